"""The plan checked against the paper's fixed torus in the job itself: a plan is a prediction,
a time is a fact.

The planner (tftorus/planning/planner.py) is only as right as the links it is given, and a link
probe on a busy machine can read CPU contention as a slow link (measured: the emulated 2 x 4's
in-host link at 0.041 GB/s, which sent Horovod's engine to one ring bucket 1.5-2.7x slower than
the fixed torus it replaced; docs/studies/planner.md). So where a plan differs from the fixed
rules (16 MiB buckets, the torus across hosts, the engine's chunk rule), the first trace of its
all-reduce (the first step of `fit`, the first call of a custom loop) runs each candidate on
zeros of the real inputs, the whole reduction as the call runs it (compression, the consistency
check, buckets), each as a graph of its own, and keeps the faster (the plan unless another is
`MARGIN` faster). Beside the fixed rules it times what else the planner weighed: where it
planned the buckets, its chunks and algorithms on the fixed 16 MiB buckets; where it left the
torus for some bucket, the best torus plan.

  measured   a warm-up each, then rounds of one call each in rotated order, each call's time
             the slowest rank's (one tiny all-reduce a round: every rank holds the same numbers
             and makes the same choices). A first version timed the collectives alone and kept
             each rank's fastest call: it read a plan at 2,019 ms that the benchmark's median
             put at 2,384, 8 % over the fixed torus, on the emulated 2 x 4, FP16.
  spent      where it decides (`contenders`): a candidate whose fastest call trails the
             leader's median by more than `DROP` is timed no more; after `ROUNDS` rounds only
             a runner-up within `CLOSE` of the leader goes on beside it, up to `MAX_ROUNDS`.
             A clear choice costs a round; a close one gets the calls that settle it. On a
             busy CPU a call of ResNet-50's set takes seconds (the emulated clusters: 2-7 s),
             on a GPU cluster milliseconds.
  judged by  the median call less what the model predicts the backward pass hides of it
             (nothing before replan(); with the step's clocks, the plan's predicted hiding),
             so a plan of small buckets that hide is not lost to one that merely sums faster

It says which it kept in one INFO line on rank 0. replan() makes a new plan for the step, and
its first trace is checked again. TFTORUS_PLAN_GUARD=0 keeps the plan untimed.
"""
import dataclasses
import logging
import os
import statistics
import time
from typing import Callable, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tftorus.planning import planner

logger = logging.getLogger(__name__)

