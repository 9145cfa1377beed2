"""The Horovod engine with every group carried by Horovod's global process set: elastic jobs.

Horovod 0.28.1 cannot lose a worker while process sets other than the global one exist: each
survivor's background thread, shutting down, negotiates the removal of those sets over the
broken global controller, meets a gloo::IoException outside any handler and aborts
(operations.cc's BackgroundThreadLoop -> ProcessSetTable::Finalize). tests/test_elastic.py's job
ended that way, on every survivor, when the torus' rows and columns were process sets.

So an elastic job registers no process set. A group's collective is one all-to-all over all
ranks with a split per destination: bytes go to the group's members only, an empty message to
everyone else. Each rank sends what it would over a process set; each collective is agreed on by
the whole world rather than by one row or column, and the torus' phases run on every row (or
column) at once anyway. Sums stay in rank order, as with the all-to-all reduce-scatter there.
"""
import horovod.tensorflow as hvd
import tensorflow as tf

from tftorus.engines.horovod_engine import HorovodCommunicator, ProcessSetError
from tftorus.torus.communicator import Group, sum_in_fp32

_REDUCE = {"max": tf.reduce_max, "min": tf.reduce_min}


class GlobalSetCommunicator(HorovodCommunicator):
    """HorovodCommunicator without process sets: see the module docstring."""

    def __init__(self):
        super().__init__((), "alltoall")

    def process_set(self, group: Group) -> "hvd.ProcessSet":
        if len(group) == self.size:
            return hvd.global_process_set
        raise ProcessSetError(f"an elastic job registers no process set (ranks {list(group)}); "
                              f"its groups go over the global set's all-to-all")

    def fuses_all_reduce(self, dtype, group):
        # Only the whole world's sums are Horovod all-reduces (which Horovod fuses).
        return len(group) == self.size and super().fuses_all_reduce(dtype, group)

    def _to(self, tensor, group: Group, rows_each: int):
        """Send `rows_each` rows of `tensor` to each member of `group`, in rank order (tensor
        holds them one after another) and nothing to other ranks; what the members sent here,
        concatenated in rank order."""
        splits = [rows_each if r in group else 0 for r in range(self.size)]
        if tensor.dtype == tf.bfloat16:  # Horovod's ops take no bfloat16: move its bytes
            moved, _ = hvd.alltoall(tf.bitcast(tensor, tf.uint8), splits=splits)
            return tf.bitcast(moved, tf.bfloat16)
        moved, _ = hvd.alltoall(tensor, splits=splits)
        return moved

    def _reduce_scatter(self, tensor, group):
        length = tensor.shape[0] if tensor.shape[0] is not None else tf.shape(tensor)[0]
        chunk = length // len(group)
        return sum_in_fp32(tf.reshape(self._to(tensor, group, chunk), [len(group), -1]))

    def _all_gather(self, tensor, group, equal_sizes=False):
        del equal_sizes  # every sender splits by its own first dimension
        rows = tf.shape(tensor)[0]
        copies = tf.concat([tensor] * len(group), 0)  # one copy of this member's rows per member
        return self._to(copies, group, rows)

    def _all_reduce(self, tensor, group, op):
        if len(group) == self.size:
            return super()._all_reduce(tensor, group, op)  # hvd.allreduce on the global set
        if op == "sum":
            return self.sum_in_rank_order(tensor, group)  # a ring's bytes: reduce-scatter + gather
        every = self._all_gather(tf.reshape(tensor, [1, -1]), group)  # max/min: small tensors
        return tf.reshape(_REDUCE[op](every, axis=0), tf.shape(tensor))
