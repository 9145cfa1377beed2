"""The tf engine's collectives from wherever a Horovod user builds them, mixed in one process:
eager code, several tf.functions, and TF1 graphs run by a tf.compat.v1.Session (the first
collective built in such a graph used to leave its ordering token there, and every later eager
call failed "... is out of scope"); and horovodrun's HOROVOD_* variables set by init() on a
TF_CONFIG cluster. One launch of 2 ranks (tests/workers/execution_modes.py)."""
import re
import unittest

import tensorflow as tf

from tests import harness
from tftorus.runtime import stack


@unittest.skipIf(stack.HOROVOD, "the current stack: `import tftorus as hvd` is the tf engine "
                                "there (on the classic stack it is Horovod's own API)")
class ExecutionModesTest(tf.test.TestCase):

    def test_eager_functions_and_tf1_sessions_mixed_on_two_ranks(self):
        result = harness.run_tf_config([harness.worker("execution_modes.py")], np=2,
                                       timeout=240, env={"HOROVOD_HOSTNAME": "kept-by-init"})
        self.assertEqual(result.returncode, 0, harness.describe(result))
        counts = re.findall(r"execution modes: (\d+) checks, 0 failed", result.output)
        self.assertEqual(len(counts), 2, harness.describe(result))
        self.assertGreaterEqual(min(int(c) for c in counts), 60, harness.describe(result))


if __name__ == "__main__":
    tf.test.main()
