"""Training steps across emulated hosts: Horovod's own DistributedOptimizer against tftorus'.

    sudo .venv/bin/python -m studies.emulated_step                  # 1x4, 2x2, 2x4 at 0.25 Gbit/s
    sudo .venv/bin/python -m studies.emulated_step --clusters 2x2 --link-gbit 0.25 1 \\
        --wires fp16 fp32 --repeats 3

What a user measures: `model.fit` steps of Keras' ResNet-50 (32 x 32 images, 10 classes, SGD
with momentum, --batch images per rank, synthetic data made in each process) on the emulated
cluster of studies/emulated_cluster.py (a network namespace per host, rate-limited host links,
every rank on this machine's cores). Variants, each its own model and optimizer in the same
processes:

  hvd       horovod.tensorflow.keras.DistributedOptimizer (Horovod's own, the reference)
  default   tftorus.keras.DistributedOptimizer with nothing but the wire compression
  torus, ring, hierarchical   the same with algorithm= forced
  compute   the plain optimizer, no reduction: the compute alone, with every rank at work

--fusion-mb sets tftorus' bucket size for its variants (Horovod's optimizer keeps its own).

For every variant also the all-reduce alone: its optimizer's reduction (`_allreduce_grads`, what
its compute_gradients calls) on gradient-shaped tensors, with no forward or backward pass.
Each repeat runs the variants in a rotated order; a variant's time is the slowest rank's median
step. The table gives medians over repeats and, per repeat then their median, the step's ratio
to hvd's and to max(compute, all-reduce), and how much of the smaller of the two the step hides:
(compute + all-reduce - step) / min(compute, all-reduce). Needs root; exits 77 where namespaces
cannot be made. The CSV (default /tmp/tftorus_step/steps.csv) is not for the repository.
"""
import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List

from studies import emulated_cluster as cluster

DEFAULT_OUT = os.path.join(tempfile.gettempdir(), "tftorus_step")
VARIANTS = ("hvd", "default", "torus", "ring", "hierarchical")
FIELDS = ("hosts", "ranks_per_host", "link_gbit", "wire", "repeat", "variant", "step_s",
          "allreduce_s")


def topology(text: str):
    """HOSTSxRANKS_PER_HOST as emulated_cluster reads it, both at least 1."""
    try:
        hosts, rph = cluster.topology(text)
    except argparse.ArgumentTypeError:
        hosts = rph = 0
    if hosts < 1 or rph < 1:
        raise argparse.ArgumentTypeError(
            f"--clusters takes HOSTSxRANKS_PER_HOST, e.g. 2x2, got {text!r}")
    return hosts, rph


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clusters", nargs="+", type=topology, default=[(1, 4), (2, 2), (2, 4)])
    p.add_argument("--link-gbit", nargs="+", type=float, default=[0.25])
    p.add_argument("--wires", nargs="+", choices=("fp16", "fp32"), default=["fp16", "fp32"])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=["hvd", "default"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=4, help="timed steps per fit call")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    p.add_argument("--batch", type=int, default=4, help="images per rank and step")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--fusion-mb", type=float, default=None,
                   help="tftorus' bucket size (fusion_threshold_bytes) in MiB; default: its own")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per cluster")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--meta", nargs=3, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--repeats and --steps must be >= 1, --warmup >= 0")
    return args


# ==================================================================================================
# Worker: one process per rank, inside its host's namespace
# ==================================================================================================

def worker(args) -> None:
    import numpy as np
    import tftorus
    tftorus.init()
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd_keras
    import tensorflow as tf
    import tftorus.keras

    rank = hvd_tf.rank()
    tf.keras.utils.set_random_seed(rank)
    shape = (args.image_size, args.image_size, 3)
    images = tf.random.uniform((args.batch,) + shape)
    labels = tf.constant(np.arange(args.batch) % 10)
    data = tf.data.Dataset.from_tensors((images, labels)).repeat()

    def optimizer(variant, wire):
        sgd = tf.keras.optimizers.SGD(0.01, momentum=0.9)
        if variant == "compute":
            return sgd
        if variant == "hvd":
            return hvd_keras.DistributedOptimizer(sgd, compression=getattr(
                hvd_keras.Compression, "fp16" if wire == "fp16" else "none"))
        compression = getattr(tftorus.Compression, "fp16" if wire == "fp16" else "none")
        torus = {} if variant == "default" else {"algorithm": variant}
        if args.fusion_mb is not None:
            torus["fusion_threshold_bytes"] = int(args.fusion_mb * (1 << 20))
        return tftorus.keras.DistributedOptimizer(sgd, compression=compression, **torus)

    class StepTimes(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self.start)

    def slowest(seconds: float) -> float:
        return float(hvd_tf.allreduce(tf.constant(seconds, tf.float64), op=hvd_tf.Max,
                                      name="slowest"))

    meta = dict(zip(("hosts", "ranks_per_host", "link_gbit"), args.meta))
    for wire in args.wires:
        variants = ["compute"] + list(args.variants)
        built = {}
        for variant in variants:
            model = tf.keras.applications.ResNet50(weights=None, input_shape=shape, classes=10,
                                                   classifier_activation=None)
            opt = optimizer(variant, wire)
            model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            grads = [tf.random.normal(v.shape, seed=1) * 1e-3 for v in model.trainable_variables]
            reduce_fn = None
            if variant != "compute":
                reduce_fn = tf.function(  # plain Python: nothing for AutoGraph to convert
                    lambda g, o=opt, m=model: o._allreduce_grads(g, m.trainable_variables),
                    autograph=False)
            built[variant] = (model, reduce_fn, grads)
        rows = []
        for repeat in range(args.repeats):
            shift = repeat % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                model, reduce_fn, grads = built[variant]
                hvd_tf.allreduce(tf.constant(0.0), name="line_up")  # start together
                timer = StepTimes()
                model.fit(data, steps_per_epoch=args.warmup + args.steps, epochs=1, verbose=0,
                          callbacks=[timer])
                step = slowest(statistics.median(timer.times[args.warmup:]))
                allreduce = 0.0
                if reduce_fn is not None:
                    calls = []
                    for i in range(args.warmup + args.steps):
                        hvd_tf.allreduce(tf.constant(0.0), name="line_up")
                        start = time.perf_counter()
                        for t in reduce_fn(grads):
                            t.numpy()
                        calls.append(time.perf_counter() - start)
                    allreduce = slowest(statistics.median(calls[args.warmup:]))
                rows.append({**meta, "wire": wire, "repeat": repeat, "variant": variant,
                             "step_s": f"{step:.4f}", "allreduce_s": f"{allreduce:.4f}"})
                if rank == 0:
                    print(f"  {wire} repeat {repeat} {variant:12s} step {step:.3f} s, "
                          f"all-reduce alone {allreduce:.3f} s", flush=True)
        if rank == 0:
            append_csv(os.path.join(args.out, "steps.csv"), rows)
        del built
    tftorus.shutdown()


