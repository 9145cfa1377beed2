"""tftorus on Ray (tftorus.ray, docs/guide/ray.md): Horovod's RayExecutor API against NumPy on 2
and 4 workers, its one-line refusals, and elastic training on a local Ray cluster of a head and
two worker nodes: a node lost mid-epoch, a node added, the final weights against a float64
replay. Ray is the current stack's (run_scripts/setup.sh installs tftorus[ray] there)."""
import importlib.util
import json
import re
import sys
import unittest
from unittest import mock

import tensorflow as tf

from official_resnet.data.embedded_data import EmbeddedSpec
from tests import harness

RAY = importlib.util.find_spec("ray") is not None
# a tenth of the main job's embedded data (tests/harness.EmbeddedDataCase makes it)
SMALL_DATA = EmbeddedSpec(num_train=1024, num_validation=128, train_shards=4, validation_shards=2)
NO_RAY = "Ray is installed on the current stack (tftorus[ray]); this stack has none"


class RefusalsTest(tf.test.TestCase):
    """What is refused before any worker starts, in one line (no Ray cluster needed)."""

    def test_without_ray_the_extra_is_named(self):
        from tftorus.ray import RayExecutor
        with mock.patch.dict(sys.modules, {"ray": None}):
            with self.assertRaisesRegex(ImportError, r"pip install 'tftorus\[ray\]'") as caught:
                RayExecutor(RayExecutor.create_settings(), num_workers=2)
        self.assertNotIn("\n", str(caught.exception))

    def test_bad_sizes(self):
        from tftorus.ray import RayExecutor
        settings = RayExecutor.create_settings()
        for kwargs, words in (
                ({"min_workers": 3, "max_workers": 2}, "min_workers=3 is more than max_workers=2"),
                ({"max_workers": 2}, "max_workers needs a positive min_workers"),
                ({"min_workers": 0}, "min_workers must be >= 1"),
                ({"num_workers": 2, "min_workers": 2}, "not both"),
                ({}, "give num_workers"),
                ({"num_workers": 2, "gpus_per_worker": 1}, "set use_gpu=True"),
                ({"num_workers": 2, "cpus_per_worker": 0}, "cpus_per_worker must be > 0")):
            with self.subTest(**kwargs):
                with self.assertRaisesRegex(ValueError, re.escape(words)):
                    RayExecutor(settings, **kwargs)

    @unittest.skipUnless(RAY, NO_RAY)
    def test_a_gpu_per_worker_from_ray(self):
        """use_gpu asks Ray for the worker's GPUs, so Ray sets each one's CUDA_VISIBLE_DEVICES
        (tftorus then uses the one it sees: cluster/gpu_per_process.py)."""
        from tftorus.on_ray.worker_group import Resources
        from tftorus.ray import RayExecutor
        settings = RayExecutor.create_settings()
        self.assertEqual(RayExecutor(settings, num_workers=2, use_gpu=True).resources,
                         Resources(1, 1))
        self.assertEqual(RayExecutor(settings, num_workers=2, use_gpu=True, gpus_per_worker=2,
                                     cpus_per_worker=4).resources.bundle(), {"CPU": 4, "GPU": 2})
        self.assertEqual(Resources(2, 1).slots({"CPU": 16, "GPU": 4}), 4)
        self.assertEqual(Resources(2, 0).slots({"CPU": 16}), 8)


@unittest.skipUnless(RAY, NO_RAY)
class ExecutorTest(tf.test.TestCase):

    def test_run_execute_run_remote_execute_single_against_numpy(self):
        """On 2 and 4 workers (tests/workers/ray_executor_check.py), and its refusals."""
        result = harness.run([harness.worker("ray_executor_check.py")], timeout=400)
        self.assertIn("14 checks, 0 failed", result.output, harness.describe(result))
        self.assertEqual(result.returncode, 0, harness.describe(result))


