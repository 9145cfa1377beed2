"""BN statistics recomputed from training batches equal the exact mean/variance of BN inputs."""
import numpy as np
import tensorflow as tf

from official_resnet.model.bn_statistics import recompute_bn_statistics
from official_resnet.model.network import BN_EPSILON, resnet

layers = tf.keras.layers


def image_batches(seed, num_batches=3, batch=4, side=6, channels=3, mean=3.0, std=2.0):
    """Batches whose channels have means far from 0, so mean and variance both matter."""
    rng = np.random.default_rng(seed)
    offset = mean * np.arange(1, channels + 1, dtype=np.float32)
    return [(offset + std * rng.standard_normal([batch, side, side, channels])).astype(np.float32)
            for _ in range(num_batches)]


def conv_bn_model():
    """Input -> Conv -> BN -> ReLU -> Conv -> BN, with non-trivial BN parameters."""
    inputs = layers.Input([6, 6, 3])
    x = layers.Conv2D(5, 3, padding="same", name="c1")(inputs)
    x = layers.BatchNormalization(epsilon=BN_EPSILON, name="bn1")(x)
    x = layers.ReLU()(x)
    x = layers.Conv2D(4, 3, padding="same", name="c2")(x)
    outputs = layers.BatchNormalization(epsilon=BN_EPSILON, name="bn2")(x)
    model = tf.keras.Model(inputs, outputs)
    bn1 = model.get_layer("bn1")
    bn1.gamma.assign([0.5, 1.0, 1.5, 2.0, 2.5])
    bn1.beta.assign([-1.0, -0.5, 0.0, 0.5, 1.0])
    return model


def expected_bn2_input(model, batch):
    """bn2's input with bn1 normalising by this batch's (population) statistics, as in training."""
    c1, bn1, c2 = (model.get_layer(n) for n in ("c1", "bn1", "c2"))
    h = tf.nn.conv2d(batch, c1.kernel, 1, "SAME") + c1.bias
    mean, var = tf.nn.moments(h, axes=[0, 1, 2])
    h = tf.nn.relu(bn1.gamma * (h - mean) / tf.sqrt(var + BN_EPSILON) + bn1.beta)
    return (tf.nn.conv2d(h, c2.kernel, 1, "SAME") + c2.bias).numpy()


def snapshot(model):
    """Every variable except BN moving statistics, by name."""
    return {v.name: v.numpy() for v in model.variables if "moving_" not in v.name}


class TwoWorkers:
    """A stand-in for `hvd.allreduce(op=Sum)` over two workers run one after the other.

    The first call (worker 1) records its buffer and returns it; the second (worker 0) returns
    the sum of both, so worker 0 ends with the statistics of the union of their batches."""

    def __init__(self):
        self.calls = []

    def __call__(self, tensor):
        self.calls.append(tensor)
        return tf.add_n(self.calls)


