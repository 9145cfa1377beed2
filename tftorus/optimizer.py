"""Drop-in DistributedOptimizer / DistributedGradientTape whose gradients go over the torus.

Horovod's wrappers already do everything around the reduction right: they keep the wrapped
optimizer's class name (so a saved model loads without Horovod), accumulate
`backward_passes_per_step` locally, skip worker-local variables, and hook Keras 2.15's new and
legacy optimizers and LossScaleOptimizer. They build their reduction with
`horovod.tensorflow._make_allreduce_grads_fn` while being constructed; we hand them ours for
exactly that moment (under a lock) and keep all the rest.
"""
import contextlib
import threading

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd_keras

from tftorus import context, fusion, reduction
from tftorus.reduction import TorusOptions

_SEAM_LOCK = threading.RLock()


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

    with _SEAM_LOCK:
        original = hvd_tf._make_allreduce_grads_fn
        hvd_tf._make_allreduce_grads_fn = make_allreduce_grads_fn
        try:
            yield
        finally:
            hvd_tf._make_allreduce_grads_fn = original


def _options(algorithm, grid, fusion_threshold_bytes, check_consistency, engine):
    return TorusOptions(algorithm=algorithm, grid=grid,
                        fusion_threshold_bytes=fusion_threshold_bytes,
                        check_consistency=check_consistency, engine=engine)


def _world_set_without_horovod(engine, kwargs):
    """On a TF_CONFIG cluster (tf engine, no Horovod runtime) Horovod's wrappers still ask their
    process set for size() and included(): hand them one that the tf engine answers."""
    if "process_set" not in kwargs and not hvd_tf.is_initialized():
        kwargs["process_set"] = context.WorldProcessSet(context.communicator(engine))
    return kwargs


def DistributedOptimizer(optimizer, *args, algorithm="torus", grid=None,
                         fusion_threshold_bytes=fusion.DEFAULT_THRESHOLD_BYTES,
                         check_consistency=True, engine=None, **kwargs):
    """`horovod.tensorflow.keras.DistributedOptimizer`, reducing over the 2D torus.

    Takes every argument of Horovod 0.28.1's (name, device_dense, device_sparse, compression,
    sparse_as_dense, gradient_predivide_factor, op, backward_passes_per_step,
    average_aggregated_gradients, num_groups, groups, process_set, scale_local_gradients), plus:

      algorithm: 'torus' (the paper's), 'ring' (flat) or 'hierarchical' (per node, then across).
      grid: None for the grid given to tftorus.init(), or 'YxX' / (Y, X) / row length / 'paper'.
      fusion_threshold_bytes: largest fused buffer (default 128 MiB, Horovod's); 0: no fusion.
      check_consistency: compare tensor shapes across ranks each step (one 48-byte all-reduce),
        so a rank with different gradients raises instead of hanging.
      engine: 'horovod' (process sets) or 'tf' (TensorFlow's collective ops); None: the engine
        tftorus.init() started.
    """
    if not callable(getattr(optimizer, "get_config", None)):  # e.g. 'sgd', which compile() takes
        raise TypeError(f"DistributedOptimizer wraps an optimizer instance, e.g. "
                        f"tf.keras.optimizers.SGD(0.1); got {optimizer!r}")
    with torus_gradient_reduction(_options(algorithm, grid, fusion_threshold_bytes,
                                           check_consistency, engine)):
        return hvd_keras.DistributedOptimizer(optimizer, *args,
                                              **_world_set_without_horovod(engine, kwargs))


def DistributedGradientTape(gradtape, *args, algorithm="torus", grid=None,
                            fusion_threshold_bytes=fusion.DEFAULT_THRESHOLD_BYTES,
                            check_consistency=True, engine=None, **kwargs):
    """`horovod.tensorflow.DistributedGradientTape`, reducing over the 2D torus.

    Takes every argument of Horovod 0.28.1's, plus the torus options of DistributedOptimizer.
    """
    with torus_gradient_reduction(_options(algorithm, grid, fusion_threshold_bytes,
                                           check_consistency, engine)):
        return hvd_tf.DistributedGradientTape(gradtape, *args,
                                              **_world_set_without_horovod(engine, kwargs))


def load_model(filepath, *args, algorithm="torus", grid=None,
               fusion_threshold_bytes=fusion.DEFAULT_THRESHOLD_BYTES, check_consistency=True,
               engine=None, **kwargs):
    """`horovod.tensorflow.keras.load_model`: a saved model whose optimizer reduces over the torus."""
    with torus_gradient_reduction(_options(algorithm, grid, fusion_threshold_bytes,
                                           check_consistency, engine)):
        return hvd_keras.load_model(filepath, *args, **kwargs)
