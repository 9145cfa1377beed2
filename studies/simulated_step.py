"""The emulated cluster's training step with overlap, predicted by the simulator (issue 49).

    .venv/bin/python -m studies.simulated_step                  # the steps docs quote (MEASURED)
    .venv/bin/python -m studies.simulated_step --csv /tmp/tftorus_step/*/steps.csv
    .venv/bin/python -m studies.simulated_step --clusters 2x2 2x4 --link-gbit 0.25 \\
        --wires fp16 fp32 --compute-s 1.3 2.6                   # predictions only

studies/emulated_step.py --model virtual measures training steps of the virtual accelerator's
ResNet-50 (studies/virtual_accelerator.py: its passes wait without CPU, its gradients appear
layer by layer in the backward pass) on the emulated cluster. This module predicts the same
steps from three things: the accelerator's schedule, each optimizer's way of sending what is
ready, and the all-reduce costs of studies/simulated_cluster.py's SimGrid model of the emulated
hosts with its existing calibration (host links at the TCP payload rate, one machine-wide copy
link for loopback, fixed costs per call and per collective from the emulated 4 KiB all-reduces:
sc.fixed_costs). Nothing is fitted to the steps: the measured steps are only printed beside
the predictions, with simulated / measured.

The step (t = 0 when the forward pass starts):
  compute   layer_profile(compute - UPDATE_SECONDS): the measured compute-alone step (the
            `compute` variant: forward + backward + the optimizer's update, no reduction) less
            the update, split over the layers as the accelerator splits it; each layer's
            gradients ready at readiness(profile); the backward pass ends at compute - update.
  step      max(backward end, last gradient summed) + UPDATE_SECONDS.
  alone     the variant's all-reduce with every gradient ready at 0, plus the fixed cost of
            one call (emulated_step times one call of the optimizer's reduction, as the
            calibration's benchmark timed one call; inside a traced step no call is added).

The optimizers (all in the simulator's costs: SimulatedCosts of studies/planner_sweep.py,
every phase affine in bytes between two simulated sizes, plus the calibration's fixed cost per
collective):
  hvd       Horovod 0.28.1's DistributedOptimizer on its background loop: a cycle starts
            HOROVOD_CYCLE_SECONDS after the previous one started, or when the previous one's
            collectives end, whichever is later; it takes every gradient ready by its start that
            is not yet sent, in ready order, fused greedily into buffers of at most
            HOROVOD_FUSION_BYTES, and runs them one after the other, each a ring all-reduce over
            all ranks (Gloo). `horovod_responses`.
  default   tftorus' DistributedOptimizer with nothing set: the plan the runtime makes before any
            replan (planner.first_plan on the links the link probe measures, here the simulated
            probe; the engine as tftorus/runtime/reduction.py builds it; the grid as
            tftorus/runtime/process_state.py picks it: plan_grid at init on Horovod, whose process
            sets are fixed then, re-planned from the links on the tf engine), its buckets'
            all-reduces queued by planner.timeline, each from its bucket's ready time (the last of
            its gradients): one collective at a time on the classic stack's Horovod engine, the
            torus' row and column queues on the current stack's tf engine (and on the classic
            stack's `default-tf`, tftorus' tf engine beside Horovod). Where the CSV's run logged its
            links and plans (its rank logs beside it), the table says whether the model's plan is
            the run's; --run-links plans on the run's links instead of the simulated probe's.
  replanned the same after ReplanCallback: planner.plan with the gradients' ready times after the
            first one's, as the step's clocks measure them (here the schedule's, exactly).
  mwms      tf.distribute.MultiWorkerMirroredStrategy, ring, FP32 (the current stack's peer).
            Read from TF 2.21 and Keras 3 sources: Keras' TF optimizer sums the gradients with
            one replica_context.all_reduce(SUM, grads) after the tape's gradient
            (_all_reduce_sum_gradients); on CPUs MWMS takes merge_call into
            CollectiveAllReduce._all_reduce, which reverses the list and packs it with
            cross_device_utils.group_by_size(values, bytes_per_pack); CommunicationOptions'
            bytes_per_pack defaults to 0 (emulated_step sets only the implementation), which is
            one pack: a concat of every gradient, one all_reduce_v2 (ring). So its all-reduce
            starts when the backward pass ends, one ring of every FP32 byte. mwms-packN
            (bytes_per_pack = N MiB): the packs group_by_size cuts, each a ring all-reduce once
            its last gradient exists, one after the other (the launcher's ordering token orders
            its collectives). Assumed: TF's CPU ring reducer moves a ring's bytes and its fixed
            cost is the Horovod engine's (no calibration of its own); the concat and split
            copies cost nothing.

A study: the product never imports it. Needs SimGrid (exits 77 without it, as
studies/simulated_cluster.py does); one SimGrid platform per process, so every cluster of a
run is built into one.
"""
import argparse
import csv
import dataclasses
import glob
import math
import os
import re
import statistics
import sys
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence, Tuple

