"""Which records each worker reads: files split over workers, and records within a file when
there are more workers than files.

ImageNet as TensorFlow's conversion writes it has 1,024 training and 128 validation files; the
paper's runs have 1,024-4,096 workers. With F files and W workers:

- W <= F: by file. Worker w reads files w, w + W, w + 2W, ... whole (at most ceil(F / W) files).
- W > F: by record within one file. Worker w reads file w % F, as the (w // F)-th of the k
  workers assigned to that file, and keeps its records w // F, w // F + k, ... So every worker
  opens one file and reads about 1/F of the data's bytes, never the whole data set.
  When F divides W every file has k = W / F readers and every worker keeps 1/W of the records.
  Otherwise the first W % F files get one reader more than the others (ceil(W / F) against
  floor(W / F)), so a worker of those files keeps a little less: the near-equal split.

Either way every record is read by exactly one worker per epoch, and the assignment depends on
(F, W, w) alone, so a resumed or re-launched run reads what it read before.
"""
import dataclasses
from typing import List, Sequence


@dataclasses.dataclass(frozen=True)
class FileShard:
    """One file as one worker reads it: records index, index + num_shards, ..."""

    path: str
    num_shards: int = 1  # workers sharing the file
    index: int = 0  # this worker's place among them

    def __post_init__(self):
        if self.num_shards < 1 or not 0 <= self.index < self.num_shards:
            raise ValueError(f"shard index {self.index} of {self.num_shards} is out of range")


def shard_files(files: Sequence[str], num_workers: int, worker_index: int) -> List[FileShard]:
    """This worker's files (and record shards within them), in the files' order."""
    if num_workers < 1 or not 0 <= worker_index < num_workers:
        raise ValueError(f"worker_index must be in [0, num_workers); got {worker_index} of "
                         f"{num_workers}")
    if not files:
        raise ValueError("no files to shard")
    files = list(files)
    if num_workers <= len(files):
        return [FileShard(f) for f in files[worker_index::num_workers]]
    which = worker_index % len(files)
    readers = len(range(which, num_workers, len(files)))  # workers assigned to this file
    return [FileShard(files[which], readers, worker_index // len(files))]

