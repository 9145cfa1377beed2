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
import argparse
import json
import os
import selectors
import shlex
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

_WITH_VALUE = ("-np", "--np", "-n", "--nproc", "--port", "--grace", "-H", "--hosts",
               "--hostfile", "-x", "--ssh", "--nnodes", "--node-rank", "--rendezvous",
               "--nproc-per-node", "--rendezvous-timeout")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {NAME}",
        usage=(f"python -m {NAME} -np N [options] (script.py | -m module) [args ...]\n"
               f"       python -m {NAME} -np N -H h1:8,h2:8 [-x NAME] [options] script.py ...\n"
               f"       python -m {NAME} --nnodes M --node-rank K --rendezvous HOST:PORT "
               f"--nproc-per-node P script.py ...\n"
               f"       python -m {NAME} --make-secret"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Start the processes (ranks) of a tftorus tf-engine job, like horovodrun or\n"
            "torchrun. Each runs this Python on the script (or -m module) with the arguments\n"
            "after it, a TF_CONFIG naming every rank (rank = task index), which\n"
            "tftorus.init() reads, and the HOROVOD_* variables horovodrun gives\n"
            "(HOROVOD_RANK, _SIZE, _LOCAL_RANK, ...; one set in the launcher's environment is\n"
            "kept for every rank). Output lines are prefixed with '[rank] '. When a rank exits\n"
            "non-zero, or a host is lost, every rank on every host gets SIGTERM, then SIGKILL\n"
            "after --grace seconds, and the launcher exits with that rank's status (128+N for\n"
            "signal N), naming it and its host. Ctrl-C or SIGTERM to the launcher ends every\n"
            "rank the same way. Every rank gets the job's secret in TFTORUS_JOB_SECRET (a new\n"
            "one unless it or TFTORUS_JOB_SECRET_FILE is set), which seals tftorus' control\n"
            "traffic; --make-secret prints one.\n\n"
            "One host (-np N alone): the ranks run in a network of their own (loopback only)\n"
            "on Linux; --share-network keeps this machine's.\n"
            "From one host over ssh (-H or --hostfile, as horovodrun): ranks fill the hosts\n"
            "in order, host by host; ssh must reach each host without a password.\n"
            "The same command on every node (--nnodes, as torchrun): node 0 hosts the\n"
            "rendezvous at --rendezvous; give every node the same TFTORUS_JOB_SECRET."),
        epilog=(
            "A scheduler may start the ranks itself instead: srun (Slurm), mpirun (Open MPI;\n"
            "TFTORUS_RENDEZVOUS across hosts), or a TF_CONFIG per process (Kubernetes).\n"
            "See docs/guide/launching.md.\n\n"
            "examples:\n"
            "  python -m tftorus.run -np 4 train.py --epochs 2\n"
            "  python -m tftorus.run -np 16 -H h1:8,h2:8 train.py\n"
            "  python -m tftorus.run --nnodes 2 --node-rank 0 --rendezvous h1:29400 "
            "--nproc-per-node 8 train.py"))
    p.add_argument("-np", "--np", "-n", "--nproc", dest="np", type=int, default=None,
                   metavar="N", help="number of processes (ranks) to start in all")
    p.add_argument("--port", type=int, default=None, metavar="BASE",
                   help="one host: rank r is named at 127.0.0.1:BASE+r (default: free ports "
                        "chosen by the OS)")
    p.add_argument("--share-network", action="store_true",
                   help="one host: run the ranks in this machine's network (default: a "
                        "private one, loopback only, where Linux allows it: TensorFlow's "
                        "servers listen on every interface, and nothing outside should reach "
                        "them)")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE_SECONDS, metavar="SECONDS",
                   help=f"after SIGTERM, seconds before SIGKILL (default "
                        f"{DEFAULT_GRACE_SECONDS:g})")
    p.add_argument("-H", "--hosts", default=None, metavar="H1:SLOTS,H2:SLOTS",
                   help="start the ranks on these hosts over ssh (a host alone: 1 slot)")
    p.add_argument("--hostfile", default=None, metavar="FILE",
                   help="the hosts, one per line: 'NAME slots=N' or 'NAME:N'")
    p.add_argument("-x", dest="forward", action="append", default=[], metavar="NAME[=VALUE]",
                   help="with -H: forward this environment variable to every host (repeat it; "
                        "variables starting with TFTORUS_, HOROVOD_, TF_, CUDA_, NCCL_, PYTHON, "
                        "OMP_, XLA_ and PATH, LD_LIBRARY_PATH, VIRTUAL_ENV go by default)")
    p.add_argument("--ssh", default="ssh", metavar="COMMAND",
                   help="with -H: the ssh command, e.g. 'ssh -p 2222 -i ~/.ssh/cluster' "
                        "(default: ssh; BatchMode and a 10 s connect timeout are added)")
    p.add_argument("--nnodes", type=int, default=None, metavar="M",
                   help="the same command on every node: the number of nodes")
    p.add_argument("--node-rank", type=int, default=None, metavar="K",
                   help="this node's number, 0..M-1 (node 0 hosts the rendezvous; its ranks "
                        "come first)")
    p.add_argument("--rendezvous", default=None, metavar="HOST:PORT",
                   help="node 0's host and a free port there")
    p.add_argument("--nproc-per-node", type=int, default=None, metavar="P",
                   help="ranks to start on this node")
    p.add_argument("--rendezvous-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long the nodes may take to all register (default 300)")
    p.add_argument("--join", action="store_true", help=argparse.SUPPRESS)  # ssh: no coordinator
    p.add_argument("--secret-stdin", action="store_true", help=argparse.SUPPRESS)
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
    per_node = [opts.nnodes, opts.node_rank, opts.rendezvous, opts.nproc_per_node]
    if any(v is not None for v in per_node):
        if any(v is None for v in per_node):
            parser.error("the per-node form needs all of --nnodes, --node-rank, --rendezvous "
                         "and --nproc-per-node")
        if opts.np is not None or opts.hosts or opts.hostfile:
            parser.error("--nnodes starts this node's ranks only: leave out -np, -H and "
                         "--hostfile (or use -np with -H from one host instead)")
        if opts.nnodes < 1 or not 0 <= opts.node_rank < opts.nnodes:
            parser.error(f"--node-rank must be in 0..{opts.nnodes - 1} (--nnodes "
                         f"{opts.nnodes}), got {opts.node_rank}")
        if opts.nproc_per_node < 1:
            parser.error(f"--nproc-per-node must be at least 1, got {opts.nproc_per_node}")
    elif opts.np is None:
        parser.error("give -np N (the number of ranks), or --nnodes ... for the per-node form")
    elif opts.np < 1:
        parser.error(f"-np must be at least 1, got {opts.np}")
    if opts.hosts and opts.hostfile:
        parser.error("give -H or --hostfile, not both")
    if opts.grace < 0:
        parser.error(f"--grace must be >= 0 seconds, got {opts.grace}")
    if opts.rendezvous_timeout <= 0:
        parser.error(f"--rendezvous-timeout must be > 0 seconds, got {opts.rendezvous_timeout}")
    if opts.port is not None and (opts.np is None or not 0 < opts.port <= 65536 - opts.np):
        parser.error(f"--port {opts.port}: ports {opts.port}..{opts.port + (opts.np or 1) - 1} "
                     f"are not all in 1..65535")
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--make-secret"]:  # for schedulers: export TFTORUS_JOB_SECRET=$(... --make-secret)
        print(job_secret.make())
        return 0
    opts, program = parse(argv)
    if opts.secret_stdin:  # a node started over ssh: the secret never on a command line
        os.environ[job_secret.ENV] = sys.stdin.readline().strip()
    if opts.nnodes is not None or opts.hosts or opts.hostfile:
        return _main_across_hosts(opts, program)
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


def _main_across_hosts(opts: argparse.Namespace, program: List[str]) -> int:
    from tftorus.launch import multi_node, over_ssh  # they import this module
    try:
        if opts.nnodes is not None:
            return multi_node.run_node(opts.node_rank, opts.nnodes, opts.nproc_per_node,
                                       opts.rendezvous, program, opts.grace,
                                       opts.rendezvous_timeout, coordinate=not opts.join)
        hosts = (over_ssh.parse_hostfile(opts.hostfile) if opts.hostfile
                 else over_ssh.parse_hosts(opts.hosts))
        return over_ssh.run(opts.np, hosts, program, opts.grace, opts.rendezvous_timeout,
                            opts.forward, shlex.split(opts.ssh))
    except ValueError as error:  # bad input: one line, nothing started
        print(f"[{NAME}] {error}", file=sys.stderr, flush=True)
        return 2
