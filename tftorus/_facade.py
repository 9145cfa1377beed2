"""What `import tftorus` gives (tftorus/__init__.py says what and where from)."""
from tftorus.horovod_api.process_sets import init
from tftorus.runtime import plain_python
# modules the guide names by their public paths: tftorus.world (rank, size, barrier, ... on either
# engine), tftorus.stack (HorovodRequired), tftorus.compression (Horovod's submodule name)
from tftorus.runtime import stack, world
from tftorus.torus import compression
from tftorus.runtime.process_state import shutdown
from tftorus.runtime.reduction import (SUPPORTED_DTYPES, TorusOptions, fused_allreduce,
                                       gradient_reducer, reduce_gradients, replan)
from tftorus.torus.compression import Compression  # adds bf16 to Horovod's choices
from tftorus.torus.grid import PAPER_GRIDS, GridError, TorusGrid, plan_grid, resolve_grid

__version__ = "0.1.0"

plain_python.exempt_from_autograph()  # before any step is traced: tftorus runs as it is there
del plain_python

_OWN = [
    "init", "shutdown", "DistributedOptimizer", "DistributedGradientTape", "Compression",
    "TorusOptions", "TorusGrid", "GridError", "PAPER_GRIDS", "plan_grid", "resolve_grid",
    "gradient_reducer", "reduce_gradients", "fused_allreduce", "SUPPORTED_DTYPES", "world",
    "replan",
]

if stack.HOROVOD:
    import horovod.tensorflow as _hvd_tf
    from horovod.tensorflow import (Adasum, Average,  # noqa: F401  Horovod's own, unchanged
                                    BroadcastGlobalVariablesHook, LocalGradientAggregationHelper,
                                    Max, Min, ProcessSet, Product, Sum, SyncBatchNormalization,
                                    add_process_set, allgather, allgather_object, allreduce,
                                    alltoall, broadcast, broadcast_, broadcast_global_variables,
                                    broadcast_object, broadcast_object_fn, broadcast_variables,
                                    ccl_built, check_extension, check_num_rank_power_of_2,
                                    cross_rank, cross_size, cuda_built, ddl_built, functions,
                                    global_process_set, gloo_built, gloo_enabled, gpu_available,
                                    gradient_aggregation, gradient_aggregation_eager,
                                    grouped_allgather, grouped_allreduce, grouped_reducescatter,
                                    handle_average_backwards_compatibility, is_homogeneous,
                                    is_initialized, join, local_rank, local_rank_op, local_size,
                                    local_size_op, mpi_built, mpi_enabled, mpi_ops,
                                    mpi_threads_supported, nccl_built, process_set_included_op,
                                    rank, rank_op, reducescatter, refs_to_vars, remove_process_set,
                                    rocm_built, size, size_op, split_list, start_timeline,
                                    stop_timeline, sync_batch_norm, util, vars_to_refs)
    from horovod.tensorflow.util import _executing_eagerly  # noqa: F401  Horovod's tests call it

    from tftorus import elastic
    from tftorus.training.optimizer_horovod import (DistributedGradientTape,
                                                    PartialDistributedGradientTape, check_optimizer,
                                                    over_the_torus, torus_gradient_reduction)

    def DistributedOptimizer(optimizer, *args, **kwargs):
        """`horovod.tensorflow.DistributedOptimizer` (its arguments, for legacy TF optimizers and
        Keras ones), reducing over the torus; torus options as tftorus.keras.DistributedOptimizer's.
        The same implementation as that one (tftorus.training.optimizer_horovod.over_the_torus)."""
        check_optimizer(optimizer)
        return over_the_torus(_hvd_tf.DistributedOptimizer, optimizer, args, kwargs)

    __all__ = _OWN + [
        "PartialDistributedGradientTape", "torus_gradient_reduction", "elastic",
        # Horovod's, unchanged
        "Average", "Sum", "Adasum", "Min", "Max", "Product", "ProcessSet", "global_process_set",
        "add_process_set", "remove_process_set", "allreduce", "grouped_allreduce", "allgather",
        "grouped_allgather", "allgather_object", "broadcast", "broadcast_", "broadcast_object",
        "broadcast_object_fn", "broadcast_variables", "broadcast_global_variables", "alltoall",
        "reducescatter", "grouped_reducescatter", "join", "SyncBatchNormalization",
        "BroadcastGlobalVariablesHook", "LocalGradientAggregationHelper",
        "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "rank_op",
        "size_op", "local_rank_op", "local_size_op", "process_set_included_op", "is_initialized",
        "is_homogeneous", "start_timeline", "stop_timeline", "mpi_built", "mpi_enabled",
        "mpi_threads_supported", "gloo_built", "gloo_enabled", "nccl_built", "ddl_built",
        "ccl_built", "cuda_built", "rocm_built", "gpu_available", "check_extension",
        "check_num_rank_power_of_2", "handle_average_backwards_compatibility", "split_list",
        "vars_to_refs", "refs_to_vars",
        # Horovod's submodules
        "util", "mpi_ops", "functions", "sync_batch_norm", "gradient_aggregation",
        "gradient_aggregation_eager",
    ]

