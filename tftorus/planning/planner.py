"""The planner: grid, buckets, chunks and algorithm per bucket, from the job and its links.

tftorus' run-time choices cost or win by the links they run on: every collective call pays a
latency per sequential step (the torus 2(X-1) + 2(Y-1), a ring 2(N-1)), every bucket and every
pipelined chunk pays those again, and the bytes pay the bandwidth of whichever link carries
them. Fixed rules picked on one cluster lose elsewhere (docs/studies/scale.md: at 1,024-4,096 GPUs
the 1-MiB chunk rule made the torus 2.9-4.2x slower than one buffer). So the plan is computed, per
job, from the cost model (tftorus/planning/cost_model.py) with:

  the world      ranks, ranks per host
  the gradients  their sizes and dtypes in the order the optimizer hands them (bucketed exactly
                 as tftorus.torus.fusion will cut them)
  the links      latency and bandwidth inside a host and across hosts, and how many ranks of a
                 host can cross at full speed at once (`Links`): measured at init by
                 tftorus/planning/link_probe.py, or given (TFTORUS_LINKS, `Links.parse`)
  the engine     whether collectives of different groups run at once (the tf engine: a torus
                 can pipeline chunks) or one after the other (Horovod's background loop)
  optionally     when each gradient is ready in the backward pass (`StepProfile`), so buckets
                 are judged by the communication the step cannot hide, not the sum of it

It tries every candidate (fusion threshold; per bucket every algorithm and chunk count the
engine can run; the grid where it is free) and keeps the fastest. Candidates within
`TIE_FRACTION` of the best go to the simpler plan (fewer buckets, fewer chunks, the torus).
What the caller fixed (TorusOptions fields, grid=) is taken as given. Everything read is the
same on every rank (the links are averaged over the world by the probe), so every rank plans
alike; the consistency check compares the outcome too.

No TensorFlow ops (fusion's bucketing is by sizes): the studies (studies/simulated_cluster.py)
run the same function on clusters that exist only in the simulator.
"""
import dataclasses
import math
import os
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from tftorus.planning import cost_model as cm
from tftorus.torus.fusion import bucket_indices
from tftorus.torus.grid import TorusGrid, divisors, hierarchical_grid, plan_grid

MIB = 1 << 20
#: Fusion thresholds tried (bytes); ONE_BUFFER stands for "everything of one dtype together"
#: (0 is fusion's "no fusion": each tensor alone).
ONE_BUFFER = -1
THRESHOLDS = (1 * MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB, 64 * MIB, ONE_BUFFER)
#: The bucket ready last (the first layers' gradients) re-cut into buckets of the threshold over
#: these (1: as cut): whatever the backward pass outlasts, that bucket's all-reduce comes after
#: it, so a long backward pass wants it small; more calls cost latency where the network binds.
#: Measured: ResNet-50's last 16 MiB bucket (14.6 MiB) put tftorus' step 0.31 s past the compute
#: on the emulated 2 x 2 where Horovod's optimizer, sending what each cycle finds ready, ended
#: 0.03 s after it (docs/studies/emulated_step.md).
TAIL_DIVISORS = (1, 4, 16)
#: No tail bucket below this (a call's latency would cost more than its bytes anywhere).
MIN_TAIL_BYTES = 256 << 10
#: The bucket ready first may give its last tensors (the last layers', made first) to a bucket
#: of their own of at most its size over these (1: not split): the link starts as soon as the
#: backward pass has made them, not the whole first bucket. Measured: ResNet-50's first 11.1
#: MiB bucket left the emulated 2 x 4's link idle 0.14 s into the backward pass, where
#: Horovod's optimizer sent from its first cycle (docs/studies/emulated_step.md).
HEAD_DIVISORS = (1, 8)
#: Chunk counts tried per torus bucket on engines that pipeline (algorithms.MAX_CHUNKS at most).
CHUNKS = (1, 2, 4, 8, 16)
#: Plans predicted within this fraction of the best are equal; the simpler one is kept.
TIE_FRACTION = 0.01
ALGORITHMS = ("torus", "ring", "hierarchical")
#: The largest bucket on an engine whose columns can run in turn (Horovod's with Gloo: its loop
#: coordinates every rank once per cycle), where the hosts' ranks cross on links of their own
#: (lanes > 1): one long column collective then holds the other columns back for its whole
#: length. Measured on the emulated 2 x 2 with a link per rank, ResNet-50's FP32 set: one
#: 97.6 MiB buffer 3.70 s (p25 2.83), 16 MiB buckets 2.01 s; with one link per host, where the
#: columns share the link anyway, one buffer was 3 % faster (docs/studies/planner.md).
IN_TURN_MAX_BUCKET_BYTES = 16 * MIB
LINKS_ENV = "TFTORUS_LINKS"
#: Until the step's clocks exist (replan()), nothing says how long the backward pass is beside
#: the all-reduce: short where the network binds, several times longer at scale on fast links.
#: The first steps get the plan whose step is nearest the best in the worst of backward passes
#: these many times as long as the fastest all-reduce alone (first_plan; gradients ready one
#: tensor after the other in reverse order: assumed_profile). Judged by the all-reduce alone, the
#: planner picked one buffer, which hides nothing: 0.77 of Horovod's optimizer's step against 0.73
#: with 16 MiB buckets (emulated 2 x 2, FP16); judged by one backward pass 1.5x the all-reduce, 45
#: small buckets where the step was the all-reduce (docs/studies/planner.md).
ASSUMED_BACKWARDS = (0.1, 0.3, 1.0, 3.0)
#: The backward pass' share of the compute (forward + backward), to judge a step by its length.
BACKWARD_SHARE = 2.0 / 3.0


