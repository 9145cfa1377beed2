"""All-reduce algorithms over a Communicator: the paper's 2D torus, and the two baselines users
would pick instead.

Each takes a flat 1-D buffer (already padded to `alignment(name, grid, chunks)`) and the number
of chunks to pipeline it in (`pipeline_chunks`: 1 but for the torus), and returns the
elementwise sum over the world; the flat ring also takes a tensor of any shape (`packs`). They
differ in which groups carry which bytes:

  torus         reduce-scatter in the row, all-reduce of the 1/X shard in the column,
                all-gather in the row: 2(X-1) + 2(Y-1) sequential steps, ring-optimal bytes.
  ring          one all-reduce over the whole world (Horovod's flat all-reduce): 2(N-1) steps.
  hierarchical  leader-based (Jia et al. 2018, which the paper compares with; PaddlePaddle's
                use_hierarchical_allreduce, TensorFlow's nccl-then-ring): all-reduce inside
                each node (row, X = ranks per node), all-reduce of the whole buffer among the
                node leaders (local rank 0: the grid's first column), then the leader's result
                to the node's other ranks. Across hosts it sends the torus' bytes per host, but
                all through the leader: one link of a host with several, and one rank's work.

Horovod's own HOROVOD_HIERARCHICAL_ALLREDUCE (NCCL builds only) reduce-scatters inside the
node, all-reduces across nodes among ranks of equal local rank and all-gathers inside the node:
that is the torus with X = ranks per node, which tftorus runs on any grid and either engine.

`auto` (the optimizers' default) picks one of them per fused buffer by topology and size
(`choose`): the engine's own all-reduce on one host and for small buffers, the torus across
hosts. The choice reads only what every rank knows alike, so every rank picks the same.

Pipelining (torus only). The three phases of one buffer run one after the other, so while the
column phase is on the network the row links sit idle and the other way round. Cut into K
chunks, chunk k+1's row reduce-scatter (and chunk k-1's all-gather) can run while chunk k's
column all-reduce crosses the hosts, on engines whose collectives of different groups run at
the same time (`Communicator.concurrent_groups`). Each chunk is reduced by the same members as
without chunks; see `pipeline_chunks` for when the chunks pay.

Chunks and the last bit: the row sum (all-to-all, then an FP32 sum in rank order) and every
16-bit sum are taken in a fixed order, so they do not change with chunks, and neither does an
FP32 column of 1 or 2 ranks (a + b == b + a) or any integer sum. An engine's ring all-reduce
(Gloo's, TF's) sums an element of an FP32 (or FP64) column of 3 or more ranks in an order set by
the element's position in the buffer, so chunks would change the last bit of such sums
(measured: up to 1e-6 relative at 3 x 2, 3 x 3 and 6 x 2 grids). Where the torus pipelines
chunks, it therefore sums such a column in rank order instead (`ordered_column`: reduce-scatter
by all-to-all plus an FP32 sum, then all-gather; the bytes of a ring), with chunks or without,
so the chunks change no bit. Where it does not (Horovod, whose collectives run one at a time;
an engine with a native NCCL reduce-scatter) the column stays the engine's all-reduce, no chunks
are picked there by default, and a count the caller forces is taken as given, at FP32 rounding.
tests/workers/pipeline_and_wire.py checks both.
"""
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tftorus.torus.communicator import Communicator
from tftorus.torus.grid import TorusGrid

#: Chunk sizes, measured on the emulated 2 x 2 cluster at 0.25 Gbit/s
#: (docs/studies/emulated_cluster.md): the pipeline's fill and drain are one chunk's row phases,
#: so small chunks hide more, while each chunk's three collectives pay a fixed cost (a few ms
#: here, hidden behind the network while the column is busy). 1 MiB chunks of a 16 MiB buffer and
#: 4 MiB chunks of 64 MiB were the fastest tried; 4 chunks of 16 MiB left the tf engine 1.13x
#: slower.
MIN_CHUNK_BYTES = 1 << 20
MAX_CHUNKS = 16


def torus_allreduce(comm: Communicator, grid: TorusGrid, flat: tf.Tensor,
                    chunks: int = 1) -> tf.Tensor:
    """The 2D torus on a buffer whose length is a multiple of `chunks * grid.x`."""
    return torus_pipeline(comm, grid, [(flat, chunks, None)])[0]


