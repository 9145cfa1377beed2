"""The job's secret: a key every rank of one job holds, and the seal on its control traffic.

tftorus' own control messages (the watchdog's UDP heartbeats and verdicts, the mpirun rendezvous,
the tf engine's addresses passed through Horovod's key-value store) travel on sockets anyone on
the network can reach. Each is sealed with an HMAC-SHA256 under the job's secret, a timestamp and
a random nonce; a receiver opens it only if the MAC is right, the timestamp is within `WINDOW`
seconds of its own clock and the nonce was not seen in that window (a replayed packet is a seen
nonce, or an old timestamp). Whatever fails is dropped and counted by the caller, never acted on.

Where the secret comes from: `python -m tftorus.run` (and run_experiment.py) make one per job
and hand it to their ranks in TFTORUS_JOB_SECRET. Where a scheduler starts the ranks (srun,
mpirun, a TF_CONFIG, horovodrun) the user gives it the same way, or names a file that holds it
in TFTORUS_JOB_SECRET_FILE (`python -m tftorus.run --make-secret` prints a new one). Without one
the seal is the plain message and rank 0 says once that the control traffic is unauthenticated.

What it cannot cover: TensorFlow's gRPC servers and the collectives themselves (they trust every
member of the cluster; run them on a network only the job's hosts reach: docs/guide/security.md).
"""
import collections
import hashlib
import hmac
import json
import os
import secrets
import struct
import sys
import threading
import time
from typing import Callable, Mapping, Optional

ENV = "TFTORUS_JOB_SECRET"
ENV_FILE = "TFTORUS_JOB_SECRET_FILE"
KEY_BYTES = 32
MIN_KEY_BYTES = 16
#: how far a sender's clock may be from the receiver's, and how long nonces are remembered
WINDOW = 120.0
_HEADER = struct.Struct("!d16s")  # sender's wall time, nonce
_MAC = hashlib.sha256().digest_size


def make() -> str:
    """A new secret, as the hex text TFTORUS_JOB_SECRET takes."""
    return secrets.token_hex(KEY_BYTES)


def load(environ: Mapping[str, str] = os.environ) -> Optional[bytes]:
    """The job's key from TFTORUS_JOB_SECRET (hex) or the file TFTORUS_JOB_SECRET_FILE names;
    None when neither is set. A malformed value raises ValueError saying what to write."""
    text = environ.get(ENV, "").strip()
    path = environ.get(ENV_FILE, "").strip()
    if text and path:
        raise ValueError(f"set {ENV} or {ENV_FILE}, not both")
    if path:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError as e:
            raise ValueError(f"{ENV_FILE}={path}: cannot read it ({e.strerror}); name a file "
                             f"that holds the job's secret (python -m tftorus.run "
                             f"--make-secret > FILE)") from None
        where = f"the file {path} ({ENV_FILE})"
    else:
        where = ENV
    if not text:
        return None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{where} must hold at least {2 * MIN_KEY_BYTES} hex digits (a secret "
                         f"of {MIN_KEY_BYTES}+ bytes); `python -m tftorus.run --make-secret` "
                         f"prints one")
    return key


_warned = set()


def warn_unauthenticated(what: str) -> None:
    """Say once per process (call it on rank 0) that `what` runs without a job secret."""
    if what in _warned:
        return
    _warned.add(what)
    print(f"tftorus: no job secret ({ENV}): {what} is unauthenticated, and anyone who "
          f"reaches this job's hosts can stop or confuse it (docs/guide/security.md)",
          file=sys.stderr, flush=True)


def fingerprint(key: Optional[bytes]) -> int:
    """16 bits that tell keys apart (0: no key), safe to share: ranks compare them at start-up
    to find a rank started with another secret or none."""
    if key is None:
        return 0
    return 1 + int.from_bytes(hmac.new(key, b"tftorus fingerprint", "sha256").digest()[:2],
                              "big") % 0xFFFF


class Seal:
    """Seals and opens messages under one key (None: plain messages, nothing checked)."""

    def __init__(self, key: Optional[bytes], window: float = WINDOW,
                 clock: Callable[[], float] = time.time):
        self.key, self.window, self.clock = key, window, clock
        self._seen = collections.OrderedDict()  # nonce -> time it came, oldest first
        self._lock = threading.Lock()

    @property
    def authenticated(self) -> bool:
        return self.key is not None

    def seal(self, message: bytes) -> bytes:
        if self.key is None:
            return message
        header = _HEADER.pack(self.clock(), secrets.token_bytes(16))
        return hmac.new(self.key, header + message, "sha256").digest() + header + message

    def open(self, data: bytes) -> Optional[bytes]:
        """The message, or None when it fails: wrong MAC, too old or new, or seen before."""
        return self.check(data)[0]

    def check(self, data: bytes):
        """(message, None) or (None, why it was refused)."""
        if self.key is None:
            return data, None
        start = _MAC + _HEADER.size
        if len(data) < start:
            return None, "too short to carry the job's seal"
        mac, header, message = data[:_MAC], data[_MAC:start], data[start:]
        if not hmac.compare_digest(mac, hmac.new(self.key, header + message, "sha256").digest()):
            return None, "not sealed with the job's secret"
        sent, nonce = _HEADER.unpack(header)
        now = self.clock()
        if not abs(now - sent) <= self.window:  # also refuses NaN
            return None, (f"sent {now - sent:+.0f} s from this host's clock (more than "
                          f"{self.window:g} s: a replay, or clocks apart)")
        with self._lock:
            while self._seen and next(iter(self._seen.values())) < now - 2 * self.window:
                self._seen.popitem(last=False)
            if nonce in self._seen:
                return None, "a replay of a message already taken"
            self._seen[nonce] = now
        return message, None

    def seal_json(self, message: dict) -> bytes:
        """`message` as JSON, sealed, in hex: ASCII with no line break (a line of a text
        protocol, a value in an HTTP store)."""
        return self.seal(json.dumps(message).encode()).hex().encode()

    def open_json(self, data: bytes):
        """(the JSON object `seal_json` made, None) or (None, why it was refused)."""
        try:
            raw = bytes.fromhex(data.decode("ascii").strip())
        except ValueError:
            return None, "not a tftorus message"
        message, why = self.check(raw)
        if message is None:
            return None, why
        try:
            message = json.loads(message)
        except Exception:  # RecursionError, bad UTF-8: whatever it held
            return None, "not JSON"
        return (message, None) if isinstance(message, dict) else (None, "not a JSON object")

