"""The planner (tftorus/planning/planner.py) judged by the simulator (studies/simulated_cluster.py).

    python -m studies.planner_sweep             # ABCI and a rail-optimized H100 cluster, ~2 min
    python -m studies.planner_sweep --quick     # 64 and 256 GPUs, FP16, compact only

For ResNet-50's gradients (FP16 and FP32 wires, the optimizer's order), on ABCI
(simulated_cluster.abci) and a DGX H100 SuperPOD-like cluster (simulated_cluster.rails: 8 GPUs
and 8 NICs per node, rail-optimized non-blocking fat tree), at 64 to 4,096 GPUs, placed compact
and scattered, on the tf engine (collectives of different groups at once: torus chunks pipeline)
and the Horovod engine (one after the other, no chunks), each row compares:

  best     planner.plan with the simulator's costs (SimulatedCosts): every grid, fusion
           threshold, per-bucket algorithm and chunk count tried against simulated times. The
           grids are the divisors X with X >= 2 and Y >= 2 (plus plan_grid's): a grid of one row
           or one column only runs the ring, whose time does not depend on the grid, so nothing
           is lost.
  planner  what a real job would run: the links a simulated link probe measures on that
           cluster and placement (link_probe.fit of the same all-reduces link_probe.probe
           times), planner.plan with its own cost model (ModelCosts), that plan's time under the
           simulator's costs (planner.evaluate).
  fixed    the rules before the planner: plan_grid's grid, 16 MiB buckets, torus, on the tf
           engine one chunk per MiB up to 16 (algorithms.pipeline_chunks), on Horovod none.
  paper    the paper's one fused buffer, torus on Table 4's grid (PAPER_GRIDS, else plan_grid),
           no chunks.

The training step (second table): step = forward + backward (COMPUTE_SECONDS, 48.2 ms: 32
images per V100 at every size, as Table 6; studies.cost_calibration.StepModel) + the
communication exposed after the backward pass (planner.evaluate with a StepProfile), on the
simulator's costs. ResNet-50's gradients are ready as studies/step_profile.py's FLOP model says
(a model, not a measurement; optimistic: see its docstring). Per row:

  best step          planner.plan on SimulatedCosts with the profile: the exhaustive best step
  first steps        the runtime's plan before it has clocked a step (the "planner" column:
                     made without a profile), its step with the profile
  planner            the runtime's plan after tftorus.replan() (ReplanCallback in fit):
                     planner.plan on the probe's links and ModelCosts with the profile as
                     the step's clocks measure it (ready times after the first gradient's;
                     measured_profile)
  paper              the one buffer: ready when the backward pass ends, nothing hidden
  eff                compute / step

Then Table 6 with and without overlap: ABCI, compact, FP16 at the paper's sizes on its Table 4
grids, images/s = N x 32 / step and the paper's efficiency (against 2,565 img/s x N / 4);
without overlap every bucket is ready at the end of the backward pass, with it at the
profile's times.

SimulatedCosts: each phase of each (algorithm, grid) is simulated at LOW_BYTES and HIGH_BYTES
of the whole buffer and taken as affine in bytes between them (a fixed flow pattern under
SimGrid's max-min sharing: latency + bytes / share); the claim is checked against direct
simulations at CHECK_BYTES and the worst deviation printed. Every phase adds the cost model's
per-collective `per_op` and summing `gamma` (cm.abci_params, on both clusters, as
simulated_cluster does). Buckets and chunks are put on the engine's queues by planner.timeline,
as the planner's own costs are: on the tf engine a chunk's column beside the next chunk's row
phases (each phase as simulated alone: no contention between the phases that overlap,
optimistic as simulated_cluster.pipelined); on Horovod's one after the other.

Every world's simulations run as one batch (identical steps simulated once; the row
reduce-scatter and all-gather share theirs). Exits 77 where SimGrid is missing.
"""
import argparse
import dataclasses
import math
import sys
import time
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence, Tuple

from studies import cost_calibration as calib
from studies import simulated_cluster as sc
from studies import step_profile
from tftorus.planning import cost_model as cm
from tftorus.planning import link_probe, planner
from tftorus.torus.fusion import bucket_indices
from tftorus.torus.grid import PAPER_GRIDS, TorusGrid, divisors, hierarchical_grid, plan_grid

MIB = 1 << 20
LOW_BYTES, HIGH_BYTES = 1 * MIB, 64 * MIB
#: Direct simulations the affine interpolation is checked against: inside the range, and
#: below it (the planner asks for chunks and small buckets of a few hundred KiB).
CHECK_BYTES = (8 * MIB, 128 << 10)
SIZES = (64, 256, 1024, 2048, 3456, 4096)
QUICK_SIZES = (64, 256)
PLACEMENTS = ("compact", "scattered")
WIRES = {"fp16": 2, "fp32": 4}
ENGINES = {"tf": planner.Engine(concurrent_groups=True),
           # NCCL on GPUs: Horovod's loop enqueues a collective and goes on, so the columns do
           # not wait for each other as with Gloo (planner.IN_TURN_MAX_BUCKET_BYTES)
           "horovod": planner.Engine(concurrent_groups=False)}
