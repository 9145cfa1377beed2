"""mpirun's rendezvous: Open MPI names no peer addresses, so across hosts every rank sends its own
"host:port" to a small TCP server that rank 0 hosts at TFTORUS_RENDEZVOUS=host:port, and gets
every rank's back in rank order (or the one error every rank then raises). Standard library
only; tftorus/cluster/discovery.py calls it."""
import socket
import time
from typing import Tuple


def address_of(raw: str) -> Tuple[str, int]:
    host, _, port = raw.strip().rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"TFTORUS_RENDEZVOUS={raw!r} is not host:port; set it to rank 0's host "
                         f"and a free port there, e.g. node01:29400")
    return host, int(port)



_RDV_MAGIC = "tftorus-rendezvous-1"


def exchange_addresses(rank: int, size: int, mine: str, where: Tuple[str, int],
                       timeout: float) -> Tuple[str, ...]:
    """Every rank's "host:port", in rank order: rank 0 listens at `where` (every interface of
    that port) and answers each rank with the full list once all `size` have sent theirs, or
    with the error every rank then raises (ranks missing after `timeout` seconds, named)."""
    if size == 1:
        return (mine,)
    deadline = time.monotonic() + timeout
    if rank == 0:
        return _serve_rendezvous(size, mine, where, deadline, timeout)
    return _join_rendezvous(rank, size, mine, where, deadline, timeout)


def _read_line(conn: socket.socket, deadline: float) -> str:
    data = b""
    while not data.endswith(b"\n"):
        conn.settimeout(max(0.05, deadline - time.monotonic()))
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > 1 << 20:
            break
    return data.decode("utf-8", "replace").strip()


def _serve_rendezvous(size, mine, where, deadline, timeout) -> Tuple[str, ...]:
    family = socket.AF_INET6 if ":" in where[0] else socket.AF_INET
    server = socket.socket(family, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    addresses, conns, error = {0: mine}, {}, None
    try:
        try:
            server.bind(("::" if family == socket.AF_INET6 else "", where[1]))
        except OSError as e:
            raise RuntimeError(f"rank 0 cannot host the rendezvous on port {where[1]} "
                               f"(TFTORUS_RENDEZVOUS): {e.strerror}; choose a free port") from None
        server.listen(min(size, 1024))
        while len(addresses) < size and error is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [r for r in range(size) if r not in addresses]
                shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
                error = (f"rank(s) {shown} did not reach the rendezvous at "
                         f"{where[0]}:{where[1]} within {timeout:g}s (did they start, with the "
                         f"same TFTORUS_RENDEZVOUS, and can they reach rank 0's host?)")
                break
            server.settimeout(remaining)
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            try:
                words = _read_line(conn, min(deadline, time.monotonic() + 10)).split()
            except OSError:
                conn.close()
                continue
            if len(words) != 4 or words[0] != _RDV_MAGIC or not words[1].isdigit() \
                    or not words[2].isdigit():
                conn.close()  # not one of ours
                continue
            their_size, their_rank = int(words[1]), int(words[2])
            if their_size != size or not 0 < their_rank < size or their_rank in addresses:
                why = (f"rank {their_rank} was started for {their_size} ranks, rank 0 for {size}"
                       if their_size != size else f"two processes claim rank {their_rank}"
                       if their_rank in addresses else f"rank {their_rank} is not in 1..{size - 1}")
                error = f"the rendezvous at {where[0]}:{where[1]} got inconsistent ranks: {why}"
                conns[-1] = conn
                break
            addresses[their_rank] = words[3]
            conns[their_rank] = conn
        reply = (f"error {error}" if error else
                 "ok " + " ".join(addresses[r] for r in range(size))) + "\n"
        for conn in conns.values():
            try:
                conn.settimeout(10)
                conn.sendall(reply.encode())
            except OSError:
                pass
    finally:
        for conn in conns.values():
            conn.close()
        server.close()
    if error:
        raise RuntimeError(f"rank 0: {error}")
    return tuple(addresses[r] for r in range(size))


def _join_rendezvous(rank, size, mine, where, deadline, timeout) -> Tuple[str, ...]:
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
            conn.sendall(f"{_RDV_MAGIC} {size} {rank} {mine}\n".encode())
            # rank 0 answers by its own deadline, which may come later than this rank's
            answer = _read_line(conn, time.monotonic() + timeout + 10)
        except OSError:
            answer = ""
    if answer.startswith("error "):
        raise RuntimeError(f"rank {rank}: {answer[6:]}")
    workers = tuple(answer.split()[1:]) if answer.startswith("ok ") else ()
    if len(workers) != size:
        raise RuntimeError(f"rank {rank}: the rendezvous at {label} closed without an answer "
                           f"(did rank 0 end?)")
    return workers
