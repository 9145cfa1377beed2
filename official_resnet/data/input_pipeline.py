"""ImageNet input: tf.data over the TFRecords written by TensorFlow's ImageNet conversion scripts.

Layout: files `train-*` and `validation-*` in one directory, each a TFRecord of
`tf.train.Example`s with `image/encoded` (JPEG bytes) and `image/class/label` (int64, 1-based
in ImageNet's conversion: `label_offset=1` maps it to 0..999). The offline set of
`embedded_data.py` has the same layout. Other features (the conversion's bounding boxes,
`image/object/bbox/*`, among them) are ignored: random crops are drawn over the whole image.

`make_dataset(...)` gives one worker's batches: (images float32 [B, H, W, 3], normalised with
ImageNet's mean and std; labels int32 [B]). `batch_size` is per worker.

Sharding across workers (official_resnet/data/sharding.py): by file when there are at least as many
files as workers, else each file is read by the workers assigned to it, each keeping every k-th
record. Every record is read by exactly one worker per epoch, and no worker reads more than
ceil(files / workers) files. Workers may hold slightly different numbers of records when the
records do not split evenly: for training that only shifts epoch boundaries (training repeats);
evaluation still sees every record exactly once over all workers.

Training: shuffled files, interleaved reading, a seeded shuffle buffer, repeat, then the paper's
augmentations (`AugmentConfig`); evaluation: one centre crop of 87.5% of the shorter side,
resized. Every random choice is a stateless op seeded from (seed, element index, worker), so
with `deterministic=True` the batches are identical run to run and independent of parallelism.

Bad data fails fast with a `DataError` naming the file and the fix: a missing directory, no
matching files, and the first `validate_records` records of every file this worker reads are
parsed, decoded and label-checked eagerly before training starts. Later records are checked in
the graph for the label range and for JPEG bytes, with the file name in the error; a record
damaged in a way TensorFlow only notices while decoding raises TensorFlow's own error, and
`check_records(files)` finds it (file and record index).
"""
import contextlib
import dataclasses
import os
import re
import warnings
from typing import Dict, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from official_resnet.data.embedded_data import MANIFEST_NAME
from official_resnet.data.sharding import FileShard, shard_files

AUTOTUNE = tf.data.AUTOTUNE
SPLIT_PATTERNS = {"train": "train-*", "validation": "validation-*"}
CROP_FRACTION = 0.875  # evaluation: centre crop of 87.5% of the shorter side (224 of 256)
MEAN_RGB = (0.485, 0.456, 0.406)  # ImageNet statistics on the [0, 1] scale
STDDEV_RGB = (0.229, 0.224, 0.225)
JPEG_MAGIC = b"\xff\xd8"  # every JPEG starts with the SOI marker
FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}
REMEDY = ("re-create the file (re-run the ImageNet TFRecord conversion, or "
          "run_scripts/make_embedded_data.py --force for the embedded set) or move it out of "
          "the data directory")


class DataError(ValueError):
    """The data directory or its records cannot be used; the message says what to do."""


