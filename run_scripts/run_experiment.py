"""Run an experiment whose phases use different numbers of workers, as Table 3 does.

    python run_scripts/run_experiment.py --exp=2 --gpus_per_phase=paper --data_dir=/imagenet \
        -- -H node001:4,node002:4,... [more horovodrun options]

Flags before `--` are run_scripts/train.py's; what follows `--` goes to the launcher (not -np).
Each run of consecutive phases on the same number of workers is one launch of
run_scripts/train.py on W workers: train.py stops at the boundary after them with a
phase-boundary checkpoint, and the next launch resumes from it on its own count (Exp. 2 with
--gpus_per_phase=paper: 3456 workers at 16 images each for epochs 1-30, then 1728 at 32). Run
the same command again after a failure: it starts at the phase the run stands in.

The launcher is the stack's: `horovodrun -np W ...` where Horovod is installed (the classic
stack; options after `--` are horovodrun's: hosts, --gloo or --mpi, ...), else tftorus' local
launcher `python -m tftorus.run -np W ...` (the current stack; options after `--` are its
--port and --grace, and across hosts -H/--hostfile, -x and --ssh: each phase's ranks fill the
hosts in order over ssh; docs/guide/launching.md).
"""
import os
import shutil
import subprocess
import sys
from typing import List, Tuple

from absl import flags as absl_flags  # noqa: E402

# A script of the checkout: its flags/ package (the absl flags) is not installed with tftorus
# (pyproject.toml installs tftorus and official_resnet alone), so the checkout goes on the path.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)
from flags.config import define_flags, resolve_run  # noqa: E402

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")


def split_argv(argv: List[str]) -> Tuple[List[str], List[str]]:
    """(train.py flags, horovodrun options) around the first `--`."""
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return list(argv), []


def launches(workers) -> List[Tuple[int, int, int]]:
    """(workers, first phase, last phase) for each run of consecutive phases on one count."""
    groups = []
    for i, w in enumerate(workers):
        if groups and groups[-1][0] == w:
            groups[-1] = (w, groups[-1][1], i)
        else:
            groups.append((w, i, i))
    return groups


def hosts_for(hvd_args: List[str], count: int) -> List[str]:
    """The horovodrun options with the host list cut to exactly `count` slots, in order.

    Horovod 0.28.1 under Gloo starts a process on every slot of -H (or --hostfile) whatever -np
    says, so a phase on fewer workers than the list holds needs a shorter list."""
    out, hosts, i = [], None, 0
    while i < len(hvd_args):
        arg = hvd_args[i]
        name, _, value = arg.partition("=")
        if name in ("-H", "--hosts", "-hostfile", "--hostfile"):
            if not value:
                i += 1
                value = hvd_args[i] if i < len(hvd_args) else ""
            if name in ("-H", "--hosts"):
                hosts = [h for h in value.split(",") if h]
            else:  # lines 'host slots=N'
                with open(value) as f:
                    hosts = [" ".join(line.split()).replace(" slots=", ":") for line in f
                             if line.strip() and not line.lstrip().startswith("#")]
        else:
            out.append(arg)
        i += 1
    slots, left = [], count
    for host in hosts or [f"localhost:{count}"]:
        name, _, n = host.partition(":")
        take = min(left, int(n or 1))
        if take:
            slots.append(f"{name}:{take}")
        left -= take
    if left > 0:
        raise ValueError(f"the hosts given have {count - left} slots; this phase needs {count} "
                         f"workers: give more hosts or slots (-H host:slots,...)")
    return ["-H", ",".join(slots), *out]


# `python -m tftorus.run`'s options that may follow `--` without Horovod (each takes a value):
# a host list starts each phase's ranks over ssh, filling the hosts in order
LOCAL_OPTIONS = {"--port": int, "--grace": float, "-H": str, "--hosts": str, "--hostfile": str,
                 "-x": str, "--ssh": str}


