"""Horovod 0.28.1's collectives on the current stack (`import tftorus as hvd` without Horovod):
tftorus/horovod_api/mpi_ops.py, process_sets.py and functions.py.

One launch per world size (2, 3 and 4 ranks) runs tests/workers/horovod_collectives_check.py:
every collective against NumPy eagerly, in a tf.function and in a TF1 graph run by a session,
with process sets, gradients, errors and the object collectives. Without a launch: what has no
meaning on the tf engine says, in one line, what to use.
"""
import re
import unittest

import tensorflow as tf

from tests import harness
from tftorus.runtime import stack

WITHOUT_HOROVOD = not stack.HOROVOD
SKIP = "the current stack (no Horovod); on the classic one these names are Horovod's own"


@unittest.skipUnless(WITHOUT_HOROVOD, SKIP)
class RefusalsTest(tf.test.TestCase):

    def test_join_and_adasum_say_what_to_use(self):
        import tftorus as hvd
        with self.assertRaisesRegex(stack.HorovodRequired,
                                    r"tftorus\.join needs Horovod's runtime.*op=hvd\.Min"):
            hvd.join  # noqa: B018
        with self.assertRaisesRegex(stack.HorovodRequired, r"op=hvd\.Adasum.*op=hvd\.Average"):
            hvd.allreduce(tf.ones([2]), op=hvd.Adasum)
        with self.assertRaisesRegex(NotImplementedError, "Only Sum and Average"):
            hvd.allreduce(tf.IndexedSlices(tf.ones([1, 3]), tf.constant([0])), op=hvd.Max)
        with self.assertRaisesRegex(ValueError, "supersedes average"):
            hvd.allreduce(tf.ones([2]), average=True, op=hvd.Sum)

    def test_process_sets_refuse_what_is_not_a_list_of_ranks(self):
        import tftorus as hvd
        with self.assertRaisesRegex(ValueError, "list of process ranks"):
            hvd.ProcessSet([0, 1.5])
        with self.assertRaisesRegex(ValueError, "list of ranks"):
            hvd.ProcessSet(3)
        fresh = hvd.ProcessSet([2, 0])
        self.assertEqual((fresh.ranks, fresh.size(), fresh.rank()), ([0, 2], None, None))
        self.assertEqual(hvd.global_process_set.process_set_id, 0)
        self.assertTrue(hvd.global_process_set.included())


@unittest.skipUnless(WITHOUT_HOROVOD, SKIP)
class CollectivesOnWorldsTest(tf.test.TestCase):

    def _world(self, np: int):
        result = harness.run_tf_config([harness.worker("horovod_collectives_check.py")], np,
                                       timeout=600)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        counts = re.findall(r"horovod_collectives_check: (\d+) checks, 0 failed", result.output)
        self.assertEqual(len(counts), np, harness.describe(result))
        self.assertGreaterEqual(min(int(c) for c in counts), 280, harness.describe(result))

    def test_two_ranks(self):
        self._world(2)

    def test_three_ranks(self):
        self._world(3)

    def test_four_ranks(self):
        self._world(4)


if __name__ == "__main__":
    tf.test.main()
