"""Horovod's API where Horovod is not installed (the current stack): the names `import tftorus
as hvd` and `import tftorus.keras as hvd` export there, answered by the tf engine.

This file only gathers them: the queries and the gradient tape are here; the collectives
(Horovod's mpi_ops, with process sets) are tftorus/horovod_api/mpi_ops.py, the sets
tftorus/horovod_api/process_sets.py, the object collectives (Horovod's functions)
tftorus/horovod_api/functions.py, Horovod's util tftorus/horovod_api/util.py. A Horovod name with no
meaning here raises `tftorus.runtime.stack.HorovodRequired` (one line naming the classic stack, and
what to use) through `missing()`, which the facades' module __getattr__ calls.
"""
import keras
import tensorflow as tf

from tftorus.cluster import discovery, tf_runtime
from tftorus.horovod_api import functions  # noqa: F401
from tftorus.horovod_api import mpi_ops  # noqa: F401  Horovod's submodule names
from tftorus.horovod_api import util  # noqa: F401
from tftorus.horovod_api import process_sets
from tftorus.horovod_api.functions import (allgather_object, broadcast_object,  # noqa: F401
                                           broadcast_object_fn)
from tftorus.horovod_api.mpi_ops import (  # noqa: F401  Horovod's collectives and *_op ops
    allgather, allreduce, alltoall, broadcast, broadcast_, broadcast_global_variables,
    broadcast_variables, grouped_allgather, grouped_allreduce, grouped_reducescatter, local_rank_op,
    local_size_op, process_set_included_op, rank_op, reducescatter, size_op)
from tftorus.horovod_api.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                              global_process_set, remove_process_set)
from tftorus.horovod_api.util import _executing_eagerly  # noqa: F401  Horovod's tests call it
from tftorus.runtime import process_state, reduction, stack
from tftorus.runtime.stack import (Adasum, Average, Max, Min,  # noqa: F401  Horovod's values
                                   Product, Sum)
from tftorus.torus.compression import Compression

_TIMELINE = ("Horovod's timeline records its own background thread's work; profile with "
             "TensorFlow's profiler instead (tf.profiler.experimental.start(logdir) and stop())")
_ACCUMULATION = ("Horovod's own accumulation for backward_passes_per_step: give "
                 "backward_passes_per_step to DistributedOptimizer, or use "
                 "tftorus.keras.BatchSizeControl")

#: Horovod names the facades do not give on this stack, and what to use instead
#: (docs/guide/horovod_compatibility.md shows them; tests/test_horovod_compatibility.py holds them).
HOROVOD_ONLY = {
    "join": "a rank that has joined must answer the others' later collectives for them, which "
            "Horovod's background thread does and TF's collectives (each issued by every "
            "member) cannot; give every rank the same number of steps instead, agreed with "
            "hvd.allreduce(tf.constant(my_steps), op=hvd.Min)",
    "BroadcastGlobalVariablesHook": "a tf.estimator hook, and TensorFlow 2.16+ has no "
                                    "tf.estimator: use callbacks.BroadcastGlobalVariablesCallback"
                                    "(0) or broadcast_variables()",
    "broadcast_global_variables": "Keras 3 has no TF1 session to run it in (Horovod's raises "
                                  "in eager mode too): use callbacks."
                                  "BroadcastGlobalVariablesCallback(0) or "
                                  "broadcast_variables(model.variables, root_rank=0)",
    "start_timeline": _TIMELINE,
    "stop_timeline": _TIMELINE,
    "torus_gradient_reduction": "it swaps Horovod's reduction; DistributedOptimizer and "
                                "gradient_reducer work here",
    "is_homogeneous": "Horovod's launcher tells it every host's rank count; ask the ranks "
                      "instead: len(set(tftorus.allgather_object(hvd.local_size()))) == 1 "
                      "(allgather_object is horovod.tensorflow's, so tftorus' too, not "
                      "tftorus.keras')",
    "check_extension": "it checks that Horovod's compiled extension exists, and this stack "
                       "has none (tftorus compiles nothing)",
    "LocalGradientAggregationHelper": _ACCUMULATION,
    "gradient_aggregation": _ACCUMULATION,
    "gradient_aggregation_eager": _ACCUMULATION,
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
    return process_state.is_initialized()


def _cluster() -> discovery.Cluster:
    if not process_state.is_initialized():
        raise ValueError("tftorus has not been initialized; use hvd.init() (tftorus.init())")
    return tf_runtime.current()


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
# The gradient tape
# ------------------------------------------------------------------------------------------------
class _DistributedGradientTape:
    """A finished tf.GradientTape whose gradient() averages over the workers on the torus."""

    def __init__(self, tape, reduce, scale_local_gradients: bool, size: int):
        self._tape, self._reduce, self._size = tape, reduce, size
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
        for i, s in enumerate(flat_sources):
            if self._is_local(s) and out[i] is not None and self._scale_local:
                out[i] = out[i] / tf.cast(self._size, out[i].dtype)
        return tf.nest.pack_sequence_as(grads, out)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None):
        """gradient(), split: ([(local source, gradient)], [(shared source, gradient)])."""
        grads = self.gradient(target, sources, output_gradients)
        local, shared = [], []
        for source, grad in zip(sources, grads):
            (local if self._is_local(source) else shared).append((source, grad))
        return local, shared

    def __getattr__(self, name):
        return getattr(self._tape, name)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=None, scale_local_gradients=True, **torus):
    """Horovod's DistributedGradientTape over the torus: `gradtape.gradient(...)` averaged (or
    summed, op=Sum) over every rank, or over a process set's members (a flat all-reduce; on
    other ranks the gradients stay as they are, as Horovod's). Torus options as
    DistributedOptimizer's."""
    del device_dense, device_sparse
    if op not in (Average, Sum):
        raise ValueError(f"op must be Average or Sum on the tf engine; got {op!r}")
    options = reduction.TorusOptions.pop_from(torus)
    if torus:
        raise TypeError(f"DistributedGradientTape() got unexpected arguments {sorted(torus)}")
    whole = process_state.is_whole_world(process_set)
    if not whole and not process_set.included():
        return _DistributedGradientTape(gradtape, lambda grads, sources: list(grads),
                                        scale_local_gradients, 1)
    size = process_state.communicator().size if whole else len(process_sets.group_of(process_set))
    reduce = reduction.make_allreduce_grads_fn(
        "DistributedGradientTape", compression, sparse_as_dense, op, gradient_predivide_factor,
        groups if groups is not None else (num_groups or None),
        None if whole else process_set, options)
    return _DistributedGradientTape(gradtape, reduce, scale_local_gradients, size)


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="",
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=None, local_layers=None,
                                   scale_local_gradients=True, **torus):
    """Horovod's PartialDistributedGradientTape: DistributedGradientTape whose `local_layers`
    (a Keras layer or a list of them) keep their gradients on each worker, scaled by 1/size
    unless scale_local_gradients=False."""
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    if not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("local_layers must be Keras layers (keras.layers.Layer), got "
                         f"{[type(layer).__name__ for layer in local_layers]}")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients, **torus)
    for layer in local_layers:
        for variable in layer.trainable_weights:
            tape.register_local_source(variable)
    return tape