class PlanError(ValueError):
    """Links or a plan request that cannot be used; says what to change."""


# ==================================================================================================
# Links
# ==================================================================================================

@dataclasses.dataclass(frozen=True)
class Links:
    """What the links of a job cost, per level.

    intra: a message between two ranks of one host (alpha s, beta s/byte).
    inter: a message from one rank to another host while no other rank of its host sends.
    lanes: how many ranks of a host can send across hosts at once at `inter`'s bandwidth each
      (1: one NIC shared by the host; ranks per host: a NIC per rank, rails). s ranks crossing at
      once each get min(1, lanes / s) of it.
    gamma: s per byte summed; per_op: s per collective call (both folded into alpha and beta
      when measured; kept for given values).
    """

    intra: cm.Link
    inter: cm.Link
    lanes: float = 1.0
    gamma: float = 0.0
    per_op: float = 0.0
    source: str = "given"

    def __post_init__(self):
        if not (math.isfinite(self.lanes) and self.lanes >= 1):
            raise PlanError(f"Links.lanes must be >= 1 (ranks of a host that can cross at once "
                            f"at full speed), got {self.lanes!r}")

    def cost_model(self, local_size: int) -> cm.CostModel:
        """The cost model of these links on hosts of `local_size` ranks."""
        lanes = max(1, min(local_size, int(round(self.lanes))))
        return cm.CostModel(cm.Params(self.intra, self.inter, gamma=self.gamma,
                                      per_op=self.per_op),
                            cm.Topology(ranks_per_host=local_size, nics_per_host=lanes,
                                        nics_per_rank=1, nic_assignment="blocks"))

    def describe(self) -> str:
        def one(link: cm.Link) -> str:
            return f"{link.alpha * 1e6:.3g} us / {link.bandwidth / 1e9:.3g} GB/s"
        return (f"{self.source}: in a host {one(self.intra)}, across hosts {one(self.inter)} "
                f"per rank, {self.lanes:.3g} rank(s) of a host at full speed at once")

    def spec(self) -> str:
        """The TFTORUS_LINKS value that gives these links (Links.parse reads it back)."""
        return (f"intra={self.intra.alpha * 1e6:.4g}us@{self.intra.bandwidth / 1e9:.4g}GB/s,"
                f"inter={self.inter.alpha * 1e6:.4g}us@{self.inter.bandwidth / 1e9:.4g}GB/s,"
                f"lanes={self.lanes:.4g}")

    @classmethod
    def parse(cls, text: str) -> "Links":
        """'intra=3.4us@50GB/s,inter=9.6us@12.5GB/s,lanes=2' (lanes optional, default 1).

        Latency in s, ms or us; bandwidth in GB/s, MB/s or Gbit/s."""
        fields: Dict[str, str] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, value = part.partition("=")
            fields[key.strip().lower()] = value.strip()
        unknown = set(fields) - {"intra", "inter", "lanes"}
        if unknown or not {"intra", "inter"} <= set(fields):
            raise PlanError(f"{LINKS_ENV}={text!r}: give intra= and inter= (and lanes=), e.g. "
                            f"'intra=3.4us@50GB/s,inter=9.6us@12.5GB/s,lanes=2'")
        try:
            lanes = float(fields.get("lanes", "1"))
        except ValueError:
            raise PlanError(f"{LINKS_ENV}: lanes={fields['lanes']!r} is not a number") from None
        return cls(_parse_link(fields["intra"], "intra"), _parse_link(fields["inter"], "inter"),
                   lanes=lanes, source=f"given ({LINKS_ENV})")


