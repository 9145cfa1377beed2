"""Worker-loss detection independent of the collectives: UDP heartbeats to rank 0.

A worker that dies or stalls leaves its peers blocked in a collective that never completes (the
Horovod engine has no timeout at all; the tf engine's names no rank). The watchdog runs beside the
collectives:

* rank 0 listens on a UDP socket; its address reaches every rank at start-up through one
  all-reduce (loopback when all ranks share a host, else this host's address, or
  TFTORUS_WATCHDOG_HOST);
* every rank's background thread sends {rank, progress counter, what, phase, epoch, step} each
  interval (heartbeat timeout / 10, at most 1 s); rank 0 answers with the world's verdict,
  and sends a verdict, once reached, to every rank unasked;
* a rank silent for more than the heartbeat timeout is *lost*; a rank whose progress has not
  moved for more than the stall timeout while another rank has moved past it is *stalled*; a rank
  that hears nothing from rank 0 for more than the heartbeat timeout declares rank 0 lost;
* on a verdict each rank prints one line to stderr naming the rank and what it and this rank were
  doing, and exits with status 4 (os._exit: nothing may wait for the lost peer).

The training loop reports progress with `progress(what, phase, epoch, step)`: a few attribute
assignments, safe to call with no watchdog running. `stop()` before the final shutdown announces
that this rank finished, so a normal end is never reported as a loss.

`handle_termination()` (with SIGTERM/SIGINT blocked in the main thread before TensorFlow starts
its threads) turns the launcher's SIGTERM into one line naming what this rank was doing: a Python
signal handler would never run while the main thread is blocked inside a TensorFlow op.
"""
import ctypes
import dataclasses
import json
import math
import os
import signal
import socket
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from tftorus.launch import job_secret

EXIT_STATUS = 4
RECEIVE_BUFFER = 1 << 20
ENV_HOST = "TFTORUS_WATCHDOG_HOST"


# ------------------------------------------------------------------------------------------------
# What this process is doing (updated by the training loop, read by the watchdog thread).
# ------------------------------------------------------------------------------------------------
class _Progress:
    __slots__ = ("counter", "what", "phase", "epoch", "step")

    def __init__(self):
        self.counter, self.what, self.phase, self.epoch, self.step = 0, "start-up", None, None, None

    def as_dict(self) -> dict:
        return {"c": self.counter, "w": self.what, "p": self.phase, "e": self.epoch, "s": self.step}


_progress = _Progress()


def progress(what: str, phase: Optional[int] = None, epoch: Optional[float] = None,
             step: Optional[int] = None, shared: bool = True) -> None:
    """Record what this rank is starting now, at the given place in training (a place not given
    stays as last recorded: a callback that knows only what it does keeps the trainer's phase,
    epoch and step). shared=False for work only some ranks do (rank 0's checkpoint): it changes
    what is reported but not the progress counter the stall rule compares across ranks."""
    p = _progress
    p.what = what
    p.phase, p.epoch, p.step = (p.phase if phase is None else phase,
                                p.epoch if epoch is None else epoch,
                                p.step if step is None else step)
    if shared:
        p.counter += 1


def describe_progress(info: Optional[dict]) -> str:
    """'phase 1, epoch 0.42, step 17, train step' from a heartbeat's fields."""
    if not info:
        return "no heartbeat yet (start-up)"
    parts = []
    if info.get("p") is not None:
        parts.append(f"phase {info['p']}")
    if info.get("e") is not None:
        parts.append(f"epoch {info['e']:.2f}")
    if info.get("s") is not None:
        parts.append(f"step {info['s']}")
    parts.append(str(info.get("w") or "?"))
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------------
# The verdict logic (pure; a fake clock in tests).
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Verdict:
    kind: str  # 'lost' or 'stalled'
    ranks: List[int]
    text: str

    def to_json(self) -> dict:
        return {"kind": self.kind, "ranks": self.ranks, "text": self.text}

    @classmethod
    def from_json(cls, d: dict, size: int) -> "Verdict":
        """The verdict a reply carries; ValueError for anything not made by `to_json`."""
        ranks = d.get("ranks") if isinstance(d, dict) else None
        if (d.get("kind") not in ("lost", "stalled") or not isinstance(ranks, list) or not ranks
                or not all(_is_int(r) and 0 <= r < size for r in ranks)
                or not isinstance(d.get("text"), str) or len(d["text"]) > MAX_TEXT):
            raise ValueError("not a verdict")
        return cls(d["kind"], list(ranks), d["text"])