from studies import planner_sweep as ps
from studies import simulated_cluster as sc
from studies.virtual_accelerator import CLASSES, layer_profile, readiness, resnet50_layers
from tftorus.planning import cost_model as cm
from tftorus.planning import link_probe, planner
from tftorus.torus.grid import TorusGrid, plan_grid

WIRE_BYTES = {"fp16": 2, "fp32": 4}
# tftorus.torus.fusion.tensor_sizes' dtype names
WIRE_DTYPES = {"fp16": "float16", "fp32": "float32"}
#: Horovod 0.28.1's defaults: HOROVOD_CYCLE_TIME (ms) and HOROVOD_FUSION_THRESHOLD (bytes).
HOROVOD_CYCLE_SECONDS = 1e-3
HOROVOD_FUSION_BYTES = 64 << 20
#: The optimizer's update and Keras' per-step work after the backward pass: what the measured
#: compute-alone step took beyond the --compute-s it was set to in the run of 2026-11-27
#: (1.2875 s for 1.2721 at FP16, 2.4466 s for 2.4297 at FP32: 15 and 17 ms), not a fit to the
#: steps predicted here.
UPDATE_SECONDS = 0.015
#: Step errors beyond this are flagged: the model is meant to predict the step within it.
WITHIN = 0.10
STACKS = ("classic", "current")
#: What each stack runs: the peer, then tftorus' DistributedOptimizer on its engine.
STACK_VARIANTS = {"classic": ("hvd", "default"), "current": ("mwms", "default")}
STACK_ENGINES = {"classic": "horovod", "current": "tf"}
MIB = 1 << 20


# ==================================================================================================
# What was measured
# ==================================================================================================

@dataclasses.dataclass(frozen=True)
class Case:
    """One measured (or asked-for) step: a cluster, wire, stack and compute, and per variant the
    measured medians (step s, all-reduce alone s; None where not measured)."""

    hosts: int
    ranks: int
    link_gbit: float
    wire: str
    stack: str
    compute_s: float
    measured: Tuple[Tuple[str, Optional[float], Optional[float]], ...] = ()
    source: str = ""
    run_links: Optional[str] = None  # the TFTORUS_LINKS its run logged
    run_plans: Tuple[str, ...] = ()  # the plans its run logged (plan_text's form)
    run_clocked_span_s: Optional[float] = None  # replan()'s clocks: first to last gradient

    @property
    def cluster(self) -> str:
        return f"{self.hosts}x{self.ranks}"

    def variants(self) -> Tuple[str, ...]:
        """What to predict: the stack's variants (MWMS only on its FP32 wire; unmeasured cases
        also tftorus after replan()) and whatever else was measured here."""
        mine = tuple(v for v in STACK_VARIANTS[self.stack] + ("replanned",) * (not self.measured)
                     if not (v == "mwms" and self.wire != "fp32"))
        return mine + tuple(v for v, _, _ in self.measured if v not in mine
                            and v not in ("mwms-as-shipped", "compute"))

    def measured_of(self, variant: str) -> Tuple[Optional[float], Optional[float]]:
        for v, step, alone in self.measured:
            if v == variant:
                return step, alone
        return None, None


