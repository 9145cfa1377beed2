"""The convergence study's arms resolve to what docs/studies/convergence.md says, and its report
works.

The study itself (studies/convergence_study.py, ~27 min) is not run here.
"""
import importlib.util
import os
import tempfile

import numpy as np
import tensorflow as tf
from absl import flags as absl_flags
from absl.testing import flagsaver

from flags import config as flag_config
from official_resnet.optimizers.lars import LARS
from official_resnet.optimizers.schedules import lr_config_b, lr_overrides
from official_resnet.plan.experiments import get_experiment, with_batch_schedule
from tests import harness


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(harness.ROOT, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


study = load("convergence_study", ("studies", "convergence_study.py"))

EPOCHS, DATASET, SMALL = 12.0, 10000, 16


def resolve_arm(arm):
    """(config, plans, schedule) train.py builds for the arm: embedded.flags' batch divisor,
    then the study's flags, on one worker."""
    flag_config.define_flags()
    absl_flags.FLAGS.mark_as_parsed()
    with flagsaver.flagsaver():
        absl_flags.FLAGS(["train.py", "--batch_divisor=256", f"--epochs={EPOCHS}",
                          *study.MODEL_FLAGS, *study.arm_flags(arm, SMALL)])
        spec = flag_config.resolve_run()
    return spec.config, spec.plans(DATASET, world_size=1), spec.schedule()


class ArmsTest(tf.test.TestCase):

    def test_sgd_arms_scale_the_lr_linearly_without_warmup(self):
        (ca, pa, sa), (cb, pb, sb) = resolve_arm("a"), resolve_arm("b")
        self.assertEqual([p.total_batch for p in pa], [SMALL])
        self.assertEqual([p.total_batch for p in pb], [32 * SMALL])
        for config in (ca, cb):
            self.assertEqual((config.optimizer, config.label_smoothing), ("sgd", 0.0))
            self.assertEqual(config.lr_scale, 1.0)  # --base_lr is already this batch's LR
        self.assertAlmostEqual(sa.lr(0.0), 0.1 * SMALL / 256)  # no warm-up: the peak at once
        self.assertAlmostEqual(sb.lr(0.0), 32 * sa.lr(0.0))
        self.assertAlmostEqual(sb.lr(4.0), 32 * sa.lr(4.0))  # the same decay shape
        self.assertEqual(sa.lr(EPOCHS), 0.0)
        self.assertEqual((sa.momentum(1.0, SMALL), sb.momentum(1.0, 32 * SMALL)), (0.9, 0.9))

    def test_recipe_arms_are_exp2_with_the_scale_down_rule(self):
        (cc, pc, sc), (cd, pd, sd) = resolve_arm("c"), resolve_arm("d")
        for config in (cc, cd):
            self.assertEqual((config.optimizer, config.lr_config, config.label_smoothing),
                             ("lars", "B", 0.1))
            self.assertEqual((config.batch_divisor, config.lr_scale_from), (108, "batch_divisor"))
        self.assertEqual([p.total_batch for p in pc], [512, 512])  # Exp. 2's two phases
        self.assertEqual([p.total_batch for p in pd], [256, 512])
        self.assertAlmostEqual(pd[1].start_epoch, EPOCHS * 30 / 90)
        for epoch in (0.0, 0.3, 2.0, 5.0, 11.0):  # configuration B, LRs divided as the batch
            paper_epoch = epoch * 90 / EPOCHS
            self.assertAlmostEqual(sc.lr(epoch), lr_config_b(paper_epoch) * 512 / 55296)
            self.assertAlmostEqual(sd.lr(epoch), sc.lr(epoch))
        # momentum as Exp. 2's 54K has it against 32K, and lower at half the batch
        self.assertAlmostEqual(sc.momentum(1.0, 512), 1 - 0.1 * 32768 / 55296, places=6)
        self.assertAlmostEqual(sd.momentum(1.0, 256), 1 - 0.2 * 32768 / 55296, places=6)

    def test_every_arm_normalises_over_the_same_micro_batch_and_bn_images(self):
        for arm in "abcde":
            config, plans, _ = resolve_arm(arm)
            self.assertEqual({p.micro_batch for p in plans}, {SMALL}, arm)
            self.assertEqual(config.bn_stat_batches * max(p.per_worker_batch for p in plans),
                             study.BN_STAT_IMAGES, arm)
            self.assertEqual((config.image_size, config.small_inputs, config.width),
                             (64, False, 8), arm)

    def test_small_batch_recipe_arm_is_exp2_at_the_small_batch(self):
        (cc, _, sc), (ce, pe, se) = resolve_arm("c"), resolve_arm("e")
        self.assertEqual([p.total_batch for p in pe], [SMALL, SMALL])
        self.assertEqual((ce.optimizer, ce.lr_config, ce.label_smoothing, ce.batch_divisor),
                         ("lars", "B", 0.1, 55296 // SMALL))
        for epoch in (0.0, 2.0, 11.0):  # the same rule: 32x smaller batch, 32x smaller LR
            self.assertAlmostEqual(se.lr(epoch), sc.lr(epoch) / 32)
        self.assertAlmostEqual(se.momentum(1.0, SMALL), sc.momentum(1.0, 32 * SMALL))
        self.assertNotIn("e", study.DEFAULT_ARMS)  # a diagnostic arm, run on request

    def test_a_batch_that_does_not_divide_exp2s_is_refused(self):
        with self.assertRaisesRegex(ValueError, "the batch 640 must divide Exp. 2's 55296"):
            study.arm_flags("c", 20)

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
                 "steps": 228 + seed if arm == "d" else 228,
                 "curve": [(e, 20.0 + 5 * e + i) for e in (1.0, 2.0, 3.0)]}
                for i, arm in enumerate("abcd") for seed in (0, 1)]
        text = study.table(rows, list("abcd"))
        self.assertEqual(len(text.splitlines()), 6)
        self.assertIn("| b | large-batch SGD, linear LR | 2 | 228 | 51.50 | 51.00-52.00 | +1.00 |",
                      text)
        self.assertIn("| d | paper recipe + batch control | 2 | 228-229 | 53.50 |", text)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "plot.png")
            study.plot(rows, list("abcd"), path, "synthetic")
            with open(path, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    tf.test.main()
