"""Non-finite gradients or loss: the update is skipped (weights, BN statistics and optimizer
slots unchanged, bit for bit), NonFiniteSteps reports it with its step (log, history.jsonl,
TensorBoard), every worker skips the same update, and --on_nonfinite=stop (or too many skips in
a row) ends the run with a message naming the step. tests/test_bad_input_surface.py runs the stop
through run_scripts/train.py (exit status 2)."""
import json
import os
import tempfile

import numpy as np
import tensorflow as tf

from official_resnet.model.keras_generation import KERAS
from official_resnet.model.recipe_model import RecipeModel, all_finite
from official_resnet.optimizers.lars import LARS
from official_resnet.plan.batch_plan import PhasePlan
from official_resnet.run.run_callbacks import EpochLogger, NonFiniteSteps, RunProgress
from official_resnet.run.run_state import NonFiniteLossError, RunState
from official_resnet.run.workers import Workers
from tests import harness
from tftorus.runtime.stack import variable_key


def small_model(label_smoothing=0.0):
    """With BN: its moving statistics are state a skipped step must not move either."""
    tf.keras.utils.set_random_seed(3)
    net = tf.keras.Sequential([tf.keras.layers.Dense(8, input_shape=(6,)),
                               tf.keras.layers.BatchNormalization(),
                               tf.keras.layers.Activation("tanh"),
                               tf.keras.layers.Dense(4)])
    return RecipeModel.wrap(net, label_smoothing=label_smoothing)


def batch(seed, nan=False):
    rng = np.random.RandomState(seed)
    images = rng.standard_normal((8, 6)).astype(np.float32)
    if nan:
        images[0, 0] = np.nan
    return tf.constant(images), tf.constant(rng.randint(0, 4, 8))


def update(model, images, labels):
    """One update of model.accumulation micro-batches: (its global loss, applied)."""
    k = int(model.accumulation.numpy())
    for x, y in zip(tf.split(images, k), tf.split(labels, k)):
        model.train_on_batch(x, y)
    return float(model.last_loss.numpy()), bool(model.last_applied.numpy())


def bn_layer(model):
    return [layer for layer in model.layers
            if isinstance(layer, tf.keras.layers.BatchNormalization)][0]


class SkipStepTest(tf.test.TestCase):

    def tearDown(self):
        tf.keras.mixed_precision.set_global_policy("float32")
        super().tearDown()

    def test_all_finite(self):
        self.assertTrue(bool(all_finite([tf.ones([3]), tf.constant(2.0, tf.float16)])))
        self.assertFalse(bool(all_finite([tf.ones([3]), tf.constant([1.0, np.inf])])))
        self.assertFalse(bool(all_finite([tf.constant(np.nan, tf.bfloat16)])))

    def test_nan_batch_skips_the_step_bit_for_bit(self):
        model = small_model(label_smoothing=0.1)
        optimizer = LARS(learning_rate=0.1, momentum=0.9, weight_decay=1e-4)
        model.compile(optimizer=optimizer)
        model.accumulation.assign(2)
        _, applied = update(model, *batch(0))
        self.assertTrue(applied)
        state = [v.numpy().copy() for v in model.variables + optimizer.variables]
        loss, applied = update(model, *batch(1, nan=True))
        self.assertFalse(applied)
        self.assertTrue(np.isnan(loss))
        for before, v in zip(state, model.variables + optimizer.variables):
            self.assertAllEqual(before, v.numpy(), msg=v.name)  # iterations too: not counted
        _, applied = update(model, *batch(2))
        self.assertTrue(applied)  # the next finite step goes on normally
        self.assertNotAllEqual(state[0], model.variables[0].numpy())
        moving_mean = bn_layer(model).moving_mean
        index = [variable_key(v) for v in model.variables].index(variable_key(moving_mean))
        self.assertNotAllEqual(state[index], moving_mean.numpy())  # a taken step moves BN stats

    def test_mixed_precision_overflow_lowers_the_loss_scale(self):
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
        model = small_model()
        model.compile(optimizer=LARS(learning_rate=0.1))  # compile adds the LossScaleOptimizer
        optimizer = model.optimizer
        self.assertIsInstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
        update(model, *batch(0))
        scale = KERAS.loss_scale(optimizer)
        weights = [v.numpy().copy() for v in model.trainable_variables]
        _, applied = update(model, *batch(1, nan=True))
        self.assertFalse(applied)
        self.assertEqual(KERAS.loss_scale(optimizer), scale / 2)
        for before, v in zip(weights, model.trainable_variables):
            self.assertAllEqual(before, v.numpy())

    def test_loss_scale_grows_after_finite_updates_and_unscales(self):
        # Keras 3's LossScaleOptimizer unscales and moves its scale only in its own apply,
        # which the recipe does not call (it would reduce twice): official_resnet.
        # keras_generation does both; the update must equal float32's without a loss scale.
        def trained(mixed):
            tf.keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
            model = small_model()
            lars = LARS(learning_rate=0.1, momentum=0.9)
            model.compile(optimizer=tf.keras.mixed_precision.LossScaleOptimizer(
                lars, initial_scale=8.0, dynamic_growth_steps=2) if mixed else lars)
            scales = []
            for i in range(3):
                update(model, *batch(i))
                if mixed:
                    scales.append(KERAS.loss_scale(model.optimizer))
            tf.keras.mixed_precision.set_global_policy("float32")
            return model, scales

        mixed, scales = trained(True)
        self.assertEqual(scales, [8.0, 16.0, 16.0])  # doubled after 2 finite updates
        self.assertEqual(int(mixed.optimizer.iterations.numpy()), 3)
        plain, _ = trained(False)
        for a, b in zip(mixed.trainable_variables, plain.trainable_variables):
            self.assertAllClose(a, b, rtol=2e-2, atol=2e-3)  # FP16 forward, unscaled update


