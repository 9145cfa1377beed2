"""The step studies' virtual accelerator (studies/virtual_accelerator.py): ResNet-50's variables,
the profile's times, exact gradients, idle CPU; on 2 workers its gradients all-reduced by
tftorus.keras.DistributedOptimizer in model.fit (tests/workers/virtual_accelerator_check.py)."""
import os
import re
import time
import unittest
from unittest import mock

import numpy as np
import tensorflow as tf

from studies import virtual_accelerator as va
from tests import harness

RANK = 3  # any rank: the gradients' values depend on it


def resnet50_for_the_step_study():
    return va.keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)


def name_of(variable) -> str:
    name = getattr(variable, "path", None) or variable.name  # Keras 3's path, Keras 2's name
    return name[:-2] if name.endswith(":0") else name


class ResNet50DescriptionTest(tf.test.TestCase):

    def test_variables_and_flops_are_keras_resnet50s(self):
        real = resnet50_for_the_step_study()
        virtual = va.VirtualResNet50(rank=0, step_seconds=0.0)
        want = [(name_of(v), tuple(v.shape)) for v in real.trainable_variables]
        self.assertLen(want, 214)
        self.assertEqual([(name_of(v), tuple(v.shape)) for v in virtual.trainable_variables],
                         want)
        self.assertEqual([(f"{s.name}/{v}", shape) for s in va.resnet50_layers()
                          for v, shape in s.variables], want)
        # the FLOPs' spatial sizes, against Keras' own output shapes (at 32 x 32 here)
        for spec in va.resnet50_layers(image_size=32):
            layer = real.get_layer(spec.name)
            if isinstance(layer, va.keras.layers.Conv2D):
                k, _, c_in, c_out = layer.kernel.shape
                _, h, w, _ = layer.output.shape
                self.assertEqual(spec.flops, 2 * k * k * c_in * c_out * h * w, spec.name)
            elif isinstance(layer, va.keras.layers.Dense):
                self.assertEqual(spec.flops, 2 * 2048 * 10)
            else:
                self.assertEqual(spec.flops, 0, spec.name)

    def test_profile_splits_the_step_by_flops_backward_twice_forward(self):
        flops = sum(s.flops for s in va.resnet50_layers(1000, 224))
        self.assertBetween(flops, 7.6e9, 7.8e9)  # ResNet-50's ~3.9 G multiply-adds
        profile = va.layer_profile(0.3)
        self.assertLen(profile, 107)
        self.assertAllClose(sum(t.forward_s + t.backward_s for t in profile), 0.3, atol=1e-12)
        self.assertAllClose([t.backward_s for t in profile],
                            [2 * t.forward_s for t in profile])
        self.assertEqual(profile[0].variables, ("conv1_conv/kernel", "conv1_conv/bias"))
        self.assertEqual(profile[1].forward_s, 0.0)  # conv1_bn
        ready = va.readiness(profile)
        self.assertAllClose(ready[0], 0.3)
        self.assertEqual(ready, sorted(ready, reverse=True))  # the last layers' first
        with self.assertRaisesRegex(ValueError, "finite number >= 0, got -1"):
            va.layer_profile(-1)
        with self.assertRaisesRegex(ValueError, "rank must be an integer >= 0"):
            va.VirtualResNet50(rank=-1)
        if not tf.config.threading.get_inter_op_parallelism_threads():  # the variable counts
            with mock.patch.dict(os.environ, {"TF_NUM_INTEROP_THREADS": "1"}), \
                    self.assertRaisesRegex(ValueError, "one inter-op thread .* Set "
                                                       "TF_NUM_INTEROP_THREADS=2"):
                va.VirtualResNet50(rank=0)

    def test_gradient_values_are_exact_and_tell_ranks_steps_and_variables_apart(self):
        values = {va.gradient_value(r, s, i) for r in range(4) for s in range(4)
                  for i in range(4)}
        self.assertLen(values, 64)
        for v in values:
            self.assertEqual(v * 2 ** 15, int(v * 2 ** 15))
            self.assertEqual(float(np.float32(v)), v)


