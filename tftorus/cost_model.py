"""An alpha-beta-gamma cost model of the all-reduce algorithms tftorus runs, and its fit.

Pure Python + numpy (no TensorFlow, no Horovod): importable anywhere, fast in tests.

The model
---------
A buffer of n bytes is summed over N ranks. Each algorithm is a sequence of *phases*; a phase
is one collective over one kind of group (the torus rows, its columns, or the whole world), run
by all groups of that kind at once. A ring collective over a group of k ranks moves the buffer
m in k chunks of m/k bytes, one chunk per step:

    reduce-scatter  k-1 steps of m/k, summing (k-1)/k * m bytes per rank
    all-gather      k-1 steps of m/k
    all-reduce      2(k-1) steps of m/k (a reduce-scatter, then an all-gather)

A step costs  alpha + (m/k) * beta_eff  (a message's latency plus its bytes over the link),
and summing costs gamma per byte. A phase also pays a fixed `per_op` (launching one
collective: Horovod's negotiation, NCCL's kernel launch), and a gradient *set* is copied into
and out of one fusion buffer (`copy` per byte, 2n bytes).

    phase time = steps * alpha + sum(chunk * beta_eff) + reduced_bytes * gamma + per_op

The three algorithms (tftorus/algorithms.py), on a grid of Y rows by X columns (N = X*Y):

    ring          all-reduce over the world:     2(N-1) steps of n/N
    torus         row reduce-scatter:            X-1 steps of n/X
                  column all-reduce of n/X:      2(Y-1) steps of n/(XY)
                  row all-gather:                X-1 steps of n/X
                  -> 2(X-1) + 2(Y-1) steps; bytes sent per rank 2(N-1)/N * n, the ring's
    hierarchical  row all-reduce of n:           2(X-1) steps of n/X
                  column all-reduce of n:        2(Y-1) steps of n/Y
                  -> the column moves X times the torus' column bytes (tftorus' version: an
                     all-reduce in the node, then of the *whole* buffer across nodes)

`hvd` (Horovod's own hvd.allreduce, a Gloo ring over all ranks) is the flat ring.

Links and hosts
---------------
Ranks sit on hosts (`Topology`): rank r on host r // ranks_per_host ('contiguous', how
horovodrun -H a:P,b:P places them) or r % hosts ('round-robin'). Which grid dimension maps
onto hosts follows: with X a multiple of ranks_per_host a row is whole hosts, and the columns
cross hosts; with rows shorter than a host, a column has several ranks per host.

A step is *intra-host* if no message of it leaves a host: it costs intra.alpha + chunk *
intra.beta. Otherwise it is *inter-host*: every step is as slow as its slowest link, taken to be
the host's NIC (intra-host links are assumed faster). The NIC is shared: if s ranks of one host
send across hosts in the same step (counted over all groups running at once, and the larger of
sends and receives, as links are full duplex), each gets

    bandwidth per rank = min(nics_per_rank, nics_per_host / s) * (1 / inter.beta)

so inter.beta is seconds per byte through *one* NIC, and beta_eff = inter.beta *
max(s / nics_per_host, 1 / nics_per_rank). A row ring crossing hosts has one sender per host
(s = 1); a column all-reduce with rows of whole hosts has every rank of a host sending (s =
ranks_per_host). The row reduce-scatter can also be modelled as tftorus' Horovod one (an
all-to-all and a local sum: round j sends m/k to the member j places on; same bytes, but more
ranks of a host cross at once).

Not in the model: pipelining inside a ring (NCCL charges only the inter-host hops the network
latency; here a crossing step pays it whole), congestion above the host (switch
oversubscription), stragglers, and overlap with computation (see StepModel).
"""
import dataclasses
import math
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from tftorus.grid import GridError, TorusGrid, divisors, plan_grid

#: Order of the parameters in a feature vector and in `Params.vector()`.
PARAM_NAMES = ("alpha_intra", "beta_intra", "alpha_inter", "beta_inter", "gamma", "per_op",
               "copy")