STEPS_PER_EPOCH = 4


class Run:
    """The outcome of run_trainer: the shared state and its history."""

    def __init__(self, state):
        self.state, self.history = state, state.history


def run_trainer(model_dir, nan_at_steps, resume_state=None, **policy):
    """One epoch of 4 updates through model.fit and the recipe's callbacks on one worker; the
    batches of `nan_at_steps` (1-based) hold a NaN; `resume_state` (a checkpoint's state.json)
    carries the skip count and the clock. Returns the Run or raises what fit raises."""
    model = small_model()
    model.compile(optimizer=LARS(learning_rate=0.01, momentum=0.9))
    batches = [batch(i, nan=i + 1 in nan_at_steps) for i in range(STEPS_PER_EPOCH)]
    images = tf.concat([b[0] for b in batches], 0)
    labels = tf.concat([b[1] for b in batches], 0)
    plan = PhasePlan(index=0, workers=1, start_epoch=0.0, end_epoch=1.0, total_batch=8,
                     per_worker_batch=8, accumulation=1, micro_batch=8,
                     steps_per_epoch=STEPS_PER_EPOCH)
    resume_state = resume_state or {"elapsed": 0.0, "nonfinite_skips_in_a_row": 0}
    state = RunState(workers=Workers(), plans=[plan], dataset_size=8 * STEPS_PER_EPOCH,
                     model_dir=model_dir, elapsed_before=resume_state["elapsed"],
                     skips_in_a_row=resume_state["nonfinite_skips_in_a_row"])
    writer = tf.summary.create_file_writer(os.path.join(model_dir, "tensorboard"))
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)
    model.fit(data, epochs=1, steps_per_epoch=STEPS_PER_EPOCH, verbose=0, callbacks=[
        RunProgress(state, 8), NonFiniteSteps(state, writer=writer, **policy),
        EpochLogger(state, 8, writer)])
    return Run(state)


def checkpoint_state(run):
    """What train.py's checkpoint says of the skip count and the clock."""
    return {"nonfinite_skips_in_a_row": run.state.skips_in_a_row,
            "elapsed": run.history[-1].elapsed}


def scalars(log_dir, tag):
    """(TensorBoard step, value) of every point of `tag` in the event files under log_dir."""
    points = []
    for name in sorted(os.listdir(log_dir)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(log_dir, name)):
            for value in event.summary.value:
                if value.tag == tag:
                    points.append((event.step, float(tf.make_ndarray(value.tensor))))
    return points


