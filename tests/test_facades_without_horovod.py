"""`import tftorus as hvd` and `import tftorus.keras as hvd` where Horovod is not installed (the
current stack): every exported name resolves, Horovod's names that need its runtime raise one
line naming the classic stack, an unsupported TensorFlow or Keras is refused in one line, and
Horovod's API answers correctly on 2 workers (tests/workers/facade_check.py)."""
import re
import unittest

import tensorflow as tf

from tests import harness
from tftorus.runtime import stack

WITHOUT_HOROVOD = not stack.HOROVOD
# What a Horovod user's script calls, by the facade (the API the current stack must give).
EXPECTED = {
    "tftorus": ["init", "shutdown", "rank", "size", "local_rank", "local_size", "cross_rank",
                "cross_size", "is_initialized", "allreduce", "allgather", "broadcast",
                "broadcast_variables", "broadcast_object", "DistributedOptimizer",
                "DistributedGradientTape", "Compression", "Average", "Sum"],
    "tftorus.keras": ["init", "shutdown", "rank", "size", "local_rank", "local_size",
                      "cross_rank", "cross_size", "is_initialized", "allreduce", "allgather",
                      "broadcast", "broadcast_variables", "broadcast_object",
                      "DistributedOptimizer", "Compression", "BatchSizeControl", "load_model",
                      "callbacks"],
}
CALLBACKS = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
             "LearningRateWarmupCallback"]


@unittest.skipUnless(WITHOUT_HOROVOD, "the current stack (no Horovod); the classic facades are "
                                      "Horovod's (tests/test_api.py)")
class FacadesTest(tf.test.TestCase):

    def test_every_export_resolves_and_the_api_is_there(self):
        import tftorus
        import tftorus.keras
        for module in (tftorus, tftorus.keras):
            for name in module.__all__:
                self.assertIsNotNone(getattr(module, name), f"{module.__name__}.{name}")
            missing = set(EXPECTED[module.__name__]) - set(module.__all__)
            self.assertFalse(missing, f"{module.__name__} lacks {sorted(missing)}")
        for name in CALLBACKS:
            self.assertTrue(callable(getattr(tftorus.keras.callbacks, name)), name)

    def test_horovod_only_names_name_the_classic_stack(self):
        import tftorus
        import tftorus.keras
        from tftorus.horovod_api.current_stack import HOROVOD_ONLY
        for module in (tftorus, tftorus.keras):
            for name in HOROVOD_ONLY:
                if name in module.__all__:
                    continue
                with self.assertRaisesRegex(stack.HorovodRequired,
                                            rf"^{re.escape(module.__name__)}\.{name} needs "
                                            r"Horovod's runtime, which only the classic stack "
                                            r"\(Python 3.11, TensorFlow 2.15.1"):
                    getattr(module, name)
            with self.assertRaises(AttributeError):
                getattr(module, "no_such_name")
        with self.assertRaisesRegex(stack.HorovodRequired, r"engine='horovod' needs Horovod"):
            tftorus.init(engine="horovod")

    def test_an_unsupported_tensorflow_or_keras_is_refused_in_one_line(self):
        saved = stack.KERAS_3, stack.tf
        try:
            stack.KERAS_3 = False  # tf.keras is Keras 2 on a TensorFlow >= 2.16
            with self.assertRaisesRegex(ImportError, r"works with Keras 3, but tf.keras is"):
                stack.check_supported()
            stack.KERAS_3, stack.tf = True, type("TF", (), {"__version__": "2.13.1"})
            with self.assertRaisesRegex(ImportError, r"needs TensorFlow 2.15 .* this is 2.13.1"):
                stack.check_supported()
        finally:
            stack.KERAS_3, stack.tf = saved


@unittest.skipUnless(WITHOUT_HOROVOD, "the current stack (no Horovod)")
class FacadesOnTwoWorkersTest(tf.test.TestCase):

    def test_horovods_api_on_the_tf_engine(self):
        result = harness.run_tf_config([harness.worker("facade_check.py")], np=2, timeout=180)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        counts = re.findall(r"facade_check: (\d+) checks, 0 failed", result.output)
        self.assertEqual(len(counts), 2, harness.describe(result))
        self.assertGreaterEqual(min(int(c) for c in counts), 12)

    def test_elastic_states_and_a_lost_worker(self):
        """hvd.elastic over a world of fixed size (tests/workers/elastic_fixed_world.py): the
        states' sync, commit and restore, KerasState in fit with Horovod's callbacks, and a
        lost worker inside run(): CollectiveError with the last commit kept."""
        result = harness.run_tf_config([harness.worker("elastic_fixed_world.py")], np=2,
                                       timeout=240, env={"TFTORUS_TF_TIMEOUT": "10"},
                                       after_a_failure=60)
        self.assertEqual(result.returncodes[0], 0, harness.describe(result))
        self.assertIn("[rank 0] LOST WORKER SEEN", result.output, harness.describe(result))
        count = re.findall(r"\[rank 0\] (\d+) checks, 0 failed", result.output)
        self.assertEqual(len(count), 1, harness.describe(result))
        self.assertEqual(int(count[0]), 16, harness.describe(result))


if __name__ == "__main__":
    tf.test.main()
