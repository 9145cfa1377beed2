"""ResNet-50's gradient readiness (studies/step_profile.py): a FLOP model of the backward pass.

Builds Keras' ResNet-50 once (a few seconds; cached for the session). No processes."""
import math
import unittest

from studies import step_profile as sp


class StepProfileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.profile = sp.resnet50_profile()

    def test_one_time_per_variable_in_the_optimizer_order(self):
        shapes = sp.variable_shapes()  # layer_table checks they are model.trainable_variables
        self.assertEqual(len(self.profile.ready), len(shapes))
        self.assertEqual(len(shapes), 214)
        self.assertEqual(shapes[0], (7, 7, 3, 64))  # conv1's kernel first, the classifier last
        self.assertEqual(shapes[-2:], [(2048, 1000), (1000,)])

    def test_ready_in_reverse_forward_order_within_the_backward_pass(self):
        ready = self.profile.ready
        backward = self.profile.backward_seconds
        self.assertAlmostEqual(backward, sp.COMPUTE_SECONDS * 2 / 3)
        self.assertTrue(all(t >= 0 for t in ready))
        self.assertTrue(all(a >= b for a, b in zip(ready, ready[1:])),
                        "a variable is ready before one after it in the forward order")
        self.assertEqual(ready[0], backward)  # the first convolution ends the backward pass
        self.assertLess(ready[-1], 0.01 * backward)  # the classifier comes first
        self.assertAlmostEqual(sp.forward_seconds() + backward, sp.COMPUTE_SECONDS)

    def test_most_bytes_ready_early(self):
        sizes = [math.prod(s) for s in sp.variable_shapes()]
        half = sum(n for n, t in zip(sizes, self.profile.ready)
                   if t <= self.profile.backward_seconds / 2)
        self.assertGreater(half / sum(sizes), 0.8)  # the late layers hold most of the weights

    def test_cached_and_scaled(self):
        self.assertIs(sp.resnet50_profile(), self.profile)
        other = sp.resnet50_profile(0.1, 0.5)
        self.assertAlmostEqual(other.backward_seconds, 0.05)
        self.assertAlmostEqual(other.ready[100] / 0.05,
                               self.profile.ready[100] / self.profile.backward_seconds)
        with self.assertRaises(ValueError):
            sp.resnet50_profile(0.0)


if __name__ == "__main__":
    unittest.main()
