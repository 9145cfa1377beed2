"""Horovod's API where Horovod is not installed (the current stack): the answers and collectives
of the tf engine, with Horovod's names and arguments, for `import tftorus as hvd` and
`import tftorus.keras as hvd`.

Everything runs over every rank (there are no process sets on the tf engine). Collectives are
exact: a broadcast is a sum to which every rank but the root adds zeros, an all-gather moves
bytes. A Horovod name with no meaning here raises `tftorus.stack.HorovodRequired` (one line
naming the classic stack) through `missing()`, which the facades' module __getattr__ calls.
"""
import pickle
import numpy as np
import tensorflow as tf

from tftorus import context, reduction, stack, tf_cluster, world
from tftorus.compression import Compression
from tftorus.stack import Adasum, Average, Max, Min, Product, Sum  # noqa: F401  Horovod's values

#: Horovod names the facades do not give on this stack, and what to use instead.
HOROVOD_ONLY = {
    "elastic": "elastic training re-forms Horovod's world; on this stack resume from the last "
               "checkpoint on the new world size (run_scripts/train.py does: --resume=auto)",
    "ProcessSet": "the tf engine reduces over every rank",
    "add_process_set": "the tf engine reduces over every rank",
    "remove_process_set": "the tf engine reduces over every rank",
    "global_process_set": "the tf engine reduces over every rank",
    "alltoall": "", "reducescatter": "", "grouped_reducescatter": "", "grouped_allreduce": "",
    "grouped_allgather": "", "join": "", "SyncBatchNormalization": "",
    "BroadcastGlobalVariablesHook": "use callbacks.BroadcastGlobalVariablesCallback(0) or "
                                    "broadcast_variables()",
    "broadcast_global_variables": "use broadcast_variables(model.variables, root_rank=0)",
    "PartialDistributedGradientTape": "", "start_timeline": "", "stop_timeline": "",
    "torus_gradient_reduction": "it swaps Horovod's reduction; DistributedOptimizer and "
                                "gradient_reducer work here",
    "is_homogeneous": "", "mpi_ops": "", "util": "", "functions": "", "sync_batch_norm": "",
    "gradient_aggregation": "", "gradient_aggregation_eager": "",
}


def missing(module: str, name: str):
    """The AttributeError for a name not on this stack's facade: HorovodRequired for
    Horovod's own names (a subclass of RuntimeError), AttributeError otherwise."""
    if name in HOROVOD_ONLY:
        return stack.horovod_required(f"{module}.{name}", HOROVOD_ONLY[name])
    return AttributeError(f"module {module!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------------------------
# Who am I
# ------------------------------------------------------------------------------------------------
def is_initialized() -> bool:
    return context.is_initialized()


def _cluster() -> tf_cluster.Cluster:
    if not context.is_initialized():
        raise ValueError("tftorus has not been initialized; use hvd.init() (tftorus.init())")
    return tf_cluster.current()


def rank() -> int:
    return _cluster().rank


def size() -> int:
    return _cluster().size


def local_rank() -> int:
    return _cluster().local_rank


def local_size() -> int:
    return _cluster().local_size


def cross_rank() -> int:
    """This host's index among the hosts (ranks are laid out host by host)."""
    return _cluster().rank // _cluster().local_size


def cross_size() -> int:
    """The number of hosts."""
    return _cluster().size // _cluster().local_size


def mpi_threads_supported() -> bool:
    return False


def _no(*args, **kwargs) -> bool:
    del args, kwargs
    return False


# Horovod's build queries: none of its back ends is here.
mpi_built = mpi_enabled = gloo_built = gloo_enabled = nccl_built = ddl_built = ccl_built = _no
cuda_built = rocm_built = _no


# ------------------------------------------------------------------------------------------------
# Collectives over every rank
# ------------------------------------------------------------------------------------------------
def _whole_world_only(process_set) -> None:
    if process_set is not None and not context.is_whole_world(process_set):
        raise ValueError("process sets are Horovod's; on the tf engine collectives run over "
                         "every rank: leave process_set out")


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=None, ignore_name_scope=False):
    """Horovod's allreduce: Average (default) or Sum over every rank, on the torus."""
    del device_dense, device_sparse, name, ignore_name_scope
    _whole_world_only(process_set)
    if average is not None and op is not None:
        raise ValueError("give op= or the deprecated average=, not both")
    op = op if op is not None else (Sum if average is False else Average)
    if op not in (Average, Sum):
        raise ValueError(f"op must be Average or Sum on the tf engine; got {op!r}")
    if isinstance(tensor, tf.IndexedSlices):
        values = allgather(tensor.values)
        if op == Average:
            values = values / tf.cast(size(), values.dtype)
        return tf.IndexedSlices(values, allgather(tensor.indices), tensor.dense_shape)
    return reduction.fused_allreduce([tensor], op, algorithm="auto", compression=compression,
                                     prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor)[0]


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Every rank's tensor, concatenated along the first dimension in rank order (ranks may
    give different first dimensions)."""
    del name, ignore_name_scope
    _whole_world_only(process_set)
    comm = context.communicator()
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        raise ValueError("allgather needs a tensor of rank >= 1 (Horovod's rule): reshape "
                         "it to [1]")
    return comm.all_gather(tensor, comm.all_ranks())


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """root_rank's tensor on every rank, bit for bit."""
    del name, ignore_name_scope
    _whole_world_only(process_set)
    comm = context.communicator()
    _check_root(root_rank, comm.size)
    tensor = tf.convert_to_tensor(tensor)
    if comm.size == 1:
        return tensor
    if tensor.dtype == tf.bool:
        return tf.cast(broadcast(tf.cast(tensor, tf.int32), root_rank), tf.bool)
    mine = tensor if comm.rank == root_rank else tf.zeros_like(tensor)
    return reduction.fused_allreduce([mine], "sum", algorithm="ring")[0]


