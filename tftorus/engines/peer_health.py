"""Lost peers on the tf engine: one thread per process probes its peers' TF servers and aborts
this process' collectives when one is gone, so a dead or stopped peer becomes an error on every
survivor instead of a hang.

Why not TF's per-op timeout: every collective given `timeout_seconds` starts TF's own timer for
it, and that timer holds two threads asleep for the whole timeout (measured on TF 2.15 and
2.21: 1,000 collectives with a timeout added 2,000 threads to the process, gone once the
timeout had passed; without one, none). A training step sends tens to hundreds of collectives
(buckets, chunks, the 16-bit wire's all-to-all and all-gather), so a 300 s timeout held
4,400-8,100 threads per rank and crashed a 4-rank job at the kernel's thread limit. The engine
therefore gives TF's timeout only to eager collectives, at most 64 at once (start-up, barriers,
broadcasts), and this monitor, which is what MultiWorkerMirroredStrategy does too, covers the
rest.

What it detects, and when (timeout: TFTORUS_TF_TIMEOUT, the cluster's collective timeout):
  - a peer whose server refuses connections (its process died): after MISSES_WHEN_REFUSED
    probes in a row, one interval apart;
  - a peer that answers no probe (stopped, hung in native code, host down or cut off): after
    `timeout` seconds without an answer;
  - a peer that restarted (a new process at the same address): at once.
A peer that never answered is given `timeout` seconds from the monitor's start to come up, and
the engine waits for every peer's first answer before its first collective (wait_until_up).
A peer that is alive but never enters a collective (stuck in Python, or running other code) is
not seen here: run_scripts/train.py's watchdog (tftorus/reliability/watchdog.py) catches that in
training.

The abort fails every collective under way and every later one, with this module's message
naming the lost rank; the engine then raises CollectiveError (see tf_engine).
"""
import logging
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional

from tensorflow.python.eager import context
from tensorflow.python.framework import errors

logger = logging.getLogger(__name__)

MARK = "tftorus peer check"  # starts every abort message (tf_engine.explain keys on it)
MISSES_WHEN_REFUSED = 3
#: Longest wait for one probe's answer. TF's probe holds Python's GIL while it waits (its
#: binding does not release it; measured: a probe of a stopped peer with a 3 s timeout let
#: another thread run once in those 3 s), so a silent peer's probe stops every Python thread of
#: this process (the watchdog's heartbeats, Keras' callbacks) for its whole timeout. A loss is
#: decided by `timeout` seconds without an answer, however many short probes that takes.
PROBE_TIMEOUT = 0.2
START_POLL = 0.1  # seconds between start-up probes of a peer not up yet
ALL_PEERS_UP_TO = 64  # beyond this world size, probe only the peers this rank talks to


def probe_interval(timeout: float) -> float:
    """Seconds between rounds of probes: a tenth of the timeout, within 0.5-5 s."""
    return min(5.0, max(0.5, timeout / 10.0))


def peers_to_probe(rank: int, size: int, groups: Iterable[Iterable[int]]) -> list:
    """Every other rank in worlds of up to ALL_PEERS_UP_TO; beyond, the members of this rank's
    groups that are not the whole world (its row and column) and its two ring neighbours. A
    loss elsewhere still reaches this rank: the peer that notices aborts, and its pending
    exchanges with its own peers fail in turn."""
    if size <= ALL_PEERS_UP_TO:
        return [r for r in range(size) if r != rank]
    near = {(rank - 1) % size, (rank + 1) % size}
    for g in groups:
        g = tuple(g)
        if rank in g and len(g) < size:
            near.update(g)
    near.discard(rank)
    return sorted(near)