@unittest.skipUnless(RAY, NO_RAY)
class ElasticTest(tf.test.TestCase):

    def check_elastic_fit(self, *flags):
        """tests/workers/ray_elastic_fit.py with `flags`, on a Ray cluster of its own."""
        result = harness.run([harness.worker("ray_elastic_fit.py"), *flags], timeout=600)
        found = re.search(r"^RESULT (.*)$", result.output, re.M)
        self.assertTrue(found, harness.describe(result))
        got = json.loads(found.group(1))
        self.assertEqual(got["world_sizes"], [4, 2, 4], result.output[-3000:])
        self.assertEqual(got["sizes_seen"], [2, 4])
        self.assertEqual(got["steps"], 20)  # every committed step once: none lost, none twice
        self.assertTrue(got["positions"])
        self.assertEqual(got["resets"], [4])  # the last world ran its reset callbacks
        self.assertEqual(got["ranks"], [0, 1, 2, 3])
        self.assertTrue(got["same_on_every_rank"])
        self.assertLess(got["max_abs_diff"], 1e-5 * max(1.0, got["scale"]))
        resumed = re.search(r"RESUMED AFTER ([\d.]+) s", result.output)
        self.assertTrue(resumed, result.output[-3000:])
        self.assertLess(float(resumed.group(1)), 60.0)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        return result

    def test_keras_fit_loses_a_node_then_grows(self):
        """RayExecutor(min_workers=2, max_workers=4) on two nodes of 2 CPUs
        (tests/workers/ray_elastic_fit.py): 4 workers, a node killed mid-epoch -> 2 go on from
        the last commit within 60 s, a node added -> 4 again at a commit; the weights are a
        float64 replay of the committed steps on the sizes they had, equal on every rank; what
        rank 0 logged of each step (tftorus.ray.ray_logger) reached run()'s callback."""
        result = self.check_elastic_fit()
        self.assertRegex(result.output, r"world 2 resumed from the last commit [\d.]+ s after "
                                        r"the loss")
        got = json.loads(re.search(r"^RESULT (.*)$", result.output, re.M).group(1))
        self.assertTrue(got["logged_every_step"])  # ray_logger.log -> run(callbacks=)
        self.assertIn("the world grows at the next commit", result.output)

    def test_ray_train_keras_fit_loses_a_node_then_grows(self):
        """The same under Ray Train's TensorflowTrainer, ScalingConfig(num_workers=(2, 4)):
        hvd.elastic's commits are its checkpoints."""
        self.check_elastic_fit("--ray-train")


def run_recipe_losing_a_node(case, *args, timeout):
    """tests/workers/ray_recipe.py with `args`: the run's summary, once the checks every size of
    it shares have passed (a world of 2 from the epoch-1 checkpoint, to the end)."""
    result = harness.run([harness.worker("ray_recipe.py"), *args], timeout=timeout)
    found = re.search(r"^RESULT (.*)$", result.output, re.M)
    case.assertTrue(found, harness.describe(result))
    summary = json.loads(found.group(1))
    case.assertIn("world 2: 2 workers", result.output)
    case.assertRegex(result.output, r"restored \S*epoch-0001\.000")
    case.assertEqual((summary["workers"], summary["epochs"]), (2, 3.0))
    case.assertEqual(result.returncode, 0, harness.describe(result))
    return summary


@unittest.skipUnless(RAY, NO_RAY)
class RecipeOnRayTest(tf.test.TestCase):

    def test_a_lost_node_mid_run(self):
        """run_scripts/train_on_ray.py on the embedded data, 2-4 workers, a worker node killed
        in epoch 2 (tests/workers/ray_recipe.py): 2 workers go on from the epoch-1 checkpoint,
        training as 4 (--logical_workers), and end inside the main job's top-1 band."""
        summary = run_recipe_losing_a_node(self, timeout=1500)
        self.assertBetween(summary["top1_1crop"], 48.70, 49.40)


@unittest.skipUnless(RAY, NO_RAY)
class RecipeOnRaySmallDataTest(harness.EmbeddedDataCase, tf.test.TestCase):
    """The same run on a tenth of the embedded data (its epochs take seconds), the node killed
    as the first checkpoint appears: the lighter sibling CI keeps (tests/conftest.py's WIDER)."""
    SPEC = SMALL_DATA

    def test_a_lost_node_then_the_run_ends_from_its_checkpoint(self):
        run_recipe_losing_a_node(self, "--kill_after=0", f"--data_dir={self.data}",
                                 "--bn_stat_batches=1", timeout=900)


if __name__ == "__main__":
    tf.test.main()
