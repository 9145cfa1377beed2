"""ResNet v1.5 builder: names, parameter count against Keras' ResNet50, init, strides, precision."""
import re

import numpy as np
import tensorflow as tf

from official_resnet.model.keras_generation import KERAS
from official_resnet.model.network import resnet
from tftorus.runtime.stack import variable_name

RESNET50_TRAINABLE = 25_557_032  # the published ResNet-50 (1000 classes, no conv biases)
EXCLUDE_FROM_DECAY = re.compile(r"_bn|bias")  # what LARS / weight decay skip by name


def name(variable) -> str:
    """'layer/weight' on both stacks (Keras 2's name 'layer/weight:0', Keras 3's path)."""
    return variable_name(variable).removesuffix(":0")


def output_shape(layer):
    """A layer's output shape as a tuple (Keras 3 layers have no `output_shape`)."""
    return tuple(layer.output.shape)


def tiny(**kwargs):
    """A ResNet-14 of width 8 on 32 px images: builds and runs in well under a second."""
    args = dict(depth=14, width=8, num_classes=10, input_shape=(32, 32, 3), small_inputs=True)
    args.update(kwargs)
    return resnet(**args)


class ResNet50AgainstKerasTest(tf.test.TestCase):
    """The full-size model, built once (graph only, nothing runs) beside Keras' ResNet50."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ours = resnet(depth=50)
        cls.keras = tf.keras.applications.ResNet50(weights=None)

    def test_trainable_parameter_count(self):
        ours = sum(v.shape.num_elements() for v in self.ours.trainable_variables)
        self.assertEqual(ours, RESNET50_TRAINABLE)
        # Keras' ResNet50 differs only by a bias on every conv (redundant before BN): its total
        # is 25,636,712 = our 25,557,032 + 26,560 conv biases + 53,120 BN moving statistics.
        keras_trainable = sum(v.shape.num_elements() for v in self.keras.trainable_variables)
        keras_conv_biases = sum(layer.filters for layer in self.keras.layers
                                if isinstance(layer, tf.keras.layers.Conv2D))
        self.assertEqual(keras_conv_biases, 26_560)
        self.assertEqual(keras_trainable, ours + keras_conv_biases)
        self.assertEqual(self.ours.count_params() + keras_conv_biases, self.keras.count_params())

    def test_every_weighted_keras_layer_has_our_name_and_shapes(self):
        ours = {layer.name: layer for layer in self.ours.layers}
        weighted = [layer for layer in self.keras.layers if layer.weights]
        self.assertLen(weighted, 53 + 53 + 1)  # convs, BNs, predictions
        for keras_layer in weighted:
            self.assertIn(keras_layer.name, ours)
            our_shapes = {name(w): tuple(w.shape) for w in ours[keras_layer.name].weights}
            for w in keras_layer.weights:
                if name(w).endswith("_conv/bias"):
                    self.assertNotIn(name(w), our_shapes)  # no conv biases (see above)
                else:
                    self.assertEqual(our_shapes[name(w)], tuple(w.shape), name(w))
        self.assertEqual(len([n for n in ours if n.endswith("_bn")]), 53)

    def test_name_regex_selects_bn_and_bias_only(self):
        excluded = [name(v) for v in self.ours.trainable_variables
                    if EXCLUDE_FROM_DECAY.search(name(v))]
        self.assertLen(excluded, 2 * 53 + 1)  # gamma and beta of 53 BNs, the classifier's bias
        self.assertIn("predictions/bias", excluded)
        self.assertIn("conv2_block1_0_bn/gamma", excluded)
        self.assertNotIn("predictions/kernel", excluded)
        self.assertNotIn("conv1_conv/kernel", excluded)

    def test_bn_settings(self):
        bn = self.ours.get_layer("conv3_block2_2_bn")
        self.assertEqual((bn.epsilon, bn.momentum), (1e-5, 0.9))

    def test_standard_shapes(self):
        self.assertEqual(tuple(self.ours.output_shape), (None, 1000))
        self.assertEqual(output_shape(self.ours.get_layer("pool1_pool")), (None, 56, 56, 64))
        self.assertEqual(output_shape(self.ours.get_layer("conv5_block3_out")),
                         (None, 7, 7, 2048))


class ResNetBuilderTest(tf.test.TestCase):

    def test_zero_init_residual_gammas(self):
        model = tiny(depth=26)
        last_bns = [layer for layer in model.layers if re.fullmatch(r"conv\d_block\d_3_bn", layer.name)]
        self.assertLen(last_bns, 8)  # one per block
        for layer in model.layers:
            if isinstance(layer, tf.keras.layers.BatchNormalization):
                expected = 0.0 if layer in last_bns else 1.0
                self.assertAllEqual(layer.gamma, np.full(layer.gamma.shape, expected), layer.name)
        for layer in tiny(zero_init_residual=False).layers:
            if isinstance(layer, tf.keras.layers.BatchNormalization):
                self.assertAllEqual(layer.gamma, np.ones(layer.gamma.shape))

    def test_zero_init_blocks_start_as_identity(self):
        model = tiny()
        block = tf.keras.Model(model.get_layer("conv3_block1_out").output,
                               model.get_layer("conv4_block1_out").output)
        x = tf.random.normal([2, 16, 16, 64])
        shortcut_only = tf.keras.Model(
            model.get_layer("conv3_block1_out").output,
            tf.keras.layers.ReLU()(model.get_layer("conv4_block1_0_bn").output))
        self.assertAllClose(block(x, training=False), shortcut_only(x, training=False))

    def test_v1_5_stride_on_3x3(self):
        model = tiny()
        for stage in (3, 4, 5):
            name = f"conv{stage}_block1"
            self.assertEqual(model.get_layer(name + "_1_conv").strides, (1, 1))
            self.assertEqual(model.get_layer(name + "_2_conv").strides, (2, 2))
            self.assertEqual(model.get_layer(name + "_0_conv").strides, (2, 2))
        self.assertEqual(model.get_layer("conv2_block1_2_conv").strides, (1, 1))
        self.assertEqual(output_shape(model.get_layer("conv3_block1_1_conv")), (None, 32, 32, 16))
        self.assertEqual(output_shape(model.get_layer("conv3_block1_2_conv")), (None, 16, 16, 16))

        v1 = tiny(stride_on_3x3=False)  # Keras' layout, same variables
        self.assertEqual(v1.get_layer("conv3_block1_1_conv").strides, (2, 2))
        self.assertEqual(v1.get_layer("conv3_block1_2_conv").strides, (1, 1))
        self.assertEqual(v1.count_params(), model.count_params())

    def test_he_fan_out_initialisation(self):
        model = resnet(depth=14, width=64, num_classes=10, input_shape=(32, 32, 3))
        kernel = model.get_layer("conv4_block1_2_conv").kernel.numpy()  # 3x3x256x256
        fan_out = 3 * 3 * kernel.shape[-1]
        self.assertAllClose(kernel.std(), np.sqrt(2.0 / fan_out), rtol=0.02)
        self.assertGreater(np.abs(kernel).max(), 2.5 * kernel.std())  # not truncated at 2 std
        dense = model.get_layer("predictions")
        self.assertAllClose(dense.kernel.numpy().std(), 0.01, rtol=0.1)
        self.assertAllEqual(dense.bias, np.zeros(10))

    def test_small_inputs_shapes(self):
        model = tiny()
        names = [layer.name for layer in model.layers]
        self.assertNotIn("pool1_pool", names)
        self.assertEqual(model.get_layer("conv1_conv").kernel.shape, (3, 3, 3, 8))
        expected = {"conv1_relu": 32, "conv2_block1_out": 32, "conv3_block1_out": 16,
                    "conv4_block1_out": 8, "conv5_block1_out": 4}
        for name, side in expected.items():
            self.assertEqual(output_shape(model.get_layer(name))[1:3], (side, side), name)
        out = model(tf.zeros([2, 32, 32, 3]), training=False)
        self.assertEqual(out.shape, (2, 10))

    def test_imagenet_stem_on_small_images(self):
        model = tiny(small_inputs=False, input_shape=(64, 64, 3))
        self.assertEqual(output_shape(model.get_layer("conv1_conv")), (None, 32, 32, 8))
        self.assertEqual(output_shape(model.get_layer("pool1_pool")), (None, 16, 16, 8))
        self.assertEqual(output_shape(model.get_layer("conv5_block1_out")), (None, 2, 2, 256))

    def test_outputs_are_logits(self):
        model = tiny(zero_init_residual=False)
        model.get_layer("predictions").bias.assign(tf.fill([10], -3.0))
        logits = model(tf.random.normal([3, 32, 32, 3]), training=False)
        self.assertAllLess(logits, 0.0)  # no softmax

    def test_mixed_precision_outputs_fp32_logits(self):
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            model = tiny()
        finally:
            tf.keras.mixed_precision.set_global_policy("float32")
        conv = model.get_layer("conv2_block1_2_conv")
        self.assertEqual(conv.compute_dtype, "float16")
        self.assertEqual(conv.kernel.dtype, tf.float32)
        self.assertEqual(model.get_layer("conv2_block1_2_bn").moving_mean.dtype, tf.float32)
        self.assertEqual(model.get_layer("predictions").compute_dtype, "float32")
        self.assertEqual(model.output.dtype, tf.float32)

        images = tf.random.normal([4, 32, 32, 3])
        labels = tf.constant([0, 1, 2, 3])
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1))
        KERAS.build_optimizer(optimizer, model.trainable_variables)  # Keras 3: its scale
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True))
            scaled = KERAS.scale_loss(optimizer, loss)
        grads = KERAS.unscale(optimizer, tape.gradient(scaled, model.trainable_variables))
        self.assertEqual(logits.dtype, tf.float32)
        self.assertTrue(np.isfinite(loss.numpy()))
        self.assertTrue(all(g.dtype == tf.float32 for g in grads))

    def test_unknown_depth_is_a_clear_error(self):
        with self.assertRaisesRegex(ValueError, "depth=34 is not one of"):
            resnet(depth=34)


if __name__ == "__main__":
    tf.test.main()