#: The steps docs/studies/emulated_step.md quotes ("Compute off the CPU", 2026-11-27, after the
#: planner's tail cut; 2 repeats, medians, the all-reduce alone from the runs' CSVs): 2 x 2 at
#: r = 2 (FP16, FP32; tftorus on both engines), 1 and 0.2 (FP16), and 2 x 4 at r = 2 (two runs
#: at FP16) and 1 (HOROVOD_CYCLE_TIME=5 there; the cycle moves these predictions by under 2 ms).
MEASURED = [
    Case(2, 2, 0.25, "fp16", "classic", 1.267, (("hvd", 2.944, 2.538), ("default", 2.260, 1.815),
                                                ("default-tf", 2.300, 1.810)), "2 x 2, r = 2"),
    Case(2, 2, 0.25, "fp32", "classic", 2.459, (("hvd", 5.787, 4.834), ("default", 4.355, 3.439),
                                                ("default-tf", 4.362, 3.439)), "2 x 2, r = 2"),
    Case(2, 2, 0.25, "fp16", "classic", 2.601, (("hvd", 3.495, 2.614), ("default", 2.820, 1.840)),
         "2 x 2, r = 1"),
    Case(2, 2, 0.25, "fp16", "classic", 12.819, (("hvd", 12.851, 2.510),
                                                 ("default", 13.012, 1.814)), "2 x 2, r = 0.2"),
    Case(2, 4, 0.25, "fp16", "classic", 1.624, (("hvd", 3.584, 3.240), ("default", 2.751, 2.069)),
         "2 x 4, r = 2"),
    Case(2, 4, 0.25, "fp32", "classic", 2.914, (("hvd", 6.904, 5.666), ("default", 4.987, 3.713)),
         "2 x 4, r = 2"),
    Case(2, 4, 0.25, "fp16", "classic", 1.617, (("hvd", 3.650, 3.144), ("default", 2.721, 1.956)),
         "2 x 4, r = 2 (a second run)"),
    Case(2, 4, 0.25, "fp16", "classic", 3.305, (("hvd", 4.195, 3.237), ("default", 3.563, 2.025)),
         "2 x 4, r = 1"),
    Case(2, 2, 0.25, "fp16", "classic", 1.278, (("hvd", 2.959, 2.509), ("default", 2.284, 1.811),
                                                ("replanned", 2.242, 1.772)),
         "2 x 2, r = 2, after ReplanCallback"),
    # the current stack: tftorus on its tf engine beside MultiWorkerMirroredStrategy (FP32 always)
    Case(2, 2, 0.25, "fp16", "current", 1.251, (("default", 2.254, 1.758),), "2 x 2, r = 2"),
    Case(2, 2, 0.25, "fp32", "current", 1.251, (("mwms", 6.336, 4.995),
                                                ("mwms-pack16", 5.545, 5.156)),
         "2 x 2, r = 2 FP16's compute"),
    Case(2, 2, 0.25, "fp32", "current", 2.455, (("default", 4.288, 3.391), ("mwms", 7.437, 5.034),
                                                ("mwms-pack16", 5.954, 5.090)), "2 x 2, r = 2"),
    Case(2, 4, 0.25, "fp16", "current", 1.635, (("default", 2.329, 1.843),), "2 x 4, r = 2"),
    Case(2, 4, 0.25, "fp32", "current", 1.635, (("mwms-pack16", 6.473, 5.954),
                                                ("mwms-pack4", 6.650, 6.086)),
         "2 x 4, r = 2 FP16's compute"),
    Case(2, 4, 0.25, "fp32", "current", 2.926, (("default", 4.369, 3.385),
                                                ("mwms-pack16", 6.847, 5.969)), "2 x 4, r = 2"),
]


def read_steps_csv(path: str, stack: Optional[str] = None) -> List[Case]:
    """studies.emulated_step's CSV (--model virtual rows) as Cases: per (cluster, link rate,
    wire) the median over repeats of each variant, the compute from the `compute` variant's
    step. A file with MWMS rows is the current stack's (its tftorus rows ran on the tf engine),
    else the classic one's, unless `stack` says. MWMS' rows (FP32) join the file's FP32 case;
    where the file has no FP32 compute rows they take its other wire's compute (the current
    stack sets one --compute-s for every wire)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("model", "resnet50") == "virtual"]
    if stack is None:
        stack = "current" if any(r["variant"].startswith("mwms") for r in rows) else "classic"
    groups: Dict[tuple, Dict[str, List[Tuple[float, float]]]] = {}
    for r in rows:
        key = (int(r["hosts"]), int(r["ranks_per_host"]), float(r["link_gbit"]), r["wire"])
        groups.setdefault(key, {}).setdefault(r["variant"], []).append(
            (float(r["step_s"]), float(r["allreduce_s"])))
    computes = {key: statistics.median(s for s, _ in v["compute"])
                for key, v in groups.items() if "compute" in v}
    cases = []
    for key in sorted(groups):
        compute = computes.get(key)
        if compute is None:  # MWMS alone on a wire: the same cluster's other wire
            compute = next((c for k, c in sorted(computes.items()) if k[:3] == key[:3]), None)
        if compute is None:
            print(f"{path}: no compute rows for {key[0]}x{key[1]} {key[3]}: left out",
                  file=sys.stderr)
            continue
        measured = tuple((v, statistics.median(s for s, _ in runs),
                          statistics.median(a for _, a in runs))
                         for v, runs in sorted(groups[key].items()) if v != "compute")
        links, plans, span = run_logs(os.path.dirname(path), *key)
        cases.append(Case(key[0], key[1], key[2], key[3], stack, compute, measured, path,
                          links, plans, span))
    return cases


LOGGED_LINKS = re.compile(r"TFTORUS_LINKS='([^']+)'")
LOGGED_PLAN = re.compile(r"tftorus: (grid .*?); predicted")
LOGGED_SPAN = re.compile(r"tftorus: the step's gradients come ([0-9.]+) ms apart")


def run_logs(directory: str, hosts: int, ranks: int, link_gbit: float, wire: str
             ) -> Tuple[Optional[str], Tuple[str, ...], Optional[float]]:
    """(the links, the plans, the clocked span s) tftorus logged in a run's rank logs beside its
    CSV (emulated_step's ranks_HxR_GBIT_WIRE.log on the classic stack,
    ranks_HxR_GBIT_LAUNCH_REPEAT.log on the current one, whose launches plan every wire): the
    first links, every distinct plan, the first span replan() read from the step's clocks."""
    paths = sorted(glob.glob(os.path.join(directory, f"ranks_{hosts}x{ranks}_{link_gbit:g}_*.log")))
    own = [p for p in paths if p.endswith(f"_{wire}.log")]
    links, plans, span = None, [], None
    for path in own or [p for p in paths if not re.search(r"_fp(16|32)\.log$", p)]:
        with open(path, errors="replace") as f:
            for line in f:
                found = LOGGED_LINKS.search(line)
                if found and links is None:
                    links = found.group(1)
                found = LOGGED_PLAN.search(line)
                if found and found.group(1) not in plans:
                    plans.append(found.group(1))
                found = LOGGED_SPAN.search(line)
                if found and span is None:
                    span = float(found.group(1)) * 1e-3
    return links, tuple(plans), span


