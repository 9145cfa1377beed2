"""Start TensorFlow's collective runtime for the "tf" engine: find the cluster, then configure TF.

TensorFlow fixes its cluster when its eager context starts (the first tensor, device query or
tf.function call), so `bootstrap()` must run before anything else touches TF's runtime; it
raises a RuntimeError naming the fix when it comes too late. It finds the workers from

  TF_CONFIG    {"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}
               as tf.distribute reads it; rank = task index.
  horovodrun   HOROVOD_RANK / _SIZE / _LOCAL_RANK / _HOSTNAME and the Gloo rendezvous server
               (HOROVOD_GLOO_RENDEZVOUS_ADDR / _PORT). Each rank picks a port, publishes
               "host:port" in that server's key-value store, and reads everyone's. Horovod's own
               runtime is not started (hvd.init() stays the user's choice).
  neither      one process, no server: every group is a single rank and answered locally.

Addresses: TF's gRPC server listens on every interface of the port; what matters is the address
the *peers* dial, `host` (arg) or TFTORUS_TF_HOST, by default 127.0.0.1 when every rank is on
this machine and HOROVOD_HOSTNAME otherwise. The port is `port` / TFTORUS_TF_PORT plus the local
rank (unique per host, and it stays below 65536 however many hosts there are), or else a free
port picked by the OS.

No coordination service (tf.distribute starts one, with its own start-up registration and
shutdown barrier): the per-op collective timeout (TFTORUS_TF_TIMEOUT, default 300 s) already
turns a dead peer into an error on every survivor. Measured: a peer SIGKILLed mid-collective
fails the survivors' collective at once ("Connection reset by peer"); one that dies before a
collective fails it after the timeout ("Collective has timed out waiting for other workers").
Task 0 is TF's collective leader: it resolves every group and every new instance key.
"""
import dataclasses
import json
import logging
import os
import socket
import time
from typing import Optional, Tuple

logger = logging.getLogger(__name__)

JOB = "worker"
DEFAULT_TIMEOUT_SECONDS = 300.0
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "ip6-localhost")
_KV_SCOPE = "tftorus_tf_cluster"


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Where every rank's TF server listens, and which one this process is."""

    workers: Tuple[str, ...]  # "host:port" of rank 0, 1, ...
    rank: int
    local_rank: int
    local_size: int
    source: str  # 'TF_CONFIG', 'horovodrun' or 'single'
    timeout: float  # seconds any one collective may take before it fails

    @property
    def size(self) -> int:
        return len(self.workers)

    def task(self, rank: int) -> str:
        return f"/job:{JOB}/replica:0/task:{rank}"

    @property
    def device(self) -> str:
        """This process' CPU device, the one every collective of the engine runs on."""
        return f"{self.task(self.rank)}/device:CPU:0"


_cluster: Optional[Cluster] = None  # started
_discovered: Optional[Cluster] = None


def current() -> Optional[Cluster]:
    """The cluster `bootstrap()` started, or None."""
    return _cluster


def _context_started() -> bool:
    from tensorflow.python.eager import context
    return context.context()._context_handle is not None  # no public accessor in TF 2.15


def check_not_started() -> None:
    """Raise if TF's runtime already runs here: it can then no longer join a cluster."""
    if _cluster is None and _context_started():
        raise RuntimeError(
            "TensorFlow's runtime already started in this process (a tensor, device query or "
            "tf.function ran), so its collective ops can no longer join a cluster. Call "
            "tftorus.init(engine='tf') (or tftorus.tf_cluster.bootstrap()) at program start, "
            "before any other TensorFlow call")


def _float_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None


def _int_env(name: str) -> Optional[int]:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise ValueError(f"{name}={raw!r} is not a port number")
    return int(raw)


def _free_port(host: str) -> int:
    # The port is free now; TF's server binds it moments later. The gap is small, and a base
    # port (TFTORUS_TF_PORT) avoids it where ports are firewalled or contended.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(("" if family == socket.AF_INET else "::", 0))
        return s.getsockname()[1]