class RecomputeBNStatisticsTest(tf.test.TestCase):

    def assertStatistics(self, layer, data, axes=(0, 1, 2), **tolerance):
        tolerance = tolerance or dict(rtol=1e-5, atol=1e-5)
        self.assertAllClose(layer.moving_mean, data.mean(axis=axes, dtype=np.float64), **tolerance)
        self.assertAllClose(layer.moving_variance, data.var(axis=axes, dtype=np.float64),
                            **tolerance)

    def test_single_bn_gets_dataset_mean_and_population_variance(self):
        inputs = layers.Input([6, 6, 3])
        model = tf.keras.Model(inputs, layers.BatchNormalization(name="bn")(inputs))
        batches = image_batches(seed=0)
        summary = recompute_bn_statistics(model, batches)
        self.assertStatistics(model.get_layer("bn"), np.concatenate(batches))
        self.assertEqual(summary.layers, ("bn",))
        self.assertEqual((summary.examples, summary.local_batches), (12, 3))

    def test_second_bn_sees_inputs_normalised_with_batch_statistics(self):
        model = conv_bn_model()
        before = snapshot(model)
        batches = image_batches(seed=1)
        summary = recompute_bn_statistics(model, batches)

        self.assertEqual(summary.layers, ("bn1", "bn2"))
        self.assertStatistics(model.get_layer("bn2"),
                              np.concatenate([expected_bn2_input(model, b) for b in batches]))
        h1 = np.concatenate([tf.nn.conv2d(b, model.get_layer("c1").kernel, 1, "SAME").numpy()
                             + model.get_layer("c1").bias.numpy() for b in batches])
        self.assertStatistics(model.get_layer("bn1"), h1)
        after = snapshot(model)
        self.assertCountEqual(after, before)
        for name, value in before.items():
            self.assertAllEqual(after[name], value, msg=name)

    def test_two_workers_get_the_statistics_of_the_union(self):
        model = conv_bn_model()
        worker0, worker1 = image_batches(seed=2), image_batches(seed=3, num_batches=2)
        allreduce = TwoWorkers()
        recompute_bn_statistics(model, worker1, allreduce_sum=allreduce)
        summary = recompute_bn_statistics(model, worker0, allreduce_sum=allreduce)

        self.assertLen(allreduce.calls, 2)  # one collective per worker, whatever the layers
        for tensor in allreduce.calls:
            self.assertEqual(tensor.dtype, tf.float32)
            self.assertEqual(tensor.shape.rank, 1)
        self.assertEqual(summary.examples, 5 * 4)
        self.assertEqual(summary.local_batches, 3)
        union = worker0 + worker1
        self.assertStatistics(model.get_layer("bn2"),
                              np.concatenate([expected_bn2_input(model, b) for b in union]))

    def test_worker_without_batches_still_joins_the_allreduce(self):
        inputs = layers.Input([6, 6, 3])
        model = tf.keras.Model(inputs, layers.BatchNormalization(name="bn")(inputs))
        batches = image_batches(seed=4)
        allreduce = TwoWorkers()
        recompute_bn_statistics(model, batches, allreduce_sum=allreduce)
        summary = recompute_bn_statistics(model, [], allreduce_sum=allreduce)
        self.assertEqual((summary.examples, summary.local_batches), (12, 0))
        self.assertStatistics(model.get_layer("bn"), np.concatenate(batches))

    def test_no_examples_anywhere_is_an_error(self):
        inputs = layers.Input([6, 6, 3])
        model = tf.keras.Model(inputs, layers.BatchNormalization()(inputs))
        with self.assertRaisesRegex(ValueError, "no examples"):
            recompute_bn_statistics(model, [])

    def test_nested_model_under_mixed_precision(self):
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            inner_in = layers.Input([6, 6, 3])
            inner = tf.keras.Model(inner_in, layers.BatchNormalization(name="inner_bn")(inner_in),
                                   name="inner")
            inputs = layers.Input([6, 6, 3])
            x = layers.Conv2D(4, 1, name="conv")(inner(inputs))
            outputs = layers.BatchNormalization(name="outer_bn")(x)
            model = tf.keras.Model(inputs, layers.Activation("linear", dtype="float32")(outputs))
        finally:
            tf.keras.mixed_precision.set_global_policy("float32")
        # Large values: their squares overflow FP16 (> 65504), so this fails unless sums are FP32.
        batches = image_batches(seed=5, mean=100.0, std=20.0)
        summary = recompute_bn_statistics(model, tf.data.Dataset.from_tensor_slices(
            (np.concatenate(batches), np.zeros([12]))).batch(4))  # (x, y) batches: x is used
        self.assertEqual(set(summary.layers), {"inner_bn", "outer_bn"})
        fp16_inputs = np.concatenate(batches).astype(np.float16).astype(np.float32)
        self.assertStatistics(inner.get_layer("inner_bn"), fp16_inputs, rtol=1e-4, atol=1e-3)
        self.assertEqual(inner.get_layer("inner_bn").moving_mean.dtype, tf.float32)
        self.assertTrue(np.all(np.isfinite(model.get_layer("outer_bn").moving_variance)))

    def test_bn_inside_a_subclassed_layer(self):
        class Block(layers.Layer):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.norm = layers.BatchNormalization(name="block_bn")

            def call(self, inputs, training=None):
                return tf.nn.relu(self.norm(inputs * 2.0, training=training))

        inputs = layers.Input([6, 6, 3])
        model = tf.keras.Model(inputs, Block(name="block")(inputs))
        batches = image_batches(seed=8)
        summary = recompute_bn_statistics(model, batches)
        self.assertEqual(summary.layers, ("block_bn",))
        self.assertStatistics(model.get_layer("block").norm, 2.0 * np.concatenate(batches))

    def test_other_training_state_is_restored_and_hooks_removed(self):
        class CountsTrainingCalls(layers.Layer):
            def build(self, input_shape):
                self.calls = self.add_weight(name="calls", shape=[], trainable=False,
                                             initializer="zeros")

            def call(self, inputs, training=None):
                if training:
                    self.calls.assign_add(1.0)
                return inputs

        inputs = layers.Input([6, 6, 3])
        bn = layers.BatchNormalization(name="bn")
        model = tf.keras.Model(inputs, bn(CountsTrainingCalls(name="counter")(inputs)))
        recompute_bn_statistics(model, image_batches(seed=6))
        self.assertEqual(model.get_layer("counter").calls.numpy(), 0.0)
        self.assertNotIn("call", vars(bn))  # the recording hook is gone
        model(tf.zeros([1, 6, 6, 3]), training=True)
        self.assertEqual(model.get_layer("counter").calls.numpy(), 1.0)

    def test_resnet_eval_uses_recomputed_statistics(self):
        model = resnet(depth=14, width=4, num_classes=3, input_shape=(8, 8, 3), small_inputs=True,
                       zero_init_residual=False)
        batch = image_batches(seed=7, num_batches=1, batch=8, side=8)[0]
        summary = recompute_bn_statistics(model, [batch])
        self.assertLen(summary.layers, 4 * 4 + 1)  # 3 per block + 1 projection, and the stem
        # From one batch, inference with the recomputed statistics reproduces the training-mode
        # output of that batch (the moving-average momentum plays no part).
        self.assertAllClose(model(batch, training=False), model(batch, training=True),
                            rtol=1e-3, atol=1e-3)


if __name__ == "__main__":
    tf.test.main()

