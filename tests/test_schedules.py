"""The paper's LR configurations and momentum rule, pinned at chosen epochs (values by hand)."""
import tensorflow as tf

from official_resnet.optimizers import schedules as S


class LrConfigATest(tf.test.TestCase):

    def test_pinned_values(self):
        pinned = {
            0.0: 1e-5,
            17.0: 1e-5 + (34.0 - 1e-5) / 2,  # half-way through the warm-up
            34.0: 34.0,  # the peak
            60.0: 34.0 * (1 - 26 / 56) ** 2,  # 9.7577
            90.0: 0.0,
        }
        for epoch, lr in pinned.items():
            self.assertAllClose(S.lr_config_a(epoch), lr, rtol=1e-12, msg=f"epoch {epoch}")
        self.assertAllClose(S.lr_config_a(60.0), 9.757653, rtol=1e-6)

    def test_continuous_at_the_end_of_warmup_and_zero_after_the_end(self):
        self.assertAllClose(S.lr_config_a(34.0 - 1e-9), S.lr_config_a(34.0), atol=1e-6)
        self.assertEqual(S.lr_config_a(120.0), 0.0)

    def test_monotone_up_then_down(self):
        up = [S.lr_config_a(e) for e in (0, 5, 10, 20, 30, 34)]
        down = [S.lr_config_a(e) for e in (34, 40, 50, 70, 89, 90)]
        self.assertEqual(up, sorted(up))
        self.assertEqual(down, sorted(down, reverse=True))


class LrConfigBTest(tf.test.TestCase):

    def test_pinned_values(self):
        pinned = {
            0.0: 0.2,
            2.5: 0.2 + 28.8 / 2,  # 14.6
            5.0: 29 * (85 / 90) ** 2,  # 25.867: the warm-up branch ends before 5
            29.99: 29 * (1 - 29.99 / 90) ** 2,  # 12.893
            30.0: 50 * (60 / 90) ** 2,  # 22.222
            60.0: 50 * (30 / 90) ** 2,  # 5.5556
            89.9: 50 * (0.1 / 90) ** 2,  # 6.2e-5
        }
        for epoch, lr in pinned.items():
            self.assertAllClose(S.lr_config_b(epoch), lr, rtol=1e-12, msg=f"epoch {epoch}")
        self.assertAllClose(S.lr_config_b(2.5), 14.6)
        self.assertAllClose(S.lr_config_b(30.0), 22.2222222)

    def test_jumps_where_the_printed_formula_jumps(self):
        eps = 1e-9
        # At 30 the LR rises by 50/29: the paper switches to Goyal et al.'s largest base LR.
        self.assertAllClose(S.lr_config_b(30.0) / S.lr_config_b(30.0 - eps), 50 / 29, rtol=1e-6)
        # At 5 the warm-up reaches 29 but the decay starts from 29 * (85/90)^2.
        self.assertAllClose(S.lr_config_b(5.0 - eps), 29.0, rtol=1e-6)
        self.assertAllClose(S.lr_config_b(5.0) / S.lr_config_b(5.0 - eps), (85 / 90) ** 2,
                            rtol=1e-6)

    def test_continuous_elsewhere(self):
        for epoch in (1.0, 4.0, 10.0, 29.0, 31.0, 45.0, 75.0, 89.0):
            self.assertAllClose(S.lr_config_b(epoch - 1e-9), S.lr_config_b(epoch), rtol=1e-6,
                                msg=f"epoch {epoch}")

    def test_zero_from_the_end_on(self):
        # (1 - e/90)^2 would grow again after 90: it is held at 0.
        self.assertEqual(S.lr_config_b(90.0), 0.0)
        self.assertEqual(S.lr_config_b(100.0), 0.0)

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "epoch"):
            S.lr_config_b(-1.0)
        with self.assertRaisesRegex(ValueError, "epoch"):
            S.lr_config_a(float("nan"))
        with self.assertRaisesRegex(ValueError, "switch_epoch"):
            S.lr_config_b(1.0, switch_epoch=100.0)
        with self.assertRaisesRegex(ValueError, "warmup_epochs"):
            S.lr_config_a(1.0, warmup_epochs=90.0)


