"""Worker: the tf engine's rows through shared memory, against the same rows over gRPC.

    # four ranks as two hosts of two, TFTORUS_TF_SHARED_MEMORY=1 (tests/test_shared_memory.py)

Checked on every rank:
- the handshake found this host's two ranks, and only them
- reduce-scatter and all-gather in the row, traced and eager, FP32, FP16, BF16 and int32: the
  same bits as over gRPC, and the exact sums (integer-valued data)
- the torus over the world (rows through shared memory, columns over gRPC): the same bits as
  with gRPC alone, and exact
- eight buckets in flight at once, new data every call: every sum exact
- reads reach TF through DLPack (BF16 through numpy's copy)
- after the calls no segment of this rank is left in /dev/shm under a name, and repeated calls
  reuse the segments they leased
"""
import glob
import os

import numpy as np

import report  # noqa: E402  (tests/workers)

import tftorus
from tftorus.runtime import process_state

tftorus.init(engine="tf")
import tensorflow as tf  # noqa: E402

comm = process_state.communicator()
rank, size = comm.rank, comm.size
transport = comm.shared_memory
check = report.Checks()
ROW = (rank // 2 * 2, rank // 2 * 2 + 1)  # the two ranks of this "host"
# FP16: 4.2 MiB, above the transport's smallest buffer; a shard of 1,100,003 items is no whole
# number of 64 bytes, so the blocks in a segment are laid out at a padded stride
ELEMENTS = 2 * 1_100_003


def data(r: int, dtype, salt: int = 7) -> tf.Tensor:
    """Rank r's input: small integers, so every sum is exact in each dtype."""
    values = tf.random.stateless_uniform([ELEMENTS], seed=[r, salt], minval=0, maxval=8,
                                         dtype=tf.int32)
    return tf.cast(values, dtype)


def bits(t) -> np.ndarray:
    t = tf.convert_to_tensor(t)
    return tf.bitcast(t, tf.int16).numpy() if t.dtype.size == 2 else t.numpy()


def traced(fn, through_shared_memory: bool):
    """fn as a tf.function whose graph takes the rows through shared memory or gRPC."""
    def body(*args):
        comm.shared_memory = transport if through_shared_memory else None
        try:
            return fn(*args)
        finally:
            comm.shared_memory = transport
    return tf.function(body, autograph=False)


check("the handshake found this host's ranks", transport is not None
      and transport.ranks == frozenset(ROW))

row_ops = lambda x: (lambda s: (s, comm.all_gather(s, ROW, equal_sizes=True)))(  # noqa: E731
    comm.reduce_scatter(x, ROW))
for dtype in (tf.float32, tf.float16, tf.bfloat16, tf.int32):
    x = data(rank, dtype)
    row_sum = sum(tf.cast(data(r, dtype), tf.float64) for r in ROW).numpy()
    shard = ELEMENTS // 2
    mine = row_sum[ROW.index(rank) * shard:(ROW.index(rank) + 1) * shard]
    with_shm, over_grpc = traced(row_ops, True), traced(row_ops, False)
    for call in range(3):  # the segments are leased again each call
        s_shm, g_shm = with_shm(x)
    s_grpc, g_grpc = over_grpc(x)
    check(f"{dtype.name} row reduce-scatter: the bits of gRPC's",
          np.array_equal(bits(s_shm), bits(s_grpc)))
    check(f"{dtype.name} row all-gather: the bits of gRPC's",
          np.array_equal(bits(g_shm), bits(g_grpc)))
    check(f"{dtype.name} row reduce-scatter: exact",
          np.array_equal(tf.cast(s_shm, tf.float64).numpy(), mine))
    check(f"{dtype.name} row all-gather: every member's shard sum",
          np.array_equal(tf.cast(g_shm, tf.float64).numpy(), row_sum))
    # eagerly: the same transport, its calls run at once
    eager = comm.reduce_scatter(x, ROW)
    check(f"{dtype.name} eager reduce-scatter: the bits of the traced one",
          np.array_equal(bits(eager), bits(s_shm)))

# Which row collectives it takes, by the bytes each moves: an all-gather by what it returns
# (the shard of a bucket just under 16 MiB is under MIN_BYTES, its result is not), a
# reduce-scatter by what it is given
half = data(rank, tf.float16)[:shard]  # 2.2 MB: under MIN_BYTES; two of them are over it
before = sum(transport.reads.values())
comm.all_gather(half, ROW, equal_sizes=True)
check("an all-gather returning 4.4 MB of 2.2 MB shards went through shared memory",
      sum(transport.reads.values()) == before + 1)
comm.reduce_scatter(half[:shard - 1], ROW)  # an even length
check("a reduce-scatter of 2.2 MB stayed on gRPC", sum(transport.reads.values()) == before + 1)

check(f"FP32, FP16 and int32 reads lent to TF, BF16's copied: {transport.reads}",
      transport.reads["copied"] > 0 and transport.reads["lent"] >= 3 * transport.reads["copied"])
own = transport._own.get(ROW, [])
check(f"repeated calls reuse segments ({len(own)} made for 12 traced and 4 eager calls)",
      0 < len(own) <= 8)

# The torus over the world: rows (a host each) through shared memory, columns over gRPC
tensors = [data(rank, tf.float32)[:150_000], tf.reshape(data(rank, tf.float32), [2, -1])]
# (the first bucket, 0.6 MiB, stays on gRPC; the second, 8.4 MiB, goes through /dev/shm)
torus = lambda ts: tftorus.fused_allreduce(ts, "sum", algorithm="torus", comm=comm)  # noqa: E731
out_shm = traced(torus, True)(tensors)
out_grpc = traced(torus, False)(tensors)
world = [sum(data(r, tf.float32).numpy().astype(np.float64) for r in range(size))]
expected = [world[0][:150_000], world[0].reshape(2, -1)]
for i, (a, b, want) in enumerate(zip(out_shm, out_grpc, expected)):
    check(f"torus tensor {i}: the bits of the torus over gRPC", np.array_equal(bits(a), bits(b)))
    check(f"torus tensor {i}: exact", np.array_equal(a.numpy().astype(np.float64), want))

# Eight buckets in flight at once, new data every call: a segment given back while a peer still
# reads it (or read before its owner wrote) would show as a wrong sum
many = traced(lambda ts: tftorus.fused_allreduce(ts, "sum", algorithm="torus", comm=comm,
                                                 fusion_threshold_bytes=ELEMENTS * 4), True)
for call in range(3):
    salts = [100 * call + i for i in range(8)]
    out = many([data(rank, tf.float32, salt) for salt in salts])
    want = [sum(data(r, tf.float32, salt).numpy().astype(np.float64)
                for r in range(size)) for salt in salts]
    check(f"call {call}: eight buckets in flight, every sum exact",
          all(np.array_equal(o.numpy().astype(np.float64), w) for o, w in zip(out, want)))

comm.barrier()  # every rank's calls are done
left = glob.glob(f"/dev/shm/tftorus-{transport.tag}-*-r{rank}-*")
check(f"no segment of this rank left under a name in /dev/shm: {left}", not left)
report.finish(rank, check.count, check.failures, "shared memory: ")
