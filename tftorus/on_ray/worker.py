"""One rank of a worker group: a Ray actor in its own process (executor.py makes it remote).

The process is new, so TensorFlow's runtime has not started: the environment the executor sets
here (TF_CONFIG, the job secret) is what `hvd.init()` in the user's function reads. An elastic
world's function runs with the driver's commit keeper installed (commit_keeper.py), and its end
is reported as one of three outcomes: done, grow (a commit where workers can join) or lost (a
peer's collective failed; the driver restarts the world from the last commit).
"""
import os
import traceback

from tftorus.cluster.discovery import free_port

DONE, GROW, LOST = "done", "grow", "lost"


class Worker:
    def __init__(self):
        self._executable = None

    def where(self) -> dict:
        """This process' node and a free port on it (for its TF server)."""
        import ray
        ip = ray.util.get_node_ip_address()
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ip,
                "port": free_port(ip)}

    def set_env(self, env: dict) -> None:
        os.environ.update({k: str(v) for k, v in env.items()})

    def start_executable(self, cls, args, kwargs) -> None:
        self._executable = cls(*(args or ()), **(kwargs or {}))

    def execute(self, fn):
        return fn(self._executable)

    def run(self, fn, args, kwargs):
        return fn(*(args or ()), **(kwargs or {}))

    def run_elastic(self, fn, args, kwargs, store, resets: int):
        """(outcome, value): fn's return value when done, else why the world ended here."""
        from tftorus.engines.tf_engine import CollectiveError
        from tftorus.on_ray.commit_store import RayCommitKeeper
        from tftorus.on_ray import ray_logger
        from tftorus.reliability import commit_keeper
        commit_keeper.install(RayCommitKeeper(store, resets))
        ray_logger.configure(store)
        try:
            return DONE, fn(*(args or ()), **(kwargs or {}))
        except commit_keeper.HostsUpdatedInterrupt:
            return GROW, None
        except CollectiveError:
            return LOST, traceback.format_exc(limit=3)