PARAM_UNITS = {"alpha_intra": "s/message", "beta_intra": "s/byte", "alpha_inter": "s/message",
               "beta_inter": "s/byte per NIC", "gamma": "s/byte summed",
               "per_op": "s/collective", "copy": "s/byte copied"}

#: Parameters that are CPU work when ranks run on CPUs (loopback messages are memcpys, sums and
#: copies are loops, a collective's set-up is a negotiation): with more ranks than cores they
#: stretch by ranks / cores (Measurement.cpu_factor). The inter-host link is a rate limit, not.
CPU_PARAMS = tuple(PARAM_NAMES.index(n) for n in ("alpha_intra", "beta_intra", "gamma", "per_op",
                                                   "copy"))

#: Algorithms the model knows; 'hvd' is Horovod's flat ring.
ALGORITHMS = ("ring", "torus", "hierarchical", "hvd")
#: Torus phases that can be measured (and fitted) alone.
TORUS_PHASES = ("row reduce-scatter", "column all-reduce", "row all-gather")


# ==================================================================================================
# Parameters and topology
# ==================================================================================================

@dataclasses.dataclass(frozen=True)
class Link:
    """One class of link: alpha seconds per message, beta seconds per byte."""

    alpha: float
    beta: float

    def __post_init__(self):
        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Link.{name} must be a finite number >= 0, got {value!r}")

    @property
    def bandwidth(self) -> float:
        """Bytes per second (inf for beta = 0)."""
        return math.inf if self.beta == 0 else 1.0 / self.beta


