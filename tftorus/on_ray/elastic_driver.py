"""The driver of an elastic job on Ray: worlds that end and start again as new processes.

TensorFlow's collective runtime cannot re-form inside a process, so where Horovod resets its
workers in place, this driver ends the world and starts a new one, of as many workers as the
alive nodes hold (min_workers..max_workers), with the grid planned for that size by hvd.init()
in the new processes. The state crosses over through the commit store (commit_store.py):

  a worker or node lost     every rank of the world is killed at once; the new world resumes
                            from the last commit (steps after it run again, once)
  room for more workers     the driver asks, and at the next commit every rank stops
                            (HostsUpdatedInterrupt); the new, larger world resumes from it
  the function returns      run() returns each rank's value, from the world that finished

What a rank logs (ray_logger.log) reaches run()'s callbacks at the driver's next poll (a second).

A world that cannot be had (fewer than min_workers' resources for elastic_timeout seconds), more
resets than reset_limit, or a user error in the function (any other exception) ends the job with
that error.
"""
import time
from typing import Callable, List, Optional

from tftorus.on_ray import worker as outcomes
from tftorus.on_ray.commit_store import CommitStore
from tftorus.on_ray.ray_module import ray
from tftorus.on_ray.worker_group import Resources, WorkerGroup

POLL_SECONDS = 1.0


def say(message: str) -> None:
    print(f"tftorus.ray: {message}", flush=True)


#: a node where a worker was lost counts as gone for this long unless Ray says it is dead
#: sooner (its health checks take a while); if it lives on, its worker alone had died
SUSPECT_SECONDS = 60.0


def alive_slots(resources: Resources, suspects: Optional[dict] = None) -> int:
    """Workers the alive nodes hold, counting their total resources (the cluster is the job's,
    as Horovod's Ray discovery assumes), suspects (node id -> when its worker was lost) aside."""
    now = time.time()
    return sum(resources.slots(n.get("Resources", {})) for n in ray().nodes()
               if n.get("Alive")
               and now - (suspects or {}).get(n.get("NodeID"), -1e9) > SUSPECT_SECONDS)


class ElasticDriver:
    def __init__(self, resources: Resources, min_workers: int, max_workers: Optional[int],
                 reset_limit: Optional[int], elastic_timeout: float, placement_timeout: float,
                 extra_env: Optional[dict] = None, world_sizes=None):
        self.resources = resources
        self.min_workers, self.max_workers = min_workers, max_workers
        self.reset_limit = reset_limit
        self.elastic_timeout, self.placement_timeout = elastic_timeout, placement_timeout
        self.extra_env = extra_env
        self.allowed = sorted(set(world_sizes)) if world_sizes else None  # None: any size
        self.store = None
        self.group: Optional[WorkerGroup] = None
        self.resets = 0
        self.world_sizes: List[int] = []
        self.suspects = {}  # nodes where a worker was lost
        self.callbacks: list = []  # run()'s, each called with every value a rank logs

    def _fits(self, slots: int) -> int:
        """The largest world size the slots hold (within max_workers and the allowed sizes)."""
        n = min(slots, self.max_workers or slots)
        if self.allowed is not None:
            n = max([a for a in self.allowed if a <= n], default=0)
        return n

    def _world_size(self) -> int:
        deadline = time.time() + self.elastic_timeout
        while True:
            slots = alive_slots(self.resources, self.suspects)
            if self._fits(slots) >= self.min_workers:
                return self._fits(slots)
            if time.time() >= deadline:
                raise TimeoutError(
                    f"tftorus.ray: the alive nodes hold {slots} workers of "
                    f"{self.resources.bundle()} each, fewer than min_workers="
                    f"{self.min_workers}, for {self.elastic_timeout:g} s (elastic_timeout): "
                    f"add nodes or lower min_workers")
            time.sleep(POLL_SECONDS)

    def _start_store(self):
        r = ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        here = r.get_runtime_context().get_node_id()  # the driver's node outlives the workers
        return r.remote(CommitStore).options(
            num_cpus=0, max_concurrency=1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()

    def progress(self) -> Optional[dict]:
        if self.store is None:
            return None
        return ray().get(self.store.progress.remote())

    def run(self, fn: Callable, args=None, kwargs=None, callbacks=None) -> list:
        self.callbacks = list(callbacks or [])
        try:
            return self._run(fn, args, kwargs)
        finally:
            self.stop()

    def _hand_over_logged(self) -> None:
        """Every callback with each value the ranks logged since the last call, in order
        (taken even without callbacks, so a job that logs does not fill the store)."""
        for value in ray().get(self.store.take_logged.remote()):
            for callback in self.callbacks:
                callback(value)

    def _run(self, fn: Callable, args, kwargs) -> list:
        r = ray()
        self.store = self._start_store()
        lost_at = None
        while True:
            size = self._world_size()
            r.get(self.store.new_world.remote(self.resets + 1, size))
            self.group = WorkerGroup(size, self.resources, self.placement_timeout,
                                     self.extra_env)
            self.world_sizes.append(size)
            say(f"world {self.resets + 1}: {size} workers on "
                f"{len(set(self.group.nodes()))} nodes"
                + (f", started {time.time() - lost_at:.1f} s after the loss" if lost_at else ""))
            futures = [a.run_elastic.remote(fn, args, kwargs, self.store, self.resets)
                       for a in self.group.actors]
            outcome, detail = self._watch(futures, size, lost_at)
            self.group.stop()
            self._hand_over_logged()  # what the world logged last
            if outcome == outcomes.DONE:
                return detail
            lost_at = time.time() if outcome == outcomes.LOST else None
            done = self.progress()
            say(f"world {self.resets + 1} ends ({detail}); the next resumes from commit "
                f"{done['commits']} {done['attributes']}")
            self.resets += 1
            if self.reset_limit is not None and self.resets > self.reset_limit:
                raise RuntimeError(f"tftorus.ray: the world was reset {self.resets} times, more "
                                   f"than reset_limit={self.reset_limit}: the last was: {detail}")

    def _watch(self, futures, size: int, lost_at):
        """(DONE, values in rank order) or (GROW | LOST, why), as soon as it is known."""
        r = ray()
        results = {}
        index = {f: i for i, f in enumerate(futures)}
        pending = list(futures)
        asked = resumed = False
        while pending:
            ready, pending = r.wait(pending, num_returns=1, timeout=POLL_SECONDS)
            self._hand_over_logged()
            for f in ready:
                rank = index[f]
                try:
                    outcome, value = r.get(f)
                except r.exceptions.RayActorError as e:
                    node = self.group.places[rank]["node_id"]
                    self.suspects[node] = time.time()
                    return outcomes.LOST, f"rank {rank} lost (node {node[:8]}): {_first_line(e)}"
                if outcome == outcomes.DONE:
                    results[rank] = value
                elif outcome == outcomes.GROW:
                    return outcomes.GROW, "workers can join"
                else:
                    return outcomes.LOST, f"rank {rank}: a peer's collective failed"
            if lost_at and not resumed:
                world = self.progress()["world"]
                if world["resumed"]:
                    resumed = True
                    say(f"world {self.resets + 1} resumed from the last commit "
                        f"{world['resumed'] - lost_at:.1f} s after the loss")
            if not results and self._fits(alive_slots(self.resources, self.suspects)) > size:
                r.get(self.store.ask_to_grow.remote())  # again each poll, until a commit takes it
                if not asked:
                    asked = True
                    say(f"room for more than {size} workers: the world grows at the next commit")
        return outcomes.DONE, [results[i] for i in range(size)]

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()
        if self.store is not None:
            ray().kill(self.store)
            self.store = None


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
