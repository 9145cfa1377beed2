"""Batch-size control: every experiment resolves, phases switch at the right epoch with the
right per-worker batch, accumulation and momentum, and unmappable worlds are clear errors."""
import tensorflow as tf
from absl import flags as absl_flags
from absl.testing import flagsaver

from flags import config as flag_config
from official_resnet.optimizers.schedules import Schedule
from official_resnet.plan import batch_plan
from official_resnet.plan.experiments import EXPERIMENTS, get_experiment

IMAGENET = 1281167


class ExperimentTableTest(tf.test.TestCase):

    def test_every_experiment_resolves(self):
        for name in ("ref", "1", "2", "3", "4", "reference"):
            exp = get_experiment(name)
            self.assertEqual(exp.phases[0].start, 0)
            self.assertEqual(exp.phases[-1].end, 90)
            for a, b in zip(exp.phases, exp.phases[1:]):
                self.assertEqual(a.end, b.start)

    def test_table3_numbers(self):
        self.assertEqual(get_experiment("2").total_batches, (55296, 55296))
        self.assertEqual(get_experiment("3").total_batches, (55296, 65536))
        self.assertEqual(get_experiment("4").total_batches, (34816, 69632, 87040, 121856))
        self.assertEqual(get_experiment("2").phases[0].paper_gpus, 3456)
        self.assertEqual(get_experiment("3").phases[1].paper_gpus, 2048)
        self.assertEqual(get_experiment("1").phases[0].paper_gpus, 2176)
        self.assertEqual((get_experiment("2").label_smoothing, get_experiment("4").label_smoothing),
                         (0.1, 0.0))

    def test_unknown_experiment(self):
        with self.assertRaisesRegex(ValueError, "unknown experiment '7'.*ref, 1, 2, 3, 4"):
            get_experiment("7")


