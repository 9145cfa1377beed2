"""Collectives over any group of ranks on the tf engine, for Horovod's API
(tftorus/horovod_api/mpi_ops.py): every dtype Horovod moves, first dimensions that differ per
rank, broadcasts and all-to-alls.

The tf engine's communicator (tftorus/engines/tf_engine.py) carries the torus' equal, flat
buffers. Horovod's collectives need more, built here on the same keys, tokens and member
order (its `_args`, `_run` and `tf_order`):

- Dtypes. TF's CPU collectives move float16/32/64 and int32/64 only (all-to-all and reduce
  also bfloat16, broadcast also bool). Other dtypes travel losslessly as one of those: bool and
  8- and 16-bit integers widened to int32, uint32/uint64 and (for gathers) bfloat16 as their
  bit patterns. Sums of 8- and 16-bit integers run in int32 and are cast back, which wraps as
  Horovod's own sum in the narrow type does; sums of 16-bit floats run in float32 and are
  rounded once (TF's CPU ring would round at every hop).
- Sizes that differ per rank (allgather, alltoall). Every member's block is padded to one
  capacity and cut back after the collective. The sizes come from the call's agreement
  (tftorus/horovod_api/collective_agreement.py), which every Horovod collective exchanges anyway.
  Eagerly the capacity is the largest block; in a traced function, where the sizes are known only
  when it runs, the next power of two, with one instance key per power (a function's keys are fixed
  when it is traced).
- Order. TF ranks a group's members by the string order of their device names; blocks are
  permuted so results are in the group's rank order, as Horovod's are.
- Empty tensors never reach TF (a collective of zero elements crashes TF's process): the
  callers skip the collective when every member's part is empty.
- No TF timeout, eagerly either: TF keeps two threads asleep for the whole timeout of every op
  given one (measured: 100 eager calls, 400 more threads for 300 s; Horovod's tests make
  thousands and the process died of it). A dead or stopped peer still fails every member (the
  engine's peer health monitor, tftorus/engines/peer_health.py); a live rank that never calls waits
  as Horovod's would (Horovod stalls too).
"""
from typing import List, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import collective_ops

from tftorus.torus.communicator import Group, sum_in_fp32

_SPAN = 32  # keys per padded collective in a traced function: one per power-of-two capacity
_WIDENED = (tf.bool, tf.int8, tf.uint8, tf.int16, tf.uint16)  # travel as int32
_AS_BITS = {tf.uint32: tf.int32, tf.uint64: tf.int64}
_MOVED = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)  # every TF CPU collective
#: Dtypes the collectives here take (Horovod's, and bfloat16, uint32 and uint64 besides).
DTYPES = _MOVED + _WIDENED + (tf.bfloat16,) + tuple(_AS_BITS)
_MERGE = {"sum": "Add", "min": "Min", "max": "Max"}


def check_dtype(dtype: tf.DType, what: str) -> None:
    if dtype not in DTYPES:
        raise TypeError(f"{what} takes tensors of {sorted(d.name for d in DTYPES)}; got "
                        f"{dtype.name}: cast it to one of those")


# -- dtypes on the wire ----------------------------------------------------------------------

def to_wire(tensor: tf.Tensor, moves: Sequence[tf.DType] = _MOVED) -> tf.Tensor:
    """The tensor as a dtype in `moves` (the collective's), keeping every value."""
    dtype = tensor.dtype
    if dtype in moves:
        return tensor
    if dtype in _WIDENED:
        return tf.cast(tensor, tf.int32)
    if dtype in _AS_BITS:
        return tf.bitcast(tensor, _AS_BITS[dtype])
    if dtype == tf.bfloat16:
        return tf.bitcast(tensor, tf.float16)
    raise TypeError(f"no wire dtype for {dtype.name}")