def broadcast_variables(variables, root_rank, process_set=None, inplace=False):
    """Assign root_rank's values to `variables` on every rank."""
    del inplace
    _whole_world_only(process_set)
    _check_root(root_rank, context.communicator().size)
    world.broadcast_variables(variables, root_rank=root_rank)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """root_rank's picklable object on every rank."""
    del session, name
    _whole_world_only(process_set)
    comm = context.communicator()
    _check_root(root_rank, comm.size)
    if comm.size == 1:
        return obj
    data = _to_tensor(obj) if comm.rank == root_rank else None
    length = broadcast(tf.constant([0 if data is None else int(data.shape[0])], tf.int64),
                       root_rank)
    payload = data if data is not None else tf.zeros([int(length.numpy()[0])], tf.int32)
    return _from_tensor(broadcast(payload, root_rank))


def allgather_object(obj, session=None, name=None, process_set=None):
    """Every rank's picklable object, as a list in rank order."""
    del session, name
    _whole_world_only(process_set)
    comm = context.communicator()
    if comm.size == 1:
        return [obj]
    data = _to_tensor(obj)
    lengths = allgather(tf.constant([int(data.shape[0])], tf.int64)).numpy()
    flat, out, start = allgather(data), [], 0
    for n in lengths:
        out.append(_from_tensor(flat[start:start + int(n)]))
        start += int(n)
    return out


def _check_root(root_rank, world_size: int) -> None:
    if not 0 <= int(root_rank) < world_size:
        raise ValueError(f"root_rank {root_rank} is not a rank of a world of {world_size}")


def _to_tensor(obj) -> tf.Tensor:
    """Pickled bytes as int32 (the dtypes TF's CPU collectives move)."""
    return tf.constant(np.frombuffer(pickle.dumps(obj), np.uint8).astype(np.int32))


def _from_tensor(tensor: tf.Tensor):
    return pickle.loads(tensor.numpy().astype(np.uint8).tobytes())


# ------------------------------------------------------------------------------------------------
# The gradient tape
# ------------------------------------------------------------------------------------------------
class _DistributedGradientTape:
    """A finished tf.GradientTape whose gradient() averages over the workers on the torus."""

    def __init__(self, tape, reduce, scale_local_gradients: bool):
        self._tape, self._reduce = tape, reduce
        self._scale_local = scale_local_gradients
        self._local = set()

    def register_local_source(self, source):
        """A source whose gradient stays on this worker (scaled by 1/size, as Horovod's)."""
        self._local.add(stack.variable_key(source))

    def _is_local(self, source) -> bool:
        return stack.variable_key(source) in self._local

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = self._tape.gradient(target, sources, output_gradients, unconnected_gradients)
        flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads)
        shared = [i for i, s in enumerate(flat_sources) if not self._is_local(s)]
        reduced = self._reduce([flat_grads[i] for i in shared], [flat_sources[i] for i in shared])
        out = list(flat_grads)
        for i, g in zip(shared, reduced):
            out[i] = g
        n = context.communicator().size
        for i, s in enumerate(flat_sources):
            if self._is_local(s) and out[i] is not None and self._scale_local:
                out[i] = out[i] / tf.cast(n, out[i].dtype)
        return tf.nest.pack_sequence_as(grads, out)

    def __getattr__(self, name):
        return getattr(self._tape, name)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=None, scale_local_gradients=True, **torus):
    """Horovod's DistributedGradientTape over the torus: `gradtape.gradient(...)` averaged (or
    summed, op=Sum) over every rank. Torus options as DistributedOptimizer's."""
    del device_dense, device_sparse
    _whole_world_only(process_set)
    if op not in (Average, Sum):
        raise ValueError(f"op must be Average or Sum on the tf engine; got {op!r}")
    options = reduction.TorusOptions.pop_from(torus)
    if torus:
        raise TypeError(f"DistributedGradientTape() got unexpected arguments {sorted(torus)}")
    reduce = reduction.make_allreduce_grads_fn(
        "DistributedGradientTape", compression, sparse_as_dense, op, gradient_predivide_factor,
        groups if groups is not None else (num_groups or None), None, options)
    return _DistributedGradientTape(gradtape, reduce, scale_local_gradients)

