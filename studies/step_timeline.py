"""One training step on the emulated cluster, drawn: rank 0's virtual accelerator (forward and
backward pass) against the all-reduces of its gradients, one panel per optimizer.

    sudo .venv/bin/python -m studies.emulated_step --clusters 2x2 --link-gbit 0.25 \\
        --wires fp16 --variants hvd default --model virtual --ratio 1 --repeats 1 \\
        --timeline /tmp/step_tl --out /tmp/step_tl_out
    .venv/bin/python -m studies.step_timeline /tmp/step_tl --out docs/img/step_timeline.png

`emulated_step --timeline DIR` (classic stack, --model virtual) runs one more step per variant
after its repeats, every rank started together, and rank 0 saves DIR/step_<variant>.json
(`step_record`): its accelerator's waits in seconds since the step began (Keras' batch begin),
which layer each variable's gradient comes from and its bytes on the wire, tftorus' buckets
(the plan's), and where the step lies on the wall clock. Horovod's timeline of the whole launch
(HOROVOD_TIMELINE, written by rank 0) is DIR/horovod_timeline.json.

The two clocks. Horovod stamps each event with microseconds of std::chrono::steady_clock since
its timeline began (at hvd.init), and writes that beginning once on the wall clock
(system_clock, `start_time_since_epoch_in_micros` in the file's first event; horovod/common/
timeline.cc). The waits are time.perf_counter, CLOCK_MONOTONIC here as steady_clock is. So an
event at `ts` is at perf_counter `start_epoch + ts - (time.time() - perf_counter)`, with the
difference of the two Python clocks read right after init, when Horovod read its own (a later
step of the wall clock would move every event otherwise); the record keeps the difference at
the step too, and the table prints how far the two drifted apart.

The picture: per variant a lane of rank 0's accelerator (the forward pass grey, the backward
pass layer by layer, darker as it goes: a layer's gradients exist at its end), and a lane per
bucket (tftorus: its buckets, each with its torus phases; Horovod's optimizer: each fused
all-reduce its background thread ran). A bucket's bar is hatched from the moment the first rank
handed it to Horovod to the start of its collective (the others were not ready, or Horovod's
thread was busy), and its triangle is when rank 0's accelerator made its last gradient. The
table gives the same spans in seconds since the step began, and each bucket's end after the
backward pass's.
"""
import argparse
import glob
import json
import os
import re
import sys
import time
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from studies import torus_timeline

TIMELINE_FILE = "horovod_timeline.json"
#: a tftorus bucket's collectives: ops in its name scope (tftorus.runtime.reduction's `bucket<k>`)
BUCKET_OP = re.compile(r"bucket(\d+)/Horovod([A-Z][a-z]+)")
#: Horovod's optimizer names its k-th gradient's all-reduce inside `<name>_Allreduce/cond_<k>`
#: (`cond` for the first): tf.cond around each horovod.tensorflow.allreduce
HVD_GRADIENT = re.compile(r"_Allreduce/cond(?:_(\d+))?/")
#: a response type: the span of the collective itself (its sub-activities nest inside)
RESPONSES = {"ALLREDUCE", "ALLGATHER", "ALLTOALL", "BROADCAST", "REDUCESCATTER", "ADASUM",
             "BARRIER", "JOIN"}
#: a collective may end this late after Keras' batch end (the clocks' error), and still count
WINDOW_SLACK_S = 0.005
HVD_COLOUR = "tab:purple"
VARIANT_TITLES = {"hvd": "Horovod's DistributedOptimizer",
                  "default": "tftorus' DistributedOptimizer"}


# ==================================================================================================
# Recording (in the worker: rank 0 of emulated_step --timeline)
# ==================================================================================================

def epoch_minus_perf(samples: int = 9) -> float:
    """time.time() - time.perf_counter(), from the pair read closest together."""
    best = None
    for _ in range(samples):
        before = time.perf_counter()
        wall = time.time()
        after = time.perf_counter()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) / 2)
    return best[1]


