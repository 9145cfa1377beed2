"""One job across hosts: a launcher per node, and a coordinator they all report to.

    # the same command on every node (K = 0 on the node that hosts the rendezvous):
    python -m tftorus.run --nnodes 2 --node-rank K --rendezvous node0:29400 \\
        --nproc-per-node 8 train.py

Each node's launcher (`NodeLauncher`) chooses a free port per rank it will start and registers
them with the coordinator at --rendezvous (node 0's launcher hosts it, or the launcher that
started the nodes over ssh: tftorus/launch/over_ssh.py). Once every node has registered, the
coordinator numbers the ranks node by node (node 0's first, so a torus row stays inside a host)
and sends each node the full worker list; each node then starts its ranks with a TF_CONFIG naming
them all and horovodrun's HOROVOD_* variables, and prefixes their output with their rank.

The job ends together (`Coordinator`): when a rank exits non-zero, its node reports it and the
coordinator tells every node to stop, naming the rank and its host; every node then stops its
ranks (SIGTERM, SIGKILL after --grace) and exits with that rank's status. A node that falls
silent for LOST_SECONDS (its launcher killed, its host gone, the network cut) is lost: the
coordinator stops the others, naming it, and a node that no longer hears the coordinator stops
its own ranks. The job succeeds when every rank on every node exits 0.

Every line between the launchers is sealed with the job's secret (TFTORUS_JOB_SECRET or _FILE,
the same on every node; tftorus/launch/job_secret.py): one that fails is dropped and counted.
Standard library only.
"""
import signal
import socket
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

from tftorus.launch import job_secret
from tftorus.launch.local import NAME, Job, _describe, _status

#: seconds between the launchers' heartbeats; a peer silent for LOST_SECONDS is lost
BEAT_SECONDS = 1.0
LOST_SECONDS = 5.0
MAX_LINE = 1 << 20


def split_host_port(raw: str, what: str = "--rendezvous") -> Tuple[str, int]:
    host, _, port = raw.strip().rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} {raw!r} is not host:port; name node 0's host and a free port "
                         f"there, e.g. node01:29400")
    return host, int(port)


