"""Real `horovodrun --gloo` jobs: torus, ring and hierarchical equal Horovod's all-reduce.

At N = 4 and 6 every grid Y x X with Y * X = N is tried (at N = 6: 6x1, 3x2, 2x3, 1x6), over
six dtypes, odd and multi-dim shapes, scalars, empty tensors, sizes smaller than the row,
FP16/BF16 wire compression and several fusion thresholds; the chunk pipeline against no chunks,
bit for bit; the dtypes 16-bit compression hands to the collectives. N = 8 (4 x 2, 2 x 4: rows
and columns of 4 ranks in a grid with both a row and a column phase, which N = 4 and 6 lack)
checks those two grids, each tensor alone and fused, on three dtypes (--light). Rows of 6 in
such a grid (N = 12) are the tf engine's twelve-rank job (tests/test_tf_engine.py): the torus
schedule is the same code on both engines, and a twelve-rank Horovod world took 118 s of CI.
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

    def test_eight_ranks(self):
        self.check_world(8, "--light")


if __name__ == "__main__":
    tf.test.main()
