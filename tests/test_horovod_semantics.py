"""tftorus' DistributedGradientTape equals Horovod's own, argument for argument, at N = 4.

Average, Sum, gradient_predivide_factor, sparse_as_dense, groups (int and lists), FP16
compression; IndexedSlices stay IndexedSlices; None gradients stay None; mixed dtypes fuse.
"""
import tensorflow as tf

from tests import harness


class HorovodSemanticsTest(tf.test.TestCase):

    def test_same_gradients_as_horovod(self):
        result = harness.run([harness.worker("gradient_semantics.py")], np=4, timeout=300)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.assertIn("0 failed", result.output)


if __name__ == "__main__":
    tf.test.main()
