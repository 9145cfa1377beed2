"""`import tftorus.keras as hvd` in place of `import horovod.tensorflow.keras as hvd`.

Horovod's Keras API (callbacks for broadcast, metric averaging and LR warm-up, rank(), size(),
...), with the optimizer, load_model and init reducing over the 2D torus; and BatchSizeControl,
the paper's batch-size control (Horovod's backward_passes_per_step is fixed for the run).
Everything exported is listed in __all__: every public name of horovod.tensorflow.keras
(ours where it reduces or re-forms the torus, Horovod's otherwise); `elastic` is
tftorus.keras.elastic (Horovod's elastic Keras API, the torus re-formed on every reset).
"""
from horovod.tensorflow.keras import (  # noqa: F401  Horovod's own, unchanged
    Average, ProcessSet, Sum, add_process_set, allgather, allreduce, broadcast,
    broadcast_global_variables, callbacks, ccl_built, cross_rank, cross_size, cuda_built,
    ddl_built, global_process_set, gloo_built, gloo_enabled, is_initialized,
    is_version_greater_equal_than, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, reducescatter, remove_process_set, rocm_built, size,
    start_timeline, stop_timeline)

from tftorus.batch_size_control import BatchSizeControl
from tftorus.keras import elastic
from tftorus.compression import Compression
from tftorus.context import init, shutdown
from tftorus.optimizer import DistributedOptimizer, load_model, reduce_gradients
from tftorus.reduction import TorusOptions

__all__ = [
    # tftorus' own
    "init", "shutdown", "DistributedOptimizer", "load_model", "reduce_gradients", "Compression",
    "TorusOptions", "BatchSizeControl", "elastic",
    # Horovod's, unchanged
    "Average", "Sum", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "allgather", "allreduce", "broadcast", "broadcast_global_variables",
    "reducescatter", "callbacks", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "is_initialized", "start_timeline", "stop_timeline", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled", "nccl_built",
    "ddl_built", "ccl_built", "cuda_built", "rocm_built", "is_version_greater_equal_than",
]