@dataclasses.dataclass(frozen=True)
class Params:
    """Link parameters: intra-host and inter-host links, summing, per-collective, copying."""

    intra: Link
    inter: Link  # beta: one NIC (see Topology.nics_per_host)
    gamma: float = 0.0  # s per byte summed
    per_op: float = 0.0  # s per collective call
    copy: float = 0.0  # s per byte copied into / out of a fusion buffer

    def __post_init__(self):
        for name in ("gamma", "per_op", "copy"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Params.{name} must be a finite number >= 0, got {value!r}")

    def vector(self) -> np.ndarray:
        return np.array([self.intra.alpha, self.intra.beta, self.inter.alpha, self.inter.beta,
                         self.gamma, self.per_op, self.copy], dtype=float)

    @classmethod
    def from_vector(cls, v: Sequence[float]) -> "Params":
        v = [float(x) for x in v]
        return cls(Link(v[0], v[1]), Link(v[2], v[3]), gamma=v[4], per_op=v[5], copy=v[6])

    def as_dict(self) -> Dict[str, float]:
        return dict(zip(PARAM_NAMES, self.vector()))

    def replace(self, **values) -> "Params":
        """A copy with some parameters (by PARAM_NAMES) changed."""
        unknown = set(values) - set(PARAM_NAMES)
        if unknown:
            raise ValueError(f"unknown parameter(s) {sorted(unknown)}; known: {PARAM_NAMES}")
        d = self.as_dict()
        d.update(values)
        return Params.from_vector([d[k] for k in PARAM_NAMES])


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where ranks sit: `ranks_per_host` ranks per host, each host with `nics_per_host` NICs.

    placement 'contiguous': rank r on host r // ranks_per_host (horovodrun -H a:P,b:P);
    'round-robin': rank r on host r % hosts. nics_per_rank: how many of the host's NICs one
    rank's traffic can use (None: all of them, i.e. the host's bandwidth is one shared pool).
    """

    ranks_per_host: int
    nics_per_host: int = 1
    nics_per_rank: Optional[int] = None
    placement: str = "contiguous"

    def __post_init__(self):
        for name in ("ranks_per_host", "nics_per_host"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Topology.{name} must be an integer >= 1, got {value!r}")
        if self.nics_per_rank is not None and not (
                isinstance(self.nics_per_rank, int) and 1 <= self.nics_per_rank <= self.nics_per_host):
            raise ValueError(f"Topology.nics_per_rank must be None or 1..nics_per_host "
                             f"({self.nics_per_host}), got {self.nics_per_rank!r}")
        if self.placement not in ("contiguous", "round-robin"):
            raise ValueError(f"Topology.placement must be 'contiguous' or 'round-robin', "
                             f"got {self.placement!r}")

    def hosts(self, size: int) -> int:
        if size <= self.ranks_per_host:  # a world within one host
            return 1
        if size % self.ranks_per_host:
            raise GridError(f"{size} ranks do not fill hosts of {self.ranks_per_host} ranks each; "
                            f"use a world size that is a multiple of {self.ranks_per_host}")
        return size // self.ranks_per_host

    def host_of(self, ranks: np.ndarray, size: int) -> np.ndarray:
        if self.placement == "contiguous":
            return ranks // self.ranks_per_host
        return ranks % self.hosts(size)

    def nic_factor(self, senders: int) -> float:
        """beta_eff / inter.beta when `senders` ranks of one host cross hosts at once."""
        per_rank = self.nics_per_rank or self.nics_per_host
        return max(senders / self.nics_per_host, 1.0 / per_rank)


# ==================================================================================================
# Phases
# ==================================================================================================

@dataclasses.dataclass(frozen=True)
class Phase:
    """One collective of an algorithm, per rank, with what it costs under each parameter.

    steps = intra_steps + inter_steps (sequential messages); chunk = bytes of one message;
    inter_weighted_bytes = sum over inter-host steps of chunk * nic_factor (multiply by
    inter.beta for seconds); max_senders = most ranks of one host crossing at once.
    """

    name: str
    group: str  # 'row', 'column' or 'world'
    members: int  # ranks per group
    chunk: float  # bytes per message
    intra_steps: int
    inter_steps: int
    intra_bytes: float
    inter_weighted_bytes: float
    sent_bytes: float  # bytes one rank sends
    reduced_bytes: float  # bytes one rank sums
    max_senders: int
    ops: int = 1
    copied_bytes: float = 0.0

    @property
    def steps(self) -> int:
        return self.intra_steps + self.inter_steps

    @property
    def link(self) -> str:
        return "inter" if self.inter_steps else "intra"

    def features(self) -> np.ndarray:
        """Seconds = features() @ Params.vector()."""
        return np.array([self.intra_steps, self.intra_bytes, self.inter_steps,
                         self.inter_weighted_bytes, self.reduced_bytes, self.ops,
                         self.copied_bytes], dtype=float)

    def seconds(self, params: Params) -> float:
        return float(self.features() @ params.vector())


def copy_phase(nbytes: float) -> Phase:
    """Copying a gradient set into one fusion buffer and back out (2n bytes, no messages)."""
    return Phase("fusion copies", "local", 1, 0.0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0, ops=0,
                 copied_bytes=2.0 * nbytes)


def _groups(grid: TorusGrid, group: str) -> np.ndarray:
    rows = np.arange(grid.size).reshape(grid.y, grid.x)
    return {"row": rows, "column": rows.T, "world": rows.reshape(1, -1)}[group]


def _crossing(groups: np.ndarray, offset: int, topo: Topology, size: int) -> int:
    """Most ranks of one host sending (or receiving) across hosts when every member sends to
    the member `offset` places on in its group; 0 if no message leaves a host."""
    src = topo.host_of(groups, size)
    dst = topo.host_of(np.roll(groups, -offset, axis=1), size)
    off = src != dst
    if not off.any():
        return 0
    return int(max(np.bincount(src[off]).max(), np.bincount(dst[off]).max()))


def ring_phase(name: str, grid: TorusGrid, group: str, topo: Topology, nbytes: float,
               kind: str) -> Optional[Phase]:
    """A ring reduce-scatter / all-gather / all-reduce of `nbytes` over each `group`.

    kind 'reduce-scatter' or 'all-gather': k-1 steps of nbytes/k; 'all-reduce': 2(k-1).
    None for groups of one rank (answered locally, no collective runs).
    """
    groups = _groups(grid, group)
    k = groups.shape[1]
    if k == 1:
        return None
    chunk = nbytes / k
    steps = {"reduce-scatter": k - 1, "all-gather": k - 1, "all-reduce": 2 * (k - 1)}[kind]
    reduced = 0.0 if kind == "all-gather" else (k - 1) * chunk
    senders = _crossing(groups, 1, topo, grid.size)
    if senders == 0:
        return Phase(name, group, k, chunk, steps, 0, steps * chunk, 0.0, steps * chunk, reduced,
                     0)
    return Phase(name, group, k, chunk, 0, steps, 0.0, steps * chunk * topo.nic_factor(senders),
                 steps * chunk, reduced, senders)


def alltoall_reduce_scatter_phase(name: str, grid: TorusGrid, group: str, topo: Topology,
                                  nbytes: float) -> Optional[Phase]:
    """tftorus' Horovod reduce-scatter: an all-to-all (round j: every member sends its j-th
    next member's shard, nbytes/k) and a local sum of the k pieces. Same bytes as the ring."""
    groups = _groups(grid, group)
    k = groups.shape[1]
    if k == 1:
        return None
    chunk = nbytes / k
    intra = inter = 0
    weighted, worst = 0.0, 0
    for j in range(1, k):
        senders = _crossing(groups, j, topo, grid.size)
        if senders:
            inter += 1
            weighted += chunk * topo.nic_factor(senders)
            worst = max(worst, senders)
        else:
            intra += 1
    return Phase(name, group, k, chunk, intra, inter, intra * chunk, weighted, (k - 1) * chunk,
                 (k - 1) * chunk, worst)


