"""Horovod's SyncBatchNormalization for Keras 3 (the current stack: no Horovod): batch
normalization whose training-mode statistics are those of the whole batch, every rank's
samples together; `tftorus.SyncBatchNormalization` and `tftorus.keras.SyncBatchNormalization`
there. On the classic stack `tftorus.SyncBatchNormalization` is Horovod's own (Keras 2).

What it computes, per channel, in training mode:
- each rank sums its own batch: S = sum(x), Q = sum(x^2) and its element count n (over the
  batch and every other non-channel axis, and only where a mask is true);
- one sum all-reduce of [S, Q, n] over every rank on the tf engine (one fused buffer of
  2 * channels + 1 values), so mean = sum(S) / sum(n) and variance = sum(Q) / sum(n) - mean^2:
  the whole batch's mean and (biased) variance, whatever each rank's batch size;
- the output normalizes with those, and the moving mean and variance move towards them
  (Keras 3's own update, so they stay the same on every rank).
Inference uses the moving statistics and runs no collective, as a plain BatchNormalization. On
one rank it is Keras 3's BatchNormalization, bit for bit.

Against Horovod 0.28.1's layer: Horovod averages the ranks' means and mean squares with equal
weights, which is the whole batch's statistics only when every rank has the same batch size;
here each rank counts by its number of elements, so unequal (or empty) batches give the
whole batch's statistics too (the same answer whenever the sizes are equal). Horovod's `fused`
argument is taken as it is there: only False.

The gradient flows through the all-reduce: the gradient of a sum over ranks is the sum over
ranks of the gradients (Horovod's registered gradient of its sum allreduce). TF's collective
ops have no registered gradient, so `sum_over_ranks` defines it.

Variance as E[x^2] - E[x]^2 (one all-reduce instead of two) loses digits when a channel's mean
is large against its spread (float32: a mean 1000 times the standard deviation leaves about one
correct digit); it is clipped at 0 so that rounding never makes it negative.
"""
import keras
import tensorflow as tf

from tftorus.runtime import process_state, reduction


def sum_over_ranks(tensor: tf.Tensor) -> tf.Tensor:
    """`tensor` summed over every rank (the tf engine's all-reduce, the shapes checked to agree
    first, so a rank with another model fails instead of hanging), with a gradient: the sum
    over ranks of the gradients."""

    @tf.custom_gradient
    def summed(x):
        def gradient(upstream):
            return sum_over_ranks(upstream)
        return reduction.fused_allreduce([x], "sum", algorithm="auto")[0], gradient
    return summed(tensor)


@keras.saving.register_keras_serializable(package="tftorus")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization with the whole batch's statistics over every rank in
    training (see the module docstring). Arguments as BatchNormalization's, and Horovod's
    `fused`, which must stay False."""

    def __init__(self, fused=False, **kwargs):
        if fused is not False:
            raise ValueError(f"SyncBatchNormalization does not support fused={fused!r} (nor does "
                             f"Horovod's): leave fused out")
        if kwargs.get("synchronized"):
            raise ValueError("SyncBatchNormalization already synchronizes over the tftorus "
                             "ranks; synchronized=True is tf.distribute's way: leave it out")
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        if process_state.communicator().size == 1:
            return super()._moments(inputs, mask)
        x = tf.convert_to_tensor(inputs)
        if mask is None:
            weighted = x
            count = tf.cast(tf.size(x) // tf.shape(x)[self.axis], x.dtype)
        else:
            # a mask covers every axis but the last (Keras 3's rule for masked moments)
            keep = tf.cast(tf.expand_dims(mask, -1), x.dtype)
            weighted = x * keep
            count = tf.reduce_sum(keep)
        axes = self._reduction_axes
        local = tf.concat([tf.reduce_sum(weighted, axes), tf.reduce_sum(weighted * x, axes),
                           tf.reshape(tf.stop_gradient(count), [1])], axis=0)
        total = sum_over_ranks(local)
        channels = x.shape[self.axis]
        elements = tf.maximum(total[-1], 1.0)  # no element anywhere: sums of zero, stats 0
        mean = total[:channels] / elements
        variance = tf.maximum(total[channels:2 * channels] / elements - tf.square(mean), 0.0)
        return mean, variance