def local_options(options: List[str]) -> List[str]:
    """The options after `--` as `python -m tftorus.run` takes them, on a stack without
    Horovod: --port BASE, --grace SECONDS, and across hosts -H/--hosts, --hostfile, -x and
    --ssh. Any other (horovodrun's) option raises ValueError saying what to do instead."""
    out, i = [], 0
    while i < len(options):
        name, eq, value = options[i].partition("=")
        if name not in LOCAL_OPTIONS:
            raise ValueError(
                f"{options[i]}: this stack has no Horovod, so options after `--` go to "
                f"`python -m tftorus.run`, which takes {', '.join(LOCAL_OPTIONS)} "
                f"(docs/guide/launching.md)")
        if not eq:
            i += 1
            value = options[i] if i < len(options) else ""
        try:
            LOCAL_OPTIONS[name](value)
        except ValueError:
            raise ValueError(f"{name} needs a number, got {value!r}") from None
        if not value:
            raise ValueError(f"{name} needs a value")
        out += [name, value]
        i += 1
    return out


def launcher(count: int, options: List[str], horovod: bool) -> List[str]:
    """The command that starts `count` workers, up to the script: horovodrun with the hosts cut
    to `count` slots, or (no Horovod) the local launcher; `options`: those after `--`."""
    if horovod:
        return [horovodrun(), "-np", str(count), *hosts_for(options, count), sys.executable]
    return [sys.executable, "-m", "tftorus.run", "-np", str(count), *local_options(options)]


def horovodrun() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    found = beside if os.path.exists(beside) else shutil.which("horovodrun")
    if not found:
        sys.exit("error: horovodrun not found: install Horovod (bash run_scripts/setup.sh)")
    return found


def main(argv: List[str]) -> int:
    train_args, launcher_args = split_argv(argv[1:])
    if any(a in ("-np", "--num-proc") or a.startswith(("-np=", "--num-proc="))
           for a in launcher_args):
        print("error: run_experiment.py sets -np per phase; leave it out of the options after "
              "`--`", file=sys.stderr)
        return 2
    from tftorus.runtime import stack  # here: it imports TensorFlow
    define_flags()
    absl_flags.FLAGS([argv[0], *train_args])
    try:
        spec = resolve_run(absl_flags.FLAGS)
        config, experiment = spec.config, spec.experiment
        if spec.fixed and not absl_flags.FLAGS.num_workers:
            direct = "horovodrun -np W" if stack.HOROVOD else "python -m tftorus.run -np W"
            raise ValueError("every phase on one world size (--gpus_per_phase=fixed) needs no "
                             f"launcher: use {direct} directly, or give --num_workers=W; "
                             "for Table 3's counts, pass --gpus_per_phase=paper")
        workers = spec.workers(absl_flags.FLAGS.num_workers)
        from official_resnet.run import checkpointing  # here: it starts TensorFlow
        found = checkpointing.find_resume(config.resume, config.model_dir)
        start = checkpointing.phase_to_run(found[1] if found else None)  # where the run stands
        groups = launches(workers)
        # every launch's command now: a wrong option fails before the first launch
        launchers = {count: launcher(count, launcher_args, stack.HOROVOD)
                     for count, _, _ in groups}
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from tftorus.launch import job_secret
    env = dict(os.environ)
    if not (env.get(job_secret.ENV) or env.get(job_secret.ENV_FILE)):
        env[job_secret.ENV] = job_secret.make()  # horovodrun hands its environment to the ranks
    launched = False
    for count, first, last in groups:
        if last < start:
            continue  # done in an earlier launch
        phases = f"phase {first + 1}" if first == last else f"phases {first + 1}-{last + 1}"
        # later launches continue from the boundary checkpoint whatever --resume said
        args = train_args + (["--resume=auto"] if launched else [])
        launched = True
        cmd = [*launchers[count], TRAIN, *args]
        print(f"[run_experiment] {experiment.name}, {phases} on {count} workers:\n  "
              + " ".join(cmd), flush=True)
        status = subprocess.call(cmd, env=env)
        if status:
            print(f"[run_experiment] {phases} failed (exit {status}); run the same command "
                  f"again to continue from the newest checkpoint", file=sys.stderr, flush=True)
            return status
    print(f"[run_experiment] {experiment.name}: every phase done; results in "
          f"{config.model_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
