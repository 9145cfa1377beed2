"""`import tftorus.keras as hvd` in place of `import horovod.tensorflow.keras as hvd`.

Horovod's Keras API (callbacks for broadcast, metric averaging and LR warm-up, rank(), size(),
...), with the optimizer, load_model and init reducing over the 2D torus; and BatchSizeControl,
the paper's batch-size control (Horovod's backward_passes_per_step is fixed for the run).
Everything exported is listed in __all__.

Where Horovod is installed (the classic stack: Keras 2) every other public name of
horovod.tensorflow.keras is Horovod's own, and `elastic` is tftorus.keras.elastic (Horovod's
elastic Keras API, the torus re-formed on every reset). Where it is not (the current stack:
Keras 3), the optimizer and load_model are tftorus.training.optimizer_keras3's, the callbacks
and SyncBatchNormalization tftorus.horovod_api's Keras 3 ones, elastic's states and callbacks
tftorus.reliability.keras_elastic_on_tf_engine's (a world of fixed size), the queries and
collectives tftorus.horovod_api.current_stack's, and Horovod's other names raise one line
naming the classic stack.
"""
from tftorus.horovod_api.process_sets import init
from tftorus.runtime import stack
from tftorus.runtime.process_state import shutdown
from tftorus.runtime.reduction import TorusOptions, reduce_gradients
from tftorus.torus.compression import Compression
from tftorus.training.batch_size_control import BatchSizeControl
from tftorus.training.replan_callback import ReplanCallback

_OWN = ["init", "shutdown", "DistributedOptimizer", "load_model", "reduce_gradients",
        "Compression", "TorusOptions", "BatchSizeControl", "ReplanCallback"]
_QUERIES = ["Average", "Sum", "allgather", "allreduce", "broadcast", "callbacks", "rank", "size",
            "local_rank", "local_size", "cross_rank", "cross_size", "is_initialized",
            "mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled",
            "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built"]

if stack.HOROVOD:
    from horovod.tensorflow.keras import (Average,  # noqa: F401  Horovod's own, unchanged
                                          ProcessSet, Sum, add_process_set, allgather, allreduce,
                                          broadcast, broadcast_global_variables, callbacks,
                                          ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                                          global_process_set, gloo_built, gloo_enabled,
                                          is_initialized, is_version_greater_equal_than, local_rank,
                                          local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                                          nccl_built, rank, reducescatter, remove_process_set,
                                          rocm_built, size, start_timeline, stop_timeline)

    from tftorus.keras import elastic
    from tftorus.training.optimizer_horovod import DistributedOptimizer, load_model

    __all__ = _OWN + _QUERIES + [
        "elastic", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
        "broadcast_global_variables", "reducescatter", "start_timeline", "stop_timeline",
        "is_version_greater_equal_than"]
else:
    from tftorus.horovod_api import mpi_ops as _collectives
    from tftorus.horovod_api.current_stack import (  # Horovod's names, answered by the tf engine
        Average, ProcessSet, Sum, add_process_set, broadcast_object, broadcast_variables, ccl_built,
        cross_rank, cross_size, cuda_built, ddl_built, global_process_set, gloo_built, gloo_enabled,
        is_initialized, local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
        nccl_built, rank, remove_process_set, rocm_built, size)
    from tftorus.horovod_api.helpers import is_version_greater_equal_than
    from tftorus.horovod_api.keras3_sync_batch_norm import SyncBatchNormalization
    from tftorus.keras import elastic  # Horovod's Keras states and callbacks, a fixed world
    from tftorus.horovod_api import keras3_callbacks as callbacks
    from tftorus.training.optimizer_keras3 import DistributedOptimizer, load_model

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
        from tftorus.horovod_api.mpi_ops import reducescatter as reduce_scatter
        return reduce_scatter(value, op=op, name=name)

    __all__ = _OWN + _QUERIES + [
        "broadcast_object", "broadcast_variables", "ProcessSet", "global_process_set",
        "add_process_set", "remove_process_set", "reducescatter", "elastic"]

    __all__ += ["SyncBatchNormalization",  # horovod.tensorflow's, for Keras 3 models
                "is_version_greater_equal_than"]

    def __getattr__(name):  # Horovod's names without a meaning here: one line naming the stack
        from tftorus.horovod_api.current_stack import missing
        raise missing("tftorus.keras", name)
