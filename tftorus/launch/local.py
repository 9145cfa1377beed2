"""Start a tf-engine job of N processes on this machine: `python -m tftorus.run -np 4 train.py`.

Like torchrun's standalone mode, for one machine: it picks N free ports on loopback, starts N
processes of this Python running the script (or `-m module`) with its arguments, each with a
TF_CONFIG naming all N (rank = task index), so `tftorus.init(engine="tf")` (or
`tftorus.cluster.tf_runtime.bootstrap()`) finds the cluster, and the HOROVOD_* variables horovodrun
gives (HOROVOD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _CROSS_RANK, _CROSS_SIZE, _HOSTNAME) unless
the user set them. Every output line of a rank is prefixed with `[rank] ` (stdout to stdout, stderr
to stderr, each stream in its order). When a rank exits non-zero the launcher ends the others
(SIGTERM, then SIGKILL after the grace period) and exits with that rank's status (128 + N for a
signal N), naming it. Ctrl-C or SIGTERM to the launcher is passed to every rank, with the same
grace period.

The command line is parsed here for every form; across hosts (-H over ssh, or --nnodes on each
node) the job runs through tftorus/launch/over_ssh.py and tftorus/launch/multi_node.py, which
start each node's ranks with this module's `Job`. A scheduler may start the processes itself
instead (srun, mpirun, a Kubernetes TFJob's TF_CONFIG; see docs/guide/launching.md). Standard
library only, so it runs without TensorFlow: `python path/to/tftorus/run.py ...` works too.
"""
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from typing import List, Optional, Sequence, Tuple

from tftorus.launch import job_secret
from tftorus.launch.rank_layout import HOROVOD_VARIABLES, horovod_variables

NAME = "tftorus.run"
DEFAULT_GRACE_SECONDS = 10.0