def from_wire(tensor: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    if tensor.dtype == dtype:
        return tensor
    if dtype in _WIDENED:
        return tf.cast(tensor, dtype)
    return tf.bitcast(tensor, dtype)


def _sum_dtype(dtype: tf.DType) -> tf.DType:
    """What a sum of `dtype` runs in (see the module docstring)."""
    if dtype in (tf.int8, tf.uint8, tf.int16, tf.uint16):
        return tf.int32
    if dtype in (tf.float16, tf.bfloat16):
        return tf.float32
    return dtype


def _minmax_dtype(dtype: tf.DType) -> tf.DType:
    return tf.int32 if dtype in (tf.int8, tf.uint8, tf.int16, tf.uint16) else dtype


# -- helpers -------------------------------------------------------------------------------

def _eager() -> bool:
    return tf.executing_eagerly()


def _flat_cat(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    flat = [tf.reshape(t, [-1]) for t in tensors]
    return flat[0] if len(flat) == 1 else tf.concat(flat, 0)


def _rest(tensor: tf.Tensor, what: str) -> List[int]:
    """The dimensions after the first, which must be known when a function is traced."""
    rest = tensor.shape.as_list()[1:]
    if any(d is None for d in rest):
        raise ValueError(f"{what} needs every dimension but the first known when the function "
                         f"is traced, got {tensor.shape}: give the tensor a static shape "
                         f"(tf.ensure_shape)")
    return rest


def _to_tf_order(comm, blocks: tf.Tensor, group: Group) -> tf.Tensor:
    """Rows in group order -> rows in TF's member order (row j for TF's j-th member)."""
    order = comm.tf_order(group)
    return blocks if order == group else tf.gather(blocks, [group.index(m) for m in order])


def _from_tf_order(comm, blocks: tf.Tensor, group: Group) -> tf.Tensor:
    order = comm.tf_order(group)
    return blocks if order == group else tf.gather(blocks, [order.index(m) for m in group])


def _capacity(largest, signature: tuple):
    """(capacity, signature, key offset): eagerly the largest block itself (in the signature);
    traced, the next power of two (>= 1) and its exponent as the key offset."""
    if _eager():
        return max(int(largest), 1), signature + (max(int(largest), 1),), None
    powers = tf.constant([1 << i for i in range(_SPAN - 1)], tf.int64)
    exponent = tf.searchsorted(powers, tf.maximum(tf.cast(largest, tf.int64), 1)[None])[0]
    return tf.gather(powers, exponent), signature, tf.cast(exponent, tf.int32)


def _args(comm, group: Group, signature: tuple, offset=None, token: bool = True):
    """The engine's collective arguments; `offset` (from _capacity) picks one of _SPAN keys."""
    padded = offset is not None and not _eager()
    args = comm.collective_args(group, signature, span=_SPAN if padded else 1)
    args["timeout"] = 0.0  # see the module docstring
    if padded:
        args["instance_key"] = args["instance_key"] + offset
    if not token:  # broadcasts take no ordering token
        del args["ordering_token"]
    return args


def _shape(first, rest: Sequence[int]) -> tf.Tensor:
    """[first, *rest] as an int64 shape (first may be a tensor)."""
    return tf.concat([tf.reshape(tf.cast(first, tf.int64), [1]),
                      tf.constant(list(rest), tf.int64)], 0)


def _pad_rows(tensor: tf.Tensor, capacity) -> tf.Tensor:
    rows = tf.shape(tensor, out_type=tf.int64)[0]
    padding = [[0, tf.cast(capacity, tf.int64) - rows]] + [[0, 0]] * (tensor.shape.rank - 1)
    return tf.pad(tensor, padding)


# -- the collectives -------------------------------------------------------------------------

def gather_rows(comm, tensor: tf.Tensor, group: Group) -> tf.Tensor:
    """[members, *shape]: every member's tensor of one static shape, in group order."""
    shape = tensor.shape.as_list()
    if any(d is None for d in shape):
        raise ValueError(f"gather_rows needs a static shape, got {tensor.shape}")
    n = len(group)
    if len(group) == 1:
        return tensor[None]
    if tensor.shape.num_elements() == 0:
        return tf.zeros([n] + shape, tensor.dtype)
    wire = to_wire(tensor)

    def build():
        out = collective_ops.all_gather_v2(
            tf.reshape(wire, [1, -1]),
            **_args(comm, group, ("hvd_gather", wire.dtype.name, tuple(shape))))
        return _from_tf_order(comm, out, group)
    return from_wire(tf.reshape(comm.run_collectives(build), [n] + shape), tensor.dtype)


def gather_varying(comm, tensors: Sequence[tf.Tensor], rows, group: Group) -> List[tf.Tensor]:
    """Horovod's (grouped) allgather: per tensor, every member's rows concatenated in group
    order. rows: [members, len(tensors)], member i's first dimension of each tensor (the same
    table on every member). One collective for all tensors of one dtype."""
    out: List[tf.Tensor] = [None] * len(tensors)
    by_dtype = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    rows = tf.cast(rows, tf.int64)
    for dtype, indices in by_dtype.items():
        pieces = _gather_one_dtype(comm, [tensors[i] for i in indices],
                                   tf.gather(rows, indices, axis=1), group)
        for i, piece in zip(indices, pieces):
            out[i] = piece
    return out


def _gather_one_dtype(comm, tensors, rows, group):
    n = len(group)
    rests = [_rest(t, "allgather") for t in tensors]
    row_sizes = [int(np.prod(r, dtype=np.int64)) for r in rests]
    if n == 1:
        return list(tensors)
    if all(s == 0 for s in row_sizes):
        totals = tf.reduce_sum(rows, axis=0)
        return [tf.zeros(_shape(totals[k], r), t.dtype)
                for k, (t, r) in enumerate(zip(tensors, rests))]
    if _eager() and int(tf.reduce_max(rows)) == 0:  # nothing anywhere: no collective
        return [tf.zeros([0] + r, t.dtype) for t, r in zip(tensors, rests)]
    wires = [to_wire(t) for t in tensors]
    signature = ("hvd_gatherv", wires[0].dtype.name, tuple(tuple(r) for r in rests))
    capacity, signature, offset = _capacity(tf.reduce_max(rows), signature)
    mine = _flat_cat([_pad_rows(w, capacity) for w in wires])

    def build():
        out = collective_ops.all_gather_v2(tf.reshape(mine, [1, -1]),
                                           **_args(comm, group, signature, offset))
        return _from_tf_order(comm, out, group)  # [n, sum of capacity * row size]
    gathered = comm.run_collectives(build)
    widths = [tf.cast(capacity, tf.int64) * s for s in row_sizes]
    results = []
    for k, (part, rest, tensor) in enumerate(
            zip(tf.split(gathered, tf.stack(widths), axis=1, num=len(tensors)), rests, tensors)):
        shape = tf.concat([tf.constant([n], tf.int64), _shape(capacity, rest)], 0)
        blocks = tf.reshape(part, shape)
        kept = [blocks[i, :rows[i, k]] for i in range(n)]
        results.append(from_wire(tf.concat(kept, 0), tensor.dtype))
    return results


def all_to_all(comm, tensor: tf.Tensor, sends, group: Group) -> tf.Tensor:
    """Horovod's alltoall: sends[i, j] rows go from member i to member j (group order; the
    same table on every member); this member receives its column's blocks in group order."""
    n = len(group)
    me = group.index(comm.rank)
    sends = tf.cast(sends, tf.int64)
    rest = _rest(tensor, "alltoall")
    if n == 1:
        return tensor[:sends[0, 0]]
    received = sends[:, me]
    empty = tf.zeros(_shape(tf.reduce_sum(received), rest), tensor.dtype)
    if int(np.prod(rest, dtype=np.int64)) == 0:
        return empty
    if _eager() and int(tf.reduce_max(sends)) == 0:
        return empty
    wire = to_wire(tensor, _MOVED + (tf.bfloat16,))
    signature = ("hvd_alltoall", wire.dtype.name, tuple(rest))
    capacity, signature, offset = _capacity(tf.reduce_max(sends), signature)
    mine = sends[me]
    pieces = tf.split(wire[:tf.reduce_sum(mine)], mine, num=n)
    blocks = tf.stack([_pad_rows(p, capacity) for p in pieces])  # [n, capacity, *rest]

    def build():
        out = collective_ops.all_to_all_v2(  # [members, m]: row j to TF's j-th member
            tf.reshape(_to_tf_order(comm, blocks, group), [n, -1]),
            **_args(comm, group, signature, offset))
        shape = tf.concat([tf.constant([n], tf.int64), _shape(capacity, rest)], 0)
        return _from_tf_order(comm, tf.reshape(out, shape), group)
    got = comm.run_collectives(build)
    kept = [got[j, :received[j]] for j in range(n)]
    return from_wire(tf.concat(kept, 0), tensor.dtype)


def reduce(comm, tensors: Sequence[tf.Tensor], group: Group, op: str) -> List[tf.Tensor]:
    """Elementwise 'sum', 'min' or 'max' over the group, of tensors of one dtype and static
    shapes: one collective."""
    if len(group) == 1 or not tensors:
        return list(tensors)
    dtype = tensors[0].dtype
    wire_dtype = _sum_dtype(dtype) if op == "sum" else _minmax_dtype(dtype)
    flat = tf.cast(_flat_cat(tensors), wire_dtype)
    if flat.shape.num_elements() == 0:
        return list(tensors)

    def build():
        return collective_ops.all_reduce_v2(
            flat, merge_op=_MERGE[op], final_op="Id",
            **_args(comm, group, ("hvd_reduce", _MERGE[op], wire_dtype.name,
                                  int(flat.shape[0]))))
    total = tf.cast(comm.run_collectives(build), dtype)
    sizes = [t.shape.num_elements() for t in tensors]
    return [tf.reshape(p, t.shape) for p, t in zip(tf.split(total, sizes), tensors)]


def reduce_scatter(comm, blocks: tf.Tensor, group: Group) -> tf.Tensor:
    """blocks: [members, m] (row j for member j, group order, every member's the same shape):
    the sum over members of row `this member`, summed in rank order (exact for integers, in
    float32 for 16-bit floats): an all-to-all, then a local sum."""
    n = len(group)
    if n == 1:
        return blocks[0]
    dtype = blocks.dtype
    wire_dtype = _sum_dtype(dtype) if dtype not in (tf.float16, tf.bfloat16) else dtype
    wire = tf.cast(blocks, wire_dtype)
    if wire.shape.num_elements() == 0:
        return blocks[0]

    def build():
        out = collective_ops.all_to_all_v2(
            _to_tf_order(comm, wire, group),
            **_args(comm, group, ("hvd_reduce_scatter", wire_dtype.name,
                                  tuple(wire.shape.as_list()))))
        return _from_tf_order(comm, tf.reshape(out, wire.shape), group)
    return tf.cast(sum_in_fp32(comm.run_collectives(build)), dtype)


def broadcast(comm, tensors: Sequence[tf.Tensor], root: int, group: Group) -> List[tf.Tensor]:
    """Global rank `root`'s tensors on every member, bit for bit (static shapes, one dtype):
    one collective."""
    if len(group) == 1 or not tensors:
        return list(tensors)
    dtype = tensors[0].dtype
    flat = to_wire(_flat_cat(tensors), _MOVED + (tf.bool,))
    size = int(flat.shape[0])
    if size == 0:
        return list(tensors)

    def build():
        args = _args(comm, group, ("hvd_broadcast", root, flat.dtype.name, size), token=False)
        if comm.rank == root:
            return collective_ops.broadcast_send_v2(flat, **args)
        return collective_ops.broadcast_recv_v2(shape=[size], dtype=flat.dtype, **args)
    values = from_wire(comm.run_collectives(build), dtype)
    sizes = [t.shape.num_elements() for t in tensors]
    return [tf.reshape(p, t.shape) for p, t in zip(tf.split(values, sizes), tensors)]
