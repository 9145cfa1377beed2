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

Each level runs a small and a large all-reduce (`SMALL_BYTES`, `LARGE_BYTES`), a warm-up and
`REPEATS` timed calls each, the median kept. A ring all-reduce of m bytes over k ranks is
2(k-1) steps of m/k: t = 2(k-1) alpha + 2(k-1)/k m beta, so the two sizes give alpha (with the
call's fixed cost spread over its steps) and beta (with the summing folded in). Every rank's
timings are averaged over the world before the fit, so every rank fits the same links and plans
the same. On one host nothing is probed: the planner keeps the engine's own all-reduce there.

The timings assume a steady CPU. A CPU quota (a container's CPU limit: the kernel runs the job
until each period's share is spent, then stalls it) makes calls of milliseconds measure the
stalls instead, and the links fitted from them can be off many times over (measured:
docs/studies/planner.md). So the probe reads the quota's stall count around itself and, where a
rank was stalled, says so in the links' source and in a warning naming TFTORUS_LINKS.
"""
import dataclasses
import logging
import os
import statistics
import time
from typing import Dict, List, Optional, Sequence

from tftorus.planning import cost_model as cm
from tftorus.planning.planner import LINKS_ENV, Links, PlanError

logger = logging.getLogger(__name__)

SMALL_BYTES = 4 << 10
LARGE_BYTES = 2 << 20
REPEATS = 3
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


def probe(comm, local_size: int) -> Links:
    """Time the three levels on `comm` (every rank calls it, eagerly, at the same point) and
    fit the links; the same Links on every rank. Needs hosts of `local_size` ranks, 2+ hosts."""
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
    seconds = []
    stalls_before = throttled_periods()
    for level, group, takes_part in plan:
        for nbytes in (SMALL_BYTES, LARGE_BYTES):
            if len(group) < 2 or (level == "intra" and local_size < 2):
                seconds.append(0.0)
                continue
            buffer = tf.ones([nbytes // 4], tf.float32)
            runs = []
            if takes_part:
                comm.all_reduce(buffer, group)  # warm-up: keys resolved, buffers allocated
                for _ in range(REPEATS):
                    start = time.perf_counter()
                    comm.all_reduce(buffer, group).numpy()
                    runs.append(time.perf_counter() - start)
            seconds.append(statistics.median(runs) if runs else 0.0)
            comm.barrier()  # the levels one at a time, every rank between them
    stalls_after = throttled_periods()
    stalled = (stalls_before is not None and stalls_after is not None
               and stalls_after > stalls_before)
    # What each level took, averaged over the ranks that ran it, and how many ranks a quota
    # stalled: the same on every rank.
    mine = np.array(seconds + [1.0 if rank % local_size == 0 else 0.0, float(stalled)],
                    np.float64)
    summed = comm.all_reduce(tf.constant(mine), comm.all_ranks()).numpy()
    stalled_ranks = int(round(summed[-1]))
    summed = summed[:-1]
    takers = {"intra": size, "inter-alone": summed[-1], "inter-all": size}
    timings, i = [], 0
    for level, group, _ in plan:
        for nbytes in (SMALL_BYTES, LARGE_BYTES):
            if summed[i] > 0:
                timings.append(Timing(level, len(group), nbytes, summed[i] / takers[level]))
            i += 1
    if not stalled_ranks:
        return fit(timings, local_size)
    links = fit(timings, local_size, source=f"measured while a CPU quota stalled {stalled_ranks} "
                                            f"of {size} ranks")
    if rank == 0:
        logger.warning(
            "tftorus: a CPU quota (cgroup cpu.max / cpu.cfs_quota_us) stalled %d of %d ranks "
            "during the link probe, so its timings hold the stalls and the plan may be far from "
            "the best. Give the links instead: %s='intra=<latency>@<bandwidth>,inter=...' (the "
            "probe's line from a run without the quota prints it), or raise the quota.",
            stalled_ranks, size, LINKS_ENV)
    return links