_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_RATE_UNITS = {"gb/s": 1e9, "mb/s": 1e6, "gbit/s": 1e9 / 8}


def _parse_link(text: str, name: str) -> cm.Link:
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(s|ms|us)\s*@\s*([0-9.eE+-]+)\s*"
                         r"(GB/s|MB/s|Gbit/s)\s*", text, re.IGNORECASE)
    if not match:
        raise PlanError(f"{LINKS_ENV}: {name}={text!r} is not 'LATENCY@BANDWIDTH', e.g. "
                        f"'9.6us@12.5GB/s' (latency in s, ms or us; bandwidth in GB/s, MB/s or "
                        f"Gbit/s)")
    alpha = float(match.group(1)) * _TIME_UNITS[match.group(2).lower()]
    rate = float(match.group(3)) * _RATE_UNITS[match.group(4).lower()]
    if not (alpha >= 0 and rate > 0 and math.isfinite(alpha) and math.isfinite(rate)):
        raise PlanError(f"{LINKS_ENV}: {name}={text!r} needs a latency >= 0 and a bandwidth > 0")
    return cm.Link(alpha=alpha, beta=1.0 / rate)


def links_from_env() -> Optional[Links]:
    """The links TFTORUS_LINKS gives, or None when it is unset."""
    text = os.environ.get(LINKS_ENV, "").strip()
    return Links.parse(text) if text else None


# ==================================================================================================
# What the planner decides
# ==================================================================================================

@dataclasses.dataclass(frozen=True)
class StepProfile:
    """When each gradient is ready, in seconds from the start of the backward pass (the
    optimizer's order), and how long the backward pass takes: communication before that end is
    hidden (as far as the buckets are ready and the links are free)."""

    ready: Tuple[float, ...]
    backward_seconds: float


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    indices: Tuple[int, ...]  # the tensors it carries (caller's order)
    nbytes: int
    algorithm: str
    chunks: int
    seconds: float  # predicted, alone


