"""Real `horovodrun --gloo` jobs: torus, ring and hierarchical equal Horovod's all-reduce.

For each world size every grid Y x X with Y * X = N is tried (at N = 6: 6x1, 3x2, 2x3, 1x6;
at N = 8: 8x1, 4x2, 2x4, 1x8), over six dtypes, odd and multi-dim shapes, scalars, empty
tensors, sizes smaller than the row, FP16/BF16 wire compression and several fusion thresholds.
"""
import tensorflow as tf

from tests import harness


class AllreduceMultiprocessTest(tf.test.TestCase):

    def check_world(self, np_):
        result = harness.run([harness.worker("allreduce_check.py")], np=np_, timeout=420)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.assertIn("0 failed", result.output)
        self.assertNotIn("MISMATCH", result.output)

    def test_one_plain_process(self):
        self.check_world(0)

    def test_one_rank_under_horovodrun(self):
        self.check_world(1)

    def test_two_ranks(self):
        self.check_world(2)

    def test_four_ranks(self):
        self.check_world(4)

    def test_six_ranks(self):
        self.check_world(6)

    def test_eight_ranks(self):
        self.check_world(8)


if __name__ == "__main__":
    tf.test.main()