class TrainStepTest(tf.test.TestCase):
    """One model, traced once, shared by the tests (its tracing is most of their time)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model = va.VirtualResNet50(rank=RANK, step_seconds=0.25, record=True)
        x = tf.ones([4, 1])

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(cls.model(x, training=True))
            return tape.gradient(loss, cls.model.trainable_variables)
        cls.step = staticmethod(step)  # not a method of the test case

    def run_step(self, fetch=True):
        """(gradients (NumPy copies where fetched), wall seconds, process CPU seconds, this
        step's number)."""
        number = self.model.steps_taken
        wall, cpu = time.perf_counter(), time.process_time()
        grads = self.step()
        grads = [g.numpy() for g in grads] if fetch else grads
        return grads, time.perf_counter() - wall, time.process_time() - cpu, number

    def test_a_traced_step_makes_the_expected_gradients_layer_by_layer_on_time(self):
        self.model.set_step_seconds(0.25)
        self.run_step()  # traces
        log = self.model.accelerator.wait_log
        walls = []
        for _ in range(2):  # the faster of two: this machine's other jobs share its cores
            log.clear()
            grads, wall, _, number = self.run_step()
            walls.append(wall)
            for got, want, variable in zip(grads, va.expected_gradients(RANK, number),
                                           self.model.trainable_variables):
                self.assertAllEqual(got, want, msg=name_of(variable))
            self.assertEqual(self.model.steps_taken, number + 1)
            names = [layer.name for layer in va.layer_profile()]
            self.assertEqual([(r.phase, r.layer) for r in log],
                             [("forward", n) for n in names] + [("backward", n)
                                                                for n in reversed(names)])
            self.assertAllClose(log[-1].due - log[0].started, 0.25, atol=1e-9)  # the schedule
            ends = [r.ended for r in log]
            self.assertEqual(ends, sorted(ends))
            self.assertBetween(log[-1].ended - log[0].started, 0.25, 0.25 + 0.1)
        self.assertBetween(min(walls), 0.25, 0.25 + 0.15)
        # a new step time takes effect without a retrace
        self.model.set_step_seconds(0.1)
        walls = []
        for _ in range(2):
            grads, wall, _, number = self.run_step()
            walls.append(wall)
            self.assertAllEqual(grads[-1], va.expected_gradients(RANK, number)[-1])
        self.assertBetween(min(walls), 0.1, 0.1 + 0.15)
        self.assertEqual(self.step.experimental_get_tracing_count(), 1)

    def test_the_waits_leave_the_cpu_idle(self):
        """Doubling the step's time adds waiting, not CPU time. The CPU a step needs (the fills:
        94 MB of gradients, and 214 Python calls; every thread of the process counts) depends
        on the machine (30 ms on a fast one, 125 ms on a slow one), so the check compares two
        step times on the same machine: waits that spun would add at least the extra wall time
        in CPU time; idle ones add none."""
        self.run_step(fetch=False)  # traced (or warm)
        measured = {}
        for seconds in (0.4, 0.8):
            self.model.set_step_seconds(seconds)
            walls, cpus = [], []
            for _ in range(3):
                _, wall, cpu, _ = self.run_step(fetch=False)
                walls.append(wall)
                cpus.append(cpu)
            measured[seconds] = (sum(walls), sum(cpus), cpus)
        extra_wall = measured[0.8][0] - measured[0.4][0]
        extra_cpu = measured[0.8][1] - measured[0.4][1]
        self.assertGreater(extra_wall, 1.0)  # three steps, 0.4 s longer each
        self.assertLess(extra_cpu, 0.25 * extra_wall,
                        f"CPU per step {measured[0.4][2]} s at 0.4 s, {measured[0.8][2]} s at 0.8 s")

    def test_model_fit_applies_the_gradients(self):
        self.model.set_step_seconds(0.02)
        first = self.model.steps_taken
        start = [v.numpy() for v in self.model.trainable_variables]
        optimizer = va.keras.optimizers.SGD(learning_rate=1.0)
        optimizer.build(self.model.trainable_variables)  # else Keras 2's fit traces twice
        self.model.compile(optimizer=optimizer, loss="mse")
        self.model.fit(np.ones((8, 1), np.float32), np.zeros((8, 1), np.float32), batch_size=4,
                       epochs=1, shuffle=False, verbose=0)
        self.assertEqual(self.model.steps_taken, first + 2)
        # SGD at learning rate 1: the weights move by minus the sum of the two steps' gradients
        for variable, w0, g0, g1 in zip(self.model.trainable_variables, start,
                                        va.expected_gradients(RANK, first),
                                        va.expected_gradients(RANK, first + 1)):
            self.assertAllEqual(variable.numpy(), w0 - g0 - g1)


@unittest.skipIf(harness.HOROVOD, "one launch, on the current stack's tf engine")
class OnTwoWorkersTest(tf.test.TestCase):

    def test_fit_averages_both_ranks_gradients_exactly(self):
        result = harness.run_world([harness.worker("virtual_accelerator_check.py")], np=2,
                                   timeout=240)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        counts = re.findall(r"virtual_accelerator_check: (\d+) checks, 0 failed", result.output)
        # per rank: 3 steps x (214 variables + the ranks' gradients differ) + the step counter
        self.assertEqual(counts, ["646", "646"], harness.describe(result))


if __name__ == "__main__":
    tf.test.main()
