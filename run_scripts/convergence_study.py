"""Convergence study: does the large-batch recipe hold accuracy at small scale?

    .venv/bin/python run_scripts/convergence_study.py             # 4 arms x 2 seeds, ~25 min
    .venv/bin/python run_scripts/convergence_study.py --seeds 0 --epochs 4   # a quick look

Every run is `run_scripts/train.py --flagfile=run_scripts/embedded.flags` (the main job's model
and data) under `horovodrun --gloo -np 2`, for the same number of epochs; the arms differ only in
batch, optimizer, LR rule and label smoothing, each set by a stated rule (ARMS below), never
tuned per arm:

  a  small-batch SGD    total batch S, momentum SGD 0.9, LR = 0.1 x S / 256 (Goyal et al.'s
                        reference rule), no warm-up, polynomial (power 2) decay to 0
  b  large-batch SGD    total batch 32 S, the same SGD with the LR scaled linearly (x32), no
                        warm-up: the naive recipe
  c  paper recipe       total batch 32 S, LARS, LR configuration B with its warm-up, label
                        smoothing 0.1, momentum from the batch rule with the reference batch
                        placed as 32K is to Exp. 2's 54K (32 S x 32768 / 55296): train.py's
                        Exp. 2 exactly, at this batch
  d  + batch control    (c) with half the batch for the first third of the epochs, then 32 S
                        (Table 3's Exp. 2/3 switch at epoch 30 of 90)

Runs go to runs/convergence/<arm>_seed<k> (log.txt, history.jsonl, summary.json); a finished
run is not repeated. The table goes to runs/convergence/results.csv and the plot of validation
top-1 against epoch (mean over seeds, band from min to max) to runs/convergence/convergence.png.
"""
import argparse
import csv
import json
import os
import statistics
import sys
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_training import REPO, train_once  # noqa: E402

SCALE = 32  # large batch / small batch
PAPER_REFERENCE, PAPER_EXP2 = 32768, 55296  # momentum 0.9 at 32K; Exp. 2's 54K

ARM_NAMES = {"a": "small-batch SGD", "b": "large-batch SGD, linear LR",
             "c": "large batch, paper recipe", "d": "paper recipe + batch control"}


def arm_flags(arm: str, small_batch: int) -> List[str]:
    """train.py flags of one arm (on top of embedded.flags), from the rules in the docstring."""
    large = SCALE * small_batch
    if arm in ("a", "b"):
        batch = small_batch if arm == "a" else large
        return ["--exp=ref", f"--batch_schedule={batch}@0", "--optimizer=sgd", "--lr_config=A",
                f"--base_lr={0.1 * batch / 256:g}", "--warmup_epochs=0", "--label_smoothing=0"]
    if arm in ("c", "d"):
        schedule = f"{large}@0" if arm == "c" else f"{large // 2}@0,{large}@30"
        return ["--exp=2", f"--batch_schedule={schedule}", "--optimizer=lars", "--lr_config=B",
                "--label_smoothing=0.1",
                f"--reference_batch={round(large * PAPER_REFERENCE / PAPER_EXP2)}"]
    raise ValueError(f"unknown arm {arm!r}; choose from {sorted(ARM_NAMES)}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arms", nargs="+", default=list(ARM_NAMES), choices=list(ARM_NAMES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--epochs", type=float, default=8.0)
    p.add_argument("--small-batch", type=int, default=32, help="arm a's total batch (default 32)")
    p.add_argument("--workers", type=int, default=2, help="local horovodrun workers (2 cores: 2)")
    p.add_argument("--out", default=os.path.join(REPO, "runs", "convergence"))
    p.add_argument("--timeout", type=float, default=900, help="seconds per run before it fails")
    p.add_argument("train_flags", nargs="*", help="extra train.py flags, after --")
    args = p.parse_args(argv)
    if args.small_batch < args.workers or args.small_batch % args.workers:
        p.error(f"--small-batch {args.small_batch} must be a multiple of --workers "
                f"{args.workers}")
    return args


def run_one(arm: str, seed: int, args) -> Dict:
    model_dir = os.path.join(args.out, f"{arm}_seed{seed}")
    summary, seconds = train_once(
        model_dir, args.workers,
        ["--flagfile=run_scripts/embedded.flags", "--batch_divisor=1", f"--epochs={args.epochs:g}",
         f"--seed={seed}", *arm_flags(arm, args.small_batch), *args.train_flags],
        args.timeout, f"arm {arm} seed {seed}")
    if seconds is not None:
        print(f"  {arm} ({ARM_NAMES[arm]}) seed {seed}: {seconds:.0f} s", flush=True)
    with open(os.path.join(model_dir, "history.jsonl")) as f:
        history = [json.loads(line) for line in f if line.strip()]
    return {"arm": arm, "seed": seed, "top1": summary["top1_1crop"],
            "train_seconds": summary["seconds"],
            "curve": [(h["epoch"], h["top1"]) for h in history if h.get("top1") is not None]}


def table(rows: List[Dict], arms: List[str]) -> str:
    base = [r["top1"] for r in rows if r["arm"] == "a"]
    lines = ["| arm | | seeds | top-1 mean % | min-max % | vs (a), points | train s (mean) |",
             "|---|---|---|---|---|---|---|"]
    for arm in arms:
        top1 = [r["top1"] for r in rows if r["arm"] == arm]
        secs = [r["train_seconds"] for r in rows if r["arm"] == arm]
        delta = f"{statistics.mean(top1) - statistics.mean(base):+.2f}" if base else "n/a"
        lines.append(f"| {arm} | {ARM_NAMES[arm]} | {len(top1)} | {statistics.mean(top1):.2f} | "
                     f"{min(top1):.2f}-{max(top1):.2f} | {delta} | {statistics.mean(secs):.0f} |")
    return "\n".join(lines)


def plot(rows: List[Dict], arms: List[str], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm in arms:
        curves = [r["curve"] for r in rows if r["arm"] == arm]
        n = min(len(c) for c in curves)
        epochs = [statistics.mean(c[i][0] for c in curves) for i in range(n)]
        values = [[c[i][1] for c in curves] for i in range(n)]
        line, = ax.plot(epochs, [statistics.mean(v) for v in values], marker="o", ms=3,
                        label=f"({arm}) {ARM_NAMES[arm]}")
        ax.fill_between(epochs, [min(v) for v in values], [max(v) for v in values],
                        color=line.get_color(), alpha=0.2)
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation top-1 (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.makedirs(args.out, exist_ok=True)
    print(f"{len(args.arms)} arms x {len(args.seeds)} seeds, {args.epochs:g} epochs, "
          f"{args.workers} workers, batches {args.small_batch} and {SCALE * args.small_batch}; "
          f"runs in {args.out}", flush=True)
    start = time.time()
    rows = [run_one(arm, seed, args) for seed in args.seeds for arm in args.arms]  # seed-major
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["arm", "seed", "top1", "train_seconds"])
        writer.writeheader()
        writer.writerows({k: r[k] for k in writer.fieldnames} for r in rows)
    png = os.path.join(args.out, "convergence.png")
    plot(rows, args.arms, png, f"Embedded data, {args.epochs:g} epochs, {args.workers} workers, "
         f"batch {args.small_batch} vs {SCALE * args.small_batch}, seeds {args.seeds}")
    print("\n" + table(rows, args.arms))
    print(f"\nwall-clock {time.time() - start:.0f} s; plot {png}; table "
          f"{os.path.join(args.out, 'results.csv')}")


if __name__ == "__main__":
    main()
