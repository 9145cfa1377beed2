"""The links, measured: a short probe at init() that times all-reduces on the job's own groups
and fits a latency and a bandwidth per level, for the planner (tftorus/planning/planner.py).

Three levels, each on groups every engine has from init() on (the node grid's rows and
columns: tftorus.torus.grid.hierarchical_grid):

  intra        a host's ranks (a node row), all hosts at once: latency and bandwidth inside a host
  inter-alone  the ranks of local rank 0 across the hosts (one node column) while the other
               ranks wait: one rank of a host crossing alone
  inter-all    every node column at once: every rank of a host crossing at the same time; its
               bandwidth against inter-alone's says how many ranks of a host cross at full
               speed at once (`Links.lanes`: 1 on one shared NIC, ranks per host on rails)

Each level runs a small and a large all-reduce (`SMALL_BYTES`, `LARGE_BYTES`), in rounds of
`REPEATS` calls each after a warm-up round, each rank keeping its fastest call: on a busy CPU a
call can only take longer than its link, never less. Rounds go on until one lowers no level's
best by more than `STEADY_FRACTION` (MIN_ROUNDS-MAX_ROUNDS). A ring all-reduce of m bytes over
k ranks is 2(k-1) steps of m/k: t = 2(k-1) alpha + 2(k-1)/k m beta, so the two sizes give alpha
(with the call's fixed cost spread over its steps) and beta (with the summing folded in). Every
rank's timings are averaged over the world before the fit, so every rank fits the same links and
plans the same. On one host nothing is probed: the planner keeps the engine's own all-reduce there.

What a busy CPU still does to it, and what the probe says then:
- A CPU quota (a container's CPU limit: the kernel runs the job until each period's share is
  spent, then stalls it) makes calls of milliseconds measure the stalls, and links fitted from
  them can be off many times over (docs/studies/planner.md). The probe reads the quota's stall
  count around itself and says so in the links' source and a warning naming TFTORUS_LINKS.
- Ranks sharing too few cores (the scheduler's run-queue wait, /proc/self/task/*/schedstat,
  above BUSY_SHARE of their time) read the CPU, not the link: said the same way.
- The in-host link is never taken slower than the link across hosts (`bounded_by_inter`).
The plan is then only as good as these figures, so the job times it against the fixed torus in
its first step (tftorus/runtime/plan_guard.py).
"""
import dataclasses
import logging
import math
import os
import statistics
import time
from typing import Dict, List, Optional, Sequence, Tuple

from tftorus.planning import cost_model as cm
from tftorus.planning.planner import LINKS_ENV, Links, PlanError

logger = logging.getLogger(__name__)

SMALL_BYTES = 4 << 10
LARGE_BYTES = 2 << 20
#: Calls of each size per level in a round, back to back, each rank keeping its fastest. The
#: latency rests on the small call alone (about a millisecond on a busy CPU): with one call a
#: round, two probes in one job, seconds apart, read it 1.6-1.8x apart on 2 busy cores, and the
#: plans differed by 1.11-1.22x (tests/workers/probe_stall_check.py); with these, 8 of 8 such
#: pairs planned alike.
REPEATS = {SMALL_BYTES: 4, LARGE_BYTES: 2}
#: Timed rounds: at least MIN_ROUNDS, then until a round lowers no level's best by more than
#: STEADY_FRACTION, at most MAX_ROUNDS.
MIN_ROUNDS = 3
MAX_ROUNDS = 8
STEADY_FRACTION = 0.10
#: A rank whose threads waited more than this share of their time for a core measured the CPU.
BUSY_SHARE = 0.25
LEVELS = ("intra", "inter-alone", "inter-all")


@dataclasses.dataclass(frozen=True)
class Timing:
    """One level's all-reduce of `nbytes` over groups of `members` ranks took `seconds`."""

    level: str
    members: int
    nbytes: float
    seconds: float