def step_record(variant: str, wire: str, waits, step_start: float, step_end: float,
                offset_at_init: float, offset_at_step: float, variables: Sequence[tuple],
                buckets: Optional[Sequence[Sequence[int]]] = None) -> dict:
    """What step_<variant>.json holds. waits: the accelerator's WaitRecords (phase, layer,
    started, due, ended; perf_counter seconds) of the step; step_start/end: perf_counter at
    Keras' batch begin and end; offset_*: epoch_minus_perf() after init and at the step;
    variables: (layer, bytes on the wire) per gradient, in the optimizer's order; buckets:
    tftorus' plan, the gradients' indices per bucket (None for other optimizers)."""
    return {
        "variant": variant, "wire": wire,
        "step_start_epoch_s": step_start + offset_at_init,
        "step_s": step_end - step_start,
        "clock": {"epoch_minus_perf_at_init_s": offset_at_init,
                  "epoch_minus_perf_at_step_s": offset_at_step,
                  "perf_counter": time.get_clock_info("perf_counter").implementation},
        "waits": [[w[0], w[1], w[2] - step_start, w[3] - step_start, w[4] - step_start]
                  for w in waits],
        "variables": [[layer, int(nbytes)] for layer, nbytes in variables],
        "buckets": None if buckets is None else [list(map(int, b)) for b in buckets],
    }


def save_record(directory: str, record: dict) -> str:
    path = os.path.join(directory, f"step_{record['variant']}.json")
    with open(path, "w") as f:
        json.dump(record, f)
    return path


