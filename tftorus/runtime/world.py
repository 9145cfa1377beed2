"""rank(), size(), barrier() and broadcast_variables() for whichever engine runs.

Where Horovod runs (the Horovod engine, or the tf engine started with `with_horovod=True`)
these are Horovod's own. Otherwise (the tf engine, under horovodrun or on a TF_CONFIG cluster)
the answers come from the TensorFlow cluster and the data moves over the tf engine's
collectives. barrier() is the running communicator's (Communicator.barrier), whichever engine.
"""
from typing import Sequence

import tensorflow as tf

from tftorus.runtime import process_state, reduction
from tftorus.runtime.stack import hvd  # None on the current stack


def rank() -> int:
    return hvd.rank() if process_state.horovod_running() else process_state.communicator().rank


def size() -> int:
    return hvd.size() if process_state.horovod_running() else process_state.communicator().size


def allreduce_sum(tensor, name: str = "tftorus_sum") -> tf.Tensor:
    """Sum one tensor over all ranks, exactly for integers (metrics, BN statistics, barriers)."""
    if process_state.horovod_running():
        return hvd.allreduce(tensor, op=hvd.Sum, name=name)
    if process_state.communicator().size == 1:
        return tf.convert_to_tensor(tensor)
    return reduction.fused_allreduce([tensor], "sum", algorithm="ring")[0]


def barrier() -> None:
    """Return when every rank has called it: the running communicator's barrier."""
    if process_state.horovod_running() and not process_state.is_initialized():
        # Horovod alone (hvd.init(), no tftorus.init()): adopting it could need process sets it
        # lacks, but a world needs none, so a bare Horovod communicator answers.
        from tftorus.engines.horovod_engine import HorovodCommunicator
        HorovodCommunicator().barrier()
    else:
        process_state.communicator().barrier()  # raises "call tftorus.init()" when nothing runs


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int = 0) -> None:
    """Give every rank root_rank's values (initial weights, restored state)."""
    variables = list(variables)
    if process_state.horovod_running():
        hvd.broadcast_variables(variables, root_rank=root_rank)
        return
    comm = process_state.communicator()
    if comm.size == 1 or not variables:
        return
    if not 0 <= root_rank < comm.size:
        raise ValueError(f"root_rank {root_rank} is not a rank of a world of {comm.size}")
    # A sum where every rank but the root adds zeros is the root's value, bit for bit.
    # tf.convert_to_tensor reads a tf.Variable and a Keras 3 variable alike (no read_value())
    mine = [tf.convert_to_tensor(v) if comm.rank == root_rank else tf.zeros(v.shape, v.dtype)
            for v in variables]
    for variable, value in zip(variables, reduction.fused_allreduce(mine, "sum")):
        variable.assign(value)
