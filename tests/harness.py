"""Launch real multi-process jobs for the tests: `horovodrun --gloo` on localhost, N plain
processes with TF_CONFIG (the tf engine's own cluster), or one process.

Every launch has a hard timeout and kills its whole process group, so a collective that hangs
fails the test instead of stalling CI.
"""
import atexit
import concurrent.futures
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, NamedTuple, Sequence, Tuple

from tftorus.launch.local import \
    free_ports  # noqa: F401  (the launcher's; tests call harness.free_ports)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(ROOT, "tests", "workers")
TRAIN = os.path.join(ROOT, "run_scripts", "train.py")
FLAGFILE = os.path.join(ROOT, "run_scripts", "embedded.flags")
# the classic stack launches worlds with horovodrun; the current one has no Horovod (as
# tests/conftest.py's CURRENT: no TensorFlow import here)
HOROVOD = importlib.util.find_spec("horovod") is not None


_DRAWN = {}  # EmbeddedSpec -> its set, drawn once in this test process


def embedded_data_copy(spec, data_dir: str) -> None:
    """`spec`'s embedded set in `data_dir`, a copy of the one this test process drew first:
    drawing 1,024 + 128 images took 6.5 s on 2 cores (2026-12-02, the main job at 305 images/s),
    copying them (1.8 MB) milliseconds, and up to six classes in one test process share that spec. A
    copy, so a class may change its own (remove the manifest, corrupt a file)."""
    from official_resnet.data import embedded_data
    if spec not in _DRAWN:
        root = tempfile.mkdtemp(prefix="tftorus-drawn-")
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        embedded_data.generate(os.path.join(root, "data"), spec, processes=1)
        _DRAWN[spec] = os.path.join(root, "data")
    shutil.copytree(_DRAWN[spec], data_dir)


class EmbeddedDataCase:
    """Test-case mixin: `cls.tmp`, a temporary directory for the class, with a small embedded
    data set in `cls.data`, the class' own copy (the class sets SPEC, an EmbeddedSpec)."""

    SPEC = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix=f"tftorus-{cls.__name__}-")
        cls.data = os.path.join(cls.tmp, "data")
        embedded_data_copy(cls.SPEC, cls.data)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()


class Result(NamedTuple):
    returncode: int
    output: str
    seconds: float
    timed_out: bool
    returncodes: Tuple[int, ...] = ()  # per process, for run_tf_config


def _env():
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    return env


def horovodrun_command(np: int, argv: Sequence[str]):
    runner = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return [runner, "--gloo", "-np", str(np), "-H", f"localhost:{np}", sys.executable, *argv]


def run_many(argvs: Sequence[Sequence[str]], timeout: float = 300.0, envs=None,
             parallel: int = 2, np=0):
    """One launch per argv (a plain process, or `np` ranks under run_world's launcher; np: one
    count for all or one per argv), `parallel` at a time; their Results in argv order. A single
    process spends most of its life importing and tracing on one thread, so two of them fill
    the two cores that one leaves half idle; jobs that fail at their start mostly wait. envs:
    one dict (or None) per argv."""
    envs = list(envs) if envs is not None else [None] * len(argvs)
    counts = list(np) if isinstance(np, (list, tuple)) else [np] * len(argvs)

    def launch(argv, env, count):
        if count:  # the stack's launcher: horovodrun, or python -m tftorus.run
            return run_world(argv, count, timeout=timeout, env=env)
        return run(argv, timeout=timeout, env=env)
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(launch, argvs, envs, counts))


def refuse_in_quick_tier() -> None:
    """The quick tier (run_scripts/test.sh --quick) starts no process: a test that does must be
    listed in tests/conftest.py's LAUNCHES, which keeps it out of that tier."""
    if os.environ.get("TFTORUS_TEST_TIER") == "quick":
        raise RuntimeError("this test starts a process, which the quick tier does not: add it "
                           "(or its class) to LAUNCHES in tests/conftest.py")


def run(argv: Sequence[str], np: int = 0, timeout: float = 300.0, env=None) -> Result:
    """Run `python argv...` under horovodrun with `np` ranks (np=0: one plain process). env:
    variables to set; None as a value removes the variable."""
    refuse_in_quick_tier()
    cmd = horovodrun_command(np, argv) if np else [sys.executable, *argv]
    start = time.monotonic()
    environ = {k: v for k, v in {**_env(), **(env or {})}.items() if v is not None}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env=environ, start_new_session=True)
    return finish(proc, timeout, start)


