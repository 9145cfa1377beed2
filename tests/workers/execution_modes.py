"""Worker: the tf engine's collectives from eager code, tf.functions and TF1 graphs, mixed in one
process, against NumPy (tests/test_execution_modes.py; 2+ plain processes with TF_CONFIG).

The order is the one that broke: the first collective of the process is built inside
`with tf.Graph().as_default():` and run by a tf.compat.v1.Session (as Horovod's own tests and
tf.compat.v1 users do), then eager code, a tf.function, eager code after it, a second
tf.function, the first again, a second TF1 graph, and eager code once more. The first graph's
session runs every kind of call at once in one `run` (two all-reduces of one shape, an
all-gather of sizes that differ per rank, a broadcast, an FP16 sum, a tf.function called inside
the graph, DistributedGradientTape, a torus reduction of several buckets, the engine's
primitives), twice, and leaves no variable of tftorus' behind in it. A call built after the
one before it and needing other feeds is run alone; calls built one by one, each run with
every one before it, keep in step. A graph of the engine's calls is freed once the user drops it.

Also (the TF_CONFIG path of issue 48): horovodrun's HOROVOD_* variables are in os.environ after
`init()`, with this rank's values, and a value the launch set is kept.
Prints "execution modes: N checks, M failed"; exits 1 on any failure.
"""
import gc
import json
import os
import weakref

import numpy as np

given = {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")}
import tftorus as hvd  # noqa: E402

hvd.init()
import report  # noqa: E402  (tests/workers)
import tensorflow as tf  # noqa: E402  (after init: TF joins its cluster when its runtime starts)

from tftorus.runtime import process_state, reduction  # noqa: E402

RANK, N = hvd.rank(), hvd.size()
comm = process_state.communicator()
checks, failures = 0, []


def check(name, got, want):
    global checks
    checks += 1
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or not np.array_equal(got, want):
        failures.append(f"{name}: got {got.tolist()}, want {want.tolist()}")


def of(rank, seed, shape=(6,), dtype=np.float32):
    """Rank `rank`'s input: small integers, so every sum and mean is exact in float32."""
    return np.random.RandomState(seed * 101 + rank).randint(-20, 21, size=shape).astype(dtype)


def every(seed, shape=(6,), dtype=np.float32):
    return [of(r, seed, shape, dtype) for r in range(N)]


def total(seed, shape=(6,), dtype=np.float32):
    return np.sum(np.array(every(seed, shape, dtype), np.float64), axis=0).astype(dtype)


ROWS = [np.full((r + 1, 2), r, np.int32) for r in range(N)]  # all-gather: sizes differ
FUSED = [(3,), (40,), (7, 5), (1,), (64,)]  # shapes of a reduction of several buckets


def graph_calls():
    """Every kind of call, built in the current (TF1) graph: {name: (tensor, want)}."""
    calls = {
        "allreduce average": (hvd.allreduce(of(RANK, 1)), total(1) / N),
        "allreduce sum, same shape": (hvd.allreduce(of(RANK, 2), op=hvd.Sum), total(2)),
        "allgather, sizes differ": (hvd.allgather(ROWS[RANK]), np.concatenate(ROWS)),
        "broadcast from the last rank": (hvd.broadcast(of(RANK, 3), root_rank=N - 1),
                                         of(N - 1, 3)),
        "fp16 sum": (hvd.allreduce(of(RANK, 4, dtype=np.float16), op=hvd.Sum),
                     total(4, dtype=np.float16)),
        "engine primitive, sum in rank order": (
            comm.sum_in_rank_order(tf.constant(of(RANK, 5, (8,), np.float16)), comm.all_ranks()),
            total(5, (8,), np.float16)),
    }

    @tf.function
    def summed(x):
        return hvd.allreduce(x, op=hvd.Sum)
    calls["tf.function inside the graph"] = (summed(of(RANK, 6)), total(6))

    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w) * float(RANK + 1)
    grad = hvd.DistributedGradientTape(tape).gradient(loss, [w])[0]
    calls["DistributedGradientTape"] = (grad, np.array([2.0, 4.0], np.float32)
                                        * np.mean(np.arange(1, N + 1)))
    fused = reduction.fused_allreduce([of(RANK, 10 + i, s) for i, s in enumerate(FUSED)], "sum",
                                      algorithm="torus", fusion_threshold_bytes=64)
    for i, (shape, out) in enumerate(zip(FUSED, fused)):
        calls[f"torus, bucket tensor {i}"] = (out, total(10 + i, shape))
    return calls, w


def run_in_a_session(label):
    """A fresh TF1 graph and session running every call at once, twice; its graph's weakref."""
    graph = tf.Graph()
    with graph.as_default():
        calls, w = graph_calls()
        ours = [v.name for v in tf.compat.v1.global_variables() if v is not w]
        check(f"{label}: no variable of tftorus' in the user's graph", ours, [])
        with tf.compat.v1.Session() as session:
            session.run(w.initializer)
            for attempt in ("run 1", "run 2"):
                got = session.run({name: t for name, (t, _) in calls.items()})
                for name, (_, want) in calls.items():
                    check(f"{label}, {attempt}: {name}", got[name], want)
    return weakref.ref(graph)


