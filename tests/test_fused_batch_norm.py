"""The recipe's BatchNormalization: on Keras 3 a fused subclass that computes what Keras 3's own
layer computes (forward, gradients, moving averages; FP32 and mixed_float16); on Keras 2 Keras'
own layer, unchanged."""
import unittest

import numpy as np
import tensorflow as tf

from official_resnet.model.keras_generation import KERAS
from official_resnet.model.network import BN_EPSILON, BN_MOMENTUM, resnet
from tftorus.runtime import stack

keras = tf.keras


def inputs(shape, seed=0):
    """Channels with means far from 0 and different spreads, so mean and variance both matter."""
    rng = np.random.default_rng(seed)
    channels = shape[-1]
    return (3.0 * np.arange(1, channels + 1) + np.linspace(0.5, 2.0, channels)
            * rng.standard_normal(shape)).astype(np.float32)


GAMMA = (0.5, 2.0)  # gamma and beta of channel 0 .. channel C-1, spaced linearly
BETA = (-1.0, 1.0)


def set_parameters(layer, channels):
    layer.gamma.assign(np.linspace(*GAMMA, channels).astype(np.float32))
    layer.beta.assign(np.linspace(*BETA, channels).astype(np.float32))


def step(layer, x, weights, training=True):
    """The layer's output, and the gradients of sum(output * weights) with respect to the input,
    gamma and beta (weights make every output element matter differently)."""
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=training)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * weights)
    return (y,) + tuple(tape.gradient(loss, [x, layer.gamma, layer.beta]))


def reference(x, weights):
    """`step` in float64 with batch statistics (biased variance), and for each of its values the
    sum of the magnitudes of the terms it adds up: a float's rounding error scales with that
    sum, not with the result (the output subtracts the mean from x, the gradients of gamma and
    beta sum N*H*W products)."""
    x, w = np.float64(x), np.float64(weights)
    axes, channels = (0, 1, 2), x.shape[-1]
    gamma, beta = np.linspace(*GAMMA, channels), np.linspace(*BETA, channels)
    inv = 1.0 / np.sqrt(x.var(axes) + BN_EPSILON)
    xhat = (x - x.mean(axes)) * inv
    values = (gamma * xhat + beta,
              gamma * inv * (w - w.mean(axes) - xhat * (w * xhat).mean(axes)),
              (w * xhat).sum(axes), w.sum(axes))
    scales = (gamma * inv * (np.abs(x) + np.abs(x.mean(axes))) + np.abs(beta),  # x - mean
              gamma * inv * (np.abs(w) + np.abs(w).mean(axes)
                             + np.abs(xhat) * np.abs(w * xhat).mean(axes)),
              np.abs(w * xhat).sum(axes), np.abs(w).sum(axes))
    return values, scales


