"""The all-reduce cost model at the paper's scale, and fitted to measured times (the fit
and the step model: studies/cost_calibration.py).

    python -m studies.scale_model
        paper scale: ring, hierarchical and torus on ABCI-like parameters (documented, nothing
        fitted) beside Table 6; per-phase breakdown; assumptions varied one at a time; the
        planner's grids beside Table 4; writes docs/img/scale_efficiency.png

    python -m studies.scale_model --csv /tmp/tftorus_emulated/allreduce.csv
        also fits the link parameters to the emulated cluster's CSV (studies/
        emulated_cluster.py writes it; docs/studies/emulated_cluster.md) and prints predicted
        against measured for every point, flagging those more than 20 % off.

    --single-host  reads a studies/benchmark_allreduce.py CSV (one machine, no hosts/bytes
        columns): every rank on one host, bytes from the workload name.

Tables are printed as Markdown so docs/studies/scale.md can quote them as they are.
"""
import argparse
import csv
import dataclasses
import math
import os
import re
import sys
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from studies import cost_calibration as cal
from tftorus.planning import cost_model as cm
from tftorus.torus.grid import PAPER_GRIDS, GridError, TorusGrid, parse_grid, plan_grid

PAPER_SIZES = (4, 1024, 2048, 3456, 4096)
PLANNER_SIZES = (1024, 2048, 2176, 3456, 4096)
CURVE_SIZES = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3456, 4096)
ALGOS = ("ring", "hierarchical", "torus")
DEFAULT_PNG = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "docs", "img",
                           "scale_efficiency.png")
FLAG = 0.20  # points whose prediction is off by more than this are flagged


# ==================================================================================================
# Paper scale
# ==================================================================================================

def paper_grid(algorithm: str, size: int) -> TorusGrid:
    """Table 4's grid for the torus (the planner's below 1024), a row per node otherwise."""
    if algorithm == "torus" and size in PAPER_GRIDS:
        return TorusGrid(size=size, x=PAPER_GRIDS[size][1])
    return cm.grid_for_algorithm(algorithm, size, 4)


def step_model(overlap: float = 0.0, nics_per_rank: Optional[int] = None,
               params: Optional[cm.Params] = None) -> cal.StepModel:
    model = cm.CostModel(params or cm.abci_params(), cm.abci_topology(nics_per_rank))
    return cal.StepModel(model, overlap=overlap)


def torus_efficiencies(sm: cal.StepModel) -> List[float]:
    return [sm.efficiency("torus", n, paper_grid("torus", n)) for n in PAPER_SIZES[1:]]


def print_paper_scale(sm: cal.StepModel) -> None:
    p, topo = sm.model.params, sm.model.topology
    print("## Paper scale: ABCI-like parameters (documented, nothing fitted)\n")
    print(f"- gradients: ResNet-50, {cm.RESNET50_PARAMS:,} parameters in FP16 = "
          f"{sm.nbytes / 1e6:.1f} MB per all-reduce, one fused buffer")
    print(f"- intra-host (NVLink2): alpha {p.intra.alpha / cm.US:.1f} us, "
          f"{p.intra.bandwidth / cm.GB:.0f} GB/s; inter-host (EDR): alpha "
          f"{p.inter.alpha / cm.US:.1f} us, {p.inter.bandwidth / cm.GB:.1f} GB/s per HCA, "
          f"{topo.nics_per_host} HCAs per node, {topo.ranks_per_host} GPUs per node; "
          f"per collective {p.per_op / cm.US:.1f} us; gamma {p.gamma * 1e12:.2f} ps/byte")
    print(f"- step: {sm.base_gpus} GPUs x {sm.batch_per_gpu} / {sm.base_images_per_s:,.0f} img/s "
          f"= {sm.base_step_seconds * 1e3:.2f} ms measured (Table 6); less the model's 4-GPU "
          f"torus all-reduce ({sm.comm_seconds('torus', 4) * 1e3:.2f} ms) = compute "
          f"{sm.compute_seconds * 1e3:.2f} ms per step")
    print(f"- overlap: {sm.overlap:.2f} of the compute (0 = the all-reduce starts after the "
          f"backward pass)\n")
    head = "| GPUs | grid (torus) |"
    for a in ALGOS:
        head += f" {a} ms | {a} img/s | {a} eff % |"
    head += " Table 6 img/s | Table 6 eff % | torus - Table 6 (pp) |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for n in PAPER_SIZES:
        line = f"| {n} | {paper_grid('torus', n)} |"
        for a in ALGOS:
            g = paper_grid(a, n)
            line += (f" {sm.comm_seconds(a, n, g) * 1e3:.1f} |"
                     f" {sm.images_per_second(a, n, g):,.0f} | {sm.efficiency(a, n, g):.1f} |")
        if n in cal.PAPER_TABLE6_EFFICIENCY:
            eff = cal.PAPER_TABLE6_EFFICIENCY[n]
            diff = sm.efficiency("torus", n, paper_grid("torus", n)) - eff
            line += f" {cal.PAPER_TABLE6[n]:,} | {eff:.2f} | {diff:+.1f} |"
        else:
            line += f" {cal.PAPER_TABLE6[n]:,} | (base) | |"
        print(line)
    print("\n(ms: the all-reduce alone; img/s and efficiency: whole steps; efficiency against "
          "Table 6's 4-GPU throughput x N/4, as the paper's.)\n")
    check = {n: sm.model.seconds("ring", paper_grid("ring", n), 48.0) * 1e3
             for n in PAPER_SIZES}
    print("tftorus adds a consistency check per step (a 48-byte max all-reduce over the world); "
          "as a flat ring it would cost "
          + ", ".join(f"{v:.1f} ms at {n}" for n, v in check.items())
          + " (latency only, not in the table above; NCCL picks a tree for small messages, "
            "whose steps grow as log N).\n")


