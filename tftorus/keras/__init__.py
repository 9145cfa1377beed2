"""`import tftorus.keras as hvd` in place of `import horovod.tensorflow.keras as hvd`.

Horovod's Keras API (callbacks for broadcast, metric averaging and LR warm-up, rank(), size(),
...), with the optimizer, load_model and init reducing over the 2D torus; and BatchSizeControl,
the paper's batch-size control (Horovod's backward_passes_per_step is fixed for the run).
Everything exported is listed in __all__.

Where Horovod is installed (the classic stack: Keras 2) every other public name of
horovod.tensorflow.keras is Horovod's own, and `elastic` is tftorus.keras.elastic (Horovod's
elastic Keras API, the torus re-formed on every reset). Where it is not (the current stack:
Keras 3), the optimizer, load_model, callbacks and elastic's states and callbacks are
tftorus.keras3's (elastic over a world of fixed size), the queries and collectives
tftorus.without_horovod's, and Horovod's other names raise one line naming the classic stack.
"""
from tftorus import stack
from tftorus.batch_size_control import BatchSizeControl
from tftorus.compression import Compression
from tftorus.context import init, shutdown
from tftorus.reduction import TorusOptions, reduce_gradients
from tftorus.replan_callback import ReplanCallback

_OWN = ["init", "shutdown", "DistributedOptimizer", "load_model", "reduce_gradients",
        "Compression", "TorusOptions", "BatchSizeControl", "ReplanCallback"]
_QUERIES = ["Average", "Sum", "allgather", "allreduce", "broadcast", "callbacks", "rank", "size",
            "local_rank", "local_size", "cross_rank", "cross_size", "is_initialized",
            "mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled",
            "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built"]

if stack.HOROVOD:
    from horovod.tensorflow.keras import (  # noqa: F401  Horovod's own, unchanged
        Average, ProcessSet, Sum, add_process_set, allgather, allreduce, broadcast,
        broadcast_global_variables, callbacks, ccl_built, cross_rank, cross_size, cuda_built,
        ddl_built, global_process_set, gloo_built, gloo_enabled, is_initialized,
        is_version_greater_equal_than, local_rank, local_size, mpi_built, mpi_enabled,
        mpi_threads_supported, nccl_built, rank, reducescatter, remove_process_set, rocm_built,
        size, start_timeline, stop_timeline)

    from tftorus.keras import elastic
    from tftorus.optimizer import DistributedOptimizer, load_model

    __all__ = _OWN + _QUERIES + [
        "elastic", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
        "broadcast_global_variables", "reducescatter", "start_timeline", "stop_timeline",
        "is_version_greater_equal_than"]
else:
    from tftorus import horovod_collectives as _collectives
    from tftorus.horovod_common import is_version_greater_equal_than
    from tftorus.keras import elastic  # Horovod's Keras states and callbacks, a fixed world
    from tftorus.keras3 import callbacks
    from tftorus.keras3.optimizer import DistributedOptimizer, load_model
    from tftorus.keras3.sync_batch_norm import SyncBatchNormalization
    from tftorus.without_horovod import (  # Horovod's names, answered by the tf engine
        Average, ProcessSet, Sum, add_process_set, broadcast_object, broadcast_variables,
        ccl_built, cross_rank, cross_size, cuda_built, ddl_built, global_process_set,
        gloo_built, gloo_enabled, is_initialized, local_rank, local_size, mpi_built,
        mpi_enabled, mpi_threads_supported, nccl_built, rank, remove_process_set, rocm_built,
        size)

    # Horovod's Keras collectives take (value, name, ...) where horovod.tensorflow's take
    # (tensor, average, ...): the same collectives, with the Keras module's parameters.
    def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
                  op=None, compression=Compression.none):
        """Horovod's Keras allreduce: `value` averaged (or op=Sum, Min, Max, Product) over
        every rank, scaled before and after."""
        return _collectives.allreduce(value, average=average, compression=compression, op=op,
                                      prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor, name=name)

    def allgather(value, name=None):
        """Horovod's Keras allgather: every rank's `value` along the first dimension."""
        return _collectives.allgather(value, name=name)

    def broadcast(value, root_rank, name=None):
        """Horovod's Keras broadcast: root_rank's `value` on every rank."""
        return _collectives.broadcast(value, root_rank, name=name)

    def reducescatter(value, name=None, op=Average):
        """Horovod's Keras reducescatter: `value` averaged (or summed, op=hvd.Sum) over every
        rank, each keeping its part of the first dimension."""
        from tftorus.horovod_collectives import reducescatter as reduce_scatter
        return reduce_scatter(value, op=op, name=name)

    __all__ = _OWN + _QUERIES + [
        "broadcast_object", "broadcast_variables", "ProcessSet", "global_process_set",
        "add_process_set", "remove_process_set", "reducescatter", "elastic"]

    __all__ += ["SyncBatchNormalization",  # horovod.tensorflow's, for Keras 3 models
                "is_version_greater_equal_than"]

    def __getattr__(name):  # Horovod's names without a meaning here: one line naming the stack
        from tftorus.without_horovod import missing
        raise missing("tftorus.keras", name)
