"""mpirun's rendezvous: Open MPI names no peer addresses, so across hosts every rank sends its own
"host:port" to a small TCP server that rank 0 hosts at TFTORUS_RENDEZVOUS=host:port, and gets
every rank's back in rank order (or the one error every rank then raises). Each line is sealed
under the job's secret (tftorus/launch/job_secret.py): a stranger's registration, a replayed one
or a connection left idle is dropped, counted and said once, and holds up no rank. Standard
library only; tftorus/cluster/discovery.py calls it."""
import ipaddress
import selectors
import socket
import sys
import time
from typing import Dict, Optional, Tuple

from tftorus.launch import job_secret


def address_of(raw: str) -> Tuple[str, int]:
    host, _, port = raw.strip().rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"TFTORUS_RENDEZVOUS={raw!r} is not host:port; set it to rank 0's host "
                         f"and a free port there, e.g. node01:29400")
    return host, int(port)



_RDV_MAGIC = "tftorus-rendezvous-2"
#: how long a connection may take to send its registration before rank 0 closes it
REGISTRATION_SECONDS = 10.0
MAX_LINE = 1 << 16


def exchange_addresses(rank: int, size: int, mine: str, where: Tuple[str, int],
                       timeout: float, seal: Optional[job_secret.Seal] = None
                       ) -> Tuple[str, ...]:
    """Every rank's "host:port", in rank order: rank 0 listens at `where` and answers each rank
    with the full list once all `size` have sent theirs, or with the error every rank then
    raises (ranks missing after `timeout` seconds, named). With the job's secret (`seal`, else
    the environment's) every registration and answer is sealed: one that fails is dropped and
    counted, never taken, and never stops the others."""
    if size == 1:
        return (mine,)
    seal = seal or job_secret.Seal(job_secret.load())
    if rank == 0 and not seal.authenticated:
        job_secret.warn_unauthenticated("the mpirun rendezvous (TFTORUS_RENDEZVOUS)")
    deadline = time.monotonic() + timeout
    if rank == 0:
        return _Server(size, mine, where, seal).serve(deadline, timeout)
    return _join_rendezvous(rank, size, mine, where, deadline, timeout, seal)


def _line(seal: job_secret.Seal, message: dict) -> bytes:
    return seal.seal_json(message) + b"\n"


def _listen_address(where: Tuple[str, int]):
    """Where rank 0 listens: the address TFTORUS_RENDEZVOUS names, or every interface where that
    is a host name this host resolves to loopback (Debian maps its own name to 127.0.1.1, which
    the other hosts cannot reach)."""
    host, port = where
    infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    family, _, _, _, address = infos[0]
    literal = _is_literal(host)
    if not literal and ipaddress.ip_address(address[0].split("%")[0]).is_loopback:
        return family, ("::" if family == socket.AF_INET6 else "", port)
    return family, address


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