# ---------------------------------------------------------------------------------------------
# Augmentations
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AugmentConfig:
    """The paper's (NNL's) training augmentations. A zero strength (or False) switches one off.

    Defaults are the usual ImageNet strengths: Inception-style crops, and mild geometric and
    photometric jitter so that 90 epochs are not over-regularised.
    """

    random_crop: bool = True  # scaling + resizing: random area and aspect, resized to the size
    area_range: Tuple[float, float] = (0.08, 1.0)  # fraction of the image area kept
    aspect_range: Tuple[float, float] = (3 / 4, 4 / 3)  # width / height of the crop
    pad_fraction: float = 0.0625  # padding: zero-pad by up to this x size, crop back (shift)
    max_rotation_degrees: float = 10.0  # rotation: uniform in [-max, max]
    max_shear: float = 0.1  # distortion: shear factor uniform in [-max, max], both axes
    flip: bool = True  # horizontal flip with probability 1/2
    brightness_delta: float = 0.2  # brightness: add uniform [-d, d] on the [0, 1] scale
    contrast_range: Tuple[float, float] = (0.8, 1.2)  # contrast factor; (1, 1) = off
    noise_stddev: float = 0.02  # Gaussian noise std on the [0, 1] scale

    NAMES = ("crop", "pad", "rotate", "distort", "flip", "brightness", "contrast", "noise")

    @classmethod
    def none(cls) -> "AugmentConfig":
        return cls.from_names(())

    @classmethod
    def from_names(cls, names: Union[str, Sequence[str]], **strengths) -> "AugmentConfig":
        """Only the named augmentations, at default (or given) strengths.

        names: 'all', 'none', or a comma list of crop, pad, rotate, distort, flip, brightness,
        contrast, noise (a flag value).
        """
        if isinstance(names, str):
            names = {"all": cls.NAMES, "none": ()}.get(names.strip().lower(),
                                                       [n.strip() for n in names.split(",")])
        names = set(n for n in names if n)
        unknown = names - set(cls.NAMES)
        if unknown:
            raise ValueError(f"unknown augmentations {sorted(unknown)}; "
                             f"choose from {', '.join(cls.NAMES)}, or all / none")
        on = cls(**strengths)
        return dataclasses.replace(
            on,
            random_crop=on.random_crop and "crop" in names,
            pad_fraction=on.pad_fraction if "pad" in names else 0.0,
            max_rotation_degrees=on.max_rotation_degrees if "rotate" in names else 0.0,
            max_shear=on.max_shear if "distort" in names else 0.0,
            flip=on.flip and "flip" in names,
            brightness_delta=on.brightness_delta if "brightness" in names else 0.0,
            contrast_range=on.contrast_range if "contrast" in names else (1.0, 1.0),
            noise_stddev=on.noise_stddev if "noise" in names else 0.0)


def _resolve_augment(augment) -> AugmentConfig:
    if augment is True:
        return AugmentConfig()
    if augment is False or augment is None:
        return AugmentConfig.none()
    if isinstance(augment, str):
        return AugmentConfig.from_names(augment)
    if isinstance(augment, AugmentConfig):
        return augment
    raise TypeError(f"augment must be a bool, a name list or an AugmentConfig, got {augment!r}")


# ---------------------------------------------------------------------------------------------
# Per-image preprocessing (public so tests and tools can call them on single images)
# ---------------------------------------------------------------------------------------------
def normalize(image01: tf.Tensor) -> tf.Tensor:
    """[0, 1] RGB -> zero mean, unit variance per channel (ImageNet statistics)."""
    return (image01 - tf.constant(MEAN_RGB)) / tf.constant(STDDEV_RGB)


def center_crop_window(height, width, crop_fraction: float = CROP_FRACTION) -> tf.Tensor:
    """[y, x, h, w] of the centred square of crop_fraction x the shorter side."""
    height, width = tf.cast(height, tf.int32), tf.cast(width, tf.int32)
    side = tf.cast(crop_fraction * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
    side = tf.maximum(side, 1)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def preprocess_for_eval(image_bytes: tf.Tensor, image_size: int,
                        crop_fraction: float = CROP_FRACTION) -> tf.Tensor:
    """JPEG bytes -> centre crop, resized to [image_size, image_size, 3], on the [0, 1] scale."""
    shape = tf.image.extract_jpeg_shape(image_bytes)
    window = center_crop_window(shape[0], shape[1], crop_fraction)
    image = tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3)  # decodes the crop only
    return _resize01(image, image_size)


def _resize01(image_uint8, image_size: int) -> tf.Tensor:
    image = tf.image.resize(image_uint8, [image_size, image_size], method="bilinear")
    return tf.clip_by_value(image / 255.0, 0.0, 1.0)


