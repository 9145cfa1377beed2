"""Micro-batches per update that can change between epochs: the paper's batch-size control for
any Keras model compiled with tftorus' DistributedOptimizer.

    model.compile(optimizer=tftorus.keras.DistributedOptimizer(opt), loss=..., metrics=[...])
    model.fit(data, callbacks=[BatchSizeControl([(0, 1), (30, 2)]), ...])

Each micro-batch's gradients are added to per-variable sums on the worker; the count-th
micro-batch of an update divides the sums by the count, reduces that mean over the workers once
and applies it, so an update sees the mean over the workers of the mean over its micro-batches,
as one batch of count x micro-batch x workers would. The count is a tf.Variable: changing it
between epochs needs no new trace. The optimizer's `iterations` counts updates.

Horovod's `backward_passes_per_step` does the same with a count fixed when the optimizer is
built, and sums unless average_aggregated_gradients. On Keras 2 Horovod's own wrapper keeps it;
on Keras 3 it is an Accumulation of that fixed count (`backward_passes`), which then sums where
Horovod sums. One `Accumulation` lives on an optimizer (`of(optimizer)`); a train step that
reduces by itself (official_resnet.model.recipe_model) accumulates through the same object's `step`.
"""
from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from tftorus.runtime.reduction import reducing_optimizer
from tftorus.runtime.stack import variable_key

_ATTRIBUTE = "_tftorus_accumulation"  # a plain attribute: never saved with the optimizer


class Accumulation:
    """The micro-batch count of an update, the micro-batches seen of the current one, and the
    sums. The sums are made by `build` before the step traces (so it traces once; `step` makes
    them itself otherwise), and are neither weights nor checkpointed: at an epoch's end they
    are empty."""

    def __init__(self, count: int = 1, average: bool = True, fixed: bool = False):
        """average: an update gets the mean of its micro-batches' gradients, else their sum
        (Horovod's average_aggregated_gradients=False). fixed: the count is Horovod's
        backward_passes_per_step, which BatchSizeControl may not change."""
        self.count = tf.Variable(int(count), dtype=tf.int64, trainable=False,
                                 name="micro_batches_per_update")
        self.seen = tf.Variable(0, dtype=tf.int64, trainable=False,
                                name="micro_batches_of_this_update")
        self.sums: Optional[List[tf.Variable]] = None
        self.average, self.fixed = average, fixed

    def set_count(self, count: int) -> None:
        """Between updates only (eagerly, e.g. at an epoch's start)."""
        if self.fixed:
            raise ValueError(_FIXED)
        if int(count) < 1:
            raise ValueError(f"micro-batches per update must be >= 1, got {count}")
        seen = int(self.seen.numpy())
        if seen:
            raise RuntimeError(f"the micro-batches per update changed to {count} half-way "
                               f"through an update ({seen} of {int(self.count.numpy())} "
                               f"micro-batches in): change it where an epoch starts, with steps "
                               f"per epoch a multiple of every count")
        self.count.assign(int(count))

    def build(self, tensors: Sequence[tf.Tensor]) -> None:
        """The sums, one per tensor (or variable) like `tensors`; once."""
        if self.sums is None:
            with tf.init_scope():
                self.sums = [tf.Variable(tf.zeros(t.shape, t.dtype), trainable=False)
                             for t in tensors]
        if [tuple(s.shape) for s in self.sums] != [tuple(t.shape) for t in tensors]:
            raise ValueError("the accumulated tensors changed shape since the first step: one "
                             "Accumulation accumulates one model's gradients")

    def step(self, tensors: Sequence[tf.Tensor], on_last: Callable[[List[tf.Tensor]], object],
             on_other: Callable[[List[tf.Tensor]], object]):
        """Adds this micro-batch's `tensors` (dense) to the sums. On the update's count-th
        micro-batch returns `on_last(means)` (each sum / count, or the sums where not
        `average`; the sums start again), else `on_other(running sums)`; both return the same
        structure (one tf.cond)."""
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        self.build(tensors)
        # Each sum read as soon as its micro-batch gradient exists (the sums were last written
        # by an earlier step), so on the last micro-batch a reduction that buckets the means
        # can send the first bucket while earlier layers still differentiate.
        totals = [s + t for s, t in zip(self.sums, tensors)]
        self.seen.assign_add(1)

        def last():
            for s in self.sums:
                s.assign(tf.zeros_like(s))
            self.seen.assign(0)
            if not self.average:
                return on_last(totals)
            return on_last([t / tf.cast(self.count, t.dtype) for t in totals])

        def other():
            for s, t in zip(self.sums, totals):
                s.assign(t)
            return on_other(totals)

        return tf.cond(tf.equal(self.seen, self.count), last, other)