class _Server:
    """Rank 0's side: many connections at once (an idle one holds nobody up), each allowed one
    registration line within REGISTRATION_SECONDS."""

    def __init__(self, size: int, mine: str, where: Tuple[str, int], seal: job_secret.Seal):
        self.size, self.where, self.seal = size, where, seal
        self.addresses: Dict[int, str] = {0: mine}
        self.members: Dict[int, socket.socket] = {}
        self.error: Optional[str] = None
        self.dropped = 0

    def drop(self, peer, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1:
            print(f"tftorus rendezvous (rank 0): dropped a connection from {peer[0]}:{peer[1]}: "
                  f"{why}; later ones are counted", file=sys.stderr, flush=True)

    def serve(self, deadline: float, timeout: float) -> Tuple[str, ...]:
        family, address = _listen_address(self.where)
        server = socket.socket(family, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        selector = selectors.DefaultSelector()
        pending: Dict[socket.socket, list] = {}  # conn -> [peer, bytes so far, deadline]
        try:
            try:
                server.bind(address)
            except OSError as e:
                raise RuntimeError(
                    f"rank 0 cannot host the rendezvous at {address[0] or '*'}:{address[1]} "
                    f"(TFTORUS_RENDEZVOUS={self.where[0]}:{self.where[1]}): {e.strerror}; name "
                    f"an address of rank 0's host and a free port") from None
            server.listen(min(self.size, 1024))
            server.setblocking(False)
            selector.register(server, selectors.EVENT_READ)
            while len(self.addresses) < self.size and self.error is None:
                now = time.monotonic()
                if now >= deadline:
                    self.error = self._missing(timeout)
                    break
                for conn in [c for c, (_, _, until) in pending.items() if until <= now]:
                    self.drop(pending[conn][0], "sent no registration in time")
                    self._forget(selector, pending, conn)
                wait = min([deadline] + [until for _, _, until in pending.values()]) - now
                for key, _ in selector.select(max(0.01, wait)):
                    if key.fileobj is server:
                        self._accept(server, selector, pending)
                    else:
                        self._read(key.fileobj, selector, pending)
            self._answer()
        finally:
            for conn in list(pending) + list(self.members.values()):
                conn.close()
            selector.close()
            server.close()
        if self.dropped:
            print(f"tftorus rendezvous (rank 0): {self.dropped} connection"
                  f"{'s' * (self.dropped != 1)} dropped in all (not the job's, malformed, "
                  f"replayed or idle)", file=sys.stderr, flush=True)
        if self.error:
            raise RuntimeError(f"rank 0: {self.error}")
        return tuple(self.addresses[r] for r in range(self.size))

    def _missing(self, timeout: float) -> str:
        missing = [r for r in range(self.size) if r not in self.addresses]
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        return (f"rank(s) {shown} did not reach the rendezvous at {self.where[0]}:"
                f"{self.where[1]} within {timeout:g}s (did they start, with the same "
                f"TFTORUS_RENDEZVOUS and job secret, and can they reach rank 0's host?)")

    def _accept(self, server, selector, pending) -> None:
        try:
            conn, peer = server.accept()
        except OSError:
            return
        if len(pending) >= 4 * self.size + 64:  # a flood of idle connections: the oldest go
            oldest = next(iter(pending))
            self.drop(pending[oldest][0], "too many connections waiting")
            self._forget(selector, pending, oldest)
        conn.setblocking(False)
        pending[conn] = [peer, b"", time.monotonic() + REGISTRATION_SECONDS]
        selector.register(conn, selectors.EVENT_READ)

    def _forget(self, selector, pending, conn) -> None:
        selector.unregister(conn)
        pending.pop(conn, None)
        conn.close()

    def _read(self, conn, selector, pending) -> None:
        peer, data, _ = pending[conn]
        try:
            chunk = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        data += chunk
        if not chunk or len(data) > MAX_LINE:
            self.drop(peer, "closed, or sent too much, before a registration line")
            return self._forget(selector, pending, conn)
        if not data.endswith(b"\n"):
            pending[conn][1] = data
            return
        selector.unregister(conn)
        pending.pop(conn)
        message, why = self.seal.open_json(data)
        if message is None or not self._register(message, conn):
            self.drop(peer, why or "not a registration")
            conn.close()

    def _register(self, message: dict, conn) -> bool:
        """False for what is not a registration; a real rank of another size, or a rank twice,
        is the job's error (sealed: it comes from the job)."""
        size, rank, address = message.get("size"), message.get("rank"), message.get("address")
        if (message.get("magic") != _RDV_MAGIC or not _is_int(size) or not _is_int(rank)
                or not isinstance(address, str) or not 0 < len(address) < 300):
            return False
        if not self.seal.authenticated and not (size == self.size and 0 < rank < size
                                                and rank not in self.addresses):
            return False  # unsealed: anyone's; never a reason to stop the job
        if size != self.size or not 0 < rank < size or rank in self.addresses:
            why = (f"rank {rank} was started for {size} ranks, rank 0 for {self.size}"
                   if size != self.size else f"two processes claim rank {rank}"
                   if rank in self.addresses else f"rank {rank} is not in 1..{self.size - 1}")
            self.error = (f"the rendezvous at {self.where[0]}:{self.where[1]} got inconsistent "
                          f"ranks: {why}")
            self.members[-1] = conn
            return True
        self.addresses[rank] = address
        self.members[rank] = conn
        return True

    def _answer(self) -> None:
        reply = ({"error": self.error} if self.error else
                 {"ok": [self.addresses[r] for r in range(self.size)]})
        for conn in self.members.values():
            try:
                conn.setblocking(True)
                conn.settimeout(10)
                conn.sendall(_line(self.seal, reply))
            except OSError:
                pass


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _read_line(conn: socket.socket, deadline: float) -> bytes:
    data = b""
    while not data.endswith(b"\n") and len(data) <= MAX_LINE:
        conn.settimeout(max(0.05, deadline - time.monotonic()))
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _join_rendezvous(rank, size, mine, where, deadline, timeout, seal) -> Tuple[str, ...]:
    label = f"{where[0]}:{where[1]} (TFTORUS_RENDEZVOUS, hosted by rank 0)"
    while True:
        try:
            conn = socket.create_connection(where, timeout=max(0.05, min(
                5.0, deadline - time.monotonic())))
            break
        except OSError as e:
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank {rank}: could not reach the rendezvous at {label} within "
                                   f"{timeout:g}s ({e.strerror or e}): did rank 0 start, and is "
                                   f"that address reachable from here?") from None
            time.sleep(0.1)
    with conn:
        try:
            conn.sendall(_line(seal, {"magic": _RDV_MAGIC, "size": size, "rank": rank,
                                      "address": mine}))
            # rank 0 answers by its own deadline, which may come later than this rank's
            answer = _read_line(conn, time.monotonic() + timeout + 10)
        except OSError:
            answer = b""
    if not answer:
        raise RuntimeError(f"rank {rank}: the rendezvous at {label} closed without an answer "
                           f"(did rank 0 end, or refuse this rank's job secret?)")
    message, why = seal.open_json(answer)
    if message is None:
        raise RuntimeError(f"rank {rank}: the rendezvous at {label} answered with what is not "
                           f"this job's ({why}): another job on that port, or a stranger")
    if isinstance(message.get("error"), str):
        raise RuntimeError(f"rank {rank}: {message['error']}")
    workers = message.get("ok")
    if (not isinstance(workers, list) or len(workers) != size
            or not all(isinstance(w, str) for w in workers)):
        raise RuntimeError(f"rank {rank}: the rendezvous at {label} answered without the "
                           f"{size} addresses")
    return tuple(workers)