def torus_phase(which: str, grid: TorusGrid, topo: Topology, nbytes: float,
                reduce_scatter: str = "ring") -> Optional[Phase]:
    """One of TORUS_PHASES of the torus all-reduce of `nbytes` (the column works on nbytes/X)."""
    if which == "row reduce-scatter":
        if reduce_scatter == "alltoall":
            return alltoall_reduce_scatter_phase(which, grid, "row", topo, nbytes)
        if reduce_scatter != "ring":
            raise ValueError(f"reduce_scatter must be 'ring' or 'alltoall', got {reduce_scatter!r}")
        return ring_phase(which, grid, "row", topo, nbytes, "reduce-scatter")
    if which == "column all-reduce":
        return ring_phase(which, grid, "column", topo, nbytes / grid.x, "all-reduce")
    if which == "row all-gather":
        return ring_phase(which, grid, "row", topo, nbytes, "all-gather")
    raise ValueError(f"unknown torus phase {which!r}; choose one of {TORUS_PHASES}")


def algorithm_phases(algorithm: str, grid: TorusGrid, topo: Topology, nbytes: float, *,
                     reduce_scatter: str = "ring", check: bool = False,
                     gradient_set: bool = False) -> List[Phase]:
    """The phases one all-reduce of `nbytes` per rank runs.

    grid: the torus grid (torus), the node grid (hierarchical: X = ranks per node in tftorus;
    the benchmark uses the torus grid); ignored by 'ring' and 'hvd' beyond its size.
    check: tftorus' consistency check (a 48-byte max all-reduce over the world) first.
    gradient_set: the buffer is many tensors, copied into a fusion buffer and back.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    topo.hosts(grid.size)  # the world must fill whole hosts
    phases: List[Optional[Phase]] = []
    if check:
        phases.append(ring_phase("consistency check", grid, "world", topo, 48.0, "all-reduce"))
    if algorithm in ("ring", "hvd"):
        phases.append(ring_phase("all-reduce (world)", grid, "world", topo, nbytes, "all-reduce"))
    elif algorithm == "torus":
        phases.extend(torus_phase(p, grid, topo, nbytes, reduce_scatter) for p in TORUS_PHASES)
    else:
        phases.append(ring_phase("row all-reduce", grid, "row", topo, nbytes, "all-reduce"))
        phases.append(ring_phase("column all-reduce (whole buffer)", grid, "column", topo, nbytes,
                                 "all-reduce"))
    if gradient_set:
        phases.append(copy_phase(nbytes))
    return [p for p in phases if p is not None]


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Parameters on a topology: times of the algorithms, per phase."""

    params: Params
    topology: Topology

    def phases(self, algorithm: str, grid: TorusGrid, nbytes: float, **kw) -> List[Phase]:
        return algorithm_phases(algorithm, grid, self.topology, nbytes, **kw)

    def seconds(self, algorithm: str, grid: TorusGrid, nbytes: float, **kw) -> float:
        return sum(p.seconds(self.params) for p in self.phases(algorithm, grid, nbytes, **kw))

    def breakdown(self, algorithm: str, grid: TorusGrid, nbytes: float,
                  **kw) -> List[Tuple[Phase, float]]:
        return [(p, p.seconds(self.params)) for p in self.phases(algorithm, grid, nbytes, **kw)]


