"""Fusion and compression on one process: packing is lossless and buckets follow the rules."""
import numpy as np
import tensorflow as tf

from tftorus.torus import fusion
from tftorus.torus.compression import Compression


class FusionTest(tf.test.TestCase):

    def tensors(self):
        return [tf.reshape(tf.range(12, dtype=tf.float32), [3, 4]), tf.constant(5.0),
                tf.zeros([0, 3]), tf.range(7, dtype=tf.int32), tf.ones([2, 2, 2], tf.float16)]

    def test_pack_unpack_round_trip_with_padding(self):
        ts = self.tensors()
        for bucket in fusion.plan_buckets(ts):
            for align in (1, 3, 8):
                flat = fusion.pack(ts, bucket, align)
                self.assertEqual(flat.shape[0] % align, 0)
                self.assertEqual(flat.shape[0], bucket.padded_length(align))
                for i, piece in zip(bucket.indices, fusion.unpack(flat, bucket)):
                    self.assertAllEqual(piece, ts[i])
                    self.assertEqual(piece.dtype, ts[i].dtype)

    def test_buckets_hold_one_dtype_and_respect_the_threshold(self):
        ts = self.tensors()
        buckets = fusion.plan_buckets(ts)
        self.assertEqual([b.dtype for b in buckets], [tf.float16, tf.int32, tf.float32])
        self.assertEqual(buckets[-1].indices, (0, 1, 2))
        small = fusion.plan_buckets(ts, threshold_bytes=16)
        for b in small:
            self.assertTrue(b.nbytes <= 16 or len(b.indices) == 1, b)
        self.assertCountEqual([i for b in small for i in b.indices], range(len(ts)))
        unfused = fusion.plan_buckets(ts, threshold_bytes=0)
        self.assertEqual(len(unfused), len(ts))

    def test_buckets_fill_in_ready_order(self):
        # A backward pass makes the last variables' gradients first: the first bucket holds the
        # list's tail, so its collectives can start before the head's gradients exist.
        layers = [tf.zeros([n]) for n in (4, 4, 4, 4, 4, 4)]  # 16 bytes each
        buckets = fusion.plan_buckets(layers, threshold_bytes=40)
        self.assertEqual([b.indices for b in buckets], [(4, 5), (2, 3), (0, 1)])
        # The default threshold splits ResNet-50's 98 MiB of FP32 gradients into several buckets.
        self.assertLess(fusion.DEFAULT_THRESHOLD_BYTES, 25 * 2 ** 20)
        # Only shapes and dtypes decide the plan: other values, the same plan on every rank.
        again = fusion.plan_buckets([tf.ones([n]) * 7 for n in (4, 4, 4, 4, 4, 4)], 40)
        self.assertEqual(buckets, again)

    def test_unknown_shapes_and_negative_threshold_are_errors(self):
        with self.assertRaisesRegex(ValueError, "fusion threshold"):
            fusion.plan_buckets(self.tensors(), threshold_bytes=-1)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def traced(t):
            return fusion.plan_buckets([t])

        with self.assertRaisesRegex(ValueError, "shapes known when the step is traced"):
            traced.get_concrete_function()

    def test_compression_casts_floats_only(self):
        x32, x64, i32 = tf.constant([1.5, -2.25]), tf.constant([3.0], tf.float64), tf.constant([3])
        for comp, wire in ((Compression.fp16, tf.float16), (Compression.bf16, tf.bfloat16)):
            for x in (x32, x64):
                w, ctx = comp.compress(x)
                self.assertEqual(w.dtype, wire)
                back = comp.decompress(w, ctx)
                self.assertEqual(back.dtype, x.dtype)
                self.assertAllClose(back, x)
            w, ctx = comp.compress(i32)
            self.assertEqual(w.dtype, tf.int32)
        w, ctx = Compression.none.compress(x32)
        self.assertIs(w, x32)
        h = tf.constant([1.0], tf.float16)
        self.assertEqual(Compression.bf16.compress(h)[0].dtype, tf.float16)  # never widens
        self.assertTrue(np.isfinite(Compression.fp16.decompress(*Compression.fp16.compress(x32))).all())


if __name__ == "__main__":
    tf.test.main()
