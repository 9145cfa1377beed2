"""Launch real multi-process jobs for the tests: `horovodrun --gloo` on localhost, or one process.

Every launch has a hard timeout and kills its whole process group, so a collective that hangs
fails the test instead of stalling CI.
"""
import os
import signal
import subprocess
import sys
import time
from typing import NamedTuple, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(ROOT, "tests", "workers")


class Result(NamedTuple):
    returncode: int
    output: str
    seconds: float
    timed_out: bool


def _env():
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    return env


def horovodrun_command(np: int, argv: Sequence[str]):
    runner = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return [runner, "--gloo", "-np", str(np), "-H", f"localhost:{np}", sys.executable, *argv]


def run(argv: Sequence[str], np: int = 0, timeout: float = 300.0, env=None) -> Result:
    """Run `python argv...` under horovodrun with `np` ranks (np=0: one plain process)."""
    cmd = horovodrun_command(np, argv) if np else [sys.executable, *argv]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env={**_env(), **(env or {})}, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        timed_out = True
    return Result(proc.returncode, out, time.monotonic() - start, timed_out)


def worker(name: str) -> str:
    return os.path.join(WORKERS, name)


def describe(result: Result, tail: int = 40, first_error: int = 30) -> str:
    """Exit status, the first traceback of any rank (the cause), and the last lines."""
    lines = [l for l in result.output.splitlines()
             if "oneDNN" not in l and "cpu_feature_guard" not in l and "rebuild TensorFlow" not in l]
    start = next((i for i, l in enumerate(lines) if "Traceback" in l or "MISMATCH" in l), None)
    first = [] if start is None else ["first error:"] + lines[start:start + first_error] + ["..."]
    return (f"exit {result.returncode} after {result.seconds:.0f}s"
            f"{' (TIMED OUT)' if result.timed_out else ''}\n" + "\n".join(first)
            + "\nlast lines:\n" + "\n".join(lines[-tail:]))
