"""tftorus.keras.DistributedOptimizer on Keras 3 (no Horovod): any Keras 3 optimizer, with its
gradients averaged over the workers on the torus.

    opt = tftorus.keras.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model.compile(optimizer=opt, loss=..., metrics=[...])

The optimizer is rebuilt from its config as a subclass of its own class (as Horovod does on
Keras 2), so it keeps its name and module: a saved model loads with Keras alone, as the plain
optimizer. The subclass overrides `apply` (which `apply_gradients` and Keras' train step call):

    Keras' train step -> [LossScaleOptimizer: unscale, check] -> apply: reduce over the torus
        -> Keras' own apply: clipping, weight decay, update, iterations += 1

so gradients are reduced after a LossScaleOptimizer's division and before clipping, as Horovod
users expect. With micro-batches per update (BatchSizeControl, or Horovod's
backward_passes_per_step) the same `_agg_helper` protocol as Horovod's wrappers
(tftorus.training.accumulation) accumulates, reduces once per update and applies it, so
`iterations` counts updates.

Mixed precision: Keras 3's LossScaleOptimizer decides on each rank's *local* gradients whether
to apply the step, and calls our `apply` (the all-reduce) only when they are finite, so a rank
whose batch overflowed would skip a collective its peers run. Around a tftorus optimizer it
therefore reduces first (after the scale's division, as always) and decides on the reduced
gradients, as Horovod does on Keras 2: one rank's inf or NaN reaches every rank's sum, so all
skip that step and halve the scale alike, with no extra collective. With micro-batches per
update (whose calls reduce only every k-th time) the ranks agree on each call's verdict
instead, by a one-number all-reduce per call. `_agree_under_loss_scale` installs this on Keras'
class once; other LossScaleOptimizers are untouched.

XLA: Keras 3 compiles the train step with XLA by itself (jit_compile='auto') when a GPU is
present and no distribution strategy is set. XLA has no lowering for TF's all-to-all and
variable-size all-gather, and would freeze the collectives' group and instance keys at compile
time, so a step traced under XLA is refused in one line: compile with jit_compile=False.
"""
from typing import List, Optional

import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import control_flow_util

from tftorus.runtime import process_state, reduction, stack
from tftorus.runtime.reduction import TorusOptions
from tftorus.torus.compression import Compression
from tftorus.training import accumulation

_SETTINGS = "_tftorus_settings"


class WholeWorld:
    """The process set of every rank (Horovod's `process_set` argument on the tf engine)."""

    whole_world = True  # process_state.is_whole_world

    def __init__(self, engine: Optional[str] = None):
        self._engine = engine

    def size(self) -> int:
        return process_state.communicator(self._engine).size

    def rank(self) -> int:
        return process_state.communicator(self._engine).rank

    def included(self) -> bool:
        return True


def refuse_xla(what: str = "this train step") -> None:
    """Raise when the graph being traced is compiled by XLA (see the module docstring)."""
    if control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph()):
        raise RuntimeError(
            f"tftorus: {what} is being compiled with XLA (jit_compile=True; Keras 3 turns it on "
            f"by itself when a GPU is present), which cannot compile TensorFlow's all-to-all and "
            f"all-gather collectives: compile the model with model.compile(..., "
            f"jit_compile=False)")


class _ReducesOverTheTorus:
    """Mixed in before the user's optimizer class (see the module docstring)."""

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:  # Keras allows it once the optimizer is built
            trainable_variables = self._trainable_variables
        grads, variables = list(grads), list(trainable_variables)
        refuse_xla()
        if not self.built:  # before any cond below: its variables cannot be made in a branch
            self.build(variables)
        helper = self._agg_helper
        if helper is None:
            if getattr(self, _SETTINGS)["reduced"]:  # by the LossScaleOptimizer around us
                return super().apply(grads, variables)
            return super().apply(self._allreduce_grads(grads, variables), variables)
        reduced = helper.compute_gradients(grads, variables)
        return helper.apply_gradients(
            lambda: super(_ReducesOverTheTorus, self).apply(reduced, variables), self)

    def build(self, variables):
        super().build(variables)
        summed = accumulation.of(self, create=False)
        if summed is not None:  # backward_passes_per_step: its sums too, before a step traces
            summed.build(variables)

    # Horovod's wrapper attributes, which tftorus.training.accumulation and reduce_gradients use.
    def _allreduce_grads(self, grads: List, variables: List) -> List:
        return getattr(self, _SETTINGS)["reduce"](grads, variables)

    @property
    def _agg_helper(self):
        return getattr(self, _SETTINGS)["helper"]

    @_agg_helper.setter
    def _agg_helper(self, helper):
        getattr(self, _SETTINGS)["helper"] = helper

    @property
    def process_set(self) -> WholeWorld:
        return getattr(self, _SETTINGS)["process_set"]

    @property
    def scale_local_gradients(self) -> bool:
        return getattr(self, _SETTINGS)["scale_local_gradients"]


