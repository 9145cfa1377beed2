"""The recipe's callbacks: BatchSizeControl in a user's own fit on 2 workers (the batch per update
switches at the given epoch, the updates per epoch follow, and the weights equal one process's
with the same total batches), its errors, the LR/momentum schedule per update, and how train.py
cuts the batch plan into Keras epochs and fits."""
import json
import os
import tempfile

import numpy as np
import tensorflow as tf

from official_resnet.model.recipe_model import RecipeModel
from official_resnet.optimizers.lars import LARS
from official_resnet.plan import batch_plan
from official_resnet.plan.batch_plan import PhasePlan
from official_resnet.run.callbacks import (BatchSizeControl, Evaluation, LRMomentumSchedule,
                                           MetricAverage)
from official_resnet.run.run_state import epochs_per_keras_epoch
from official_resnet.run.workers import Workers
from tests import harness


def load(directory, rank):
    with np.load(os.path.join(directory, f"rank{rank}.npz")) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


class BatchSizeControlFitTest(tf.test.TestCase):

    def test_users_fit_on_two_workers(self):
        single = os.path.join(tempfile.mkdtemp(prefix="tftorus-bsc-"), "single")
        result = harness.run([harness.worker("batch_size_control_fit.py"), single], timeout=300)
        self.assertEqual(result.returncode, 0, harness.describe(result))  # the one-process run
        multi, result = harness.two_rank_suite()  # the two-rank world other tests share
        self.assertIn("rank 1/2 done", result.output, harness.describe(result))
        expected = [{"updates": 8, "batch_per_update": 8}] * 2 + \
                   [{"updates": 4, "batch_per_update": 16}] * 2
        for directory, ranks in ((single, [0]), (multi, [0, 1])):
            for r in ranks:
                with open(os.path.join(directory, f"rank{r}.json")) as f:
                    self.assertEqual(json.load(f), expected, f"{directory} rank {r}")
        reference, got, other = load(single, 0), load(multi, 0), load(multi, 1)
        for a, b, c in zip(reference, got, other):
            self.assertAllEqual(b, c)  # both workers hold the same weights
            self.assertLess(np.max(np.abs(a - b)) / np.max(np.abs(a)), 1e-5)


def small_model():
    tf.keras.utils.set_random_seed(1)
    net = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(3,))])
    return RecipeModel.wrap(net)


