"""What the recipe needs from Keras that Keras 2 (classic stack) and Keras 3 (current stack)
spell differently: the one place official_resnet tells them apart, besides lars.py's choice of
class. `KERAS` is the class of this process' generation, picked once by tftorus.runtime.stack.

Where they differ, and why the recipe does what it does on each:

  loss scale        Keras 2's LossScaleOptimizer scales (get_scaled_loss), unscales
                    (get_unscaled_gradients) and, in apply_gradients, checks the gradients it is
                    handed and skips a non-finite update, lowering the scale. The recipe hands it
                    the *reduced* gradients, so every worker agrees. Keras 3's scales
                    (scale_loss) but unscales and checks only inside its own `apply`, which would
                    call our DistributedOptimizer's `apply` and reduce a second time. So on
                    Keras 3 the recipe unscales by the optimizer's `dynamic_scale` itself, checks
                    the reduced values, applies the update without reducing again
                    (`apply_reduced`) and moves the loss scale as Keras 3's LossScaleOptimizer
                    does (halve on a skip; double after `dynamic_growth_steps` finite updates).
  applying          Horovod's Keras 2 wrapper reduces in compute_gradients, so its
                    apply_gradients applies what it is given; tftorus' Keras 3 optimizer reduces
                    in `apply`, so already-reduced gradients go to the update of the class it
                    subclasses (the one after the class that defines `_allreduce_grads`).
  layers            every layer under a model: Keras 2's tf.Module `submodules`; Keras 3 layers are
                    no tf.Modules, and list their nested layers with `_flatten_layers`.
  checkpoints       tf.train.Checkpoint of the same model and optimizer saves other objects
                    (Keras 2's layer_with_weights-N and slot order, Keras 3's layers and
                    variables): a checkpoint is resumed by the generation that wrote it, which
                    its state.json records (checkpointing.check_generation refuses the other).
  building          the update sits in a tf.cond, which cannot create variables: the slots are
                    made before the step traces. Keras 2: the inner optimizer's build (it makes
                    them once). Keras 3: `build` creates new variables on every call, so it is
                    called once, on the LossScaleOptimizer when there is one (its scale and
                    counter too).
  BatchNormalization  Keras 2's runs TensorFlow's fused kernel (FusedBatchNormV3); Keras 3's
                    computes moments and normalises in some 20 ops forward and 25 backward, 3x
                    the fused kernel's time on CPU. The recipe's model takes
                    `KERAS.batch_normalization()`: Keras 2's own layer, or on Keras 3
                    fused_batch_norm.py's subclass (beside this file) with the fused kernel in
                    training mode (same variables, names and results).
"""
from typing import Callable, List, Optional

import tensorflow as tf

from tftorus.runtime import stack

LossScaleOptimizer = tf.keras.mixed_precision.LossScaleOptimizer  # either generation's


def loss_scale_optimizer(optimizer) -> Optional[LossScaleOptimizer]:
    """`optimizer` when it is a LossScaleOptimizer (compile adds one under mixed_float16)."""
    return optimizer if isinstance(optimizer, LossScaleOptimizer) else None


def _true():
    return tf.constant(True)


class Keras2:
    """Keras 2 (TensorFlow 2.15, Horovod's wrappers)."""

    name = "Keras 2"
    generation = 2  # what a checkpoint's state.json records (checkpointing.check_generation)
    stack = "the classic stack"

    @staticmethod
    def sublayers(model) -> List:
        """Every module under `model`, however deep (layers among them)."""
        return list(model.submodules)

    @staticmethod
    def build_optimizer(optimizer, variables: List) -> None:
        inner = optimizer.inner_optimizer if loss_scale_optimizer(optimizer) else optimizer
        inner.build(variables)

    @staticmethod
    def scale_loss(optimizer, loss):
        lso = loss_scale_optimizer(optimizer)
        return lso.get_scaled_loss(loss) if lso else loss

    @staticmethod
    def unscale(optimizer, grads: List) -> List:
        lso = loss_scale_optimizer(optimizer)
        return lso.get_unscaled_gradients(grads) if lso else grads

    @staticmethod
    def apply_or_skip(optimizer, grads: List, variables: List, finite,
                      skip: Callable[[], tf.Tensor]) -> tf.Tensor:
        """The update of the (reduced, unscaled) `grads` when `finite`, else `skip()`; whether
        it was applied."""
        if loss_scale_optimizer(optimizer):  # it skips non-finite updates itself and lowers
            optimizer.apply_gradients(zip(grads, variables))  # the loss scale
            return tf.cond(finite, _true, skip)

        def apply():
            optimizer.apply_gradients(zip(grads, variables))
            return tf.constant(True)
        return tf.cond(finite, apply, skip)

    @staticmethod
    def loss_scale(optimizer) -> float:
        return float(optimizer.loss_scale)

    @staticmethod
    def batch_normalization():
        """The BN layer class of the recipe's model: Keras 2's, fused already."""
        return tf.keras.layers.BatchNormalization