class PeerHealthMonitor:
    """Probe `peers` (ranks) with TF's collective peer health check; abort on a lost one."""

    def __init__(self, peers: Iterable[int], task_of: Callable[[int], str],
                 address_of: Callable[[int], str], timeout: float,
                 interval: Optional[float] = None, clock=time.monotonic,
                 probe: Optional[Callable[[str, int], None]] = None,
                 abort: Optional[Callable[[str], None]] = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.peers = list(peers)
        self._task_of, self._address_of = task_of, address_of
        self.timeout = float(timeout)
        self.interval = probe_interval(self.timeout) if interval is None else float(interval)
        self._clock, self._sleep = clock, sleep
        self._probe = probe or (lambda task, ms:
                                context.context().check_collective_ops_peer_health(task, ms))
        self._abort = abort or (lambda message:
                                context.context().abort_collective_ops(errors.UNAVAILABLE,
                                                                       message))
        start = clock()
        self._last_answer: Dict[int, Optional[float]] = {p: None for p in self.peers}
        self._refusals: Dict[int, int] = {p: 0 for p in self.peers}
        self._started = start
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.lost: Optional[str] = None  # the abort message, once a peer is lost

    # -- start-up: every peer's server up before the first collective ----------------------

    def wait_until_up(self) -> Optional[str]:
        """Probe until every peer has answered once, for at most `timeout` seconds from the
        monitor's start. Returns None, or a message naming the peers that never answered.

        Why before the first collective: TF sends a collective's data (RecvBuf) as fail-fast
        gRPC calls (GRPC_FAIL_FAST=use_caller, TF's default), and a connection refused before
        the peer listened leaves the channel in gRPC's reconnect back-off, in which such a
        call fails at once and TF aborts the collective executor. Probes sent before a peer
        is up are such refusals; probing again until each peer answers leaves every channel
        connected. Measured on TF 2.21 without this wait: a rank starting 2, 3 or 4 s after
        the other ended a 2-rank job at its first collective every time."""
        waiting: List[int] = list(self.peers)
        refused: Dict[int, bool] = {}
        while True:
            for peer in list(waiting):
                try:
                    self._probe(self._task_of(peer), self._probe_ms())
                except errors.OpError as e:
                    refused[peer] = isinstance(e, errors.UnavailableError)
                    continue
                self._last_answer[peer] = self._clock()
                waiting.remove(peer)
            if not waiting:
                return None
            elapsed = self._clock() - self._started
            if elapsed >= self.timeout:
                names = ", ".join(
                    f"rank {p} ({self._address_of(p)}, "
                    f"{'refused: not started or exited' if refused.get(p) else 'silent'})"
                    for p in waiting)
                return (f"{names} did not answer within {elapsed:.0f} s of this rank joining "
                        f"the cluster: start every process of the job with the same cluster "
                        f"(TF_CONFIG, launcher), check that this host reaches those addresses "
                        f"(firewall, TFTORUS_TF_HOST), or give slow starts more time with "
                        f"TFTORUS_TF_TIMEOUT (now {self.timeout:g} s)")
            self._sleep(START_POLL)

    # -- one round (the thread calls it; tests call it on a fake clock) ---------------------

    def check_once(self) -> Optional[str]:
        """Probe every peer once; abort and return the message when one is lost."""
        for peer in self.peers:
            if self._stop.is_set() or self.lost:
                break
            message = self._check_peer(peer)
            if message:
                self.lost = message
                logger.error(message)
                self._abort(message)
                return message
        return None

    def _check_peer(self, peer: int) -> Optional[str]:
        task = self._task_of(peer)
        try:
            self._probe(task, self._probe_ms())
        except errors.FailedPreconditionError:
            return self._message(peer, "restarted: a new process answers at its address, so "
                                       "its part of every collective is gone")
        except (errors.UnavailableError, errors.DeadlineExceededError, errors.AbortedError,
                errors.CancelledError, errors.UnknownError) as e:
            now = self._clock()
            refused = isinstance(e, errors.UnavailableError)
            self._refusals[peer] = self._refusals[peer] + 1 if refused else 0
            last = self._last_answer[peer]
            if last is not None and self._refusals[peer] >= MISSES_WHEN_REFUSED:
                return self._message(peer, f"refused {self._refusals[peer]} probes in a row "
                                           f"(its process died or its host is down)")
            since = last if last is not None else self._started
            if now - since >= self.timeout:
                what = ("answered no probe" if last is not None
                        else "never answered a probe since start-up")
                return self._message(peer, f"{what} for {now - since:.0f} s (the collective "
                                           f"timeout is {self.timeout:g} s: it died, is "
                                           f"stopped or hangs, or its host is cut off)")
            return None
        self._last_answer[peer] = self._clock()
        self._refusals[peer] = 0
        return None

    def _probe_ms(self) -> int:
        return max(1, int(min(self.interval, PROBE_TIMEOUT) * 1000))

    def _message(self, peer: int, what: str) -> str:
        return (f"{MARK}: rank {peer} lost: its TF server ({self._address_of(peer)}) {what}. "
                f"Collectives aborted on this rank.")

    # -- the thread -------------------------------------------------------------------------

    def start(self) -> "PeerHealthMonitor":
        if self.peers and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tftorus-peer-health",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.check_once():
                return
