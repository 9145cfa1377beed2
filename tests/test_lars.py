"""LARS against a NumPy transcription of the same formula, and inside Keras' machinery.

The reference is written from the LARS paper's Algorithm 1 (documented in official_resnet/lars.py),
independently of the TensorFlow code: coupled weight decay, the trust ratio on the raw gradient's
norm, the learning rate applied before the momentum buffer.
"""
import numpy as np
import tensorflow as tf

from official_resnet import lars as L

EXCLUDE = ["_bn", "bias"]


def reference_step(w, g, v, *, lr, momentum, wd, eta, eps, decay, adapt, nesterov=False):
    """One LARS step in float64 NumPy; returns (new w, new v)."""
    g = g.astype(np.float64)
    wd = wd if decay else 0.0
    g_total = g + wd * w
    trust = 1.0
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    if adapt and w_norm > 0 and g_norm > 0:
        trust = eta * w_norm / (g_norm + wd * w_norm + eps)
    v = momentum * v + lr * trust * g_total
    step = momentum * v + lr * trust * g_total if nesterov else v
    return w - step, v


class LarsTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        tf.keras.mixed_precision.set_global_policy("float32")
        self.rng = np.random.default_rng(0)

    def _variables(self):
        return {
            "conv1/kernel": tf.Variable(self.rng.normal(size=(3, 3, 2, 4)).astype("f4"),
                                        name="conv1/kernel"),
            "conv1_bn/gamma": tf.Variable(self.rng.normal(size=(4,)).astype("f4") + 1.0,
                                          name="conv1_bn/gamma"),  # excluded by name
            "dense/bias": tf.Variable(self.rng.normal(size=(4,)).astype("f4"),
                                      name="dense/bias"),  # excluded by name
            "zero/kernel": tf.Variable(np.zeros((5, 4), "f4"), name="zero/kernel"),  # ||w|| = 0
        }

    def _compare(self, grad_dtype, nesterov=False, steps=4):
        variables = self._variables()
        hp = dict(wd=1e-3, eta=0.01, eps=1e-6)
        opt = L.LARS(learning_rate=0.5, momentum=0.9, weight_decay=hp["wd"],
                     trust_coefficient=hp["eta"], epsilon=hp["eps"],
                     exclude_from_weight_decay=EXCLUDE, nesterov=nesterov)
        ref_w = {k: v.numpy().astype(np.float64) for k, v in variables.items()}
        ref_v = {k: np.zeros_like(w) for k, w in ref_w.items()}
        schedule = [(0.5, 0.9), (1.0, 0.9), (2.0, 0.95), (0.25, 0.5)]  # (lr, momentum) per step
        for step in range(steps):
            lr, momentum = schedule[step]
            opt.learning_rate = lr
            opt.momentum = momentum
            grads = {k: self.rng.normal(size=v.shape).astype(grad_dtype)
                     for k, v in variables.items()}
            grads["zero/kernel"] *= 1e-3
            opt.apply_gradients([(tf.constant(grads[k]), variables[k]) for k in variables])
            for k in variables:
                excluded = k in ("conv1_bn/gamma", "dense/bias")
                ref_w[k], ref_v[k] = reference_step(
                    ref_w[k], grads[k].astype(np.float32), ref_v[k], lr=lr, momentum=momentum,
                    decay=not excluded, adapt=not excluded, nesterov=nesterov, **hp)
        for k, v in variables.items():
            self.assertEqual(v.dtype, tf.float32)
            self.assertAllClose(v.numpy(), ref_w[k], rtol=1e-5, atol=1e-6, msg=k)
            self.assertAllClose(opt.velocity(v).numpy(), ref_v[k], rtol=1e-5, atol=1e-6, msg=k)
        return variables, ref_w

    def test_matches_reference_fp32_gradients(self):
        variables, _ = self._compare("float32")
        # The zero-weight variable moved with trust 1 on its first step, then was adapted.
        self.assertGreater(np.abs(variables["zero/kernel"].numpy()).max(), 0)

    def test_matches_reference_fp16_gradients(self):
        self._compare("float16")

    def test_matches_reference_nesterov(self):
        self._compare("float32", nesterov=True)

    def test_trust_ratio_is_applied(self):
        # A large gradient on a unit-norm weight: the step is eta * lr * ||w|| / ||g|| * g.
        w = tf.Variable(np.full((4,), 0.5, "f4"), name="w")
        g = np.full((4,), 100.0, "f4")  # ||g|| = 200, ||w|| = 1
        opt = L.LARS(learning_rate=1.0, momentum=0.0, trust_coefficient=0.01, epsilon=0.0)
        opt.apply_gradients([(tf.constant(g), w)])
        self.assertAllClose(w.numpy(), 0.5 - 0.01 * 1.0 / 200.0 * 100.0 * np.ones(4))

    def test_zero_gradient_and_zero_weight_do_not_produce_nan(self):
        w = tf.Variable(np.zeros((3,), "f4"), name="w")
        opt = L.LARS(learning_rate=1.0, weight_decay=1e-4, epsilon=0.0)
        opt.apply_gradients([(tf.zeros(3), w)])
        self.assertAllEqual(w.numpy(), np.zeros(3))

    def test_momentum_change_takes_effect_in_a_compiled_step(self):
        w = tf.Variable([1.0, 2.0], name="w")
        opt = L.LARS(learning_rate=1.0, momentum=0.9, exclude_from_layer_adaptation=["w"])

        @tf.function
        def step():
            opt.apply_gradients([(tf.constant([1.0, 1.0]), w)])

        step()  # v = 1
        opt.momentum = 0.5
        step()  # v = 0.5 * 1 + 1 (without retracing)
        self.assertAllClose(opt.velocity(w).numpy(), [1.5, 1.5])
        opt.momentum.assign(0.0)
        opt.learning_rate.assign(2.0)
        step()  # v = 2
        self.assertAllClose(opt.velocity(w).numpy(), [2.0, 2.0])
        self.assertAllClose(w.numpy(), [1.0 - 4.5, 2.0 - 4.5])

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "momentum"):
            L.LARS(momentum=1.0)
        with self.assertRaisesRegex(ValueError, "trust_coefficient"):
            L.LARS(trust_coefficient=0.0)
        with self.assertRaisesRegex(ValueError, "regex"):
            L.LARS(exclude_from_weight_decay=["("])
        opt = L.LARS()
        with self.assertRaisesRegex(ValueError, "momentum"):
            opt.momentum = -0.1

    def test_config_round_trip(self):
        opt = L.LARS(learning_rate=3.0, momentum=0.95, weight_decay=5e-5,
                     trust_coefficient=0.001, epsilon=1e-7, exclude_from_weight_decay=EXCLUDE,
                     exclude_from_layer_adaptation=["_bn"], nesterov=True, clipnorm=1.0)
        opt.momentum = 0.8  # the current value is what a rebuilt optimizer starts from
        config = opt.get_config()
        self.assertEqual(config["momentum"], np.float32(0.8))
        self.assertEqual(config["exclude_from_weight_decay"], EXCLUDE)
        rebuilt = L.LARS.from_config(config)
        self.assertEqual(rebuilt.get_config(), config)
        # As Horovod's DistributedOptimizer does: a subclass of the same name, from the config.
        subclass = type("LARS", (L.LARS,), {})
        self.assertEqual(subclass.from_config(opt.get_config()).get_config(), config)
        # And through Keras' registry (what a saved model or LossScaleOptimizer's config uses).
        again = tf.keras.optimizers.deserialize(tf.keras.optimizers.serialize(opt),
                                                use_legacy_optimizer=False)
        self.assertIsInstance(again, L.LARS)
        self.assertEqual(again.get_config(), config)

    def test_default_adaptation_exclusion_follows_weight_decay_exclusion(self):
        config = L.LARS(exclude_from_weight_decay=EXCLUDE).get_config()
        self.assertEqual(config["exclude_from_layer_adaptation"], EXCLUDE)
        self.assertEqual(L.LARS().get_config()["trust_coefficient"], 0.01)  # the paper's

    def _tiny_model(self):
        tf.keras.utils.set_random_seed(1)
        inputs = tf.keras.Input((6,))
        x = tf.keras.layers.Dense(8, name="fc1")(inputs)
        x = tf.keras.layers.BatchNormalization(name="fc1_bn")(x)
        x = tf.keras.layers.Activation("relu")(x)
        outputs = tf.keras.layers.Dense(3, name="logits")(x)
        outputs = tf.keras.layers.Activation("linear", dtype="float32")(outputs)
        return tf.keras.Model(inputs, outputs)

    def _data(self):
        x = self.rng.normal(size=(64, 6)).astype("f4")
        y = (x[:, 0] > 0).astype("i4") + (x[:, 1] > 0).astype("i4")
        return x, y

    def test_model_fit(self):
        model = self._tiny_model()
        opt = L.LARS(learning_rate=1.0, weight_decay=1e-4, trust_coefficient=0.01,
                     exclude_from_weight_decay=EXCLUDE)
        model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x, y = self._data()
        before = model.get_weights()
        history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
        losses = history.history["loss"]
        self.assertTrue(np.all(np.isfinite(losses)))
        self.assertLess(losses[-1], losses[0])
        changed = [not np.allclose(a, b) for a, b in zip(before, model.get_weights())]
        self.assertTrue(any(changed))
        self.assertEqual(int(opt.iterations.numpy()), 12)

    def test_loss_scale_optimizer_mixed_float16(self):
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            model = self._tiny_model()
            self.assertEqual(model.layers[1].compute_dtype, "float16")
            inner = L.LARS(learning_rate=1.0, weight_decay=1e-4,
                           exclude_from_weight_decay=EXCLUDE)
            opt = tf.keras.mixed_precision.LossScaleOptimizer(inner)
            self.assertIs(L.unwrap(opt), inner)
            L.unwrap(opt).momentum = 0.95
            model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            x, y = self._data()
            history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
            self.assertTrue(np.all(np.isfinite(history.history["loss"])))
            for weight in model.trainable_weights:
                self.assertEqual(weight.dtype, tf.float32)
                self.assertTrue(np.all(np.isfinite(weight.numpy())), weight.name)
            self.assertAllClose(inner.momentum.numpy(), 0.95)
            self.assertGreater(int(inner.iterations.numpy()), 0)
            for velocity in inner._velocities:  # the LARS state is FP32 too
                self.assertEqual(velocity.dtype, tf.float32)
        finally:
            tf.keras.mixed_precision.set_global_policy("float32")

    def test_horovod_distributed_optimizer_rebuilds_lars(self):
        # One plain process: Horovod's wrapper rebuilds LARS from get_config() (a subclass of
        # the same name); the multi-process behaviour is tested with the all-reduce itself.
        try:
            import horovod.tensorflow.keras as hvd
        except ImportError as error:
            self.skipTest(f"Horovod is not installed: {error}")
        hvd.init()
        opt = L.LARS(learning_rate=2.0, momentum=0.95, weight_decay=1e-4,
                     exclude_from_weight_decay=EXCLUDE, trust_coefficient=0.001)
        wrapped = hvd.DistributedOptimizer(opt)
        self.assertIsInstance(wrapped, L.LARS)
        self.assertEqual(type(wrapped).__name__, "LARS")
        self.assertEqual(wrapped.get_config(), opt.get_config())
        model = self._tiny_model()
        model.compile(wrapped, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        wrapped.momentum = 0.5  # set on the rebuilt optimizer, the one that trains
        x, y = self._data()
        history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        self.assertTrue(np.all(np.isfinite(history.history["loss"])))
        self.assertAllClose(wrapped.momentum.numpy(), 0.5)
        self.assertAllClose(opt.momentum.numpy(), 0.95)  # the original is not the one in use

    def test_unwrap_rejects_other_optimizers(self):
        with self.assertRaisesRegex(TypeError, "no LARS"):
            L.unwrap(tf.keras.optimizers.SGD())


if __name__ == "__main__":
    tf.test.main()