def _affine_matrix(angle, shear_x, shear_y, size: int) -> tf.Tensor:
    """Rotation and shear about the image centre, as tfa.image.transform's 8 numbers.

    tfa maps each output pixel (x, y) to the input pixel M @ (x, y, 1); the angles and shears
    are symmetric around zero, so sampling M directly is as good as sampling its inverse.
    """
    c, s = tf.cos(angle), tf.sin(angle)
    one, zero = tf.ones_like(angle), tf.zeros_like(angle)
    rotation = tf.reshape(tf.stack([c, -s, zero, s, c, zero, zero, zero, one]), [3, 3])
    shear = tf.reshape(tf.stack([one, shear_x, zero, shear_y, one, zero, zero, zero, one]), [3, 3])
    centre = (size - 1) / 2.0
    to_origin = tf.constant([[1, 0, -centre], [0, 1, -centre], [0, 0, 1]], tf.float32)
    back = tf.constant([[1, 0, centre], [0, 1, centre], [0, 0, 1]], tf.float32)
    m = back @ rotation @ shear @ to_origin
    return tf.reshape(m, [9])[:8]


def affine_transform(image: tf.Tensor, matrix: tf.Tensor,
                     use_addons: Optional[bool] = None) -> tf.Tensor:
    """One [H, W, C] image through the 8-number transform `matrix` (as _affine_matrix gives it):
    bilinear, reflected at the edges; same shape and dtype.

    This is `tfa.image.transform(image, matrix, interpolation="bilinear",
    fill_mode="reflect")`, and that is TensorFlow's own ImageProjectiveTransformV3 kernel. The
    classic stack calls it through tensorflow-addons, which its package list pins; the current
    stack has no tensorflow-addons (its last release, 0.23, is for TensorFlow < 2.16) and calls
    the op with the arguments tfa passes: the image as a batch of one, the matrix as float32
    [1, 8], output_shape the image's [H, W] (int32), fill_value 0.0 (float32; unused when
    reflecting), mode names upper-case. tests/test_input_pipeline.py checks that the two give
    the same pixels, bit for bit.

    use_addons: None chooses by tftorus.runtime.stack (the one place that tells the stacks apart): a
    classic stack without tensorflow-addons is a broken install and fails here, rather than
    quietly taking another path; True / False force one path (the tests compare them).
    """
    if use_addons is None:
        from tftorus.runtime import stack  # here: importing the package costs time
        use_addons = not stack.KERAS_3
    if use_addons:
        with warnings.catch_warnings():  # its end-of-life notice would fill every rank's log
            warnings.simplefilter("ignore", UserWarning)
            import tensorflow_addons as tfa  # here: importing it costs time
        return tfa.image.transform(image, matrix, interpolation="bilinear", fill_mode="reflect")
    image = tf.convert_to_tensor(image, name="images")
    image.shape.assert_has_rank(3)
    output = tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None],
        transforms=tf.convert_to_tensor(matrix, tf.float32, name="transforms")[None],
        output_shape=tf.shape(image)[:2],
        interpolation="BILINEAR", fill_mode="REFLECT",
        fill_value=tf.constant(0.0, tf.float32))
    return output[0]


def preprocess_for_train(image_bytes: tf.Tensor, image_size: int, seed: tf.Tensor,
                         augment: AugmentConfig = AugmentConfig(),
                         crop_fraction: float = CROP_FRACTION) -> tf.Tensor:
    """JPEG bytes -> augmented [image_size, image_size, 3] on the [0, 1] scale.

    seed: int [2] tensor; every random op gets its own seed split from it (stateless).
    Without any augmentation this equals preprocess_for_eval.
    """
    seeds = tf.unstack(tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 10))
    shape = tf.image.extract_jpeg_shape(image_bytes)
    if augment.random_crop:  # scaling, aspect and resizing in one: decode only the crop
        whole = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4])
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape, bounding_boxes=whole, seed=seeds[0], min_object_covered=0.1,
            aspect_ratio_range=augment.aspect_range, area_range=augment.area_range,
            max_attempts=10, use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
    else:
        window = center_crop_window(shape[0], shape[1], crop_fraction)
    image = _resize01(tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3), image_size)

    if augment.pad_fraction > 0:  # padding: black border, then a random shift back to the size
        pad = max(1, int(round(augment.pad_fraction * image_size)))
        image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
        image = tf.image.stateless_random_crop(image, [image_size, image_size, 3], seeds[1])
    if augment.max_rotation_degrees > 0 or augment.max_shear > 0:  # rotation and distortion
        max_angle = augment.max_rotation_degrees * 3.141592653589793 / 180.0
        angle = tf.random.stateless_uniform([], seeds[2], -max_angle, max_angle + 1e-12)
        shears = tf.random.stateless_uniform([2], seeds[3], -augment.max_shear,
                                             augment.max_shear + 1e-12)
        matrix = _affine_matrix(angle, shears[0], shears[1], image_size)
        image = affine_transform(image, matrix)
    if augment.flip:
        image = tf.image.stateless_random_flip_left_right(image, seeds[4])
    if augment.brightness_delta > 0:
        image = tf.image.stateless_random_brightness(image, augment.brightness_delta, seeds[5])
    lo, hi = augment.contrast_range
    if (lo, hi) != (1.0, 1.0):
        image = tf.image.stateless_random_contrast(image, lo, hi, seeds[6])
    image = tf.clip_by_value(image, 0.0, 1.0)
    if augment.noise_stddev > 0:  # after clipping: noise is what the sensor adds last
        image += tf.random.stateless_normal(tf.shape(image), seeds[7], stddev=augment.noise_stddev)
    return tf.ensure_shape(image, [image_size, image_size, 3])