GUARD_ENV = "TFTORUS_PLAN_GUARD"
#: Timed calls per contender after its warm-up, at least; while the best two are within CLOSE
#: of each other, more of those two, up to MAX_ROUNDS. Four candidates: 8 calls with the
#: warm-ups where one leads clearly after a round, 20 where all four stay close.
ROUNDS = 3
MAX_ROUNDS = 5
#: A candidate whose fastest call, less what it hides, trails the leader's median score by more
#: than this share of the leader's median call is timed no more: on one core two sets of calls
#: of the same collective differed by 4-5 % (docs/studies/planner.md), stalls only add.
DROP = 0.25
#: Another candidate replaces the plan only when faster by more than this share of the plan's.
MARGIN = 0.03
#: Past ROUNDS, only candidates within this share of the leader's median are timed again.
CLOSE = 2 * MARGIN


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to run a set's all-reduce: its name in the log, and its plan (costed by the
    model, for what it predicts the backward pass hides)."""

    name: str
    plan: planner.Plan

    @property
    def predicted_hidden(self) -> float:
        hidden = self.plan.seconds - self.plan.exposed_seconds
        return hidden if hidden > 1e-9 else 0.0  # rounding, not hiding


def enabled() -> bool:
    value = os.environ.get(GUARD_ENV, "1").strip().lower()
    if value not in ("0", "1", "", "on", "off", "true", "false"):
        raise ValueError(f"{GUARD_ENV}={value!r}: set 1 (time the plan against the fixed "
                         f"torus in the first step; the default) or 0 (trust the plan)")
    return value not in ("0", "off", "false")


def same_layout(a: planner.Plan, b: planner.Plan) -> bool:
    """Whether two plans run the same collectives (buckets, algorithms, chunks)."""
    return [(x.indices, x.algorithm, x.chunks) for x in a.buckets] == [
        (x.indices, x.algorithm, x.chunks) for x in b.buckets]


def distinct(candidates: Sequence[Candidate]) -> List[Candidate]:
    """The candidates that run differently, the first of each kept (the plan comes first)."""
    out: List[Candidate] = []
    for c in candidates:
        if not any(same_layout(c.plan, o.plan) for o in out):
            out.append(c)
    return out


def contenders(candidates: Sequence[Candidate], calls: Sequence[Sequence[float]],
               timed: Sequence[int]) -> List[int]:
    """Which of the candidates `timed` (indices) to time again, given every candidate's calls so
    far (seconds, the slowest rank's); none when the choice is made, judged by `scores` of the
    medians. Before ROUNDS calls a candidate stays unless even its fastest call trails the
    leader by DROP; from then on only those within CLOSE of the leader stay (the best two at
    most), and none after MAX_ROUNDS or once one is left."""
    score = scores(candidates, [statistics.median(c) for c in calls])
    lead = min(timed, key=lambda i: (score[i], i))
    scale = statistics.median(calls[lead])
    rounds = min(len(calls[i]) for i in timed)
    if rounds < ROUNDS:
        keep = [i for i in timed
                if min(calls[i]) - candidates[i].predicted_hidden <= score[lead] + DROP * scale]
    else:  # the leader and the runner-up, where it is close
        keep = sorted(timed, key=lambda i: (score[i], i))[:2]
        keep = [i for i in keep if score[i] <= score[lead] + CLOSE * scale]
    return keep if len(keep) > 1 and rounds < MAX_ROUNDS else []


def scores(candidates: Sequence[Candidate], measured: Sequence[float]) -> List[float]:
    """Each candidate's measured all-reduce less what its plan predicts the backward pass
    hides."""
    return [m - c.predicted_hidden for c, m in zip(candidates, measured)]


def measure(comm, candidates: Sequence[Candidate], runs: Sequence[Callable[[], object]]
            ) -> Tuple[float, List[List[float]]]:
    """The warm-ups' seconds (traces, keys, buffers: a call each) and each candidate's timed
    calls (seconds, the slowest rank's): the warm-ups, then rounds of one call of each of
    `contenders`, in rotated order, every call after a barrier, a round's times agreed by a max
    over the ranks (the same lists on every rank). Every rank calls it at the same point,
    eagerly."""
    def timed(run) -> float:
        comm.barrier()
        start = time.perf_counter()
        out = run()
        for t in tf.nest.flatten(out)[:1]:
            t.numpy()  # finished, not just dispatched
        return time.perf_counter() - start

    warm_up = sum(timed(run) for run in runs)
    calls: List[List[float]] = [[] for _ in runs]
    going = list(range(len(runs)))
    r = 0
    while going:
        shift = r % len(going)
        mine = {i: timed(runs[i]) for i in going[shift:] + going[:shift]}
        slowest = comm.all_reduce(tf.constant(np.array([mine[i] for i in going], np.float64)),
                                  comm.all_ranks(), op="max").numpy()
        for i, seconds in zip(going, slowest):
            calls[i].append(float(seconds))
        going = contenders(candidates, calls, going)
        r += 1
    return warm_up, calls


def decide(candidates: Sequence[Candidate], measured: Sequence[float]) -> int:
    """The index of the candidate whose measured all-reduce, less what its plan predicts the
    backward pass hides, is least; the plan (the first) unless another beats it by more than
    MARGIN (two calls of one collective differ by a few percent on a quiet machine)."""
    if len(candidates) != len(measured) or not candidates:
        raise ValueError("decide() needs one measured time per candidate")
    score = scores(candidates, measured)
    best = min(range(len(score)), key=lambda i: (score[i], i))
    return best if score[best] < score[0] - MARGIN * measured[0] else 0


def check(comm, candidates: Sequence[Candidate], run_of: Callable[[Candidate], Callable],
          what: str = "the all-reduce") -> Candidate:
    """The candidate to keep: candidates[0] (the plan) untimed where it is the only one or the
    guard is off, else the fastest as `decide` judges `measure`'s times, said at INFO."""
    candidates = distinct(candidates)
    if len(candidates) < 2 or not enabled():
        return candidates[0]
    start = time.perf_counter()
    warm_up, calls = measure(comm, candidates, [run_of(c) for c in candidates])
    measured = [statistics.median(c) for c in calls]
    kept = candidates[decide(candidates, measured)]
    if comm.rank == 0:
        times = ", ".join(f"{c.name} {m * 1e3:.4g} ms ({len(n)})" + (
            f" (-{c.predicted_hidden * 1e3:.3g} ms hidden, predicted)" if c.predicted_hidden
            else "") for c, m, n in zip(candidates, measured, calls))
        verdict = ("keeping the plan" if kept is candidates[0]
                   else f"the plan is slower here: running {kept.name} instead")
        logger.info("tftorus: plan guard on %s (the slowest rank's median of the calls in "
                    "brackets; %.1f s, %.1f s of it the warm-ups): %s; %s", what,
                    time.perf_counter() - start, warm_up, times, verdict)
    return kept

