"""Tensor fusion: many gradients -> a few flat buffers (buckets) -> back.

One collective per buffer instead of one per tensor amortises the per-operation latency that
dominates small gradients (ResNet-50 has 161 of them, most under 1 MiB). Buffers hold one dtype,
stop at a byte threshold, and are padded with zeros to a multiple of the row length so the torus
reduce-scatter splits them evenly.

Buckets are filled in the order gradients become ready: a backward pass produces the last
layer's gradients first, so the plan walks the caller's list (the variables' forward order)
backwards. Inside a TF graph an op runs as soon as its inputs exist, so a bucket's collectives,
which depend only on that bucket's gradients, go out while the earlier layers are still being
differentiated; one buffer of every gradient could leave only after the whole backward pass.
The threshold (16 MiB by default) trades that overlap against the fixed cost of each bucket's
collectives (a few ms each); ResNet-50's 98 MiB of FP32 gradients make 7 buckets. The plan
depends only on the tensors' shapes and dtypes, so it is the same on every rank. A bucket whose
sum the engine fuses by itself (Horovod's all-reduce) is not packed: its tensors go one by one
(algorithms.packs).
"""
import dataclasses
from typing import List, Sequence, Tuple

import numpy as np
import tensorflow as tf

DEFAULT_THRESHOLD_BYTES = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Which input tensors one flat buffer carries, and how to cut it apart again."""

    indices: Tuple[int, ...]
    shapes: Tuple[Tuple[int, ...], ...]
    dtype: tf.DType

    @property
    def sizes(self) -> Tuple[int, ...]:
        return tuple(int(np.prod(s, dtype=np.int64)) for s in self.shapes)

    @property
    def length(self) -> int:
        return sum(self.sizes)

    def padded_length(self, align: int) -> int:
        return -(-self.length // align) * align

    @property
    def nbytes(self) -> int:
        return self.length * self.dtype.size


def static_shape(tensor: tf.Tensor, what: str = "tensor") -> Tuple[int, ...]:
    if not tensor.shape.is_fully_defined():
        raise ValueError(
            f"{what} {getattr(tensor, 'name', '')} has shape {tensor.shape}: tensor fusion needs "
            f"shapes known when the step is traced (gradients of variables always have them)")
    return tuple(tensor.shape.as_list())


def plan_buckets(tensors: Sequence[tf.Tensor],
                 threshold_bytes: int = DEFAULT_THRESHOLD_BYTES) -> List[Bucket]:
    """Group tensors into buckets of one dtype and at most `threshold_bytes` (0: no fusion; a
    larger tensor gets a bucket of its own), in ready order (bucket_indices says how)."""
    return buckets_of(tensors, bucket_indices(tensor_sizes(tensors), threshold_bytes))


def tensor_sizes(tensors: Sequence[tf.Tensor]) -> List[Tuple[int, tf.DType]]:
    """(bytes, dtype) of each tensor, from its static shape: what bucketing goes by."""
    return [(int(np.prod(static_shape(t, f"tensor #{i}"), dtype=np.int64)) * t.dtype.size,
             t.dtype) for i, t in enumerate(tensors)]


def buckets_of(tensors: Sequence[tf.Tensor],
               index_groups: Sequence[Sequence[int]]) -> List[Bucket]:
    """The Buckets that carry these groups of tensor indices (a plan's, or bucket_indices')."""
    return [Bucket(tuple(ix), tuple(static_shape(tensors[i]) for i in ix), tensors[ix[0]].dtype)
            for ix in index_groups]


def bucket_indices(sizes: Sequence[Tuple[int, object]],
                   threshold_bytes: int = DEFAULT_THRESHOLD_BYTES) -> List[Tuple[int, ...]]:
    """The buckets of tensors given as (bytes, dtype) in the caller's order, as index tuples:
    the list is walked from its end, a bucket of one dtype closes when the next tensor would
    overflow it, and buckets come out in the order they close (the rest at the end, in the
    order their dtypes first appeared). Inside a bucket the tensors keep the caller's order.
    Sizes alone decide it, so the planner (tftorus/planning/planner.py) cuts exactly what runs."""
    if threshold_bytes < 0:
        raise ValueError(f"fusion threshold must be >= 0 bytes, got {threshold_bytes}")
    open_buckets = {}  # dtype -> (indices, bytes) being filled, newest tensor first
    done = []
    for i in reversed(range(len(sizes))):
        nbytes, dtype = sizes[i]
        if dtype in open_buckets and open_buckets[dtype][1] + nbytes > threshold_bytes:
            done.append(open_buckets.pop(dtype)[0])
        indices, used = open_buckets.get(dtype, ((), 0))
        open_buckets[dtype] = ((i,) + indices, used + nbytes)
    done.extend(indices for indices, _ in open_buckets.values())
    return done


def pack(tensors: Sequence[tf.Tensor], bucket: Bucket, align: int = 1) -> tf.Tensor:
    """The bucket's tensors as one flat buffer, zero-padded to a multiple of `align`."""
    parts = [tf.reshape(tensors[i], [-1]) for i in bucket.indices]
    pad = bucket.padded_length(align) - bucket.length
    if pad:
        parts.append(tf.zeros([pad], dtype=bucket.dtype))
    return parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)


def unpack(flat: tf.Tensor, bucket: Bucket) -> List[tf.Tensor]:
    """Inverse of pack: the bucket's tensors in their shapes (padding dropped)."""
    if len(bucket.indices) == 1:
        return [tf.reshape(flat[:bucket.length], bucket.shapes[0])]
    pieces = tf.split(flat[:bucket.length], bucket.sizes)
    return [tf.reshape(p, s) for p, s in zip(pieces, bucket.shapes)]