def _split(address: str) -> Tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"worker address {address!r} is not 'host:port'")
    return host.strip("[]"), int(port)


def _local_ranks(workers, rank) -> Tuple[int, int]:
    """(local rank, local size): tasks sharing this task's host name."""
    hosts = [_split(w)[0] for w in workers]
    mine = hosts[rank]
    same = [i for i, h in enumerate(hosts) if h == mine or
            (h in _LOOPBACK_NAMES and mine in _LOOPBACK_NAMES)]
    return same.index(rank), len(same)


def from_tf_config(raw: str, timeout: float) -> Cluster:
    try:
        config = json.loads(raw)
        workers = tuple(config["cluster"][JOB])
        task = config.get("task", {})
        task_type, index = task.get("type", JOB), int(task["index"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"TF_CONFIG must look like {{\"cluster\": {{\"worker\": [\"host:port\", ...]}}, "
            f"\"task\": {{\"type\": \"worker\", \"index\": i}}}}; could not read it ({e!r})") from e
    other_jobs = sorted(set(config["cluster"]) - {JOB})
    if task_type != JOB or other_jobs:
        raise ValueError(f"the tf engine runs one job named 'worker' (rank = task index); "
                         f"TF_CONFIG has task type {task_type!r} and jobs {other_jobs}")
    if not 0 <= index < len(workers):
        raise ValueError(f"TF_CONFIG task index {index} is outside the {len(workers)} workers")
    for w in workers:
        _split(w)
    local_rank, local_size = _local_ranks(workers, index)
    return Cluster(workers, index, local_rank, local_size, "TF_CONFIG", timeout)


def _horovod_env(name: str) -> int:
    raw = os.environ.get(name, "")
    if not raw.strip().isdigit():
        raise RuntimeError(f"{name} is {raw!r}: the tf engine under horovodrun needs the "
                           f"variables horovodrun sets (HOROVOD_RANK, HOROVOD_SIZE, ...)")
    return int(raw)


def from_horovodrun(host: Optional[str], port: Optional[int], timeout: float,
                    rendezvous_timeout: float) -> Cluster:
    """Swap addresses through horovodrun's rendezvous key-value store (HTTP PUT/GET)."""
    from horovod.runner.http.http_client import put_data_into_kvstore, read_data_from_kvstore

    rank, size = _horovod_env("HOROVOD_RANK"), _horovod_env("HOROVOD_SIZE")
    local_rank = _horovod_env("HOROVOD_LOCAL_RANK")
    local_size = int(os.environ.get("HOROVOD_LOCAL_SIZE", "0") or 0) or size
    addr = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    kv_port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    if not addr or not kv_port:
        raise RuntimeError("HOROVOD_RANK is set but HOROVOD_GLOO_RENDEZVOUS_ADDR/_PORT are not: "
                           "launch with `horovodrun --gloo`, or give every process a TF_CONFIG")
    hostname = os.environ.get("HOROVOD_HOSTNAME", "localhost")
    if host is None:
        single_host = local_size == size or hostname in _LOOPBACK_NAMES
        host = "127.0.0.1" if single_host else hostname
    my_port = port + local_rank if port is not None else _free_port(host)
    me = f"[{host}]:{my_port}" if ":" in host else f"{host}:{my_port}"
    put_data_into_kvstore(addr, kv_port, _KV_SCOPE, str(rank), me)
    workers, deadline = [], time.monotonic() + rendezvous_timeout
    for r in range(size):
        while True:
            try:
                workers.append(read_data_from_kvstore(addr, kv_port, _KV_SCOPE, str(r)))
                break
            except RuntimeError:  # 404 until rank r has published
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"rank {rank}: rank {r} did not publish its TF server address within "
                        f"{rendezvous_timeout:.0f}s (did it call tftorus.init(engine='tf')?)")
                time.sleep(0.05)
    return Cluster(tuple(workers), rank, local_rank, local_size, "horovodrun", timeout)