def _line(points: Sequence[Timing]) -> cm.Link:
    """alpha, beta of a ring all-reduce's step from its times at two or more sizes."""
    k = points[0].members
    steps, per_byte = 2 * (k - 1), 2 * (k - 1) / k
    xs = [p.nbytes for p in points]
    ys = [p.seconds for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    slope = max(slope, 1e-15)  # a bandwidth, even where noise made it look free
    intercept = max(my - slope * mx, 0.0)
    return cm.Link(alpha=intercept / steps, beta=slope / per_byte)


def fit(timings: Sequence[Timing], local_size: int, source: str = "measured") -> Links:
    """The links these timings imply, on hosts of `local_size` ranks."""
    by_level: Dict[str, List[Timing]] = {}
    for t in timings:
        if t.level not in LEVELS:
            raise PlanError(f"unknown probe level {t.level!r}; one of {LEVELS}")
        if t.members > 1:
            by_level.setdefault(t.level, []).append(t)
    for level, points in by_level.items():
        if len({p.nbytes for p in points}) < 2:
            raise PlanError(f"probe level {level!r} needs times at two sizes or more")
    if not by_level:
        raise PlanError("the probe has no timing of a group of two ranks or more")
    inter = _line(by_level.get("inter-alone") or by_level.get("inter-all")
                  or by_level["intra"])
    intra = _line(by_level["intra"]) if "intra" in by_level else inter
    lanes = 1.0
    if "inter-all" in by_level and "inter-alone" in by_level and local_size > 1:
        crowded = _line(by_level["inter-all"])
        lanes = min(float(local_size), max(1.0, local_size * inter.beta / crowded.beta))
    return Links(intra=intra, inter=inter, lanes=lanes, source=source)


def _cgroup_dirs(proc_cgroup: str, root: str) -> List[str]:
    """The cpu controller's directories of this process' cgroup and its ancestors, under the
    cgroup mount `root` (v1: root/cpu[,cpuacct]/path; v2: root/path)."""
    dirs = []
    for line in proc_cgroup.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        names = [c for c in controllers.split(",") if c]
        if names and "cpu" not in names:
            continue
        bases = ([os.path.join(root, controllers), os.path.join(root, "cpu"),
                  os.path.join(root, "cpu,cpuacct")] if names else [root])
        parts = [p for p in path.strip().split("/") if p]
        for base in dict.fromkeys(bases):
            for depth in range(len(parts), -1, -1):
                dirs.append(os.path.join(base, *parts[:depth]))
    return dirs


def throttled_periods(proc_cgroup: Optional[str] = None, root: str = "/sys/fs/cgroup"
                      ) -> Optional[int]:
    """How many periods a CPU quota has stalled this process' cgroup or an ancestor so far (the
    `nr_throttled` of their cpu.stat, summed); None where no cpu.stat can be read."""
    if proc_cgroup is None:
        try:
            with open("/proc/self/cgroup") as f:
                proc_cgroup = f.read()
        except OSError:
            return None
    total, found = 0, False
    # v1's cpu and cpu,cpuacct are often one directory under two names: count it once
    for directory in dict.fromkeys(os.path.realpath(d) for d in _cgroup_dirs(proc_cgroup, root)):
        try:
            with open(os.path.join(directory, "cpu.stat")) as f:
                stat = dict(line.split()[:2] for line in f if len(line.split()) >= 2)
        except OSError:
            continue
        if "nr_throttled" in stat:
            total, found = total + int(stat["nr_throttled"]), True
    return total if found else None


def cpu_wait() -> Optional[Tuple[float, float]]:
    """(seconds run, seconds waited for a core) by this process' threads so far, from the
    scheduler's per-thread accounting (/proc/self/task/*/schedstat); None where unreadable."""
    run = wait = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                fields = f.read().split()
            run, wait = run + int(fields[0]), wait + int(fields[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return run / 1e9, wait / 1e9


def steady(previous: Sequence[float], now: Sequence[float]) -> bool:
    """Whether a round of timings lowered no level's best by more than STEADY_FRACTION."""
    return all(n >= p * (1 - STEADY_FRACTION) for p, n in zip(previous, now)
               if math.isfinite(p) and p > 0)


def bounded_by_inter(links: Links) -> Links:
    """The in-host link never slower than the link across hosts: whatever crosses hosts is
    copied through the host first, so an in-host figure below the cross-host one is the CPU's
    contention, not the link (measured: 8 ranks on 2 cores read their in-host link within 1.6x
    of a 0.25 Gbit/s wire)."""
    intra, inter = links.intra, links.inter
    if intra.beta <= inter.beta and intra.alpha <= inter.alpha:
        return links
    bounded = cm.Link(alpha=min(intra.alpha, inter.alpha), beta=min(intra.beta, inter.beta))
    return dataclasses.replace(links, intra=bounded,
                               source=links.source + ", in-host link taken as fast as across")


def probe(comm, local_size: int) -> Links:
    """Time the three levels on `comm` (every rank calls it, eagerly, at the same point) and
    fit the links; the same Links on every rank. Needs hosts of `local_size` ranks, 2+ hosts.

    Rounds of REPEATS calls per level and size, after a warm-up round, each rank keeping its
    fastest call (CPU stalls only add), until a round lowers no best by more than
    STEADY_FRACTION (every rank agreeing: one tiny all-reduce) or MAX_ROUNDS."""
    import numpy as np
    import tensorflow as tf

    from tftorus.torus.grid import hierarchical_grid

    size, rank = comm.size, comm.rank
    grid = hierarchical_grid(size, local_size)
    if grid.y < 2:
        raise PlanError("the link probe needs two hosts or more; on one host there is nothing "
                        "to plan (the engine's own all-reduce)")
    row, col = grid.row_group(rank), grid.col_group(rank)
    plan = [("intra", row, True), ("inter-alone", col, rank % local_size == 0),
            ("inter-all", col, True)]
    calls = [(level, group, takes_part, nbytes) for level, group, takes_part in plan
             for nbytes in (SMALL_BYTES, LARGE_BYTES)
             if len(group) >= 2 and not (level == "intra" and local_size < 2)]
    buffers = {n: tf.ones([n // 4], tf.float32) for n in (SMALL_BYTES, LARGE_BYTES)}

    def one_round() -> List[float]:
        seconds = []
        for _, group, takes_part, nbytes in calls:
            took = math.inf
            for _ in range(REPEATS[nbytes] if takes_part else 0):
                start = time.perf_counter()
                comm.all_reduce(buffers[nbytes], group).numpy()
                took = min(took, time.perf_counter() - start)
            seconds.append(took)
            comm.barrier()  # the levels one at a time, every rank between them
        return seconds

    stalls_before, cpu_before = throttled_periods(), cpu_wait()
    one_round()  # warm-up: keys resolved, buffers allocated
    best = [math.inf] * len(calls)
    rounds = 0
    while True:
        previous = list(best)
        best = [min(b, t) for b, t in zip(best, one_round())]
        rounds += 1
        if rounds >= MAX_ROUNDS:
            break
        if rounds >= MIN_ROUNDS:
            unsteady = 0.0 if steady(previous, best) else 1.0
            if comm.all_reduce(tf.constant([unsteady]), comm.all_ranks(), op="max").numpy()[0] == 0:
                break
    stalls_after, cpu_after = throttled_periods(), cpu_wait()
    stalled = (stalls_before is not None and stalls_after is not None
               and stalls_after > stalls_before)
    waited = 0.0
    if cpu_before is not None and cpu_after is not None:
        ran, queued = (a - b for a, b in zip(cpu_after, cpu_before))
        waited = queued / (ran + queued) if ran + queued > 0 else 0.0
    # What each level took, averaged over the ranks that ran it, how many ranks a quota
    # stalled, and the largest share of its time a rank waited for a core: the same on every rank.
    mine = np.array([b if math.isfinite(b) else 0.0 for b in best]
                    + [1.0 if rank % local_size == 0 else 0.0, float(stalled)], np.float64)
    summed = comm.all_reduce(tf.constant(mine), comm.all_ranks()).numpy()
    waited = float(comm.all_reduce(tf.constant([waited], tf.float64), comm.all_ranks(),
                                   op="max").numpy()[0])
    stalled_ranks = int(round(summed[-1]))
    summed = summed[:-1]
    takers = {"intra": size, "inter-alone": summed[-1], "inter-all": size}
    timings = [Timing(level, len(group), nbytes, summed[i] / takers[level])
               for i, (level, group, _, nbytes) in enumerate(calls) if summed[i] > 0]
    notes = []
    if stalled_ranks:
        notes.append(f"while a CPU quota stalled {stalled_ranks} of {size} ranks")
    if waited > BUSY_SHARE:
        notes.append(f"on busy cores (a rank's threads waited {waited:.0%} of their time for "
                     f"one)")
    if rounds >= MAX_ROUNDS:
        notes.append(f"unsteady after {rounds} rounds")
    source = "measured" + (" " + ", ".join(notes) if notes else "")
    links = bounded_by_inter(fit(timings, local_size, source=source))
    if rank == 0 and stalled_ranks:
        logger.warning(
            "tftorus: a CPU quota (cgroup cpu.max / cpu.cfs_quota_us) stalled %d of %d ranks "
            "during the link probe, so its timings hold the stalls and the plan may be far from "
            "the best. Give the links instead: %s='intra=<latency>@<bandwidth>,inter=...' (the "
            "probe's line from a run without the quota prints it), or raise the quota.",
            stalled_ranks, size, LINKS_ENV)
    elif rank == 0 and notes:
        logger.warning(
            "tftorus: the link probe measured %s, so its links may be the CPU's, not the "
            "network's; the plan is timed against the fixed torus in the first step (the plan "
            "guard), and %s gives the links without the probe.", ", ".join(notes), LINKS_ENV)
    return links