FIXED_THRESHOLD = 16 * MIB
WITHIN = 0.03
CLUSTERS = ("abci", "rails")
#: Compute per step (forward + backward, s): 32 images per V100 at every size, as in Table 6
#: (studies.cost_calibration.StepModel).
COMPUTE_SECONDS = step_profile.COMPUTE_SECONDS
#: The "Table 6 with and without overlap" worlds: ABCI, compact, FP16, the paper's sizes.
TABLE6_WORLD = ("abci", "compact", "fp16")
TABLE6_SIZES = tuple(sorted(calib.PAPER_TABLE6_EFFICIENCY))


def cluster_spec(name: str) -> sc.ClusterSpec:
    return {"abci": sc.abci, "rails": sc.rails}[name](name)


# ==================================================================================================
# Simulation in batches
# ==================================================================================================

class Batch:
    """Ring steps to simulate, collected and run together; identical steps (same cluster, flows
    and bytes) are simulated once."""

    def __init__(self, platform: sc.Platform):
        self.platform = platform
        self._index: Dict[tuple, int] = {}
        self._times: List[float] = []
        self._pending: List[sc.StepJob] = []
        self.simulated = 0

    def add(self, cluster: str, phase: sc.SimPhase, gpus: Sequence[int]) -> tuple:
        job = sc.StepJob(cluster, sc.step_flows(phase, gpus), max(1, int(round(phase.chunk))))
        key = (job.cluster, job.flows, job.nbytes)
        if key not in self._index:
            self._index[key] = len(self._times) + len(self._pending)
            self._pending.append(job)
        return key

    def run(self) -> None:
        if self._pending:
            self._times.extend(self.platform.run_steps(self._pending))
            self.simulated += len(self._pending)
            self._pending = []

    def step_seconds(self, key: tuple) -> float:
        i = self._index[key]
        if i >= len(self._times):
            self.run()
        return self._times[i]


class World:
    """One job on one cluster: its ranks' GPUs, and the batch its simulations go to."""

    def __init__(self, batch: Batch, cluster: str, spec: sc.ClusterSpec, size: int, how: str,
                 seed: int = 0, params: Optional[cm.Params] = None):
        self.batch, self.cluster, self.size, self.how = batch, cluster, size, how
        self.local_size = spec.node.gpus
        self.gpus = sc.placement(spec, size, how, seed)
        params = params or cm.abci_params()
        self.per_op, self.gamma = params.per_op, params.gamma

    def request(self, phase: sc.SimPhase):
        """A phase to simulate; returns what `seconds` takes once the batch has run."""
        return phase, self.batch.add(self.cluster, phase, self.gpus)

    def seconds(self, requested) -> float:
        phase, key = requested
        return (phase.steps * self.batch.step_seconds(key) + self.per_op
                + phase.reduced_bytes * self.gamma)


# ==================================================================================================
# The planner's costs, from the simulator
# ==================================================================================================

