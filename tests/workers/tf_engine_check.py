"""Worker: the tf engine (TensorFlow collective ops) against float64 NumPy references.

Launched as N plain processes with TF_CONFIG, or under `horovodrun --gloo -np N` (the engine
then swaps TF server addresses through horovodrun's rendezvous; Horovod itself never starts).
Every rank derives every rank's inputs from (seed, rank), so references need no collective.
Checks, on every row and column of every grid Y x X of N and on the world:
  * TF's member order: all-gather of rank ids is in ascending-rank group order, also where TF
    ranks members differently (N >= 11: ".../task:10" sorts before ".../task:2");
  * each primitive: all-gather (equal sizes; sizes that differ per rank, zero rows included;
    FP32/FP16/BF16/INT), reduce-scatter (which shard), all-reduce (sum/max/min, FP32, FP16,
    BF16, INT32);
  * torus on every grid, ring and hierarchical through `tftorus.fused_allreduce`, FP32 and
    FP16 tensors and FP16 wire compression, odd sizes, sizes below X, scalars and empty;
  * the same inside tf.function, called again, retraced with other shapes, and retraced on
    odd ranks only (instance keys must not depend on tracing history);
  * gradient_reducer (Average) as a custom training loop uses it;
  * the torus' chunk pipeline equals no chunks bit for bit, and FP16/BF16 compression puts
    16-bit tensors on the wire (tests/workers/pipeline_and_wire.py).
Prints one line per failure and "N checks, M failed"; exits 1 on any failure.
"""
import argparse

import numpy as np

import tftorus
from tftorus.cluster import discovery, tf_runtime
from tftorus.runtime import process_state
from tftorus.torus.grid import divisors, parse_grid

args = argparse.ArgumentParser()
args.add_argument("--timeout", type=float, default=120.0)
args.add_argument("--light", action="store_true",
                  help="big worlds: fewer fused cases; each primitive once on the groups whose "
                       "TF order is rank order (the world and the others: every dtype and op)")
opts = args.parse_args()

