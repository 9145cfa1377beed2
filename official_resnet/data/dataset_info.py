"""How many records a data directory holds, without every worker reading every record.

In order: the embedded set's manifest; ImageNet's known split sizes when the directory is the
standard TFRecord conversion (1,024 `train-NNNNN-of-01024` and 128 `validation-NNNNN-of-00128`
files); a cache of an earlier count (`.tftorus-record-counts.json`, keyed by the files' names
and sizes, so a changed file is counted again); else nothing: the caller counts once (rank 0
in run_scripts/train.py), shares the count with the other workers and writes the cache.
"""
import dataclasses
import json
import os
import tempfile
from typing import Dict, List, Optional

SPLITS = ("train", "validation")
IMAGENET_FILES = {"train": 1024, "validation": 128}  # TensorFlow's ImageNet conversion
IMAGENET_RECORDS = {"train": 1_281_167, "validation": 50_000}  # ILSVRC-2012
IMAGENET_CLASSES = 1000
CACHE_NAME = ".tftorus-record-counts.json"


@dataclasses.dataclass(frozen=True)
class DataSizes:
    train: int
    validation: int
    num_classes: Optional[int]  # None: not recorded (ImageNet conversions do not say)
    source: str  # 'manifest', 'imagenet', 'cache', 'counted' or 'embedded spec'


def _split_files(data_dir: str, split: str) -> List[str]:
    import tensorflow as tf  # here: a plan (train.py --plan_only) never needs it

    return sorted(f for f in tf.io.gfile.glob(os.path.join(data_dir, f"{split}-*"))
                  if not f.endswith(".tmp"))


def _is_standard_imagenet(files_by_split: Dict[str, List[str]]) -> bool:
    for split, count in IMAGENET_FILES.items():
        names = [os.path.basename(f) for f in files_by_split[split]]
        expected = [f"{split}-{i:05d}-of-{count:05d}" for i in range(count)]
        if names != expected:
            return False
    return True


def _fingerprint(files_by_split: Dict[str, List[str]]) -> Dict[str, List]:
    import tensorflow as tf

    return {split: [[os.path.basename(f), tf.io.gfile.stat(f).length] for f in files]
            for split, files in files_by_split.items()}


def known_sizes(data_dir: str) -> Optional[DataSizes]:
    """The sizes if they can be known without reading the records, else None."""
    from official_resnet.data.embedded_data import MANIFEST_NAME, read_manifest

    manifest = read_manifest(data_dir) if os.path.isdir(data_dir) else None
    if manifest and all(manifest.get("splits", {}).get(s, {}).get("records") is not None
                        for s in SPLITS):
        return DataSizes(*(int(manifest["splits"][s]["records"]) for s in SPLITS),
                         manifest.get("num_classes"), f"manifest ({MANIFEST_NAME})")
    files = {s: _split_files(data_dir, s) for s in SPLITS}
    if _is_standard_imagenet(files):
        return DataSizes(IMAGENET_RECORDS["train"], IMAGENET_RECORDS["validation"],
                         IMAGENET_CLASSES, "imagenet")
    try:
        with open(os.path.join(data_dir, CACHE_NAME)) as f:
            cached = json.load(f)
        if cached["files"] == _fingerprint(files):
            return DataSizes(cached["train"], cached["validation"], None, "cache")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def count_sizes(data_dir: str) -> DataSizes:
    """Count every record (one worker does this) and cache the counts next to the data when the
    directory is writable (a read-only data set is counted again on the next run)."""
    from official_resnet.data.input_pipeline import count_records

    files = {s: _split_files(data_dir, s) for s in SPLITS}
    sizes = DataSizes(count_records(files["train"]), count_records(files["validation"]), None,
                      "counted")
    try:  # a name of its own (mkstemp: never a file or symlink someone put there), then renamed
        fd, tmp = tempfile.mkstemp(prefix=CACHE_NAME + ".", suffix=".tmp", dir=data_dir)
        mask = os.umask(0o022)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)  # mkstemp's 0600: the mode a plain open gives
        with os.fdopen(fd, "w") as f:
            json.dump({"train": sizes.train, "validation": sizes.validation,
                       "files": _fingerprint(files)}, f)
        os.replace(tmp, os.path.join(data_dir, CACHE_NAME))
    except OSError:
        pass
    return sizes


def file_bytes(data_dir: str, split: str) -> List[int]:
    """Sizes of a split's files, in the order the input pipeline shards them."""
    import tensorflow as tf

    return [tf.io.gfile.stat(f).length for f in _split_files(data_dir, split)]