def torus_pipeline(comm: Communicator, grid: TorusGrid,
                   buffers: Sequence[Tuple[tf.Tensor, int, Optional[str]]]) -> List[tf.Tensor]:
    """The torus on several buffers ((flat, chunks, name scope or None) each, in the order they
    are ready), their chunks as one pipeline: the next buffer's first reduce-scatter goes to the
    row while this one's last chunks are in the column, so on an engine that runs different
    groups' collectives at once the column does not wait for a row phase between buffers (one
    fill and one drain for them all, not one each). Each chunk is summed by the same ranks in
    the same order as alone, so no bit changes."""
    row, col = grid.row_group(comm.rank), grid.col_group(comm.rank)
    parts = []  # (buffer, chunk): every chunk of every buffer, in issue order
    for b, (flat, chunks, _) in enumerate(buffers):
        parts += [(b, piece) for piece in (tf.split(flat, chunks) if chunks > 1 else [flat])]

    def phase(i, run):
        scope = buffers[parts[i][0]][2]
        if scope is None:
            return run()
        with tf.name_scope(scope):
            return run()

    def column_sum(shard):
        ordered = ordered_column(grid, comm, shard.dtype)
        return (comm.sum_in_rank_order if ordered else comm.all_reduce)(shard, col)

    n = len(parts)
    scattered, reduced, gathered = [None] * n, [None] * n, [None] * n
    # Issued in pipeline order, which is the order engines with per-group ordering run a
    # group's collectives in: the row runs RS(i), AG(i-2), RS(i+1), ... while the column runs
    # AR(i-1), AR(i), ... (one chunk: RS, AR, AG, one after the other)
    for step in range(n + 2):
        i = step
        if i < n:
            scattered[i] = phase(i, lambda: comm.reduce_scatter(parts[i][1], row))  # horizontal
        i = step - 1
        if 0 <= i < n:
            reduced[i] = phase(i, lambda: column_sum(scattered[i]))  # vertical, 1/X of it
        i = step - 2
        if 0 <= i < n:
            gathered[i] = phase(i, lambda: comm.all_gather(reduced[i], row, equal_sizes=True))
    out = []
    for b in range(len(buffers)):
        mine = [g for (owner, _), g in zip(parts, gathered) if owner == b]
        out.append(mine[0] if len(mine) == 1 else tf.concat(mine, axis=0))
    return out


def ring_allreduce(comm: Communicator, grid: TorusGrid, flat: tf.Tensor,
                   chunks: int = 1) -> tf.Tensor:
    del grid, chunks  # flat: the whole world is one group, and one collective pipelines nothing
    return comm.all_reduce(flat, comm.all_ranks())


def hierarchical_allreduce(comm: Communicator, grid: TorusGrid, flat: tf.Tensor,
                           chunks: int = 1) -> tf.Tensor:
    """Leader-based, on the node grid (a row per node, tftorus.torus.grid.hierarchical_grid)."""
    del chunks  # pipeline_chunks gives only the torus more than one
    row = grid.row_group(comm.rank)
    node_sum = comm.all_reduce(flat, row)  # step 1: inside the node
    # Every rank runs the same ops, so that engines which match collectives by the name of
    # their input (Horovod) pair them across ranks; only the sizes differ by rank.
    n = node_sum.shape[0] if node_sum.shape[0] is not None else tf.shape(node_sum)[0]
    length = n if comm.rank == row[0] else 0
    # step 2: the leaders (the first column) all-reduce the whole buffer across the hosts; the
    # other columns all-reduce nothing
    across = comm.all_reduce(node_sum[:length], grid.col_group(comm.rank))
    # step 3: the leader's sum to its node; the others add zeros, which leaves it bit for bit
    return comm.all_reduce(tf.pad(across, [[0, n - length]]), row)


ALGORITHMS: Dict[str, Callable[[Communicator, TorusGrid, tf.Tensor, int], tf.Tensor]] = {
    "torus": torus_allreduce,
    "ring": ring_allreduce,
    "hierarchical": hierarchical_allreduce,
}


AUTO = "auto"

#: Below this, `auto` sends a buffer as one all-reduce even across hosts: the torus' three
#: collectives in turn cost three latencies where one pays, and a small buffer's bytes are not
#: what limits it.
SMALL_BUFFER_BYTES = 256 << 10


def check_algorithm(name: str) -> str:
    if name != AUTO and name not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {name!r}; choose one of "
                         f"{[AUTO] + sorted(ALGORITHMS)}")
    return name