# ==================================================================================================
# The step's schedule
# ==================================================================================================

def gradient_set(wire: str) -> List[Tuple[int, str]]:
    """(bytes, dtype name) of VirtualResNet50's gradients on the wire, in the optimizer's order
    (its trainable variables: Keras' ResNet-50 at 10 classes)."""
    out = []
    for spec in resnet50_layers(CLASSES):
        for _, shape in spec.variables:
            out.append((math.prod(shape) * WIRE_BYTES[wire], WIRE_DTYPES[wire]))
    return out


def ready_times(compute_s: float, update_s: float = UPDATE_SECONDS) -> Tuple[List[float], float]:
    """(each gradient's ready time from the step's start, in the optimizer's order; the end of
    the backward pass): the accelerator's profile for the compute less the update."""
    profile = layer_profile(max(0.0, compute_s - update_s))
    per_layer = readiness(profile)
    ready = [t for times, layer_ready in zip(profile, per_layer)
             for t in [layer_ready] * len(times.variables)]
    return ready, sum(t.forward_s + t.backward_s for t in profile)


# ==================================================================================================
# The simulated cluster
# ==================================================================================================

def emulated_spec(hosts: int, ranks: int, link_gbit: float) -> sc.ClusterSpec:
    """studies.emulated_cluster's hosts as the calibration simulates them: one link per host at
    the TCP payload rate, loopback through the fitted machine-wide copy link."""
    copy_bw, _, _ = sc.fit_host_costs()
    return sc.emulated(cluster_name(hosts, ranks, link_gbit), hosts, ranks, 1,
                       link_bw=link_gbit * 1e9 / 8 * sc.TCP_PAYLOAD_FRACTION, copy_bw=copy_bw)


def cluster_name(hosts: int, ranks: int, link_gbit: float) -> str:
    return f"step{hosts}x{ranks}at{link_gbit:g}"


def host_fixed_costs(hosts: int, ranks: int) -> Tuple[float, float]:
    """(seconds per call, per collective): the calibration's, from the emulated 4 KiB
    all-reduces of this cluster (the median over the others where it has none)."""
    costs = sc.fixed_costs(sc.MEASURED_RAILS)
    return costs.get((hosts, ranks), costs[None])


class SimulatedCluster:
    """One emulated cluster in the simulator: its ranks, the all-reduce costs
    (planner_sweep.SimulatedCosts) and the links tftorus' probe would measure there."""

    def __init__(self, platform: sc.Platform, name: str, per_call: float, per_collective: float,
                 links: Optional[planner.Links] = None):
        spec = platform.specs[name]
        self.size, self.local_size = spec.gpus, spec.node.gpus
        self.per_call = per_call
        self.world = ps.World(ps.Batch(platform), name, spec, self.size, "compact",
                              params=cm.Params(cm.Link(0.0, 0.0), cm.Link(0.0, 0.0),
                                               per_op=per_collective))
        self.costs = ps.SimulatedCosts(self.world)
        self.ring_grid = plan_grid(self.size, self.local_size)
        self._probe = ps.probe_phases(self.world)
        self._links = links

    def links(self) -> planner.Links:
        """What link_probe.probe would fit here: its all-reduces, each one collective (the
        probe calls the engine's all-reduce itself: no consistency check, no fused call, so
        not the per-call cost; with it, the simulated 2 x 4's inter-host latency came out
        11 ms where the runs measured 2.5); or the links given instead."""
        if self._links is None:
            timings = [link_probe.Timing(level, members, nbytes, self.world.seconds(req))
                       for level, members, nbytes, req in self._probe]
            self._links = link_probe.fit(timings, self.local_size, source="simulated probe")
        return self._links

    def ring_seconds(self, nbytes: float) -> float:
        """One ring all-reduce over every rank (one collective)."""
        return self.costs.seconds("ring", self.ring_grid, nbytes, 1, False)