def eager(label):
    check(f"{label}: eager allreduce", hvd.allreduce(of(RANK, 20), op=hvd.Sum), total(20))
    check(f"{label}: eager allgather", hvd.allgather(ROWS[RANK]), np.concatenate(ROWS))


run_in_a_session("first TF1 graph")  # the process' first collective
eager("after a TF1 graph")


def engine_calls_in_a_graph():
    """A TF1 graph with the engine's calls alone, run; its weakref. (Horovod's names may keep
    their graph: TF's custom_gradient registers graph-mode gradients for good.)"""
    graph = tf.Graph()
    with graph.as_default():
        calls = [reduction.fused_allreduce([of(RANK, 40)], "sum")[0],
                 comm.all_gather(tf.constant(ROWS[RANK]), comm.all_ranks()),
                 comm.sum_in_rank_order(tf.constant(of(RANK, 41, (8,), np.float16)),
                                        comm.all_ranks())]
        with tf.compat.v1.Session() as session:
            got = session.run(calls)
    for name, value, want in zip(("fused_allreduce", "all_gather", "sum_in_rank_order"), got,
                                 (total(40), np.concatenate(ROWS), total(41, (8,), np.float16))):
        check(f"engine calls in a graph: {name}", value, want)
    return weakref.ref(graph)


def build_run_build_run():
    """As Horovod's tests do, with a feed: a call needing other feeds than the one built before
    it is run alone (the earlier one would fail unfed)."""
    with tf.Graph().as_default():
        fed = tf.compat.v1.placeholder(tf.float32, [6])
        first = hvd.allreduce(fed, op=hvd.Sum)
        with tf.compat.v1.Session() as session:
            check("built, run: a fed call", session.run(first, {fed: of(RANK, 50)}), total(50))
            second = hvd.allreduce(of(RANK, 51), op=hvd.Sum)
            check("then built and run alone", session.run(second), total(51))


CALLS_SO_FAR = 20  # the session's threads are as many as cores


def build_and_run_every_call_so_far():
    """As Horovod's fused tests do: build a call, run every call so far, build the next, ...:
    more calls at once than a session has threads, which the build order keeps in step."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        calls = []
        for i in range(CALLS_SO_FAR):
            calls.append(hvd.allgather(tf.fill([i + 1, 2], RANK)))
            got = session.run(calls)
        for i, gathered in enumerate(got):
            check(f"every call so far, run together: call {i}", gathered,
                  np.concatenate([np.full((i + 1, 2), r, np.int32) for r in range(N)]))


build_run_build_run()
build_and_run_every_call_so_far()
dropped = engine_calls_in_a_graph()
gc.collect()
check("a graph of the engine's calls is freed once dropped", dropped() is None, True)


@tf.function
def first_function(x):
    return hvd.allreduce(x, op=hvd.Sum), hvd.allreduce(x * 2.0)


@tf.function
def second_function(x, rows):
    return hvd.allgather(rows), hvd.broadcast(x, root_rank=0), hvd.allreduce(x, op=hvd.Sum)


summed, doubled_mean = first_function(tf.constant(of(RANK, 30)))
check("first tf.function: sum", summed, total(30))
check("first tf.function: mean of doubles", doubled_mean, total(30) * 2.0 / N)
eager("after a traced tf.function")
gathered, broadcast, summed = second_function(tf.constant(of(RANK, 31)), ROWS[RANK])
check("second tf.function: allgather", gathered, np.concatenate(ROWS))
check("second tf.function: broadcast", broadcast, of(0, 31))
check("second tf.function: sum", summed, total(31))
summed, _ = first_function(tf.constant(of(RANK, 32)))
check("first tf.function again, new values", summed, total(32))
run_in_a_session("second TF1 graph")
eager("after a second TF1 graph")

# horovodrun's variables, set by init() on a TF_CONFIG cluster (127.0.0.1 for every rank: one
# host); what the launch gave is kept
want = {"HOROVOD_HOSTNAME": "localhost", "HOROVOD_RANK": str(RANK), "HOROVOD_SIZE": str(N),
        "HOROVOD_LOCAL_RANK": str(RANK), "HOROVOD_LOCAL_SIZE": str(N),
        "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1", **given}
check("HOROVOD_* after init (the launch's own kept)",
      json.dumps({k: os.environ.get(k) for k in sorted(want)}), json.dumps(dict(sorted(
          want.items()))))
check("the launch gave HOROVOD_HOSTNAME only", sorted(given), ["HOROVOD_HOSTNAME"])

report.finish(RANK, checks, failures, what="execution modes: ")
