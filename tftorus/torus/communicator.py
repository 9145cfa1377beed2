"""The three collectives every all-reduce algorithm here is written against.

An engine (Horovod process sets, TensorFlow collective ops) implements them over a *group*: a
sorted tuple of global ranks that contains the caller. Groups of one rank are answered locally,
so an algorithm never special-cases a 1 x N or N x 1 grid.
"""
import abc
import weakref
from typing import List, Sequence, Tuple

import tensorflow as tf

Group = Tuple[int, ...]
REDUCE_OPS = ("sum", "max", "min")


class Communicator(abc.ABC):
    """Reduce-scatter, all-reduce and all-gather over groups of ranks, on flat tensors."""

    #: short name used in benchmarks, logs and errors
    engine = "abstract"
    #: how the engine reduce-scatters: 'alltoall' (all-to-all, then a sum in rank order) or
    #: 'native' (the engine's own; see choose_reduce_scatter)
    reduce_scatter_impl = "alltoall"
    #: Whether collectives of different groups (a row's and a column's) can be in flight at the
    #: same time in one process: what the torus' chunk pipeline needs to overlap its phases.
    concurrent_groups = False
    #: The largest fused buffer worth planning (None: no limit): where an engine's collectives
    #: cost more than linearly above some size, which the link probe's small messages cannot
    #: see, the planner (tftorus/planning/planner.py) keeps its buckets below it.
    max_bucket_bytes = None
    #: The largest pipeline chunk worth planning (None: no limit): where a chunk's row phases
    #: take the cores its column's transfer needs, a long one stalls the column, which the
    #: planner's model of links cannot see; the planner cuts the torus' chunks below it.
    max_chunk_bytes = None
    #: Whether one group's long collective can hold back another group's on other ranks (the
    #: columns then run in turn where each has a link of its own): see the planner's
    #: IN_TURN_MAX_BUCKET_BYTES.
    columns_in_turn = False

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This process' global rank."""

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """Number of processes in the world."""

    @property
    @abc.abstractmethod
    def local_size(self) -> int:
        """Processes on this host (the row length of hierarchical all-reduce)."""

    def all_ranks(self) -> Group:
        """The group of every rank."""
        return tuple(range(self.size))

    def barrier(self) -> None:
        """Return when every rank has called it (call it eagerly): a one-element all-reduce
        over all ranks, so each engine's barrier is its own collective, written once here."""
        self.all_reduce(tf.zeros([1], tf.int32), self.all_ranks())

    def reduce_scatter(self, tensor: tf.Tensor, group: Sequence[int]) -> tf.Tensor:
        """Sum a 1-D tensor over `group`; return the member's equal shard (its index in group)."""
        group = self._check(group)
        if tensor.shape[0] is not None and tensor.shape[0] % len(group):
            raise ValueError(
                f"reduce-scatter needs a length divisible by the group size {len(group)}, "
                f"got {tensor.shape[0]}: pad the buffer (tftorus.torus.fusion pads for you)")
        if len(group) == 1:
            return tensor
        return self._reduce_scatter(tensor, group)

    def all_reduce(self, tensor: tf.Tensor, group: Sequence[int], op: str = "sum") -> tf.Tensor:
        """Reduce a tensor elementwise over `group` with `op` ('sum', 'max' or 'min')."""
        group = self._check(group)
        if op not in REDUCE_OPS:
            raise ValueError(f"unknown reduce op {op!r}; choose one of {REDUCE_OPS}")
        if len(group) == 1:
            return tensor
        return self._all_reduce(tensor, group, op)

    def all_gather(self, tensor: tf.Tensor, group: Sequence[int],
                   equal_sizes: bool = False) -> tf.Tensor:
        """Concatenate every member's tensor along dimension 0, in group order.

        Members may pass different first dimensions; `equal_sizes=True` promises they do not
        (the algorithms' shards), so an engine that must otherwise exchange sizes first (the
        tf engine) can skip that round.
        """
        group = self._check(group)
        if len(group) == 1:
            return tensor
        return self._all_gather(tensor, group, equal_sizes)

    def as_one_call(self, fn, tensors: Sequence[tf.Tensor],
                    outputs: Sequence[tf.TensorSpec]) -> List[tf.Tensor]:
        """`fn(tensors)`: tensors like `outputs`, made with this engine's collectives. An engine
        whose ops a TF1 session cannot run as they are (the tf engine's) runs fn there as one
        unit instead; Horovod's ops run anywhere, so here it is just the call."""
        del outputs
        return fn(list(tensors))

    def fuses_all_reduce(self, dtype: tf.DType, group: Group) -> bool:
        """Whether the engine itself fuses a sum of `dtype` over `group` with the others that are
        ready at the same time (Horovod's background thread packs whatever is ready in each cycle
        into one buffer). Such sums are best handed over tensor by tensor: each leaves as soon as
        it exists, and no pack or unpack copy of ours is added to the engine's own. Engines whose
        collectives go one op, one message (TF's) do not, and get our buckets instead."""
        del dtype, group
        return False

    @property
    def transport(self) -> str:
        """What carries the bytes; a plan and the guard's verdict hold for one transport."""
        return self.engine

    @property
    def rank_ordered_sums(self) -> bool:
        """Whether `sum_in_rank_order` really sums in rank order: its reduce-scatter is the
        all-to-all one, not an engine's native (NCCL) reduce-scatter with an order of its own."""
        return self.reduce_scatter_impl == "alltoall"

    def sum_in_rank_order(self, tensor: tf.Tensor, group: Sequence[int]) -> tf.Tensor:
        """Sum over `group` as reduce-scatter (all-to-all, then a sum of at least FP32 in rank
        order; on the tf engine in TF's member order, fixed too) + all-gather: the bytes of a ring
        all-reduce, and every element summed in the same order wherever it sits in the buffer (an
        engine's ring sums an element in an order set by its position). For 16-bit floats (both
        engines' CPU all-reduces sum them in 16 bits at each hop or one scalar at a time,
        docs/studies/benchmarks.md) and for the torus' FP32 columns of 3+ ranks where it pipelines
        chunks (algorithms.ordered_column)."""
        group = self._check(group)
        if len(group) == 1:
            return tensor
        flat = tf.reshape(tensor, [-1])
        length = flat.shape[0] if flat.shape[0] is not None else tf.shape(flat)[0]
        padded = tf.pad(flat, [[0, (-length) % len(group)]])
        shard = self._reduce_scatter(padded, group)
        return tf.reshape(self._all_gather(shard, group, True)[:length], tf.shape(tensor))

    def _check(self, group: Sequence[int]) -> Group:
        group = tuple(sorted(int(r) for r in group))
        if self.rank not in group:
            raise ValueError(f"rank {self.rank} is not a member of group {group}")
        if group[0] < 0 or group[-1] >= self.size or len(set(group)) != len(group):
            raise ValueError(f"group {group} is not a set of ranks of a world of {self.size}")
        return group

    @abc.abstractmethod
    def _reduce_scatter(self, tensor: tf.Tensor, group: Group) -> tf.Tensor:
        ...

    @abc.abstractmethod
    def _all_reduce(self, tensor: tf.Tensor, group: Group, op: str) -> tf.Tensor:
        ...

    @abc.abstractmethod
    def _all_gather(self, tensor: tf.Tensor, group: Group, equal_sizes: bool) -> tf.Tensor:
        ...