# ==================================================================================================
# The optimizers
# ==================================================================================================

@dataclasses.dataclass(frozen=True)
class Response:
    """One collective Horovod's loop ran: when it started, which gradients, until when."""

    start: float
    indices: Tuple[int, ...]
    nbytes: int
    end: float


def horovod_responses(ready: Sequence[float], nbytes: Sequence[int], seconds,
                      cycle: float = HOROVOD_CYCLE_SECONDS,
                      threshold: int = HOROVOD_FUSION_BYTES) -> List[Response]:
    """Horovod's background loop over gradients ready at `ready` (s): a cycle starts `cycle`
    after the previous one's start or when its collectives end, whichever is later (idle, it
    ticks every `cycle` from its last start); it fuses every unsent gradient ready by then, in
    ready order, into buffers of at most `threshold` bytes (a larger gradient alone), and runs
    them one after the other, `seconds(bytes)` each."""
    pending = sorted(range(len(ready)), key=lambda i: (ready[i], -i))
    out: List[Response] = []
    start, k = 0.0, 0
    while k < len(pending):
        first = ready[pending[k]]
        if first > start:  # idle until the tick that sees it
            start += math.ceil((first - start) / cycle - 1e-9) * cycle
        taken = []
        while k < len(pending) and ready[pending[k]] <= start + 1e-12:
            taken.append(pending[k])
            k += 1
        end = start
        buffer: List[int] = []
        used = 0
        for i in taken + [None]:
            if buffer and (i is None or used + nbytes[i] > threshold):
                begin, end = end, end + seconds(used)
                out.append(Response(begin, tuple(buffer), used, end))
                buffer, used = [], 0
            if i is not None:
                buffer.append(i)
                used += nbytes[i]
        start = max(start + cycle, end)
    return out


@dataclasses.dataclass
class Prediction:
    variant: str
    alone_s: float
    step_s: float
    what: str  # the plan, or how many collectives


def predict_hvd(cluster: SimulatedCluster, tensors, ready, backward_end: float,
                update_s: float = UPDATE_SECONDS,
                cycle_s: float = HOROVOD_CYCLE_SECONDS) -> Prediction:
    sizes = [b for b, _ in tensors]
    alone = horovod_responses([0.0] * len(sizes), sizes, cluster.ring_seconds, cycle_s)
    step = horovod_responses(ready, sizes, cluster.ring_seconds, cycle_s)
    return Prediction("hvd", alone[-1].end + cluster.per_call,
                      max(backward_end, step[-1].end) + update_s,
                      f"{len(step)} fused ring all-reduces in the step ({len(alone)} alone)")


def mwms_packs(nbytes: Sequence[int], bytes_per_pack: int) -> List[Tuple[int, ...]]:
    """CollectiveAllReduce._all_reduce's packs (TF 2.21): the gradients reversed (the backward
    pass' order), cut by cross_device_utils.group_by_size: a pack closes once it holds more
    than `bytes_per_pack` (0: one pack of everything)."""
    order = list(reversed(range(len(nbytes))))
    if bytes_per_pack == 0:
        return [tuple(order)]
    packs: List[List[int]] = []
    used = 0
    for i in order:
        if not packs or used > bytes_per_pack:
            packs.append([])
            used = 0
        packs[-1].append(i)
        used += nbytes[i]
    return [tuple(p) for p in packs]


def predict_mwms(cluster: SimulatedCluster, tensors, ready, backward_end: float,
                 update_s: float = UPDATE_SECONDS, bytes_per_pack: int = 0,
                 variant: str = "mwms") -> Prediction:
    """Each pack one ring all-reduce (a concat, all_reduce_v2), one after the other in pack
    order (the launcher's ordering token), each once its last gradient exists."""
    sizes = [b for b, _ in tensors]
    packs = mwms_packs(sizes, bytes_per_pack)
    alone = step = 0.0
    for pack in packs:
        seconds = cluster.ring_seconds(sum(sizes[i] for i in pack))
        alone += seconds
        step = max(step, max(ready[i] for i in pack)) + seconds
    what = (f"{len(packs)} FP32 ring all-reduces of packs of > {bytes_per_pack / MIB:g} MiB, in "
            f"turn" if bytes_per_pack else "one FP32 ring all-reduce after the backward pass")
    return Prediction(variant, alone + cluster.per_call, max(backward_end, step) + update_s, what)


