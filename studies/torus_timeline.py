"""Where one torus all-reduce spends its time: Horovod's timeline, per bucket and phase.

Run the emulated cluster with Horovod's timeline on and only the torus beside Horovod's own
all-reduce (other variants' buckets carry the same names), then draw the last torus call:

    sudo HOROVOD_TIMELINE=/tmp/tftorus_timeline.json .venv/bin/python -m studies.emulated_cluster \\
        --hosts 2 --ranks-per-host 2 --link-gbit 0.25 --engines horovod --sizes --resnet fp16 \\
        --repeats 3 --warmup 1 --variants hvd torus --out /tmp/tftorus_timeline
    .venv/bin/python -m studies.torus_timeline /tmp/tftorus_timeline.json --out timeline.png

Rank 0 writes the timeline: what its background thread did for its row and its column. Each
bucket's three collectives are drawn from the moment the first member of the group asked for
them (Horovod's negotiation, hatched: the others had not yet) to their end; between them Horovod's thread is idle
while TensorFlow packs, sums and unpacks, or waits for the group's other members. The table
printed gives the same spans and the idle time of Horovod's thread within the call.
"""
import argparse
import collections
import json
import re
import sys
from typing import Dict, List, Tuple

PHASES = {"Alltoall": "row reduce-scatter (all-to-all)", "Allreduce": "column all-reduce",
          "Allgather": "row all-gather"}
COLOURS = {"Alltoall": "tab:blue", "Allreduce": "tab:red", "Allgather": "tab:green"}
#: a torus bucket's collectives, named by tftorus.runtime.reduction's name scope per bucket
TORUS_OP = re.compile(r"bucket(\d+)/Horovod(Alltoall|Allreduce|Allgather)_bucket\d+_")
#: ops further apart than this belong to different calls of the all-reduce
CALL_GAP_US = 300e3


def load(path: str) -> list:
    """Horovod's Chrome trace; a job that ended without closing the array is read too."""
    with open(path) as f:
        text = f.read().rstrip().rstrip(",")
    return json.loads(text if text.endswith("]") else text + "]")


def spans(events: list) -> Tuple[Dict[int, str], List[tuple]]:
    """(pid -> tensor name, [(start us, end us, pid, activity)]) from B/E pairs."""
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("name") == "process_name" and "name" in e.get("args", {})}
    open_, out = collections.defaultdict(list), []
    for e in events:
        if e.get("ph") == "B":
            open_[e["pid"]].append((e["name"], e["ts"]))
        elif e.get("ph") == "E" and open_[e["pid"]]:
            name, start = open_[e["pid"]].pop()
            out.append((start, e["ts"], e["pid"], name))
    return names, sorted(out)


def torus_calls(names, all_spans) -> List[List[tuple]]:
    """Each call of the torus: [(bucket, op, negotiation start, start, end)] in time order."""
    ops = {}
    for start, end, pid, activity in all_spans:
        m = TORUS_OP.search(names.get(pid, ""))
        if not m:
            continue
        key = (pid, int(m.group(1)), m.group(2))
        if activity.startswith("NEGOTIATE"):
            ops.setdefault(key, []).append(["neg", start, end])
        elif activity.upper() == m.group(2).upper():
            ops.setdefault(key, []).append(["run", start, end])
    rows = []
    for (pid, bucket, op), items in ops.items():
        negs = [i for i in items if i[0] == "neg"]
        for run in (i for i in items if i[0] == "run"):
            before = [n for n in negs if n[1] <= run[1]]
            asked = max(n[1] for n in before) if before else run[1]
            rows.append((bucket, op, asked, run[1], run[2]))
    rows.sort(key=lambda r: r[3])
    calls, current = [], []
    for r in rows:
        if current and r[3] - max(c[4] for c in current) > CALL_GAP_US:
            calls.append(current)
            current = []
        current.append(r)
    if current:
        calls.append(current)
    return [c for c in calls if {r[1] for r in c} == set(PHASES)]


def summary(call: List[tuple]) -> str:
    t0 = min(r[2] for r in call)
    end = max(r[4] for r in call)
    lines = [f"{'bucket':>6} {'phase':<32}{'asked ms':>10}{'start ms':>10}{'end ms':>10}"
             f"{'ran ms':>9}"]
    for bucket, op, asked, start, stop in sorted(call, key=lambda r: r[3]):
        lines.append(f"{bucket:>6} {PHASES[op]:<32}{(asked - t0) / 1e3:>10.1f}"
                     f"{(start - t0) / 1e3:>10.1f}{(stop - t0) / 1e3:>10.1f}"
                     f"{(stop - start) / 1e3:>9.1f}")
    # Horovod's thread runs one collective at a time (fused ops share one span): its busy time
    busy, last = 0.0, t0
    for _, _, _, start, stop in sorted(call, key=lambda r: r[3]):
        busy += max(0.0, stop - max(start, last))
        last = max(last, stop)
    lines.append(f"call: {(end - t0) / 1e3:.0f} ms from the first request to the last "
                 f"collective's end; Horovod's thread busy {busy / 1e3:.0f} ms, idle "
                 f"{(end - t0 - busy) / 1e3:.0f} ms")
    return "\n".join(lines)


def plot(call: List[tuple], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t0 = min(r[2] for r in call)
    buckets = sorted({r[0] for r in call})
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * len(buckets)))
    for bucket, op, asked, start, stop in call:
        y = buckets.index(bucket)
        ax.barh(y, (start - asked) / 1e3, left=(asked - t0) / 1e3, height=0.5,
                color=COLOURS[op], alpha=0.2, hatch="//", edgecolor=COLOURS[op], linewidth=0)
        ax.barh(y, max((stop - start) / 1e3, 1.0), left=(start - t0) / 1e3, height=0.5,
                color=COLOURS[op])
    from matplotlib.patches import Patch
    handles = [Patch(color=COLOURS[op], label=label) for op, label in PHASES.items()]
    handles.append(Patch(facecolor="white", edgecolor="grey", hatch="//",
                         label="asked by a member, waiting for the others"))
    ax.set_yticks(range(len(buckets)), [f"bucket {b}" for b in buckets])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the call's first request (rank 0's Horovod thread)")
    ax.set_title(title, fontsize=9)
    ax.legend(handles=handles, fontsize=7, loc="lower right", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("timeline", help="HOROVOD_TIMELINE's file")
    p.add_argument("--call", type=int, default=-1,
                   help="which torus call (0: the first, -1: the last; default -1)")
    p.add_argument("--out", default=None, help="PNG to draw the call into")
    p.add_argument("--title", default="one torus all-reduce, per bucket and phase")
    args = p.parse_args(argv)
    names, all_spans = spans(load(args.timeline))
    calls = torus_calls(names, all_spans)
    if not calls:
        print(f"{args.timeline}: no torus call (ops named bucket<k>/HorovodAlltoall_..., "
              f"...Allreduce_..., ...Allgather_...) found; run the study with --variants hvd "
              f"torus and HOROVOD_TIMELINE set", file=sys.stderr)
        return 2
    call = calls[args.call]
    print(f"{len(calls)} torus calls in the timeline; call {args.call}:")
    print(summary(call))
    if args.out:
        plot(call, args.out, args.title)
        print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
