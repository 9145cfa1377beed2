"""The tests' Ray cluster on this machine: a head with no CPUs (the driver's node, where the
commit store lives) and two worker nodes of 2 logical CPUs, joined by this process."""
import contextlib
import os
import shutil


# How Ray's GCS finds a lost node dead: by default after 5 failed health checks 3 s apart, each
# allowed 10 s (15-50 s after a loss), while Ray Train still counts the node's CPUs and waits for a world of
# the old size. Here checks 1 s apart, each allowed 2 s: a removed node is dead within about 5 s;
# a live one would have to miss 5 checks in a row.
HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_timeout_ms": 2000,
                 "health_check_failure_threshold": 5}


@contextlib.contextmanager
def three_nodes(work_dir: str):
    """Yields (cluster, [worker node, worker node]); ends Ray and removes work_dir after."""
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 0, "include_dashboard": False,
                                      "_system_config": HEALTH_CHECKS})
    try:
        nodes = [cluster.add_node(num_cpus=2) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=True)
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()
        if os.path.isdir(work_dir):
            shutil.rmtree(work_dir, ignore_errors=True)