def tftorus_engine(cluster: SimulatedCluster, grid: TorusGrid, engine: str,
                   dtypes: Sequence[str]) -> planner.Engine:
    """planner.Engine as tftorus/runtime/reduction.py builds it from the communicator (on CPUs)."""
    import tensorflow as tf

    from tftorus.engines.tf_engine import CPU_MAX_BUCKET_BYTES, CPU_MAX_CHUNK_BYTES
    from tftorus.torus import algorithms
    concurrent = engine == "tf"
    comm = SimpleNamespace(size=cluster.size, local_size=cluster.local_size,
                           concurrent_groups=concurrent, rank_ordered_sums=True)
    return planner.Engine(
        concurrent_groups=concurrent,
        chunks_allowed=all(algorithms.chunks_keep_bits(grid, comm, tf.as_dtype(d))
                           for d in dtypes),
        max_bucket_bytes=CPU_MAX_BUCKET_BYTES if concurrent else None,
        max_chunk_bytes=CPU_MAX_CHUNK_BYTES if concurrent else None,
        columns_in_turn=not concurrent)  # Horovod with Gloo runs the columns in turn


def tftorus_grid(cluster: SimulatedCluster, engine: str, links: planner.Links) -> TorusGrid:
    """The grid tftorus runs on: plan_grid at init on Horovod (its process sets are fixed
    then), re-planned from the links on the tf engine (tftorus/runtime/process_state.py)."""
    if engine == "horovod":
        return plan_grid(cluster.size, cluster.local_size)
    from tftorus.runtime import process_state
    return process_state._planned_grid(cluster.size, cluster.local_size, links, engine)


def tftorus_plan(cluster: SimulatedCluster, tensors, engine: str,
                 links: Optional[planner.Links] = None,
                 ready: Optional[Sequence[float]] = None) -> Tuple[planner.Plan, planner.Engine]:
    """The plan tftorus runs, as reduction._plan makes it for a training step, on the links
    (default: the simulated probe's) with its own cost model: before replan(), planner.first_plan;
    after it (`ready` given: what the step's clocks measure, gradient_readiness.py), planner.plan
    with the gradients' ready times after the first one's."""
    links = links or cluster.links()
    grid = tftorus_grid(cluster, engine, links)
    caps = tftorus_engine(cluster, grid, engine, sorted({d for _, d in tensors}))
    fixed = dict(grid=grid, threshold_bytes=None, algorithm=None, chunks=None)
    if ready is None:
        p = planner.first_plan(cluster.size, cluster.local_size, tensors, links, caps, **fixed)
    else:
        first = min(ready)
        profile = planner.StepProfile(tuple(r - first for r in ready), max(ready) - first)
        p = planner.plan(cluster.size, cluster.local_size, tensors, links, caps,
                         profile=profile, **fixed)
    return p, caps


def predict_default(cluster: SimulatedCluster, tensors, ready, backward_end: float, engine: str,
                    update_s: float = UPDATE_SECONDS, links: Optional[planner.Links] = None,
                    variant: str = "default", clocked_span_s: Optional[float] = None
                    ) -> Prediction:
    """tftorus' DistributedOptimizer (`default`, `default-tf`), or after replan()
    (`replanned`: planned on the ready times, or, given `clocked_span_s`, on them squeezed to
    the span the run's clocks measured; summed as the gradients are really ready)."""
    clocked = None
    if variant == "replanned":
        first = min(ready)
        squeeze = 1.0 if clocked_span_s is None else clocked_span_s / (max(ready) - first)
        clocked = [first + (r - first) * squeeze for r in ready]
    p, caps = tftorus_plan(cluster, tensors, engine, links, clocked)

    def summed(at):
        return planner.timeline(cluster.costs, p.grid,
                                [(b.algorithm, b.nbytes, b.chunks, at(b)) for b in p.buckets],
                                caps.concurrent_groups)

    alone = summed(lambda b: 0.0)
    last = summed(lambda b: max(ready[i] for i in b.indices))
    return Prediction(variant, alone + cluster.per_call, max(backward_end, last) + update_s,
                      f"{engine} engine: {plan_text(p)}")


def plan_text(p: planner.Plan) -> str:
    """The plan as the runtime's log line says it (grid, buckets, chunks, algorithms)."""
    return p.describe().split("; predicted")[0].replace("tftorus: ", "")


def run_plan_note(case: Case, pred: Prediction) -> str:
    """Whether the run planned what the model planned (where its log says)."""
    if not case.run_plans or pred.variant not in ("default", "default-tf", "replanned"):
        return ""
    plan = pred.what.split(": ", 1)[1]
    return " (the run's plan)" if plan in case.run_plans else " (**not** the run's plan)"


