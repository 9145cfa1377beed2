"""tftorus' DistributedGradientTape equals Horovod's own, argument for argument, at N = 4.

Average, Sum, gradient_predivide_factor, sparse_as_dense, groups (int and lists), FP16
compression; IndexedSlices stay IndexedSlices; None gradients stay None; mixed dtypes fuse.
"""
import tensorflow as tf

from tests import harness


class HorovodSemanticsTest(tf.test.TestCase):

    def test_same_gradients_as_horovod(self):
        # in the four-rank world other tests share (tests/harness.FOUR_RANK_SUITE)
        failure = harness.suite_report(harness.four_rank_suite()[1], "gradient_semantics", 4,
                                       harness.FOUR_RANK_SUITE)
        self.assertFalse(failure, failure)


if __name__ == "__main__":
    tf.test.main()