def choose(name: str, grid: TorusGrid, comm: Communicator, nbytes: int) -> str:
    """The algorithm a fused buffer of `nbytes` goes by: `name` itself, or for 'auto':

      one host (every rank on it)         -> 'ring': the engine's own all-reduce; the torus only
                                             adds steps where no slow link is to be spared
      a grid with one row or one column   -> 'ring': the torus would be a ring anyway
      a buffer under SMALL_BUFFER_BYTES   -> 'ring': latency, not bytes, limits it
      otherwise                           -> 'torus': its column phase alone crosses the hosts,
                                             with 1/X of the buffer per rank

    Everything read here (world and host sizes, the grid, the buffer's static size) is the same
    on every rank, so all ranks choose alike; the consistency check compares the choices too.
    """
    if name != AUTO:
        return name
    if comm.local_size >= comm.size or grid.x == 1 or grid.y == 1:
        return "ring"
    return "ring" if nbytes < SMALL_BUFFER_BYTES else "torus"


def packs(name: str, comm: Communicator, dtype: tf.DType) -> bool:
    """Whether a bucket going by `name` is packed into one buffer, or handed over tensor by
    tensor: the flat ring on an engine that fuses its all-reduces by itself (Horovod's
    background thread packs whatever is ready each cycle, as for Horovod's own optimizer), where
    our packing would only add copies and hold each tensor back until its bucket is complete.
    Measured on one host of 4 ranks, FP32: packed, the step was 1.06-1.12 of Horovod's
    optimizer; tensor by tensor, 0.90 (docs/studies/emulated_step.md)."""
    return not (name == "ring" and comm.fuses_all_reduce(dtype, comm.all_ranks()))


def _ring_order_shows(grid: TorusGrid, dtype: tf.DType) -> bool:
    """Whether an engine's ring all-reduce of the column can round an element differently with
    its place in the buffer: floats summed at 32 or 64 bits over 3+ ranks."""
    return grid.y >= 3 and dtype.is_floating and dtype.size >= 4


def ordered_column(grid: TorusGrid, comm: Communicator, dtype: tf.DType) -> bool:
    """Whether the torus sums its column in rank order (Communicator.sum_in_rank_order) rather
    than with the engine's all-reduce: for FP32/FP64 columns of 3+ ranks on engines that
    pipeline chunks, so that chunks change no bit. The same with chunks or without."""
    return comm.concurrent_groups and comm.rank_ordered_sums and _ring_order_shows(grid, dtype)


def chunks_keep_bits(grid: TorusGrid, comm: Communicator, dtype: tf.DType) -> bool:
    """Whether cutting a buffer of `dtype` into chunks leaves every bit of its sum as it is:
    not where an engine's ring sums a float column of 3+ ranks (it is then summed in rank order
    where the engine pipelines, ordered_column). The fixed rule and the planner both ask."""
    return not _ring_order_shows(grid, dtype) or ordered_column(grid, comm, dtype)


def pipeline_chunks(name: str, grid: TorusGrid, comm: Communicator, nbytes: int,
                    requested: Optional[int] = None, dtype: tf.DType = tf.float32) -> int:
    """How many chunks the torus cuts a buffer of `nbytes` of `dtype` into (1: no pipelining).

    `requested` (TorusOptions.pipeline_chunks) wins when given. Otherwise chunks only where
    they can overlap something: a torus with both a row and a column phase, spanning more than
    one host (on one host all phases share the same memory and cores), on an engine that runs
    collectives of different groups at the same time, and where they leave every bit of the
    result as it is (a floating-point column of 3+ ranks summed at 32 or 64 bits only where it
    is summed in rank order: see the module's docstring); then one chunk per MIN_CHUNK_BYTES, at
    most MAX_CHUNKS.
    """
    if name != "torus":
        return 1
    if requested is not None:
        return requested
    if grid.x == 1 or grid.y == 1 or comm.local_size >= comm.size or not comm.concurrent_groups:
        return 1
    if not chunks_keep_bits(grid, comm, dtype):
        return 1
    return int(max(1, min(MAX_CHUNKS, nbytes // MIN_CHUNK_BYTES)))


def check_chunks(chunks) -> None:
    if chunks is not None and (not isinstance(chunks, int) or isinstance(chunks, bool)
                               or chunks < 1):
        raise ValueError(f"pipeline_chunks must be None (chosen by buffer size and engine) or a "
                         f"whole number >= 1 (1: no pipelining), got {chunks!r}")


def alignment(name: str, grid: TorusGrid, chunks: int = 1) -> int:
    """Buffers are padded to a multiple of this so every chunk's row shards are equal."""
    return grid.x * chunks if name == "torus" else 1
