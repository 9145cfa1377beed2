"""LARS against a NumPy transcription of the same formula, and inside Keras' machinery, on both
stacks: official_resnet.optimizers.lars.LARS is the Keras 2 class on the classic stack and the
Keras 3 class on the current one (official_resnet/optimizers/lars_keras2.py, lars_keras3.py,
sharing lars_core.py).

The reference is written from the LARS paper's Algorithm 1 (documented in
official_resnet/optimizers/lars.py), independently of the TensorFlow code: coupled weight decay,
the trust ratio on the raw gradient's norm, the learning rate applied before the momentum buffer.

tftorus' DistributedOptimizer needs tftorus.init(); on Keras 3 that is the tf engine, which must
start before TensorFlow's runtime does, so its test class comes first in this file and calls it in
setUpClass (a run where an earlier test started TensorFlow without tftorus.init() skips it,
saying so); on the classic stack Horovod's engine has no such constraint.
"""
import ast
import copy
import os
import tempfile

import numpy as np
import tensorflow as tf

import tftorus
from official_resnet.model import network as resnet_model
from official_resnet.optimizers import lars as L
from tftorus.runtime import stack

if stack.KERAS_3:
    import keras

    LossScaleOptimizer = keras.optimizers.LossScaleOptimizer
else:
    keras = tf.keras
    LossScaleOptimizer = tf.keras.mixed_precision.LossScaleOptimizer

EXCLUDE = ["_bn", "bias"]


def recipe_exclusions():
    """official_resnet.run.trainer.EXCLUDE_FROM_LARS, read from its source: trainer imports the
    whole recipe (PIL, the input pipeline), which is beside the point here."""
    package = os.path.dirname(os.path.dirname(resnet_model.__file__))  # official_resnet/
    path = os.path.join(package, "run", "trainer.py")
    with open(path) as source:
        for node in ast.parse(source.read()).body:
            if isinstance(node, ast.Assign) and any(
                    getattr(t, "id", None) == "EXCLUDE_FROM_LARS" for t in node.targets):
                return ast.literal_eval(node.value)
    raise AssertionError(f"EXCLUDE_FROM_LARS is no longer assigned in {path}")


def variable(value, path):
    """A variable whose name, as LARS reads it (`stack.variable_name`), is `path` (Keras 3's
    `path`) or `path:0` (tf.Variable's name on Keras 2)."""
    value = np.asarray(value, "float32")
    if not stack.KERAS_3:
        return tf.Variable(value, name=path)
    scope, _, leaf = path.rpartition("/")
    if not scope:
        return keras.Variable(value, name=leaf, dtype="float32")
    with keras.name_scope(scope):
        return keras.Variable(value, name=leaf, dtype="float32")


def dtype_of(v):
    return tf.as_dtype(v.dtype)


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


def tiny_model():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,))
    x = keras.layers.Dense(8, name="fc1")(inputs)
    x = keras.layers.BatchNormalization(name="fc1_bn")(x)
    x = keras.layers.Activation("relu")(x)
    outputs = keras.layers.Dense(3, name="logits")(x)
    outputs = keras.layers.Activation("linear", dtype="float32")(outputs)
    return keras.Model(inputs, outputs)


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype("f4")
    y = (x[:, 0] > 0).astype("i4") + (x[:, 1] > 0).astype("i4")
    return x, y


def loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class DistributedOptimizerTest(tf.test.TestCase):
    """First in the file: on Keras 3 tftorus.init() has to run before TensorFlow starts."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.init_error = None
        try:
            tftorus.init()  # one process (the tf engine without a cluster on Keras 3)
        except RuntimeError as error:  # an earlier test in this process started TensorFlow
            cls.init_error = error

    def setUp(self):
        super().setUp()
        if self.init_error is not None:
            self.skipTest(f"tftorus.init() cannot run in this process any more (run this file "
                          f"alone): {self.init_error}")
        keras.mixed_precision.set_global_policy("float32")

    def test_tftorus_distributed_optimizer_rebuilds_lars(self):
        # One process: tftorus' wrapper (Horovod's on Keras 2, tftorus' own on Keras 3)
        # rebuilds LARS from get_config() as a subclass of the same name, which then trains as
        # the plain LARS does on one worker; the multi-process sums are the all-reduce's tests.
        import tftorus.keras as hvd
        opt = L.LARS(learning_rate=2.0, momentum=0.95, weight_decay=1e-4,
                     exclude_from_weight_decay=EXCLUDE, trust_coefficient=0.001)
        wrapped = hvd.DistributedOptimizer(opt)
        self.assertIsInstance(wrapped, L.LARS)
        self.assertIsNot(type(wrapped), L.LARS)
        self.assertEqual(type(wrapped).__name__, "LARS")
        self.assertEqual(wrapped.get_config(), opt.get_config())
        self.assertIs(L.unwrap(LossScaleOptimizer(wrapped)), wrapped)
        x, y = data()
        trained = []
        for optimizer in (wrapped, L.LARS.from_config(opt.get_config())):
            model = tiny_model()
            model.compile(optimizer, loss())
            optimizer.momentum = 0.5  # set on the rebuilt optimizer, the one that trains
            history = model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
            self.assertTrue(np.all(np.isfinite(history.history["loss"])))
            trained.append(model.get_weights())
        for ours, plain in zip(*trained):  # one worker: the average is the gradient itself
            self.assertAllClose(ours, plain, rtol=1e-5, atol=1e-6)
        self.assertAllClose(wrapped.momentum.numpy(), 0.5)
        self.assertAllClose(opt.momentum.numpy(), 0.95)  # the original is not the one in use
        self.assertEqual(int(wrapped.iterations.numpy()), 4)


class LarsTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        keras.mixed_precision.set_global_policy("float32")
        self.rng = np.random.default_rng(0)

    def _variables(self):
        return {
            "conv1/kernel": variable(self.rng.normal(size=(3, 3, 2, 4)), "conv1/kernel"),
            "conv1_bn/gamma": variable(self.rng.normal(size=(4,)) + 1.0,
                                       "conv1_bn/gamma"),  # excluded by name
            "dense/bias": variable(self.rng.normal(size=(4,)), "dense/bias"),  # excluded
            "zero/kernel": variable(np.zeros((5, 4)), "zero/kernel"),  # ||w|| = 0
        }

    def _compare(self, grad_dtype, nesterov=False, steps=4):
        """Four steps of one compiled step, the LR and momentum changed between them."""
        variables = self._variables()
        names = list(variables)
        var_list = [variables[k] for k in names]
        self.assertEqual([stack.variable_name(v).removesuffix(":0") for v in var_list], names)
        hp = dict(wd=1e-3, eta=0.01, eps=1e-6)
        opt = L.LARS(learning_rate=0.5, momentum=0.9, weight_decay=hp["wd"],
                     trust_coefficient=hp["eta"], epsilon=hp["eps"],
                     exclude_from_weight_decay=EXCLUDE, nesterov=nesterov)
        opt.build(var_list)
        traces = []

        @tf.function
        def step(grads):
            traces.append(1)  # runs only while tracing
            opt.apply_gradients(zip(grads, var_list))

        ref_w = {k: v.numpy().astype(np.float64) for k, v in variables.items()}
        ref_v = {k: np.zeros_like(w) for k, w in ref_w.items()}
        schedule = [(0.5, 0.9), (1.0, 0.9), (2.0, 0.95), (0.25, 0.5)]  # (lr, momentum) per step
        for i in range(steps):
            lr, momentum = schedule[i]
            opt.learning_rate = lr
            opt.momentum = momentum
            grads = {k: self.rng.normal(size=v.shape).astype(grad_dtype)
                     for k, v in variables.items()}
            grads["zero/kernel"] *= 1e-3
            step([tf.constant(grads[k]) for k in names])
            for k in names:
                excluded = k in ("conv1_bn/gamma", "dense/bias")
                ref_w[k], ref_v[k] = reference_step(
                    ref_w[k], grads[k].astype(np.float32), ref_v[k], lr=lr, momentum=momentum,
                    decay=not excluded, adapt=not excluded, nesterov=nesterov, **hp)
        self.assertLen(traces, 1)  # new LR and momentum values reached the step untraced
        self.assertEqual(int(opt.iterations.numpy()), steps)
        for k, v in variables.items():
            self.assertEqual(dtype_of(v), tf.float32)
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
        w = variable(np.full((4,), 0.5), "w")
        g = np.full((4,), 100.0, "f4")  # ||g|| = 200, ||w|| = 1
        opt = L.LARS(learning_rate=1.0, momentum=0.0, trust_coefficient=0.01, epsilon=0.0)
        opt.apply_gradients([(tf.constant(g), w)])
        self.assertAllClose(w.numpy(), 0.5 - 0.01 * 1.0 / 200.0 * 100.0 * np.ones(4))

    def test_separate_exclusion_lists(self):
        # Decay excluded for the bias only, adaptation for the BN gamma only.
        w = {k: variable(np.full((4,), 0.5), k) for k in ("fc_bn/gamma", "fc/bias")}
        g = np.full((4,), 100.0, "f4")
        opt = L.LARS(learning_rate=1.0, momentum=0.0, weight_decay=0.1, epsilon=0.0,
                     exclude_from_weight_decay=["bias"], exclude_from_layer_adaptation=["_bn"])
        opt.apply_gradients([(tf.constant(g), v) for v in w.values()])
        # gamma: decay, no trust ratio: 0.5 - (100 + 0.1 * 0.5)
        self.assertAllClose(w["fc_bn/gamma"].numpy(), np.full(4, 0.5 - 100.05))
        # bias: trust ratio without decay: 0.5 - 0.01 * 1 / 200 * 100
        self.assertAllClose(w["fc/bias"].numpy(), np.full(4, 0.5 - 0.005))

    def test_sparse_gradient_is_densified(self):
        dense, sparse = variable(np.ones((4, 2)), "emb_a"), variable(np.ones((4, 2)), "emb_b")
        values = np.array([[1.0, 2.0], [3.0, 4.0]], "f4")
        grad = tf.IndexedSlices(tf.constant(values), tf.constant([0, 2]), tf.constant([4, 2]))
        opt = L.LARS(learning_rate=1.0, momentum=0.9, weight_decay=1e-2)
        opt.apply_gradients([(grad, sparse), (tf.convert_to_tensor(grad), dense)])
        self.assertAllClose(sparse.numpy(), dense.numpy())
        self.assertNotAllClose(sparse.numpy()[1], np.ones(2))  # weight decay on every row

    def test_zero_gradient_and_zero_weight_do_not_produce_nan(self):
        w = variable(np.zeros((3,)), "w")
        opt = L.LARS(learning_rate=1.0, weight_decay=1e-4, epsilon=0.0)
        opt.apply_gradients([(tf.zeros(3), w)])
        self.assertAllEqual(w.numpy(), np.zeros(3))

    def test_momentum_change_takes_effect_in_a_compiled_step(self):
        w = variable([1.0, 2.0], "w")
        opt = L.LARS(learning_rate=1, momentum=0.9, exclude_from_layer_adaptation=["w"])
        opt.build([w])

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
        self.assertEqual(step.experimental_get_tracing_count(), 1)

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
        self.assertEqual(config["exclude_from_layer_adaptation"], ["_bn"])
        rebuilt = L.LARS.from_config(config)
        self.assertEqual(rebuilt.get_config(), config)
        # As Horovod's and tftorus' DistributedOptimizer do: a subclass of the same name.
        subclass = type("LARS", (L.LARS,), {"__module__": L.LARS.__module__})
        self.assertEqual(subclass.from_config(opt.get_config()).get_config(), config)
        # And through Keras' registry (what a saved model or LossScaleOptimizer's config uses).
        serialized = keras.optimizers.serialize(opt)
        again = (keras.optimizers.deserialize(serialized) if stack.KERAS_3 else
                 keras.optimizers.deserialize(serialized, use_legacy_optimizer=False))
        self.assertIsInstance(again, L.LARS)
        self.assertEqual(again.get_config(), config)

    def test_learning_rate_schedule_config_round_trip(self):
        schedule = keras.optimizers.schedules.PiecewiseConstantDecay([2], [1.0, 0.5])
        opt = L.LARS(learning_rate=schedule, momentum=0.9)
        config = opt.get_config()
        self.assertIsInstance(config["learning_rate"], dict)
        rebuilt = L.LARS.from_config(copy.deepcopy(config))  # (from_config edits its argument)
        self.assertEqual(rebuilt.get_config(), config)
        self.assertAllClose(float(rebuilt.learning_rate), 1.0)

    def test_default_adaptation_exclusion_follows_weight_decay_exclusion(self):
        config = L.LARS(exclude_from_weight_decay=EXCLUDE).get_config()
        self.assertEqual(config["exclude_from_layer_adaptation"], EXCLUDE)
        self.assertEqual(L.LARS().get_config()["trust_coefficient"], 0.01)  # the paper's

    def test_recipe_exclusions_on_the_projects_resnet(self):
        # The recipe's regexes exclude every BN gamma and beta and the classifier's bias, and
        # nothing else, on this stack's variable names (Keras 3: 'conv1_bn/gamma', Keras 2:
        # 'conv1_bn/gamma:0'), so both stacks exclude the same variables.
        exclude = recipe_exclusions()
        self.assertEqual(exclude, EXCLUDE)
        model = resnet_model.resnet(depth=14, num_classes=10, width=4, input_shape=(8, 8, 3),
                                    small_inputs=True)
        expected, bn_layers = set(), 0
        for layer in model.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                bn_layers += 1
                expected |= {f"{layer.name}/gamma", f"{layer.name}/beta"}
            elif isinstance(layer, keras.layers.Dense):
                expected.add(f"{layer.name}/bias")
        opt = L.LARS(exclude_from_weight_decay=exclude, weight_decay=1e-4)
        opt.build(model.trainable_variables)
        excluded = set()
        for v in model.trainable_variables:
            name = stack.variable_name(v).removesuffix(":0")
            decay, adapt = opt._use_weight_decay(v), opt._use_layer_adaptation(v)
            self.assertEqual(decay, adapt, name)
            if not decay:
                excluded.add(name)
        self.assertEqual(excluded, expected)
        self.assertLen(excluded, 2 * bn_layers + 1)
        self.assertLen(model.trainable_variables, len(excluded) + 18)  # 17 convs + the dense

    def test_model_fit(self):
        model = tiny_model()
        opt = L.LARS(learning_rate=1.0, weight_decay=1e-4, trust_coefficient=0.01,
                     exclude_from_weight_decay=EXCLUDE)
        model.compile(opt, loss())
        x, y = data()
        before = model.get_weights()
        history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
        losses = history.history["loss"]
        self.assertTrue(np.all(np.isfinite(losses)))
        self.assertLess(losses[-1], losses[0])
        changed = [not np.allclose(a, b) for a, b in zip(before, model.get_weights())]
        self.assertTrue(any(changed))
        self.assertEqual(int(opt.iterations.numpy()), 12)

    def test_checkpoint_restores_momentum_and_velocities(self):
        # The recipe checkpoints with tf.train.Checkpoint(model=..., optimizer=...).
        w = variable([1.0, -2.0, 3.0], "fc/kernel")
        opt = L.LARS(learning_rate=0.5, momentum=0.9)
        opt.apply_gradients([(tf.constant([0.1, 0.2, 0.3]), w)])
        opt.momentum, opt.learning_rate = 0.7, 0.25
        path = tf.train.Checkpoint(optimizer=opt, w=w).save(
            os.path.join(tempfile.mkdtemp(prefix="tftorus-lars-"), "ckpt"))
        w2 = variable([0.0, 0.0, 0.0], "fc/kernel")
        opt2 = L.LARS(learning_rate=0.1, momentum=0.1)
        opt2.build([w2])
        tf.train.Checkpoint(optimizer=opt2, w=w2).restore(path).assert_consumed()
        self.assertAllClose(opt2.momentum.numpy(), 0.7)
        self.assertAllClose(opt2.learning_rate.numpy(), 0.25)
        self.assertAllClose(opt2.velocity(w2).numpy(), opt.velocity(w).numpy())
        self.assertEqual(int(opt2.iterations.numpy()), 1)

    def test_saved_model_loads_with_keras_alone(self):
        model = tiny_model()
        opt = L.LARS(learning_rate=0.5, momentum=0.9, exclude_from_weight_decay=EXCLUDE)
        model.compile(opt, loss())
        x, y = data()
        model.fit(x[:16], y[:16], batch_size=8, epochs=1, verbose=0)
        opt.momentum = 0.7
        path = os.path.join(tempfile.mkdtemp(prefix="tftorus-lars-"), "m.keras")
        model.save(path)
        loaded = keras.models.load_model(path)  # the class is registered: no custom_objects
        self.assertIs(type(loaded.optimizer), L.LARS)
        self.assertEqual(loaded.optimizer.get_config(), opt.get_config())
        self.assertAllClose(loaded.optimizer.momentum.numpy(), 0.7)
        self.assertEqual(int(loaded.optimizer.iterations.numpy()), 2)
        for v, v2 in zip(model.trainable_variables, loaded.trainable_variables):
            self.assertAllClose(opt.velocity(v).numpy(), loaded.optimizer.velocity(v2).numpy())

    def test_loss_scale_optimizer_mixed_float16(self):
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            model = tiny_model()
            self.assertEqual(model.layers[1].compute_dtype, "float16")
            inner = L.LARS(learning_rate=1.0, weight_decay=1e-4,
                           exclude_from_weight_decay=EXCLUDE)
            opt = LossScaleOptimizer(inner)
            self.assertIs(L.unwrap(opt), inner)
            L.unwrap(opt).momentum = 0.95
            opt.learning_rate = 0.5  # the LossScaleOptimizer passes it on
            self.assertAllClose(inner.learning_rate.numpy(), 0.5)
            model.compile(opt, loss())
            x, y = data()
            history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
            self.assertTrue(np.all(np.isfinite(history.history["loss"])))
            for weight in model.trainable_weights:
                self.assertEqual(dtype_of(weight), tf.float32)
                self.assertTrue(np.all(np.isfinite(weight.numpy())), weight.name)
            self.assertAllClose(inner.momentum.numpy(), 0.95)
            self.assertGreater(int(inner.iterations.numpy()), 0)
            for velocity in inner._velocities:  # the LARS state is FP32 too
                self.assertEqual(dtype_of(velocity), tf.float32)
        finally:
            keras.mixed_precision.set_global_policy("float32")

    def test_unwrap_rejects_other_optimizers(self):
        with self.assertRaisesRegex(TypeError, "no LARS"):
            L.unwrap(keras.optimizers.SGD())


if __name__ == "__main__":
    tf.test.main()
