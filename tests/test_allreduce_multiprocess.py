"""Real `horovodrun --gloo` jobs: torus, ring and hierarchical equal Horovod's all-reduce.

At N = 4 and 6 every grid Y x X with Y * X = N is tried (at N = 6: 6x1, 3x2, 2x3, 1x6), over
six dtypes, odd and multi-dim shapes, scalars, empty tensors, sizes smaller than the row,
FP16/BF16 wire compression and several fusion thresholds; the chunk pipeline against no chunks,
bit for bit; the dtypes 16-bit compression hands to the collectives. N = 12 (6 x 2, 4 x 3,
3 x 4, 2 x 6: rows and columns of 2, 3, 4 and 6 ranks, as a 3 x 3 world has rows of 3) checks
the grids with both a row and a column phase, each tensor alone and fused, on three dtypes
(--light). No N = 8: its two such grids (4 x 2, 2 x 4) have rows and columns of 2 and 4 ranks,
which N = 12's grids have too.
"""
import tensorflow as tf

from tests import harness


class AllreduceMultiprocessTest(tf.test.TestCase):

    def check_world(self, np_, *extra):
        result = harness.run([harness.worker("allreduce_check.py"), *extra], np=np_,
                             timeout=600)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.assertIn("0 failed", result.output)
        self.assertNotIn("MISMATCH", result.output)

    def test_one_plain_process(self):
        self.check_world(0)

    def test_one_rank_under_horovodrun(self):
        self.check_world(1)

    def test_two_ranks(self):
        # in the two-rank world other tests share (tests/harness.two_rank_suite)
        failure = harness.suite_report(harness.two_rank_suite()[1], "allreduce_check", 2,
                                       harness.TWO_RANK_SUITE)
        self.assertFalse(failure, failure)

    def test_four_ranks(self):
        # in the four-rank world other tests share (tests/harness.FOUR_RANK_SUITE)
        failure = harness.suite_report(harness.four_rank_suite()[1], "allreduce_check", 4,
                                       harness.FOUR_RANK_SUITE)
        self.assertFalse(failure, failure)

    def test_six_ranks(self):
        self.check_world(6)

    def test_twelve_ranks(self):
        self.check_world(12, "--light")


if __name__ == "__main__":
    tf.test.main()
