"""The convergence study's arms resolve to what docs/convergence.md says, and its report works.

The study itself (run_scripts/convergence_study.py, ~25 min) is not run here.
"""
import importlib.util
import os
import tempfile

import numpy as np
import tensorflow as tf
from absl import flags as absl_flags
from absl.testing import flagsaver

from flags import config as flag_config
from flags.experiments import get_experiment, with_batch_schedule
from official_resnet import batch_plan
from official_resnet.lars import LARS
from official_resnet.schedules import Schedule, lr_overrides
from tests import harness

spec = importlib.util.spec_from_file_location(
    "convergence_study", os.path.join(harness.ROOT, "run_scripts", "convergence_study.py"))
study = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study)

EPOCHS, WORKERS, DATASET = 8.0, 2, 9600


def resolve_arm(arm):
    """(config, plans, schedule) train.py would build for the arm."""
    flag_config.define_flags()
    absl_flags.FLAGS.mark_as_parsed()
    with flagsaver.flagsaver():
        for item in ["--batch_divisor=1", f"--epochs={EPOCHS}"] + study.arm_flags(arm, 32):
            name, value = item[2:].split("=", 1)
            absl_flags.FLAGS[name].parse(value)
        config = flag_config.resolve()
    experiment = with_batch_schedule(get_experiment(config.exp), config.batch_schedule)
    plans = batch_plan.plan_phases(experiment, world_size=WORKERS, dataset_size=DATASET,
                                   epochs=config.epochs, batch_divisor=config.batch_divisor)
    schedule = Schedule(config.lr_config, total_epochs=config.epochs,
                        reference_batch=config.reference_batch / config.batch_divisor,
                        lr_params=lr_overrides(config.lr_config, config.epochs, config.base_lr,
                                               config.warmup_epochs))
    return config, plans, schedule


class ArmsTest(tf.test.TestCase):

    def test_sgd_arms_scale_the_lr_linearly_without_warmup(self):
        (ca, pa, sa), (cb, pb, sb) = resolve_arm("a"), resolve_arm("b")
        self.assertEqual([p.total_batch for p in pa], [32])
        self.assertEqual([p.total_batch for p in pb], [1024])
        for config in (ca, cb):
            self.assertEqual((config.optimizer, config.label_smoothing), ("sgd", 0.0))
        self.assertAlmostEqual(sa.lr(0.0), 0.1 * 32 / 256)  # no warm-up: the peak at once
        self.assertAlmostEqual(sb.lr(0.0), 32 * sa.lr(0.0))
        self.assertAlmostEqual(sb.lr(4.0), 32 * sa.lr(4.0))  # the same decay shape
        self.assertEqual(sa.lr(EPOCHS), 0.0)
        self.assertEqual((sa.momentum(1.0, 32), sb.momentum(1.0, 1024)), (0.9, 0.9))

    def test_recipe_arms_use_lars_warmup_smoothing_and_batch_control(self):
        (cc, pc, sc), (cd, pd, sd) = resolve_arm("c"), resolve_arm("d")
        for config in (cc, cd):
            self.assertEqual((config.optimizer, config.lr_config, config.label_smoothing),
                             ("lars", "B", 0.1))
        self.assertEqual([p.total_batch for p in pc], [1024])
        self.assertEqual([p.total_batch for p in pd], [512, 1024])
        self.assertAlmostEqual(pd[1].start_epoch, EPOCHS * 30 / 90)
        self.assertLess(sc.lr(0.0), sc.lr(EPOCHS * 5 / 90 - 0.01))  # warming up
        # momentum as Exp. 2's 54K has it against 32K
        self.assertAlmostEqual(sc.momentum(1.0, 1024), 1 - 0.1 * 32768 / 55296, places=3)

    def test_bad_batch_schedules_name_the_fix(self):
        for bad in ("512@5", "x@0", "512@0,256@95", "512@0,256@0", "0@0", "512@0,256@7.5"):
            with self.assertRaisesRegex(ValueError, "batch_schedule", msg=bad):
                with_batch_schedule(get_experiment("2"), bad)

    def test_lr_overrides(self):
        self.assertEqual(lr_overrides("A", 9.0, base_lr=0.4, warmup_epochs=1.0),
                         {"base_lr": 0.4, "warmup_epochs": 10.0})  # paper epochs: 1 x 90 / 9
        with self.assertRaisesRegex(ValueError, "configuration A"):
            lr_overrides("B", 9.0, base_lr=0.4)


class SgdOptimizerTest(tf.test.TestCase):

    def test_lars_without_layer_adaptation_is_momentum_sgd(self):
        """--optimizer=sgd: the LARS update with trust ratio 1 is Keras' momentum SGD."""
        rng = np.random.default_rng(0)
        start = rng.standard_normal((3, 4)).astype(np.float32)
        grads = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3)]
        ours = tf.Variable(start, name="conv/kernel")
        keras = tf.Variable(start, name="conv/kernel")
        sgd_like = LARS(learning_rate=0.05, momentum=0.9, exclude_from_layer_adaptation=[".*"])
        reference = tf.keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
        for g in grads:
            sgd_like.apply_gradients([(tf.constant(g), ours)])
            reference.apply_gradients([(tf.constant(g), keras)])
        self.assertAllClose(ours.numpy(), keras.numpy(), rtol=1e-6, atol=1e-6)


class ReportTest(tf.test.TestCase):

    def test_table_and_plot_from_histories(self):
        rows = [{"arm": arm, "seed": seed, "top1": 50.0 + i + seed, "train_seconds": 100.0,
                 "curve": [(e, 20.0 + 5 * e + i) for e in (1.0, 2.0, 3.0)]}
                for i, arm in enumerate("abcd") for seed in (0, 1)]
        text = study.table(rows, list("abcd"))
        self.assertEqual(len(text.splitlines()), 6)
        self.assertIn("| b | large-batch SGD, linear LR | 2 | 51.50 | 51.00-52.00 | +1.00 |", text)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "plot.png")
            study.plot(rows, list("abcd"), path, "synthetic")
            with open(path, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    tf.test.main()
