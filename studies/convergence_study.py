"""Convergence study: does the large-batch recipe hold accuracy at small scale?

    .venv/bin/python -m studies.convergence_study             # 4 arms x 3 seeds, ~27 min
    .venv/bin/python -m studies.convergence_study --seeds 0 --epochs 4   # a quick look

Every run is `run_scripts/train.py --flagfile=run_scripts/embedded.flags` on the embedded data,
with the study's model (MODEL_FLAGS) and, for every arm alike, a micro-batch of S images: BN
normalises over the same S images in every arm, as over one GPU's 16 or 32 in the paper, and a
large batch of 32 S is 32 emulated workers' micro-batches accumulated in one process. The arms
differ only in batch, optimizer, LR and label smoothing, each set by one rule (ARMS below):
the LR is linear in the total batch, never tuned per arm.

  a  small-batch SGD    total batch S, momentum SGD 0.9, LR = 0.1 x S / 256 (Goyal et al.'s
                        rule), no warm-up, polynomial (power 2) decay to 0
  b  large-batch SGD    total batch 32 S, the same SGD with the LR scaled linearly (x32), no
                        warm-up: the naive recipe
  c  paper recipe       total batch 32 S: train.py --exp=2 with --batch_divisor=55296/(32 S), so
                        Exp. 2's LARS, configuration B, label smoothing and momentum rule, with
                        the LR divided as the batch is (train.py's scale-down rule)
  d  + batch control    (c) with half the batch for the first third of the epochs, then 32 S
                        (Table 3's switch at epoch 30 of 90, as Exp. 1 and 4 double the batch)
  e  small-batch recipe (c) at total batch S (not run by default): separates what the recipe
                        does at any batch from what it does for a large one

Runs go to runs/convergence/<arm>_seed<k> (log.txt, history.jsonl, summary.json); a finished
run is not repeated. The table goes to runs/convergence/results.csv and the plot of validation
top-1 against epoch (mean over seeds, band from min to max) to runs/convergence/convergence.png.
"""
import argparse
import concurrent.futures
import csv
import json
import os
import statistics
import sys
import time
from typing import Dict, List

from studies.local_training import REPO, train_once

SCALE = 32  # large batch / small batch (the paper's 32K is 32x Goyal et al.'s 1K)
PAPER_EXP2_BATCH = 55296  # Exp. 2's 54K: the batch its LRs were set for
# The study's model: the main job's ResNet-14 with the ImageNet stem at the data's own 64 px
# (conv2 at 16 x 16, as 224 px reaches 56 x 56) and width 8. It trains about 2.5x the images per
# core of the main job's 32 px layout, which the large arms need to take hundreds of steps.
MODEL_FLAGS = ["--image_size=64", "--nosmall_inputs", "--width=8"]
BN_STAT_IMAGES = 2560  # images for the BN statistics before each evaluation, in every arm

ARM_NAMES = {"a": "small-batch SGD", "b": "large-batch SGD, linear LR",
             "c": "large batch, paper recipe", "d": "paper recipe + batch control",
             "e": "small batch, paper recipe"}
DEFAULT_ARMS = ["a", "b", "c", "d"]


def arm_batches(arm: str, small_batch: int) -> List[int]:
    """The total batches an arm trains with, in order."""
    large = SCALE * small_batch
    return {"a": [small_batch], "b": [large], "c": [large], "d": [large // 2, large],
            "e": [small_batch]}[arm]


def arm_flags(arm: str, small_batch: int, workers: int = 1) -> List[str]:
    """train.py flags of one arm (on top of embedded.flags and MODEL_FLAGS), from the rules in
    the docstring."""
    if arm not in ARM_NAMES:
        raise ValueError(f"unknown arm {arm!r}; choose from {sorted(ARM_NAMES)}")
    batch = max(arm_batches(arm, small_batch))
    common = [f"--max_micro_batch={small_batch // workers}",
              f"--bn_stat_batches={max(1, BN_STAT_IMAGES * workers // batch)}"]
    if arm in ("a", "b"):
        return common + ["--exp=ref", f"--batch_schedule={batch}@0", "--batch_divisor=1",
                         "--optimizer=sgd", "--lr_config=A", f"--base_lr={0.1 * batch / 256:g}",
                         "--warmup_epochs=0", "--label_smoothing=0"]
    if PAPER_EXP2_BATCH % batch:
        raise ValueError(f"the batch {batch} must divide Exp. 2's {PAPER_EXP2_BATCH} "
                         f"(--small-batch 8, 16 or 32 do)")
    flags = common + ["--exp=2", f"--batch_divisor={PAPER_EXP2_BATCH // batch}",
                      "--optimizer=lars"]
    if arm == "d":
        flags.append(f"--batch_schedule={PAPER_EXP2_BATCH // 2}@0,{PAPER_EXP2_BATCH}@30")
    return flags


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARM_NAMES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=float, default=12.0)
    p.add_argument("--small-batch", type=int, default=16,
                   help="arm a's total batch and every arm's micro-batch (default 16)")
    p.add_argument("--workers", type=int, default=1,
                   help="horovodrun workers per run (1: one process accumulates micro-batches)")
    p.add_argument("--parallel", type=int, default=2,
                   help="runs at once, sharing the cores, each with cores/parallel TensorFlow "
                        "threads (one small model cannot keep 2 cores busy)")
    p.add_argument("--out", default=os.path.join(REPO, "runs", "convergence"))
    p.add_argument("--timeout", type=float, default=1200, help="seconds per run before it fails")
    p.add_argument("train_flags", nargs="*", help="extra train.py flags, after --")
    args = p.parse_args(argv)
    if args.small_batch < args.workers or args.small_batch % args.workers:
        p.error(f"--small-batch {args.small_batch} must be a multiple of --workers "
                f"{args.workers}")
    if args.parallel < 1:
        p.error("--parallel must be >= 1")
    return args