MAX_TEXT = 4096  # a verdict's text; a heartbeat's "what" is far shorter


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def checked_info(info) -> dict:
    """A heartbeat's progress fields as `_Progress.as_dict` makes them; ValueError otherwise."""
    if (not isinstance(info, dict) or not _is_int(info.get("c")) or not 0 <= info["c"] < 2 ** 62
            or not isinstance(info.get("w"), str) or len(info["w"]) > 256
            or not all(info.get(k) is None or _is_int(info[k]) for k in ("p", "s"))
            or not (info.get("e") is None or (isinstance(info["e"], (int, float))
                                              and not isinstance(info["e"], bool)
                                              and math.isfinite(info["e"])))):
        raise ValueError("not a heartbeat")
    return {k: info.get(k) for k in ("c", "w", "p", "e", "s")}


class Monitor:
    """Rank 0's view of the world: when each rank was last heard and last made progress."""

    def __init__(self, size: int, heartbeat_timeout: float, stall_timeout: float,
                 clock: Callable[[], float] = time.monotonic):
        self.size, self.clock = size, clock
        self.heartbeat_timeout, self.stall_timeout = heartbeat_timeout, stall_timeout
        now = clock()
        self.seen = [now] * size
        self.changed = [now] * size
        self.counter = [0] * size
        self.info: List[Optional[dict]] = [None] * size
        self.finished = [False] * size

    def heard(self, rank: int, info: dict, finished: bool = False) -> None:
        now = self.clock()
        self.seen[rank] = now
        if info.get("c", 0) != self.counter[rank] or self.info[rank] is None:
            self.changed[rank] = now
            self.counter[rank] = info.get("c", 0)
        self.info[rank] = info
        self.finished[rank] = self.finished[rank] or finished

    def verdict(self) -> Optional[Verdict]:
        now = self.clock()
        live = [r for r in range(self.size) if not self.finished[r]]
        lost = sorted((r for r in live if now - self.seen[r] > self.heartbeat_timeout),
                      key=lambda r: self.seen[r])
        if lost:
            return Verdict("lost", lost, "; ".join(
                f"rank {r} lost: no heartbeat for {now - self.seen[r]:.1f} s (last seen: "
                f"{describe_progress(self.info[r])})" for r in lost))
        stalled = [r for r in live if now - self.changed[r] > self.stall_timeout
                   and any(self.counter[o] > self.counter[r] for o in range(self.size) if o != r)]
        if stalled:
            stalled.sort(key=lambda r: self.changed[r])
            return Verdict("stalled", stalled, "; ".join(
                f"rank {r} stalled: no progress for {now - self.changed[r]:.1f} s while other "
                f"ranks moved on (stuck in: {describe_progress(self.info[r])})" for r in stalled))
        return None


class Rank0Monitor:
    """A non-zero rank's view: when rank 0 last answered."""

    def __init__(self, heartbeat_timeout: float, clock: Callable[[], float] = time.monotonic):
        self.heartbeat_timeout, self.clock = heartbeat_timeout, clock
        self.last_reply = clock()
        self.rank0_info: Optional[dict] = None
        self.rank0_finished = False

    def replied(self, rank0_info: Optional[dict], finished: bool = False) -> None:
        self.last_reply = self.clock()
        self.rank0_info = rank0_info or self.rank0_info
        self.rank0_finished = self.rank0_finished or finished

    def verdict(self) -> Optional[Verdict]:
        silent = self.clock() - self.last_reply
        if self.rank0_finished or silent <= self.heartbeat_timeout:
            return None
        return Verdict("lost", [0], f"rank 0 lost: no reply for {silent:.1f} s (last seen: "
                                    f"{describe_progress(self.rank0_info)})")


# ------------------------------------------------------------------------------------------------
# The background thread.
# ------------------------------------------------------------------------------------------------
def interval_for(heartbeat_timeout: float) -> float:
    return max(0.05, min(1.0, heartbeat_timeout / 10.0))