def finish(proc: subprocess.Popen, timeout: float, start: float) -> Result:
    """Wait for a process started in its own session (its output piped, as text); past
    `timeout` seconds kill its whole group. Its Result, timed from `start`."""
    try:
        out, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        timed_out = True
    return Result(proc.returncode, out, time.monotonic() - start, timed_out)


def run_world(argv: Sequence[str], np: int, timeout: float = 300.0, env=None) -> Result:
    """`python argv...` as `np` workers with the stack's launcher: horovodrun on the classic
    stack, tftorus' local launcher (`python -m tftorus.run -np N`, one TF_CONFIG per rank, lines
    prefixed '[rank]') on the current one, which has no Horovod."""
    if HOROVOD:
        return run(argv, np=np, timeout=timeout, env=env)
    return run(["-m", "tftorus.run", "-np", str(np), *argv], timeout=timeout, env=env)


_SHARED = {}


def shared(key, launch):
    """`launch()`'s result, made once per test session for `key`: the checks that need the same
    world and engine read one launch (each asserting its own part of it) instead of each
    starting processes that import TensorFlow again."""
    if key not in _SHARED:
        _SHARED[key] = launch()
    return _SHARED[key]


# One horovodrun world of four ranks on the Horovod engine runs these checking workers in turn
# (tests/workers/suite.py), then trains every training-equivalence mode into the suite's
# directory (tests/test_training_equivalence.py reads it); one intra-op thread per rank, which
# the overlap check needs (tests/workers/overlap.py says why).
FOUR_RANK_SUITE = ("allreduce_check", "global_set_check", "gradient_semantics", "overlap")  # they report "N checks"
FOUR_RANK_ENV = {"TF_NUM_INTRAOP_THREADS": "1"}
EQUIVALENCE_MODES = "fit,fit_legacy,tape,accumulate,mixed"


def four_rank_suite() -> Tuple[str, Result]:
    """(the directory train_equivalence wrote to, the launch's result)."""
    return _suite(4, "horovod",
                  [*FOUR_RANK_SUITE, f"train_equivalence:{EQUIVALENCE_MODES}:{{out}}"])


# Two ranks on the Horovod engine: the all-reduce checks, the non-finite step, and the recipe's
# batch-size control in a user's fit (weights to the suite's directory). The current stack (no
# Horovod) runs the recipe's two on the tf engine, its ranks launched by TF_CONFIG.
TWO_RANK_SUITE = (("allreduce_check", "nonfinite_step") if HOROVOD
                  else ("nonfinite_step",))  # they report "N checks, M failed"


def two_rank_suite() -> Tuple[str, Result]:
    """(the directory batch_size_control_fit wrote to, the launch's result)."""
    return _suite(2, "horovod" if HOROVOD else "tf",
                  [*TWO_RANK_SUITE, "batch_size_control_fit:{out}"])


# The same on the tf engine under horovodrun (TF's collectives, Horovod's rendezvous only):
# tf_engine_check first, as its init() registers every grid of four ranks; then the overlap;
# then the training-equivalence mode `tape`.
TF_SUITE = ("tf_engine_check", "overlap")  # they report "N checks, M failed"


def four_rank_tf_suite() -> Tuple[str, Result]:
    """(the directory train_equivalence wrote to, the launch's result)."""
    return _suite(4, "tf", ["tf_engine_check", "overlap:tf", "train_equivalence:tape:{out}"])


def _suite(np: int, engine: str, specs: Sequence[str]) -> Tuple[str, Result]:
    def start():
        out = tempfile.mkdtemp(prefix=f"tftorus-suite-{np}-{engine}-")
        argv = [worker("suite.py"), *(s.format(out=out) for s in specs)]
        env = {**FOUR_RANK_ENV, "TFTORUS_ENGINE": engine}
        if not HOROVOD:  # no horovodrun: one TF_CONFIG per rank
            return out, run_tf_config(argv, np, timeout=900, env=env)
        return out, run(argv, np=np, timeout=900, env=env)
    return shared(("suite", np, engine), start)


def _ranks_without_failure(output: str, name: str):
    lines = re.findall(rf"^(?:\[\d+\]<stdout>:)?\[rank (\d+)\] {re.escape(name)}: .*?"
                       rf"(\d+) checks, (\d+) failed$", output, re.M)
    return {int(rank) for rank, checks, failed in lines if int(failed) == 0 and int(checks)}