# Before any TensorFlow call: the cluster is fixed when TF's runtime starts.
n_guess = discovery.discover(timeout=opts.timeout).size
GRIDS = [f"{n_guess // x}x{x}" for x in divisors(n_guess)]
tftorus.init(grid=GRIDS[len(GRIDS) // 2], extra_grids=GRIDS, engine="tf",
             collective_timeout=opts.timeout)

import pipeline_and_wire  # noqa: E402  (tests/workers)
import report  # noqa: E402
import tensorflow as tf  # noqa: E402

comm = process_state.communicator()
RANK, N = comm.rank, comm.size
TOL = {tf.float64: 1e-12, tf.float32: 1e-6, tf.float16: 2e-3, tf.bfloat16: 2e-2}
failures = []
checks = 0


def data(rank, seed, shape, dtype, integer=False):
    rng = np.random.RandomState(seed * 1009 + rank)
    values = rng.randint(-8, 9, size=shape) if integer or dtype.is_integer \
        else rng.standard_normal(size=shape)
    return tf.cast(tf.constant(values, tf.float64), dtype)


def wide(t):
    return tf.cast(t, tf.float64).numpy()


def compare(name, got, want, scale=None, tol=0.0):
    global checks
    checks += 1
    got = wide(got)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        failures.append(f"{name}: shape {got.shape} != {want.shape}")
        return
    bound = tol * (np.abs(want) if scale is None else scale) + (1e-30 if tol else 0.0)
    err = np.abs(got - want)
    if np.any(err > bound):
        i = np.unravel_index(np.argmax(err - bound), err.shape) if err.ndim else ()
        failures.append(f"{name}: error {err[i]:.3g} > {np.asarray(bound)[i]:.3g} "
                        f"(got {got[i]}, want {want[i]})")


def groups():
    seen = []
    for spec in GRIDS:
        g = tftorus.resolve_grid(spec, N)
        for group in (g.row_group(RANK), g.col_group(RANK)):
            if len(group) > 1 and group not in seen:
                seen.append(group)
    return seen + ([comm.all_ranks()] if comm.all_ranks() not in seen else [])


def check_primitives(group, seed, every=True):
    """every=False (--light, for groups whose TF order is rank order, other than the world):
    each primitive once, in float32."""
    n, pos = len(group), group.index(RANK)
    tag = f"group {group}"
    ids = comm.all_gather(tf.constant([RANK, 10 * RANK], tf.int32), group, equal_sizes=True)
    compare(f"{tag} all_gather order", ids, [v for r in group for v in (r, 10 * r)])
    if not every:
        want = np.concatenate([wide(data(r, seed, (3,), tf.float32)) for r in group])
        compare(f"{tag} all_gather float32",
                comm.all_gather(data(RANK, seed, (3,), tf.float32), group, True), want)
        inputs = [wide(data(r, seed + 2, (5 * n,), tf.float32)) for r in group]
        shard = slice(pos * 5, (pos + 1) * 5)
        compare(f"{tag} reduce_scatter float32",
                comm.reduce_scatter(data(RANK, seed + 2, (5 * n,), tf.float32), group),
                np.sum(inputs, 0)[shard], np.sum(np.abs(inputs), 0)[shard], TOL[tf.float32])
        inputs = [wide(data(r, seed + 3, (7,), tf.float32)) for r in group]
        compare(f"{tag} all_reduce sum float32",
                comm.all_reduce(data(RANK, seed + 3, (7,), tf.float32), group, "sum"),
                np.sum(inputs, 0), np.sum(np.abs(inputs), 0), TOL[tf.float32])
        return
    for dtype in (tf.float32, tf.float16, tf.bfloat16, tf.int64):
        mine = data(RANK, seed, (3,), dtype)
        want = np.concatenate([wide(data(r, seed, (3,), dtype)) for r in group])
        compare(f"{tag} all_gather {dtype.name}", comm.all_gather(mine, group, True), want)
    # Sizes that differ per rank (sparse gradients): 0, 1 or 2 rows of 2.
    rows = lambda r: r % 3  # noqa: E731
    mine = data(RANK, seed + 1, (rows(RANK), 2), tf.float32)
    want = np.concatenate([wide(data(r, seed + 1, (rows(r), 2), tf.float32)) for r in group])
    compare(f"{tag} all_gather sizes differ", comm.all_gather(mine, group), want)
    mine = tf.range(rows(RANK) + 1, dtype=tf.int64) + 100 * RANK
    want = np.concatenate([np.arange(rows(r) + 1) + 100 * r for r in group])
    compare(f"{tag} all_gather int64 sizes differ", comm.all_gather(mine, group), want)
    for dtype in (tf.float32, tf.float16):
        length = 5 * n
        inputs = [wide(data(r, seed + 2, (length,), dtype)) for r in group]
        total, scale = np.sum(inputs, 0), np.sum(np.abs(inputs), 0)
        shard = slice(pos * 5, (pos + 1) * 5)
        compare(f"{tag} reduce_scatter {dtype.name}",
                comm.reduce_scatter(data(RANK, seed + 2, (length,), dtype), group),
                total[shard], scale[shard], TOL[dtype])
    for dtype, op, size in [(tf.float32, "sum", 7), (tf.int32, "sum", 4), (tf.float32, "max", 3),
                            (tf.float32, "min", 3), (tf.float16, "sum", 5),
                            (tf.bfloat16, "sum", 6), (tf.bfloat16, "max", 2)]:
        inputs = [wide(data(r, seed + 3, (size,), dtype)) for r in group]
        want = {"sum": np.sum, "max": np.max, "min": np.min}[op](inputs, 0)
        scale = np.sum(np.abs(inputs), 0)
        tol = 0.0 if dtype.is_integer or op != "sum" else TOL[dtype]
        compare(f"{tag} all_reduce {op} {dtype.name}",
                comm.all_reduce(data(RANK, seed + 3, (size,), dtype), group, op),
                want, scale, tol)


SHAPES = [(), (1,), (3,), (7,), (5, 3), (0,), (1001,)]


def check_fused(label, seed, dtype, compression=tftorus.Compression.none, wire=None, **kw):
    inputs = [data(RANK, seed, s, dtype) for s in SHAPES]
    out = tftorus.fused_allreduce(inputs, "sum", compression=compression, **kw)
    compare_fused(label, seed, dtype, out, wire or dtype)


def compare_fused(label, seed, dtype, out, wire, shapes=SHAPES):
    for i, shape in enumerate(shapes):
        every = [wide(data(r, seed, shape, dtype)) for r in range(N)]
        compare(f"{label} shape={shape}", out[i], np.sum(every, 0), np.sum(np.abs(every), 0),
                TOL[wire])
        if out[i].dtype != dtype:
            failures.append(f"{label} shape={shape}: dtype {out[i].dtype.name}")


def check_split_messages():
    """Blocks above max_message_bytes go as several collectives (uneven pieces here), eagerly
    and in a tf.function: results must be laid out exactly as with one message."""
    saved, comm.max_message_bytes = comm.max_message_bytes, 1024
    try:
        for group in (comm.all_ranks(),) + tuple(g for g in groups() if len(g) > 1)[:2]:
            n, pos = len(group), group.index(RANK)
            length = 601 * n  # 2404-byte blocks: pieces of 802, 802, 800 bytes
            inputs = [wide(data(r, 800, (length,), tf.float32)) for r in group]
            total, scale = np.sum(inputs, 0), np.sum(np.abs(inputs), 0)
            shard = slice(pos * 601, (pos + 1) * 601)
            for how, rs in (("eager", comm.reduce_scatter),
                            ("tf.function", tf.function(comm.reduce_scatter))):
                compare(f"group {group} reduce_scatter 1KiB messages {how}",
                        rs(data(RANK, 800, (length,), tf.float32), group),
                        total[shard], scale[shard], TOL[tf.float32])
            for dtype, shape in ((tf.int64, (301,)), (tf.bfloat16, (7, 150)), (tf.float32, (700,))):
                want = np.concatenate([wide(data(r, 801, shape, dtype)) for r in group])
                compare(f"group {group} all_gather 1KiB messages {dtype.name}",
                        comm.all_gather(data(RANK, 801, shape, dtype), group, True), want)
        for k, grid in enumerate(GRIDS[:3]):
            check_fused(f"torus {grid} float32 1KiB messages", 700 + k, tf.float32,
                        algorithm="torus", grid=grid)
    finally:
        comm.max_message_bytes = saved


def main():
    global checks
    order_differs = [g for g in groups() if comm.tf_order(g) != g]
    print(f"[rank {RANK}] TF member order differs from rank order in {len(order_differs)} of "
          f"my groups {order_differs[:3]}", flush=True)
    for i, group in enumerate(groups()):
        # the same choice on every member: it depends on the group alone
        every = not opts.light or group == comm.all_ranks() or group in order_differs
        check_primitives(group, seed=10 + i, every=every)
    cases = [("torus", g) for g in GRIDS] + [("ring", None), ("hierarchical", None)]
    # leader-based hierarchical with nodes of X ranks (one host's node grid has one row)
    cases += [("hierarchical", g) for g in pipeline_and_wire.two_phase_grids(GRIDS, N)[:1]]
    for k, (algorithm, grid) in enumerate(cases):
        label = f"{algorithm} {grid or ''}"
        where = (dict(torus_grid=parse_grid(grid, N)) if algorithm == "hierarchical" and grid
                 else dict(grid=grid))
        check_fused(f"{label} float32", 100 + k, tf.float32, algorithm=algorithm, **where)
        if opts.light and algorithm == "torus" and grid not in ("2x5", "5x2", "2x6", "6x2"):
            continue
        check_fused(f"{label} float16", 200 + k, tf.float16, algorithm=algorithm, **where)
        check_fused(f"{label} float32 fp16-wire", 300 + k, tf.float32,
                    tftorus.Compression.fp16, tf.float16, algorithm=algorithm, **where)
        check_fused(f"{label} float32 64B-buckets", 400 + k, tf.float32, algorithm=algorithm,
                    fusion_threshold_bytes=64, **where)
    check_split_messages()
    two_phase = pipeline_and_wire.two_phase_grids(GRIDS, N)
    for k, grid in enumerate(two_phase[:1] if opts.light else two_phase):
        inputs = [data(RANK, 900 + k, s, tf.float32) for s in SHAPES]
        checks += pipeline_and_wire.check_chunks("chunks float32", inputs, grid, failures)
        if not opts.light:  # the wide worlds: chunks eagerly (N <= 6 trace them as well)
            checks += pipeline_and_wire.check_chunks("chunks fp16-wire", inputs, grid, failures,
                                                     tftorus.Compression.fp16, in_function=True)
    checks += pipeline_and_wire.check_wire(two_phase[0] if two_phase else None, RANK, failures)
    # Inside tf.function: twice (keys reused), then retraced with other shapes (keys rederived).
    step = tf.function(lambda ts: tftorus.fused_allreduce(ts, "sum"))
    for call, (seed, shapes) in enumerate([(500, SHAPES), (501, SHAPES), (502, [(4,), (9, 2)])]):
        out = step([data(RANK, seed, s, tf.float32) for s in shapes])
        compare_fused(f"tf.function call {call}", seed, tf.float32, out, tf.float32, shapes)
    # Odd ranks retrace (a new tf.function), even ranks reuse their trace: the keys must agree.
    fresh = tf.function(lambda ts: tftorus.fused_allreduce(ts, "sum", fusion_threshold_bytes=64))
    again = tf.function(lambda ts: tftorus.fused_allreduce(ts, "sum", fusion_threshold_bytes=64))
    again([data(RANK, 503, s, tf.float32) for s in SHAPES])
    out = (fresh if RANK % 2 else again)([data(RANK, 504, s, tf.float32) for s in SHAPES])
    compare_fused("retraced on odd ranks only", 504, tf.float32, out, tf.float32)
    # The reducer a custom training loop calls (Average), in a tf.function.
    reduce = tftorus.gradient_reducer(op="average")
    grads = [data(RANK, 600, (4, 3), tf.float32), data(RANK, 601, (5,), tf.float32)]
    for i, got in enumerate(reduce(grads)):
        every = [wide(data(r, 600 + i, grads[i].shape, tf.float32)) for r in range(N)]
        compare(f"gradient_reducer average #{i}", got, np.mean(every, 0),
                np.sum(np.abs(every), 0) / N, 1e-6)
    report.finish(RANK, checks, failures, what=f"tf engine ({tf_runtime.current().source}), "
                                               f"grids {GRIDS}: ")


if __name__ == "__main__":
    main()