def _apply_under_loss_scale(loss_scale, apply_as_keras_does, grads, trainable_variables):
    """keras.optimizers.LossScaleOptimizer.apply around a tftorus optimizer (module docstring):
    every rank takes the same branch of the loss scale's finite-or-not decision."""
    inner = loss_scale.inner_optimizer
    if trainable_variables is None:
        trainable_variables = inner._trainable_variables
    grads, variables = list(grads), list(trainable_variables)
    refuse_xla()
    if not loss_scale.built:  # its scale and our slots, before any branch
        loss_scale.build(variables)
    settings = getattr(inner, _SETTINGS)
    if inner._agg_helper is not None:  # micro-batches: agree on the verdict every call
        return apply_as_keras_does(loss_scale, grads, variables)
    # Reduced after the division (a 16-bit wire would overflow on scaled values), then scaled
    # back for Keras' own division: exact for the power-of-two scales it keeps.
    scale = loss_scale.dynamic_scale
    scaled = [g is not None and not loss_scale._overwrite_variable_with_gradient(v)
              for g, v in zip(grads, variables)]
    grads = [_times(g, 1.0 / scale) if s else g for g, s in zip(grads, scaled)]
    grads = inner._allreduce_grads(grads, variables)
    grads = [_times(g, scale) if s else g for g, s in zip(grads, scaled)]
    settings["reduced"] = True  # while the branches trace (or run, eagerly)
    try:
        return apply_as_keras_does(loss_scale, grads, variables)
    finally:
        settings["reduced"] = False