def default_grid(algorithm: str, size: int, ranks_per_host: int) -> TorusGrid:
    """The grid tftorus uses for `algorithm` when none is given: the planner's for the torus,
    a row per host for hierarchical (tftorus.grid.hierarchical_grid), any for the ring."""
    if algorithm == "hierarchical":
        return TorusGrid(size=size, x=min(ranks_per_host, size))
    return plan_grid(size, ranks_per_host)


# ==================================================================================================
# Fitting
# ==================================================================================================

@dataclasses.dataclass(frozen=True)
class Measurement:
    """A measured time of some phases (one phase alone, or a whole algorithm)."""

    label: str
    phases: Tuple[Phase, ...]
    seconds: float
    cpu_factor: float = 1.0  # >1: ranks share cores, CPU-side costs stretch by this much

    def __post_init__(self):
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"measurement {self.label!r}: time must be > 0, got {self.seconds}")
        if not (math.isfinite(self.cpu_factor) and self.cpu_factor >= 1):
            raise ValueError(f"measurement {self.label!r}: cpu_factor must be >= 1, "
                             f"got {self.cpu_factor}")

    def features(self) -> np.ndarray:
        f = sum((p.features() for p in self.phases), np.zeros(len(PARAM_NAMES)))
        f[list(CPU_PARAMS)] *= self.cpu_factor
        return f

    def predict(self, params: Params) -> float:
        return float(self.features() @ params.vector())


@dataclasses.dataclass(frozen=True)
class FitResult:
    params: Params
    fitted: Tuple[str, ...]  # parameters the fit chose
    undetermined: Tuple[str, ...]  # free parameters no measurement depends on (left at base)
    predicted: Tuple[float, ...]  # seconds, in the order of the measurements
    measured: Tuple[float, ...]
    labels: Tuple[str, ...]

    @property
    def relative_errors(self) -> np.ndarray:
        """(predicted - measured) / measured per point."""
        return (np.array(self.predicted) - np.array(self.measured)) / np.array(self.measured)

    @property
    def rms_relative_error(self) -> float:
        return float(np.sqrt(np.mean(self.relative_errors ** 2)))


