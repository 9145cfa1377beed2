"""One job across hosts started from one of them over ssh, as horovodrun does:

    python -m tftorus.run -np 16 -H h1:8,h2:8 train.py
    python -m tftorus.run -np 16 --hostfile hosts.txt train.py    # lines "h1 slots=8" or "h1:8"

This launcher hosts the coordinator (tftorus/launch/multi_node.py) and starts one node launcher
per host: over ssh (BatchMode: the user's keys or agent, never a password prompt), or directly
on this host when it is named (localhost, or its own name). Ranks fill the hosts in the order
given, so rank r is on the host whose slots hold it. Each node launcher gets the job's secret on
its standard input (never on a command line), runs in the same directory with the same Python,
and gets the environment forwarded as horovodrun's -x does: the variables named by -x NAME (or
-x NAME=VALUE), and by default those whose names start with one of FORWARDED_PREFIXES. Output
comes back prefixed by rank. A host that ssh cannot reach (unknown, down, refusing the key) stops
the job in one line naming it; so does any rank's failure, a lost host or Ctrl-C. Standard
library only.
"""
import os
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from tftorus.launch import job_secret, multi_node
from tftorus.launch.local import NAME

#: environment variables forwarded to every host by default (besides -x)
FORWARDED_PREFIXES = ("TFTORUS_", "HOROVOD_", "TF_", "CUDA_", "NCCL_", "PYTHON", "OMP_",
                      "KMP_", "XLA_", "LD_LIBRARY_PATH", "PATH", "VIRTUAL_ENV")
#: never forwarded: each rank gets its own, or (the secret) it goes by standard input
NOT_FORWARDED = ("TF_CONFIG", job_secret.ENV, job_secret.ENV_FILE, "PYTHONHOME")
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
#: a job stopped before any rank started: how long the node launchers that registered get to
#: say so before every launcher is ended
STOPPED_BEFORE_START_SECONDS = 1.0
RUN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run.py")


def parse_hosts(text: str, what: str = "-H") -> List[Tuple[str, int]]:
    """"h1:8,h2:8" (a host alone: 1 slot) -> [("h1", 8), ("h2", 8)]."""
    hosts = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, slots = item.rpartition(":") if ":" in item else (item, "", "1")
        if not name or not slots.isdigit() or int(slots) < 1:
            raise ValueError(f"{what} {text!r}: each host is NAME or NAME:SLOTS with SLOTS >= 1, "
                             f"e.g. -H h1:8,h2:8")
        hosts.append((name, int(slots)))
    if not hosts:
        raise ValueError(f"{what} {text!r} names no host; e.g. -H h1:8,h2:8")
    names = [n for n, _ in hosts]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{what} names {', '.join(repeated)} more than once; give each host "
                         f"once with all its slots")
    return hosts