@dataclasses.dataclass(frozen=True)
class Plan:
    grid: TorusGrid
    threshold_bytes: int  # ONE_BUFFER: one bucket per dtype
    buckets: Tuple[BucketPlan, ...]
    seconds: float  # predicted all-reduce of every bucket, all ready at once (timeline)
    exposed_seconds: float  # predicted: what the step cannot hide (profile), else `seconds`
    links: Optional[Links] = None
    why: str = ""
    tail_threshold_bytes: Optional[int] = None  # the last-ready bucket cut again at this size
    head_bytes: Optional[int] = None  # the first-ready bucket's last tensors sent first, at most

    def describe(self) -> str:
        """One line for the log: the plan, then why."""
        n = len(self.buckets)
        sizes = sorted({round(b.nbytes / MIB, 1) for b in self.buckets}, reverse=True)
        algos = sorted({b.algorithm for b in self.buckets})
        chunks = sorted({b.chunks for b in self.buckets})
        size_text = "/".join(f"{s:g}" for s in sizes[:3]) + ("/..." if len(sizes) > 3 else "")
        cuts = ([f"the first-ready one's first {self.head_bytes / MIB:.3g} MiB apart"]
                if self.head_bytes else []) + (
            [f"the last-ready one in pieces of {self.tail_threshold_bytes / MIB:.3g} MiB"]
            if self.tail_threshold_bytes else [])
        tail = f" ({'; '.join(cuts)})" if cuts else ""
        text = (f"tftorus: grid {self.grid}, {n} bucket{'s' * (n != 1)} of {size_text} MiB"
                f"{tail}, {'/'.join(map(str, chunks))} chunk{'s' * (chunks != [1])} each, "
                f"{'/'.join(algos)}; predicted {self.seconds * 1e3:.3g} ms per all-reduce")
        if self.exposed_seconds != self.seconds:
            text += f", {self.exposed_seconds * 1e3:.3g} ms of it past the backward pass"
        if self.links is not None:
            text += f"; links {self.links.describe()}"
        return text + (f"; {self.why}" if self.why else "")


@dataclasses.dataclass(frozen=True)
class Engine:
    """What the engine can run: collectives of different groups at once (chunks pipeline), and
    whether chunks may be cut at all (a float column of 3+ ranks summed by the engine's ring
    would round differently with them: algorithms.pipeline_chunks)."""

    concurrent_groups: bool
    chunks_allowed: bool = True
    max_bucket_bytes: Optional[int] = None  # Communicator.max_bucket_bytes
    max_chunk_bytes: Optional[int] = None  # Communicator.max_chunk_bytes
    columns_in_turn: bool = False  # Communicator.columns_in_turn


# ==================================================================================================
# Costs
# ==================================================================================================

def _algorithm_grid(algorithm: str, grid: TorusGrid, local_size: int) -> TorusGrid:
    return hierarchical_grid(grid.size, local_size) if algorithm == "hierarchical" else grid


class ModelCosts:
    """Seconds of one bucket for an algorithm, grid and chunk count, from the cost model: each
    phase's time is affine in its bytes, so every (algorithm, grid) is evaluated at two sizes
    once. Anything with the same `phase_seconds` and `seconds` can stand in for it (the
    studies' simulator: studies/planner_sweep.py)."""

    def __init__(self, model: cm.CostModel, local_size: int):
        self.model = model
        self.local_size = local_size
        self._lines: Dict[tuple, List[Tuple[float, float]]] = {}
        self._seconds: Dict[tuple, float] = {}

    def _phase_lines(self, algorithm: str, grid: TorusGrid) -> List[Tuple[float, float]]:
        key = (algorithm, grid.x)
        if key not in self._lines:
            g = _algorithm_grid(algorithm, grid, self.local_size)
            one = self.model.phases(algorithm, g, float(MIB))
            zero = self.model.phases(algorithm, g, 0.0)
            params = self.model.params
            self._lines[key] = [(z.seconds(params), (o.seconds(params) - z.seconds(params)) / MIB)
                                for z, o in zip(zero, one)]
        return self._lines[key]

    def phase_seconds(self, algorithm: str, grid: TorusGrid, nbytes: float) -> List[float]:
        """Each phase's seconds for one buffer of `nbytes` (the torus: reduce-scatter, column,
        all-gather; fewer where the grid has no row or no column)."""
        return [a + b * nbytes for a, b in self._phase_lines(algorithm, grid)]

    def seconds(self, algorithm: str, grid: TorusGrid, nbytes: float, chunks: int,
                concurrent: bool) -> float:
        """One bucket alone (its chunks pipelined where the engine runs groups at once)."""
        key = (algorithm, grid, nbytes, chunks, concurrent)  # the search asks again and again
        if key not in self._seconds:
            self._seconds[key] = timeline(self, grid, [(algorithm, nbytes, chunks, 0.0)],
                                          concurrent)
        return self._seconds[key]