def append_csv(path: str, rows: List[dict]) -> None:
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerows(rows)


# ==================================================================================================
# Report
# ==================================================================================================

def step_table(rows: List[Dict[str, str]]) -> str:
    """One cluster, rate and wire: per variant the medians and the ratios (see the docstring)."""
    by = {}
    for r in rows:
        by.setdefault(r["variant"], {})[int(r["repeat"])] = (float(r["step_s"]),
                                                             float(r["allreduce_s"]))
    compute = by.get("compute", {})
    hvd = by.get("hvd", {})
    lines = [f"{'variant':<14}{'step s':>8}{'compute s':>11}{'all-reduce s':>14}"
             f"{'hidden':>8}{'step/hvd':>10}{'step/max(c,a)':>15}"]
    for variant, reps in by.items():
        if variant == "compute":
            continue
        step = statistics.median(s for s, _ in reps.values())
        alone = statistics.median(a for _, a in reps.values())
        comp = statistics.median(compute[r][0] for r in reps if r in compute) if compute else 0
        to_hvd = [s / hvd[r][0] for r, (s, _) in reps.items() if r in hvd]
        to_max = [s / max(compute[r][0], a) for r, (s, a) in reps.items() if r in compute]
        hidden = [(compute[r][0] + a - s) / min(compute[r][0], a)
                  for r, (s, a) in reps.items() if r in compute and min(compute[r][0], a) > 0]
        fmt = (lambda v: f"{statistics.median(v):.2f}" if v else "n/a")
        lines.append(f"{variant:<14}{step:>8.3f}{comp:>11.3f}{alone:>14.3f}"
                     f"{fmt(hidden):>8}{fmt(to_hvd):>10}{fmt(to_max):>15}")
    return "\n".join(lines)


def report(path: str) -> str:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    groups = {}
    for r in rows:
        groups.setdefault((r["hosts"], r["ranks_per_host"], r["link_gbit"], r["wire"]), []).append(r)
    out = []
    for (hosts, rph, gbit, wire), group in groups.items():
        link = "" if hosts == "1" else f", {gbit} Gbit/s host links"
        out.append(f"\n== {hosts} host(s) x {rph} ranks{link}, {wire} wire ==\n"
                   + step_table(group))
    return "\n".join(out)


# ==================================================================================================
# Launcher
# ==================================================================================================

def worker_argv(args, wire: str, meta) -> List[str]:
    """The command of one rank: `--worker` with the launcher's settings, one wire, and `meta`
    (hosts, ranks per host, link) for the CSV rows."""
    return [sys.executable, "-m", "studies.emulated_step", "--worker", "--wires", wire,
            "--variants", *args.variants, "--repeats", str(args.repeats),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
            "--image-size", str(args.image_size), "--out", args.out,
            *(["--fusion-mb", str(args.fusion_mb)] if args.fusion_mb is not None else []),
            "--meta", *meta]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    reason = cluster.why_not_possible()
    if reason:
        print(f"emulated step benchmark skipped: {reason}", file=sys.stderr)
        return cluster.SKIPPED
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "steps.csv")
    if os.path.exists(csv_path):
        os.remove(csv_path)  # the tables are of this run
    failed = []
    for hosts, rph in args.clusters:
        for gbit in (args.link_gbit if hosts > 1 else args.link_gbit[:1]):
            # One launch per wire: every variant's model lives in the same processes, and at
            # 2 x 4 two wires' worth of ResNet-50s (3 GB a rank) ran this machine out of memory.
            for wire in args.wires:
                title = f"{hosts}x{rph}" + (f" at {gbit:g} Gbit/s" if hosts > 1 else "")
                title += f", {wire} wire"
                print(f"emulated cluster {title}", flush=True)
                argv_worker = worker_argv(args, wire, (str(hosts), str(rph), f"{gbit:g}"))
                log = os.path.join(args.out, f"ranks_{hosts}x{rph}_{gbit:g}_{wire}.log")
                with cluster.Cluster(hosts, gbit):
                    rc = cluster.launch(args, hosts, rph, argv_worker, log)
                if rc:
                    failed.append(title)
    if os.path.exists(csv_path):
        print(report(csv_path))
        print(f"\nCSV: {csv_path}")
    return cluster.exit_status(failed)


if __name__ == "__main__":
    sys.exit(main())
