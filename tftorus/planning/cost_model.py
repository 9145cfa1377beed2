"""An alpha-beta-gamma cost model of the all-reduce algorithms tftorus runs.

Pure Python + numpy (no TensorFlow, no Horovod): importable anywhere, fast in tests. The library
uses it for the training plan's all-reduce time per step (official_resnet/plan/run_plan.py, on the
paper's cluster: the ABCI section at the end). Fitting its parameters to measured times and the
paper's measured training step (Table 6) are the studies' (studies/cost_calibration.py).

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

The three algorithms (tftorus/torus/algorithms.py), on a grid of Y rows by X columns (N = X*Y):

    ring          all-reduce over the world:     2(N-1) steps of n/N
    torus         row reduce-scatter:            X-1 steps of n/X
                  column all-reduce of n/X:      2(Y-1) steps of n/(XY)
                  row all-gather:                X-1 steps of n/X
                  -> 2(X-1) + 2(Y-1) steps; bytes sent per rank 2(N-1)/N * n, the ring's
    hierarchical  row all-reduce of n:           2(X-1) steps of n/X
                  leaders' all-reduce of n:      2(Y-1) steps of n/Y, one rank per host (the
                                                 grid's first column) crossing
                  row all-reduce of n:           2(X-1) steps of n/X (the leader's sum to its
                                                 node: the others add zeros)
                  -> per host the torus' cross-host bytes, but all from one rank: on hosts with
                     several NICs and nics_per_rank=1 (rails) one NIC carries them all

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
oversubscription), stragglers, and overlap with computation (studies/cost_calibration.py's
StepModel adds it).
"""
import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tftorus.torus.grid import GridError, TorusGrid, divisors, hierarchical_grid, plan_grid

#: Order of the parameters in a feature vector and in `Params.vector()`.
PARAM_NAMES = ("alpha_intra", "beta_intra", "alpha_inter", "beta_inter", "gamma", "per_op",
               "copy")

#: Algorithms the model has phases for. Not the registry tftorus runs them from
#: (tftorus.torus.algorithms.ALGORITHMS): 'ring', 'torus' and 'hierarchical' are its entries of
#: those names; 'hvd' is Horovod's own hvd.allreduce, the same flat ring without tftorus around it;
#: 'auto' is no algorithm of its own (it picks one of these per buffer, algorithms.choose).
MODELLED_ALGORITHMS = ("ring", "torus", "hierarchical", "hvd")
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
    # 'pool': a host's NICs serve whichever of its ranks cross (NCCL spreading channels);
    # 'blocks': local rank l sends through NIC l * nics_per_host // ranks_per_host only, as on
    # ABCI's and DGX nodes (GPUs 0-1 on the first HCA...): two crossing ranks of one block share
    # its NIC even where the host has another one idle (the planner's, tftorus/planning/planner.py)
    nic_assignment: str = "pool"

    def __post_init__(self):
        for name in ("ranks_per_host", "nics_per_host"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Topology.{name} must be an integer >= 1, got {value!r}")
        per_rank = self.nics_per_rank
        if per_rank is not None and not (
                isinstance(per_rank, int) and 1 <= per_rank <= self.nics_per_host):
            raise ValueError(f"Topology.nics_per_rank must be None or 1..nics_per_host "
                             f"({self.nics_per_host}), got {self.nics_per_rank!r}")
        if self.nic_assignment not in ("pool", "blocks"):
            raise ValueError(f"Topology.nic_assignment must be 'pool' or 'blocks', "
                             f"got {self.nic_assignment!r}")
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

    def nic_of(self, ranks: np.ndarray, size: int) -> np.ndarray:
        """The NIC (of its host) each rank sends through, with 'blocks' assignment."""
        local = (ranks % self.ranks_per_host if self.placement == "contiguous"
                 else ranks // self.hosts(size))
        return local * self.nics_per_host // self.ranks_per_host

    def nic_factor(self, senders: int) -> float:
        """beta_eff / inter.beta when `senders` ranks of one host (with 'blocks': of one NIC)
        cross hosts at once."""
        per_rank = self.nics_per_rank or self.nics_per_host
        if self.nic_assignment == "blocks":
            return max(float(senders), 1.0 / per_rank)
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
    group: str  # 'row', 'column', 'leaders' (the first column) or 'world'
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
    return {"row": rows, "column": rows.T, "leaders": rows.T[:1], "world": rows.reshape(1, -1)
            }[group]


def _crossing(groups: np.ndarray, offset: int, topo: Topology, size: int) -> int:
    """Most ranks of one host sending (or receiving) across hosts when every member sends to
    the member `offset` places on in its group; 0 if no message leaves a host."""
    src = topo.host_of(groups, size)
    peers = np.roll(groups, -offset, axis=1)
    dst = topo.host_of(peers, size)
    off = src != dst
    if not off.any():
        return 0
    if topo.nic_assignment == "blocks":  # count per NIC: host * nics + the rank's NIC
        src = src * topo.nics_per_host + topo.nic_of(groups, size)
        dst = dst * topo.nics_per_host + topo.nic_of(peers, size)
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
    if algorithm not in MODELLED_ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {MODELLED_ALGORITHMS}")
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
        phases.append(ring_phase("leaders' all-reduce", grid, "leaders", topo, nbytes,
                                 "all-reduce"))
        phases.append(ring_phase("row broadcast (all-reduce)", grid, "row", topo, nbytes,
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


# ==================================================================================================
# Grids
# ==================================================================================================

def grid_for_algorithm(algorithm: str, size: int, ranks_per_host: int) -> TorusGrid:
    """The grid tftorus would run `algorithm` on in a world of `size` ranks, `ranks_per_host`
    per host, with no grid given: a row per host for hierarchical (hierarchical_grid), the
    planner's torus grid otherwise (the ring's cost ignores it). What
    tftorus.runtime.process_state.grid_for
    picks in a running job, for a world that is only modelled."""
    if algorithm == "hierarchical":
        return hierarchical_grid(size, min(ranks_per_host, size))
    return plan_grid(size, ranks_per_host)


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
# The paper's machine (ABCI): what the training plan predicts the all-reduce on
# ==================================================================================================

#: ResNet-50's trainable parameters (tf.keras.applications.ResNet50, 1000 classes; the count
#: docs/studies/benchmarks.md measured): the plan's gradient buffer is this many elements.
RESNET50_PARAMS = 25_583_592

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
