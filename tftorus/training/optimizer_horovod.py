"""Drop-in DistributedOptimizer / DistributedGradientTape whose gradients go over the torus.

Horovod's wrappers already do everything around the reduction right: they keep the wrapped
optimizer's class name (so a saved model loads without Horovod), accumulate
`backward_passes_per_step` locally, skip worker-local variables, and hook Keras 2.15's new and
legacy optimizers and LossScaleOptimizer. They build their reduction with
`horovod.tensorflow._make_allreduce_grads_fn` while being constructed; we hand them ours for
exactly that moment (under a lock) and keep all the rest.
"""
import contextlib
import inspect
import threading

import horovod
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd_keras
import tensorflow as tf

from tftorus.runtime import process_state, reduction
from tftorus.runtime.reduction import (TorusOptions, reduce_gradients,  # noqa: F401
                                       reducing_optimizer)

_SEAM_LOCK = threading.RLock()

# The seam: the parameters of horovod.tensorflow._make_allreduce_grads_fn as Horovod 0.28.1's
# wrappers call it. A Horovod whose function differs would take our reduction with other
# arguments, or not call it at all: refuse it at the first wrapper, saying which Horovod works.
SEAM_PARAMETERS = ("name", "device_dense", "device_sparse", "compression", "sparse_as_dense",
                   "op", "gradient_predivide_factor", "groups", "process_set")


def check_seam() -> None:
    found = getattr(hvd_tf, "_make_allreduce_grads_fn", None)
    params = tuple(inspect.signature(found).parameters) if callable(found) else None
    if params != SEAM_PARAMETERS:
        version = getattr(horovod, "__version__", "unknown")
        raise ImportError(
            f"tftorus reduces gradients inside Horovod's wrappers through "
            f"horovod.tensorflow._make_allreduce_grads_fn{SEAM_PARAMETERS}, as in Horovod "
            f"0.28.1; this Horovod ({version}) has "
            f"{'no such function' if params is None else params}: install horovod==0.28.1 "
            f"(bash run_scripts/setup.sh does)")


@contextlib.contextmanager
def torus_gradient_reduction(options: TorusOptions):
    """While active, Horovod's wrappers built in this thread reduce gradients with tftorus."""

    def make_allreduce_grads_fn(name, device_dense, device_sparse, compression, sparse_as_dense,
                                op, gradient_predivide_factor, groups,
                                process_set=hvd_tf.global_process_set):
        del device_dense, device_sparse  # placement follows the gradients
        return reduction.make_allreduce_grads_fn(
            name, compression, sparse_as_dense, op, gradient_predivide_factor, groups,
            process_set, options)

    check_seam()
    with _SEAM_LOCK:
        original = hvd_tf._make_allreduce_grads_fn
        hvd_tf._make_allreduce_grads_fn = make_allreduce_grads_fn
        try:
            yield
        finally:
            hvd_tf._make_allreduce_grads_fn = original


class WorldProcessSet(hvd_tf.ProcessSet):
    """All ranks, answered by the tf engine: Horovod's optimizer and tape wrappers ask their
    process set for size() and included(); without a Horovod runtime (TF_CONFIG clusters) this
    answers from the TensorFlow cluster instead."""

    whole_world = True  # process_state.is_whole_world

    def __init__(self, comm):
        super().__init__(list(range(comm.size)))
        self.process_set_id = 0
        self._comm = comm

    def size(self):
        return self._comm.size

    def rank(self):
        return self._comm.rank

    def included(self):
        return True


def _world_set_without_horovod(engine, kwargs):
    """On a TF_CONFIG cluster (tf engine, no Horovod runtime) Horovod's wrappers still ask their
    process set for size() and included(): hand them one that the tf engine answers."""
    if "process_set" not in kwargs and not hvd_tf.is_initialized():
        kwargs["process_set"] = WorldProcessSet(process_state.communicator(engine))
    return kwargs