def predict(cluster: SimulatedCluster, case: Case, update_s: float = UPDATE_SECONDS,
            links: Optional[planner.Links] = None,
            cycle_s: float = HOROVOD_CYCLE_SECONDS,
            clocked_span_s: Optional[float] = None) -> List[Prediction]:
    """Every variant of the case the model knows, in the case's order; tftorus plans on
    `links` (default: the simulated probe's), replans on the readiness squeezed to
    `clocked_span_s` where given; Horovod's loop cycles every `cycle_s`."""
    tensors = gradient_set(case.wire)
    ready, backward_end = ready_times(case.compute_s, update_s)
    out = []
    for variant in case.variants():
        if variant == "hvd":
            out.append(predict_hvd(cluster, tensors, ready, backward_end, update_s, cycle_s))
        elif variant == "mwms" or variant.startswith("mwms-pack"):
            pack_mib = int(variant[len("mwms-pack"):]) if variant != "mwms" else 0
            out.append(predict_mwms(cluster, gradient_set("fp32"), ready, backward_end,
                                    update_s, pack_mib * MIB, variant))
        elif variant in ("default", "default-tf", "replanned"):
            # default-tf: the classic stack's tftorus on its tf engine, beside Horovod
            engine = "tf" if variant == "default-tf" else STACK_ENGINES[case.stack]
            out.append(predict_default(cluster, tensors, ready, backward_end, engine, update_s,
                                       links, variant, clocked_span_s))
    return out


# ==================================================================================================
# Output
# ==================================================================================================

def ratio(simulated: float, measured: Optional[float]) -> str:
    if measured is None or measured <= 0:
        return f"{simulated:.3f} / - "
    return f"{simulated:.3f} / {measured:.3f} ({simulated / measured:.2f})"


def report(cases: Sequence[Case], update_s: float = UPDATE_SECONDS,
           links: Optional[planner.Links] = None, run_links: bool = False,
           cycle_s: float = HOROVOD_CYCLE_SECONDS) -> Optional[tuple]:
    """Build every case's cluster in one platform, predict, print the table; returns the worst
    step error (relative, signed; case, variant) or None where nothing was measured. `links`:
    tftorus plans on these instead of the simulated probe's; `run_links`: on the links each
    case's run logged, where it did."""
    keys = sorted({(c.hosts, c.ranks, c.link_gbit) for c in cases})
    platform = sc.Platform([emulated_spec(*k) for k in keys])
    clusters = {k: SimulatedCluster(platform, cluster_name(*k), *host_fixed_costs(*k[:2]),
                                    links=links)
                for k in keys}
    print("| cluster | Gbit/s | wire | stack | compute s | variant | all-reduce alone s: "
          "simulated / measured (ratio) | step s: simulated / measured (ratio) | past the "
          "compute s: simulated / measured | model |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst = None
    for case in cases:
        cluster = clusters[(case.hosts, case.ranks, case.link_gbit)]
        mine = planner.Links.parse(case.run_links) if run_links and case.run_links else None
        span = case.run_clocked_span_s if run_links else None
        for pred in predict(cluster, case, update_s, mine, cycle_s, span):
            step, alone = case.measured_of(pred.variant)
            flag = ""
            if step:
                error = pred.step_s / step - 1
                flag = " **" if abs(error) > WITHIN else ""
                if worst is None or abs(error) > abs(worst[0]):
                    worst = (error, case, pred.variant)
            past = "-" if step is None else f"{step - case.compute_s:.3f}"
            print(f"| {case.cluster} | {case.link_gbit:g} | {case.wire} | {case.stack} | "
                  f"{case.compute_s:.3f} | {pred.variant} | {ratio(pred.alone_s, alone)} | "
                  f"{ratio(pred.step_s, step)}{flag} | "
                  f"{pred.step_s - case.compute_s:.3f} / {past} | {pred.what}"
                  f"{run_plan_note(case, pred)} |")
    print()
    for k, cluster in clusters.items():
        print(f"- {k[0]}x{k[1]} at {k[2]:g} Gbit/s: tftorus' links ({cluster.links().source}) "
              f"`{cluster.links().spec()}`; "
              f"fixed costs {cluster.per_call * 1e3:.1f} ms a call, "
              f"{cluster.world.per_op * 1e3:.1f} ms a collective")
    logged = sorted({(c.source, c.wire, c.run_links, c.run_plans, c.run_clocked_span_s)
                     for c in cases if c.run_plans}, key=lambda x: x[:2])
    for source, wire, spec, plans, span in logged:
        used = " (planned on)" if run_links else ""
        clocked = "" if span is None else (f"; replan()'s clocks: gradients {span * 1e3:.1f} ms "
                                           f"apart{used}")
        print(f"- {source} {wire}: the run's links{used} `{spec}`; its plans: "
              + "; ".join(plans) + clocked)
    if worst is not None:
        error, case, variant = worst
        print(f"\n**Worst step error: {error:+.1%}** ({case.cluster} {case.wire} {case.stack}, "
              f"compute {case.compute_s:.3f} s, {variant}); steps beyond {WITHIN:.0%} marked **.")
    return worst


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--csv", nargs="+", default=None,
                   help="studies.emulated_step CSVs (--model virtual rows); default: the steps "
                        "docs/studies/emulated_step.md quotes (MEASURED)")
    p.add_argument("--stack", choices=STACKS, default=None,
                   help="the stack the CSVs ran on (default: current where a file has MWMS "
                        "rows, else classic)")
    p.add_argument("--clusters", nargs="+", type=ps_topology, default=None,
                   help="predict these HOSTSxRANKS clusters instead of measured ones")
    p.add_argument("--link-gbit", nargs="+", type=float, default=[0.25])
    p.add_argument("--wires", nargs="+", choices=tuple(WIRE_BYTES), default=["fp16", "fp32"])
    p.add_argument("--compute-s", nargs="+", type=float, default=None,
                   help="with --clusters: the compute-alone steps (s) to predict")
    p.add_argument("--stacks", nargs="+", choices=STACKS, default=list(STACKS),
                   help="with --clusters: whose variants to predict")
    p.add_argument("--links", type=planner.Links.parse, default=None,
                   help="tftorus plans on these links (TFTORUS_LINKS form, e.g. a run's logged "
                        "'intra=3490us@1.432GB/s,inter=2474us@0.03207GB/s,lanes=1.012') instead "
                        "of the simulated probe's: the plan that run made, on simulated costs")
    p.add_argument("--run-links", action="store_true",
                   help="tftorus plans on the links each CSV's run logged (its rank logs beside "
                        "the CSV) instead of the simulated probe's, and replans on the span "
                        "its step's clocks logged")
    p.add_argument("--horovod-cycle-ms", type=float, default=HOROVOD_CYCLE_SECONDS * 1e3,
                   help="HOROVOD_CYCLE_TIME of the runs (default Horovod's, %(default)g)")
    p.add_argument("--update-s", type=float, default=UPDATE_SECONDS,
                   help="the update after the backward pass, inside the compute (default "
                        "%(default)s)")
    args = p.parse_args(argv)
    if (args.clusters is None) != (args.compute_s is None):
        p.error("--clusters and --compute-s go together (predictions without measurements)")
    if args.clusters and args.csv:
        p.error("give --csv (measured steps) or --clusters with --compute-s, not both")
    if args.links and args.run_links:
        p.error("give --links (the same for every case) or --run-links (each run's), not both")
    for v in (args.compute_s or []) + args.link_gbit:
        if not (v > 0 and math.isfinite(v)):
            p.error(f"--compute-s and --link-gbit take numbers > 0, got {v}")
    if not 0 <= args.update_s:
        p.error("--update-s must be >= 0")
    if not args.horovod_cycle_ms > 0:
        p.error("--horovod-cycle-ms must be > 0")
    return args


