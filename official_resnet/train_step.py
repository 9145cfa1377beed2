"""One optimizer step of the paper's recipe, for one worker.

    per-worker batch -> k micro-batches (gradient accumulation, k from the batch plan)
      each: forward (mixed precision) -> label-smoothed loss -> scaled backward
    -> local mean of the k gradients -> one all-reduce over the torus (the loss rides along)
    -> unscale -> skip the step if any reduced gradient or the loss is inf/NaN, else LARS
       updates in FP32 (under mixed precision the LossScaleOptimizer skips it and lowers the
       loss scale, as dynamic loss scaling does)

The check runs on the *reduced* values, which are the same on every worker, so all workers take
(or skip) every step together and none is left waiting in a collective. A skipped step leaves no
trace in the model: the BN moving statistics its forward pass updated are put back too. The step
returns whether it applied the update, so the trainer can report every skipped step.
"""
from typing import Callable, List, Optional

import tensorflow as tf


def smoothed_cross_entropy(labels, logits, num_classes: int, label_smoothing: float):
    """Mean cross-entropy against one-hot labels smoothed by `label_smoothing`, in FP32."""
    one_hot = tf.one_hot(tf.cast(labels, tf.int32), num_classes)
    loss = tf.keras.losses.categorical_crossentropy(
        one_hot, tf.cast(logits, tf.float32), from_logits=True, label_smoothing=label_smoothing)
    return tf.reduce_mean(loss)


class TrainStep:
    """Builds the per-phase step function: `step(images, labels) -> (loss, correct, applied)`.

    `reduce_fn(grads, vars)` averages a list of tensors over the workers (tftorus'
    gradient_reducer, or the identity on one process).
    """

    def __init__(self, model: tf.keras.Model, optimizer, reduce_fn: Callable,
                 num_classes: int, label_smoothing: float):
        self.model = model
        self.optimizer = optimizer
        self.reduce_fn = reduce_fn
        self.num_classes = num_classes
        self.label_smoothing = label_smoothing
        self._loss_scaled = isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)

    def build(self, accumulation: int):
        """A tf.function for per-worker batches made of `accumulation` micro-batches."""
        model, variables = self.model, self.model.trainable_variables
        if not self._loss_scaled and not getattr(self.optimizer, "_built", False):
            # Slots must exist before the traced step: the update sits in a tf.cond branch,
            # where TensorFlow cannot create variables.
            self.optimizer.build(variables)

        def micro_step(images, labels):
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                loss = smoothed_cross_entropy(labels, logits, self.num_classes,
                                              self.label_smoothing)
                scaled = self.optimizer.get_scaled_loss(loss) if self._loss_scaled else loss
            grads = tape.gradient(scaled, variables)
            correct = tf.reduce_sum(tf.cast(
                tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32),
                         tf.cast(labels, tf.int32)), tf.float32))
            return loss, grads, correct

        @tf.function
        def step(images, labels):
            # Read before the forward passes move them (TF orders reads and writes of a variable
            # as written), so a skipped step can put them back.
            state = model.non_trainable_variables
            state_before = [tf.identity(v) for v in state]

            def discard_state_updates():
                for v, before in zip(state, state_before):
                    v.assign(before)
                return tf.constant(False)

            micro_images = tf.split(images, accumulation)
            micro_labels = tf.split(labels, accumulation)
            loss, grads, correct = micro_step(micro_images[0], micro_labels[0])
            for i in range(1, accumulation):  # unrolled: k is fixed within a phase
                l_i, g_i, c_i = micro_step(micro_images[i], micro_labels[i])
                loss, correct = loss + l_i, correct + c_i
                grads = [a + b for a, b in zip(grads, g_i)]
            if accumulation > 1:
                grads = [g / accumulation for g in grads]
                loss = loss / accumulation
            # The loss rides in the gradient all-reduce: every worker logs the global mean and
            # sees a non-finite loss at the same step, so stopping on it never strands a rank.
            reduced = self.reduce_fn(list(grads) + [tf.reshape(loss, [1])],
                                     list(variables) + [None])
            grads, loss = reduced[:-1], tf.reshape(reduced[-1], [])
            if self._loss_scaled:
                grads = self.optimizer.get_unscaled_gradients(grads)
            finite = all_finite(grads + [loss])
            if self._loss_scaled:  # it skips non-finite steps itself and lowers the loss scale
                self.optimizer.apply_gradients(zip(grads, variables))
                applied = tf.cond(finite, lambda: tf.constant(True), discard_state_updates)
                return loss, correct, applied

            def apply():
                self.optimizer.apply_gradients(zip(grads, variables))
                return tf.constant(True)
            applied = tf.cond(finite, apply, discard_state_updates)
            return loss, correct, applied

        return step


def all_finite(tensors: List[tf.Tensor]) -> tf.Tensor:
    """True when no tensor holds an inf or a NaN (one boolean for the whole list)."""
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(tf.cast(t, tf.float32)))
                          for t in tensors])


def make_eval_step(model: tf.keras.Model):
    """`eval_step(images, labels) -> (correct, count)` with the BN statistics in the model."""

    @tf.function
    def eval_step(images, labels):
        logits = model(images, training=False)
        correct = tf.reduce_sum(tf.cast(
            tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32),
                     tf.cast(labels, tf.int32)), tf.float32))
        return correct, tf.cast(tf.shape(labels)[0], tf.float32)

    return eval_step