def sum_in_fp32(chunks: tf.Tensor) -> tf.Tensor:
    """Sum chunks (stacked on axis 0) in at least FP32, so FP16/BF16 wire data keeps its bits.

    Two chunks are one add in their own dtype: a 16-bit add on the CPU is the FP32 sum of the
    two rounded once, the same bits as the cast-sum-cast below, in one pass instead of three
    (a 2-rank row of the FP16 torus spent 25 ms per 16 MiB bucket on the casts here)."""
    dtype = chunks.dtype
    if chunks.shape[0] == 2:
        return chunks[0] + chunks[1]
    if dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tf.reduce_sum(tf.cast(chunks, tf.float32), axis=0), dtype)
    return tf.reduce_sum(chunks, axis=0)


class SumsInTurn:
    """The local sums after a group's all-to-alls, one bucket after the other.

    A training step's buckets all reach the reduce-scatter at about the same time: their
    all-to-alls take milliseconds, and then every bucket's sum runs at once on the same cores,
    so the first bucket's sum ends with the last one's and the column phase, which waits for it,
    starts late (a Horovod timeline of the ResNet-50 set at 2 x 2: 100 ms between the last
    all-to-all and the first column all-reduce). In turn, the first sum ends after its own
    work and the column starts while the next sums run. Per traced graph and group (a row's
    sums never wait for a column's); eagerly, ops already run in the order they are called."""

    def __init__(self):
        # graph -> {group: the previous sum's name}: a name, as a tensor would keep its graph
        # (the key) alive for good
        self._last = weakref.WeakKeyDictionary()

    def after_previous(self, group: Group, make_sum):
        if tf.executing_eagerly():
            return make_sum()
        graph = tf.compat.v1.get_default_graph()
        last = self._last.setdefault(graph, {})
        before = [graph.get_tensor_by_name(last[group])] if group in last else []
        with tf.control_dependencies(before):
            total = make_sum()
        last[group] = total.name
        return total


REDUCE_SCATTER_IMPLS = ("auto", "alltoall", "native")


def choose_reduce_scatter(requested: str, native_available: bool, why_not_native: str) -> str:
    """How an engine does its reduce-scatter: 'alltoall' (each member gets its chunk from
    everyone and sums locally: the bytes of a reduce-scatter), 'native' (the engine's own,
    where it has a correct and fast one: NCCL), or 'auto' (native where available)."""
    if requested not in REDUCE_SCATTER_IMPLS:
        raise ValueError(f"reduce_scatter_impl must be one of {REDUCE_SCATTER_IMPLS}, "
                         f"got {requested!r}")
    if requested == "auto":
        return "native" if native_available else "alltoall"
    if requested == "native" and not native_available:
        raise ValueError(why_not_native)
    return requested