def suite_report(result: Result, name: str, np: int, names: Sequence[str]) -> str:
    """'' when worker `name` of a suite reported no failure on each of `np` ranks (and, once
    every worker of the suite did, the job exited 0); else the failure, for the assertion."""
    clean = _ranks_without_failure(result.output, name)
    if clean != set(range(np)):
        return f"{name}: ranks reporting no failure {sorted(clean)} of {np}\n" + describe(result)
    if result.returncode != 0 and all(_ranks_without_failure(result.output, n) == clean
                                      for n in names):
        return (f"every check of the suite passed but the job ended with {result.returncode}\n"
                + describe(result))
    return ""


def run_tf_config(argv: Sequence[str], np: int, timeout: float = 300.0, env=None,
                  after_a_failure: float = None) -> Result:
    """Run `python argv...` as `np` plain local processes, each with a TF_CONFIG naming all of
    them on loopback (rank = task index). returncode: 0 if every process exited 0, else the
    first non-zero one; returncodes has each. Output: each process' lines, in rank order."""
    workers = [f"127.0.0.1:{p}" for p in free_ports(np)]
    return run_ranks(argv, np, lambda i: {**(env or {}), "TF_CONFIG": json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})}, timeout,
        after_a_failure)


def free_port_base(count: int) -> int:
    """A base port with `count` consecutive ports free right now, for launchers whose ranks
    listen on base + local rank (srun, mpirun). Drawn below Linux's ephemeral range (32768+),
    where the ports of outgoing connections, other tests' included, would take base + i."""
    for _ in range(200):
        base = random.randint(10000, 32000 - count)
        socks = []
        try:
            for port in range(base, base + count):
                socks.append(socket.socket())
                socks[-1].bind(("", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports found in 10000..32000")


# How long the other ranks may go on once one has failed: a peer stuck in a rendezvous with
# a dead rank would otherwise hold the test for its whole timeout.
AFTER_A_FAILURE = 30.0


def run_ranks(argv: Sequence[str], np: int, env_of: Callable[[int], dict],
              timeout: float = 300.0, after_a_failure: float = None) -> Result:
    """Run `python argv...` as `np` plain local processes, process i with the variables
    `env_of(i)` (a launcher's: TF_CONFIG, Slurm's, Open MPI's; None removes one). Result as
    run_tf_config's; once a process fails, the rest get `after_a_failure` seconds (default
    AFTER_A_FAILURE)."""
    after_a_failure = AFTER_A_FAILURE if after_a_failure is None else after_a_failure
    refuse_in_quick_tier()
    start = time.monotonic()
    procs, logs = [], []
    try:
        for i in range(np):
            log = tempfile.TemporaryFile(mode="w+")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT, text=True,
                cwd=ROOT, env={k: v for k, v in {**_env(), **env_of(i)}.items() if v is not None},
                start_new_session=True))
        deadline = start + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                deadline = min(deadline, time.monotonic() + after_a_failure)
            time.sleep(0.2)
        timed_out = any(p.poll() is None for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    output = []
    for i, (p, log) in enumerate(zip(procs, logs)):
        log.seek(0)
        output.append(f"----- task {i} (exit {p.returncode}) -----\n{log.read()}")
        log.close()
    codes = tuple(p.returncode for p in procs)
    return Result(next((c for c in codes if c), 0), "\n".join(output),
                  time.monotonic() - start, timed_out, codes)


def worker(name: str) -> str:
    return os.path.join(WORKERS, name)


# Ray Train's own helper actors print tracebacks that end no job (its placement-group cleaner
# asks a dashboard the tests' clusters do not run): the cause is elsewhere
NOISY_TRACEBACKS = ("(PlacementGroupCleaner",)


def describe(result: Result, tail: int = 40, first_error: int = 30) -> str:
    """Exit status, the first traceback of any rank (the cause), and the last lines."""
    lines = [l for l in result.output.splitlines()
             if "oneDNN" not in l and "cpu_feature_guard" not in l and "rebuild TensorFlow" not in l]
    start = next((i for i, l in enumerate(lines) if ("Traceback" in l or "MISMATCH" in l)
                  and not any(n in l for n in NOISY_TRACEBACKS)), None)
    first = [] if start is None else ["first error:"] + lines[start:start + first_error] + ["..."]
    return (f"exit {result.returncode} after {result.seconds:.0f}s"
            f"{' (TIMED OUT)' if result.timed_out else ''}\n" + "\n".join(first)
            + "\nlast lines:\n" + "\n".join(lines[-tail:]))
