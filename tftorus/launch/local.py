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

There is no multi-host mode: on a cluster the scheduler starts the processes (srun, mpirun, a
Kubernetes TFJob's TF_CONFIG; see docs/guide/launching.md). Standard library only, so it runs
without TensorFlow: `python path/to/tftorus/run.py ...` works too.
"""
import argparse
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from tftorus.launch import job_secret, private_network
from tftorus.launch.rank_layout import HOROVOD_VARIABLES, horovod_variables

NAME = "tftorus.run"
DEFAULT_GRACE_SECONDS = 10.0

_WITH_VALUE = ("-np", "--np", "-n", "--nproc", "--port", "--grace")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {NAME}",
        usage=f"python -m {NAME} -np N [--port BASE] [--grace SECONDS] [--share-network] "
              f"(script.py | -m module) [args ...]\n       python -m {NAME} --make-secret",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Start N processes of a tftorus tf-engine job on this machine, like torchrun's\n"
            "standalone mode. Each runs this Python on the script (or -m module) with the\n"
            "arguments after it, and a TF_CONFIG naming every rank at 127.0.0.1:<port>\n"
            "(rank = task index), which tftorus.init(engine='tf') reads, and the HOROVOD_*\n"
            "variables horovodrun gives (HOROVOD_RANK, _SIZE, _LOCAL_RANK, ...; one set in\n"
            "the launcher's environment is kept for every rank). Output lines are\n"
            "prefixed with '[rank] ' (stdout to stdout, stderr to stderr). When a rank exits\n"
            "non-zero the others get SIGTERM, then SIGKILL after --grace seconds, and the\n"
            "launcher exits with that rank's status (128+N for signal N). Ctrl-C or SIGTERM to\n"
            "the launcher goes to every rank the same way. Every rank gets the job's secret in\n"
            "TFTORUS_JOB_SECRET (a new one unless it or TFTORUS_JOB_SECRET_FILE is set), which\n"
            "seals tftorus' control traffic; --make-secret prints one for a scheduler's job.\n"
            "On Linux the ranks run in a network of their own (loopback only), so nothing\n"
            "outside reaches TensorFlow's servers; --share-network keeps this machine's."),
        epilog=(
            "One machine only. On a cluster the scheduler starts the processes and tftorus\n"
            "finds them itself: srun (Slurm), mpirun (Open MPI; TFTORUS_RENDEZVOUS across\n"
            "hosts), or a TF_CONFIG per process (Kubernetes TFJob).\n"
            "See docs/guide/launching.md.\n\n"
            "example:  python -m tftorus.run -np 4 train.py --epochs 2"))
    p.add_argument("-np", "--np", "-n", "--nproc", dest="np", type=int, required=True,
                   metavar="N", help="number of processes (ranks) to start")
    p.add_argument("--port", type=int, default=None, metavar="BASE",
                   help="rank r is named at 127.0.0.1:BASE+r (TensorFlow's server binds every "
                        "interface at that port; default: free ports chosen by the "
                        "OS)")
    p.add_argument("--share-network", action="store_true",
                   help="run the ranks in this machine's network (default: a private one, "
                        "loopback only, where Linux allows it: TensorFlow's servers listen on "
                        "every interface, and nothing outside should reach them)")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE_SECONDS, metavar="SECONDS",
                   help=f"after SIGTERM, seconds before SIGKILL (default "
                        f"{DEFAULT_GRACE_SECONDS:g})")
    return p


def parse(argv: Sequence[str]) -> Tuple[argparse.Namespace, List[str]]:
    """(launcher options, the command after `python`: [script, args...] or ['-m', module, ...]).
    Launcher options come first; the first other word (or `-m`, or what follows `--`) starts
    the program, so the program's own options are never taken for the launcher's."""
    argv = list(argv)
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            head, program = argv[:i], argv[i + 1:]
            break
        if word == "-m" or not word.startswith("-") or word == "-":
            head, program = argv[:i], argv[i:]
            break
        i += 2 if word in _WITH_VALUE else 1
    else:
        head, program = argv, []
    parser = _parser()
    opts = parser.parse_args(head)
    if not program or program == ["-m"]:
        parser.error("name the script to run (or -m module)")
    if opts.np < 1:
        parser.error(f"-np must be at least 1, got {opts.np}")
    if opts.grace < 0:
        parser.error(f"--grace must be >= 0 seconds, got {opts.grace}")
    if opts.port is not None and not 0 < opts.port <= 65536 - opts.np:
        parser.error(f"--port {opts.port}: ports {opts.port}..{opts.port + opts.np - 1} are not "
                     f"all in 1..65535")
    if program[0] != "-m" and not os.path.exists(program[0]):
        parser.error(f"no such script: {program[0]}")
    return opts, program


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
        self.selector = selectors.DefaultSelector()
        self.pending = {}  # fd -> (rank, stream, partial line)
        self.failed: Optional[Tuple[int, int]] = None  # (rank, returncode) of the first failure
        self.signalled: Optional[int] = None
        self.stop_deadline: Optional[float] = None

    def start(self, program: Sequence[str], ports: Sequence[int]) -> None:
        """One process per port, rank = its index, with horovodrun's HOROVOD_* variables (one
        host, "localhost" as horovodrun names it by default) where the user has not set them."""
        base_env = dict(os.environ)
        base_env.setdefault("PYTHONUNBUFFERED", "1")  # lines as they are printed
        kept = [name for name in HOROVOD_VARIABLES if name in base_env]
        if kept:
            self.say(f"{', '.join(kept)} set in the environment: every rank gets that value "
                     f"(unset it to have each rank's own)")
        if not (base_env.get(job_secret.ENV) or base_env.get(job_secret.ENV_FILE)):
            base_env[job_secret.ENV] = job_secret.make()  # this job's alone
        hosts = ["localhost"] * len(ports)
        for rank, config in enumerate(tf_configs(ports)):
            env = {**horovod_variables(hosts, rank), **base_env, "TF_CONFIG": config}
            proc = subprocess.Popen([sys.executable, *program], env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, preexec_fn=_die_with_parent)
            self.procs.append(proc)
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

    def wait(self) -> int:
        """Run until every rank ended and all their output is written; the launcher's status."""
        ended_at = None
        while self.pending or any(p.poll() is None for p in self.procs):
            self._pump(0.1)
            if all(p.poll() is not None for p in self.procs):
                # every rank ended; a process it left behind may hold its output open
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > 2.0:
                    for fd, (rank, stream, partial) in list(self.pending.items()):
                        if partial:
                            self._emit(rank, stream, [partial])
                    break
            if self.failed is None and self.signalled is None:
                for rank, proc in enumerate(self.procs):
                    if proc.poll() not in (None, 0):
                        self.failed = (rank, proc.returncode)
                        running = sum(p.poll() is None for p in self.procs)
                        self.say(f"rank {rank} {_describe(proc.returncode)}; stopping the other "
                                 f"{running} running rank(s)")
                        self.stop()
                        break
            if self.stop_deadline is not None and time.monotonic() > self.stop_deadline:
                if any(p.poll() is None for p in self.procs):
                    self.say(f"SIGKILL to the rank(s) still running after {self.grace:g}s")
                    self._signal_all(signal.SIGKILL)
                self.stop_deadline = float("inf")
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--make-secret"]:  # for schedulers: export TFTORUS_JOB_SECRET=$(... --make-secret)
        print(job_secret.make())
        return 0
    opts, program = parse(argv)
    job = Job(opts.grace)
    if opts.np > 1 and not opts.share_network:
        why = private_network.enter()
        if why:
            job.say(f"the ranks share this machine's network ({why}): TensorFlow's servers "
                    f"listen on every interface, reachable from other hosts unless a firewall "
                    f"stops them (docs/guide/security.md)")
    ports = (list(range(opts.port, opts.port + opts.np)) if opts.port is not None
             else free_ports(opts.np))
    old = {s: signal.signal(s, job.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        job.start(program, ports)
        if job.signalled is not None:  # a signal while starting: stop the ranks started since
            job.stop(job.signalled)
        return job.wait()
    finally:
        job._signal_all(signal.SIGKILL)  # an error in the launcher itself: leave no rank behind
        for s, h in old.items():
            signal.signal(s, h)
