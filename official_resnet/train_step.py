"""One optimizer step of the paper's recipe, for one worker.

    per-worker batch -> k micro-batches (gradient accumulation, k from the batch plan)
      each: forward (mixed precision) -> label-smoothed loss -> scaled backward
    -> local mean of the k gradients -> one all-reduce over the torus (the loss rides along)
    -> unscale -> LossScaleOptimizer skips the step on inf/NaN, else LARS updates in FP32

All workers reduce the same tensors, so they take (or skip) every step together.
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
    """Builds the per-phase step function: `step(images, labels) -> (loss, correct)`.

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
            self.optimizer.apply_gradients(zip(grads, variables))
            return loss, correct

        return step


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
