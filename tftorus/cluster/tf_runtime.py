"""Start TensorFlow's collective runtime for the "tf" engine over the cluster that
tftorus/cluster/discovery.py finds: `bootstrap()`.

TensorFlow fixes its cluster when its eager context starts (the first tensor, device query or
tf.function call), so `bootstrap()` must run before anything else touches TF's runtime; it
raises a RuntimeError naming the fix when it comes too late. Once the cluster is known, a
process that srun, mpirun or a TF_CONFIG started also gets horovodrun's HOROVOD_* variables.

No coordination service (tf.distribute starts one, with its own start-up registration and
shutdown barrier): the engine's peer probes (tftorus/engines/peer_health.py; TFTORUS_TF_TIMEOUT,
default 300 s) already turn a dead peer into an error on every survivor. Measured: a peer SIGKILLed
mid-collective fails the survivors' collective at once ("Connection reset by peer"); one that
dies before a collective or stops is found by the probes.
Task 0 is TF's collective leader: it resolves every group and every new instance key.
"""
import logging
import os
from typing import Dict, Optional

from tftorus.cluster import gpu_per_process
from tftorus.cluster.discovery import (JOB, Cluster, discover, host_names,
                                       launched, split_address)
from tftorus.launch import rank_layout  # the launcher's HOROVOD_* variables (stdlib only)

logger = logging.getLogger(__name__)

_cluster: Optional[Cluster] = None  # started


def current() -> Optional[Cluster]:
    """The cluster `bootstrap()` started, or None."""
    return _cluster


def _context_started() -> bool:
    from tensorflow.python.eager import context
    return context.context()._context_handle is not None  # no public accessor in TF 2.15


def check_not_started() -> None:
    """Raise if TF's runtime already runs here and a launcher says there is a cluster to join:
    it can then no longer join it. A process started alone has none, so anything goes."""
    if _cluster is None and launched() and _context_started():
        raise RuntimeError(
            "TensorFlow's runtime already started in this process (a tensor, device query or "
            "tf.function ran), so its collective ops can no longer join a cluster. Call "
            "tftorus.init(engine='tf') (or tftorus.cluster.tf_runtime.bootstrap()) at program "
            "start, before any other TensorFlow call")


def bootstrap(host: Optional[str] = None, port: Optional[int] = None,
              timeout: Optional[float] = None, rendezvous_timeout: float = 300.0) -> Cluster:
    """Find the cluster and start this process' TF server with collective ops enabled.

    host: the address peers reach this process at (default: TFTORUS_TF_HOST, else loopback on
      one machine, else HOROVOD_HOSTNAME, the host name (mpirun) or the node's name (srun)).
      Ignored with TF_CONFIG, which names every address.
    port: base port; the server listens on port + local rank (default: TFTORUS_TF_PORT, else a
      free port under horovodrun and mpirun's rendezvous, else discovery.DEFAULT_PORT). Ignored with
      TF_CONFIG.
    timeout: seconds a peer may answer no probe before this process' collectives are aborted,
      and an eager collective's own timeout (default: TFTORUS_TF_TIMEOUT or 300). A dead or
      stopped peer surfaces as an error, not as a hang.
    Idempotent: a second call returns the running cluster.
    """
    global _cluster
    if _cluster is not None:
        return _cluster
    check_not_started()
    cluster = discover(host, port, timeout, rendezvous_timeout)
    # Horovod's GPU-pinning lines, while TF still lets a process choose (gpu_per_process.py)
    gpu_per_process.pin(cluster.local_rank, cluster.local_size, cluster.size)
    if cluster.size > 1:
        _start_server(cluster)
    _cluster = cluster
    publish_horovod_variables(cluster)
    logger.info("tftorus tf engine: rank %d of %d (%s), servers %s", cluster.rank, cluster.size,
                cluster.source, ",".join(cluster.workers))
    return cluster


def horovod_variables(cluster: Cluster) -> Dict[str, str]:
    """horovodrun's HOROVOD_* values for this rank (tftorus.launch.rank_layout.horovod_variables):
    each rank's
    host from its address, loopback names as one host, "localhost" (horovodrun's name for it).
    Where that disagrees with the launcher's own local rank or size (mpirun across "hosts" that
    share one TFTORUS_TF_HOST), the launcher's wins: hosts of local_size ranks each, in rank
    order (Open MPI's default mapping)."""
    hosts = host_names(cluster.workers)
    values = rank_layout.horovod_variables(hosts, cluster.rank)
    if (int(values["HOROVOD_LOCAL_RANK"]), int(values["HOROVOD_LOCAL_SIZE"])) != \
            (cluster.local_rank, cluster.local_size):
        blocks = [f"host{r // cluster.local_size}" for r in range(cluster.size)]
        values = {**rank_layout.horovod_variables(blocks, cluster.rank),
                  "HOROVOD_HOSTNAME": hosts[cluster.rank]}
    return values


def publish_horovod_variables(cluster: Cluster) -> None:
    """Put horovodrun's HOROVOD_* variables into os.environ where they are absent, when a
    process that srun, mpirun or a TF_CONFIG started (no tftorus.run, no horovodrun, which set
    them for their children) joins its cluster at init.

    Why: scripts written for horovodrun read them (os.environ["HOROVOD_RANK"] to name a log
    file, pick a data shard, or only let rank 0 write), and such a script should run unchanged
    whatever started it. They can only appear at init, which finds the cluster, so a script
    sees them from tftorus.init() on, as its subprocesses do. A value already there (the user's,
    a launcher's) is kept. A process started alone gets none (horovodrun gives none there
    either)."""
    if cluster.source in ("single", "horovodrun"):
        return
    for name, value in horovod_variables(cluster).items():
        os.environ.setdefault(name, value)


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
        task_index=cluster.rank, protocol="grpc", port=split_address(cluster.workers[cluster.rank])[1])
    ctx.enable_collective_ops(server_def)
    ctx.ensure_initialized()  # starts the gRPC server now, so peers can reach it
