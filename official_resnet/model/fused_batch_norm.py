"""Keras 3's BatchNormalization with TensorFlow's fused kernel in training mode (current stack).

Keras 3's BatchNormalization computes in training mode `tf.nn.moments` and then
`tf.nn.batch_normalization`: 21 ops forward (with the moving averages) and 25 backward, several
over the whole activation, where Keras 2 (and TensorFlow's own models) run one FusedBatchNormV3
and one FusedBatchNormGradV3. In the main job's model on this project's 2-core CPU its BN ops
took 3x the fused kernel's time and the training step 1.5x (docs/studies/main_job.md), and ResNets have
a BN after every conv.

`FusedBatchNormalization` is that layer with the same constructor, variables and names (gamma,
beta, moving_mean, moving_variance), so checkpoints, the `_bn` name rule of LARS and weight decay
and `bn_statistics` see no difference. Only its training-mode call on 4-D channels-last input
changes; everything else (inference, masks, renorm, synchronized, other ranks or axes,
a frozen layer) is Keras 3's own code.

It computes what Keras 3's layer computes, up to float rounding:
- the output normalises by the batch mean and the *biased* batch variance (divided by n = N*H*W),
  plus epsilon, in FP32 also for FP16 input (Keras 3 casts FP16 to FP32; the kernel takes FP16
  input with FP32 gamma/beta and computes its statistics in FP32), then returns the input's
  dtype (the layer's compute dtype);
- the moving averages move by `momentum` towards the batch mean and the biased batch variance,
  as Keras 3's do. The kernel returns the variance with Bessel's correction (n / (n - 1)), so it
  is scaled back by (n - 1) / n first, as Keras 2's fused path does too.
The epsilon goes to the kernel as is, as Keras 2's fused layer passes it.
"""
import keras  # Keras 3: keras_generation.Keras3 is the one importer of this module
import tensorflow as tf

_FUSED_DTYPES = (tf.float16, tf.bfloat16, tf.float32)  # inputs FusedBatchNormV3 takes


@keras.saving.register_keras_serializable(package="official_resnet")
class FusedBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization, training mode through FusedBatchNormV3 (see module)."""

    def _fusable(self, inputs, mask) -> bool:
        return (mask is None and not self.renorm and not self.synchronized
                and inputs.shape.rank == 4 and self.axis in (-1, 3)
                and tf.as_dtype(self.compute_dtype) in _FUSED_DTYPES)

    def call(self, inputs, training=None, mask=None):
        if not (training and self.trainable) or not self._fusable(inputs, mask):
            return super().call(inputs, training=training, mask=mask)
        x = tf.cast(inputs, self.compute_dtype)
        channels = x.shape[-1]
        # FP32 parameters whatever the input's dtype (Keras 3 made them with autocast=False).
        gamma = (tf.convert_to_tensor(self.gamma) if self.scale
                 else tf.ones([channels], tf.float32))
        beta = (tf.convert_to_tensor(self.beta) if self.center
                else tf.zeros([channels], tf.float32))
        outputs, batch_mean, batch_variance = tf.compat.v1.nn.fused_batch_norm(
            x, gamma, beta, epsilon=self.epsilon, data_format="NHWC", is_training=True)

        # Elements per channel; the kernel's variance has Bessel's correction, Keras' has not.
        n = tf.cast(tf.size(x) // channels, tf.float32)
        biased_variance = batch_variance * ((n - 1.0) / tf.maximum(n, 1.0))
        # The statistics need no gradient (Keras 3's moving averages get none either).
        batch_mean = tf.stop_gradient(batch_mean)
        biased_variance = tf.stop_gradient(biased_variance)
        self.moving_mean.assign(
            self.moving_mean * self.momentum + batch_mean * (1.0 - self.momentum))
        self.moving_variance.assign(
            self.moving_variance * self.momentum + biased_variance * (1.0 - self.momentum))
        return outputs