class PlanTest(tf.test.TestCase):

    def test_exp2_at_paper_scale(self):
        plans = batch_plan.plan_phases(get_experiment("2"), world_size=3456,
                                       dataset_size=IMAGENET)
        self.assertEqual([(p.per_worker_batch, p.total_batch) for p in plans],
                         [(16, 55296), (16, 55296)])  # the world keeps 3456: 16 per worker
        self.assertEqual([(p.start_epoch, p.end_epoch) for p in plans], [(0, 30), (30, 90)])
        self.assertEqual(plans[0].steps_per_epoch, IMAGENET // 55296)

    def test_exp4_uneven_rows(self):
        # 85K and 119K do not divide by 4096 (nor by 2048: 87040 / 2048 = 42.5); every total
        # batch of Exp. 4 divides by gcd = 17408, so 2176 workers (Exp. 1's count) run it.
        for world in (4096, 2048):
            with self.assertRaisesRegex(batch_plan.PlanError, f"does not split over {world} workers"):
                batch_plan.plan_phases(get_experiment("4"), world_size=world, dataset_size=IMAGENET)
        plans = batch_plan.plan_phases(get_experiment("4"), world_size=2176, dataset_size=IMAGENET)
        self.assertEqual([p.per_worker_batch for p in plans], [16, 32, 40, 56])
        self.assertEqual([p.start_epoch for p in plans], [0, 30, 45, 75])

    def test_scaled_run_switches_at_scaled_epochs(self):
        plans = batch_plan.plan_phases(get_experiment("3"), world_size=4, dataset_size=10000,
                                       epochs=6, batch_divisor=256)
        self.assertEqual([(p.start_epoch, p.end_epoch) for p in plans], [(0, 2), (2, 6)])
        self.assertEqual([p.total_batch for p in plans], [216, 256])
        self.assertEqual([p.per_worker_batch for p in plans], [54, 64])
        self.assertEqual(batch_plan.phase_at(plans, 1.99).index, 0)
        self.assertEqual(batch_plan.phase_at(plans, 2.0).index, 1)

    def test_momentum_follows_the_total_batch(self):
        plans = batch_plan.plan_phases(get_experiment("3"), world_size=4, dataset_size=10000,
                                       epochs=6, batch_divisor=256)
        schedule = Schedule("B", total_epochs=6, reference_batch=32768 / 256)
        m1 = schedule.momentum(1.0, plans[0].total_batch)
        m2 = schedule.momentum(3.0, plans[1].total_batch)
        self.assertAllClose([m1, m2], [1 - 0.1 * 32768 / 55296, 0.95])  # the paper's values

    def test_accumulation_under_a_cap(self):
        plans = batch_plan.plan_phases(get_experiment("2"), world_size=1, dataset_size=100000,
                                       batch_divisor=256, max_micro_batch=64)
        self.assertEqual([(p.per_worker_batch, p.accumulation, p.micro_batch) for p in plans],
                         [(216, 4, 54), (216, 4, 54)])
        for p in plans:
            self.assertEqual(p.accumulation * p.micro_batch, p.per_worker_batch)
            self.assertLessEqual(p.micro_batch, 64)

    def test_logical_workers(self):
        """A world standing in for --logical_workers: one micro-batch per logical worker, so 1,
        2 or 4 workers as 4 take micro-batches of 216 / 4 = 54; a world that does not divide
        the logical workers, or a cap that does not divide their batch, is refused."""
        exp = get_experiment("2")
        for world, accumulation in ((4, 1), (2, 2), (1, 4)):
            plans = batch_plan.plan_phases(exp, world_size=world, dataset_size=10000,
                                           batch_divisor=256, logical_workers=4)
            self.assertEqual({(p.accumulation, p.micro_batch) for p in plans},
                             {(accumulation, 54)}, world)
        with self.assertRaisesRegex(batch_plan.PlanError, "3 workers cannot stand in for "
                                                          "--logical_workers=4"):
            batch_plan.plan_phases(exp, world_size=3, dataset_size=10000, batch_divisor=256,
                                   logical_workers=4)
        with self.assertRaisesRegex(batch_plan.PlanError, "a divisor of 54"):
            batch_plan.plan_phases(exp, world_size=2, dataset_size=10000, batch_divisor=256,
                                   logical_workers=4, max_micro_batch=40)  # 3 x 36

    def test_bad_worlds_and_sizes(self):
        exp = get_experiment("2")
        with self.assertRaisesRegex(batch_plan.PlanError, "does not split over 5 workers"):
            batch_plan.plan_phases(exp, world_size=5, dataset_size=10000, batch_divisor=256)
        with self.assertRaisesRegex(batch_plan.PlanError, "larger than the data set"):
            batch_plan.plan_phases(exp, world_size=4, dataset_size=100, batch_divisor=256)
        with self.assertRaisesRegex(batch_plan.PlanError, "batch_divisor"):
            batch_plan.plan_phases(exp, world_size=4, dataset_size=10000, batch_divisor=7)
        # 34816 / 2048 = 17 per worker: under a cap of 16 only 17 micro-batches of 1 are equal
        with self.assertRaisesRegex(batch_plan.PlanError, r"only as 17 x 1, far below the cap; "
                                                          r"set --max_micro_batch to one of"):
            batch_plan.plan_phases(get_experiment("1"), world_size=1, dataset_size=10000,
                                   batch_divisor=2048, max_micro_batch=16)


class FlagsTest(tf.test.TestCase):

    def test_flags_resolve_each_experiment_and_overrides(self):
        flag_config.define_flags()
        absl_flags.FLAGS.mark_as_parsed()  # defaults, as tests import without parsing argv
        for exp in EXPERIMENTS:
            with flagsaver.flagsaver(exp=exp):
                config = flag_config.resolve()
                self.assertEqual(config.lr_config, get_experiment(exp).lr_config)
        with flagsaver.flagsaver(exp="2", label_smoothing=0.0, lr_config="a"):
            config = flag_config.resolve()
            self.assertEqual((config.label_smoothing, config.lr_config), (0.0, "A"))
        with flagsaver.flagsaver(exp="9"):
            with self.assertRaisesRegex(ValueError, "unknown experiment"):
                flag_config.resolve()
        with flagsaver.flagsaver(exp="2", epochs=-1.0):
            with self.assertRaisesRegex(ValueError, "--epochs must be positive"):
                flag_config.resolve()
        # inf passes every "> 0" (--heartbeat_timeout=inf turned the watchdog off): refused
        for name, value in (("heartbeat_timeout", float("inf")), ("base_lr", float("nan")),
                            ("stall_timeout", float("-inf"))):
            with flagsaver.flagsaver(exp="2", **{name: value}):
                with self.assertRaisesRegex(ValueError, rf"--{name} must be a finite number"):
                    flag_config.resolve()

    def test_batch_divisor_divides_the_lr_unless_lr_scale_is_given(self):
        """The scale-down rule: batches / D -> LR schedule / D; --lr_scale overrides it."""
        flag_config.define_flags()
        absl_flags.FLAGS.mark_as_parsed()
        with flagsaver.flagsaver(exp="2"):
            config = flag_config.resolve()
            self.assertEqual((config.lr_scale, config.lr_scale_from), (1.0, "batch_divisor"))
        with flagsaver.flagsaver(exp="2", batch_divisor=256):
            config = flag_config.resolve()
            self.assertEqual((config.lr_scale, config.lr_scale_from), (1 / 256, "batch_divisor"))
        with flagsaver.flagsaver(exp="2", batch_divisor=256, lr_scale=0.5):
            config = flag_config.resolve()
            self.assertEqual((config.lr_scale, config.lr_scale_from), (0.5, "flag"))
        with flagsaver.flagsaver(exp="2", lr_scale=0.0):
            with self.assertRaisesRegex(ValueError, "--lr_scale must be > 0"):
                flag_config.resolve()


if __name__ == "__main__":
    tf.test.main()


class PhaseWorkersTest(tf.test.TestCase):
    """--gpus_per_phase: Table 3's GPU count per phase, checked phase by phase."""

    # Table 3: (GPUs, per-worker batch) per phase; Exp. 4's 68K phase: 4096 GPUs at 17 each
    TABLE3 = {"ref": [(1024, 32)], "1": [(2176, 16), (2176, 32)],
              "2": [(3456, 16), (1728, 32)], "3": [(3456, 16), (2048, 32)],
              "4": [(2176, 16), (4096, 17), (2720, 32), (3808, 32)]}

    def test_paper_counts_for_every_experiment(self):
        for name, rows in self.TABLE3.items():
            with self.subTest(exp=name):
                exp = get_experiment(name)
                workers = batch_plan.phase_workers(exp, "paper")
                plans = batch_plan.plan_phases(exp, workers=workers, dataset_size=IMAGENET)
                self.assertEqual([(p.workers, p.per_worker_batch) for p in plans], rows)
                self.assertEqual([p.total_batch for p in plans], list(exp.total_batches))

    def test_scaled_down_keeps_the_per_worker_batches(self):
        exp = get_experiment("2")
        workers = batch_plan.phase_workers(exp, "paper", batch_divisor=864)
        self.assertEqual(workers, (4, 2))
        plans = batch_plan.plan_phases(exp, workers=workers, dataset_size=1024, batch_divisor=864)
        self.assertEqual([(p.workers, p.total_batch, p.per_worker_batch) for p in plans],
                         [(4, 64, 16), (2, 64, 32)])
        with self.assertRaisesRegex(batch_plan.PlanError, "does not divide; use a divisor of"):
            batch_plan.phase_workers(exp, "paper", batch_divisor=256)

    def test_fixed_and_explicit(self):
        exp = get_experiment("3")
        self.assertEqual(batch_plan.phase_workers(exp, "fixed", 8), (8, 8))
        self.assertEqual(batch_plan.phase_workers(exp, "4, 2"), (4, 2))
        with self.assertRaisesRegex(batch_plan.PlanError, "has 2 phase"):
            batch_plan.phase_workers(exp, "4")
        with self.assertRaisesRegex(batch_plan.PlanError, "give the number of workers"):
            batch_plan.phase_workers(exp, "fixed")

    def test_exp3_on_3456_says_which_counts_divide(self):
        with self.assertRaises(batch_plan.PlanError) as caught:
            batch_plan.plan_phases(get_experiment("3"), world_size=3456, dataset_size=IMAGENET)
        text = str(caught.exception)
        self.assertIn("the total batch 65536 of epochs 31-90 does not split over 3456 workers",
                      text)
        self.assertIn("([55296, 65536], gcd 2048): e.g. 256, 512, 1024, 2048 workers", text)
        self.assertIn("--gpus_per_phase=paper", text)
