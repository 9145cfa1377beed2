"""Who this process is among the job's workers, and how to sum a tensor over all of them.

The recipe's callbacks and the trainer take a `Workers` rather than calling the engine, so they
run unchanged in one process (`Workers()`: rank 0 of 1, sums are the identity) and in tests that
give a sum of their own. `Workers.current()` is the running job's, after `tftorus.init()`.
"""
import dataclasses
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tftorus.runtime import world


@dataclasses.dataclass(frozen=True)
class Workers:
    rank: int = 0
    size: int = 1
    allreduce_sum: Optional[Callable[[tf.Tensor], tf.Tensor]] = None  # None: one process

    @classmethod
    def current(cls) -> "Workers":
        """The job tftorus.init() joined (either engine)."""
        size = world.size()
        return cls(rank=world.rank(), size=size,
                   allreduce_sum=world.allreduce_sum if size > 1 else None)

    @property
    def chief(self) -> bool:
        return self.rank == 0

    def sum(self, tensor):
        return tensor if self.allreduce_sum is None else self.allreduce_sum(tensor)

    def barrier(self) -> None:
        """Return when every worker has called it (the engine's barrier)."""
        if self.size > 1:
            world.barrier()

    def from_chief(self, text: str) -> str:
        """Rank 0's `text` on every worker (two sums: its length, then its bytes; the others
        add zeros). A collective: every worker calls it at the same point."""
        if self.size == 1:
            return text
        data = text.encode() if self.chief else b""
        length = int(self.sum(tf.constant([len(data)], tf.int64)).numpy()[0])
        mine = (np.frombuffer(data, np.uint8).astype(np.int32) if self.chief
                else np.zeros(length, np.int32))
        return bytes(self.sum(tf.constant(mine)).numpy().astype(np.uint8)).decode()

    def count(self, true: bool) -> int:
        """How many workers passed True (a collective)."""
        return int(self.sum(tf.constant([int(bool(true))], tf.int64)).numpy()[0])

