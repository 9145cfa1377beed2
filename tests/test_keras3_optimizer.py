"""tftorus.keras.DistributedOptimizer on Keras 3 (the current stack), in one process: it is the
user's optimizer class (a saved model loads with Keras alone), it trains as the plain optimizer
on one worker (with backward_passes_per_step too), it refuses what it cannot do in one line, and
a step compiled by XLA is refused. On 2 workers: backward_passes_per_step and
average_aggregated_gradients in fit and in custom loops against float64 NumPy
(tests/workers/keras3_backward_passes.py). The other multi-worker sums are
tests/test_user_fit.py's."""
import os
import re
import tempfile
import unittest

import numpy as np
import tensorflow as tf

from tests import harness
from tftorus.runtime import stack

if stack.KERAS_3:
    import keras

    import tftorus
    import tftorus.keras as hvd


@unittest.skipUnless(stack.KERAS_3, "Keras 3 (the current stack); Keras 2 takes Horovod's wrapper")
class Keras3OptimizerTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        tftorus.init()  # one process: the tf engine without a cluster

    def model_and_data(self, optimizer, **compile_kwargs):
        keras.utils.set_random_seed(3)
        inputs = keras.Input((4,))
        model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(3)(inputs)))
        model.compile(optimizer=optimizer, loss="mse", **compile_kwargs)
        rng = np.random.RandomState(0)
        return model, rng.standard_normal((16, 4)).astype("float32"), \
            rng.standard_normal((16, 2)).astype("float32")

    def test_keeps_the_users_class_and_config(self):
        sgd = keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True, clipnorm=2.0)
        opt = hvd.DistributedOptimizer(sgd, compression=hvd.Compression.fp16)
        self.assertIsInstance(opt, keras.optimizers.SGD)
        self.assertEqual((type(opt).__name__, type(opt).__module__),
                         ("SGD", type(sgd).__module__))
        self.assertEqual(opt.get_config(), sgd.get_config())

    def test_one_worker_trains_as_the_plain_optimizer(self):
        ours, x, y = self.model_and_data(
            hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)))
        plain, _, _ = self.model_and_data(keras.optimizers.SGD(0.1, momentum=0.9))
        ours.fit(x, y, batch_size=4, epochs=2, verbose=0)
        plain.fit(x, y, batch_size=4, epochs=2, verbose=0)
        for a, b in zip(ours.get_weights(), plain.get_weights()):
            self.assertAllClose(a, b, rtol=1e-6, atol=1e-7)
        self.assertEqual(int(ours.optimizer.iterations.numpy()), 8)

    def test_batch_size_control_counts_updates(self):
        model, x, y = self.model_and_data(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)))
        model.fit(x, y, batch_size=4, epochs=3, verbose=0,
                  callbacks=[hvd.BatchSizeControl([(0, 1), (1, 2), (2, 4)])])
        self.assertEqual(int(model.optimizer.iterations.numpy()), 4 + 2 + 1)

    def test_backward_passes_per_step_on_one_worker(self):
        # k micro-batches of 4 per update: as the plain optimizer on batches of 4k with the mean
        # (average_aggregated_gradients) or k times the learning rate (their sum); iterations
        # counts updates; k=1 is the plain path
        def trained(optimizer, batch_size):
            model, x, y = self.model_and_data(optimizer)
            model.fit(x, y, batch_size=batch_size, epochs=2, verbose=0, shuffle=False)
            return model

        for k, average, lr in [(2, True, 0.1), (4, False, 0.1 * 4), (1, True, 0.1)]:
            with self.subTest(k=k, average=average):
                ours = trained(hvd.DistributedOptimizer(
                    keras.optimizers.SGD(0.1, momentum=0.9), backward_passes_per_step=k,
                    average_aggregated_gradients=average), 4)
                plain = trained(keras.optimizers.SGD(lr, momentum=0.9), 4 * k)
                for a, b in zip(ours.get_weights(), plain.get_weights()):
                    self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)
                self.assertEqual(int(ours.optimizer.iterations.numpy()), 2 * 4 // k)
                self.assertEqual(ours.optimizer._agg_helper is None, k == 1)

    def test_backward_passes_per_step_is_not_batch_size_controls(self):
        model, x, y = self.model_and_data(hvd.DistributedOptimizer(
            keras.optimizers.SGD(0.1), backward_passes_per_step=2))
        with self.assertRaisesRegex(ValueError, "built with Horovod's backward_passes_per_step"):
            model.fit(x, y, batch_size=4, epochs=1, verbose=0,
                      callbacks=[hvd.BatchSizeControl([(0, 1)])])

    def test_saved_model_loads_with_keras_alone_and_with_load_model(self):
        model, x, y = self.model_and_data(hvd.DistributedOptimizer(keras.optimizers.Adam(1e-2)))
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        path = os.path.join(tempfile.mkdtemp(prefix="tftorus-k3-"), "m.keras")
        model.save(path)
        plain = keras.models.load_model(path)
        self.assertEqual(type(plain.optimizer), keras.optimizers.Adam)
        again = hvd.load_model(path)
        self.assertEqual(type(again.optimizer).__name__, "Adam")
        self.assertTrue(hasattr(again.optimizer, "_allreduce_grads"))
        self.assertEqual(int(again.optimizer.iterations.numpy()), 2)  # its state came along
        again.fit(x, y, batch_size=8, epochs=1, verbose=0)
        self.assertEqual(int(again.optimizer.iterations.numpy()), 4)

    def test_an_xla_compiled_step_is_refused_in_one_line(self):
        model, x, y = self.model_and_data(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                                          jit_compile=True)
        with self.assertRaisesRegex(RuntimeError, r"compiled with XLA.*jit_compile=False"):
            model.fit(x, y, batch_size=4, epochs=1, verbose=0)

    def test_what_it_cannot_do_says_what_to_use(self):
        sgd = keras.optimizers.SGD(0.1)
        for kwargs, pattern in [
                ({"backward_passes_per_step": 0}, "whole number >= 1"),
                ({"backward_passes_per_step": 1.5}, "whole number >= 1"),
                ({"backward_passes_per_step": True}, "whole number >= 1"),
                ({"op": hvd.Adasum if hasattr(hvd, "Adasum") else 2}, "Average or tftorus.Sum"),
                ({"algorithm": "butterfly"}, "algorithm"),
                ({"not_an_option": 1}, "unexpected arguments")]:
            with self.assertRaisesRegex((ValueError, TypeError), pattern):
                hvd.DistributedOptimizer(sgd, **kwargs)
        with self.assertRaisesRegex(TypeError, "optimizer instance"):
            hvd.DistributedOptimizer("sgd")
        with self.assertRaisesRegex(TypeError, "LossScaleOptimizer around ours"):
            hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(sgd))
        with self.assertRaisesRegex(ValueError, "already a tftorus"):
            hvd.DistributedOptimizer(hvd.DistributedOptimizer(sgd))


@unittest.skipUnless(stack.KERAS_3, "Keras 3 (the current stack); Keras 2 takes Horovod's wrapper, "
                                    "whose backward_passes_per_step is Horovod's own")
class BackwardPassesOnTwoWorkersTest(tf.test.TestCase):

    def test_fit_and_custom_loops_against_numpy(self):
        result = harness.run_tf_config([harness.worker("keras3_backward_passes.py")], np=2,
                                       timeout=300)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        counts = re.findall(r"backward passes: (\d+) checks, 0 failed", result.output)
        self.assertEqual(counts, ["20", "20"], harness.describe(result))


if __name__ == "__main__":
    tf.test.main()