def discover(host: Optional[str] = None, port: Optional[int] = None,
             timeout: Optional[float] = None, rendezvous_timeout: float = 300.0) -> Cluster:
    """Find the cluster (no TF runtime involved): TF_CONFIG, else horovodrun, else one process.

    The first discovery is kept and returned by later calls: under horovodrun a second one
    would publish a second port while peers may already have read the first.
    """
    global _discovered
    if _discovered is None:
        _discovered = _discover(host, port, timeout, rendezvous_timeout)
    return _discovered


def _discover(host, port, timeout, rendezvous_timeout) -> Cluster:
    timeout = timeout if timeout is not None else _float_env("TFTORUS_TF_TIMEOUT",
                                                             DEFAULT_TIMEOUT_SECONDS)
    if timeout <= 0:
        raise ValueError(f"the collective timeout must be > 0 seconds, got {timeout}")
    host = host or os.environ.get("TFTORUS_TF_HOST") or None
    port = port if port is not None else _int_env("TFTORUS_TF_PORT")
    if os.environ.get("TF_CONFIG", "").strip():
        return from_tf_config(os.environ["TF_CONFIG"], timeout)
    if os.environ.get("HOROVOD_RANK", "").strip():
        return from_horovodrun(host, port, timeout, rendezvous_timeout)
    return Cluster(("localhost:0",), 0, 0, 1, "single", timeout)


def bootstrap(host: Optional[str] = None, port: Optional[int] = None,
              timeout: Optional[float] = None, rendezvous_timeout: float = 300.0) -> Cluster:
    """Find the cluster and start this process' TF server with collective ops enabled.

    host: the address peers reach this process at (default: TFTORUS_TF_HOST, else loopback on
      one machine, else HOROVOD_HOSTNAME). Ignored with TF_CONFIG, which names every address.
    port: base port; the server listens on port + local rank (default: TFTORUS_TF_PORT, else a
      free port). Ignored with TF_CONFIG.
    timeout: seconds one collective may take before it fails (default: TFTORUS_TF_TIMEOUT or
      300). A dead or stuck peer surfaces as an error after this long, not as a hang.
    Idempotent: a second call returns the running cluster.
    """
    global _cluster
    if _cluster is not None:
        return _cluster
    check_not_started()
    cluster = discover(host, port, timeout, rendezvous_timeout)
    if cluster.size > 1:
        _start_server(cluster)
    _cluster = cluster
    logger.info("tftorus tf engine: rank %d of %d (%s), servers %s", cluster.rank, cluster.size,
                cluster.source, ",".join(cluster.workers))
    return cluster


def _start_server(cluster: Cluster) -> None:
    from tensorflow.core.protobuf import cluster_pb2, tensorflow_server_pb2
    from tensorflow.python.eager import context

    ctx = context.context()
    # Task 0 resolves every group (members and their devices); a filter keeps each task from
    # contacting every other one at start-up, as tf.distribute's multi-worker strategy does.
    ctx.configure_collective_ops(
        collective_leader=cluster.task(0),
        scoped_allocator_enabled_ops=("CollectiveReduce",),
        device_filters=(f"/job:{JOB}/task:{cluster.rank}",))
    cluster_def = cluster_pb2.ClusterDef()
    job = cluster_def.job.add(name=JOB)
    for i, address in enumerate(cluster.workers):
        job.tasks[i] = address
    server_def = tensorflow_server_pb2.ServerDef(
        cluster=cluster_def, default_session_config=ctx.config, job_name=JOB,
        task_index=cluster.rank, protocol="grpc", port=_split(cluster.workers[cluster.rank])[1])
    ctx.enable_collective_ops(server_def)
    ctx.ensure_initialized()  # starts the gRPC server now, so peers can reach it