def fit(measurements: Sequence[Measurement], base: Optional[Params] = None,
        free: Iterable[str] = PARAM_NAMES) -> FitResult:
    """Least-squares fit of the `free` parameters, minimising relative error.

    The model is linear in its parameters (seconds = features @ params), so minimising
    sum(((predicted - measured) / measured)^2) is a weighted linear least-squares problem,
    solved with non-negative least squares (no parameter may go below 0). Parameters not in
    `free` stay at their `base` value (default 0); a free parameter no measurement depends on
    (e.g. inter-host ones when every run was on one host) stays at base too and is reported in
    `undetermined`.
    """
    from scipy.optimize import nnls

    measurements = list(measurements)
    if not measurements:
        raise ValueError("fit needs at least one measurement")
    free = tuple(free)
    unknown = set(free) - set(PARAM_NAMES)
    if unknown:
        raise ValueError(f"unknown parameter(s) {sorted(unknown)}; known: {PARAM_NAMES}")
    base = base or Params(Link(0.0, 0.0), Link(0.0, 0.0))
    A = np.array([m.features() for m in measurements])
    t = np.array([m.seconds for m in measurements])
    idx = [PARAM_NAMES.index(n) for n in free]
    fixed = [i for i in range(len(PARAM_NAMES)) if i not in idx]
    seen = [i for i in idx if np.any(A[:, i] != 0)]
    undetermined = tuple(PARAM_NAMES[i] for i in idx if i not in seen)
    residual_target = t - A[:, fixed] @ base.vector()[fixed]
    w = 1.0 / t  # relative error: each row divided by its measured time
    # Columns differ by ~15 orders of magnitude (steps vs bytes): scale them to unit norm so
    # the solver's tolerance treats every parameter alike.
    cols = A[:, seen] * w[:, None]
    norms = np.linalg.norm(cols, axis=0)
    norms[norms == 0] = 1.0
    solution, _ = nnls(cols / norms, residual_target * w)
    v = base.vector().copy()
    v[seen] = solution / norms
    params = Params.from_vector(v)
    return FitResult(params, tuple(PARAM_NAMES[i] for i in seen), undetermined,
                     tuple(float(m.predict(params)) for m in measurements), tuple(t.tolist()),
                     tuple(m.label for m in measurements))


# ==================================================================================================
# Grid planning
# ==================================================================================================

