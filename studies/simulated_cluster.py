"""The all-reduce on a simulated cluster: ABCI's network in SimGrid, checked against the emulated
hosts and the paper's Table 6 (issue 40; docs/studies/scale.md, "Simulated cluster").

    python -m studies.simulated_cluster                        # everything, ~2 min; the plot
    python -m studies.simulated_cluster --only calibration     # the emulated clusters, ~7 s
    python -m studies.simulated_cluster --only calibration --csv /tmp/tftorus_rails/*/allreduce.csv
        against fresh studies.emulated_cluster CSVs instead of the medians quoted in
        docs/studies/scale.md
    python -m studies.simulated_cluster --only abci            # ABCI at the paper's scale

Exits 77 (skipped), saying why, where SimGrid is missing. Tables print as Markdown, as
docs/studies/scale.md quotes them.

A study: the product (tftorus/) never imports this module or SimGrid. SimGrid 3.32's Python
bindings come from Debian's python3-simgrid (run_scripts/setup.sh installs it where apt works);
`load_simgrid` loads only that one extension module into the venv, never the rest of Debian's
dist-packages (whose numpy would shadow the venv's).

What SimGrid does here: the flows. A collective is a sequence of phases (the cost model's:
tftorus/planning/cost_model.py); a phase is a ring collective run by all its groups at once, k-1 or
2(k-1) steps in which every member sends one chunk to the next member. Every step of a phase
moves the same pattern of flows, so the simulator runs *one* step of each phase and bucket with
all its flows at once (every rank's message, through the NVLink, HCA, rack and spine links the
route crosses, shared max-min fairly by SimGrid's CM02 flow model) and the phase takes
steps x that step. A phase also pays the cost model's per-collective `per_op` and its summing
(`gamma` per byte), which are not network and are added as the cost model adds them. Nothing is
fitted to Table 6.

Platforms (one SimGrid engine per process, so every cluster lives in one platform):
  abci        32 racks x 34 nodes (1,088); a node is 4 GPUs, every pair joined by NVLink2
              (50 GB/s each way, 3.4 us), and 2 EDR HCAs (12.5 GB/s each way; GPUs 0-1 on the
              first, 2-3 on the second; 4.8 us each end, so 9.6 us node to node); a rack is
              non-blocking inside (full bisection) and has 24 EDR links to the spine (300 GB/s
              each way for 68 HCA ports: the 1/3 oversubscription); the spine (two directors)
              is non-blocking. Sources: docs/studies/scale.md.
  emulated    the hosts of studies.emulated_cluster: H hosts x R ranks, each host with 1 link or
              a link per rank at 0.25 Gbit/s to a bridge, its ranks joined by loopback; all of
              it on one machine, so every host's loopback traffic shares one memory-copy link.
  flat        (tests) hosts of R ranks with one NIC each on one non-blocking switch.
"""
import argparse
import dataclasses
import glob
import importlib.machinery
import importlib.util
import math
import os
import random
import statistics
import sys
import sysconfig
from typing import Dict, List, Optional, Sequence, Tuple

from studies import cost_calibration as cal
from tftorus.planning import cost_model as cm
from tftorus.torus.grid import PAPER_GRIDS, TorusGrid, plan_grid

DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"
DEFAULT_PNG = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "docs", "img",
                           "simulated_efficiency.png")

# ==================================================================================================
# SimGrid: loaded alone from Debian's package where the venv has none
# ==================================================================================================

_SIMGRID = None
SIMGRID_MISSING = ""


