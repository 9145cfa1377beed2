"""One world of ranks on Ray: a placement group, an actor per rank (worker.py), and the
environment that makes them one tf-engine cluster (TF_CONFIG naming every rank's node address
and a free port there, the job's secret, the user's extra variables).

Ranks are numbered node by node (a node's ranks are consecutive, so local ranks are Horovod's),
in the order Ray placed the bundles. A worker with GPUs gets them from Ray, which sets its
CUDA_VISIBLE_DEVICES to its own; tftorus then uses the one it sees (cluster/gpu_per_process.py).
"""
import dataclasses
import json
from typing import List, Optional

from tftorus.cluster.discovery import JOB, join_address
from tftorus.launch import job_secret
from tftorus.on_ray.ray_module import ray
from tftorus.on_ray.worker import Worker


@dataclasses.dataclass(frozen=True)
class Resources:
    cpus_per_worker: float = 1
    gpus_per_worker: float = 0

    def bundle(self, workers: int = 1) -> dict:
        b = {"CPU": self.cpus_per_worker * workers}
        if self.gpus_per_worker:
            b["GPU"] = self.gpus_per_worker * workers
        return b

    def slots(self, node_resources: dict) -> int:
        """How many workers a node of these total resources holds."""
        n = int(node_resources.get("CPU", 0) // self.cpus_per_worker) \
            if self.cpus_per_worker else 1 << 30
        if self.gpus_per_worker:
            n = min(n, int(node_resources.get("GPU", 0) // self.gpus_per_worker))
        return n


def actor_options(resources: Resources, placement_group, bundle_index: int) -> dict:
    """Ray's options for one rank's actor: its CPUs and GPUs, in its bundle."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    return {"num_cpus": resources.cpus_per_worker, "num_gpus": resources.gpus_per_worker,
            "max_restarts": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group, placement_group_bundle_index=bundle_index)}


def cluster_spec(places: List[dict], rank: int) -> str:
    """TF_CONFIG for `rank` over the workers at `places` (in rank order)."""
    workers = [join_address(p["ip"], p["port"]) for p in places]
    return json.dumps({"cluster": {JOB: workers}, "task": {"type": JOB, "index": rank}})


class WorkerGroup:
    """`size` ranks as Ray actors, placed and given their environment; stop() ends them."""

    def __init__(self, size: int, resources: Resources, timeout_s: float,
                 extra_env: Optional[dict] = None, num_hosts: Optional[int] = None):
        r = ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        self._remove_placement_group = remove_placement_group
        self.size = size
        if num_hosts:  # Horovod's colocated layout: num_hosts nodes, size // num_hosts on each
            per_host = size // num_hosts
            bundles = [resources.bundle(per_host)] * num_hosts
            strategy, bundle_of = "STRICT_SPREAD", [i // per_host for i in range(size)]
        else:
            bundles, strategy, bundle_of = [resources.bundle()] * size, "PACK", list(range(size))
        self.placement_group = placement_group(bundles, strategy=strategy)
        ready, _ = r.wait([self.placement_group.ready()], timeout=timeout_s)
        if not ready:
            total = r.cluster_resources()
            self.stop()
            raise TimeoutError(
                f"tftorus.ray: {size} workers of {resources.bundle()} each "
                f"({strategy}) were not placed within {timeout_s:g} s; the cluster has "
                f"{_short(total)} in all and {_short(r.available_resources())} free: ask for "
                f"fewer workers or resources per worker, add nodes, or raise "
                f"placement_group_timeout_s")
        remote = r.remote(Worker)
        self.actors = [remote.options(**actor_options(resources, self.placement_group, b))
                       .remote() for b in bundle_of]
        places = r.get([a.where.remote() for a in self.actors])
        order = sorted(range(size), key=lambda i: (bundle_of[i] if num_hosts else 0,
                                                   places[i]["node_id"], i))
        self.actors = [self.actors[i] for i in order]
        self.places = [places[i] for i in order]
        secret = job_secret.make()
        env = dict(extra_env or {})
        r.get([a.set_env.remote({**env, "TF_CONFIG": cluster_spec(self.places, rank),
                                 job_secret.ENV: secret, "PYTHONUNBUFFERED": "1"})
               for rank, a in enumerate(self.actors)])

    def nodes(self) -> List[str]:
        return [p["node_id"] for p in self.places]

    def stop(self) -> None:
        r = ray()
        for actor in getattr(self, "actors", []):
            r.kill(actor, no_restart=True)
        self.actors = []
        if self.placement_group is not None:
            try:
                self._remove_placement_group(self.placement_group)
            except Exception:  # a placement group on a lost node is gone already
                pass
            self.placement_group = None


def _short(resources: dict) -> str:
    """"CPU 4, GPU 0" of Ray's resource dict (memory aside)."""
    return ", ".join(f"{k} {resources.get(k, 0):g}" for k in ("CPU", "GPU"))