class Keras3:
    """Keras 3 (TensorFlow >= 2.16, tftorus' Keras 3 optimizer)."""

    name = "Keras 3"
    generation = 3
    stack = "the current stack"

    @staticmethod
    def sublayers(model) -> List:
        return list(model._flatten_layers(include_self=False, recursive=True))

    @staticmethod
    def build_optimizer(optimizer, variables: List) -> None:
        if not optimizer.built:
            optimizer.build(list(variables))

    @staticmethod
    def scale_loss(optimizer, loss):
        lso = loss_scale_optimizer(optimizer)
        return lso.scale_loss(loss) if lso else loss

    @staticmethod
    def unscale(optimizer, grads: List) -> List:
        lso = loss_scale_optimizer(optimizer)
        if not lso:
            return grads
        scale = tf.convert_to_tensor(lso.dynamic_scale)
        return [None if g is None else g / tf.cast(scale, g.dtype) for g in grads]

    @staticmethod
    def apply_reduced(optimizer, grads: List, variables: List) -> None:
        """The update of gradients already reduced: the optimizer's own, past tftorus'
        reduction when `optimizer` is a tftorus DistributedOptimizer."""
        for klass in type(optimizer).__mro__:
            if "_allreduce_grads" in vars(klass):  # tftorus.training.optimizer_keras3's mixin
                return super(klass, optimizer).apply(grads, variables)
        return optimizer.apply(grads, variables)

    @staticmethod
    def apply_or_skip(optimizer, grads: List, variables: List, finite,
                      skip: Callable[[], tf.Tensor]) -> tf.Tensor:
        lso = loss_scale_optimizer(optimizer)
        inner = lso.inner_optimizer if lso else optimizer

        def apply():
            Keras3.apply_reduced(inner, grads, variables)
            return tf.constant(True)
        applied = tf.cond(finite, apply, skip)
        if lso:
            Keras3._move_loss_scale(lso, finite)
        return applied

    @staticmethod
    def _move_loss_scale(lso, finite) -> None:
        """Keras 3's LossScaleOptimizer's rule (its _stateful_handle_*): a skipped update
        halves the scale; `dynamic_growth_steps` finite ones in a row double it."""
        counter, scale = lso.step_counter, lso.dynamic_scale

        def on_finite():
            def grow():
                counter.assign(0)
                scale.assign(scale * 2.0)
                return tf.constant(True)

            def count():
                counter.assign_add(1)
                return tf.constant(True)
            return tf.cond(tf.equal(counter, lso.dynamic_growth_steps - 1), grow, count)

        def on_skip():
            counter.assign(0)
            scale.assign(scale * 0.5)
            return tf.constant(False)
        tf.cond(finite, on_finite, on_skip)

    @staticmethod
    def loss_scale(optimizer) -> float:
        return float(optimizer.dynamic_scale.numpy() if optimizer.built
                     else optimizer.initial_scale)

    @staticmethod
    def batch_normalization():
        """Keras 3's BN with TensorFlow's fused kernel in training mode (imported here only:
        it subclasses Keras 3's layer)."""
        from official_resnet.model.fused_batch_norm import FusedBatchNormalization
        return FusedBatchNormalization


KERAS = Keras3 if stack.KERAS_3 else Keras2