def over_the_torus(horovod_wrapper, wrapped, args, kwargs, takes_process_set: bool = True):
    """`horovod_wrapper(wrapped, *args, **kwargs)` (one of Horovod's optimizer or tape
    wrappers) with its gradients reduced by tftorus: the one implementation behind every
    wrapper below and tftorus.DistributedOptimizer. kwargs may hold the TorusOptions."""
    options = TorusOptions.pop_from(kwargs)
    if takes_process_set:
        kwargs = _world_set_without_horovod(options.engine, kwargs)
    with torus_gradient_reduction(options):
        return horovod_wrapper(wrapped, *args, **kwargs)


def check_optimizer(optimizer) -> None:
    if isinstance(optimizer, str) or not callable(getattr(optimizer, "apply_gradients", None)):
        # e.g. 'sgd', which compile() takes
        raise TypeError(f"DistributedOptimizer wraps an optimizer instance, e.g. "
                        f"tf.keras.optimizers.SGD(0.1); got {optimizer!r}")


def DistributedOptimizer(optimizer, *args, **kwargs):
    """`horovod.tensorflow.keras.DistributedOptimizer`, reducing over the 2D torus.

    Takes every argument of Horovod 0.28.1's (name, device_dense, device_sparse, compression,
    sparse_as_dense, gradient_predivide_factor, op, backward_passes_per_step,
    average_aggregated_gradients, num_groups, groups, process_set, scale_local_gradients), plus
    the torus options (`torus_options=TorusOptions(...)`, or its fields by name):

      algorithm: 'auto' (default: per fused buffer, by the planner from the links measured at
        init, tftorus/planning/planner.py; on one host the engine's own all-reduce), 'torus' (the
        paper's), 'ring' (flat) or 'hierarchical' (per node, then across).
      grid: None for the grid given to tftorus.init(), or 'YxX' / (Y, X) / row length / 'paper'.
      fusion_threshold_bytes: largest fused buffer (default None: planned; 16 MiB on one host);
        buckets fill in the order the backward pass makes gradients, so the first goes out
        while it still runs; 0: no fusion.
      check_consistency: compare tensor shapes across ranks each step (one 48-byte all-reduce),
        so a rank with different gradients raises instead of hanging.
      engine: 'horovod' (process sets) or 'tf' (TensorFlow's collective ops); None: the engine
        tftorus.init() started.
      pipeline_chunks: chunks per fused buffer, so one chunk's row phase overlaps another's
        column phase; None: planned (off on one host and on Horovod, which runs its
        collectives one at a time); 1: off.
    """
    check_optimizer(optimizer)
    wrapped = over_the_torus(hvd_keras.DistributedOptimizer, optimizer, args, kwargs)
    # Horovod's class keeps the wrapped one's name, which is enough for HDF5; the Keras v3 format
    # also records the module, which Horovod leaves as its own (loading then needs it): the
    # wrapped class' module makes a saved model load with Keras alone, as its own optimizer.
    type(wrapped).__module__ = type(optimizer).__module__
    return wrapped


def DistributedGradientTape(gradtape, *args, **kwargs):
    """`horovod.tensorflow.DistributedGradientTape`, reducing over the 2D torus.

    Takes every argument of Horovod 0.28.1's, plus the torus options of DistributedOptimizer.
    """
    return over_the_torus(hvd_tf.DistributedGradientTape, gradtape, args, kwargs)


def PartialDistributedGradientTape(gradtape, *args, local_layers=None, **kwargs):
    """`horovod.tensorflow.PartialDistributedGradientTape` over the torus: the gradients of
    `local_layers` (a Keras layer or a list of them) stay on each worker (scaled by 1/size unless
    scale_local_gradients=False, as Horovod's), the others are reduced as by
    DistributedGradientTape, whose arguments it takes."""
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, tf.keras.layers.Layer):
        local_layers = [local_layers]
    if not all(isinstance(layer, tf.keras.layers.Layer) for layer in local_layers):
        raise ValueError("local_layers must be tf.keras.layers.Layer objects")
    tape = DistributedGradientTape(gradtape, *args, **kwargs)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape


def load_model(filepath, *args, **kwargs):
    """`horovod.tensorflow.keras.load_model`: a saved model whose optimizer reduces over the
    torus (torus options as DistributedOptimizer's)."""
    return over_the_torus(hvd_keras.load_model, filepath, args, kwargs, takes_process_set=False)
