"""tftorus.SyncBatchNormalization on the current stack (Keras 3, the tf engine): the whole
batch's statistics over ranks with unequal batches, outputs, gradients and moving statistics
against float64 NumPy, eager and traced, masked, a rank without samples, and a model.fit
(tests/workers/sync_batch_norm_check.py) on 2 and on 3 ranks. On the classic stack the layer is
Horovod's own (Keras 2), which tftorus re-exports unchanged."""
import re
import unittest

from tests import harness
from tftorus.runtime import stack


@unittest.skipIf(stack.HOROVOD, "the classic stack re-exports Horovod's own layer")
class SyncBatchNormTest(unittest.TestCase):

    def _run(self, np_):
        result = harness.run_tf_config([harness.worker("sync_batch_norm_check.py")], np=np_,
                                       timeout=300)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        counts = re.findall(r"sync_batch_norm_check: (\d+) checks, 0 failed", result.output)
        self.assertEqual(len(counts), np_, harness.describe(result))
        self.assertGreaterEqual(min(int(c) for c in counts), 35, harness.describe(result))

    def test_two_ranks_match_the_whole_batch(self):
        self._run(2)

    def test_three_ranks_match_the_whole_batch(self):
        self._run(3)

    def test_both_facades_export_it(self):
        import tftorus
        import tftorus.keras
        from tftorus.horovod_api.keras3_sync_batch_norm import SyncBatchNormalization
        self.assertIs(tftorus.SyncBatchNormalization, SyncBatchNormalization)
        self.assertIs(tftorus.keras.SyncBatchNormalization, SyncBatchNormalization)
        self.assertIn("SyncBatchNormalization", tftorus.__all__)
        self.assertIn("SyncBatchNormalization", tftorus.keras.__all__)


if __name__ == "__main__":
    unittest.main()