class MomentumTest(tf.test.TestCase):

    def test_paper_batches(self):
        self.assertAllClose(S.momentum_for_batch(32768), 0.9)
        self.assertAllClose(S.momentum_for_batch(55296), 1 - 0.1 / 1.6875)  # 0.940741
        self.assertAllClose(S.momentum_for_batch(55296), 0.9407407)
        self.assertAllClose(S.momentum_for_batch(65536), 0.95)

    def test_small_batch_raises_with_advice(self):
        self.assertAllClose(S.momentum_for_batch(3276.8), 0.0)  # the smallest allowed
        with self.assertRaisesRegex(ValueError, "lower reference_batch"):
            S.momentum_for_batch(256)
        # Scaled with the data set, the same batch is fine.
        reference = S.scaled_reference_batch(50000)
        self.assertAllClose(reference, 32768 * 50000 / 1281167)
        self.assertAllClose(S.momentum_for_batch(55296 * 50000 / 1281167, reference),
                            S.momentum_for_batch(55296))

    def test_cap(self):
        self.assertAllClose(S.momentum_for_batch(10 ** 9), S.MAX_MOMENTUM)
        self.assertAllClose(S.momentum_for_batch(131072, max_momentum=0.96), 0.96)
        with self.assertRaisesRegex(ValueError, "max_momentum"):
            S.momentum_for_batch(32768, max_momentum=1.0)

    def test_bad_arguments(self):
        for kwargs in ({"total_batch": 0}, {"total_batch": 1024, "reference_batch": 0},
                       {"total_batch": 1024, "reference_momentum": 1.0}):
            with self.assertRaises(ValueError):
                S.momentum_for_batch(**kwargs)


class ScheduleTest(tf.test.TestCase):

    def test_paper_length(self):
        a, b = S.Schedule("A"), S.Schedule("b")
        self.assertEqual(b.lr_config, "B")
        for epoch in (0.0, 17.0, 34.0, 60.0, 90.0):
            self.assertEqual(a.lr(epoch), S.lr_config_a(epoch))
        for epoch in (0.0, 2.5, 5.0, 30.0, 89.9):
            self.assertEqual(b.lr(epoch), S.lr_config_b(epoch))

    def test_momentum_rule_per_config(self):
        a, b = S.Schedule("A"), S.Schedule("B")
        self.assertEqual(a.momentum(10.0, 55296), 0.9)  # A: constant
        self.assertAllClose(b.momentum(10.0, 55296), 0.9407407)  # B: follows the batch
        self.assertAllClose(b.momentum(40.0, 65536), 0.95)  # Exp. 3 after epoch 30
        forced = S.Schedule("A", batch_momentum=True)
        self.assertAllClose(forced.momentum(0.0, 65536), 0.95)
        constant_b = S.Schedule("B", batch_momentum=False, constant_momentum=0.85)
        self.assertEqual(constant_b.momentum(0.0, 65536), 0.85)

    def test_shortened_run_scales_every_breakpoint(self):
        short = S.Schedule("B", total_epochs=9.0)
        self.assertAllClose(short.lr(0.25), S.lr_config_b(2.5))  # mid warm-up
        self.assertAllClose(short.lr(3.0), S.lr_config_b(30.0))  # the switch
        self.assertAllClose(short.lr(3.0) / short.lr(3.0 - 1e-9), 50 / 29, rtol=1e-6)
        self.assertEqual(short.lr(9.0), 0.0)
        a = S.Schedule("A", total_epochs=45.0)
        self.assertAllClose(a.lr(17.0), 34.0)  # the peak moves from 34 to 17
        self.assertAllClose(S.paper_epoch(4.5, 9.0), 45.0)

    def test_lr_params_and_scale(self):
        s = S.Schedule("A", lr_params={"base_lr": 10.0}, lr_scale=0.5)
        self.assertAllClose(s.lr(34.0), 5.0)

    def test_validation(self):
        with self.assertRaisesRegex(ValueError, "lr_config"):
            S.Schedule("C")
        with self.assertRaisesRegex(ValueError, "peak_lr.*accepted"):
            S.Schedule("B", lr_params={"peak_lr": 1.0})
        with self.assertRaisesRegex(ValueError, "total_epochs"):
            S.Schedule("B", total_epochs=0)
        with self.assertRaisesRegex(ValueError, "reference_momentum"):
            S.Schedule("B", reference_momentum=1.5)
        with self.assertRaisesRegex(ValueError, "lower reference_batch"):
            S.Schedule("B").momentum(0.0, 1024)
        with self.assertRaisesRegex(ValueError, "epoch"):
            S.Schedule("A").lr(-0.5)


if __name__ == "__main__":
    tf.test.main()