def load_simgrid():
    """The simgrid module, or None (SIMGRID_MISSING says why).

    `import simgrid` first; where that fails, only Debian's simgrid extension module for this
    Python (/usr/lib/python3/dist-packages/simgrid.cpython-311-...so) is loaded, by file: the
    rest of that directory stays off sys.path."""
    global _SIMGRID, SIMGRID_MISSING
    if _SIMGRID is not None:
        return _SIMGRID
    try:
        import simgrid  # noqa: F401  (a venv or system where it is importable)
        _SIMGRID = simgrid
        return _SIMGRID
    except ImportError:
        pass
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    paths = sorted(glob.glob(os.path.join(DEBIAN_DIST_PACKAGES, "simgrid" + suffix)))
    if not paths:
        SIMGRID_MISSING = (f"SimGrid's Python bindings are not installed for Python "
                           f"{sys.version_info.major}.{sys.version_info.minor} (no "
                           f"{DEBIAN_DIST_PACKAGES}/simgrid{suffix}); on Debian: "
                           f"apt-get install python3-simgrid")
        return None
    try:
        loader = importlib.machinery.ExtensionFileLoader("simgrid", paths[0])
        spec = importlib.util.spec_from_file_location("simgrid", paths[0], loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except ImportError as e:
        SIMGRID_MISSING = f"{paths[0]} does not load: {e}"
        return None
    sys.modules["simgrid"] = module
    _SIMGRID = module
    return module


# ==================================================================================================
# Clusters
# ==================================================================================================

GB = 1e9
US = 1e-6
UNLIMITED = 1e15  # bytes/s: a link that limits nothing here


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """One node (a host): `gpus` ranks, joined pairwise (NVLink) or through a shared copy link,
    and NICs; GPU i leaves the node through NIC nic_of_gpu[i]."""

    gpus: int = 4
    pair_bw: float = 50 * GB  # per direction, per GPU pair (0: ranks joined by `shared_copy`)
    pair_lat: float = 3.4 * US
    nics: int = 2
    nic_bw: float = 12.5 * GB  # per direction
    nic_lat: float = 4.8 * US  # each end: node to node is twice this
    nic_of_gpu: Tuple[int, ...] = (0, 0, 1, 1)

    def __post_init__(self):
        if len(self.nic_of_gpu) != self.gpus or max(self.nic_of_gpu) >= self.nics:
            raise ValueError(f"nic_of_gpu {self.nic_of_gpu} must name a NIC < {self.nics} for "
                             f"each of {self.gpus} GPUs")


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """Racks of nodes. Inside a rack every node reaches every other through its NICs only (full
    bisection); a rack reaches the others through `uplink_bw` each way (0: no limit) and a
    non-blocking spine. shared_copy_bw > 0: every intra-node message of the whole cluster goes
    through one link of that rate (the emulated cluster: every host on one machine's cores)."""

    name: str
    node: NodeSpec
    racks: int = 1
    nodes_per_rack: int = 1
    uplink_bw: float = 0.0
    uplink_lat: float = 0.0
    shared_copy_bw: float = 0.0
    shared_copy_lat: float = 0.0

    @property
    def nodes(self) -> int:
        return self.racks * self.nodes_per_rack

    @property
    def gpus(self) -> int:
        return self.nodes * self.node.gpus


def abci(name: str = "abci", racks: int = 32, uplinks_per_rack: int = 24) -> ClusterSpec:
    """ABCI as docs/studies/scale.md sources it: 1,088 nodes of 4 V100 (NVLink2) and 2 EDR HCAs;
    racks of 34 nodes, full bisection inside; 24 EDR links per rack to the spine (1/3
    oversubscription)."""
    return ClusterSpec(name, NodeSpec(), racks=racks, nodes_per_rack=34,
                       uplink_bw=uplinks_per_rack * 12.5 * GB)



#: The emulated cluster's host links: `tbf` at 0.25 Gbit/s (docs/studies/emulated_cluster.md).
EMULATED_LINK_BW = 0.25e9 / 8


def emulated(name: str, hosts: int, ranks: int, links: int, link_bw: float = EMULATED_LINK_BW,
             copy_bw: float = 0.0) -> ClusterSpec:
    """studies.emulated_cluster's hosts: `links` host links (1, or one per rank: rank l on link
    l mod links), no latency (no netem), one bridge; loopback through one machine-wide copy
    link of `copy_bw` (0: unlimited)."""
    node = NodeSpec(gpus=ranks, pair_bw=0.0, pair_lat=0.0, nics=links, nic_bw=link_bw,
                    nic_lat=0.0, nic_of_gpu=tuple(i % links for i in range(ranks)))
    return ClusterSpec(name, node, racks=1, nodes_per_rack=hosts, shared_copy_bw=copy_bw)


def flat(name: str, hosts: int, ranks: int, nic_bw: float, nic_lat: float, pair_bw: float,
         pair_lat: float) -> ClusterSpec:
    """Hosts of `ranks` ranks (pairwise links) and one NIC each, on one non-blocking switch: the
    cost model's picture with nics_per_host=1 (tests)."""
    node = NodeSpec(gpus=ranks, pair_bw=pair_bw, pair_lat=pair_lat, nics=1, nic_bw=nic_bw,
                    nic_lat=nic_lat / 2, nic_of_gpu=(0,) * ranks)
    return ClusterSpec(name, node, racks=1, nodes_per_rack=hosts)


class Platform:
    """Every cluster of a run in one SimGrid platform (SimGrid allows one per process)."""

    def __init__(self, specs: Sequence[ClusterSpec]):
        sg = load_simgrid()
        if sg is None:
            raise RuntimeError(SIMGRID_MISSING)
        self.sg = sg
        self.engine = sg.Engine(["tftorus-simulated-cluster", "--cfg=network/model:CM02",
                                 "--cfg=network/crosstraffic:0", "--cfg=network/TCP-gamma:0",
                                 "--log=root.thres:critical"])
        self.specs = {s.name: s for s in specs}
        self.gpus: Dict[str, list] = {}
        root = sg.NetZone.create_star_zone("root")
        for spec in specs:
            self.gpus[spec.name] = self._cluster(root, spec)
        root.seal()

    def _link(self, zone, name, bw, lat):
        """A full-duplex link; bw 0 means unlimited (SimGrid forbids empty routes in a zone,
        so an unlimited link is one at UNLIMITED bytes/s)."""
        return zone.create_split_duplex_link(name, bw if bw > 0 else UNLIMITED).set_latency(
            lat).seal()

    def _up(self, link):
        return self.sg.LinkInRoute(link, self.sg.LinkInRoute.Direction.UP)

    def _cluster(self, root, spec: ClusterSpec) -> list:
        sg = self.sg
        czone = sg.NetZone.create_star_zone(spec.name)
        czone.set_parent(root)
        copy = None
        if spec.shared_copy_bw > 0:  # one link, shared both ways (SHARED policy)
            copy = czone.create_link(f"{spec.name}-copy", spec.shared_copy_bw)
            copy.set_latency(spec.shared_copy_lat).seal()
        gpus = []
        for r in range(spec.racks):
            rzone = sg.NetZone.create_star_zone(f"{spec.name}-r{r}")
            rzone.set_parent(czone)
            gateway = None
            for n in range(spec.nodes_per_rack):
                nzone, ngw, hosts = self._node(rzone, f"{spec.name}-r{r}n{n}", spec.node, copy)
                rzone.add_route(nzone.netpoint, None, ngw, None, [], True)
                # A zone's gateway must sit one level down (SimGrid resolves routes zone by
                # zone): the rack leaves through its first node's router.
                gateway = gateway or ngw
                gpus.extend(hosts)
            rzone.seal()
            links = []
            if spec.uplink_bw > 0:
                links = [self._up(self._link(czone, f"{spec.name}-r{r}-up", spec.uplink_bw,
                                             spec.uplink_lat))]
            czone.add_route(rzone.netpoint, None, gateway, None, links, True)
        czone.seal()
        return gpus

    def _node(self, parent, name: str, node: NodeSpec, copy):
        sg = self.sg
        zone = sg.NetZone.create_full_zone(name)
        zone.set_parent(parent)
        gw = zone.create_router(f"{name}-gw")
        hosts = [zone.create_host(f"{name}g{i}", 1e12).seal() for i in range(node.gpus)]
        nics = [self._link(zone, f"{name}-nic{j}", node.nic_bw, node.nic_lat)
                for j in range(node.nics)]
        for i in range(node.gpus):
            for j in range(i + 1, node.gpus):
                if copy is not None:
                    links = [sg.LinkInRoute(copy)]
                else:
                    pair = self._link(zone, f"{name}-nv{i}-{j}", node.pair_bw, node.pair_lat)
                    links = [self._up(pair)]
                zone.add_route(hosts[i].netpoint, hosts[j].netpoint, None, None, links, True)
            nic = nics[node.nic_of_gpu[i]]
            zone.add_route(hosts[i].netpoint, gw, None, None, [self._up(nic)], True)
        zone.seal()
        return zone, gw, hosts

    def run_steps(self, jobs: Sequence["StepJob"]) -> List[float]:
        """Simulated seconds of each job: its flows started together, until the last ends."""
        sg = self.sg
        out: List[float] = []

        def controller():
            for job in jobs:
                hosts = self.gpus[job.cluster]
                start = sg.Engine.clock
                comms = [sg.Comm.sendto_async(hosts[s], hosts[d], job.nbytes)
                         for s, d in job.flows]
                sg.Comm.wait_all(comms)
                out.append(sg.Engine.clock - start)

        first = self.gpus[jobs[0].cluster][0] if jobs else None
        if first is None:
            return out
        sg.Actor.create("controller", first, controller)
        self.engine.run()
        return out


@dataclasses.dataclass(frozen=True)
class StepJob:
    """One step of a phase: `flows` (source, destination GPU index) of `nbytes` each, at once."""

    cluster: str
    flows: Tuple[Tuple[int, int], ...]
    nbytes: int


# ==================================================================================================
# A current GPU cluster: 8 GPUs per node, a NIC per GPU, rail-optimized fat tree (added for
# studies/planner_sweep.py; the platforms above are built as before)
# ==================================================================================================

@dataclasses.dataclass(frozen=True)
class RailsSpec(ClusterSpec):
    """A rail-optimized cluster: GPU i of every node has its own NIC on leaf (rail) i of its
    scalable unit (a 'rack' here: `nodes_per_rack` nodes); a node's GPUs reach each other through
    an NVSwitch (a port of node.pair_bw per GPU and direction, half of node.pair_lat each way);
    same-rail traffic of one unit turns at its leaf, everything else (another rail, another unit)
    climbs to the spine: `switch_lat` on each leaf-spine hop. The fabric is non-blocking: no
    switch or uplink limits a rate, only the NICs and NVSwitch ports do. Built by RailsPlatform."""

    switch_lat: float = 0.3 * US


def rails(name: str = "rails", units: int = 18, nodes_per_unit: int = 32) -> RailsSpec:
    """A DGX H100 SuperPOD-like cluster (public figures; nothing fitted):

    - NVIDIA DGX H100 (datasheet / user guide): 8x H100 SXM5, NVLink 4 through NVSwitch, 900 GB/s
      bidirectional per GPU (18 links x 25 GB/s each way): 450 GB/s per direction per GPU;
      8x ConnectX-7 single-port 400 Gb/s InfiniBand NDR (one per GPU): 50 GB/s per direction.
    - NVIDIA DGX SuperPOD reference architecture (DGX H100): scalable units of 32 nodes, a
      rail-optimized, non-blocking (full fat-tree) compute fabric of Quantum-2 NDR switches: NIC
      i of every node of a unit on leaf i, leaves joined through spines.
    - Latencies as ABCI's model takes them from NCCL's tuning table (Ring / Simple): 3.4 us per
      NVLink hop, 9.6 us per network hop node to node (4.8 us each end); the spine adds
      2 x `switch_lat` (0.3 us per leaf-spine hop: an assumption, of the order of an InfiniBand
      switch's port-to-port latency).

    18 units of 32 nodes: 576 nodes, 4,608 GPUs (4,096 fill 512 nodes; the rest lets a
    scattered placement pick among more nodes than it needs)."""
    node = NodeSpec(gpus=8, pair_bw=450 * GB, pair_lat=3.4 * US, nics=8, nic_bw=50 * GB,
                    nic_lat=4.8 * US, nic_of_gpu=tuple(range(8)))
    return RailsSpec(name, node, racks=units, nodes_per_rack=nodes_per_unit)


class RailsPlatform(Platform):
    """Platform that also builds RailsSpec clusters (other specs exactly as Platform does).

    A unit is one Dijkstra zone: GPU hosts, an NVSwitch router per node, a leaf router per rail
    and a spine router (the unit's gateway to the others, through a star zone with no limit).
    SimGrid's Dijkstra counts the links of each edge, so every host edge carries its port and one
    limitless zero-latency link: a message between two nodes' GPUs then takes its own NIC, never
    an NVLink hop to another GPU's NIC (NCCL's PXN is not modelled), and one inside a node takes
    the NVSwitch, never the fabric."""

    def _cluster(self, root, spec: ClusterSpec) -> list:
        if not isinstance(spec, RailsSpec):
            return super()._cluster(root, spec)
        sg = self.sg
        czone = sg.NetZone.create_star_zone(spec.name)
        czone.set_parent(root)
        node = spec.node
        gpus = []
        for u in range(spec.racks):
            name = f"{spec.name}-u{u}"
            uzone = sg.NetZone.create_dijkstra_zone(name)
            uzone.set_parent(czone)
            pad = self._link(uzone, f"{name}-pad", 0.0, 0.0)
            spine = uzone.create_router(f"{name}-spine")
            leaves = [uzone.create_router(f"{name}-leaf{i}") for i in range(node.nics)]
            for i, leaf in enumerate(leaves):
                up = self._link(uzone, f"{name}-leaf{i}-up", 0.0, spec.switch_lat)
                uzone.add_route(leaf, spine, None, None, [self._up(up)], True)
            for n in range(spec.nodes_per_rack):
                nname = f"{name}n{n}"
                nvswitch = uzone.create_router(f"{nname}-nvs")
                for i in range(node.gpus):
                    host = uzone.create_host(f"{nname}g{i}", 1e12).seal()
                    port = self._link(uzone, f"{nname}-nv{i}", node.pair_bw, node.pair_lat / 2)
                    uzone.add_route(host.netpoint, nvswitch, None, None,
                                    [self._up(port), self._up(pad)], True)
                    nic = self._link(uzone, f"{nname}-nic{i}", node.nic_bw, node.nic_lat)
                    uzone.add_route(host.netpoint, leaves[node.nic_of_gpu[i]], None, None,
                                    [self._up(nic), self._up(pad)], True)
                    gpus.append(host)
            uzone.seal()
            czone.add_route(uzone.netpoint, None, spine, None, [], True)
        czone.seal()
        return gpus


# ==================================================================================================
# Collectives as phases of ring steps (the cost model's phases)
# ==================================================================================================

@dataclasses.dataclass(frozen=True)
class SimPhase:
    name: str
    groups: Tuple[Tuple[int, ...], ...]  # ranks of each group running this phase at once
    nbytes: float  # the buffer each group's collective works on
    kind: str  # 'reduce-scatter', 'all-gather', 'all-reduce'

    @property
    def members(self) -> int:
        return len(self.groups[0])

    @property
    def steps(self) -> int:
        k = self.members
        return 2 * (k - 1) if self.kind == "all-reduce" else k - 1

    @property
    def chunk(self) -> float:
        return self.nbytes / self.members

    @property
    def reduced_bytes(self) -> float:
        return 0.0 if self.kind == "all-gather" else (self.members - 1) * self.chunk


#: Algorithms the simulator runs: the cost model's, and Horovod's NCCL hierarchical all-reduce
#: (HOROVOD_HIERARCHICAL_ALLREDUCE: reduce-scatter in the node, all-reduce across nodes among
#: ranks of equal local rank, all-gather in the node: the torus with X = ranks per node).
ALGORITHMS = ("ring", "torus", "hierarchical", "nccl-hierarchical")


def phases(algorithm: str, grid: TorusGrid, nbytes: float, local_size: int) -> List[SimPhase]:
    """The phases of one all-reduce of `nbytes` (groups of one rank run nothing)."""
    if algorithm == "nccl-hierarchical":
        algorithm, grid = "torus", TorusGrid(size=grid.size, x=local_size)
    rows = tuple(grid.rows())
    cols = tuple(grid.cols())
    out: List[SimPhase] = []
    if algorithm == "ring":
        out.append(SimPhase("all-reduce (world)", (tuple(range(grid.size)),), nbytes,
                            "all-reduce"))
    elif algorithm == "torus":
        out.append(SimPhase("row reduce-scatter", rows, nbytes, "reduce-scatter"))
        out.append(SimPhase("column all-reduce", cols, nbytes / grid.x, "all-reduce"))
        out.append(SimPhase("row all-gather", rows, nbytes, "all-gather"))
    elif algorithm == "hierarchical":
        out.append(SimPhase("row all-reduce", rows, nbytes, "all-reduce"))
        out.append(SimPhase("leaders' all-reduce", (cols[0],), nbytes, "all-reduce"))
        out.append(SimPhase("row broadcast (all-reduce)", rows, nbytes, "all-reduce"))
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    return [p for p in out if p.members > 1]


def step_flows(phase: SimPhase, gpu_of_rank: Sequence[int]) -> Tuple[Tuple[int, int], ...]:
    """One ring step: every member of every group sends to the next member."""
    flows = []
    for g in phase.groups:
        k = len(g)
        for i in range(k):
            flows.append((gpu_of_rank[g[i]], gpu_of_rank[g[(i + 1) % k]]))
    return tuple(flows)


def placement(spec: ClusterSpec, ranks: int, how="compact", seed: int = 0) -> List[int]:
    """GPU index of each rank: ranks fill nodes in order (local rank = GPU), nodes taken
    'compact' (rack after rack), 'fragmented' (random nodes of the whole machine, `seed`,
    ranks in node order, as a sorted host list gives them) or 'scattered' (the same nodes in
    random order: almost every ring hop leaves its rack). A sequence: the GPU of each rank."""
    if not isinstance(how, str):
        gpus = [int(g) for g in how]
        if len(gpus) != ranks or len(set(gpus)) != ranks or not all(
                0 <= g < spec.gpus for g in gpus):
            raise ValueError(f"a placement must name {ranks} distinct GPUs of {spec.name}")
        return gpus
    per = spec.node.gpus
    if ranks % per and ranks > per:
        raise ValueError(f"{ranks} ranks do not fill nodes of {per}")
    nodes_needed = max(1, ranks // per)
    if nodes_needed > spec.nodes:
        raise ValueError(f"{ranks} ranks need {nodes_needed} nodes; {spec.name} has {spec.nodes}")
    every = list(range(spec.nodes))
    if how == "compact":
        nodes = every[:nodes_needed]
    elif how == "fragmented":
        nodes = sorted(random.Random(seed).sample(every, nodes_needed))
    elif how == "scattered":
        nodes = random.Random(seed).sample(every, nodes_needed)
    else:
        raise ValueError(f"placement must be compact, fragmented or scattered, got {how!r}")
    return [nodes[r // per] * per + r % per for r in range(ranks)]


@dataclasses.dataclass
class PhaseTime:
    name: str
    steps: int
    step_seconds: float  # simulated, network only
    extra_seconds: float  # per_op + summing (the cost model's, not network)

    @property
    def seconds(self) -> float:
        return self.steps * self.step_seconds + self.extra_seconds


class Simulator:
    """Runs collectives on a Platform's clusters; per_op and gamma are the non-network costs
    (per collective call, per byte summed) added as the cost model adds them."""

    def __init__(self, platform: Platform, per_op: float = 0.0, gamma: float = 0.0):
        self.platform = platform
        self.per_op = per_op
        self.gamma = gamma

    def allreduce(self, cluster: str, algorithm: str, grid: TorusGrid,
                  buffers: Sequence[float], how: str = "compact",
                  per_op: Optional[float] = None, gamma: Optional[float] = None
                  ) -> List[List[PhaseTime]]:
        return self.many([(cluster, algorithm, grid, buffers, how, per_op, gamma)])[0]

    def many(self, requests) -> List[List[List[PhaseTime]]]:
        """Several all-reduces in one simulation run: [(cluster, algorithm, grid, buffers,
        placement, per_op, gamma)] -> per request, per buffer, the phases' times."""
        jobs, layout = [], []
        for cluster, algorithm, grid, buffers, how, per_op, gamma in requests:
            spec = self.platform.specs[cluster]
            gpu_of_rank = placement(spec, grid.size, how)
            per_request = []
            for nbytes in buffers:
                per_buffer = []
                for ph in phases(algorithm, grid, nbytes, spec.node.gpus):
                    jobs.append(StepJob(cluster, step_flows(ph, gpu_of_rank),
                                        max(1, int(round(ph.chunk)))))
                    per_buffer.append((ph, self.per_op if per_op is None else per_op,
                                       self.gamma if gamma is None else gamma))
                per_request.append(per_buffer)
            layout.append(per_request)
        times = iter(self.platform.run_steps(jobs))
        out = []
        for per_request in layout:
            out.append([[PhaseTime(ph.name, ph.steps, next(times), op + ph.reduced_bytes * g)
                         for ph, op, g in per_buffer] for per_buffer in per_request])
        return out


def total(result: List[List[PhaseTime]]) -> float:
    return sum(p.seconds for buf in result for p in buf)


# ==================================================================================================
# ResNet-50's gradients as tftorus' fusion cuts them
# ==================================================================================================

def resnet50_buckets(bytes_per_element: int = 2,
                     threshold: Optional[int] = None) -> List[int]:
    """Byte sizes of the fused buffers tftorus sends for ResNet-50's 214 gradients on a wire of
    `bytes_per_element` (2: FP16), cut by tftorus.torus.fusion.plan_buckets (16 MiB by default).
    Builds Keras' ResNet-50 for the shapes (TensorFlow; a study only)."""
    import tensorflow as tf

    from studies.benchmark_allreduce import resnet50_shapes
    from tftorus.torus import fusion
    dtype = {2: tf.float16, 4: tf.float32}[bytes_per_element]
    specs = [tf.TensorSpec(s, dtype) for s in resnet50_shapes()]
    buckets = fusion.plan_buckets(specs, fusion.DEFAULT_THRESHOLD_BYTES if threshold is None
                                  else threshold)
    sizes = [b.nbytes for b in buckets]
    assert sum(sizes) == cm.RESNET50_PARAMS * bytes_per_element, sum(sizes)
    return sizes


# ==================================================================================================
# Calibration: the emulated clusters
# ==================================================================================================

#: Medians (ms) measured on the emulated clusters (docs/studies/scale.md, "Calibration";
#: 2026-11-26, main job at 504.5 images/s), 5 repeats, made by
#:   sudo .venv/bin/python -m studies.emulated_cluster --sweep 2x2 2x4 4x2 --links-per-host 1 \
#:       rank --engines horovod --variants hvd torus ring hierarchical --sizes 16M \
#:       --resnet fp32 --repeats 5 --fusion-threshold-mb 128 --out /tmp/tftorus_rails
#: and the fixed costs' 4 KiB all-reduces by the same with --sweep 2x2 2x4 --sizes 4K --resnet.
#: (hosts, ranks, links) -> workload -> (ring, hierarchical, torus). --csv reads a fresh run.
MEASURED_RAILS = {
    (2, 2, 1): {"flat 4 KiB": (7.2, 13.7, 13.3), "flat 16 MiB": (870, 616, 589),
                "resnet50 fp32": (5207, 3843, 3681)},
    (2, 2, 2): {"flat 4 KiB": (8.7, 11.0, 12.0), "flat 16 MiB": (898, 615, 334),
                "resnet50 fp32": (5234, 3783, 3658)},
    (2, 4, 1): {"flat 4 KiB": (21.4, 33.4, 28.8), "flat 16 MiB": (1002, 690, 638),
                "resnet50 fp32": (6102, 4216, 3923)},
    (2, 4, 4): {"flat 4 KiB": (24.0, 36.1, 32.4), "flat 16 MiB": (1019, 695, 222),
                "resnet50 fp32": (6108, 4324, 1322)},
    (4, 2, 1): {"flat 16 MiB": (1002, 966, 966), "resnet50 fp32": (6211, 5852, 5652)},
    (4, 2, 2): {"flat 16 MiB": (1059, 985, 495), "resnet50 fp32": (6192, 5917, 5633)},
}
CAL_ALGOS = ("ring", "hierarchical", "torus")
MIB = 1 << 20
#: ResNet-50's FP32 gradient set, 97.6 MiB.
RESNET50_FP32_BYTES = 4 * cm.RESNET50_PARAMS


def read_rails_csv(path: str) -> Dict[tuple, Dict[str, tuple]]:
    """MEASURED_RAILS' shape from a studies.emulated_cluster CSV (variant medians; rows at
    0.25 Gbit/s, the rate the calibration simulates; others are left out, and counted)."""
    import csv
    out: Dict[tuple, Dict[str, Dict[str, float]]] = {}
    skipped = 0
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("kind") != "variant" or row.get("name") not in CAL_ALGOS:
                continue
            if abs(float(row.get("link_gbit") or 0) - EMULATED_LINK_BW * 8 / 1e9) > 1e-9:
                skipped += 1
                continue
            if row["workload"].startswith("resnet50") and float(row.get("fusion_mb") or 128) < 128:
                # the simulator sends the set as one buffer, as the study did before its
                # default became tftorus' 16 MiB buckets
                raise SystemExit(
                    f"{path}: the ResNet-50 rows were measured in {row['fusion_mb']} MiB buckets; "
                    f"the calibration simulates the set as one buffer: run studies.emulated_cluster "
                    f"with --fusion-threshold-mb 128")
            links = row.get("links_per_host") or "1"
            key = (int(row["hosts"]), int(row["ranks_per_host"]), int(links))
            out.setdefault(key, {}).setdefault(row["workload"], {})[row["name"]] = float(
                row["median_ms"])
    if skipped:
        print(f"{path}: {skipped} rows at other link rates than "
              f"{EMULATED_LINK_BW * 8 / 1e9:g} Gbit/s left out", file=sys.stderr)
    return {k: {w: tuple(v.get(a, math.nan) for a in CAL_ALGOS) for w, v in ws.items()}
            for k, ws in out.items()}


# ==================================================================================================
# The paper's scale
# ==================================================================================================

SWEEP_SIZES = (64, 128, 256, 512, 1024, 2048, 3456, 4096)


class SimulatedModel:
    """What cal.StepModel needs of a cost model (seconds, topology), answered from simulated
    all-reduce times: the cost model's step model, with the simulator's communication."""

    def __init__(self, seconds: Dict[Tuple[str, int, int], float], ranks_per_host: int = 4):
        self._seconds = seconds
        self.topology = cm.Topology(ranks_per_host=ranks_per_host, nics_per_host=2)

    def seconds(self, algorithm: str, grid: TorusGrid, nbytes: float, **kw) -> float:
        return self._seconds[(algorithm, grid.size, grid.x)]


def torus_grids(size: int) -> Dict[str, TorusGrid]:
    grids = {"planner": plan_grid(size, 4)}
    if size in PAPER_GRIDS:
        grids["paper"] = TorusGrid(size=size, x=PAPER_GRIDS[size][1])
    return grids


#: TCP over the emulated links: `tbf` counts each Ethernet frame (1,514 bytes at the veth's
#: 1,500-byte MTU) and a frame carries 1,448 bytes of payload (IPv4 20 + TCP 32 with Linux's
#: default timestamps): the payload rate is 1448/1514 of the link's. Derived, not fitted.
TCP_PAYLOAD_FRACTION = 1448 / 1514

#: The emulated hosts' row phases timed alone (Horovod engine, every host at work; medians,
#: ms), as docs/studies/emulated_cluster.md quotes them, the 2 x 2 from
#:   sudo .venv/bin/python -m studies.emulated_cluster --hosts 2 --ranks-per-host 2 \
#:       --link-gbit 0.25 --engines horovod tf --sizes 16M 64M --resnet fp32 --repeats 3 ...
#:   ("2 hosts x 2 ranks ... with 4 chunks", 2026-11-24; its Horovod phases)
#: and the 2 x 4 from
#:   sudo .venv/bin/python -m studies.emulated_cluster --hosts 2 --ranks-per-host 4 \
#:       --link-gbit 0.25 --engines horovod --sizes 16M 64M --resnet fp32   (2026-11-24)
#: (hosts, ranks) -> workload -> (row reduce-scatter, row all-gather). They fix the two
#: costs the network leaves out, one machine-wide copy rate for loopback and Horovod's fixed
#: cost per collective; the all-reduces the calibration predicts are other runs.
MEASURED_ROW_PHASES = {
    (2, 2): {"flat 16 MiB": (34, 25), "flat 64 MiB": (85, 61), "resnet50 fp32": (130, 109)},
    (2, 4): {"flat 16 MiB": (55, 51), "flat 64 MiB": (174, 148), "resnet50 fp32": (259, 226)},
}


def workload_bytes(workload: str) -> int:
    """Bytes of a benchmark workload: 'flat 16 MiB', 'flat 64 KiB', 'resnet50 fp32'."""
    if workload == "resnet50 fp32":
        return RESNET50_FP32_BYTES  # one buffer: the benchmark's fusion threshold is 128 MiB
    if workload == "resnet50 fp16":
        return cal.RESNET50_FP16_BYTES
    _, number, unit = workload.split()
    return int(number) * {"KiB": 1 << 10, "MiB": MIB, "GiB": 1 << 30}[unit]


def row_phase_volume(hosts: int, ranks: int, nbytes: float) -> float:
    """Bytes all ranks of all hosts move over loopback in one row reduce-scatter (= all-gather)
    of `nbytes` with a row per host: X-1 steps of n/X per rank."""
    return hosts * ranks * (ranks - 1) * nbytes / ranks


def fit_host_costs() -> Tuple[float, float, float]:
    """(copy bytes/s for the whole machine, seconds per collective, rms relative error): the
    least-squares line t = per_op + volume / copy through MEASURED_ROW_PHASES."""
    import numpy as np
    rows, times = [], []
    for (h, r), ws in MEASURED_ROW_PHASES.items():
        for w, pair in ws.items():
            for t in pair:
                rows.append([1.0, row_phase_volume(h, r, workload_bytes(w))])
                times.append(t * 1e-3)
    a, t = np.array(rows), np.array(times)
    w = 1.0 / t  # relative error
    (per_op, inv_bw), *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    err = (a @ [per_op, inv_bw] - t) / t
    return 1.0 / inv_bw, float(per_op), float(np.sqrt(np.mean(err ** 2)))


def calibration_specs(measured: Dict[tuple, Dict[str, tuple]]) -> List[ClusterSpec]:
    """Each measured emulated cluster twice: as calibrated ('emu...') and bare ('bare...':
    nominal link rate, free loopback; the network alone)."""
    copy_bw, _, _ = fit_host_costs()
    specs = [emulated(f"emu{h}x{r}l{k}", h, r, k, link_bw=EMULATED_LINK_BW * TCP_PAYLOAD_FRACTION,
                      copy_bw=copy_bw) for (h, r, k) in sorted(measured)]
    return specs + [emulated(f"bare{h}x{r}l{k}", h, r, k) for (h, r, k) in sorted(measured)]


#: The workload whose bytes cost next to nothing: what its all-reduces take is fixed costs.
FIXED_COST_WORKLOAD = "flat 4 KiB"


def fixed_costs(measured: Dict[tuple, Dict[str, tuple]]
                ) -> Dict[Optional[Tuple[int, int]], Tuple[float, float]]:
    """(seconds per call, seconds per collective in it) per emulated cluster (hosts, ranks), from
    the 4 KiB all-reduces measured beside the others, and under None the median over them for
    clusters without: a ring is one collective, a torus and a leader-based hierarchical three
    (one after the other, in one call), so per collective = (torus - ring) / 2 and
    (hierarchical - ring) / 2, their median over the cluster's runs; per call = ring - that.
    Both grow with the ranks sharing this machine's cores. Empty where the run has no 4 KiB
    rows."""
    ring, hier, torus = (CAL_ALGOS.index(a) for a in ("ring", "hierarchical", "torus"))

    def split(smalls):
        per_op = statistics.median([(t[x] - t[ring]) / 2 for t in smalls for x in (hier, torus)])
        return (statistics.median([t[ring] for t in smalls]) - per_op) * 1e-3, per_op * 1e-3

    by_cluster: Dict[Tuple[int, int], list] = {}
    for (h, r, _), ws in measured.items():
        if FIXED_COST_WORKLOAD in ws:
            by_cluster.setdefault((h, r), []).append(ws[FIXED_COST_WORKLOAD])
    out = {key: split(smalls) for key, smalls in by_cluster.items()}
    if out:
        out[None] = split([t for smalls in by_cluster.values() for t in smalls])
    return out


def calibration(platform: Platform, measured: Dict[tuple, Dict[str, tuple]]) -> List[dict]:
    """Predict every measured emulated all-reduce; rows of a side-by-side table. The fixed
    costs come from the run's 4 KiB rows where it has them (fixed_costs; those rows are not
    predicted), else every collective pays the row-phase fit's intercept (a phase timed alone:
    one call of one collective)."""
    copy_bw, intercept, fit_err = fit_host_costs()
    split = fixed_costs(measured)
    sim = Simulator(platform)
    requests, keys, per_call = [], [], []
    for (h, r, k), workloads in sorted(measured.items()):
        grid = TorusGrid(size=h * r, x=r)
        call, per_op = split.get((h, r), split.get(None, (0.0, intercept)))
        for w in workloads:
            if w == FIXED_COST_WORKLOAD:
                continue
            for a in CAL_ALGOS:
                n = workload_bytes(w)
                requests.append((f"emu{h}x{r}l{k}", a, grid, [n], "compact", per_op, 0.0))
                requests.append((f"bare{h}x{r}l{k}", a, grid, [n], "compact", 0.0, 0.0))
                keys.append((h, r, k, w, a))
                per_call.append(call)
    results = sim.many(requests)
    rows = []
    for i, (h, r, k, w, a) in enumerate(keys):
        full, floor = total(results[2 * i]) + per_call[i], total(results[2 * i + 1])
        meas = measured[(h, r, k)][w][CAL_ALGOS.index(a)] * 1e-3
        rows.append(dict(hosts=h, ranks=r, links=k, workload=w, algorithm=a, floor=floor,
                         simulated=full, measured=meas, error=(full - meas) / meas))
    rows.append(dict(copy_bw=copy_bw, intercept=intercept, fit_err=fit_err, split=split))
    return rows


def print_calibration(rows: List[dict], source: str) -> None:
    fit = rows[-1]
    rows = rows[:-1]
    print("## Calibration: the emulated clusters, simulated against measured\n")
    print(f"- measured: {source}")
    print(f"- simulated: host links {EMULATED_LINK_BW * 8 / 1e9:.2f} Gbit/s x TCP payload "
          f"{TCP_PAYLOAD_FRACTION:.3f} = {EMULATED_LINK_BW * TCP_PAYLOAD_FRACTION / 1e6:.2f} MB/s "
          f"each way, no latency; loopback of all hosts through one copy link of "
          f"{fit['copy_bw'] / 1e9:.2f} GB/s (fitted to the row phases timed alone, "
          f"MEASURED_ROW_PHASES: rms {fit['fit_err']:.1%}); "
          + ("fixed costs from the run's " + FIXED_COST_WORKLOAD + " all-reduces, per call and "
             "per collective in it: " + "; ".join(
                 f"{'others' if key is None else f'{key[0]} x {key[1]}'} {c * 1e3:.1f} + "
                 f"{o * 1e3:.1f} ms" for key, (c, o) in fit["split"].items())
             if fit["split"] else
             f"{fit['intercept'] * 1e3:.1f} ms per collective (that fit's intercept)"))
    print("- floor: the same simulation with the nominal link rate and nothing else (the "
          "network alone)\n")
    print("| hosts x ranks | links per host | workload | algorithm | floor ms | simulated ms | "
          "measured ms | simulated / measured - 1 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        flag = " **" if abs(r["error"]) > 0.15 else ""
        print(f"| {r['hosts']} x {r['ranks']} | {r['links']} | {r['workload']} | "
              f"{r['algorithm']} | {r['floor'] * 1e3:.0f} | {r['simulated'] * 1e3:.0f} | "
              f"{r['measured'] * 1e3:.0f} | {r['error']:+.1%}{flag} |")
    within = sum(abs(r["error"]) <= 0.15 for r in rows)
    print(f"\n{within} of {len(rows)} within 15 % (** marks the others).\n")


# ==================================================================================================
# ABCI at the paper's scale
# ==================================================================================================

@dataclasses.dataclass(frozen=True)
class Variant:
    """One way of running the sweep: which cluster, which buffers, where the job sits."""

    label: str
    cluster: str = "abci"
    # 'one': the paper's single fused FP16 buffer; 'buckets': tftorus' fusion buckets, one after
    # the other (the Horovod engine: no chunks); 'chunks': those buckets on the tf engine, the
    # torus cutting each into chunks and pipelining them (algorithms.pipeline_chunks)
    buffers: str = "one"
    how: str = "compact"
    seed: int = 0  # of the random placements


ABCI = "abci"  # 24 uplinks per rack of 34 nodes (1/3 oversubscription)
ABCI_FULL = "abci-full-bisection"  # the same with no limit above the rack
ABCI_NEEDED = "abci-needed"  # DIAGNOSTIC: fewer effective uplinks (what Table 6 would need)
NEEDED_UPLINKS = 14
PAPER_SIZES = (1024, 2048, 3456, 4096)


def abci_specs() -> List[ClusterSpec]:
    return [abci(ABCI), dataclasses.replace(abci(ABCI_FULL), uplink_bw=0.0),
            abci(ABCI_NEEDED, uplinks_per_rack=NEEDED_UPLINKS)]


#: The sweep's variants; the first is the main prediction.
VARIANTS = (
    Variant("compact, one buffer (the paper's)"),
    Variant("compact, tftorus' FP16 buckets", buffers="buckets"),
    Variant("compact, tftorus' FP16 buckets in pipelined chunks (tf engine)", buffers="chunks"),
    Variant("compact, no oversubscription", cluster=ABCI_FULL),
    Variant("fragmented (random nodes, in node order), one buffer", how="fragmented"),
    Variant("scattered (random nodes, random order), one buffer", how="scattered"),
    Variant(f"DIAGNOSTIC: scattered, {NEEDED_UPLINKS} effective uplinks per rack",
            cluster=ABCI_NEEDED, how="scattered"),
)


def platform_spec(name: str) -> ClusterSpec:
    return {s.name: s for s in abci_specs()}[name]


def abci_requests(variant: Variant, sizes: Sequence[int], buckets: Sequence[int],
                  algorithms: Sequence[str] = ("ring", "hierarchical", "nccl-hierarchical",
                                               "torus")) -> List[tuple]:
    """(key, request) for every algorithm and grid of every size, plus the 4-GPU base."""
    p = cm.abci_params()
    bufs = [cal.RESNET50_FP16_BYTES] if variant.buffers == "one" else list(buckets)
    out = []
    for n in (4,) + tuple(sizes):
        grids = {}
        for a in algorithms:
            if a == "torus":
                for g in list(torus_grids(n).values()) + [cm.grid_for_algorithm("torus", n, 4)]:
                    grids[(a, g.x)] = g
            elif a in ("hierarchical", "nccl-hierarchical"):
                g = cm.grid_for_algorithm("hierarchical", n, 4)
                grids[(a, g.x)] = g
            elif n > 4 or a == "ring":
                g = plan_grid(n, 4)
                grids[(a, g.x)] = g
        for (a, x), g in grids.items():
            sizes_here = bufs
            if variant.buffers == "chunks" and a == "torus":
                sizes_here = [b / chunks_of(g, b) for b in bufs]
            how = variant.how if variant.how == "compact" else placement(
                platform_spec(variant.cluster), n, variant.how, variant.seed)
            out.append(((a, n, x), (variant.cluster, a, g, sizes_here, how, p.per_op,
                                    p.gamma)))
    return out


def run_variants(platform: Platform, variants: Sequence[Variant], sizes: Sequence[int],
                 buckets: Sequence[int], algorithms: Sequence[str] = ALGORITHMS
                 ) -> Dict[str, Dict[tuple, List[List[PhaseTime]]]]:
    """Every variant's all-reduces in one simulation: label -> (algorithm, size, x) -> phases."""
    sim = Simulator(platform)
    keyed = [(v.label, key, req) for v in variants
             for key, req in abci_requests(v, sizes, buckets, algorithms)]
    results = sim.many([req for _, _, req in keyed])
    out: Dict[str, Dict[tuple, List[List[PhaseTime]]]] = {v.label: {} for v in variants}
    chunked = {v.label for v in variants if v.buffers == "chunks"}
    for (label, key, req), res in zip(keyed, results):
        if label in chunked and key[0] == "torus":
            grid = req[2]
            res = [[PhaseTime("pipelined torus", 1, pipelined(phases_, chunks_of(grid, b)), 0.0)]
                   for phases_, b in zip(res, buckets)]
        out[label][key] = res
    return out


def chunks_of(grid: TorusGrid, nbytes: float) -> int:
    """How many chunks tftorus' torus cuts a 16-bit bucket into on an engine that runs groups
    at once (the tf engine) in a multi-node world: algorithms.pipeline_chunks' rule."""
    from types import SimpleNamespace

    import tensorflow as tf

    from tftorus.torus import algorithms
    comm = SimpleNamespace(local_size=4, size=grid.size, concurrent_groups=True,
                           rank_ordered_sums=True)
    return algorithms.pipeline_chunks("torus", grid, comm, int(nbytes), dtype=tf.float16)


def pipelined(chunk_phases: List[PhaseTime], k: int) -> float:
    """A bucket of k equal chunks through the torus' pipeline: chunk i's column all-reduce runs
    beside chunk i+1's row reduce-scatter and chunk i-1's row all-gather (those two share the
    row links: one after the other). Each phase as simulated alone (no contention between the
    phases running at once: optimistic)."""
    if len(chunk_phases) != 3:  # a grid without rows or columns: nothing to pipeline
        return k * sum(p.seconds for p in chunk_phases)
    rs, col, ag = (p.seconds for p in chunk_phases)
    middle = sum(max(col, (rs if i < k else 0.0) + (ag if i > 1 else 0.0))
                 for i in range(1, k + 1))
    return rs + middle + ag


def step_model(results: Dict[tuple, List[List[PhaseTime]]]) -> cal.StepModel:
    """The cost model's step model (studies/cost_calibration.py) on simulated all-reduces."""
    return cal.StepModel(SimulatedModel({k: total(v) for k, v in results.items()}))


def paper_grid(size: int) -> TorusGrid:
    return TorusGrid(size=size, x=PAPER_GRIDS[size][1]) if size in PAPER_GRIDS else plan_grid(
        size, 4)


def implied_torus_ms(size: int, sm: cal.StepModel) -> float:
    """The all-reduce time Table 6's step implies: N x 32 / img/s less the compute."""
    return (size * cal.PAPER_BATCH_PER_GPU / cal.PAPER_TABLE6[size] - sm.compute_seconds) * 1e3


def print_sweep(results, variant: Variant, sizes: Sequence[int]) -> None:
    from studies import scale_model as smod
    sm = step_model(results[variant.label])
    cmodel = smod.step_model()
    cmodel1 = smod.step_model(nics_per_rank=1)
    print(f"### {variant.label}\n")
    print("| GPUs | ring ms | hierarchical ms | NCCL hierarchical ms | torus grid (Table 4) | "
          "torus ms | planner's grid | torus ms | cost model torus ms (HCAs pooled / one per "
          "GPU pair) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        g, pg = paper_grid(n), plan_grid(n, 4)
        hg = cm.grid_for_algorithm("hierarchical", n, 4)
        print(f"| {n} | {sm.comm_seconds('ring', n) * 1e3:.1f} | "
              f"{sm.comm_seconds('hierarchical', n, hg) * 1e3:.1f} | "
              f"{sm.comm_seconds('nccl-hierarchical', n, hg) * 1e3:.1f} | "
              f"{g if n in PAPER_GRIDS else '-'} | "
              f"{sm.comm_seconds('torus', n, g) * 1e3:.2f} | {pg} | "
              f"{sm.comm_seconds('torus', n, pg) * 1e3:.2f} | "
              f"{cmodel.comm_seconds('torus', n, g) * 1e3:.2f} / "
              f"{cmodel1.comm_seconds('torus', n, g) * 1e3:.2f} |")
    print()


def efficiencies(results, variants: Sequence[Variant], sizes: Sequence[int]
                 ) -> Dict[str, List[float]]:
    out = {}
    for v in variants:
        sm = step_model(results[v.label])
        out[v.label] = [sm.efficiency("torus", n, paper_grid(n)) for n in sizes]
    return out


def print_table6(results, variants: Sequence[Variant]) -> Dict[str, List[float]]:
    from studies import scale_model as smod
    sizes = PAPER_SIZES
    effs = efficiencies(results, variants, sizes)
    print("## Table 6: torus efficiency %, simulated, beside the paper's and the cost model's\n")
    print("Table 4's grids; step = compute + all-reduce (the cost model's StepModel, no "
          "overlap; compute from Table 6's 4-GPU point less that row's own simulated 4-GPU "
          "all-reduce); efficiency against Table 6's 4-GPU img/s x N/4.\n")
    print("| | " + " | ".join(str(n) for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    print("| Table 6 | " + " | ".join(f"{cal.PAPER_TABLE6_EFFICIENCY[n]:.2f}" for n in sizes)
          + " |")
    for label, sm in (("cost model, base (a node's 2 HCAs pooled)", smod.step_model()),
                      ("cost model, one HCA per rank", smod.step_model(nics_per_rank=1))):
        print(f"| {label} | " + " | ".join(
            f"{sm.efficiency('torus', n, paper_grid(n)):.1f}" for n in sizes) + " |")
    for v in variants:
        print(f"| simulated: {v.label} | " + " | ".join(
            f"{e:.1f} ({e - cal.PAPER_TABLE6_EFFICIENCY[n]:+.1f})"
            for n, e in zip(sizes, effs[v.label])) + " |")
    print("\n(in brackets: simulated - Table 6, percentage points)\n")
    return effs


def print_phases(results, variants: Sequence[Variant]) -> None:
    print("## Where the torus' time goes (one buffer, Table 4's grids), ms\n")
    print("| GPUs | grid | variant | row reduce-scatter | column all-reduce | row all-gather | "
          "torus | Table 6 implies |")
    print("|---|---|---|---|---|---|---|---|")
    for n in PAPER_SIZES:
        g = paper_grid(n)
        for v in variants:
            if v.buffers != "one":
                continue
            res = results[v.label][("torus", n, g.x)][0]
            sm = step_model(results[v.label])
            print(f"| {n} | {g} | {v.label} | " + " | ".join(f"{p.seconds * 1e3:.2f}"
                                                           for p in res)
                  + f" | {sum(p.seconds for p in res) * 1e3:.2f} | "
                    f"{implied_torus_ms(n, sm):.2f} |")
    print()


SEEDS = (0, 1, 2, 3, 4)


def print_seeds(platform: Platform) -> None:
    """The random placements depend on their draw: torus efficiency over several seeds."""
    variants = [Variant(f"{how} seed {seed}", how=how, seed=seed)
                for how in ("scattered", "fragmented") for seed in SEEDS]
    results = run_variants(platform, variants, PAPER_SIZES, [], algorithms=("torus",))
    effs = efficiencies(results, variants, PAPER_SIZES)
    print("## Random placements: torus efficiency % by seed (one buffer, Table 4's grids)\n")
    print("| placement | " + " | ".join(str(n) for n in PAPER_SIZES) + " |")
    print("|---|" + "---|" * len(PAPER_SIZES))
    for how in ("fragmented", "scattered"):
        rows = [effs[f"{how} seed {seed}"] for seed in SEEDS]
        print(f"| {how}, seeds {SEEDS[0]}-{SEEDS[-1]}: min - max | " + " | ".join(
            f"{min(col):.1f} - {max(col):.1f}" for col in zip(*rows)) + " |")
    print()


def plot(png: str, results, effs_sizes: Sequence[int]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from studies import scale_model as smod
    fig, ax = plt.subplots(figsize=(7.5, 6.0))
    sizes = [n for n in effs_sizes]
    cmodel = smod.step_model()
    ax.plot(sizes, [cmodel.efficiency("torus", n, paper_grid(n)) for n in sizes], "k--",
            label="cost model (HCAs pooled)")
    styles = ["o-", "s-", "d--", None, "v-", "^-", "x:"]
    for v, style in zip(VARIANTS, styles):
        if style is None:
            continue
        sm = step_model(results[v.label])
        ax.plot(sizes, [sm.efficiency("torus", n, paper_grid(n)) for n in sizes], style,
                label=f"simulated: {v.label}")
    ax.plot(list(PAPER_SIZES), [cal.PAPER_TABLE6_EFFICIENCY[n] for n in PAPER_SIZES], "r*",
            markersize=14, label="Table 6 (measured)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(n) for n in sizes], fontsize=8)
    for label in ax.get_xticklabels()[-2:]:
        label.set_rotation(40)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("scaling efficiency, % (torus, batch 32 per GPU)")
    ax.set_title("ResNet-50 on ABCI: Table 6 against the cost model and SimGrid")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}\n")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--csv", nargs="+", default=None,
                   help="studies.emulated_cluster CSVs to calibrate against, e.g. a sweep's "
                        "/tmp/tftorus_rails/*/allreduce.csv (default: the medians "
                        "docs/studies/scale.md quotes, MEASURED_RAILS)")
    p.add_argument("--only", choices=("calibration", "abci"), default=None,
                   help="run one part only")
    p.add_argument("--png", default=DEFAULT_PNG, help="efficiency plot (default: %(default)s)")
    p.add_argument("--no-plot", dest="plot", action="store_false", help="skip the PNG")
    return p.parse_args(argv)


def main(argv: Sequence[str] = None) -> int:
    args = parse_args(argv)
    if load_simgrid() is None:
        print(f"skipped: {SIMGRID_MISSING}", file=sys.stderr)
        return 77
    measured, source = MEASURED_RAILS, (
        "medians quoted in docs/studies/scale.md (2026-11-26; MEASURED_RAILS)")
    if args.csv:
        measured, source = {}, " ".join(args.csv)
        for path in args.csv:
            for key, workloads in read_rails_csv(path).items():
                measured.setdefault(key, {}).update(workloads)
    specs = []
    if args.only != "abci":
        specs += calibration_specs(measured)
    buckets: List[int] = []
    if args.only != "calibration":
        specs += abci_specs()
        buckets = resnet50_buckets()
    platform = Platform(specs)
    if args.only != "abci":
        print_calibration(calibration(platform, measured), source)
    if args.only == "calibration":
        return 0
    print("## ABCI at the paper's scale\n")
    print(f"- ResNet-50's gradients in FP16: one buffer of {cal.RESNET50_FP16_BYTES / 1e6:.1f} "
          f"MB (the paper), or tftorus' fusion buckets: "
          + ", ".join(f"{b / 1e6:.1f}" for b in buckets) + " MB (16 MiB threshold): on the "
          "Horovod engine one after the other, no chunks; on the tf engine the torus cuts them "
          "into " + ", ".join(str(chunks_of(paper_grid(4096), b)) for b in buckets)
          + " chunks and pipelines them")
    print("- per collective 8.4 us and summing 3.33 ps/byte added to the simulated network "
          "time, as in the cost model (cm.abci_params)\n")
    results = run_variants(platform, VARIANTS, SWEEP_SIZES, buckets)
    for v in VARIANTS[:3]:
        print_sweep(results, v, SWEEP_SIZES)
    print_table6(results, VARIANTS)
    print_phases(results, VARIANTS)
    print_seeds(platform)
    if args.plot:
        plot(args.png, results, SWEEP_SIZES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
