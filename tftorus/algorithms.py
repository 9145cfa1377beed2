"""All-reduce algorithms over a Communicator: the paper's 2D torus, and two baselines.

Each takes a flat 1-D buffer (already padded to `alignment(grid)`) and returns the elementwise
sum over the world. They differ in which groups carry which bytes:

  torus         reduce-scatter in the row, all-reduce of the 1/X shard in the column,
                all-gather in the row: 2(X-1) + 2(Y-1) sequential steps, ring-optimal bytes.
  ring          one all-reduce over the whole world (Horovod's flat all-reduce): 2(N-1) steps.
  hierarchical  all-reduce inside a node (row, X = ranks per node), then all-reduce of the
                *whole* buffer across nodes (column): the middle step moves X times the torus'.
"""
from typing import Callable, Dict

import tensorflow as tf

from tftorus.communicator import Communicator
from tftorus.grid import TorusGrid


def torus_allreduce(comm: Communicator, grid: TorusGrid, flat: tf.Tensor) -> tf.Tensor:
    row, col = grid.row_group(comm.rank), grid.col_group(comm.rank)
    shard = comm.reduce_scatter(flat, row)  # step 1: horizontal
    shard = comm.all_reduce(shard, col)  # step 2: vertical, on 1/X of the buffer
    return comm.all_gather(shard, row, equal_sizes=True)  # step 3: horizontal


def ring_allreduce(comm: Communicator, grid: TorusGrid, flat: tf.Tensor) -> tf.Tensor:
    del grid  # flat: the whole world is one group
    return comm.all_reduce(flat, comm.world())


def hierarchical_allreduce(comm: Communicator, grid: TorusGrid, flat: tf.Tensor) -> tf.Tensor:
    flat = comm.all_reduce(flat, grid.row_group(comm.rank))  # inside the node
    return comm.all_reduce(flat, grid.col_group(comm.rank))  # across nodes, full buffer


ALGORITHMS: Dict[str, Callable[[Communicator, TorusGrid, tf.Tensor], tf.Tensor]] = {
    "torus": torus_allreduce,
    "ring": ring_allreduce,
    "hierarchical": hierarchical_allreduce,
}


def check_algorithm(name: str) -> str:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {name!r}; choose one of {sorted(ALGORITHMS)}")
    return name


def alignment(name: str, grid: TorusGrid) -> int:
    """Buffers are padded to a multiple of this so every row member's shard is equal."""
    return grid.x if name == "torus" else 1