def address_towards(host: str, port: int) -> str:
    """This host's address on the interface that reaches `host` (what the other nodes reach
    this one at)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((host, port))  # no packet is sent: it only picks the route
        return probe.getsockname()[0]
    finally:
        probe.close()


class Channel:
    """Sealed JSON lines over one TCP connection, read without blocking."""

    def __init__(self, conn: socket.socket, seal: job_secret.Seal, peer: str):
        self.conn, self.seal, self.peer = conn, seal, peer
        self.buffer = b""
        self.heard = time.monotonic()
        self.closed = False
        self.dropped = 0
        conn.setblocking(False)

    def send(self, message: dict) -> None:
        if self.closed:
            return
        try:
            self.conn.setblocking(True)
            self.conn.settimeout(LOST_SECONDS)
            self.conn.sendall(self.seal.seal_json(message) + b"\n")
        except OSError:
            self.closed = True
        finally:
            if not self.closed:
                self.conn.setblocking(False)

    def receive(self) -> List[dict]:
        """The messages that arrived (none if nothing did); `closed` once the peer is gone."""
        messages = []
        while not self.closed:
            try:
                data = self.conn.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.closed = True
                break
            if not data:
                self.closed = True
                break
            self.buffer += data
            if len(self.buffer) > MAX_LINE and b"\n" not in self.buffer:
                self.closed = True  # not our protocol
                break
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            message, why = self.seal.open_json(line)
            if message is None:
                self.dropped += 1
                continue
            self.heard = time.monotonic()
            messages.append(message)
        return messages

    def silent_for(self) -> float:
        return time.monotonic() - self.heard

    def close(self) -> None:
        self.closed = True
        try:
            self.conn.close()
        except OSError:
            pass


class Coordinator:
    """Waits for `nnodes` node launchers, numbers their ranks, then watches the job (module
    docstring). `result` is (status, why) once it ended: 0 when every rank exited 0."""

    def __init__(self, nnodes: int, listen: Tuple[str, int], seal: job_secret.Seal,
                 timeout: float, say=None):
        self.thread = threading.Thread(target=self._serve, name="tftorus-coordinator",
                                       daemon=True)
        self.nnodes, self.seal, self.timeout = nnodes, seal, timeout
        self.say = say or (lambda message: print(f"[{NAME}] {message}", file=sys.stderr,
                                                 flush=True))
        self.server = socket.create_server(listen, reuse_port=False)
        self.server.setblocking(False)
        self.port = self.server.getsockname()[1]
        self.nodes: Dict[int, Tuple[Channel, dict]] = {}
        self.started = False  # the ranks' plan was sent: before it, no rank runs anywhere
        self.result: Optional[Tuple[int, str]] = None
        self.stop_request: Optional[Tuple[int, str]] = None  # from the launcher (a signal)
        self.refused = 0

    def request_stop(self, status: int, why: str) -> None:
        self.stop_request = (status, why)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    def _serve(self) -> None:
        try:
            self.result = self._run()
        except Exception as error:  # a bug here must still end the job, saying why
            self.result = (1, f"the coordinator failed: {error!r}")
            self._broadcast({"t": "stop", "status": 1, "why": self.result[1]})

    def _run(self) -> Tuple[int, str]:
        unregistered: List[Channel] = []
        deadline = time.monotonic() + self.timeout
        while len(self.nodes) < self.nnodes:  # registration
            if self.stop_request:
                return self._end(*self.stop_request)
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.nnodes)) - set(self.nodes))
                return self._end(1, f"node(s) {missing} of {self.nnodes} did not register "
                                     f"within {self.timeout:g} s (are their launchers running, "
                                     f"with the same --rendezvous and job secret?)")
            self._accept(unregistered)
            for channel in list(unregistered):
                for message in channel.receive():
                    self._register(channel, message, unregistered)
                if channel.closed or (channel in unregistered and channel.silent_for() > 10):
                    unregistered.remove(channel)
                    channel.close()
            for node, (channel, info) in list(self.nodes.items()):
                channel.receive()
                if channel.closed:
                    return self._end(1, f"{info['host']} (node {node}) left before the job "
                                         f"started")
            time.sleep(0.02)
        for channel in unregistered:
            channel.close()
        self._start_ranks()
        return self._watch()

    def _accept(self, unregistered: List[Channel]) -> None:
        while True:
            try:
                conn, peer = self.server.accept()
            except (BlockingIOError, InterruptedError):
                return
            unregistered.append(Channel(conn, self.seal, f"{peer[0]}:{peer[1]}"))

    def _register(self, channel: Channel, message: dict, unregistered: List[Channel]) -> None:
        node, nproc = message.get("node"), message.get("nproc")
        ports = message.get("ports")
        if (message.get("t") != "register" or not _is_int(node) or not _is_int(nproc)
                or not isinstance(ports, list) or len(ports) != nproc
                or not all(_is_int(p) for p in ports) or not isinstance(message.get("address"),
                                                                       str)
                or not isinstance(message.get("host"), str)):
            self.refused += 1
            return
        if not 0 <= node < self.nnodes or node in self.nodes:
            channel.send({"t": "stop", "status": 2,
                          "why": f"node rank {node} is outside 0..{self.nnodes - 1} or taken: "
                                 f"give each node its own --node-rank"})
            return
        unregistered.remove(channel)
        self.nodes[node] = (channel, message)

    def _start_ranks(self) -> None:
        workers, hosts, first = [], [], {}
        for node in range(self.nnodes):
            info = self.nodes[node][1]
            first[node] = len(workers)
            address = info["address"]
            address = f"[{address}]" if ":" in address else address
            workers += [f"{address}:{port}" for port in info["ports"]]
            hosts += [info["host"]] * info["nproc"]
        self.started = True
        for node, (channel, _) in self.nodes.items():
            channel.send({"t": "start", "workers": workers, "hosts": hosts,
                          "first": first[node]})

    def _watch(self) -> Tuple[int, str]:
        done = set()
        last_beat = 0.0
        while True:
            if self.stop_request:
                return self._end(*self.stop_request)
            if time.monotonic() - last_beat > BEAT_SECONDS:
                self._broadcast({"t": "beat"})
                last_beat = time.monotonic()
            for node, (channel, info) in self.nodes.items():
                for message in channel.receive():
                    if message.get("t") == "failed":
                        status = message.get("status")
                        status = status if _is_int(status) and 0 < status < 256 else 1
                        return self._end(status, f"rank {message.get('rank')} on "
                                                  f"{info['host']} {message.get('what')}")
                    if message.get("t") == "done":
                        done.add(node)
                if node in done:
                    continue
                if channel.closed:
                    return self._end(1, f"lost {info['host']} (node {node}): its launcher's "
                                         f"connection closed")
                if channel.silent_for() > LOST_SECONDS:
                    return self._end(1, f"lost {info['host']} (node {node}): no word from its "
                                         f"launcher for {LOST_SECONDS:g} s")
            if len(done) == self.nnodes:
                self._broadcast({"t": "finish"})
                return 0, ""
            time.sleep(0.05)

    def _end(self, status: int, why: str) -> Tuple[int, str]:
        self._broadcast({"t": "stop", "status": status, "why": why})
        return status, why

    def _broadcast(self, message: dict) -> None:
        for channel, _ in self.nodes.values():
            channel.send(message)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class NodeLauncher:
    """One node's launcher: registers, starts its ranks, reports, and stops with the job."""

    def __init__(self, node: int, nproc: int, rendezvous: Tuple[str, int],
                 seal: job_secret.Seal, grace: float, timeout: float, host: str = ""):
        self.node, self.nproc, self.rendezvous = node, nproc, rendezvous
        self.seal, self.timeout = seal, timeout
        self.host = host or socket.gethostname()
        self.job = Job(grace)
        self.job.say = self.say  # its lines name this node

    def say(self, message: str) -> None:
        self.job.err.write(f"[{NAME} {self.host}] {message}\n".encode())
        self.job.err.flush()

    def connect(self) -> Channel:
        """The coordinator may start a little after this node: retry until the timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                conn = socket.create_connection(self.rendezvous, timeout=5)
                return Channel(conn, self.seal, "%s:%d" % self.rendezvous)
            except OSError as error:
                if time.monotonic() > deadline:
                    raise ConnectionError(
                        f"cannot reach the rendezvous at {self.rendezvous[0]}:"
                        f"{self.rendezvous[1]} within {self.timeout:g} s ({error}); start node "
                        f"0's launcher, or check the address and the firewall") from None
                time.sleep(0.5)

    def run(self, program: List[str]) -> int:
        channel = self.connect()
        address = address_towards(*self.rendezvous)
        if address.startswith("127.") and not self.rendezvous[0].startswith("127."):
            address = socket.gethostbyname(self.host)
        ports = _free_ports(self.nproc)
        channel.send({"t": "register", "node": self.node, "nproc": self.nproc,
                      "address": address, "ports": ports, "host": self.host})
        plan = self._wait_for_start(channel)
        if plan.get("t") == "stop":
            self.say(f"stopped before starting: {plan.get('why')}")
            return plan.get("status", 1) if _is_int(plan.get("status")) else 1
        first = plan["first"]
        self.job.start_ranks(program, plan["workers"], plan["hosts"],
                             range(first, first + self.nproc))
        return self._watch(channel)

    def _wait_for_start(self, channel: Channel) -> dict:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for message in channel.receive():
                if message.get("t") == "start" and _valid_plan(message, self.nproc):
                    return message
                if message.get("t") == "stop":
                    return message
            if channel.closed:
                return {"t": "stop", "status": 1, "why": "the coordinator closed the connection"}
            if self.job.signalled is not None:
                return {"t": "stop", "status": 128 + self.job.signalled, "why": "signalled"}
            time.sleep(0.05)
        return {"t": "stop", "status": 1,
                "why": f"the other nodes did not all register within {self.timeout:g} s"}

    def _watch(self, channel: Channel) -> int:
        job = self.job
        reported = False
        verdict: Optional[Tuple[int, str]] = None
        last_beat, ended_at = 0.0, None
        while True:
            job._pump(0.1)
            if time.monotonic() - last_beat > BEAT_SECONDS:
                channel.send({"t": "beat"})
                last_beat = time.monotonic()
            failed = job.first_failure()
            if failed is not None and not reported and job.stop_deadline is None:
                reported = True
                channel.send({"t": "failed", "rank": failed[0], "status": _status(failed[1]),
                              "what": _describe(failed[1])})
                self.say(f"rank {failed[0]} {_describe(failed[1])}; stopping the job")
                job.stop()
            if job.signalled is not None and not reported and verdict is None:
                reported = True
                channel.send({"t": "failed", "rank": "-", "status": 128 + job.signalled,
                              "what": f"was stopped by {signal.Signals(job.signalled).name} "
                                      f"(its launcher got it)"})
            for message in channel.receive():
                if message.get("t") == "stop" and verdict is None:
                    status = message.get("status")
                    verdict = (status if _is_int(status) else 1, str(message.get("why")))
                    if job.stop_deadline is None:
                        self.say(f"stopping this node's ranks: {verdict[1]}")
                    job.stop()
                elif message.get("t") == "finish" and verdict is None:
                    verdict = (0, "")
            if verdict is None and (channel.closed or channel.silent_for() > LOST_SECONDS):
                verdict = (1, "lost the coordinator (node 0's launcher, or the launcher that "
                              "started this node)")
                self.say(f"stopping this node's ranks: {verdict[1]}")
                job.stop()
            all_ended = all(p.poll() is not None for p in job.procs)
            if all_ended and failed is None and not reported and verdict is None:
                reported = True
                channel.send({"t": "done"})
            job.kill_after_grace()
            done, ended_at = job.output_done(ended_at)
            if done and verdict is not None:
                break
        for proc in job.procs:
            proc.wait()
        channel.close()
        status, why = verdict
        if status:
            self.say(f"failed: {why}")
        return status


def _valid_plan(message: dict, nproc: int) -> bool:
    workers, hosts, first = message.get("workers"), message.get("hosts"), message.get("first")
    return (isinstance(workers, list) and isinstance(hosts, list) and len(workers) == len(hosts)
            and all(isinstance(w, str) for w in workers + hosts) and _is_int(first)
            and 0 <= first <= len(workers) - nproc)


def _free_ports(count: int) -> List[int]:
    """Ports free on every interface now, all distinct (TensorFlow's servers bind them all)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_node(node: int, nnodes: int, nproc: int, rendezvous: str, program: List[str],
             grace: float, timeout: float, coordinate: bool = True) -> int:
    """One node's part of a multi-node job (module docstring); its exit status. Node 0 hosts
    the coordinator at --rendezvous unless `coordinate` is False (the ssh launcher hosts it)."""
    where = split_host_port(rendezvous)
    seal = job_secret.Seal(job_secret.load())
    launcher = NodeLauncher(node, nproc, where, seal, grace, timeout)
    coordinator = None
    if node == 0 and coordinate:
        if not seal.authenticated:
            job_secret.warn_unauthenticated("the launchers' rendezvous (--rendezvous)")
        coordinator = Coordinator(nnodes, ("", where[1]), seal, timeout, launcher.say)
        coordinator.start()
    old = {s: signal.signal(s, launcher.job.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = launcher.run(program)
        if coordinator is not None:
            coordinator.join(timeout=2 * LOST_SECONDS)
        return status
    except ConnectionError as error:
        launcher.say(str(error))
        return 1
    finally:
        launcher.job._signal_all(signal.SIGKILL)  # leave no rank behind
        for s, h in old.items():
            signal.signal(s, h)
