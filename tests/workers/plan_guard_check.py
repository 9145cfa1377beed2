"""Worker: the plan guard on a real world, against a plan made slow on purpose.

    # two "hosts" of two ranks each, both on this machine (Horovod's engine)
    horovodrun --gloo -np 4 -H localhost:2,127.0.0.1:2 python tests/workers/plan_guard_check.py
    # the tf engine: one TF_CONFIG per rank naming 127.0.0.1 and 127.0.0.2 (tests/test_plan_guard.py)

The links are given (TFTORUS_LINKS: no probe), and the planner is made to cut every tensor into a
torus bucket of its own: 30 torus all-reduces of three phases each where the fixed rules send
one 16 MiB bucket. Checked, on every rank:
- a custom loop's all-reduce (a tf.function around fused_allreduce): the guard times both and
  runs the fixed torus; the sums equal NumPy's
- with TFTORUS_PLAN_GUARD=0 the same call keeps the slow plan (the check above can fail)
- a user's Keras fit with ReplanCallback: the guard runs at the first step's trace and again at
  the trace after replan(), both times keeping the fixed torus; the ranks' weights stay equal
Rank 0 prints the guard's INFO lines (the test counts them).
"""
import logging
import os

import numpy as np
import planner_check  # noqa: E402  (tests/workers)
import report  # noqa: E402  (tests/workers)
import tensorflow as tf

import tftorus
from tftorus.planning import planner
from tftorus.runtime import plan_guard, process_state, reduction

SHAPES = [(17,), (33, 8), (5, 5, 3)] * 10  # 30 small tensors: one 16 MiB bucket


def _per_tensor_torus(real):
    """The planner, made to put each tensor in a torus bucket of its own where it may choose."""
    def plan(*args, **kwargs):
        if kwargs.get("threshold_bytes") is None:
            kwargs["threshold_bytes"] = 0
        if kwargs.get("algorithm") is None:
            kwargs["algorithm"] = "torus"
        if kwargs.get("chunks") is None:
            kwargs["chunks"] = 1
        return real(*args, **kwargs)
    return plan


def _tensors(rank: int):
    rng = np.random.RandomState(rank)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _kept_buckets() -> set:
    return {len(p.buckets) for p in reduction._plans.values()}


def _loop(rank, size, failures, guard_on: bool) -> None:
    os.environ[plan_guard.GUARD_ENV] = "1" if guard_on else "0"
    reduction._plans.clear()
    step = tf.function(lambda ts: reduction.fused_allreduce(ts, "sum", algorithm="auto"))
    tensors = [tf.constant(t) for t in _tensors(rank)]
    for _ in range(2):
        out = step(tensors)
    every = [_tensors(r) for r in range(size)]
    for i, got in enumerate(out):
        want = sum(e[i].astype(np.float64) for e in every)
        if float(np.max(np.abs(got.numpy() - want))) > 1e-4 * max(1.0, float(np.abs(want).max())):
            failures.append(f"guard {'on' if guard_on else 'off'}: tensor {i} sum differs")
    want_buckets = {1} if guard_on else {len(SHAPES)}
    if _kept_buckets() != want_buckets:
        failures.append(f"guard {'on' if guard_on else 'off'}: ran plans of "
                        f"{sorted(_kept_buckets())} buckets, expected {sorted(want_buckets)}")


def _fit(rank, failures) -> None:
    os.environ[plan_guard.GUARD_ENV] = "1"
    reduction._plans.clear()
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input((8,))] + [
        tf.keras.layers.Dense(8, activation="relu") for _ in range(10)] + [
        tf.keras.layers.Dense(4)])
    callback = planner_check.fit_replanning(model, rank, samples=48, features=8)
    if not callback.replanned:
        failures.append("fit: ReplanCallback did not re-plan after 2 steps")
    plans = list(reduction._plans.values())
    if len(plans) < 2 or any(len(p.buckets) != 1 for p in plans):
        failures.append(f"fit: expected the fixed torus (1 bucket) before and after replan(), "
                        f"ran {[len(p.buckets) for p in plans]} buckets")
    mine = tf.concat([tf.reshape(v, [-1]) for v in model.trainable_variables], 0)
    comm = process_state.communicator()
    both = comm.all_reduce(tf.concat([mine, -mine], 0), comm.all_ranks(), op="max").numpy()
    if not np.array_equal(both[:mine.shape[0]], -both[mine.shape[0]:]):
        failures.append("fit: the ranks' weights differ")


def main():
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    planner.plan = _per_tensor_torus(planner.plan)
    tftorus.init(engine=os.environ.get("TFTORUS_ENGINE") or None)
    comm = process_state.communicator()
    rank, size = comm.rank, comm.size
    failures = []
    if process_state.links() is None:
        failures.append("no links: give TFTORUS_LINKS and two hosts")
        report.finish(rank, 1, failures, what="plan guard: ")
    _loop(rank, size, failures, guard_on=True)
    _loop(rank, size, failures, guard_on=False)
    _fit(rank, failures)
    report.finish(rank, 3, failures, what="plan guard: ")


if __name__ == "__main__":
    main()
