"""The gradient-readiness study (studies/gradient_readiness.py) on a small model, in seconds."""
import contextlib
import io

import numpy as np
import tensorflow as tf

from studies import gradient_readiness


class GradientReadinessTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        tf.keras.utils.set_random_seed(0)
        # Wide layers, so each bucket's gradients take measurable time; the last layer's come
        # first in the backward pass.
        self.model = tf.keras.Sequential([tf.keras.Input((256,))] + [
            tf.keras.layers.Dense(512, activation="relu") for _ in range(4)] + [
            tf.keras.layers.Dense(10)])
        self.optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
        self.optimizer.build(self.model.trainable_variables)
        self.loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.images = tf.random.uniform((64, 256))
        self.labels = tf.constant(np.arange(64) % 10)

    def test_buckets_are_ready_between_the_forward_and_the_backward_pass_end(self):
        # one 512 x 512 FP16 kernel is 0.5 MiB: a bucket per layer or so
        buckets = gradient_readiness.bucket_plan(self.model.trainable_variables, tf.float16,
                                                 600 * 1024)
        self.assertGreater(len(buckets), 2)
        self.assertEqual(max(buckets[0].indices), len(self.model.trainable_variables) - 1)
        result = gradient_readiness.readiness(self.model, self.optimizer, self.loss,
                                              self.images, self.labels, buckets, steps=5,
                                              warmup=2)
        ready = result["buckets"]
        self.assertLen(ready, len(buckets))
        self.assertLess(0.0, result["forward"])
        self.assertLessEqual(result["forward"], ready[0])
        self.assertEqual(ready, sorted(ready))  # stamps run in the order they were made
        self.assertLessEqual(ready[-1], result["backward"])
        self.assertGreater(result["update"], 0.0)
        lines = gradient_readiness.report(result, buckets)
        self.assertIn("forward pass ends", lines[0])
        self.assertRegex(lines[-1], r"At most (0|1)\.\d\d of the step's compute")

    def test_bad_arguments_say_what_to_change(self):
        err = io.StringIO()
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(err):
            gradient_readiness.parse_args(["--batch", "0"])
        self.assertIn("--batch >= 1", err.getvalue())
        self.assertEqual(gradient_readiness.parse_args(["--fusion-mb", "4"]).fusion_mb, 4.0)


if __name__ == "__main__":
    tf.test.main()