def one_step(tf, model, data, line_up) -> Tuple[float, float]:
    """This rank's perf_counter at Keras' batch begin and end of one model.fit step, every rank
    started together; the model's wait_log then holds this step's waits alone."""
    class Edges(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.end = time.perf_counter()

    edges = Edges()
    model.accelerator.wait_log.clear()
    line_up()
    model.fit(data, steps_per_epoch=1, epochs=1, verbose=0, callbacks=[edges])
    line_up()  # the next variant's step starts together again
    return edges.start, edges.end


def plan_buckets(plans, gradients: int) -> Optional[List[List[int]]]:
    """tftorus' buckets (gradient indices) of the last of `plans` (tftorus.planning.planner.Plan) that
    carries all `gradients`, or None (Horovod's optimizer makes none)."""
    whole = [p for p in plans
             if sorted(i for b in p.buckets for i in b.indices) == list(range(gradients))]
    return [list(b.indices) for b in whole[-1].buckets] if whole else None


def record_step(directory: str, variant: str, wire: str, model, start: float, end: float,
                offset_at_init: float, plans=()) -> str:
    """Rank 0 after one_step: step_<variant>.json in `directory`, of a VirtualResNet50 built
    with record=True; `plans`: those tftorus made for the model (none for Horovod's)."""
    width = 2 if wire == "fp16" else 4
    variables = [(layer.name, int(v.shape.num_elements()) * width) for layer in model.layers
                 for v in getattr(layer, "virtual_variables", ())]
    if len(variables) != len(model.trainable_variables):
        raise RuntimeError(f"{len(variables)} virtual variables but "
                           f"{len(model.trainable_variables)} trainable ones: the gradients' "
                           f"layers would be misread")
    record = step_record(variant, wire, model.accelerator.wait_log, start, end, offset_at_init,
                         epoch_minus_perf(), variables, plan_buckets(plans, len(variables)))
    return save_record(directory, record)


# ==================================================================================================
# Reading
# ==================================================================================================

class Collective(NamedTuple):
    """One Horovod collective of rank 0 in the step, seconds since the step began."""
    tensor: str
    kind: str  # the response type: ALLREDUCE, ALLTOALL, ...
    asked: float  # the first rank handed it in (Horovod's negotiation began)
    start: float
    end: float


class Lane(NamedTuple):
    """A bucket: tftorus' (its phases) or one of Horovod's fused all-reduces."""
    label: str
    collectives: List[Collective]
    asked: float  # the first rank had handed in all of it (its first phase; a fused one's last)
    gradients: Optional[List[int]]  # its gradients' indices, where known
    ready: Optional[float]  # rank 0's last gradient of it made, where known
    nbytes: Optional[int]

    @property
    def start(self) -> float:
        return min(c.start for c in self.collectives)

    @property
    def end(self) -> float:
        return max(c.end for c in self.collectives)


def timeline_start_epoch_us(events: list) -> int:
    """When Horovod's timeline began, in microseconds on the wall clock."""
    for e in events:
        start = e.get("args", {}).get("start_time_since_epoch_in_micros")
        if start is not None:
            return int(start)
    raise ValueError("Horovod's timeline has no start_time_since_epoch_in_micros (its first "
                     "event): a timeline of Horovod 0.28.1's format is needed")


def step_collectives(record: dict, events: list) -> List[Collective]:
    """Rank 0's collectives that ran within the record's step, in their start order."""
    names, spans = torus_timeline.spans(events)
    shift_s = timeline_start_epoch_us(events) / 1e6 - record["step_start_epoch_s"]
    runs, negotiations = [], {}
    for start, end, pid, activity in spans:
        start, end = start / 1e6 + shift_s, end / 1e6 + shift_s
        if activity.startswith("NEGOTIATE_"):
            negotiations.setdefault(pid, []).append(start)
        elif activity in RESPONSES:
            runs.append((start, end, pid, activity))
    out = []
    for start, end, pid, kind in runs:
        if start < 0 or end > record["step_s"] + WINDOW_SLACK_S:
            continue
        asked = [t for t in negotiations.get(pid, []) if t <= start]
        # the negotiation that led to this run: the latest one before it, if it began in the step
        first = max(asked) if asked and max(asked) >= 0 else start
        out.append(Collective(names.get(pid, str(pid)), kind, first, start, end))
    return sorted(out, key=lambda c: (c.start, c.tensor))


def gradient_ready(record: dict) -> List[float]:
    """Per gradient (the optimizer's order), when rank 0's accelerator made it: the end of its
    layer's backward wait, seconds since the step began."""
    ended = {w[1]: w[4] for w in record["waits"] if w[0] == "backward"}
    missing = sorted({layer for layer, _ in record["variables"] if layer not in ended})
    if missing:
        raise ValueError(f"the step's waits have no backward pass of {missing[:3]}: a record "
                         f"of one whole step is needed")
    return [ended[layer] for layer, _ in record["variables"]]


def lanes(record: dict, collectives: Sequence[Collective]) -> List[Lane]:
    """The step's buckets: tftorus' by their name scope (each with its phases), the rest as
    Horovod's fused all-reduces (the collectives its thread ran at the same time)."""
    ready = gradient_ready(record)
    sizes = [nbytes for _, nbytes in record["variables"]]
    plan = record.get("buckets")
    scoped: Dict[int, List[Collective]] = {}
    others = []
    for c in collectives:
        m = BUCKET_OP.search(c.tensor)
        if m:
            scoped.setdefault(int(m.group(1)), []).append(c)
        else:
            others.append(c)
    out = []
    for k in sorted(scoped):
        members = plan[k] if plan is not None and k < len(plan) else None
        first = min(scoped[k], key=lambda c: c.start)
        out.append(_lane(f"bucket {k}", scoped[k], first.asked, members, ready, sizes))
    fused: List[List[Collective]] = []
    for c in sorted(others, key=lambda c: c.start):
        if fused and c.start < max(f.end for f in fused[-1]):
            fused[-1].append(c)
        else:
            fused.append([c])
    named = hvd_gradients(fused, len(sizes))
    for j, group in enumerate(fused):  # Horovod's optimizer's, or another (its response named)
        label = "fused" if named[j] else group[0].kind.lower()
        out.append(_lane(f"{label} {j} ({len(group)} tensor{'s' * (len(group) > 1)})", group,
                         max(c.asked for c in group), named[j], ready, sizes))
    return sorted(out, key=lambda lane: lane.start)


def hvd_gradients(fused: Sequence[Sequence[Collective]], gradients: int
                  ) -> List[Optional[List[int]]]:
    """The gradients' indices of each of Horovod's fused all-reduces, read from its tensors'
    names: None for a group of other names, and for every group if a gradient came twice."""
    out = []
    for group in fused:
        found = [HVD_GRADIENT.search(c.tensor) for c in group]
        indices = [int(m.group(1) or 0) for m in found if m]
        out.append(indices if len(indices) == len(group) and max(indices) < gradients
                   else None)
    flat = [i for indices in out if indices for i in indices]
    return out if len(set(flat)) == len(flat) else [None] * len(out)


def _lane(label, collectives, asked, members, ready, sizes) -> Lane:
    if not members:
        return Lane(label, collectives, asked, None, None, None)
    return Lane(label, collectives, asked, list(members), max(ready[i] for i in members),
                sum(sizes[i] for i in members))


def passes(record: dict) -> Dict[str, float]:
    """The step's marks, seconds since it began: the forward pass's end, the backward pass's
    first and last wait's end, the step's end."""
    forward = [w[4] for w in record["waits"] if w[0] == "forward"]
    backward = [w for w in record["waits"] if w[0] == "backward"]
    if not forward or not backward:
        raise ValueError("the step's waits lack a forward or a backward pass")
    return {"forward_end": max(forward), "backward_start": min(w[2] for w in backward),
            "backward_end": max(w[4] for w in backward), "step_end": record["step_s"]}


# ==================================================================================================
# Report
# ==================================================================================================

def table(record: dict, step_lanes: Sequence[Lane]) -> str:
    """The step's spans: per bucket when rank 0 had made it, when the first rank asked for it,
    its collectives' start and end, and that end after the backward pass's (negative: before)."""
    marks = passes(record)
    drift_ms = 1e3 * (record["clock"]["epoch_minus_perf_at_step_s"]
                      - record["clock"]["epoch_minus_perf_at_init_s"])
    title = VARIANT_TITLES.get(record["variant"], record["variant"])
    lines = [f"{record['variant']} ({title}, {record['wire']} wire): step "
             f"{marks['step_end']:.3f} s; forward pass ends {marks['forward_end']:.3f} s, "
             f"backward pass {marks['backward_start']:.3f}-{marks['backward_end']:.3f} s "
             f"(rank 0; wall clock moved {drift_ms:+.2f} ms against perf_counter since init)",
             f"  {'bucket':<22}{'MiB':>7}{'ready s':>9}{'asked s':>9}{'start s':>9}{'end s':>9}"
             f"{'after backward s':>18}"]
    fmt = (lambda v, spec: "-" if v is None else format(v, spec))
    for lane in step_lanes:
        mib = None if lane.nbytes is None else lane.nbytes / (1 << 20)
        lines.append(f"  {lane.label:<22}{fmt(mib, '.1f'):>7}{fmt(lane.ready, '.3f'):>9}"
                     f"{lane.asked:>9.3f}{lane.start:>9.3f}{lane.end:>9.3f}"
                     f"{lane.end - marks['backward_end']:>18.3f}")
    if step_lanes:
        last = max(lane.end for lane in step_lanes)
        lines.append(f"  last collective ends {relative(last - marks['backward_end'], 3)} the "
                     f"backward pass; the step ends "
                     f"{relative(marks['step_end'] - marks['backward_end'], 3)} it")
    else:
        lines.append("  no collective of Horovod's timeline lies within this step")
    return "\n".join(lines)


def relative(seconds: float, digits: int) -> str:
    """'0.25 s after' or '0.10 s before' (the caller names what)."""
    return f"{abs(seconds):.{digits}f} s {'after' if seconds >= 0 else 'before'}"


def plot(records: Sequence[dict], all_lanes: Sequence[Sequence[Lane]], path: str,
         title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    heights = [2 + len(step_lanes) for step_lanes in all_lanes]
    fig, axes = plt.subplots(len(records), 1, sharex=True, squeeze=False,
                             figsize=(11, 1.2 + 0.33 * sum(heights)),
                             gridspec_kw={"height_ratios": heights})
    shades = plt.get_cmap("Oranges")
    for ax, record, step_lanes in zip(axes[:, 0], records, all_lanes):
        marks = passes(record)
        span = max(marks["backward_end"] - marks["backward_start"], 1e-9)

        def shade(t):  # later in the backward pass, darker
            return shades(0.3 + 0.65 * (t - marks["backward_start"]) / span)
        for phase, _, started, _, ended in record["waits"]:
            if ended > started:
                ax.barh(0, ended - started, left=started, height=0.6, linewidth=0,
                        color="0.75" if phase == "forward" else shade(ended))
        for y, lane in enumerate(step_lanes, start=1):
            for c in lane.collectives:
                colour = _colour(c)
                ax.barh(y, c.start - c.asked, left=c.asked, height=0.5, color=colour,
                        alpha=0.2, hatch="//", edgecolor=colour, linewidth=0)
                ax.barh(y, max(c.end - c.start, 1e-3), left=c.start, height=0.5, color=colour)
            if lane.ready is not None:
                ax.plot([lane.ready], [y - 0.38], marker="v", color=shade(lane.ready),
                        markeredgecolor="black", markeredgewidth=0.5, markersize=6)
        for mark, style, label in (("backward_end", ":", "backward pass ends"),
                                   ("step_end", "--", "step ends")):
            ax.axvline(marks[mark], color="black", linestyle=style, linewidth=1)
            ax.text(marks[mark], -0.55, f" {label}", fontsize=7, va="bottom")
        ax.set_yticks(range(len(step_lanes) + 1),
                      ["accelerator"] + [lane.label for lane in step_lanes], fontsize=7)
        ax.set_ylim(len(step_lanes) + 0.6, -0.9)
        last = max([lane.end for lane in step_lanes], default=marks["backward_end"])
        ax.set_title(f"{VARIANT_TITLES.get(record['variant'], record['variant'])} "
                     f"({record['wire']} wire): step {marks['step_end']:.2f} s, its last "
                     f"collective ends {relative(last - marks['backward_end'], 2)} the backward "
                     f"pass", fontsize=9)
    handles = [Patch(color="0.75", label="forward pass"),
               Patch(color=shades(0.6), label="backward pass (darker: later)")]
    handles += [Patch(color=torus_timeline.COLOURS[op], label=label)
                for op, label in torus_timeline.PHASES.items()]
    handles += [Patch(color=HVD_COLOUR, label="Horovod's fused all-reduce"),
                Patch(facecolor="white", edgecolor="grey", hatch="//",
                      label="asked by a rank, not yet running"),
                Line2D([], [], marker="v", color="white", markerfacecolor=shades(0.6),
                       markeredgecolor="black", label="rank 0's last gradient of it made")]
    axes[-1, 0].set_xlabel("seconds since the step began (rank 0)")
    fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=4, framealpha=0.9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _colour(c: Collective) -> str:
    m = BUCKET_OP.search(c.tensor)
    if not m:
        return HVD_COLOUR
    return torus_timeline.COLOURS.get(m.group(2), "tab:grey")


def load_records(directory: str) -> List[dict]:
    """The step records of a --timeline directory, Horovod's optimizer first."""
    paths = glob.glob(os.path.join(directory, "step_*.json"))
    records = []
    for path in paths:
        with open(path) as f:
            records.append(json.load(f))
    return sorted(records, key=lambda r: (r["variant"] != "hvd", r["variant"]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("directory", help="emulated_step's --timeline DIR")
    p.add_argument("--variants", nargs="+", default=None,
                   help="the panels, in order (default: every step_<variant>.json, hvd first)")
    p.add_argument("--out", default=None, help="PNG to draw the step into")
    p.add_argument("--title", default="one training step, rank 0: its accelerator and its "
                                      "buckets' collectives")
    args = p.parse_args(argv)
    records = load_records(args.directory)
    timeline = os.path.join(args.directory, TIMELINE_FILE)
    if not records or not os.path.exists(timeline):
        print(f"{args.directory}: no step_<variant>.json or no {TIMELINE_FILE}; make them with "
              f"`python -m studies.emulated_step --model virtual --timeline "
              f"{args.directory} ...` (see this module's docstring)", file=sys.stderr)
        return 2
    if args.variants:
        by = {r["variant"]: r for r in records}
        unknown = [v for v in args.variants if v not in by]
        if unknown:
            print(f"--variants {unknown}: {args.directory} has steps of {sorted(by)}",
                  file=sys.stderr)
            return 2
        records = [by[v] for v in args.variants]
    events = torus_timeline.load(timeline)
    all_lanes = []
    for record in records:
        step_lanes = lanes(record, step_collectives(record, events))
        all_lanes.append(step_lanes)
        print(table(record, step_lanes))
    if args.out:
        plot(records, all_lanes, args.out, args.title)
        print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