def of(optimizer, create: bool = True) -> Optional[Accumulation]:
    """The Accumulation of `optimizer` (through a LossScaleOptimizer), made at the first ask
    (None if not made and not `create`)."""
    if optimizer is None:
        raise ValueError("the model has no optimizer yet: model.compile(optimizer=tftorus.keras."
                         "DistributedOptimizer(...), ...) first")
    found = reducing_optimizer(optimizer)
    accumulation = getattr(found, _ATTRIBUTE, None)
    if accumulation is None and create:
        accumulation = Accumulation()
        object.__setattr__(found, _ATTRIBUTE, accumulation)  # untracked: not the optimizer's
    return accumulation


class _Reduction:
    """Horovod's wrappers call their `_agg_helper` (when set) to reduce gradients and to apply
    them; this one accumulates through the optimizer's Accumulation: the count-th micro-batch
    reduces the means (or sums) over the workers and the update is applied; the others apply
    nothing."""

    def __init__(self, optimizer, accumulation: Accumulation):
        self.optimizer, self.accumulation, self._local = optimizer, accumulation, set()

    def register_local_var(self, var):
        self._local.add(variable_key(var))

    def compute_gradients(self, grads, variables):
        # Sums for every variable (made with the variables' shapes before the step traces); a
        # variable without a gradient adds zeros and still gets None back.
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                 for g in grads]  # sums of sparse gradients are dense anyway
        present = [i for i, g in enumerate(grads) if g is not None]
        tensors = [g if g is not None else tf.zeros(v.shape, v.dtype)
                   for g, v in zip(grads, variables)]

        def reduce(means):
            out = list(means)
            shared = [i for i in present if variable_key(variables[i]) not in self._local]
            reduced = self.optimizer._allreduce_grads([means[i] for i in shared],
                                                      [variables[i] for i in shared])
            for i, g in zip(shared, reduced):
                out[i] = g
            size = self.optimizer.process_set.size()
            for i in present:  # worker-local variables, scaled as Horovod's are
                if variable_key(variables[i]) in self._local and self.optimizer.scale_local_gradients:
                    out[i] = means[i] / size
            return out

        reduced = self.accumulation.step(tensors, reduce, lambda sums: sums)
        return [g if grads[i] is not None else None for i, g in enumerate(reduced)]

    def apply_gradients(self, apply, optimizer, *args, **kwargs):
        """`apply()` (the wrapped optimizer's own apply_gradients) when the update is complete,
        which step() marks by starting the count again."""
        def applied():
            apply()
            return tf.constant(True)

        tf.cond(tf.equal(self.accumulation.seen, 0), applied, lambda: tf.constant(False))
        return optimizer.iterations


_FIXED = ("this optimizer was built with Horovod's backward_passes_per_step, a count fixed for "
          "the whole run; to change it per epoch range build it without "
          "backward_passes_per_step and let BatchSizeControl set it")


def backward_passes(optimizer, count: int, average: bool) -> Accumulation:
    """Horovod's backward_passes_per_step=count on `optimizer` (Keras 3's DistributedOptimizer,
    as it is built): each call's gradients are added to the sums, the count-th call reduces
    their mean (`average`: Horovod's average_aggregated_gradients) or sum over the workers
    once and applies it, the others apply nothing."""
    holder = reducing_optimizer(optimizer)
    accumulation = Accumulation(count, average=average, fixed=True)
    object.__setattr__(holder, _ATTRIBUTE, accumulation)  # untracked: not the optimizer's
    holder._agg_helper = _Reduction(holder, accumulation)
    return accumulation


def enable(optimizer) -> Accumulation:
    """Make `optimizer` (a tftorus DistributedOptimizer) accumulate through its Accumulation in
    Keras' own train step; returns the Accumulation. Call before the step traces
    (BatchSizeControl does, at the start of fit)."""
    holder = reducing_optimizer(optimizer)
    if not hasattr(holder, "_allreduce_grads"):
        raise TypeError(f"{type(optimizer).__name__} cannot change its micro-batches per update: "
                        f"compile with tftorus.keras.DistributedOptimizer("
                        f"{type(optimizer).__name__}(...)) (on one process too)")
    if optimizer is not holder:
        raise ValueError("a LossScaleOptimizer around the DistributedOptimizer would count and "
                         "rescale every micro-batch as an update; with changing micro-batches "
                         "per update use official_resnet.model.recipe_model.RecipeModel, whose "
                         "step unscales once per update")
    helper = getattr(holder, "_agg_helper", None)
    if helper is not None and not isinstance(helper, _Reduction) \
            or getattr(of(holder, create=False), "fixed", False):
        raise ValueError(_FIXED)
    accumulation = of(holder)
    if helper is None:
        holder._agg_helper = _Reduction(holder, accumulation)
    return accumulation


def enable_for(model: tf.keras.Model) -> Accumulation:
    """`enable(model.optimizer)`, with the sums (and a Keras optimizer's own slots) made now for
    the model's trainable variables: outside the step, which then traces once, not twice."""
    accumulation = enable(model.optimizer)
    accumulation.build(model.trainable_variables)
    if isinstance(model.optimizer, tf.keras.optimizers.Optimizer):  # not the legacy ones
        model.optimizer.build(model.trainable_variables)
    return accumulation
