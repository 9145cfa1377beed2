"""Driver (current stack): the recipe on the embedded data (run_scripts/train_on_ray.py) on a
local Ray cluster of a head (no CPUs) and two worker nodes of 2 logical CPUs, min 2 / max 4
workers; once the first epoch's checkpoint is written a worker node is killed, and the run must
go on with 2 workers from that checkpoint to the end, training as 4 (--logical_workers=4, the
launcher's default). Prints "RESULT {json}" with the summary.

    python tests/workers/ray_recipe.py [--kill_after=S] [train.py flags that override...]

--kill_after: seconds from the first checkpoint to the kill (default 8, into the main job's
second epoch; 0 on a small data set, whose epochs take seconds).
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "run_scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ray_cluster  # noqa: E402  (tests/workers)
import train_on_ray  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill_after", type=float, default=8.0)
    ours, overrides = parser.parse_known_args()
    os.chdir(REPO)  # the workers run train.py here too: the flags' data/embedded is the main job's
    model_dir = tempfile.mkdtemp(prefix="tftorus_ray_recipe_")
    with ray_cluster.three_nodes(model_dir) as (cluster, nodes):
        args, train_argv = train_on_ray.parse([
            "--min_workers=2", "--max_workers=4", "--",
            "--exp=2", "--engine=tf", "--flagfile=run_scripts/embedded.flags",
            f"--model_dir={model_dir}", *overrides])  # default: data/embedded, made on first use
        errors = []

        def go():
            try:
                train_on_ray.run(args, train_argv, ray_init=False)
            except BaseException as e:  # reported below
                errors.append(repr(e))
        runner = threading.Thread(target=go)
        runner.start()
        first = os.path.join(model_dir, "checkpoints", "epoch-0001.000")
        while runner.is_alive() and not os.path.isdir(first):
            time.sleep(0.5)
        if not runner.is_alive():
            sys.exit(f"the run ended before its first checkpoint: {errors}")
        time.sleep(ours.kill_after)  # into the second epoch (its first steps: less to redo)
        cluster.remove_node(nodes[1])
        print("KILLED a worker node in epoch 2", flush=True)
        runner.join(1800)
        if errors or runner.is_alive():
            sys.exit(f"the run failed: {errors or 'still running after 30 min'}")
        with open(os.path.join(model_dir, "summary.json")) as f:
            summary = json.load(f)
        print("RESULT " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