def run_one(arm: str, seed: int, args) -> Dict:
    model_dir = os.path.join(args.out, f"{arm}_seed{seed}")
    threads = max(1, (os.cpu_count() or 1) // (args.parallel * args.workers))
    summary, seconds = train_once(
        model_dir, args.workers,
        ["--flagfile=run_scripts/embedded.flags", *MODEL_FLAGS, f"--epochs={args.epochs:g}",
         f"--seed={seed}", *arm_flags(arm, args.small_batch, args.workers), *args.train_flags],
        args.timeout, f"arm {arm} seed {seed}",
        env={"TF_NUM_INTRAOP_THREADS": str(threads), "TF_NUM_INTEROP_THREADS": str(threads)})
    with open(os.path.join(model_dir, "history.jsonl")) as f:
        history = [json.loads(line) for line in f if line.strip()]
    if seconds is not None:
        print(f"  {arm} ({ARM_NAMES[arm]}) seed {seed}: top-1 {summary['top1_1crop']:.2f}%, "
              f"{summary['steps']} steps, {seconds:.0f} s", flush=True)
    return {"arm": arm, "seed": seed, "top1": summary["top1_1crop"], "steps": summary["steps"],
            "train_seconds": summary["seconds"],
            "curve": [(h["epoch"], h["top1"]) for h in history if h.get("top1") is not None]}


def table(rows: List[Dict], arms: List[str]) -> str:
    base = [r["top1"] for r in rows if r["arm"] == "a"]
    lines = ["| arm | | seeds | steps | top-1 mean % | min-max % | vs (a), points | "
             "train s (mean) |", "|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        top1 = [r["top1"] for r in rows if r["arm"] == arm]
        secs = [r["train_seconds"] for r in rows if r["arm"] == arm]
        delta = f"{statistics.mean(top1) - statistics.mean(base):+.2f}" if base else "n/a"
        steps = sorted({r["steps"] for r in rows if r["arm"] == arm})  # alike over seeds
        steps_text = str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"
        lines.append(f"| {arm} | {ARM_NAMES[arm]} | {len(top1)} | {steps_text} | "
                     f"{statistics.mean(top1):.2f} | {min(top1):.2f}-{max(top1):.2f} | {delta} | "
                     f"{statistics.mean(secs):.0f} |")
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
          f"{args.workers} worker(s) per run, {args.parallel} run(s) at once, batches "
          f"{args.small_batch} and {SCALE * args.small_batch}; runs in {args.out}", flush=True)
    start = time.time()
    runs = [(arm, seed) for seed in args.seeds for arm in args.arms]  # seed-major
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        rows = list(pool.map(lambda run: run_one(*run, args), runs))
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["arm", "seed", "top1", "steps", "train_seconds"])
        writer.writeheader()
        writer.writerows({k: r[k] for k in writer.fieldnames} for r in rows)
    png = os.path.join(args.out, "convergence.png")
    plot(rows, args.arms, png, f"Embedded data, ResNet-14 w8 at 64 px, {args.epochs:g} epochs\n"
         f"batch {args.small_batch} vs {SCALE * args.small_batch} (micro-batches of "
         f"{args.small_batch // args.workers}), seeds {', '.join(map(str, args.seeds))}")
    print("\n" + table(rows, args.arms))
    print(f"\nwall-clock {time.time() - start:.0f} s; plot {png}; table "
          f"{os.path.join(args.out, 'results.csv')}")


if __name__ == "__main__":
    main()
