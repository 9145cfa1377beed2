"""Communicator on Horovod: one process set per torus row and per column.

Horovod registers process sets at `hvd.init(process_sets=...)` (or later, collectively, when
started with dynamic process sets); `tftorus.init()` does that for the grids it is asked for.
"""
from typing import Dict, Iterable

import horovod.tensorflow as hvd
import tensorflow as tf

from tftorus.torus.communicator import (Communicator, Group, SumsInTurn, choose_reduce_scatter,
                                        sum_in_fp32)

_HVD_OPS = {"sum": hvd.Sum, "max": hvd.Max, "min": hvd.Min}

#: The row reduce-scatter defaults to 'alltoall': with Horovod 0.28.1's Gloo ops it measured 3-5x
#: as fast as hvd.reducescatter here (docs/studies/benchmarks.md). 'native' (hvd.reducescatter) is
#: for NCCL on GPUs only: on Gloo it returned wrong sums inside our graphs in the benchmark.
NATIVE_REFUSED = (
    "reduce_scatter_impl='native' needs Horovod built with NCCL: on Gloo, hvd.reducescatter "
    "measured 3-5x slower than the default 'alltoall' and returned a wrong sum for ResNet-50's "
    "fused gradients (docs/studies/benchmarks.md); leave reduce_scatter_impl at 'alltoall'")


class ProcessSetError(RuntimeError):
    """A group was needed for which Horovod has no process set."""


class HorovodCommunicator(Communicator):
    engine = "horovod"
    # Horovod runs every collective of every process set in turn on its one background thread
    # (RunLoopOnce performs each response of each set before the next), so a row's and a
    # column's collectives never overlap: the torus' chunk pipeline has nothing to gain here.
    concurrent_groups = False
    # Its loop also coordinates every rank once per cycle, and with Gloo it performs each
    # collective to its end before the next cycle: a column whose request misses the other
    # column's cycle waits for that column's whole collective (docs/studies/planner.md). With
    # NCCL on GPUs the loop only enqueues the collective and goes on (untested here: no GPU).
    columns_in_turn = True

    def __init__(self, process_sets: Iterable["hvd.ProcessSet"] = (),
                 reduce_scatter_impl: str = "alltoall"):
        if not hvd.is_initialized():
            raise RuntimeError("Horovod is not initialised: call tftorus.init() first")
        self.reduce_scatter_impl = choose_reduce_scatter(reduce_scatter_impl,
                                                         hvd.nccl_built(), NATIVE_REFUSED)
        self.columns_in_turn = not (hvd.nccl_built() and tf.config.list_logical_devices("GPU"))
        # Gloo sums FP16 one scalar at a time on CPUs (and Horovod takes no bf16); NCCL sums
        # 16-bit floats natively, so keep hvd.allreduce for 16-bit sums where NCCL is built.
        self.sum_16bit_in_fp32 = not hvd.nccl_built()
        self._sets: Dict[Group, hvd.ProcessSet] = {}
        self._sums = SumsInTurn()
        for ps in process_sets:
            self._sets[tuple(sorted(ps.ranks))] = ps

    @property
    def rank(self):
        return hvd.rank()

    @property
    def size(self):
        return hvd.size()

    @property
    def local_size(self):
        return hvd.local_size()

    def process_set(self, group: Group) -> "hvd.ProcessSet":
        if len(group) == self.size:
            return hvd.global_process_set
        if group in self._sets:
            return self._sets[group]
        raise ProcessSetError(
            f"Horovod has no process set for ranks {list(group)}. Pass every grid you use to "
            f"tftorus.init(grid=..., extra_grids=[...]) so its rows and columns are registered "
            f"at start-up (hvd.init() alone registers none).")

    # Horovod 0.28.1's TensorFlow ops take no bfloat16. Data movement (alltoall, allgather)
    # carries its bytes as uint8; a sum runs in FP32 and is cast back.

    def _reduce_scatter(self, tensor, group):
        ps = self.process_set(group)
        if self.reduce_scatter_impl == "native":
            wide = tf.cast(tensor, tf.float32) if tensor.dtype == tf.bfloat16 else tensor
            return tf.cast(hvd.reducescatter(wide, op=hvd.Sum, process_set=ps), tensor.dtype)
        received = _move(hvd.alltoall, tensor, ps)  # chunk j of every member -> member j
        return self._sums.after_previous(
            group, lambda: sum_in_fp32(tf.reshape(received, [len(group), -1])))

    def _sums_16bit_in_rank_order(self, dtype, group) -> bool:
        """Whether a 16-bit sum goes by all-to-all + FP32 sum + all-gather, not hvd.allreduce.
        Over two members it need not: Gloo adds each pair once, in FP32, and rounds once to
        FP16, the same bits as the FP32 sum in rank order; across emulated hosts the all-to-all
        plus all-gather made the torus' FP16 column 0.93 of a ring where its bytes allow 0.67
        (docs/studies/emulated_step.md)."""
        return (dtype in (tf.float16, tf.bfloat16) and self.sum_16bit_in_fp32
                and not (dtype == tf.float16 and len(group) == 2))

    def fuses_all_reduce(self, dtype, group):
        # Every sum that is one hvd.allreduce; Horovod does not fuse its all-to-alls.
        return not self._sums_16bit_in_rank_order(dtype, group)

    def _all_reduce(self, tensor, group, op):
        ps = self.process_set(group)
        if op == "sum" and self._sums_16bit_in_rank_order(tensor.dtype, group):
            return self.sum_in_rank_order(tensor, group)
        if tensor.dtype == tf.bfloat16:
            wide = hvd.allreduce(tf.cast(tensor, tf.float32), op=_HVD_OPS[op], process_set=ps)
            return tf.cast(wide, tf.bfloat16)
        return hvd.allreduce(tensor, op=_HVD_OPS[op], process_set=ps)

    def _all_gather(self, tensor, group, equal_sizes=False):
        del equal_sizes  # hvd.allgather takes any first dimension at no extra cost
        return _move(hvd.allgather, tensor, self.process_set(group))


def _move(collective, tensor, process_set):
    """Run a data-movement collective (no arithmetic), passing bfloat16 as its raw bytes."""
    if tensor.dtype != tf.bfloat16:
        return collective(tensor, process_set=process_set)
    moved = collective(tf.bitcast(tensor, tf.uint8), process_set=process_set)  # [..., 2] bytes
    return tf.bitcast(moved, tf.bfloat16)