class Watchdog:
    def __init__(self, rank: int, size: int, address: Tuple[str, int], heartbeat_timeout: float,
                 stall_timeout: float, sock: Optional[socket.socket] = None,
                 exit: Callable[[int], None] = os._exit,
                 seal: Optional[job_secret.Seal] = None):
        self.rank, self.size, self.address = rank, size, address
        self.heartbeat_timeout, self.stall_timeout = heartbeat_timeout, stall_timeout
        self.interval = interval_for(heartbeat_timeout)
        self.seal = seal or job_secret.Seal(None)
        self._exit = exit
        self._stop = threading.Event()
        self._verdict: Optional[Verdict] = None
        self._got_verdict = threading.Event()
        self._defer_exit = False  # the main thread waits for the verdict (a failed collective)
        self._lock = threading.Lock()
        self.dropped = 0  # datagrams refused: not the job's, malformed, replayed
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            if rank != 0:  # only on the interface that reaches rank 0, not every one
                sock.bind((_local_address_towards(address), 0))
        self.sock = sock
        self.sock.settimeout(self.interval)
        try:  # room for heartbeats behind a burst of junk (the kernel caps it at rmem_max)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        except OSError:
            pass
        if rank == 0:
            self.monitor = Monitor(size, heartbeat_timeout, stall_timeout)
            self.peers: Dict[int, tuple] = {}
        else:
            self.monitor = Rank0Monitor(heartbeat_timeout)
        self.thread = threading.Thread(target=self._run, name="tftorus-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self.thread.start()
        return self

    # -- wire ------------------------------------------------------------------------------------
    def _send(self, payload: dict, to) -> None:
        try:
            self.sock.sendto(self.seal.seal(json.dumps(payload).encode()), to)
        except OSError:
            pass  # a full buffer or an unreachable peer: the timeouts decide

    def _message(self, data: bytes, peer) -> Optional[dict]:
        """The JSON object a datagram carries, or None (counted, the first one said) when it
        is not the job's: wrong seal, replayed, or not an object."""
        message, why = self.seal.check(data)
        if message is not None:
            try:
                msg = json.loads(message)
            except Exception:  # RecursionError and OverflowError as well as bad JSON
                msg, why = None, "not a JSON object"
            if msg is not None and not isinstance(msg, dict):
                msg, why = None, "not a JSON object"
            if msg is not None:
                return msg
        self.drop(peer, why)
        return None

    def drop(self, peer, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1:
            print(f"tftorus watchdog (rank {self.rank}): dropped a datagram from "
                  f"{_where(peer)}: {why}; later ones are counted, and the count said at the end",
                  file=sys.stderr, flush=True)

    def _status(self) -> dict:
        return {"v": self._verdict.to_json() if self._verdict else None,
                "i": _progress.as_dict(), "f": self._stop.is_set()}

    def _run(self):
        try:
            (self._serve if self.rank == 0 else self._beat)()
        except Exception as e:  # never take the job down for a watchdog bug
            print(f"tftorus watchdog (rank {self.rank}): stopped: {e!r}", file=sys.stderr,
                  flush=True)

    def _serve(self):
        next_check = 0.0
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(65536)
            except socket.timeout:
                data = None
            except OSError:
                if self._stop.is_set():
                    return
                data = None
            if data is not None:
                self._heard(data, peer)
            now = time.monotonic()
            if now >= next_check and not self._stop.is_set():
                next_check = now + self.interval
                self.monitor.heard(0, _progress.as_dict())
                if self._verdict is None:
                    verdict = self.monitor.verdict()
                    if verdict is not None:
                        # answer the live ranks for a moment so they all hear who was lost
                        self._decide(verdict, grace=2 * self.interval + 0.5)
                        self._push()

    def _heard(self, data: bytes, peer) -> None:
        """Rank 0: one heartbeat, taken only if it is the job's and well formed, from the
        address its rank was first heard from."""
        msg = self._message(data, peer)
        if msg is None:
            return
        try:
            r, info, finished = msg.get("r"), checked_info(msg.get("i")), msg.get("f", False)
            if not _is_int(r) or not 0 < r < self.size or not isinstance(finished, bool):
                raise ValueError("not a heartbeat")
        except ValueError as e:
            return self.drop(peer, str(e))
        if self.peers.setdefault(r, peer) != peer:
            return self.drop(peer, f"rank {r}'s heartbeat from another address than before")
        self.monitor.heard(r, info, finished=finished)
        self._send(self._status(), peer)

    def _push(self):
        """Rank 0: send the verdict to every rank heard so far, unasked. A rank whose watchdog
        thread cannot run while rank 0 answers (its main thread holding the interpreter in a
        blocked call) finds it waiting in its socket once it runs, instead of rank 0's silence."""
        for peer in list(self.peers.values()):
            self._send(self._status(), peer)

    def _exit_later(self, grace: float):
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            time.sleep(0.05)
        if self.rank == 0:
            self._push()  # once more: a network may drop a datagram (loopback does not)
        if not self._defer_exit:
            self._exit(EXIT_STATUS)

    def _beat(self):
        next_send = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_send:
                next_send = now + self.interval
                self._send({"r": self.rank, "i": _progress.as_dict()}, self.address)
                if self._verdict is None:
                    # replies already waiting count first: a thread starved by a loaded machine
                    # would otherwise judge rank 0 silent while its verdict sits in the socket
                    if not self._drain():
                        return
                    verdict = self.monitor.verdict() if self._verdict is None else None
                    if verdict is not None:  # rank 0 is gone: nobody to wait for
                        self._decide(verdict, grace=0.0)
            try:
                self._handle(*self.sock.recvfrom(65536))
            except socket.timeout:
                pass
            except OSError:
                if self._stop.is_set():
                    return

    def _drain(self) -> bool:
        """Handle every datagram already received; False once the watchdog is stopping."""
        while True:
            try:
                data, peer = self.sock.recvfrom(65536, socket.MSG_DONTWAIT)
            except (BlockingIOError, socket.timeout):
                return True
            except OSError:
                return not self._stop.is_set()
            self._handle(data, peer)

    def _handle(self, data: bytes, peer) -> None:
        """A non-zero rank: rank 0's reply, taken only if it is the job's, well formed and
        from rank 0's address."""
        if tuple(peer[:2]) != tuple(self.address):
            return self.drop(peer, f"not from rank 0 ({_where(self.address)})")
        msg = self._message(data, peer)
        if msg is None:
            return
        try:
            info = None if msg.get("i") is None else checked_info(msg["i"])
            verdict = None if not msg.get("v") else Verdict.from_json(msg["v"], self.size)
            if not isinstance(msg.get("f", False), bool):
                raise ValueError("not a reply")
        except (ValueError, AttributeError) as e:
            return self.drop(peer, str(e) or "not a reply")
        self.monitor.replied(info, finished=msg.get("f", False))
        if verdict is not None and self._verdict is None:
            # not at once: a peer still waiting for its reply would see this rank's exit
            # (Gloo aborts) before it hears the verdict
            self._decide(verdict, grace=self.interval + 0.5)

    def _decide(self, verdict: Verdict, grace: float):
        with self._lock:
            if self._verdict is not None:
                return
            self._verdict = verdict
        self._got_verdict.set()
        if self._defer_exit:
            return  # the main thread reports it with its own error
        print(self.line(verdict), file=sys.stderr, flush=True)
        if grace <= 0:
            self._exit(EXIT_STATUS)
        else:
            threading.Thread(target=self._exit_later, args=(grace,), daemon=True).start()

    def line(self, verdict: Verdict) -> str:
        return (f"tftorus watchdog: {verdict.text}; rank {self.rank} was in "
                f"{describe_progress(_progress.as_dict())}; stopping")

    # -- main thread -----------------------------------------------------------------------------
    def wait_verdict(self, timeout: float) -> Optional[Verdict]:
        """The verdict, waiting up to `timeout` s for one (after a failed collective)."""
        self._defer_exit = True
        self._got_verdict.wait(timeout)
        if self._verdict is not None and self.rank == 0:
            time.sleep(2 * self.interval + 0.5)  # keep answering: the others learn it from us
        return self._verdict

    def stop(self):
        """This rank finished normally: tell rank 0 (or, on rank 0, the others) and stop."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self.rank == 0:
            for peer in list(self.peers.values()):
                self._send(self._status(), peer)
        else:
            for _ in range(3):  # loopback UDP does not drop, but a network might
                self._send({"r": self.rank, "i": _progress.as_dict(), "f": True}, self.address)
        self.thread.join(timeout=2 * self.interval + 1.0)
        self.sock.close()
        if self.dropped:
            print(f"tftorus watchdog (rank {self.rank}): {self.dropped} datagram"
                  f"{'s' * (self.dropped != 1)} dropped in all (not the job's, malformed or "
                  f"replayed)", file=sys.stderr, flush=True)


def _where(peer) -> str:
    try:
        return f"{peer[0]}:{peer[1]}"
    except (TypeError, IndexError):
        return repr(peer)


def _local_address_towards(address: Tuple[str, int]) -> str:
    """This host's address on the route to `address` (loopback for a loopback address)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(address)  # UDP: picks the route, sends nothing
        return probe.getsockname()[0]
    finally:
        probe.close()


# ------------------------------------------------------------------------------------------------
# Module-level API for the training script.
# ------------------------------------------------------------------------------------------------
_current: Optional[Watchdog] = None
_rank: Optional[int] = None  # this process' rank, once start() knows it


def _advertised_host(all_local: bool) -> str:
    host = os.environ.get(ENV_HOST, "").strip()
    if host:
        return socket.gethostbyname(host)
    if all_local:
        return "127.0.0.1"
    # horovodrun names each host as given in -H; else the machine's own name
    address = socket.gethostbyname(os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname())
    if address.startswith("127."):
        raise RuntimeError(
            f"the watchdog of a multi-host job would listen on {address}, a loopback address "
            f"the other hosts cannot reach; set {ENV_HOST} to an address of rank 0's host that "
            f"they can reach")
    return address


def start(heartbeat_timeout: float, stall_timeout: float) -> Optional[Watchdog]:
    """Start this rank's watchdog (a collective: every rank calls it at the same point).
    Nothing to watch in a world of one."""
    global _current, _rank
    import tensorflow as tf

    from tftorus.runtime import process_state, world
    from tftorus.runtime.stack import hvd

    if heartbeat_timeout <= 0 or stall_timeout <= 0:
        raise ValueError("the watchdog's heartbeat and stall timeouts must be > 0 seconds")
    rank, size = world.rank(), world.size()
    _rank = rank
    if size == 1:
        return None
    local_size = (hvd.local_size() if process_state.horovod_running()
                  else process_state.communicator().local_size)
    key = job_secret.load()
    sock = None
    mine = [0] * 5
    if rank == 0:
        host = _advertised_host(local_size == size)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind((host, 0))  # the advertised address only (loopback on one host)
        except OSError as e:
            raise RuntimeError(f"the watchdog cannot listen on {host} ({e.strerror}): set "
                               f"{ENV_HOST} to an address of rank 0's host") from None
        mine = [int(x) for x in host.split(".")] + [sock.getsockname()[1]]
    # Only rank 0 adds its address: the sum is rank 0's address on every rank. Every rank
    # adds its secret's fingerprint (and 1 if it has none): equal sums on every rank or a
    # rank was started with another secret.
    fingerprint = job_secret.fingerprint(key)
    got = world.allreduce_sum(tf.constant(mine + [fingerprint, int(key is None)], tf.int32),
                              name="tftorus_watchdog_address")
    got = [int(x) for x in got.numpy()]
    address = (".".join(str(x) for x in got[:4]), got[4])
    check_same_secret(rank, size, key, got[5], got[6])
    _current = Watchdog(rank, size, address, heartbeat_timeout, stall_timeout, sock=sock,
                        seal=job_secret.Seal(key)).start()
    if process_state.horovod_running():
        install_terminate_hook()
    return _current


def check_same_secret(rank: int, size: int, key: Optional[bytes], fingerprints: int,
                      without: int) -> None:
    """From the sums of every rank's secret fingerprint and of the ranks without a secret:
    stop this rank with one line if its secret is not the others', and on rank 0 say once that
    a job without one has unauthenticated control traffic."""
    if fingerprints != size * job_secret.fingerprint(key):
        raise ValueError(
            f"tftorus: the ranks were started with different job secrets ({without} of {size} "
            f"with none; rank {rank} with {'none' if key is None else 'one'}): give every rank "
            f"the same {job_secret.ENV} or {job_secret.ENV_FILE} (python -m tftorus.run does)")
    if key is None and rank == 0:
        job_secret.warn_unauthenticated("the watchdog's control traffic")


# ------------------------------------------------------------------------------------------------
# Horovod's background thread dying on a lost peer.
# ------------------------------------------------------------------------------------------------
_TERMINATE_HANDLER = ctypes.CFUNCTYPE(None)
_terminate_hook = None  # (our handler, the one it replaced): kept alive for the process


def install_terminate_hook() -> bool:
    """When a peer dies, Gloo throws in Horovod's background thread, nothing catches it, and
    std::terminate aborts the process within milliseconds: before the watchdog or the launcher's
    SIGTERM can say who was lost. This C++ terminate handler says what this rank was doing,
    then gives them that time (the heartbeat timeout and a little more) before the usual abort,
    which still prints the C++ error. Returns False where libstdc++ cannot be reached."""
    global _terminate_hook
    if _terminate_hook is not None:
        return True
    try:
        set_terminate = ctypes.CDLL("libstdc++.so.6")._ZSt13set_terminatePFvvE
    except (OSError, AttributeError):
        return False
    set_terminate.restype = ctypes.c_void_p
    set_terminate.argtypes = [_TERMINATE_HANDLER]

    def on_terminate():
        dog = _current
        who = _rank if _rank is not None else os.environ.get("HOROVOD_RANK", "?")
        print(f"tftorus: rank {who} lost a Horovod connection (a peer died or closed it) "
              f"while in {describe_progress(_progress.as_dict())}; waiting for the watchdog to "
              f"name the lost rank", file=sys.stderr, flush=True)
        if dog is not None:  # its verdict, or the launcher's SIGTERM, ends the process
            dog._got_verdict.wait(dog.heartbeat_timeout + 3 * dog.interval + 2.0)
            time.sleep(2 * dog.interval + 1.0)
        previous = _terminate_hook[1]
        if previous:
            _TERMINATE_HANDLER(previous)()  # libstdc++'s: prints the exception, aborts
        os.abort()

    handler = _TERMINATE_HANDLER(on_terminate)
    _terminate_hook = (handler, None)
    _terminate_hook = (handler, set_terminate(handler))
    return True


def stop() -> None:
    """Call before the final shutdown: a normal end is never reported as a loss."""
    global _current
    if _current is not None:
        _current.stop()
        _current = None


def verdict_after_failure(timeout: Optional[float] = None) -> Optional[str]:
    """After a failed collective: the watchdog's verdict (who was lost), waiting up to `timeout`
    (default: long enough for a verdict on a peer that died just now: the heartbeat timeout, a
    heartbeat interval or two and rank 0's answer). The watchdog then leaves the exit to the
    caller."""
    if _current is None:
        return None
    if timeout is None:
        timeout = _current.heartbeat_timeout + 3 * _current.interval + 2.0
    found = _current.wait_verdict(timeout)
    return found.text if found else None


def current() -> Optional[Watchdog]:
    return _current


# ------------------------------------------------------------------------------------------------
# The launcher's SIGTERM.
# ------------------------------------------------------------------------------------------------
TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def block_termination_signals() -> None:
    """Block SIGTERM/SIGINT in this (main) thread; call before TensorFlow starts any thread so
    every thread inherits the mask and only `handle_termination`'s thread receives them."""
    signal.pthread_sigmask(signal.SIG_BLOCK, TERMINATION_SIGNALS)


def handle_termination() -> Optional[threading.Thread]:
    """Start a thread that waits for SIGTERM/SIGINT (blocked beforehand) and exits with one line
    saying what this rank was doing. Nothing to do if the signals are not blocked."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if not all(s in blocked for s in TERMINATION_SIGNALS):
        return None

    def wait():
        sig = signal.sigwait(TERMINATION_SIGNALS)
        if _current is not None and _current._verdict is not None:
            os._exit(EXIT_STATUS)  # the watchdog already said why the job stops
        who = _rank if _rank is not None else os.environ.get("HOROVOD_RANK", "?")
        name = signal.Signals(sig).name
        cause = ("the launcher stops the job, usually because another worker failed: see its "
                 "'Process N exit with status code' line" if sig == signal.SIGTERM else
                 "interrupted")
        print(f"tftorus: rank {who} got {name} ({cause}) while in "
              f"{describe_progress(_progress.as_dict())}; stopping", file=sys.stderr, flush=True)
        os._exit(128 + sig)

    thread = threading.Thread(target=wait, name="tftorus-signals", daemon=True)
    thread.start()
    return thread