def parse_record(serialized: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """Serialized tf.train.Example -> (JPEG bytes, stored label int64)."""
    parsed = tf.io.parse_single_example(serialized, FEATURES)
    return parsed["image/encoded"], parsed["image/class/label"]


def _checked_label(stored, filename, label_offset: int, num_classes: int):
    """0-based int32 label; an out-of-range one stops the pipeline with the file named."""
    label = stored - label_offset
    ok = tf.logical_and(label >= 0, label < num_classes)
    check = tf.debugging.Assert(ok, [
        f"Label out of range [0, {num_classes}) after subtracting label_offset={label_offset} "
        f"(ImageNet conversion labels are 1-based: label_offset=1; check num_classes). "
        f"Stored label and file:", stored, filename], summarize=3)
    with tf.control_dependencies([check]):
        return tf.cast(tf.identity(label), tf.int32)


def _checked_jpeg(image_bytes, filename):
    is_jpeg = tf.equal(tf.strings.substr(image_bytes, 0, 2), JPEG_MAGIC)
    check = tf.debugging.Assert(is_jpeg, [
        f"image/encoded is not JPEG data: the record is damaged; {REMEDY}. File:", filename])
    with tf.control_dependencies([check]):
        return tf.identity(image_bytes)


# ---------------------------------------------------------------------------------------------
# Files, counting, validation
# ---------------------------------------------------------------------------------------------
def _reason(error: tf.errors.OpError) -> str:
    """TensorFlow's message without its op and function-node decorations."""
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", error.message.splitlines()[0])
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", text).strip()


# The in-graph checks of make_dataset (_checked_label, _checked_jpeg) begin with these words.
IN_GRAPH_CHECKS = ("Label out of range", "image/encoded is not JPEG data")


_files_read: List[str] = []  # every file make_dataset read in this process


def _damaged(files: Sequence[str]) -> Optional[str]:
    """The first of `files` that TensorFlow cannot read to its end (each read whole: only after
    a failure)."""
    for f in dict.fromkeys(files):
        try:
            count_records(f)
        except DataError:
            return f
    return None


@contextlib.contextmanager
def data_errors_in_words():
    """A record that fails an in-graph check mid-run surfaces from the iterator as TensorFlow's
    InvalidArgumentError (a traceback); inside this block it becomes a DataError saying what is
    wrong, with the stored value and the file."""
    try:
        yield
    except tf.errors.DataLossError as error:  # a TFRecord damaged past what was validated
        raise DataError(f"a record file is damaged ({_reason(error)}): "
                        f"{_damaged(_files_read) or 'one of ' + str(len(_files_read)) + ' files'}"
                        f"; {REMEDY}, then run again with --resume=auto: it continues from the "
                        f"last checkpoint") from None
    except tf.errors.InvalidArgumentError as error:
        if not any(check in error.message for check in IN_GRAPH_CHECKS):
            raise
        text = error.message.split("assertion failed: ", 1)[-1].splitlines()[0].strip()
        text = text.strip("[]").replace("] [", " ")  # "[what:] [value] [file]" -> plain words
        raise DataError(f"a record failed the input pipeline's check: {text}") from None


def list_files(data_dir: str, split: str) -> List[str]:
    """Sorted record files of a split; DataError when the directory or the files are missing."""
    if split not in SPLIT_PATTERNS:
        raise ValueError(f"split must be one of {sorted(SPLIT_PATTERNS)}, got {split!r}")
    if not data_dir or not tf.io.gfile.isdir(data_dir):
        raise DataError(
            f"data directory {data_dir!r} does not exist. Point --data_dir at ImageNet in "
            f"TFRecord form (train-*, validation-*), or write the offline set there with "
            f"`python run_scripts/make_embedded_data.py --out_dir {data_dir}`.")
    pattern = os.path.join(data_dir, SPLIT_PATTERNS[split])
    files = sorted(f for f in tf.io.gfile.glob(pattern) if not f.endswith(".tmp"))
    if not files:
        present = sorted(tf.io.gfile.listdir(data_dir))[:5]
        raise DataError(
            f"no {split} files matching {pattern} (the directory holds: "
            f"{present or 'nothing'}). ImageNet's TFRecord conversion names them "
            f"{split}-00000-of-NNNNN; point --data_dir at that directory, or generate the "
            f"offline set with `python run_scripts/make_embedded_data.py --out_dir {data_dir}`.")
    return files


def count_records(files: Union[str, Sequence[str]]) -> int:
    """Number of records in the files (reads them all; DataError names a damaged file)."""
    files = [files] if isinstance(files, str) else list(files)
    total = 0
    for f in files:
        try:
            total += int(tf.data.TFRecordDataset(f).reduce(tf.constant(0, tf.int64),
                                                           lambda n, _: n + 1))
        except tf.errors.OpError as e:
            raise DataError(f"cannot read {f} as TFRecords ({_reason(e)}); "
                            f"{REMEDY}.") from e
    return total


def check_records(files: Union[str, Sequence[str]], *, num_classes: int = 1000,
                  label_offset: int = 1, max_records: Optional[int] = None) -> int:
    """Read, parse, decode and label-check records eagerly; DataError at the first bad one.

    max_records: per file (None: all). Returns the number of records checked.
    """
    files = [files] if isinstance(files, str) else list(files)
    checked = 0
    for f in files:
        records = tf.data.TFRecordDataset(f)
        if max_records is not None:
            records = records.take(max_records)
        index = 0
        iterator = iter(records)
        while True:
            try:
                serialized = next(iterator)
            except StopIteration:
                break
            except tf.errors.OpError as e:
                raise DataError(f"record {index} of {f} is corrupted "
                                f"({_reason(e)}); {REMEDY}.") from e
            try:
                image_bytes, stored = parse_record(serialized)
                tf.io.decode_jpeg(image_bytes, channels=3)
            except tf.errors.OpError as e:
                raise DataError(f"record {index} of {f} is not a readable ImageNet example "
                                f"(a tf.train.Example with a JPEG in image/encoded and an int64 "
                                f"image/class/label): {_reason(e)}; "
                                f"{REMEDY}.") from e
            label = int(stored) - label_offset
            if not 0 <= label < num_classes:
                raise DataError(
                    f"record {index} of {f} has image/class/label {int(stored)}, which is "
                    f"{label} after subtracting label_offset={label_offset}: outside "
                    f"[0, {num_classes}). ImageNet's conversion writes 1-based labels "
                    f"(label_offset=1); 0-based data needs label_offset=0; or fix num_classes.")
            index += 1
        checked += index
    return checked


def describe(data_dir: str, *, count: bool = True) -> Dict:
    """Files and records per split, and the number of classes if a manifest records it.

    count=False skips reading every record (records come from the manifest, if any). A split
    without files shows 0 files; a missing directory is a DataError.
    """
    if not data_dir or not tf.io.gfile.isdir(data_dir):
        list_files(data_dir, "train")  # raises the missing-directory error
    info = {"data_dir": data_dir, "splits": {}, "num_classes": None}
    manifest = _read_manifest(data_dir)
    if manifest:
        info["num_classes"] = manifest.get("num_classes")
    for split, pattern in SPLIT_PATTERNS.items():
        files = sorted(f for f in tf.io.gfile.glob(os.path.join(data_dir, pattern))
                       if not f.endswith(".tmp"))  # a missing split is described, not an error
        records = count_records(files) if count else (
            manifest or {}).get("splits", {}).get(split, {}).get("records")
        info["splits"][split] = {"files": len(files), "records": records}
    return info


def num_examples(data_dir: str, split: str) -> int:
    """Records in a split: from the manifest when there is one, else counted."""
    manifest = _read_manifest(data_dir)
    if manifest and manifest.get("splits", {}).get(split, {}).get("records") is not None:
        return int(manifest["splits"][split]["records"])
    return count_records(list_files(data_dir, split))


def _read_manifest(data_dir: str) -> Optional[Dict]:
    import json

    path = os.path.join(data_dir, MANIFEST_NAME)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------
# The data set
# ---------------------------------------------------------------------------------------------
def validate_split(data_dir: str, split: str, *, num_workers: int = 1, worker_index: int = 0,
                   num_classes: int = 1000, label_offset: int = 1, records: int = 1) -> None:
    """Check the first `records` records of every file this worker will read (the check
    make_dataset runs), so a run can refuse bad data before it writes or trains anything."""
    _validate(_paths(data_dir, split, num_workers, worker_index), records, num_classes,
              label_offset)


def make_dataset(data_dir: str, split: str, batch_size: int, *, image_size: int = 224,
                 num_workers: int = 1, worker_index: int = 0, training: Optional[bool] = None,
                 seed: int = 0, label_offset: int = 1, num_classes: int = 1000,
                 augment: Union[bool, str, AugmentConfig] = True,
                 crop_fraction: float = CROP_FRACTION, cache: Union[bool, str] = False,
                 shuffle_buffer: int = 10_000, repeat: Optional[bool] = None,
                 drop_remainder: Optional[bool] = None, deterministic: bool = False,
                 validate_records: int = 1, skip_batches: int = 0) -> tf.data.Dataset:
    """One worker's batches of (images float32 [B, S, S, 3], labels int32 [B]).

    batch_size: per worker. training: default split == 'train' (shuffle, augment, repeat,
    drop the last partial batch). augment: True (all of the paper's, default strengths), False,
    'crop,flip,...', or an AugmentConfig; ignored when not training. cache: True (memory) or a
    file prefix; caches this worker's raw records, before shuffling. deterministic: same batches
    on every run (slightly slower). validate_records: records per file checked eagerly before
    the pipeline is built (0: none). skip_batches: start after this many batches, skipped as
    records before decoding (resuming mid-phase; same batches as before only when deterministic).
    """
    training = split == "train" if training is None else training
    repeat = training if repeat is None else repeat
    drop_remainder = training if drop_remainder is None else drop_remainder
    if batch_size < 1 or image_size < 1:
        raise ValueError(f"batch_size and image_size must be >= 1, got {batch_size}, {image_size}")
    config = _resolve_augment(augment) if training else AugmentConfig.none()

    if validate_records > 0:
        _validate(_paths(data_dir, split, num_workers, worker_index), validate_records,
                  num_classes, label_offset)
    _files_read.extend(_paths(data_dir, split, num_workers, worker_index))
    records = worker_records(data_dir, split, num_workers, worker_index, shuffle=training,
                             seed=seed, deterministic=deterministic)
    if cache:
        records = records.cache(cache if isinstance(cache, str) else "")
    if training:
        records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        records = records.repeat()

    # Every branch below is on Python values (the augmentation's configuration), so AutoGraph,
    # which tf.data would run over this and each function it calls, has nothing to convert;
    # skipping it takes about a second off every worker's start.
    @tf.autograph.experimental.do_not_convert
    def preprocess(index, record):
        serialized, filename = record
        image_bytes, stored = parse_record(serialized)
        label = _checked_label(stored, filename, label_offset, num_classes)
        image_bytes = _checked_jpeg(image_bytes, filename)
        if training:
            # Unique per (seed, worker, element): workers never repeat each other's draws.
            element = tf.stack([tf.cast(seed, tf.int64), index * num_workers + worker_index])
            image = preprocess_for_train(image_bytes, image_size, element, config, crop_fraction)
        else:
            image = preprocess_for_eval(image_bytes, image_size, crop_fraction)
        return normalize(image), label

    ds = records.enumerate()
    if skip_batches:
        ds = ds.skip(skip_batches * batch_size)  # indices (augmentation seeds) stay the same
    ds = ds.map(preprocess, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    return ds.with_options(pipeline_options(deterministic)).prefetch(AUTOTUNE)


def pipeline_options(deterministic: bool) -> tf.data.Options:
    """make_dataset's tf.data options: no autotuning thread.

    With autotuning on, every iterator runs a model thread that sleeps between optimizations,
    its period doubling up to 60 s, and deleting the iterator joins that thread. In TF 2.15
    the wake-up can be lost (CancellationManager marks itself cancelled only after running the
    callback that wakes the thread, so the thread may see 'not cancelled' and sleep out the
    period): a worker's model.fit then returns up to a minute after its last epoch, while its
    peers wait for it (the idle minute at the end of a run; tests/test_train_script.py checks
    the summary's tail_seconds). Without it, AUTOTUNE parallelism takes TF's untuned default
    and prefetch(AUTOTUNE) sizes its buffer by itself: the same batches, and the same images/s
    on the main job here."""
    options = tf.data.Options()
    options.deterministic = deterministic
    options.autotune.enabled = False
    return options


def _paths(data_dir, split, num_workers, worker_index) -> List[str]:
    return [s.path for s in shard_files(list_files(data_dir, split), num_workers, worker_index)]


def worker_records(data_dir: str, split: str, num_workers: int = 1, worker_index: int = 0, *,
                   shuffle: bool = False, seed: int = 0,
                   deterministic: bool = True) -> tf.data.Dataset:
    """This worker's raw records, (serialized example, file name), one pass: its files, and its
    share of each file's records when files are shared (official_resnet/data/sharding.py).
    shuffle: the file order, reshuffled each pass (training)."""
    shards: List[FileShard] = shard_files(list_files(data_dir, split), num_workers, worker_index)
    ds = tf.data.Dataset.from_tensor_slices((
        [s.path for s in shards], tf.constant([s.num_shards for s in shards], tf.int64),
        tf.constant([s.index for s in shards], tf.int64)))
    if shuffle:
        ds = ds.shuffle(len(shards), seed=seed, reshuffle_each_iteration=True)

    def read(path, num_shards, index):  # a shared file: every num_shards-th record from index
        return tf.data.TFRecordDataset(path).shard(num_shards, index).map(lambda r: (r, path))

    return ds.interleave(read, cycle_length=min(len(shards), 16), block_length=1,
                         num_parallel_calls=AUTOTUNE, deterministic=deterministic)


def _validate(files: Sequence[str], per_file: int, num_classes: int, label_offset: int) -> None:
    """Check the first records of each file: a fast graph pass, then an eager pass to name the
    culprit only when the fast one fails."""
    def first_records(f):
        return tf.data.TFRecordDataset(f).take(per_file)

    def decode(serialized):
        image_bytes, stored = parse_record(serialized)
        shape = tf.shape(tf.io.decode_jpeg(image_bytes, channels=3))
        return shape[-1], stored - label_offset

    ds = tf.data.Dataset.from_tensor_slices(list(files)).interleave(
        first_records, cycle_length=min(len(files), 16), num_parallel_calls=AUTOTUNE)
    ds = ds.map(decode, num_parallel_calls=AUTOTUNE).batch(1024)
    try:
        for _, labels in ds:
            if tf.reduce_any(labels < 0) or tf.reduce_any(labels >= num_classes):
                raise DataError("label out of range")  # the eager pass below names the file
    except (tf.errors.OpError, DataError):
        check_records(files, num_classes=num_classes, label_offset=label_offset,
                      max_records=per_file)
        raise  # the eager pass found nothing: the fast pass' own error is the best we have


if __name__ == "__main__":  # python -m official_resnet.data.input_pipeline DATA_DIR
    import json
    import sys

    print(json.dumps(describe(sys.argv[1] if len(sys.argv) > 1 else "data/embedded"), indent=2))