def parse_hostfile(path: str) -> List[Tuple[str, int]]:
    """horovodrun's host file: a host per line, "NAME slots=N" or "NAME:N" or "NAME"."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as error:
        raise ValueError(f"--hostfile {path}: cannot read it ({error.strerror})") from None
    items = []
    for number, line in enumerate(lines, 1):
        line = line.split("#")[0].strip()
        if not line:
            continue
        words = line.split()
        if len(words) == 2 and words[1].startswith("slots="):
            items.append(f"{words[0]}:{words[1][len('slots='):]}")
        elif len(words) == 1:
            items.append(words[0])
        else:
            raise ValueError(f"--hostfile {path}, line {number}: {line!r}; write 'NAME slots=N' "
                             f"or 'NAME:N'")
    return parse_hosts(",".join(items), f"--hostfile {path}")


def assign(hosts: Sequence[Tuple[str, int]], np: int) -> List[Tuple[str, int]]:
    """(host, ranks) in host order, filling each host's slots before the next one's."""
    total = sum(slots for _, slots in hosts)
    if np > total:
        listed = ",".join(f"{h}:{s}" for h, s in hosts)
        raise ValueError(f"-np {np} but the hosts have {total} slots ({listed}): lower -np or "
                         f"give more hosts or slots")
    placed, left = [], np
    for host, slots in hosts:
        if left == 0:
            break
        placed.append((host, min(slots, left)))
        left -= placed[-1][1]
    return placed


def forwarded_environment(names: Sequence[str], environ=os.environ) -> Dict[str, str]:
    """What every host gets: -x NAME (this environment's value) or -x NAME=VALUE, and the
    variables with FORWARDED_PREFIXES."""
    env = {k: v for k, v in environ.items()
           if k.startswith(FORWARDED_PREFIXES) and k not in NOT_FORWARDED}
    for item in names:
        name, sep, value = item.partition("=")
        if not name.replace("_", "").isalnum():
            raise ValueError(f"-x {item!r}: give a variable's NAME or NAME=VALUE")
        if name in NOT_FORWARDED:
            raise ValueError(f"-x {name}: {name} is not forwarded (each rank gets its own, or "
                             f"the launcher passes it securely)")
        if sep:
            env[name] = value
        elif name in environ:
            env[name] = environ[name]
    return env


def is_this_host(host: str) -> bool:
    return host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())


def node_command(node: int, nnodes: int, nproc: int, rendezvous: str, program: Sequence[str],
                 grace: float, timeout: float) -> List[str]:
    """The node launcher's command (this Python, tftorus/run.py by path)."""
    return [sys.executable, RUN_PY, "--nnodes", str(nnodes), "--node-rank", str(node),
            "--nproc-per-node", str(nproc), "--rendezvous", rendezvous, "--grace", f"{grace:g}",
            "--rendezvous-timeout", f"{timeout:g}", "--join", "--secret-stdin", "--",
            *program]


def remote_shell_line(command: Sequence[str], env: Dict[str, str]) -> str:
    """What ssh runs on a host: the same directory, the forwarded variables, the command."""
    assignments = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return " ".join(["cd", shlex.quote(os.getcwd()), "&&", "exec", "env", *assignments,
                     *(shlex.quote(word) for word in command)])


def this_hosts_address(remote: Sequence[str]) -> str:
    """The address the other hosts reach this one at: the interface towards the first remote
    host that resolves (loopback when every host is this one)."""
    for host in remote:
        try:
            return multi_node.address_towards(socket.gethostbyname(host), 22)
        except OSError:
            continue
    if remote:
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            pass
    return "127.0.0.1"


class SshJob:
    """The node launchers' processes (ssh or local), their relayed output, their end."""

    def __init__(self, grace: float):
        self.grace = grace
        self.procs: List[Tuple[str, subprocess.Popen]] = []
        self.selector = selectors.DefaultSelector()
        self.partial: Dict[int, bytes] = {}
        self.last_error: Dict[str, str] = {}
        self.signalled: Optional[int] = None

    def say(self, message: str) -> None:
        sys.stderr.buffer.write(f"[{NAME}] {message}\n".encode())
        sys.stderr.buffer.flush()

    def start(self, host: str, command: List[str], secret: str) -> None:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            proc.stdin.write(secret.encode() + b"\n")
            proc.stdin.close()
        except OSError:  # it ended at once: its status says why
            pass
        self.procs.append((host, proc))
        for pipe, stream in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
            os.set_blocking(pipe.fileno(), False)
            self.selector.register(pipe, selectors.EVENT_READ, (host, stream))
            self.partial[pipe.fileno()] = b""

    def pump(self, timeout: float) -> None:
        """Relay what the node launchers wrote, line by line (already prefixed by rank)."""
        if not self.partial:
            time.sleep(timeout)
            return
        for key, _ in self.selector.select(timeout):
            pipe, (host, stream) = key.fileobj, key.data
            try:
                data = os.read(pipe.fileno(), 65536)
            except BlockingIOError:
                continue
            text = self.partial.pop(pipe.fileno()) + data
            if not data:
                self.selector.unregister(pipe)
                pipe.close()
                lines, rest = ([text] if text else []), None
            else:
                *lines, rest = text.split(b"\n")
                self.partial[pipe.fileno()] = rest
            for line in lines:
                stream.write(line + b"\n")
                if stream is sys.stderr.buffer and line.strip():
                    self.last_error[host] = line.decode(errors="replace").strip()
            stream.flush()

    def ended_early(self) -> Optional[Tuple[str, int]]:
        """(host, status) of a node launcher that exited non-zero."""
        for host, proc in self.procs:
            if proc.poll() not in (None, 0):
                return host, proc.returncode
        return None

    def running(self) -> bool:
        return any(proc.poll() is None for _, proc in self.procs)

    def kill(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def on_signal(self, sig, _frame) -> None:
        if self.signalled is None:
            self.signalled = sig
            self.say(f"got {signal.Signals(sig).name}; stopping every rank on every host")
        else:
            self.kill()


def run(np: int, hosts: Sequence[Tuple[str, int]], program: Sequence[str], grace: float,
        timeout: float, forward: Sequence[str] = (), ssh: Sequence[str] = ("ssh",)) -> int:
    """Start the job (module docstring); its exit status."""
    placed = assign(hosts, np)
    env = forwarded_environment(forward)
    key = job_secret.load()  # a malformed one is refused here, before any host is started
    secret = key.hex() if key is not None else job_secret.make()
    seal = job_secret.Seal(bytes.fromhex(secret))
    job = SshJob(grace)
    remote = [h for h, _ in placed if not is_this_host(h)]
    address = this_hosts_address(remote)
    coordinator = multi_node.Coordinator(len(placed), ("", 0), seal, timeout, job.say)
    rendezvous = f"[{address}]:{coordinator.port}" if ":" in address else \
        f"{address}:{coordinator.port}"
    coordinator.start()
    old = {s: signal.signal(s, job.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for node, (host, nproc) in enumerate(placed):
            command = node_command(node, len(placed), nproc, rendezvous, program, grace, timeout)
            if is_this_host(host):
                job.start(host, ["env", *[f"{k}={v}" for k, v in env.items()], *command],
                          secret)
            else:
                job.start(host, [*ssh, *SSH_OPTIONS, host, remote_shell_line(command, env)],
                          secret)
        return _wait(job, coordinator, grace)
    finally:
        job.kill()
        for s, h in old.items():
            signal.signal(s, h)


def _wait(job: SshJob, coordinator: multi_node.Coordinator, grace: float) -> int:
    stopping_since = None
    while True:
        job.pump(0.1)
        if coordinator.result is None and coordinator.stop_request is None:
            early = job.ended_early()
            if job.signalled is not None:
                coordinator.request_stop(128 + job.signalled,
                                         f"stopped by {signal.Signals(job.signalled).name}")
            elif early is not None:
                host, code = early
                said = job.last_error.get(host, "")
                coordinator.request_stop(
                    code if 0 < code < 256 else 1,
                    f"{host}: its launcher {'(ssh) ' if not is_this_host(host) else ''}exited "
                    f"with status {code}" + (f": {said}" if said else ""))
        if coordinator.result is not None or coordinator.stop_request is not None:
            stopping_since = stopping_since or time.monotonic()
            # the node launchers stop their ranks (grace), then exit; ssh ends with them. Ended
            # before the start (a host ssh cannot reach): no rank runs anywhere, and a node
            # launcher that registers now would wait for a start that never comes (killed below)
            wait = grace + 2 * multi_node.LOST_SECONDS
            if coordinator.result is not None and not coordinator.started:
                wait = STOPPED_BEFORE_START_SECONDS
            if not job.running() or time.monotonic() - stopping_since > wait:
                break
    coordinator.join(timeout=2 * multi_node.LOST_SECONDS)
    for _ in range(20):  # what is still in the pipes
        job.pump(0.05)
    status, why = coordinator.result or coordinator.stop_request or (1, "unknown")
    if status:
        job.say(f"failed: {why}")
    return status