def _times(gradient, factor):
    """A dense or sparse gradient times a scalar."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * tf.cast(factor, gradient.values.dtype),
                                gradient.indices, gradient.dense_shape)
    return gradient * tf.cast(factor, gradient.dtype)


def _agree_under_loss_scale():
    """Install `_apply_under_loss_scale` on Keras 3's LossScaleOptimizer (once), and an agreed
    finiteness verdict for a tftorus optimizer that accumulates micro-batches."""
    cls = tf.keras.optimizers.LossScaleOptimizer
    if getattr(cls, "_tftorus_agrees", False):
        return
    keras_apply, keras_check_finite = cls.apply, cls.check_finite

    def apply(self, grads, trainable_variables=None):
        if getattr(self.inner_optimizer, _SETTINGS, None) is None:
            return keras_apply(self, grads, trainable_variables)
        return _apply_under_loss_scale(self, keras_apply, grads, trainable_variables)

    def check_finite(self, grads):
        finite = keras_check_finite(self, grads)
        inner = self.inner_optimizer
        if getattr(inner, _SETTINGS, None) is None or inner._agg_helper is None:
            return finite  # not ours, or on gradients already reduced
        return getattr(inner, _SETTINGS)["all_true"](finite)

    cls.apply, cls.check_finite, cls._tftorus_agrees = apply, check_finite, True


def _all_true_fn(engine: Optional[str]):
    """A bool scalar -> whether it is True on every rank (a one-number all-reduce)."""
    def all_true(flag):
        comm = process_state.communicator(engine)
        least = comm.all_reduce(tf.reshape(tf.cast(flag, tf.int32), [1]), comm.all_ranks(), "min")
        return tf.equal(least[0], 1)
    return all_true


def DistributedOptimizer(optimizer, name: Optional[str] = None, device_dense: str = "",
                         device_sparse: str = "", compression=Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op=stack.Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups=None, process_set=None,
                         scale_local_gradients: bool = True, **torus):
    """`optimizer` (a Keras 3 optimizer instance) averaging its gradients over the torus.

    Horovod 0.28.1's arguments keep their meaning where the tf engine can give it:
    compression (Compression.none/.fp16/.bf16), sparse_as_dense, gradient_predivide_factor,
    op (Average or Sum), num_groups/groups, scale_local_gradients, backward_passes_per_step and
    average_aggregated_gradients: each call's gradients are added up on the worker, and every
    k-th call reduces their sum (divided by k where average_aggregated_gradients) over the
    workers once and applies it; the other calls apply nothing. Unlike Horovod's, whose
    `iterations` counts calls, `iterations` then counts updates, as with BatchSizeControl (a
    learning-rate schedule sees updates), and sparse gradients are summed dense where Horovod
    asks for sparse_as_dense. device_dense/device_sparse are ignored (placement follows the
    gradients). Torus options: `torus_options=` or its fields by name (algorithm=, grid=,
    fusion_threshold_bytes=, check_consistency=, engine=, pipeline_chunks=), as on the classic
    stack.
    """
    del device_dense, device_sparse
    keras = tf.keras
    if isinstance(optimizer, str) or not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a Keras optimizer instance, e.g. "
                        f"keras.optimizers.SGD(0.1); got {optimizer!r}")
    if getattr(optimizer, _SETTINGS, None) is not None:
        raise ValueError("this optimizer is already a tftorus DistributedOptimizer")
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise TypeError("wrap the inner optimizer and put the LossScaleOptimizer around ours: "
                        "keras.optimizers.LossScaleOptimizer(tftorus.keras.DistributedOptimizer("
                        "opt)) (model.compile does that under a mixed_float16 policy), so "
                        "gradients are reduced after the loss scale's division")
    if isinstance(backward_passes_per_step, bool) or not isinstance(
            backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be a whole number >= 1 (the calls "
                         f"per update; 1: every call), got {backward_passes_per_step!r}")
    if op not in (stack.Average, stack.Sum):
        raise ValueError("op must be tftorus.Average or tftorus.Sum on the tf engine (Adasum, "
                         f"Min, Max and Product are Horovod's); got {op!r}")
    if process_set is not None and not process_state.is_whole_world(process_set):
        raise ValueError("process sets are Horovod's; on the tf engine the optimizer reduces "
                         "over every rank: leave process_set out")
    if num_groups and groups is None:
        groups = num_groups
    options = TorusOptions.pop_from(torus)
    if torus:
        raise TypeError(f"DistributedOptimizer() got unexpected arguments {sorted(torus)}")
    base = type(optimizer)
    cls = type(base.__name__, (_ReducesOverTheTorus, base), {
        "__module__": base.__module__,  # saved as the user's own optimizer class
        "__doc__": base.__doc__})
    wrapped = cls.from_config(optimizer.get_config())
    reduce = reduction.make_allreduce_grads_fn(
        name or f"Distributed{base.__name__}", compression, sparse_as_dense, op,
        gradient_predivide_factor, groups, None, options)
    object.__setattr__(wrapped, _SETTINGS, {  # untracked: not the optimizer's state
        "reduce": reduce, "helper": None, "process_set": WholeWorld(options.engine),
        "scale_local_gradients": scale_local_gradients, "reduced": False,
        "all_true": _all_true_fn(options.engine)})
    _agree_under_loss_scale()
    if backward_passes_per_step > 1:  # Horovod's helper only then, average or not
        accumulation.backward_passes(wrapped, backward_passes_per_step,
                                     bool(average_aggregated_gradients))
    return wrapped


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=None,
               **torus):
    """`keras.models.load_model`, its optimizer made a DistributedOptimizer (Horovod's
    `load_model` on Keras 3); torus options as DistributedOptimizer's."""
    objects = dict(custom_objects or {})
    for opt in custom_optimizers or []:
        objects[opt.__name__] = opt
    model = tf.keras.models.load_model(filepath, custom_objects=objects or None)
    if model.optimizer is not None:
        inner = model.optimizer
        kwargs = dict(torus)
        if compression is not None:
            kwargs["compression"] = compression
        if isinstance(inner, tf.keras.optimizers.LossScaleOptimizer):
            raise ValueError(f"{filepath} was saved with a LossScaleOptimizer; load it with "
                             f"keras.models.load_model and compile it again with "
                             f"LossScaleOptimizer(tftorus.keras.DistributedOptimizer(opt))")
        wrapped = DistributedOptimizer(inner, **kwargs)
        if inner.built:  # the saved slots and iterations carry over
            wrapped.build(model.trainable_variables)
            for mine, saved in zip(wrapped.variables, inner.variables):
                mine.assign(saved)
        model.optimizer = wrapped
    return model