class SimulatedCosts:
    """planner's cost provider (`seconds(algorithm, grid, nbytes, chunks, concurrent)`) answered
    from SimGrid: every phase affine in bytes through its simulated times at LOW_BYTES and
    HIGH_BYTES. `request` queues (algorithm, grid)s for the world's batch; anything asked for
    later is simulated on demand."""

    def __init__(self, world: World):
        self.world = world
        self._requested: Dict[tuple, tuple] = {}
        self._lines: Dict[tuple, List[Tuple[float, float]]] = {}
        self._memo: Dict[tuple, float] = {}

    def _key(self, algorithm: str, grid: TorusGrid) -> tuple:
        if algorithm == "ring":
            return ("ring", 1)  # the world's ring: the grid does not matter
        if algorithm == "hierarchical":
            return ("hierarchical", self.world.local_size)
        return (algorithm, grid.x)

    def _grid(self, algorithm: str, grid: TorusGrid) -> TorusGrid:
        if algorithm == "hierarchical":
            return hierarchical_grid(self.world.size, self.world.local_size)
        return grid

    def phases_at(self, algorithm: str, grid: TorusGrid, nbytes: float) -> list:
        """The phases of one all-reduce of `nbytes`, queued for simulation."""
        g = self._grid(algorithm, grid)
        return [self.world.request(p)
                for p in sc.phases(algorithm, g, nbytes, self.world.local_size)]

    def request(self, algorithm: str, grid: TorusGrid) -> None:
        key = self._key(algorithm, grid)
        if key not in self._requested:
            self._requested[key] = (self.phases_at(algorithm, grid, LOW_BYTES),
                                    self.phases_at(algorithm, grid, HIGH_BYTES))

    def request_grids(self, grids: Sequence[TorusGrid]) -> None:
        for g in grids:
            for a in planner.candidate_algorithms(g, self.world.local_size):
                self.request(a, g)

    def lines(self, algorithm: str, grid: TorusGrid) -> List[Tuple[float, float]]:
        """(seconds at 0 bytes, seconds per byte) of each phase."""
        key = self._key(algorithm, grid)
        if key not in self._lines:
            self.request(algorithm, grid)
            low, high = self._requested[key]
            out = []
            for lo, hi in zip(low, high):
                t0, t1 = self.world.seconds(lo), self.world.seconds(hi)
                slope = (t1 - t0) / (HIGH_BYTES - LOW_BYTES)
                out.append((t0 - slope * LOW_BYTES, slope))
            self._lines[key] = out
        return self._lines[key]

    def phase_seconds(self, algorithm: str, grid: TorusGrid, nbytes: float) -> List[float]:
        return [a + b * nbytes for a, b in self.lines(algorithm, grid)]

    def seconds(self, algorithm: str, grid: TorusGrid, nbytes: float, chunks: int,
                concurrent: bool) -> float:
        memo = (self._key(algorithm, grid), nbytes, chunks, concurrent)
        if memo not in self._memo:  # one bucket alone, as the planner's own costs answer it
            self._memo[memo] = planner.timeline(self, grid, [(algorithm, nbytes, chunks, 0.0)],
                                                concurrent)
        return self._memo[memo]


# ==================================================================================================
# The link probe, simulated
# ==================================================================================================

def probe_phases(world: World) -> List[Tuple[str, int, float, tuple]]:
    """(level, members, bytes, queued phase) of exactly what link_probe.probe times: ring
    all-reduces on the node grid's rows, on the local-rank-0 column alone, on every column at
    once, at SMALL_BYTES and LARGE_BYTES."""
    grid = hierarchical_grid(world.size, world.local_size)
    levels = [("intra", grid.rows()), ("inter-alone", grid.cols()[:1]),
              ("inter-all", grid.cols())]
    out = []
    for level, groups in levels:
        if len(groups[0]) < 2:
            continue
        for nbytes in (link_probe.SMALL_BYTES, link_probe.LARGE_BYTES):
            phase = sc.SimPhase(level, tuple(groups), float(nbytes), "all-reduce")
            out.append((level, len(groups[0]), float(nbytes), world.request(phase)))
    return out


def probed_links(world: World, queued) -> planner.Links:
    timings = [link_probe.Timing(level, members, nbytes, world.seconds(req))
               for level, members, nbytes, req in queued]
    return link_probe.fit(timings, world.local_size, source="simulated probe")


# ==================================================================================================
# Plans
# ==================================================================================================

@dataclasses.dataclass
class Outcome:
    seconds: float
    what: str


def describe(p: planner.Plan) -> str:
    thr = "one" if p.threshold_bytes == planner.ONE_BUFFER else f"{p.threshold_bytes // MIB}M"
    algos = "/".join(sorted({b.algorithm[:4] for b in p.buckets}))
    chunks = sorted({b.chunks for b in p.buckets})
    text = f"{p.grid} {thr} {algos}"
    if chunks != [1]:
        text += " k" + "/".join(map(str, chunks))
    return text


