"""The tests' Ray cluster on this machine: a head with no CPUs (the driver's node, where the
commit store lives) and two worker nodes of 2 logical CPUs, joined by this process."""
import contextlib
import os
import shutil


@contextlib.contextmanager
def three_nodes(work_dir: str):
    """Yields (cluster, [worker node, worker node]); ends Ray and removes work_dir after."""
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 0, "include_dashboard": False})
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
