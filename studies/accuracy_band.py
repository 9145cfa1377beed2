"""Accuracy band of the main job: the same run on 4 workers and on 1 process, over several seeds.

    .venv/bin/python -m studies.accuracy_band                   # 3 seeds x 3 arms, ~17 min
    .venv/bin/python -m studies.accuracy_band --seeds 0 --arms np4 np1

Every arm runs `run_scripts/train.py --exp=2 --flagfile=run_scripts/embedded.flags` (the README's
main job) with one seed, so the arms differ only in how the same total batch is computed:

  np4       4 workers on a 2 x 2 torus, 54 images per worker per step (the main job)
  np1-mb54  1 process, the step's 216 images as 4 accumulated micro-batches of 54, so BN
            normalises over the same 54 images as on each of the 4 workers
  np1       1 process, BN over all 216 images of a step

A seed fixes the initial weights; the data order and augmentation also depend on how the data
is sharded, so np4 and np1 with one seed see different orders. The spread over seeds is the
band a single run falls in. Per arm it also prints how far the worst run's final top-1 fell
below its best epoch, and the largest ratio of last to first epoch's training loss (a run that
ends past its best, or whose loss rose, shows there). Each run's directory (runs/accuracy_band/<arm>_seed<k>) keeps its
log, history.jsonl and summary.json; the table goes to runs/accuracy_band/results.csv.
"""
import argparse
import csv
import json
import os
import statistics
import sys

from studies.local_training import REPO, train_once

ARMS = {
    "np4": (4, ["--grid=2x2"]),
    "np1-mb54": (1, ["--max_micro_batch=54"]),
    "np1": (1, []),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--out", default=os.path.join(REPO, "runs", "accuracy_band"))
    p.add_argument("--timeout", type=float, default=1200, help="seconds per run before it fails")
    p.add_argument("train_flags", nargs="*", help="extra train.py flags, after --")
    return p.parse_args(argv)


def run_one(arm: str, seed: int, args) -> dict:
    """One run's row: final and best top-1 and the first and last epoch's training loss."""
    workers, arm_flags = ARMS[arm]
    model_dir = os.path.join(args.out, f"{arm}_seed{seed}")
    summary, seconds = train_once(
        model_dir, workers,
        ["--exp=2", "--flagfile=run_scripts/embedded.flags", f"--seed={seed}", *arm_flags,
         *args.train_flags], args.timeout, f"{arm} seed {seed}")
    with open(os.path.join(model_dir, "history.jsonl")) as f:
        history = [json.loads(line) for line in f if line.strip()]
    evaluated = [h["top1"] for h in history if h.get("top1") is not None]
    row = {"arm": arm, "seed": seed, "top1": summary["top1_1crop"], "best_top1": max(evaluated),
           "first_loss": history[0]["loss"], "last_loss": history[-1]["loss"],
           "train_seconds": summary["seconds"]}
    if seconds is not None:
        print(f"  {arm:9s} seed {seed}: top-1 {row['top1']:.2f}% (best epoch "
              f"{row['best_top1']:.2f}%), loss {row['first_loss']:.3f} -> {row['last_loss']:.3f} "
              f"({seconds:.0f} s wall-clock)", flush=True)
    return row


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(f"{len(args.arms)} arms x {len(args.seeds)} seeds of the main job; runs in {args.out}",
          flush=True)
    # seed-major: a partial sweep still compares every arm
    rows = [run_one(arm, seed, args) for seed in args.seeds for arm in args.arms]
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    print(f"\n{'arm':10s} {'seeds':>5s} {'top-1 mean':>10s} {'min':>7s} {'max':>7s} "
          f"{'final - best':>12s} {'last/first loss':>15s}  per seed")
    for arm in args.arms:
        mine = [r for r in rows if r["arm"] == arm]
        top1 = [r["top1"] for r in mine]
        below_best = max(r["best_top1"] - r["top1"] for r in mine)  # the worst run's
        loss_ratio = max(r["last_loss"] / r["first_loss"] for r in mine)
        print(f"{arm:10s} {len(top1):5d} {statistics.mean(top1):9.2f}% {min(top1):6.2f}% "
              f"{max(top1):6.2f}% {-below_best:+11.2f}  {loss_ratio:14.3f}   "
              + ", ".join(f"{t:.2f}" for t in top1))
    print("final - best: the largest drop of a run's final top-1 below its best epoch; "
          "last/first loss: the largest ratio of a run's last epoch's training loss to its first")


if __name__ == "__main__":
    main()