def plan_grid_by_cost(size: int, model: CostModel, nbytes: float,
                      reduce_scatter: str = "ring", local_size: Optional[int] = None) -> TorusGrid:
    """The row length X whose torus all-reduce of `nbytes` the model predicts fastest.

    Ties (within 1e-9 relative) go to what plan_grid would pick among them: rows of whole
    hosts, then the squarest, then the wider grid. local_size, if given, must be the model's
    ranks per host.
    """
    if local_size is not None and local_size != model.topology.ranks_per_host:
        raise GridError(f"local_size {local_size} differs from the model's topology "
                        f"({model.topology.ranks_per_host} ranks per host)")
    if nbytes <= 0:
        raise ValueError(f"nbytes must be > 0 to compare grids by cost, got {nbytes}")
    model.topology.hosts(size)
    cost = {x: model.seconds("torus", TorusGrid(size=size, x=x), nbytes,
                             reduce_scatter=reduce_scatter) for x in divisors(size)}
    best = min(cost.values())
    tied = [x for x, c in cost.items() if c <= best * (1 + 1e-9)]
    rph = model.topology.ranks_per_host
    return TorusGrid(size=size, x=min(tied, key=lambda x: (
        not (1 < rph < size and x % rph == 0), abs(x - size // x), -x)))


# ==================================================================================================
# The paper's machine (ABCI) and training step
# ==================================================================================================

#: ResNet-50's trainable parameters (tf.keras.applications.ResNet50, 1000 classes; the count
#: docs/benchmarks.md measured) in FP16, as the paper communicates gradients.
RESNET50_PARAMS = 25_583_592
RESNET50_FP16_BYTES = 2 * RESNET50_PARAMS

#: Table 6 of the paper: GPUs -> images/s (per-worker batch 32).
PAPER_TABLE6 = {4: 2565, 1024: 556_522, 2048: 1_091_357, 3456: 1_641_853, 4096: 1_929_054}
PAPER_TABLE6_EFFICIENCY = {1024: 84.75, 2048: 83.10, 3456: 74.08, 4096: 73.44}
PAPER_BATCH_PER_GPU = 32

GB = 1e9
US = 1e-6


def abci_topology(nics_per_rank: Optional[int] = None) -> Topology:
    """ABCI compute node: 4 V100 (paper 3.1), 2 InfiniBand EDR HCAs (paper 3.1).

    nics_per_rank None: a ring crossing the host can use both HCAs (NCCL spreads its channels
    over the NICs); 1: each rank's traffic goes through one HCA only.
    """
    return Topology(ranks_per_host=4, nics_per_host=2, nics_per_rank=nics_per_rank)


def abci_params() -> Params:
    """Link parameters for ABCI from documented hardware numbers (nothing fitted).

    intra beta: NVLink2 is 25 GB/s per direction per link (NVIDIA V100 whitepaper: 6 links,
      300 GB/s in total both ways); with 4 SXM2 V100 fully connected, each GPU pair has 2 links:
      50 GB/s per direction.
    inter beta: InfiniBand EDR, 100 Gbit/s = 12.5 GB/s per direction per HCA (signalling rate;
      measured ib_write_bw reaches ~12 GB/s); 2 HCAs per node.
    alpha: NCCL's own cost model (src/graph/tuning.cc, NCCL 2.7.5), per-hop latency of a
      Ring / Simple-protocol step: 3.4 us over NVLink, 9.6 us over the network.
    per_op: the same table's base latency of one Ring / Simple collective, 8.4 us.
    gamma: V100 HBM2 at 900 GB/s; summing a byte reads two and writes one: 3 B / 900 GB/s.
    copy: 0 (the paper's fused buffer is summed in place; Horovod's copies are not in NCCL's).
    """
    return Params(intra=Link(alpha=3.4 * US, beta=1 / (50 * GB)),
                  inter=Link(alpha=9.6 * US, beta=1 / (12.5 * GB)),
                  gamma=3 / (900 * GB), per_op=8.4 * US, copy=0.0)


@dataclasses.dataclass(frozen=True)
class StepModel:
    """One training step: compute, then (part of) the gradient all-reduce.

    overlap: fraction of the compute time the all-reduce may hide behind (0: it starts after
    the backward pass, as one fused buffer does; 2/3: it may run during the whole backward pass,
    about twice the forward's FLOPs). step = compute + max(0, comm - overlap * compute).
    compute: derived from the paper's 4-GPU throughput (Table 6) minus the model's own 4-GPU
    all-reduce, so efficiency is against the measured 4-GPU point, as the paper's is.
    """

    model: CostModel
    nbytes: float = RESNET50_FP16_BYTES
    batch_per_gpu: int = PAPER_BATCH_PER_GPU
    base_gpus: int = 4
    base_images_per_s: float = PAPER_TABLE6[4]
    overlap: float = 0.0

    def __post_init__(self):
        if not 0.0 <= self.overlap < 1.0:
            raise ValueError(f"overlap must be in [0, 1), got {self.overlap}")

    @property
    def base_step_seconds(self) -> float:
        """Measured step time at base_gpus: base_gpus * batch / images per second."""
        return self.base_gpus * self.batch_per_gpu / self.base_images_per_s

    def comm_seconds(self, algorithm: str, size: int, grid: Optional[TorusGrid] = None) -> float:
        grid = grid or default_grid(algorithm, size, self.model.topology.ranks_per_host)
        return self.model.seconds(algorithm, grid, self.nbytes)

    def _exposed(self, comm: float, compute: float) -> float:
        return max(0.0, comm - self.overlap * compute)

    @property
    def compute_seconds(self) -> float:
        """Compute time per step: the measured base step less the exposed torus all-reduce of
        the base world (solved for the overlap case: compute + exposed(comm, compute) = base)."""
        base = self.base_step_seconds
        comm = self.comm_seconds("torus", self.base_gpus)
        if comm <= self.overlap * base:  # all hidden at the base size
            return base
        return (base - comm) / (1.0 - self.overlap)

    def step_seconds(self, algorithm: str, size: int, grid: Optional[TorusGrid] = None) -> float:
        compute = self.compute_seconds
        return compute + self._exposed(self.comm_seconds(algorithm, size, grid), compute)

    def images_per_second(self, algorithm: str, size: int,
                          grid: Optional[TorusGrid] = None) -> float:
        return size * self.batch_per_gpu / self.step_seconds(algorithm, size, grid)

    def efficiency(self, algorithm: str, size: int, grid: Optional[TorusGrid] = None) -> float:
        """Percent of base_images_per_s * size / base_gpus (the paper's definition)."""
        ideal = self.base_images_per_s * size / self.base_gpus
        return 100.0 * self.images_per_second(algorithm, size, grid) / ideal
