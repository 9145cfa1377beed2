"""Non-finite gradients or loss: the step is skipped (weights and optimizer slots unchanged, bit
for bit), the step is reported, every worker skips the same step, and --on_nonfinite=stop ends
the run with a message naming the step (tests/test_train_script.py runs that end to end)."""
import numpy as np
import tensorflow as tf

from official_resnet.lars import LARS
from official_resnet.train_step import TrainStep, all_finite
from tests import harness


def identity_reduce(grads, variables):
    del variables  # one worker
    return grads


def small_model():
    tf.keras.utils.set_random_seed(3)
    return tf.keras.Sequential([tf.keras.layers.Dense(8, activation="tanh", input_shape=(6,)),
                                tf.keras.layers.Dense(4)])


def batch(seed, nan=False):
    rng = np.random.RandomState(seed)
    images = rng.standard_normal((8, 6)).astype(np.float32)
    if nan:
        images[0, 0] = np.nan
    return tf.constant(images), tf.constant(rng.randint(0, 4, 8))


class SkipStepTest(tf.test.TestCase):

    def tearDown(self):
        tf.keras.mixed_precision.set_global_policy("float32")
        super().tearDown()

    def test_all_finite(self):
        self.assertTrue(bool(all_finite([tf.ones([3]), tf.constant(2.0, tf.float16)])))
        self.assertFalse(bool(all_finite([tf.ones([3]), tf.constant([1.0, np.inf])])))
        self.assertFalse(bool(all_finite([tf.constant(np.nan, tf.bfloat16)])))

    def test_nan_batch_skips_the_step_bit_for_bit(self):
        model = small_model()
        optimizer = LARS(learning_rate=0.1, momentum=0.9, weight_decay=1e-4)
        step = TrainStep(model, optimizer, identity_reduce, 4, 0.1).build(accumulation=2)
        _, _, applied = step(*batch(0))
        self.assertTrue(bool(applied))
        state = [v.numpy().copy() for v in model.variables + optimizer.variables]
        loss, _, applied = step(*batch(1, nan=True))
        self.assertFalse(bool(applied))
        self.assertTrue(np.isnan(float(loss)))
        for before, v in zip(state, model.variables + optimizer.variables):
            self.assertAllEqual(before, v.numpy(), msg=v.name)  # iterations too: not counted
        _, _, applied = step(*batch(2))
        self.assertTrue(bool(applied))  # the next finite step goes on normally
        self.assertNotAllEqual(state[0], model.variables[0].numpy())

    def test_mixed_precision_overflow_lowers_the_loss_scale(self):
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
        model = small_model()
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(LARS(learning_rate=0.1))
        step = TrainStep(model, optimizer, identity_reduce, 4, 0.0).build(accumulation=1)
        step(*batch(0))
        scale = float(optimizer.loss_scale)
        weights = [v.numpy().copy() for v in model.trainable_variables]
        _, _, applied = step(*batch(1, nan=True))
        self.assertFalse(bool(applied))
        self.assertEqual(float(optimizer.loss_scale), scale / 2)
        for before, v in zip(weights, model.trainable_variables):
            self.assertAllEqual(before, v.numpy())


class SkipOnEveryWorkerTest(tf.test.TestCase):

    def test_one_rank_nan_every_rank_skips(self):
        result = harness.run([harness.worker("nonfinite_step.py")], np=2, timeout=180)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.assertFalse(result.timed_out, harness.describe(result))
        self.assertEqual(result.output.count("verdicts [True, False, True]"), 2,
                         harness.describe(result))
        self.assertEqual(result.output.count("non-finite step: 4 checks, 0 failed"), 2,
                         harness.describe(result))


if __name__ == "__main__":
    tf.test.main()