def timeline(costs, grid: TorusGrid, buckets: Sequence[Tuple[str, float, int, float]],
             concurrent: bool) -> float:
    """When the last of `buckets` ((algorithm, bytes, chunks, ready seconds), in the order the
    step issues them) is summed.

    Horovod's engine (not concurrent) runs one collective at a time, in order. The tf engine
    orders collectives per group (a token each) and runs different groups' at once: a torus
    chunk's row reduce-scatter, column all-reduce and row all-gather go to two queues (the row's
    and the column's), and consecutive torus buckets' chunks form one pipeline (the issue order
    of algorithms.torus_pipeline: RS(i), AR(i-1), AG(i-2) over every chunk of them), so the
    column of one chunk runs beside the row phases of the next, in this bucket or the next one.
    A ring or hierarchical bucket holds both queues while it runs (it shares the links)."""
    row = col = 0.0  # when each queue is free
    stream = []  # (rs, ar, ag, ready) of each torus chunk waiting to go as one pipeline

    def pipeline(row, col):
        n = len(stream)
        rs_end, ar_end = [0.0] * n, [0.0] * n
        for step in range(n + 2):
            if step < n:
                rs, _, _, ready = stream[step]
                row = rs_end[step] = max(row, ready) + rs
            if 0 <= step - 1 < n:
                col = ar_end[step - 1] = max(col, rs_end[step - 1]) + stream[step - 1][1]
            if 0 <= step - 2 < n:
                row = max(row, ar_end[step - 2]) + stream[step - 2][2]
        stream.clear()
        return row, col

    for algorithm, nbytes, chunks, ready in buckets:
        phases = costs.phase_seconds(algorithm, grid, nbytes / chunks)
        if concurrent and algorithm == "torus" and len(phases) == 3:
            stream.extend([(*phases, ready)] * chunks)
            continue
        row, col = pipeline(row, col)
        start = max(row, col, ready)
        row = col = start + chunks * sum(phases)
    row, col = pipeline(row, col)
    return max(row, col)


# ==================================================================================================
# Planning
# ==================================================================================================

def candidate_algorithms(grid: TorusGrid, local_size: int) -> Tuple[str, ...]:
    """What 'auto' may choose on this grid: on one host, or where the grid has one row or one
    column, the engine's own all-reduce only (the torus would be a ring, and on one host it only
    adds steps where no slow link is to be spared: measured, docs/studies/emulated_step.md)."""
    if local_size >= grid.size or grid.x == 1 or grid.y == 1:
        return ("ring",)
    out = ["torus", "ring"]
    if grid.size % local_size == 0 and 1 < local_size:
        out.append("hierarchical")
    return tuple(out)


