"""Who this process is among the job's workers, and how to sum a tensor over all of them.

The recipe's callbacks and the trainer take a `Workers` rather than calling the engine, so they
run unchanged in one process (`Workers()`: rank 0 of 1, sums are the identity) and in tests that
give a sum of their own. `Workers.current()` is the running job's, after `tftorus.init()`.
"""
import dataclasses
from typing import Callable, Optional

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
