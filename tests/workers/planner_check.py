"""Worker: the link probe and the planner on a real world; the planned all-reduce against NumPy.

    # two "hosts" of two ranks each, both on this machine
    horovodrun --gloo -np 4 -H localhost:2,127.0.0.1:2 python tests/workers/planner_check.py
    # the tf engine: one TF_CONFIG per rank naming 127.0.0.1 and 127.0.0.2 (tests/test_planner.py)
    horovodrun --gloo -np 4 -H localhost:4 python tests/workers/planner_check.py   # one host

On a world of two hosts or more, init() has measured the links: every rank must hold the same,
the probe must have taken under 4 s, and a planned all-reduce (buckets, chunks and algorithm
from the plan) must equal the float64 NumPy sum. On one host nothing is probed at init (there is
nothing to plan), so the worker runs the probe itself as if its ranks sat on hosts of two, and
checks the same agreement and time.

PLANNER_CHECK_STALLED_TASK=k: the TF_CONFIG task k reads a CPU quota's stall count that grows
during the probe (as under a container's CPU limit, which this machine has not), so every rank's
links must say that 1 of the world's ranks was stalled (the count is summed over the world).
"""
import itertools
import json
import os
import time

import numpy as np
import report  # noqa: E402  (tests/workers)
import tensorflow as tf

import tftorus
from tftorus.planning import link_probe, planner
from tftorus.runtime import process_state, reduction


def _agree(comm, links: planner.Links, failures) -> None:
    """Every rank holds the same links: the max and min over the world of each value agree."""
    mine = np.array([links.intra.alpha, links.intra.beta, links.inter.alpha, links.inter.beta,
                     links.lanes], np.float64)
    both = comm.all_reduce(tf.constant(np.concatenate([mine, -mine])), comm.all_ranks(),
                           op="max").numpy()
    if not np.array_equal(both[:5], -both[5:]):
        failures.append(f"ranks measured different links: max {both[:5]}, min {-both[5:]}")


SHAPES = [(3,), (1000, 33), (7, 7), (256 * 1024,), (5,), (640, 1024), (11,)]


def _tensors(rank: int):
    rng = np.random.RandomState(rank)
    out = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    return out + [rng.randint(-50, 50, size=(123,)).astype(np.int64)]


def fit_replanning(model, rank: int, samples: int, features: int):
    """`model` compiled with tftorus' DistributedOptimizer and fit one epoch on this rank's
    random data with ReplanCallback(after_steps=2); the callback."""
    import tftorus.keras
    model.compile(optimizer=tftorus.keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.RandomState(rank)
    x = rng.standard_normal((samples, features)).astype(np.float32)
    y = rng.randint(0, 4, samples)
    callback = tftorus.keras.ReplanCallback(after_steps=2)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    return callback


def _fit_replans(rank: int):
    """A small model's fit with ReplanCallback: the steps clock their gradients, replan() gives
    the planner a profile, the step is traced again and planned for it; the ranks' weights stay
    equal."""
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.layers.Dense(256, activation="relu"),
                                 tf.keras.layers.Dense(256, activation="relu"),
                                 tf.keras.layers.Dense(4)])
    callback = fit_replanning(model, rank, samples=64, features=32)
    out = []
    if not callback.replanned:
        out.append("ReplanCallback did not re-plan after 2 steps")
    if not any("exposed" in p.why for p in reduction._plans.values()):
        out.append("no plan was judged by the step after replan()")
    mine = tf.concat([tf.reshape(v, [-1]) for v in model.trainable_variables], 0)
    comm = process_state.communicator()  # the engine's own: Horovod's runtime may not run here
    both = comm.all_reduce(tf.concat([mine, -mine], 0), comm.all_ranks(), op="max").numpy()
    if not np.array_equal(both[:mine.shape[0]], -both[mine.shape[0]:]):
        out.append("the ranks' weights differ after the re-planned steps")
    return out


def _stall_this_task() -> None:
    stalled = os.environ.get("PLANNER_CHECK_STALLED_TASK")
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {}).get("index")
    if stalled is not None and str(task) == stalled:
        stalls = itertools.count()
        link_probe.throttled_periods = lambda: next(stalls)  # read before and after the probe


def main():
    _stall_this_task()
    tftorus.init(engine=os.environ.get("TFTORUS_ENGINE") or None)
    comm = process_state.communicator()
    rank, size, local = comm.rank, comm.size, comm.local_size
    checks, failures = 0, []
    if local < size:  # several hosts: init() probed
        links = process_state.links()
        checks += 1
        if links is None or not links.source.startswith("measured"):
            failures.append(f"init() on {size // local} hosts left no measured links: {links}")
            report.finish(rank, checks, failures, what="planner: ")
        seconds = None
    else:
        start = time.perf_counter()
        links = link_probe.probe(comm, 2)
        seconds = time.perf_counter() - start
    checks += 1
    _agree(comm, links, failures)
    checks += 1
    if not (links.intra.beta > 0 and links.inter.beta > 0 and 1 <= links.lanes <= 2):
        failures.append(f"implausible links {links}")
    if seconds is not None:
        checks += 1
        if seconds > 4.0:  # up to 8 rounds where the cores are busy (link_probe.MAX_ROUNDS)
            failures.append(f"the probe took {seconds:.2f} s (over 4 s)")
    # A planned reduction: many tensors, two dtypes, sizes from a few bytes to a few MiB.
    tensors = _tensors(rank)
    out = reduction.fused_allreduce([tf.constant(t) for t in tensors], "sum", algorithm="auto")
    every = [_tensors(r) for r in range(size)]
    for i, got in enumerate(out):
        checks += 1
        want = sum(e[i].astype(np.float64) for e in every)
        if tensors[i].dtype == np.int64:
            ok = np.array_equal(got.numpy(), want.astype(np.int64))
        else:
            ok = float(np.max(np.abs(got.numpy() - want))) <= 1e-4 * max(
                1.0, float(np.max(np.abs(want))))
        if not ok:
            failures.append(f"tensor {i} {tensors[i].shape} {tensors[i].dtype}: sum differs")
    if local < size:  # planned for the step, in a user's fit
        checks += 1
        failures += _fit_replans(rank)
    plans = {p.describe() for p in reduction._plans.values()}
    print(f"[rank {rank}] links {links.describe()}"
          + (f" in {seconds:.2f} s" if seconds is not None else "")
          + "".join(f"\n[rank {rank}] plan {p}" for p in plans), flush=True)
    report.finish(rank, checks, failures, what="planner: ")


if __name__ == "__main__":
    main()