def search_grids(size: int, local_size: int) -> List[TorusGrid]:
    xs = {x for x in divisors(size) if x >= 2 and size // x >= 2}
    xs.add(plan_grid(size, local_size).x)
    return [TorusGrid(size=size, x=x) for x in sorted(xs)]


def paper_grid(size: int, local_size: int) -> TorusGrid:
    if size in PAPER_GRIDS:
        return TorusGrid(size=size, x=PAPER_GRIDS[size][1])
    return plan_grid(size, local_size)


def fixed_rule_chunks(grid: TorusGrid, local_size: int, nbytes: int, wire: str,
                      engine: planner.Engine) -> int:
    """algorithms.pipeline_chunks' rule (the tf engine sums FP32 columns in rank order)."""
    import tensorflow as tf

    from tftorus.torus import algorithms
    comm = SimpleNamespace(local_size=local_size, size=grid.size,
                           concurrent_groups=engine.concurrent_groups, rank_ordered_sums=True)
    dtype = {"fp16": tf.float16, "fp32": tf.float32}[wire]
    return algorithms.pipeline_chunks("torus", grid, comm, int(nbytes), dtype=dtype)


def fixed_rules(costs: SimulatedCosts, tensors, wire: str, engine: planner.Engine) -> Outcome:
    world = costs.world
    grid = plan_grid(world.size, world.local_size)
    total, ks = 0.0, set()
    for indices in bucket_indices(tensors, FIXED_THRESHOLD):
        nbytes = sum(tensors[i][0] for i in indices)
        k = fixed_rule_chunks(grid, world.local_size, nbytes, wire, engine)
        ks.add(k)
        total += costs.seconds("torus", grid, nbytes, k, engine.concurrent_groups)
    ks = sorted(ks)
    return Outcome(total, f"{grid} 16M torus" + ("" if ks == [1] else
                                                  " k" + "/".join(map(str, ks))))


def paper_torus(costs: SimulatedCosts, tensors, engine: planner.Engine) -> Outcome:
    world = costs.world
    grid = paper_grid(world.size, world.local_size)
    nbytes = sum(b for b, _ in tensors)
    return Outcome(costs.seconds("torus", grid, nbytes, 1, engine.concurrent_groups),
                   f"{grid} one torus")


# ==================================================================================================
# The sweep
# ==================================================================================================

def tensor_sets(wires: Sequence[str], shapes=None) -> Dict[str, List[Tuple[int, str]]]:
    """ResNet-50's gradients as (bytes, wire) in the optimizer's (forward) order."""
    if shapes is None:
        from studies.benchmark_allreduce import resnet50_shapes
        shapes = resnet50_shapes()
    return {w: [(math.prod(s) * WIRES[w], w) for s in shapes] for w in wires}


@dataclasses.dataclass
class Row:
    cluster: str
    how: str
    size: int
    wire: str
    engine: str
    best: Outcome
    planner: Outcome
    fixed: Outcome
    paper: Outcome
    links: str = ""
    step: Optional["StepRow"] = None
    table6: Optional["Table6Row"] = None

    @property
    def miss(self) -> float:
        return self.planner.seconds / self.best.seconds - 1


@dataclasses.dataclass
class StepRow:
    """One row's training step (s): compute + the communication exposed after the backward
    pass (planner.evaluate with the profile, on the simulator's costs)."""
    compute: float
    best: Outcome  # planner.plan on simulated costs with the profile: the exhaustive best step
    default: Outcome  # the runtime's plan (made without a profile)
    profiled: Outcome  # planner.plan on the probe's links with the profile
    paper: Outcome  # one buffer, ready at the end of the backward pass
    first_plan: Optional[planner.Plan] = None  # `default`'s plan, for print_first_plan_hedge
    local_size: int = 0  # the world's ranks per host

    def miss(self, variant: str) -> float:
        return getattr(self, variant).seconds / self.best.seconds - 1


@dataclasses.dataclass
class Table6Row:
    """Step seconds on the paper's Table 4 grid, per variant: (without overlap: every bucket
    ready at the end of the backward pass, with overlap: the profile)."""
    grid: str
    steps: Dict[str, Tuple[float, float]]


def sweep_worlds(platform: sc.Platform, clusters: Sequence[str], sizes: Sequence[int],
                 placements: Sequence[str], tensors: Dict[str, list],
                 engines: Sequence[str] = tuple(ENGINES), seed: int = 0,
                 check: bool = True, profile: Optional[planner.StepProfile] = None
                 ) -> Tuple[List[Row], List[tuple], dict]:
    """Rows of the comparison, the interpolation checks (cluster, how, size, algorithm, grid,
    bytes, interpolated, simulated), and counts. With `profile` (the backward pass's gradient
    readiness, planner.StepProfile) every row has its training step too (Row.step), and the
    TABLE6_WORLD rows at TABLE6_SIZES the paper's grid with and without overlap (Row.table6)."""
    batch = Batch(platform)
    worlds = []
    for cluster in clusters:
        spec = platform.specs[cluster]
        for how in placements:
            for size in sizes:
                if size > spec.gpus or size <= spec.node.gpus:
                    continue
                world = World(batch, cluster, spec, size, how, seed)
                costs = SimulatedCosts(world)
                grids = search_grids(size, world.local_size)
                costs.request_grids(grids)
                costs.request_grids([paper_grid(size, world.local_size)])
                probe = probe_phases(world)
                checks = []
                if check:
                    pg = plan_grid(size, world.local_size)
                    for a in planner.candidate_algorithms(pg, world.local_size):
                        for n in CHECK_BYTES:
                            checks.append((a, pg, n, costs.phases_at(a, pg, n)))
                worlds.append((world, costs, probe, checks))
    batch.run()  # every world's phases, probes and checks in one simulation
    rows, checked = [], []
    for world, costs, probe, checks in worlds:
        for a, g, n, queued in checks:
            direct = [world.seconds(q) for q in queued]
            for t_lin, t_sim in zip(costs.phase_seconds(a, g, n), direct):
                checked.append((world.cluster, world.how, world.size, a, g, n, t_lin, t_sim))
        links = probed_links(world, probe)
        grids = search_grids(world.size, world.local_size)
        for wire, ts in tensors.items():
            for ename in engines:
                engine = ENGINES[ename]
                best = planner.plan(world.size, world.local_size, ts, links, engine,
                                    grids=grids, costs=costs)
                mine = planner.plan(world.size, world.local_size, ts, links, engine)
                mine_s, _ = planner.evaluate(mine, costs, engine)
                row = Row(world.cluster, world.how, world.size, wire, ename,
                          Outcome(best.seconds, describe(best)), Outcome(mine_s, describe(mine)),
                          fixed_rules(costs, ts, wire, engine), paper_torus(costs, ts, engine),
                          links.spec())
                if profile is not None:
                    first = planner.first_plan(world.size, world.local_size, ts, links, engine)
                    row.step = training_step(world, costs, ts, links, engine, grids, first,
                                             row.paper, profile)
                    if ((world.cluster, world.how, wire) == TABLE6_WORLD
                            and world.size in TABLE6_SIZES):
                        row.table6 = table6_row(world, costs, ts, links, engine, profile)
                rows.append(row)
    return rows, checked, {"steps simulated": batch.simulated}


def training_step(world: World, costs: SimulatedCosts, ts, links: planner.Links,
                  engine: planner.Engine, grids, default: planner.Plan, paper: Outcome,
                  profile: planner.StepProfile) -> StepRow:
    """The step of each variant: compute + exposed communication on the simulator's costs."""
    compute = COMPUTE_SECONDS
    best = planner.plan(world.size, world.local_size, ts, links, engine, grids=grids,
                        costs=costs, profile=profile)
    profiled = planner.plan(world.size, world.local_size, ts, links, engine,
                            profile=measured_profile(profile))

    def step(p: planner.Plan) -> Outcome:
        return Outcome(compute + planner.evaluate(p, costs, engine, profile)[1], describe(p))

    return StepRow(compute, Outcome(compute + best.exposed_seconds, describe(best)),
                   step(default), step(profiled),
                   Outcome(compute + paper.seconds, paper.what), default, world.local_size)


def table6_row(world: World, costs: SimulatedCosts, ts, links: planner.Links,
               engine: planner.Engine, profile: planner.StepProfile) -> Table6Row:
    """On the paper's grid: the one buffer, the runtime's plan (no profile), the planner with
    the profile, and the exhaustive best (of the all-reduce without overlap, of the exposed
    time with it); without overlap every bucket is ready when the backward pass ends."""
    grid = paper_grid(world.size, world.local_size)
    compute = COMPUTE_SECONDS

    def both(p: planner.Plan) -> Tuple[float, float]:
        alone, exposed = planner.evaluate(p, costs, engine, profile)
        return compute + alone, compute + exposed

    common = {"grid": grid}
    one = planner.plan(world.size, world.local_size, ts, links, engine, grid=grid,
                       threshold_bytes=planner.ONE_BUFFER, algorithm="torus", chunks=1)
    default = planner.first_plan(world.size, world.local_size, ts, links, engine, **common)
    profiled = planner.plan(world.size, world.local_size, ts, links, engine,
                            profile=measured_profile(profile),
                            **common)
    best_ar = planner.plan(world.size, world.local_size, ts, links, engine, costs=costs, **common)
    best_step = planner.plan(world.size, world.local_size, ts, links, engine, costs=costs,
                             profile=profile, **common)
    return Table6Row(str(grid), {
        "paper one buffer": both(one),
        "first steps": both(default),
        "planner (after replan)": both(profiled),
        "best": (both(best_ar)[0], both(best_step)[1]),
    })


def run_clusters(clusters: Sequence[str], sizes, placements, tensors, engines, seed,
                 profile: Optional[planner.StepProfile] = None) -> tuple:
    """These clusters in one platform (SimGrid allows one engine per process: a worker process
    runs one cluster, or this process runs them all)."""
    start = time.perf_counter()
    platform = sc.RailsPlatform([cluster_spec(c) for c in clusters])
    built = time.perf_counter() - start
    rows, checked, counts = sweep_worlds(platform, clusters, sizes, placements, tensors,
                                         engines, seed, profile=profile)
    counts.update({"platform s": built, "total s": time.perf_counter() - start})
    return rows, checked, counts


# ==================================================================================================
# Output
# ==================================================================================================

def ms(t: float) -> str:
    return f"{t * 1e3:.2f}"


def print_rows(rows: Sequence[Row]) -> None:
    print("| cluster | placement | GPUs | wire | engine | best ms (grid, buckets, algorithm, "
          "chunks) | planner ms (its choice) | planner / best - 1 | fixed rules ms | "
          "one-buffer paper torus ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        flag = " **" if r.miss > WITHIN else ""
        print(f"| {r.cluster} | {r.how} | {r.size} | {r.wire} | {r.engine} | "
              f"{ms(r.best.seconds)} ({r.best.what}) | {ms(r.planner.seconds)} "
              f"({r.planner.what}) | {r.miss:+.1%}{flag} | {ms(r.fixed.seconds)} "
              f"({r.fixed.what}) | {ms(r.paper.seconds)} ({r.paper.what}) |")
    print()


def print_summary(rows: Sequence[Row]) -> None:
    within = sum(r.miss <= WITHIN for r in rows)
    worst = sorted(rows, key=lambda r: -r.miss)[:3]
    print(f"**{within} of {len(rows)} rows within {WITHIN:.0%} of the best**; worst: " + "; ".join(
        f"{r.cluster} {r.how} {r.size} {r.wire} {r.engine} {r.miss:+.1%}" for r in worst))
    fixed_worse = [r.fixed.seconds / r.best.seconds - 1 for r in rows]
    paper_worse = [r.paper.seconds / r.best.seconds - 1 for r in rows]
    print(f"\nAgainst the best: fixed rules {min(fixed_worse):+.0%} to {max(fixed_worse):+.0%}, "
          f"one-buffer paper torus {min(paper_worse):+.0%} to {max(paper_worse):+.0%}.\n")


STEP_VARIANTS = {"default": "first steps (no profile yet)",
                 "profiled": "planner (after replan: the step's clocks)"}


def measured_profile(profile: planner.StepProfile) -> planner.StepProfile:
    """The profile as tftorus/runtime/gradient_readiness.py's clocks give it at run time: ready times after the
    first gradient's, the backward pass first to last gradient."""
    first = min(profile.ready)
    return planner.StepProfile(tuple(r - first for r in profile.ready),
                               max(profile.ready) - first)


def print_steps(rows: Sequence[Row]) -> None:
    print("| cluster | placement | GPUs | wire | engine | best step ms (its plan) | eff % | "
          "first steps ms (vs best) | planner ms, after replan (its plan; vs best) | "
          "paper one buffer ms | paper eff % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r.step
        if s is None:
            continue

        def vs(variant):
            miss = s.miss(variant)
            return f"{miss:+.1%}" + (" **" if miss > WITHIN else "")

        print(f"| {r.cluster} | {r.how} | {r.size} | {r.wire} | {r.engine} | "
              f"{ms(s.best.seconds)} ({s.best.what}) | {100 * s.compute / s.best.seconds:.1f} | "
              f"{ms(s.default.seconds)} ({vs('default')}) | {ms(s.profiled.seconds)} "
              f"({s.profiled.what}; {vs('profiled')}) | {ms(s.paper.seconds)} | "
              f"{100 * s.compute / s.paper.seconds:.1f} |")
    print()


def print_step_summary(rows: Sequence[Row]) -> Dict[str, int]:
    """The step against the best step and the paper's one buffer; returns the counts of rows
    slower than the one buffer per variant (must be 0)."""
    stepped = [r for r in rows if r.step is not None]
    slower = {}
    for variant, name in STEP_VARIANTS.items():
        misses = sorted(stepped, key=lambda r: -r.step.miss(variant))
        within = sum(r.step.miss(variant) <= WITHIN for r in stepped)
        worse = [r for r in stepped if getattr(r.step, variant).seconds
                 > r.step.paper.seconds * (1 + 1e-9)]
        slower[variant] = len(worse)
        print(f"**{name}: {within} of {len(stepped)} rows' steps within {WITHIN:.0%} of the "
              f"best step**; worst: " + "; ".join(
                  f"{r.cluster} {r.how} {r.size} {r.wire} {r.engine} {r.step.miss(variant):+.1%}"
                  for r in misses[:3]) + f". Slower than the one-buffer paper step: {len(worse)}"
              + (" (" + "; ".join(
                  f"{r.cluster} {r.how} {r.size} {r.wire} {r.engine} by "
                  f"{getattr(r.step, variant).seconds / r.step.paper.seconds - 1:+.2%}"
                  for r in worse) + ")" if worse else "") + ".\n")
    gains = [r.step.paper.seconds / r.step.best.seconds - 1 for r in stepped]
    if gains:
        print(f"The one-buffer paper step against the best step: {min(gains):+.1%} to "
              f"{max(gains):+.1%}.\n")
    return slower


def print_first_plan_hedge(rows: Sequence[Row], tensors: Dict[str, list],
                           profile: planner.StepProfile) -> None:
    """Why the first steps' plan misses where it misses most: on that row's links and its first
    plan's grid, the cost model's exposed communication per bucket size under each backward pass
    first_plan assumes and under the clocked profile, and the worst regret first_plan weighs."""
    stepped = [r for r in rows if r.step is not None and r.step.first_plan is not None]
    if not stepped:
        return
    r = max(stepped, key=lambda row: row.step.miss("default"))
    size, local = r.size, r.step.local_size
    ts, engine, links = tensors[r.wire], ENGINES[r.engine], planner.Links.parse(r.links)
    grid = r.step.first_plan.grid
    costs = planner.ModelCosts(links.cost_model(local), local)
    assumed, regrets_of = planner.assumed_regrets(size, local, ts, links, engine, costs)
    alone_s = assumed[0].backward_seconds / planner.ASSUMED_BACKWARDS[0]
    clocked = measured_profile(profile)
    fs = " / ".join(f"{f:g}x" for f in planner.ASSUMED_BACKWARDS)
    print(f"### Why the first steps miss most at {r.cluster} {r.how} {size} {r.wire} {r.engine}\n")
    print(f"The cost model on that row's links (`{r.links}`), the first plan's grid {grid}: the "
          f"communication exposed after the backward pass, ms, for backward passes {fs} the "
          f"all-reduce alone ({ms(alone_s)} ms; first_plan's assumptions), the step's "
          f"regret against the best plan under each, and with the backward pass the clocks "
          f"measure ({ms(clocked.backward_seconds)} ms; what replan() plans for).\n")
    print(f"| buckets | exposed ms ({fs}) | step / best step ({fs}) | worst | exposed ms, "
          f"clocked |")
    print("|---|---|---|---|---|")
    for th in (8 * MIB, 16 * MIB, 32 * MIB, 64 * MIB, planner.ONE_BUFFER):
        p = planner.plan(size, local, ts, links, engine, grid=grid, threshold_bytes=th,
                         costs=costs)
        exposed = [planner.evaluate(p, costs, engine, a)[1] for a in assumed]
        regrets = regrets_of(p)
        name = "one" if th == planner.ONE_BUFFER else f"{th // MIB} MiB"
        print(f"| {name} ({len(p.buckets)}) | " + " / ".join(ms(e) for e in exposed)
              + " | " + " / ".join(f"{g:.3f}" for g in regrets)
              + f" | {max(regrets):.3f} | {ms(planner.evaluate(p, costs, engine, clocked)[1])} |")
    print()


def print_table6(rows: Sequence[Row]) -> None:
    t6 = [r for r in rows if r.table6 is not None]
    if not t6:
        return
    base = calib.PAPER_TABLE6[4] / 4  # images/s per GPU at Table 6's 4-GPU point
    variants = list(t6[0].table6.steps)
    print(f"## Table 6 with and without overlap ({' '.join(TABLE6_WORLD)}, the paper's Table 4 "
          f"grids)\n")
    print(f"Images/s = N x {calib.PAPER_BATCH_PER_GPU} / step, efficiency = images/s / "
          f"({calib.PAPER_TABLE6[4]:,} x N / 4) (Table 6's 4-GPU point). Without overlap every "
          "bucket is ready when the backward pass ends; with overlap at the profile's times "
          "(studies/step_profile.py). Cells: images/s (efficiency %), without / with overlap (one "
          "value where they are equal). The compute, 48.2 ms, is Table 6's 4-GPU step (49.90 ms) "
          "less its own all-reduce, so a step that hides all of it reaches "
          f"{100 * calib.PAPER_BATCH_PER_GPU / (base * COMPUTE_SECONDS):.1f} %.\n")
    print("| GPUs | grid | engine | paper Table 6 | " + " | ".join(variants) + " |")
    print("|---|---|---|---|" + "---|" * len(variants))

    def cell(n, step):
        ips = n * calib.PAPER_BATCH_PER_GPU / step
        return f"{ips:,.0f} ({100 * ips / (base * n):.1f})"

    for r in t6:
        n = r.size
        paper = f"{calib.PAPER_TABLE6[n]:,} ({calib.PAPER_TABLE6_EFFICIENCY[n]:.2f})"
        cells = [cell(n, a) if abs(a - b) <= 1e-12 else f"{cell(n, a)} / {cell(n, b)}"
                 for a, b in (r.table6.steps[v] for v in variants)]
        print(f"| {n} | {r.table6.grid} | {r.engine} | {paper} | " + " | ".join(cells) + " |")
    print()


def print_links(rows: Sequence[Row]) -> None:
    print("Links the simulated probe measures (TFTORUS_LINKS form):\n")
    seen = set()
    for r in rows:
        key = (r.cluster, r.how, r.size)
        if key not in seen:
            seen.add(key)
            print(f"- {r.cluster} {r.how} {r.size}: `{r.links}`")
    print()


def print_checks(checked: Sequence[tuple]) -> float:
    """The affine claim against direct simulation; returns the worst relative deviation."""
    worst = {}
    for c in checked:
        cluster, how, size, a, g, n, t_lin, t_sim = c
        dev = abs(t_lin - t_sim) / t_sim
        if n not in worst or dev > worst[n][0]:
            worst[n] = (dev, c)
    print("Phase times interpolated in bytes (simulated at "
          f"{LOW_BYTES // MIB} and {HIGH_BYTES // MIB} MiB) against direct simulation, plan_grid's "
          f"algorithms, every world; worst per size:\n")
    for n, (dev, (cluster, how, size, a, g, _, t_lin, t_sim)) in sorted(worst.items()):
        print(f"- {n / MIB:g} MiB: {dev:.2%} ({cluster} {how} {size} GPUs, {a} on {g}: "
              f"interpolated {t_lin * 1e3:.4f} ms, simulated {t_sim * 1e3:.4f} ms)")
    print()
    return max((d for d, _ in worst.values()), default=0.0)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"only {QUICK_SIZES} GPUs, FP16, compact")
    p.add_argument("--clusters", nargs="+", choices=CLUSTERS, default=list(CLUSTERS))
    p.add_argument("--sizes", nargs="+", type=int, default=None)
    p.add_argument("--jobs", type=int, default=2,
                   help="worker processes, one cluster each (default %(default)s; 1: in this one)")
    p.add_argument("--seed", type=int, default=0, help="of the scattered placements")
    return p.parse_args(argv)


def main(argv: Sequence[str] = None) -> int:
    args = parse_args(argv)
    if sc.load_simgrid() is None:
        print(f"skipped: {sc.SIMGRID_MISSING}", file=sys.stderr)
        return 77
    start = time.perf_counter()
    sizes = tuple(args.sizes or (QUICK_SIZES if args.quick else SIZES))
    placements = ("compact",) if args.quick else PLACEMENTS
    wires = ("fp16",) if args.quick else tuple(WIRES)
    tensors = tensor_sets(wires)
    profile = step_profile.resnet50_profile(COMPUTE_SECONDS)
    engines = tuple(ENGINES)
    rows: List[Row] = []
    checked: List[tuple] = []
    counts = {}
    if args.jobs > 1 and len(args.clusters) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=args.jobs,
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(run_clusters, [c], sizes, placements, tensors, engines,
                                   args.seed, profile) for c in args.clusters]
            for c, f in zip(args.clusters, futures):
                r, ch, n = f.result()
                rows += r
                checked += ch
                counts[c] = n
    else:
        rows, checked, n = run_clusters(args.clusters, sizes, placements, tensors, engines,
                                        args.seed, profile)
        counts[" and ".join(args.clusters)] = n
    print("## The planner against the simulator's best\n")
    print(f"ResNet-50's {len(next(iter(tensors.values())))} gradients "
          + ", ".join(f"{w.upper()} {sum(b for b, _ in ts) / MIB:.1f} MiB"
                      for w, ts in tensors.items())
          + "; clusters " + ", ".join(args.clusters) + " (studies/simulated_cluster.py); "
          "best: planner.plan on simulated costs over every grid with X, Y >= 2; planner: "
          "planner.plan on the simulated probe's links and its cost model, timed by the "
          "simulator.\n")
    print_rows(rows)
    print_summary(rows)
    print("## The training step\n")
    print(f"Step = forward + backward ({COMPUTE_SECONDS * 1e3:.1f} ms: 32 images per GPU at every "
          f"size, Table 6) + the communication exposed after the backward pass, on the "
          f"simulator's costs, with ResNet-50's gradients ready as studies/step_profile.py's "
          f"FLOP model says (backward {profile.backward_seconds * 1e3:.2f} ms). best: "
          "planner.plan on simulated costs with the profile; first steps: the runtime's "
          "plan before its clocks (made without a profile); planner: after replan, the probe's "
          "links, the cost model and the profile the clocks measure; paper: one buffer, "
          "ready when the backward pass ends. eff = "
          "compute / step.\n")
    print_steps(rows)
    print_step_summary(rows)
    print_first_plan_hedge(rows, tensors, profile)
    print_table6(rows)
    print_checks(checked)
    print_links(rows)
    print("Simulation: " + "; ".join(
        f"{c} {n['steps simulated']} distinct steps, platform {n['platform s']:.1f} s, "
        f"{n['total s']:.0f} s in all" for c, n in counts.items())
        + f"; the sweep {time.perf_counter() - start:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