def plan(size: int, local_size: int, tensor_bytes: Sequence[Tuple[int, object]],
         links: Optional[Links], engine: Engine, *, grid: Optional[TorusGrid] = None,
         threshold_bytes: Optional[int] = None, algorithm: Optional[str] = None,
         chunks: Optional[int] = None, profile: Optional[StepProfile] = None,
         grids: Optional[Sequence[TorusGrid]] = None, costs=None,
         score: Optional[Callable[[Plan], float]] = None) -> Plan:
    """The fastest plan the cost model predicts for these tensors on these links.

    tensor_bytes: (bytes, dtype) of each tensor, in the optimizer's order.
    grid / threshold_bytes / algorithm / chunks: fixed by the caller (None: planned; algorithm
      'auto' is None). grids: the grids to choose among when `grid` is None (default: every
      row length of the world; an engine whose groups are fixed passes its one grid as `grid`).
    links: measured (tftorus/planning/link_probe.py) or given (Links.parse); without them
      tftorus keeps its fixed rules and does not call this (reduction.py).
    costs: what a bucket costs (default: ModelCosts of `links`); the studies pass simulated ones.
    score: what the search minimizes (default: the exposed seconds; first_plan's regret).
    """
    if size < 1 or local_size < 1:
        raise PlanError(f"size and local_size must be >= 1, got {size} and {local_size}")
    local_size = min(local_size, size)
    if algorithm == "auto":
        algorithm = None
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise PlanError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS} or 'auto'")
    if links is None:
        raise PlanError("plan() needs links: measure them (tftorus.planning.link_probe) or give "
                        f"them ({LINKS_ENV})")
    costs = costs or ModelCosts(links.cost_model(local_size), local_size)
    if grid is not None:
        grid_choices = [grid]
    else:
        grid_choices = list(grids) if grids else [TorusGrid(size=size, x=x) for x in divisors(size)]
    total = sum(b for b, _ in tensor_bytes)
    cap = engine.max_bucket_bytes
    if engine.columns_in_turn and links.lanes >= 1.5:
        cap = min(cap or IN_TURN_MAX_BUCKET_BYTES, IN_TURN_MAX_BUCKET_BYTES)
    thresholds = [threshold_bytes] if threshold_bytes is not None else [
        t for t in THRESHOLDS if cap is None or (t if t != ONE_BUFFER else total) <= cap]
    concurrent = engine.concurrent_groups
    best: Optional[Plan] = None
    best_key = None
    for g in grid_choices:
        algos = (algorithm,) if algorithm else candidate_algorithms(g, local_size)
        for threshold, tail, head in _cuts(thresholds, threshold_bytes is not None, total):
            cut = threshold if threshold != ONE_BUFFER else max(1, total)
            cut_indices = cut_buckets(tensor_bytes, cut, tail, head)
            sizes = [sum(tensor_bytes[i][0] for i in indices) for indices in cut_indices]
            ready = [max(profile.ready[i] for i in indices) if profile else 0.0
                     for indices in cut_indices]
            choices = _chunk_choices(g, local_size, engine, chunks)
            tried = set()  # capped, several k give the same counts: cost each set once
            for k in choices:
                counts = tuple(_capped_chunks(k, nbytes, engine) if len(choices) > 1 else k
                               for nbytes in sizes)
                if counts in tried:
                    continue
                tried.add(counts)
                buckets = []
                for indices, nbytes, kb in zip(cut_indices, sizes, counts):
                    # per bucket the fastest algorithm alone; within the tie band the torus
                    options = [(costs.seconds(a, g, nbytes, kb if a == "torus" else 1,
                                              concurrent), a) for a in algos]
                    t_best = min(t for t, _ in options)
                    t, a = min((o for o in options if o[0] <= t_best * (1 + TIE_FRACTION)),
                               key=lambda o: ALGORITHMS.index(o[1]))
                    buckets.append(BucketPlan(tuple(indices), nbytes, a,
                                              kb if a == "torus" else 1, t))
                candidate = _costed(Plan(g, threshold, tuple(buckets), 0.0, 0.0, links,
                                         tail_threshold_bytes=tail if tail != cut else None,
                                         head_bytes=head if head != cut else None),
                                    costs, engine, profile)
                # simpler wins a tie: fewer buckets, fewer chunks, the grid plan_grid picks
                key = (score(candidate) if score else candidate.exposed_seconds, len(buckets), k,
                       g != plan_grid(size, local_size))
                if best is None or _better(key, best_key):
                    best, best_key = candidate, key
    return dataclasses.replace(best, why=_why(best, grid, threshold_bytes, algorithm, chunks,
                                              profile))