def print_breakdown(sm: cal.StepModel) -> None:
    print("## Where the time goes (per rank, one all-reduce of the gradients)\n")
    print("| GPUs | algorithm | grid | phase | steps | link | ranks per host crossing | "
          "MB sent | ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in PAPER_SIZES[1:]:
        for a in ALGOS:
            g = paper_grid(a, n)
            for phase, t in sm.model.breakdown(a, g, sm.nbytes):
                shown = "world" if a == "ring" else g
                print(f"| {n} | {a} | {shown} | {phase.name} | {phase.steps} | {phase.link} | "
                      f"{phase.max_senders or '-'} | {phase.sent_bytes / 1e6:.1f} | "
                      f"{t * 1e3:.2f} |")
    print()


def solve_inter_bandwidth(target_eff: float, size: int) -> float:
    """The one inter-host bandwidth (bytes/s per HCA) that makes the torus hit `target_eff`
    at `size` (bisection; efficiency rises with bandwidth). A fit to Table 6, labelled so."""
    lo, hi = 0.1 * cm.GB, 1000 * cm.GB
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        sm = step_model(params=cm.abci_params().replace(beta_inter=1 / mid))
        if sm.efficiency("torus", size, paper_grid("torus", size)) < target_eff:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def print_sensitivity() -> Dict[str, List[float]]:
    print("## Assumptions varied one at a time (torus efficiency %, Table 4 grids)\n")
    calib_bw = solve_inter_bandwidth(cal.PAPER_TABLE6_EFFICIENCY[1024], 1024)
    rows = [
        ("base: both HCAs shared by the ranks crossing a node, no overlap", step_model()),
        ("one HCA per rank (a ring leaving a node uses one 12.5 GB/s HCA)",
         step_model(nics_per_rank=1)),
        ("all-reduce overlaps the backward pass (2/3 of compute)", step_model(overlap=2 / 3)),
        ("network latency x10 (alpha_inter 96 us)",
         step_model(params=cm.abci_params().replace(alpha_inter=96 * cm.US))),
        (f"FITTED: one inter-host bandwidth ({calib_bw / cm.GB:.2f} GB/s per HCA) chosen so "
         f"that 1024 GPUs give Table 6's 84.75 %",
         step_model(params=cm.abci_params().replace(beta_inter=1 / calib_bw))),
    ]
    sizes = PAPER_SIZES[1:]
    print("| assumption | " + " | ".join(str(n) for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    out = {}
    for label, sm in rows:
        effs = torus_efficiencies(sm)
        out[label] = effs
        print(f"| {label} | " + " | ".join(f"{e:.1f}" for e in effs) + " |")
    print("| Table 6 | " + " | ".join(f"{cal.PAPER_TABLE6_EFFICIENCY[n]:.2f}" for n in sizes)
          + " |")
    implied = [solve_inter_bandwidth(cal.PAPER_TABLE6_EFFICIENCY[n], n) / cm.GB for n in sizes]
    print("| DIAGNOSTIC, solved per size: inter-host GB/s per HCA at which the base model gives "
          "Table 6 | " + " | ".join(f"{b:.2f}" for b in implied) + " |")
    base = step_model()
    print("\nStep time Table 6 implies (N x 32 / img/s) against the base model's, ms:\n")
    print(f"| GPUs | Table 6 step | minus the 4-GPU step ({base.base_step_seconds * 1e3:.2f}) | "
          f"model step (compute + torus) | model torus | unexplained |")
    print("|---|---|---|---|---|---|")
    for n in sizes:
        measured = n * cal.PAPER_BATCH_PER_GPU / cal.PAPER_TABLE6[n]
        model = base.step_seconds("torus", n, paper_grid("torus", n))
        comm = base.comm_seconds("torus", n, paper_grid("torus", n))
        print(f"| {n} | {measured * 1e3:.2f} | {(measured - base.base_step_seconds) * 1e3:.2f} | "
              f"{model * 1e3:.2f} | {comm * 1e3:.2f} | {(measured - model) * 1e3:.2f} |")
    print()
    return out


def print_planner(sm: cal.StepModel) -> None:
    print("## Grid planner: squarest (default) and by cost, against Table 4\n")
    model, n_bytes = sm.model, sm.nbytes
    print("| GPUs | Table 4 | torus ms | plan_grid (squarest, whole nodes) | torus ms | "
          "plan_grid by cost | torus ms | steps 2(X-1)+2(Y-1) (cost grid) |")
    print("|---|---|---|---|---|---|---|---|")
    for n in PLANNER_SIZES:
        paper = TorusGrid(size=n, x=PAPER_GRIDS[n][1])
        square = plan_grid(n, 4)
        by_cost = cm.plan_grid_by_cost(n, model, n_bytes, local_size=4)
        ms = lambda g: model.seconds("torus", g, n_bytes) * 1e3  # noqa: E731
        print(f"| {n} | {paper} | {ms(paper):.2f} | {square} | {ms(square):.2f} | {by_cost} | "
              f"{ms(by_cost):.2f} | {by_cost.sequential_steps} |")
    print()


def plot(png: str, sensitivity_label: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base, one_hca = step_model(), step_model(nics_per_rank=1)
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    styles = {"ring": ("tab:red", "s"), "hierarchical": ("tab:orange", "^"),
              "torus": ("tab:blue", "o")}
    for a in ALGOS:
        effs = [base.efficiency(a, n, paper_grid(a, n)) for n in CURVE_SIZES]
        color, marker = styles[a]
        ax.plot(CURVE_SIZES, effs, marker=marker, color=color, ms=4, label=f"{a} (model)")
    ax.plot(CURVE_SIZES, [one_hca.efficiency("torus", n, paper_grid("torus", n))
                          for n in CURVE_SIZES],
            ls="--", color="tab:blue", label=f"torus (model, {sensitivity_label})")
    sizes = sorted(cal.PAPER_TABLE6_EFFICIENCY)
    ax.plot(sizes, [cal.PAPER_TABLE6_EFFICIENCY[n] for n in sizes], "k*", ms=11, ls="none",
            label="paper, Table 6 (2D torus)")
    ax.set_xscale("log", base=2)
    ticks = (4, 16, 64, 256, 1024, 2048, 4096)  # 3456 sits just left of 4096, unlabelled
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(n) for n in ticks], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("GPUs (4 per node, log scale)")
    ax.set_ylabel("scaling efficiency vs 4 GPUs (%)")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3)
    ax.set_title("ResNet-50 FP16 gradients, batch 32/GPU, ABCI-like links, no overlap",
                 fontsize=9)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    print(f"plot: {os.path.relpath(png)}\n")


# ==================================================================================================
# Measured CSV
# ==================================================================================================

REQUIRED = ("np", "grid", "workload", "kind", "name", "median_ms")
CLUSTER_COLUMNS = ("hosts", "ranks_per_host", "bytes")

#: CSV variant name -> (engine, algorithm, reduce-scatter, consistency check)
VARIANTS = {
    "hvd": ("horovod", "hvd", "ring", False),
    "torus": ("horovod", "torus", "alltoall", True),
    "torus-nocheck": ("horovod", "torus", "alltoall", False),
    "torus-fp32sum": ("horovod", "torus", "alltoall", True),
    "torus-native": ("horovod", "torus", "ring", True),
    "ring": ("horovod", "ring", "ring", True),
    "hierarchical": ("horovod", "hierarchical", "ring", True),
    "torus-tf": ("tf", "torus", "alltoall", True),
    "ring-tf": ("tf", "ring", "ring", True),
    "hierarchical-tf": ("tf", "hierarchical", "ring", True),
    "mwms": ("tf", "hvd", "ring", False),
}
#: CSV phase name -> (engine, what it is)
PHASES = {
    "reduce-scatter (alltoall)": ("horovod", "row reduce-scatter", "alltoall"),
    "reduce-scatter (native)": ("horovod", "row reduce-scatter", "ring"),
    "column all-reduce": ("horovod", "column all-reduce", None),
    "row all-gather": ("horovod", "row all-gather", None),
    "tf reduce-scatter (alltoall)": ("tf", "row reduce-scatter", "alltoall"),
    "tf column all-reduce": ("tf", "column all-reduce", None),
    "tf row all-gather": ("tf", "row all-gather", None),
    "consistency check": ("horovod", "check", None),
    "pack": ("horovod", "copy", None),
    "unpack": ("horovod", "copy", None),
}
#: Left out of the fit (still predicted and shown): short key -> why.
NOT_FITTED = {
    "native": "hvd.reducescatter on Gloo is 3-4.6x slower than its bytes "
              "(docs/studies/benchmarks.md)",
    "tiny": "a 48-byte collective costs less than the fixed cost of a MiB-sized one, which one "
            "per_op cannot describe (docs/studies/scale.md)",
    "fp16": "FP16 sums on CPU are ~3x slower per byte than FP32: another gamma",
    "empty": "nothing the model counts (packing one flat tensor copies nothing)",
}
NOT_FITTED_BY_NAME = {"torus-native": "native", "reduce-scatter (native)": "native",
                      "consistency check": "tiny"}

SIZE_RE = re.compile(r"flat\s+([\d.]+)\s*([KMG]?)i?B", re.I)


class CsvError(ValueError):
    pass


def workload_bytes(workload: str) -> int:
    """FP32 bytes of a benchmark workload from its name ('flat 16 MiB', 'resnet50 fp32')."""
    m = SIZE_RE.match(workload)
    if m:
        return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[
            m.group(2).upper()])
    if workload.startswith("resnet50"):
        return 4 * cm.RESNET50_PARAMS
    raise CsvError(f"cannot tell the bytes of workload {workload!r}; the CSV needs a 'bytes' "
                   f"column")


def read_rows(path: str, single_host: bool) -> List[dict]:
    how = ("run `sudo .venv/bin/python -m studies.emulated_cluster` first "
           "(docs/studies/emulated_cluster.md), or give a studies/benchmark_allreduce.py CSV with "
           "--single-host")
    if not os.path.exists(path):
        raise CsvError(f"no CSV at {path}: {how}")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise CsvError(f"{path} has no data rows: {how}")
    missing = [c for c in REQUIRED if c not in rows[0]]
    if missing:
        raise CsvError(f"{path} lacks column(s) {missing} (has {list(rows[0])}): {how}")
    lacking = [c for c in CLUSTER_COLUMNS if c not in rows[0]]
    if lacking and not single_host:
        raise CsvError(f"{path} lacks the cluster column(s) {lacking}: it looks like a "
                       f"benchmark_allreduce.py CSV; pass --single-host to read it as one host, "
                       f"or {how}")
    for r in rows:
        if single_host:
            r.setdefault("hosts", "1")
            r.setdefault("ranks_per_host", r["np"])
            r.setdefault("bytes", str(workload_bytes(r["workload"])))
            r.setdefault("link_gbit", "")
    return rows


class Point:
    """One CSV row with what the model makes of it."""

    def __init__(self, row: dict):
        self.row = row
        self.size = int(row["np"])
        self.hosts = int(row["hosts"])
        self.rph = int(row["ranks_per_host"])
        if self.hosts * self.rph != self.size:
            raise CsvError(f"row {row['workload']}/{row['name']}: hosts {self.hosts} x "
                           f"ranks_per_host {self.rph} != np {self.size}")
        self.grid = parse_grid(row["grid"], self.size)
        self.workload, self.kind, self.name = row["workload"], row["kind"], row["name"]
        self.fp16 = "fp16" in self.workload.lower()
        # `bytes` is the FP32 size of the gradients (as benchmark_allreduce.py prints it);
        # FP16 compression halves what goes on the wire.
        self.wire_bytes = int(row["bytes"]) / (2 if self.fp16 else 1)
        self.gradient_set = not self.workload.lower().startswith("flat")
        self.seconds = float(row["median_ms"]) / 1e3
        self.link_gbit = row.get("link_gbit", "")
        try:
            self.gbit = float(self.link_gbit) if self.link_gbit else 0.0
        except ValueError:
            raise CsvError(f"row {self.workload}/{self.name}: link_gbit {self.link_gbit!r} is not "
                           f"a number") from None
        self.engine, self.phases, self.why_not = self._model()

    @property
    def label(self) -> str:
        return f"N={self.size} {self.hosts}x{self.rph} {self.grid} | {self.workload} | {self.name}"

    def _model(self) -> Tuple[Optional[str], Optional[Tuple[cm.Phase, ...]], str]:
        topo = cm.Topology(ranks_per_host=self.rph)
        n = self.wire_bytes
        if self.kind == "variant":
            if self.name not in VARIANTS:
                return None, None, "no model for this variant"
            engine, algorithm, rs, check = VARIANTS[self.name]
            phases = cm.algorithm_phases(algorithm, self.grid, topo, n, reduce_scatter=rs,
                                         check=check, gradient_set=self.gradient_set)
        elif self.name in PHASES:
            engine, what, rs = PHASES[self.name]
            if what == "check":
                phases = cm.algorithm_phases("ring", self.grid, topo, 48.0)
            elif what == "copy":  # pack or unpack: one copy of the buffer
                phases = [cm.Phase("copy", "local", 1, 0.0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0, ops=0,
                                   copied_bytes=n if self.gradient_set else 0.0)]
            else:
                phases = [p for p in [cm.torus_phase(what, self.grid, topo, n, rs or "ring")]
                          if p is not None]
        else:
            return None, None, "no model for this phase"
        why = NOT_FITTED_BY_NAME.get(self.name, "fp16" if self.fp16 else "")
        if not any(np.any(p.features()) for p in phases):
            why = "empty"
        return engine, tuple(phases), why

    def measurement(self, cores: int = 0, ref_gbit: float = 0.0) -> cal.Measurement:
        """cores: ranks / cores stretches CPU-side costs; ref_gbit: beta_inter is fitted for a
        link of that rate, and this row's inter-host bytes count ref_gbit / link_gbit times."""
        phases = self.phases
        if ref_gbit and self.gbit:
            phases = tuple(dataclasses.replace(
                p, inter_weighted_bytes=p.inter_weighted_bytes * ref_gbit / self.gbit)
                for p in phases)
        return cal.Measurement(self.label, phases, self.seconds,
                              cpu_factor=max(1.0, self.size / cores) if cores else 1.0)


def fit_and_report(path: str, single_host: bool, flag: float,
                   cores: int = 0) -> Dict[str, cal.FitResult]:
    points = [Point(r) for r in read_rows(path, single_host)]
    points = [p for p in points if p.seconds > 0]
    print(f"## Fit to measured times: {path} ({len(points)} rows)\n")
    print("Relative-error least squares (non-negative) of alpha/beta per link class, gamma, "
          "a per-collective cost and a per-byte copy cost, one fit per engine, on FP32 rows of "
          "the variants and phases the model describes; every row is predicted below.\n")
    results = {}
    by_engine = defaultdict(list)
    for p in points:
        if p.engine:
            by_engine[p.engine].append(p)
    for engine, pts in sorted(by_engine.items()):
        fit_pts = [p for p in pts if not p.why_not]
        # Rows at several emulated link rates share one beta_inter, stated for the commonest rate.
        rates = [p.gbit for p in pts if p.gbit]
        ref_gbit = max(set(rates), key=rates.count) if rates else 0.0
        if len(fit_pts) < 2:
            print(f"engine {engine}: {len(fit_pts)} usable row(s), not enough to fit\n")
            continue
        result = cal.fit([p.measurement(cores, ref_gbit) for p in fit_pts])
        results[engine] = result
        print(f"### engine {engine}: {len(fit_pts)} rows fitted, rms relative error "
              f"{result.rms_relative_error * 100:.1f} %\n")
        print("| parameter | fitted | as |")
        print("|---|---|---|")
        for name, value in result.params.as_dict().items():
            note = "not determined by these rows (left at 0)" if name in result.undetermined else ""
            print(f"| {name} ({cal.PARAM_UNITS[name]}) | {value:.4g} | "
                  f"{describe_param(name, value)} {note} |")
        if ref_gbit:
            others = sorted(set(rates) - {ref_gbit})
            print(f"\n(beta_inter is for the emulated {ref_gbit:g} Gbit/s link = "
                  f"{ref_gbit / 8:.3f} GB/s per host"
                  + (f"; rows at {', '.join(f'{g:g}' for g in others)} Gbit/s count their "
                     f"inter-host bytes {ref_gbit:g} / rate times" if others else "") + ")")
        print()
        print("| np | hosts x ranks | grid | workload | row | kind | measured ms | predicted ms | "
              "error | in fit |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        flagged = []
        for p in pts:
            pred = p.measurement(cores, ref_gbit).predict(result.params) * 1e3
            err = (pred - p.seconds * 1e3) / (p.seconds * 1e3)
            mark = " **>20%**" if abs(err) > flag else ""
            if abs(err) > flag:
                flagged.append((p, err))
            print(f"| {p.size} | {p.hosts}x{p.rph} | {p.grid} | {p.workload} | {p.name} | {p.kind} "
                  f"| {p.seconds * 1e3:.1f} | {pred:.1f} | {err * 100:+.0f}%{mark} | "
                  f"{'no (' + p.why_not + ')' if p.why_not else 'yes'} |")
        print(f"\n{len(flagged)} of {len(pts)} rows off by more than {flag * 100:.0f} % "
              f"({sum(1 for p, _ in flagged if not p.why_not)} of them in the fit).\n")
        for key in sorted({p.why_not for p in pts if p.why_not}):
            print(f"- not fitted ({key}): {NOT_FITTED[key]}")
        print()
    unmodelled = sorted({p.name for p in points if not p.engine})
    if unmodelled:
        print(f"Rows without a model (not predicted): {', '.join(unmodelled)}\n")
    return results


def describe_param(name: str, value: float) -> str:
    if value <= 0:
        return "0"
    if name.startswith("alpha") or name == "per_op":
        return f"{value * 1e3:.3f} ms"
    return f"{1 / value / 1e9:.3f} GB/s"


# ==================================================================================================
# Main
# ==================================================================================================

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--csv", default=None,
                   help="measured CSV to fit (studies/emulated_cluster.py writes one)")
    p.add_argument("--single-host", action="store_true",
                   help="the CSV is benchmark_allreduce.py's: one host, bytes from workload names")
    p.add_argument("--png", default=DEFAULT_PNG, help="efficiency plot (default: %(default)s)")
    p.add_argument("--no-plot", dest="plot", action="store_false", help="skip the PNG")
    p.add_argument("--no-paper", dest="paper", action="store_false",
                   help="skip the paper-scale tables (with --csv: the fit only)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                   help="cores the measured ranks shared (CPU-side costs stretch by ranks / cores; "
                        "0: ignore; default: this machine's, %(default)s)")
    p.add_argument("--flag", type=float, default=FLAG,
                   help="flag predictions off by more than this fraction (default: %(default)s)")
    return p.parse_args(argv)


def main(argv: Sequence[str] = None) -> int:
    args = parse_args(argv)
    if args.paper:
        sm = step_model()
        print_paper_scale(sm)
        print_breakdown(sm)
        print_sensitivity()
        print_planner(sm)
        if args.plot:
            plot(args.png, "one HCA per rank")
    if args.csv:
        try:
            fit_and_report(args.csv, args.single_host, args.flag, args.cores)
        except (CsvError, GridError) as e:
            print(f"scale_model.py: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
