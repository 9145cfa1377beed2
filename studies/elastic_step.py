"""Training steps in an elastic job against the same job on a fixed world, beside Horovod's own.

    .venv/bin/python -m studies.elastic_step                  # 2 hosts x 2 ranks, fp32, 3 repeats
    .venv/bin/python -m studies.elastic_step --repeats 5 --wires fp16 fp32

An elastic job carries the torus' rows and columns on Horovod's global set (an all-to-all with
a split per rank; tftorus/engines/horovod_elastic_engine.py says why), a fixed one on process sets.
This runs the timing worker of studies/emulated_step (model.fit steps of Keras' ResNet-50, the
variants side by side in the same processes) twice on this machine, as two local hosts of 2 ranks
('localhost' and '127.0.0.1'): under `horovodrun` with a fixed world, then under its elastic
driver (`--min-np 4 --max-np 4`), where no worker comes or goes. Each table's step/hvd is
against Horovod's DistributedOptimizer in the same launch; Horovod's own steps are the same
code in both. Needs no root; the ranks share this machine's cores and loopback, so the numbers
are CPU-bound and say what the global set's collectives cost in a step, not what a network
does. The CSVs (default /tmp/tftorus_elastic_step) are not for the repository.
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile

from studies import emulated_step
from studies.out_dir import own_dir

DEFAULT_OUT = os.path.join(tempfile.gettempdir(), "tftorus_elastic_step")
HOSTS = "localhost:2,127.0.0.1:2"  # two host names, both this machine: a world of 2 x 2
MODES = {  # horovodrun's arguments for each kind of world
    "fixed": ["-np", "4", "-H", HOSTS],
    "elastic": ["-np", "4", "--min-np", "4", "--max-np", "4", "-H", HOSTS],
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--wires", nargs="+", choices=("fp16", "fp32"), default=["fp32"])
    p.add_argument("--variants", nargs="+", choices=emulated_step.VARIANTS,
                   default=["hvd", "default", "torus"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per launch")
    args = p.parse_args(argv)
    args.fusion_mb = None  # tftorus' own bucket size
    if args.repeats < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--repeats and --steps must be >= 1, --warmup >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    own_dir(args.out)
    runner = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": emulated_step.cluster.REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    tables, failed = [], []
    for mode, world in MODES.items():
        for wire in args.wires:
            csv_path = os.path.join(args.out, "steps.csv")
            if os.path.exists(csv_path):
                os.remove(csv_path)
            print(f"{mode} world of 2 x 2, {wire} wire", flush=True)
            cmd = [runner, "--gloo", *world,
                   *emulated_step.worker_argv(args, wire, ("2", "2", mode))]
            log = os.path.join(args.out, f"ranks_{mode}_{wire}.log")
            with open(log, "w") as f:
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    cwd=emulated_step.cluster.REPO, timeout=args.timeout).returncode
            if rc or not os.path.exists(csv_path):
                failed.append(f"{mode} {wire} (exit {rc}; see {log})")
                continue
            with open(csv_path, newline="") as f:
                rows = list(csv.DictReader(f))
            os.replace(csv_path, os.path.join(args.out, f"steps_{mode}_{wire}.csv"))
            tables.append(f"\n== {mode} world, 2 hosts x 2 ranks (one machine), {wire} wire ==\n"
                          + emulated_step.step_table(rows))
    print("\n".join(tables))
    for f in failed:
        print(f"failed: {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