@unittest.skipUnless(stack.KERAS_3, "the fused subclass is for Keras 3 (current stack)")
class FusedEqualsKeras3Test(tf.test.TestCase):
    """FusedBatchNormalization against keras.layers.BatchNormalization, same weights and data."""

    def setUp(self):
        super().setUp()
        from official_resnet.model.fused_batch_norm import FusedBatchNormalization
        self.fused_class = FusedBatchNormalization
        self.addCleanup(keras.mixed_precision.set_global_policy, "float32")

    def pair(self, shape):
        """(Keras 3's layer, the fused one), built for `shape` with equal non-trivial params."""
        made = []
        for klass in (keras.layers.BatchNormalization, self.fused_class):
            layer = klass(momentum=BN_MOMENTUM, epsilon=BN_EPSILON)
            layer.build(shape)
            set_parameters(layer, shape[-1])
            made.append(layer)
        return made

    def check_equal(self, shape, policy, tolerance, graph=False, steps=3):
        """Both layers, `steps` training steps on new batches, then inference: each output and
        gradient within `tolerance` of the float64 value (relative to its terms' magnitudes),
        the moving averages equal to float rounding."""
        keras.mixed_precision.set_global_policy(policy)
        unfused, fused = self.pair(shape)
        self.assertEqual(fused.compute_dtype, unfused.compute_dtype)
        rng = np.random.default_rng(99)
        run = tf.function(step) if graph else step
        for i in range(steps):  # the moving averages move on every step
            x = tf.cast(inputs(shape, seed=i), fused.compute_dtype)
            weights = tf.constant(rng.standard_normal(shape).astype(np.float32))
            expected, scales = reference(x, weights)
            for layer in (unfused, fused):
                got = run(layer, x, weights)
                self.assertEqual(got[0].dtype, x.dtype)  # FP16 in and out under mixed_float16
                self.assertEqual(got[1].dtype, x.dtype)
                for name, g, e, scale in zip(("output", "d input", "d gamma", "d beta"),
                                             got, expected, scales):
                    ratio = np.abs(np.float64(g) - e) / np.maximum(scale, 1e-30)
                    self.assertLessEqual(ratio.max(), tolerance,
                                         f"{layer.name}: {name} at step {i}")
            self.assertAllClose(fused.moving_mean, unfused.moving_mean, rtol=1e-5, atol=1e-5)
            self.assertAllClose(fused.moving_variance, unfused.moving_variance,
                                rtol=1e-5, atol=1e-5)
        # inference: Keras 3's own code in both, with moving averages equal to float rounding
        x = tf.cast(inputs(shape, seed=7), fused.compute_dtype)
        close = 1e-5 if policy == "float32" else 2e-3
        self.assertAllClose(fused(x, training=False), unfused(x, training=False),
                            rtol=close, atol=close)

    def test_float32_eager(self):
        self.check_equal([6, 5, 5, 4], "float32", 1e-5)

    def test_float32_in_a_tf_function(self):
        # the main job's per-worker batch (54) at a conv3 resolution of its 32 px images
        self.check_equal([54, 8, 8, 16], "float32", 1e-5, graph=True)

    def test_mixed_float16(self):
        # FP16 input and output, FP32 parameters and statistics in both layers: within FP16's
        # rounding (2^-11 relative) of the float64 value of the FP16 input
        self.check_equal([6, 5, 5, 4], "mixed_float16", 2e-3)
        self.check_equal([8, 4, 4, 8], "mixed_float16", 2e-3, graph=True)

    def test_one_element_per_channel(self):
        # n = 1: the batch variance is 0 (Bessel's correction must not divide by n - 1 = 0)
        self.check_equal([1, 1, 1, 3], "float32", 1e-5)

    def test_same_variables_and_names(self):
        fused = self.fused_class(name="conv1_bn")
        fused.build([2, 4, 4, 3])
        self.assertEqual([v.path for v in fused.weights],
                         ["conv1_bn/gamma", "conv1_bn/beta", "conv1_bn/moving_mean",
                          "conv1_bn/moving_variance"])
        self.assertEqual([v.path for v in fused.trainable_weights],
                         ["conv1_bn/gamma", "conv1_bn/beta"])
        self.assertIsInstance(fused, keras.layers.BatchNormalization)
        config = fused.get_config()
        self.assertIsInstance(type(fused).from_config(config), self.fused_class)
        import keras as keras3  # tf.keras' namespace has no `saving` on TF 2.21
        self.assertIsInstance(keras3.saving.deserialize_keras_object(
            keras3.saving.serialize_keras_object(fused)), self.fused_class)

    def test_other_inputs_take_keras_own_path(self):
        # 2-D input (after a Dense), and a frozen layer: Keras 3's code, so equal outputs
        unfused, fused = self.pair([5, 3])
        x = inputs([5, 3])
        self.assertAllClose(fused(x, training=True), unfused(x, training=True))
        unfused, fused = self.pair([2, 3, 3, 4])
        fused.trainable = unfused.trainable = False
        x = inputs([2, 3, 3, 4])
        self.assertAllClose(fused(x, training=True), unfused(x, training=True))
        self.assertAllEqual(fused.moving_mean, np.zeros(4))

    def test_checkpoint_of_the_unfused_model_restores(self):
        # the model's checkpoints from before (Keras 3's own layer) restore into the fused one
        def model(klass):
            x = keras.Input([4, 4, 3])
            y = klass(name="bn")(keras.layers.Conv2D(5, 1, name="conv")(x))
            return keras.Model(x, y)
        old, new = model(keras.layers.BatchNormalization), model(self.fused_class)
        old.get_layer("bn").moving_mean.assign(np.arange(5, dtype=np.float32))
        set_parameters(old.get_layer("bn"), 5)
        path = tf.train.Checkpoint(model=old).write(self.get_temp_dir() + "/ckpt")
        tf.train.Checkpoint(model=new).read(path).assert_consumed()
        for a, b in zip(old.weights, new.weights):
            self.assertEqual(a.path, b.path)
            self.assertAllEqual(a, b)

    def test_recipe_model_trains_with_the_fused_kernel(self):
        model = resnet(depth=14, width=4, num_classes=3, input_shape=(8, 8, 3), small_inputs=True)
        bns = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
        self.assertLen(bns, 17)  # the stem's, 3 per block and 4 projection shortcuts
        self.assertTrue(all(type(layer) is self.fused_class for layer in bns))

        @tf.function
        def train_step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x, training=True))
            return tape.gradient(loss, model.trainable_variables)
        graph = train_step.get_concrete_function(tf.TensorSpec([2, 8, 8, 3])).graph
        ops = [op.type for op in graph.get_operations()]
        self.assertEqual(ops.count("FusedBatchNormV3"), 17)
        self.assertEqual(ops.count("FusedBatchNormGradV3"), 17)


@unittest.skipIf(stack.KERAS_3, "Keras 2 (classic stack)")
class Keras2UnchangedTest(tf.test.TestCase):

    def test_keras_own_batch_normalization(self):
        self.assertIs(KERAS.batch_normalization(), tf.keras.layers.BatchNormalization)
        model = resnet(depth=14, width=4, num_classes=3, input_shape=(8, 8, 3), small_inputs=True)
        self.assertTrue(all(type(layer) is tf.keras.layers.BatchNormalization
                            for layer in model.layers if "_bn" in layer.name))


if __name__ == "__main__":
    tf.test.main()
