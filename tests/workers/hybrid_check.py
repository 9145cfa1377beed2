"""Worker: the hybrid engine (Horovod inside a host, TF across hosts) against float64 references.

Run under `horovodrun --gloo -np 4`. On one machine every rank shares a host, so the engine that
`tftorus.init(engine="hybrid")` starts sends every group to Horovod; the checks then build the
same engine over the same two runtimes with ranks 0-1 and 2-3 named as two hosts, so the 2 x 2
torus' rows run on Horovod and its columns on TF's collective ops, in the chunk pipeline.
Checks:
  * routing: which engine each row, column and the world goes to; local size;
  * torus (chunks by size, and forced), ring and hierarchical through `fused_allreduce`, eager
    and in tf.function, FP32 and FP16 wire compression, against float64 NumPy sums;
  * chunks against no chunks, bit for bit (every sum here has a fixed order: rows are
    all-to-all plus an FP32 sum in rank order, columns have two ranks).
Prints one line per failure and "N checks, M failed"; exits 1 on any failure.
"""
import numpy as np

import tftorus
from tftorus import algorithms, context

tftorus.init(grid="2x2", engine="hybrid", collective_timeout=120)  # before any other TF call

import tensorflow as tf  # noqa: E402
import report  # noqa: E402  (tests/workers)
from tftorus.hybrid_engine import HybridCommunicator  # noqa: E402

started = context.communicator()
RANK, N = started.rank, started.size
horovod, tf_engine = context.communicator("horovod"), context.communicator("tf")
grid = tftorus.resolve_grid("2x2", N)
ROW, COL, WORLD = grid.row_group(RANK), grid.col_group(RANK), started.world()
SHAPES = [(3, 5), (1000,), (768, 1024), ()]  # 3 MiB in FP32: 3 chunks by size
failures, checks = [], 0


def expect(ok, what):
    global checks
    checks += 1
    if not ok:
        failures.append(what)


def inputs(rank, seed):
    rng = np.random.RandomState(seed * 1009 + rank)
    return [np.asarray(rng.standard_normal(size=s)) for s in SHAPES]


def reference(seed):
    return [np.asarray(sum(parts)) for parts in zip(*(inputs(r, seed) for r in range(N)))]


def check_sums(label, comm, seed, in_function=False, **kw):
    mine = [tf.constant(x, tf.float32) for x in inputs(RANK, seed)]

    def reduce(ts):
        return tftorus.fused_allreduce(ts, "sum", comm=comm, torus_grid=grid, **kw)
    got = [t.numpy() for t in (tf.function(reduce)(mine) if in_function else reduce(mine))]
    fp16 = kw.get("compression") is tftorus.Compression.fp16
    for i, (g, want) in enumerate(zip(got, reference(seed))):
        err = float(np.max(np.abs(g - want), initial=0.0))
        bound = (2e-3 if fp16 else 1e-5) * max(1.0, float(np.max(np.abs(want), initial=0.0)))
        expect(g.shape == want.shape and err <= bound,
               f"{label} tensor #{i} shape {g.shape}: off the float64 sum by {err:.3g}")
    return got


# As started on one machine: one host, so every group is Horovod's and nothing is chunked.
expect(started.engine == "hybrid" and started.local_size == N,
       f"started as {started.engine} with local size {started.local_size}")
expect(all(started.engine_for(g) is horovod for g in (ROW, COL, WORLD)),
       "on one host every group must go to Horovod")
check_sums("one host torus", started, 1)

# Two named hosts: rows inside a host (Horovod), columns and the world across (TF).
two_hosts = HybridCommunicator(horovod, tf_engine, [f"host{r // 2}" for r in range(N)])
expect(two_hosts.local_size == 2, f"local size {two_hosts.local_size}, want 2")
expect(two_hosts.engine_for(ROW) is horovod, f"row {ROW} not on Horovod")
expect(two_hosts.engine_for(COL) is tf_engine and two_hosts.engine_for(WORLD) is tf_engine,
       f"column {COL} / world not on the tf engine")
chunks = algorithms.pipeline_chunks("torus", grid, two_hosts, 3 << 20, None, tf.float32)
expect(chunks == 3, f"chunks by size for 3 MiB: {chunks}, want 3")

for in_function in (False, True):
    where = "tf.function" if in_function else "eager"
    for algorithm in ("ring", "hierarchical"):
        check_sums(f"{where} {algorithm}", two_hosts, 2, in_function, algorithm=algorithm)
    for compression in (tftorus.Compression.none, tftorus.Compression.fp16):
        label = f"{where} torus {'fp16 wire' if compression is tftorus.Compression.fp16 else ''}"
        unchunked = check_sums(f"{label} no chunks", two_hosts, 3, in_function,
                               compression=compression, pipeline_chunks=1)
        for requested in (None, 2):
            chunked = check_sums(f"{label} chunks {requested}", two_hosts, 3, in_function,
                                 compression=compression, pipeline_chunks=requested)
            for i, (a, b) in enumerate(zip(unchunked, chunked)):
                expect(a.tobytes() == b.tobytes(), f"{label} chunks {requested} tensor #{i}: "
                       f"not bit for bit the unchunked sum")

report.finish(RANK, checks, failures, "hybrid engine: ")
