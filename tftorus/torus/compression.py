"""Wire compression: cast gradients to 16 bits for the all-reduce, back after it.

Same interface as horovod.tensorflow.Compression (`compress(t) -> (t, ctx)`,
`decompress(t, ctx)`), so Horovod's compressors can be passed too. Only floating tensors wider
than the wire type are cast; everything else passes through. The paper sends FP16 gradients;
on GPUs and slow links that halves the bytes, on a loopback CPU run the FP16 arithmetic costs
more than it saves (see docs/studies/benchmarks.md), so the default is no compression.
"""
import tensorflow as tf


class _Cast:
    wire_dtype = None

    @classmethod
    def compress(cls, tensor):
        ctx = tensor.dtype
        if cls.wire_dtype is not None and tensor.dtype.is_floating \
                and tensor.dtype.size > cls.wire_dtype.size:
            return tf.cast(tensor, cls.wire_dtype), ctx
        return tensor, ctx

    @classmethod
    def decompress(cls, tensor, ctx):
        return tf.cast(tensor, ctx) if ctx is not None and tensor.dtype != ctx else tensor


class NoneCompressor(_Cast):
    """Send tensors as they are."""


class FP16Compressor(_Cast):
    """Send floating tensors as IEEE half precision."""
    wire_dtype = tf.float16


class BF16Compressor(_Cast):
    """Send floating tensors as bfloat16 (FP32's range, 8 bits of mantissa)."""
    wire_dtype = tf.bfloat16


class Compression:
    """Pick one: Compression.none, Compression.fp16, Compression.bf16."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
