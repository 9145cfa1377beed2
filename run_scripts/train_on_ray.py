"""The recipe (run_scripts/train.py) on a Ray cluster, elastic between its checkpoints.

    python run_scripts/train_on_ray.py --address=auto --min_workers=2 --max_workers=8 \
        [--cpus_per_worker=8 --use_gpu] -- --exp=2 --data_dir=/imagenet --model_dir=/shared/run1

Everything after `--` is train.py's; the workers run it in this directory (the same path on
every node, as the checkout must be), so relative paths mean what they mean here. Each world of workers (tftorus.ray.RayExecutor with
min_workers/max_workers) runs train.py with --resume=auto: when a worker or node is lost, the
world restarts as the workers the alive nodes hold and continues from the newest checkpoint in
--model_dir; so --model_dir must be a directory every node sees (a shared file system), and a
lost world redoes at most the epoch since that checkpoint. Every world trains as one of
max_workers workers (train.py's --logical_workers, default --max_workers): a smaller one reads
their data and accumulates their micro-batches, so worlds take the sizes that divide it, and a
run that lost workers ends where the full world would have. Leave --grid out: each world plans
the grid for its size. Needs Ray
(`pip install 'tftorus[ray]'`; the current stack's set-up installs it).
"""
import argparse
import os
import runpy
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "run_scripts", "train.py")


def one_world(train_argv, cwd):
    """train.py in this Ray worker, as if launched from the driver's directory (so relative
    paths, like the embedded flags' data/embedded, mean what they mean there): its exit status 0
    is success."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
    sys.argv = [TRAIN, *train_argv]
    try:
        runpy.run_path(TRAIN, run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise RuntimeError(f"train.py exited with status {e.code} (its error is above)")
    return "done"


def logical_workers(train_argv) -> int:
    return int(next(a.split("=", 1)[1] for a in train_argv
                    if a.startswith("--logical_workers=")))


def divisors(n: int):
    return [d for d in range(1, n + 1) if n % d == 0]


def parse(argv):
    ours, theirs = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="train.py's flags follow a lone --")
    p.add_argument("--address", default=None,
                   help="the Ray cluster (auto: the one this node is part of; default: start "
                        "Ray on this machine alone)")
    p.add_argument("--min_workers", type=int, required=True)
    p.add_argument("--max_workers", type=int, required=True)
    p.add_argument("--cpus_per_worker", type=float, default=1)
    p.add_argument("--use_gpu", action="store_true", help="a GPU per worker, from Ray")
    p.add_argument("--elastic_timeout", type=float, default=600,
                   help="seconds to wait for min_workers' resources before giving up")
    p.add_argument("--reset_limit", type=int, default=None)
    args = p.parse_args(ours)
    if any(a == "--resume" or a.startswith("--resume=") and a != "--resume=auto"
           for a in theirs):
        p.error("train.py's --resume is auto here (each world continues from the newest "
                "checkpoint): leave it out")
    if any(a == "--grid" or a.startswith("--grid=") for a in theirs):
        p.error("leave --grid out: each world plans the grid for its own size")
    if "--logical_workers" in theirs:  # the "--flag value" form, as one "--flag=value"
        i = theirs.index("--logical_workers")
        theirs[i:i + 2] = [f"--logical_workers={theirs[i + 1]}"]
    if not any(a.startswith("--logical_workers") for a in theirs):
        theirs = [*theirs, f"--logical_workers={args.max_workers}"]
    if not any(a.startswith("--model_dir") for a in theirs):
        p.error("give train.py a --model_dir that every node sees (after --): the worlds "
                "continue from its checkpoints")
    return args, theirs


def run(args, train_argv, ray_init=True) -> None:
    sys.path.insert(0, REPO)
    from tftorus.ray import RayExecutor
    import ray
    if ray_init and not ray.is_initialized():
        ray.init(address=args.address,
                 runtime_env={"env_vars": {"PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}})
    executor = RayExecutor(RayExecutor.create_settings(), min_workers=args.min_workers,
                           max_workers=args.max_workers, cpus_per_worker=args.cpus_per_worker,
                           use_gpu=args.use_gpu, reset_limit=args.reset_limit,
                           elastic_timeout=args.elastic_timeout,
                           world_sizes=divisors(logical_workers(train_argv)))
    # one_world goes to the workers by value: run_scripts/ is no package they could import
    ray.cloudpickle.register_pickle_by_value(sys.modules[one_world.__module__])
    executor.start(extra_env_vars={"TF_CPP_MIN_LOG_LEVEL": "2"})
    start = time.time()
    try:
        executor.run(one_world, args=[[*train_argv, "--resume=auto"], os.getcwd()])
    finally:
        executor.shutdown()
    print(f"train_on_ray: done in {time.time() - start:.0f} s on worlds of "
          f"{executor.world_sizes} workers", flush=True)


if __name__ == "__main__":
    run(*parse(sys.argv[1:]))