else:
    from tftorus import elastic  # Horovod's states and run() over a world of fixed size
    from tftorus.horovod_api.current_stack import (  # Horovod's names, answered by the tf engine
        Adasum, Average, DistributedGradientTape, Max, Min, PartialDistributedGradientTape,
        ProcessSet, Product, Sum, _executing_eagerly, add_process_set, allgather, allgather_object,
        allreduce, alltoall, broadcast, broadcast_, broadcast_global_variables, broadcast_object,
        broadcast_object_fn, broadcast_variables, ccl_built, cross_rank, cross_size, cuda_built,
        ddl_built, functions, global_process_set, gloo_built, gloo_enabled, grouped_allgather,
        grouped_allreduce, grouped_reducescatter, is_initialized, local_rank, local_rank_op,
        local_size, local_size_op, mpi_built, mpi_enabled, mpi_ops, mpi_threads_supported,
        nccl_built, process_set_included_op, rank, rank_op, reducescatter, remove_process_set,
        rocm_built, size, size_op, util)
    from tftorus.horovod_api.helpers import (  # Horovod's small helpers, pure Python
        check_num_rank_power_of_2, gpu_available, handle_average_backwards_compatibility,
        split_list)
    from tftorus.horovod_api.keras3_sync_batch_norm import SyncBatchNormalization
    from tftorus.horovod_api.util import refs_to_vars, vars_to_refs
    from tftorus.horovod_api import keras3_sync_batch_norm as sync_batch_norm
    from tftorus.training.optimizer_keras3 import DistributedOptimizer

    __all__ = _OWN + [
        "Average", "Sum", "Adasum", "Min", "Max", "Product", "ProcessSet", "global_process_set",
        "add_process_set", "remove_process_set", "allreduce", "grouped_allreduce", "allgather",
        "grouped_allgather", "allgather_object", "broadcast", "broadcast_", "broadcast_object",
        "broadcast_object_fn", "broadcast_variables", "broadcast_global_variables", "alltoall",
        "reducescatter", "grouped_reducescatter", "rank", "size", "local_rank", "local_size",
        "cross_rank", "cross_size", "rank_op", "size_op", "local_rank_op", "local_size_op",
        "process_set_included_op", "is_initialized", "mpi_built", "mpi_enabled",
        "mpi_threads_supported", "gloo_built", "gloo_enabled", "nccl_built", "ddl_built",
        "ccl_built", "cuda_built", "rocm_built",
        # Horovod's submodules: its collectives, object functions and util; elastic
        "mpi_ops", "functions", "util", "elastic", "PartialDistributedGradientTape",
    ]
    __all__ += ["SyncBatchNormalization", "sync_batch_norm"]  # Keras 3's (horovod_api)
    __all__ += ["check_num_rank_power_of_2", "gpu_available",
                "handle_average_backwards_compatibility", "split_list", "vars_to_refs",
                "refs_to_vars"]

    # Horovod's submodules importable by name, as a script ported from horovod.tensorflow
    # imports them: `from tftorus.util import _executing_eagerly`, `import tftorus.mpi_ops`
    import sys as _sys
    for _name, _module in (("mpi_ops", mpi_ops), ("functions", functions), ("util", util)):
        _sys.modules.setdefault(f"tftorus.{_name}", _module)
    del _sys, _name, _module

    def __getattr__(name):  # Horovod's names without a meaning here: one line naming the stack
        from tftorus.horovod_api.current_stack import missing
        raise missing("tftorus", name)