class TrainerReportTest(tf.test.TestCase):
    """The policy and the report, on the real Trainer with a NaN batch at a known step."""

    def test_skip_is_reported_with_its_step(self):
        model_dir = tempfile.mkdtemp(prefix="tftorus-nonfinite-")
        with self.assertLogs("official_resnet.run.run_callbacks", "WARNING") as logs:
            trainer = run_trainer(model_dir, nan_at_steps={3})
        self.assertIn("step 3 (epoch 0.75): non-finite gradients or loss (nan) over all "
                      "workers; the step was skipped (1 in a row)", "\n".join(logs.output))
        [epoch] = trainer.history
        self.assertEqual((epoch.skipped_steps, epoch.skipped_at), (1, [3]))
        self.assertTrue(np.isfinite(epoch.loss))  # the mean of the 3 applied steps
        with open(os.path.join(model_dir, "history.jsonl")) as f:
            saved = json.loads(f.readline())
        self.assertEqual((saved["skipped_steps"], saved["skipped_at"]), (1, [3]))
        board = os.path.join(model_dir, "tensorboard")
        self.assertEqual(scalars(board, "skipped_step"), [(24, 3.0)])  # at 24 samples seen
        self.assertEqual(scalars(board, "skipped_steps"), [(32, 1.0)])  # per epoch

    def test_stop_policy_stops_at_the_first_one(self):
        with self.assertRaisesRegex(NonFiniteLossError,
                                    r"at step 2 \(epoch 0\.50\), stopping after "
                                    r"--on_nonfinite=stop: training diverged; lower the learning "
                                    r"rate \(--lr_scale\)"):
            run_trainer(tempfile.mkdtemp(), nan_at_steps={2}, on_nonfinite="stop")

    def test_skips_in_a_row_stop_the_run(self):
        # Skips that are not in a row do not add up; a run of them stops the run.
        trainer = run_trainer(tempfile.mkdtemp(), nan_at_steps={1, 3}, max_nonfinite_skips=2)
        self.assertEqual(trainer.history[0].skipped_at, [1, 3])
        with self.assertRaisesRegex(NonFiniteLossError, r"at step 3 .*2 steps in a row "
                                                        r"\(--max_nonfinite_skips\)"):
            run_trainer(tempfile.mkdtemp(), nan_at_steps={2, 3}, max_nonfinite_skips=2)

    def test_an_epoch_of_only_skipped_steps_has_no_loss(self):
        trainer = run_trainer(tempfile.mkdtemp(), nan_at_steps={1, 2, 3, 4},
                              max_nonfinite_skips=10)
        self.assertTrue(np.isnan(trainer.history[0].loss))  # not 0.0: nothing was applied

    def test_skip_count_and_clock_carry_over_a_resume(self):
        trainer = run_trainer(tempfile.mkdtemp(), nan_at_steps={4}, max_nonfinite_skips=2)
        state = checkpoint_state(trainer)
        self.assertEqual(state["nonfinite_skips_in_a_row"], 1)  # the epoch ended on a skip
        self.assertEqual(state["elapsed"], trainer.history[-1].elapsed)
        # Resumed: the clock goes on from the saved seconds, and the first step's skip is the
        # second in a row, which reaches --max_nonfinite_skips=2.
        state.update(elapsed=1000.0)
        resumed = run_trainer(tempfile.mkdtemp(), nan_at_steps=set(), resume_state=state,
                              max_nonfinite_skips=2)
        self.assertGreater(resumed.history[0].elapsed, 1000.0)
        with self.assertRaisesRegex(NonFiniteLossError, r"at step 1 .*2 steps in a row"):
            run_trainer(tempfile.mkdtemp(), nan_at_steps={1}, resume_state=state,
                        max_nonfinite_skips=2)


class SkipOnEveryWorkerTest(tf.test.TestCase):

    def test_one_rank_nan_every_rank_skips(self):
        # in the two-rank world other tests share (tests/harness.two_rank_suite)
        result = harness.two_rank_suite()[1]
        failure = harness.suite_report(result, "nonfinite_step", 2, harness.TWO_RANK_SUITE)
        self.assertFalse(failure, failure)
        self.assertEqual(result.output.count("verdicts [True, False, True]"), 2,
                         harness.describe(result))
        self.assertEqual(result.output.count("non-finite step: 4 checks, 0 failed"), 2,
                         harness.describe(result))


if __name__ == "__main__":
    tf.test.main()