def _cuts(thresholds: Sequence[int], fixed: bool, total: int) -> List[Tuple[int, int, int]]:
    """(threshold, tail threshold, head bytes) to try; a threshold the caller fixed is kept as
    is (no tail or head cut)."""
    out = []
    for threshold in thresholds:
        cut = threshold if threshold != ONE_BUFFER else max(1, total)
        if fixed:
            out.append((threshold, cut, cut))
            continue
        tails = {cut // d for d in TAIL_DIVISORS if cut // d >= MIN_TAIL_BYTES} or {cut}
        heads = {cut // d for d in HEAD_DIVISORS if cut // d >= MIN_TAIL_BYTES} or {cut}
        out.extend((threshold, tail, head) for tail in sorted(tails, reverse=True)
                   for head in sorted(heads, reverse=True))
    return out


def cut_buckets(tensor_bytes: Sequence[Tuple[int, object]], threshold: int,
                tail_threshold: Optional[int] = None,
                head_bytes: Optional[int] = None) -> List[Tuple[int, ...]]:
    """tftorus.torus.fusion's buckets of `threshold`, with the bucket ready last (the one holding
    the first tensor: the backward pass makes it last) cut again at `tail_threshold`, its pieces in
    the order they are ready, and the bucket ready first (holding the last tensor) split in two
    where its last tensors up to `head_bytes` can go first."""
    cut = bucket_indices(tensor_bytes, threshold)
    if head_bytes and head_bytes < threshold and cut:
        first = max(range(len(cut)), key=lambda b: max(cut[b]))
        members, used, split = cut[first], 0, len(cut[first])
        while split > 1 and used + tensor_bytes[members[split - 1]][0] <= head_bytes:
            split -= 1
            used += tensor_bytes[members[split]][0]
        if 0 < split < len(members):  # the head goes first: it is ready first
            cut = cut[:first] + [members[split:], members[:split]] + cut[first + 1:]
    if not tail_threshold or tail_threshold >= threshold or not cut:
        return cut
    last = min(range(len(cut)), key=lambda b: min(cut[b]))
    members = cut[last]
    pieces = bucket_indices([tensor_bytes[i] for i in members], tail_threshold)
    return cut[:last] + [tuple(members[j] for j in piece) for piece in pieces] + cut[last + 1:]


def assumed_profile(tensor_bytes: Sequence[Tuple[int, object]],
                    backward_seconds: float) -> StepProfile:
    """The readiness assumed before the step is clocked: the backward pass hands the optimizer's
    last tensors first, one tensor as long as the next (in a CNN the late, large gradients come
    first, as studies/step_profile.py's FLOPs say: bytes come early). Even bytes instead made
    the simulator's first steps up to 16.6 % slower than the best, even tensors 10.5 %."""
    n = len(tensor_bytes)
    ready = [backward_seconds * (n - i) / n for i in range(n)]
    return StepProfile(tuple(ready), backward_seconds)


def assumed_regrets(size: int, local_size: int, tensor_bytes: Sequence[Tuple[int, object]],
                    links: Links, engine: Engine, costs, **fixed
                    ) -> Tuple[List[StepProfile], Callable[[Plan], List[float]]]:
    """The backward passes first_plan assumes (ASSUMED_BACKWARDS times the fastest all-reduce
    alone) and, for a plan, its regret under each: the step (forward + backward + exposed) over
    the best step any plan gives under that assumption."""
    alone = plan(size, local_size, tensor_bytes, links, engine, costs=costs, **fixed)
    assumed = [assumed_profile(tensor_bytes, f * alone.seconds) for f in ASSUMED_BACKWARDS]

    def step(profile: StepProfile, exposed: float) -> float:
        return profile.backward_seconds / BACKWARD_SHARE + exposed

    best = [step(a, plan(size, local_size, tensor_bytes, links, engine, costs=costs,
                         profile=a, **fixed).exposed_seconds) for a in assumed]

    def regrets(p: Plan) -> List[float]:
        return [step(a, evaluate(p, costs, engine, a)[1]) / b for a, b in zip(assumed, best)]

    return assumed, regrets


def first_plan(size: int, local_size: int, tensor_bytes: Sequence[Tuple[int, object]],
               links: Links, engine: Engine, costs=None, **fixed) -> Plan:
    """The plan for the steps before replan(): the least worst regret over the assumed backward
    passes (assumed_regrets)."""
    costs = costs or ModelCosts(links.cost_model(min(local_size, size)), min(local_size, size))
    _, regrets = assumed_regrets(size, local_size, tensor_bytes, links, engine, costs, **fixed)

    def regret(p: Plan) -> float:
        return max(regrets(p))

    p = plan(size, local_size, tensor_bytes, links, engine, costs=costs, score=regret, **fixed)
    return dataclasses.replace(p, why=p.why.replace(
        "judged by the all-reduce's time",
        f"judged by its step against the best under backward passes of "
        f"{ASSUMED_BACKWARDS[0]:g}-{ASSUMED_BACKWARDS[-1]:g}x the all-reduce (within "
        f"{(regret(p) - 1) * 100:.0f} %) until replan() clocks the step"))


def layout_plan(grid: TorusGrid, threshold_bytes: int,
                buckets: Sequence[Tuple[Sequence[int], int, str, int]], links: Links,
                local_size: int, engine: Engine, profile: Optional[StepProfile] = None,
                why: str = "") -> Plan:
    """A plan made elsewhere ((tensor indices, bytes, algorithm, chunks) per bucket: the fixed
    rules', for one), costed by the same model, so the guard (tftorus/runtime/plan_guard.py)
    can weigh what it hides against the planner's choice."""
    local_size = min(local_size, grid.size)
    costs = ModelCosts(links.cost_model(local_size), local_size)
    planned = tuple(BucketPlan(tuple(ix), int(nbytes), a, k,
                               costs.seconds(a, grid, nbytes, k, engine.concurrent_groups))
                    for ix, nbytes, a, k in buckets)
    return _costed(Plan(grid, threshold_bytes, planned, 0.0, 0.0, links, why=why), costs,
                   engine, profile)


def _costed(p: Plan, costs, engine: Engine, profile: Optional[StepProfile]) -> Plan:
    seconds, exposed = evaluate(p, costs, engine, profile)
    return dataclasses.replace(p, seconds=seconds, exposed_seconds=exposed)


def _better(key, best_key) -> bool:
    cost, best_cost = key[0], best_key[0]
    if cost < best_cost * (1 - TIE_FRACTION):
        return True
    if cost > best_cost * (1 + TIE_FRACTION):
        return False
    return key[1:] < best_key[1:] or (key[1:] == best_key[1:] and cost < best_cost)


def _chunk_choices(grid: TorusGrid, local_size: int, engine: Engine,
                   chunks: Optional[int]) -> Tuple[int, ...]:
    if chunks is not None:
        return (chunks,)
    if not (engine.concurrent_groups and engine.chunks_allowed) or local_size >= grid.size:
        return (1,)  # nothing runs beside a chunk's phases, or one host: chunks only add calls
    return CHUNKS


def _capped_chunks(chunks: int, nbytes: float, engine: Engine) -> int:
    """A bucket's chunk count with its chunks no larger than the engine's max_chunk_bytes (at
    most max(CHUNKS) of them)."""
    if engine.max_chunk_bytes is None:
        return chunks
    return int(min(max(CHUNKS), max(chunks, math.ceil(nbytes / engine.max_chunk_bytes))))


def _why(p: Plan, grid, threshold, algorithm, chunks, profile) -> str:
    del grid  # the run time always passes init()'s: the line names it anyway
    fixed = [name for name, v in (("buckets", threshold), ("algorithm", algorithm),
                                  ("chunks", chunks)) if v is not None]
    parts = []
    if fixed:
        parts.append(f"{', '.join(fixed)} fixed")
    parts.append("judged by the step's exposed communication" if profile
                 else "judged by the all-reduce's time")
    return "; ".join(parts)


def evaluate(p: Plan, costs, engine: Engine, profile: Optional[StepProfile] = None
             ) -> Tuple[float, float]:
    """(all-reduce seconds, exposed seconds) of plan `p` under `costs` (the studies judge the
    planner's choice, made on its cost model, by a simulator's costs): the timeline of its
    buckets all ready at once, and with the profile's ready times less the backward pass (the
    same as the first without a profile)."""
    def run(ready):
        return timeline(costs, p.grid, [(b.algorithm, b.nbytes, b.chunks, r)
                                        for b, r in zip(p.buckets, ready)],
                        engine.concurrent_groups)
    alone = run([0.0] * len(p.buckets))
    if profile is None:
        return alone, alone
    ready = [max(profile.ready[i] for i in b.indices) for b in p.buckets]
    return alone, max(0.0, run(ready) - profile.backward_seconds)