def free_ports(count: int) -> List[int]:
    """Ports free now on loopback, all distinct (held together while chosen). A rank's TF server
    binds its port a few seconds later; --port avoids that gap where ports are contended."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_configs(ports: Sequence[int]) -> List[str]:
    workers = [f"127.0.0.1:{p}" for p in ports]
    return [json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
            for i in range(len(ports))]


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL when the launcher dies, even by SIGKILL."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


class Job:
    """N child processes, their prefixed output, and their end."""

    def __init__(self, grace: float, out=None, err=None):
        self.grace = grace
        self.out = out or sys.stdout.buffer
        self.err = err or sys.stderr.buffer
        self.procs: List[subprocess.Popen] = []
        self.ranks: List[int] = []  # the job's rank of each process
        self.selector = selectors.DefaultSelector()
        self.pending = {}  # fd -> (rank, stream, partial line)
        self.failed: Optional[Tuple[int, int]] = None  # (rank, returncode) of the first failure
        self.signalled: Optional[int] = None
        self.stop_deadline: Optional[float] = None

    def start(self, program: Sequence[str], ports: Sequence[int]) -> None:
        """One process per port on loopback, rank = its index (one host, "localhost" as
        horovodrun names it by default)."""
        workers = [f"127.0.0.1:{p}" for p in ports]
        self.start_ranks(program, workers, ["localhost"] * len(ports), range(len(ports)))

    def start_ranks(self, program: Sequence[str], workers: Sequence[str], hosts: Sequence[str],
                    ranks: Sequence[int]) -> None:
        """Start `ranks` of the job whose rank r is at workers[r] on hosts[r], each with its
        TF_CONFIG and horovodrun's HOROVOD_* variables where the user has not set them."""
        base_env = dict(os.environ)
        base_env.setdefault("PYTHONUNBUFFERED", "1")  # lines as they are printed
        kept = [name for name in HOROVOD_VARIABLES if name in base_env]
        if kept:
            self.say(f"{', '.join(kept)} set in the environment: every rank gets that value "
                     f"(unset it to have each rank's own)")
        if not (base_env.get(job_secret.ENV) or base_env.get(job_secret.ENV_FILE)):
            base_env[job_secret.ENV] = job_secret.make()  # this job's alone
        for rank in ranks:
            config = json.dumps({"cluster": {"worker": list(workers)},
                                 "task": {"type": "worker", "index": rank}})
            env = {**horovod_variables(hosts, rank), **base_env, "TF_CONFIG": config}
            proc = subprocess.Popen([sys.executable, *program], env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, preexec_fn=_die_with_parent)
            self.procs.append(proc)
            self.ranks.append(rank)
            for pipe, stream in ((proc.stdout, self.out), (proc.stderr, self.err)):
                os.set_blocking(pipe.fileno(), False)
                self.selector.register(pipe, selectors.EVENT_READ)
                self.pending[pipe.fileno()] = (rank, stream, b"")

    def say(self, message: str) -> None:
        self.err.write(f"[{NAME}] {message}\n".encode())
        self.err.flush()

    def _emit(self, rank: int, stream, lines: Sequence[bytes]) -> None:
        prefix = f"[{rank}] ".encode()
        stream.write(b"".join(prefix + line + b"\n" for line in lines))
        stream.flush()

    def _pump(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            pipe = key.fileobj
            rank, stream, partial = self.pending[pipe.fileno()]
            try:
                data = os.read(pipe.fileno(), 65536)
            except BlockingIOError:
                continue
            if not data:  # the rank closed it (exited): its last line may lack a newline
                if partial:
                    self._emit(rank, stream, [partial])
                self.selector.unregister(pipe)
                del self.pending[pipe.fileno()]
                pipe.close()
                continue
            *lines, partial = (partial + data).split(b"\n")
            if lines:
                self._emit(rank, stream, lines)
            self.pending[pipe.fileno()] = (rank, stream, partial)

    def _signal_all(self, sig: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)  # the rank and anything it started
                except ProcessLookupError:
                    pass

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Send `sig` to every running rank; SIGKILL those still running after the grace."""
        if self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + self.grace
        self._signal_all(sig)

    def on_signal(self, sig, _frame) -> None:
        if self.signalled is None:
            self.signalled = sig
            self.say(f"got {signal.Signals(sig).name}; stopping every rank")
            self.stop(sig)
        else:  # a second Ctrl-C: no more grace
            self._signal_all(signal.SIGKILL)

    def first_failure(self) -> Optional[Tuple[int, int]]:
        """(rank, returncode) of a rank that exited non-zero, or None."""
        for rank, proc in zip(self.ranks, self.procs):
            if proc.poll() not in (None, 0):
                return rank, proc.returncode
        return None

    def kill_after_grace(self) -> None:
        if self.stop_deadline is not None and time.monotonic() > self.stop_deadline:
            if any(p.poll() is None for p in self.procs):
                self.say(f"SIGKILL to the rank(s) still running after {self.grace:g}s")
                self._signal_all(signal.SIGKILL)
            self.stop_deadline = float("inf")

    def output_done(self, ended_at: Optional[float]) -> Tuple[bool, Optional[float]]:
        """(whether all output is written, when every rank had ended). Once every rank ended
        the output gets 2 s more (a process a rank left behind may hold it open); then what
        is left of a line is written and the rest given up."""
        if not self.pending:
            return all(p.poll() is not None for p in self.procs), ended_at
        if not all(p.poll() is not None for p in self.procs):
            return False, None
        ended_at = ended_at or time.monotonic()
        if time.monotonic() - ended_at <= 2.0:
            return False, ended_at
        for rank, stream, partial in self.pending.values():
            if partial:
                self._emit(rank, stream, [partial])
        return True, ended_at

    def wait(self) -> int:
        """Run until every rank ended and all their output is written; the launcher's status."""
        ended_at = None
        while True:
            self._pump(0.1)
            done, ended_at = self.output_done(ended_at)
            if done:
                break
            if self.failed is None and self.signalled is None:
                failed = self.first_failure()
                if failed is not None:
                    self.failed = failed
                    running = sum(p.poll() is None for p in self.procs)
                    self.say(f"rank {failed[0]} {_describe(failed[1])}; stopping the other "
                             f"{running} running rank(s)")
                    self.stop()
            self.kill_after_grace()
            if not self.pending:  # output closed (e.g. a rank closed it): just wait
                time.sleep(0.05)
        for proc in self.procs:
            proc.wait()
        if self.failed is not None:
            rank, code = self.failed
            self.say(f"failed: rank {rank} {_describe(code)} first")
            return _status(code)
        if self.signalled is not None:
            return 128 + self.signalled
        return 0