def ps_topology(text: str) -> Tuple[int, int]:
    try:
        hosts, ranks = (int(x) for x in text.lower().split("x"))
    except ValueError:
        hosts = ranks = 0
    if hosts < 2 or ranks < 1:
        raise argparse.ArgumentTypeError(
            f"--clusters takes HOSTSxRANKS with 2 hosts or more, e.g. 2x2, got {text!r}")
    return hosts, ranks


def cases_of(args) -> List[Case]:
    if args.clusters:
        return [Case(h, r, g, w, s, c, (), "asked")
                for h, r in args.clusters for g in args.link_gbit for w in args.wires
                for s in args.stacks for c in args.compute_s]
    if args.csv:
        return [c for path in args.csv for c in read_steps_csv(path, args.stack)]
    return list(MEASURED)


def main(argv: Sequence[str] = None) -> int:
    args = parse_args(argv)
    if sc.load_simgrid() is None:
        print(f"skipped: {sc.SIMGRID_MISSING}", file=sys.stderr)
        return 77
    cases = cases_of(args)
    if not cases:
        print("no --model virtual steps in the CSVs given", file=sys.stderr)
        return 1
    sources = sorted({c.source for c in cases})
    print("## The emulated cluster's training step, simulated\n")
    print(f"Measured: {'; '.join(sources)}. Step = max(backward end, last gradient summed) + "
          f"update ({args.update_s * 1e3:.0f} ms); Horovod's cycle {args.horovod_cycle_ms:g} ms; "
          f"ratios simulated / measured.\n")
    worst = report(cases, args.update_s, args.links, args.run_links,
                   args.horovod_cycle_ms * 1e-3)
    # exit 1 where a measured step is missed by more than WITHIN: the docs claim the model
    # predicts every quoted step within it (tests/test_simulated_step.py holds it to that)
    return 1 if worst is not None and abs(worst[0]) > WITHIN else 0


if __name__ == "__main__":
    sys.exit(main())