class CallbackUnitTest(tf.test.TestCase):

    def test_totals_that_do_not_split_say_what_to_change(self):
        with self.assertRaisesRegex(ValueError, r"total batch 12 of epochs 2-4 is not a multiple "
                                                r"of micro-batch 8 x 1 workers"):
            BatchSizeControl.from_total_batches([(0, 2, 8), (2, 4, 12)], micro_batch=8,
                                                workers=1)

    def test_needs_an_accumulating_model_and_whole_updates_per_epoch(self):
        data = tf.data.Dataset.from_tensors((tf.ones([2, 3]), tf.zeros([2], tf.int32))).repeat()
        plain = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(3,))])
        plain.compile(optimizer="sgd", loss="mse")
        with self.assertRaisesRegex(TypeError, r"SGD cannot change its micro-batches per "
                                               r"update: compile with tftorus.keras."
                                               r"DistributedOptimizer\(SGD\(...\)\)"):
            plain.fit(data, epochs=1, steps_per_epoch=2, verbose=0,
                      callbacks=[BatchSizeControl([(0, 2)])])
        model = small_model()
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1))
        with self.assertRaisesRegex(ValueError, "3 steps per epoch is not a multiple of \\[2\\]"):
            model.fit(data, epochs=1, steps_per_epoch=3, verbose=0,
                      callbacks=[BatchSizeControl([(0, 2)])])

    def test_lr_and_momentum_are_set_per_update_on_the_samples_clock(self):
        model = small_model()
        model.compile(optimizer=LARS(learning_rate=0.0, momentum=0.9))
        self.check_lr_and_momentum_per_update(model)

    def test_lr_and_momentum_per_update_in_a_users_own_model(self):
        # Keras' own train step, the user's loss, our optimizer (one process here)
        import tftorus
        import tftorus.keras
        tftorus.init()
        inputs = tf.keras.Input((3,))
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(4)(inputs))
        model.compile(optimizer=tftorus.keras.DistributedOptimizer(
            LARS(learning_rate=0.0, momentum=0.9)),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        self.check_lr_and_momentum_per_update(model)

    def check_lr_and_momentum_per_update(self, model):
        seen = []

        class Record(tf.keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                opt = self.model.optimizer
                seen.append((batch, round(float(opt.learning_rate.numpy()), 4),
                             round(float(opt.momentum.numpy()), 4)))

        data = tf.data.Dataset.from_tensors((tf.ones([2, 3]), tf.zeros([2], tf.int32))).repeat()
        schedule = LRMomentumSchedule(lambda epoch: epoch, lambda epoch, total: total / 100,
                                      micro_batch=2, workers=1, epoch_fraction=0.5)
        model.fit(data, epochs=2, steps_per_epoch=4, verbose=0, callbacks=[
            BatchSizeControl([(0, 1), (1, 2)]), schedule, Record()])
        # epoch 0: one micro-batch per update, LR = data epoch = batch / 4 / 2; epoch 1: updates
        # of 2 micro-batches, set at their first (batches 0 and 2), total batch 4
        self.assertEqual(seen, [(0, 0.0, 0.02), (1, 0.125, 0.02), (2, 0.25, 0.02),
                                (3, 0.375, 0.02), (0, 0.5, 0.04), (1, 0.5, 0.04),
                                (2, 0.75, 0.04), (3, 0.75, 0.04)])


def plan(index, start, end, workers, total, accumulation=1):
    per_worker = total // workers
    return PhasePlan(index=index, workers=workers, start_epoch=start, end_epoch=end,
                     total_batch=total, per_worker_batch=per_worker, accumulation=accumulation,
                     micro_batch=per_worker // accumulation, steps_per_epoch=1000 // total)


class StandaloneCallbacksTest(tf.test.TestCase):
    """The callbacks of official_resnet.run.callbacks in a user's plain Keras fit, no trainer."""

    def test_evaluation_with_bn_statistics_and_metric_average_in_a_plain_fit(self):
        tf.keras.utils.set_random_seed(5)
        model = tf.keras.Sequential([tf.keras.layers.Dense(8, input_shape=(3,)),
                                     tf.keras.layers.BatchNormalization(),
                                     tf.keras.layers.Dense(2)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x = np.random.RandomState(0).standard_normal((32, 3)).astype(np.float32) * 5 + 3
        y = (x[:, 0] > 3).astype(np.int32)
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
        seen = []

        class Record(tf.keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                seen.append((epoch, sorted(logs), logs.get("val_top1")))

        evaluation = Evaluation(lambda: data, Workers(), every=2.0, bn_batches=lambda e: data)
        history = model.fit(data, epochs=3, verbose=0, callbacks=[
            MetricAverage(Workers()), evaluation, Record()])
        # due at epoch 2 (every 2) and at the fit's last, 3; with the BN statistics of the data
        self.assertEqual([e for e, _, top1 in seen if top1 is not None], [1, 2])
        self.assertIn("val_top1", history.history)
        bn = model.layers[1]
        self.assertAllClose(bn.moving_mean, np.mean(model.layers[0](x), axis=0), atol=1e-4)
        self.assertTrue(all(0.0 <= top1 <= 100.0 for _, _, top1 in seen if top1 is not None))


class FitSegmentsTest(tf.test.TestCase):

    def test_keras_epochs_put_every_phase_boundary_on_an_epoch(self):
        self.assertEqual(epochs_per_keras_epoch([plan(0, 0, 1.5, 1, 8), plan(1, 1.5, 3, 1, 8)]),
                         0.5)
        self.assertAlmostEqual(epochs_per_keras_epoch([plan(0, 0, 2 / 3, 1, 8),
                                                       plan(1, 2 / 3, 2, 1, 8)]), 1 / 3)
        with self.assertRaisesRegex(ValueError, "choose --epochs"):
            epochs_per_keras_epoch([plan(0, 0, 0.123, 1, 8), plan(1, 0.123, 1, 1, 8)])

    def test_a_new_fit_where_the_world_size_or_the_micro_batch_changes(self):
        plans = [plan(0, 0, 1, 4, 64), plan(1, 1, 2, 4, 128, accumulation=2),  # micro 16, 16
                 plan(2, 2, 3, 4, 96),  # micro 24
                 plan(3, 3, 4, 2, 96)]  # other world size
        segments = batch_plan.fit_segments(plans, dataset_size=1000, epoch_fraction=1.0)
        self.assertEqual([[p.index for p in s.phases] for s in segments], [[0, 1], [2], [3]])
        self.assertEqual([(s.first_epoch, s.end_epoch) for s in segments],
                         [(0, 2), (2, 3), (3, 4)])
        # 1000 examples / (4 x 16) = 15.6 micro-steps, cut to a multiple of the accumulations (1,
        # 2); / (4 x 24) = 10.4; / (2 x 48) = 10.4
        self.assertEqual([s.steps_per_epoch for s in segments], [14, 10, 10])


if __name__ == "__main__":
    tf.test.main()
