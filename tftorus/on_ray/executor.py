"""`tftorus.ray.RayExecutor`: Horovod's RayExecutor (horovod.ray, 0.28.1) with the same API and
meaning, over the tf engine, so a Horovod-on-Ray script changes only its imports.

    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4, cpus_per_worker=1, use_gpu=False)
    executor.start()
    results = executor.run(train, kwargs={"epochs": 2})   # one value per rank, in rank order
    executor.shutdown()

Each rank is a Ray actor in a new process whose TF_CONFIG names every rank, so `hvd.init()` in
the function joins them; the ranks share a fresh job secret. With min_workers (and max_workers)
the executor is elastic (elastic_driver.py): run() restarts the world when workers are lost or
can join, and hvd.elastic's states resume from the commit the driver keeps.
"""
import dataclasses
from typing import Any, Callable, List, Optional

from tftorus.on_ray.elastic_driver import ElasticDriver
from tftorus.on_ray.ray_module import ray
from tftorus.on_ray.worker_group import Resources, WorkerGroup


@dataclasses.dataclass
class Settings:
    """What create_settings() returns. placement_group_timeout_s bounds the wait for the
    workers' resources. timeout_s (Horovod's bound on probing network interfaces) and the ssh
    and NIC fields are Horovod's and unused: Ray starts the workers, and the tf engine dials
    the node addresses Ray reports."""
    timeout_s: float = 30
    ssh_identity_file: Optional[str] = None
    ssh_str: Optional[str] = None
    placement_group_timeout_s: float = 100
    nics: Optional[set] = None
    elastic: bool = False


class RayExecutor:
    """Run a function on a group of Ray workers that form one tftorus world.

    Horovod's arguments, and one of tftorus': world_sizes, the sizes an elastic world may take
    (e.g. the divisors of a fixed total batch); the largest one the alive nodes hold is used."""

    @classmethod
    def create_settings(cls, timeout_s: float = 30, ssh_identity_file: Optional[str] = None,
                        ssh_str: Optional[str] = None, placement_group_timeout_s: float = 100,
                        nics: Optional[set] = None) -> Settings:
        return Settings(timeout_s, ssh_identity_file, ssh_str, placement_group_timeout_s,
                        set(nics) if nics else None)

    def __init__(self, settings: Settings, num_workers: Optional[int] = None,
                 num_hosts: Optional[int] = None, num_workers_per_host: int = 1,
                 cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[float] = None,
                 use_current_placement_group: bool = True, min_workers: Optional[int] = None,
                 max_workers: Optional[int] = None, reset_limit: Optional[int] = None,
                 cooldown_range=None, elastic_timeout: float = 600,
                 override_discovery: bool = True, world_sizes=None):
        if max_workers is not None and not (min_workers and min_workers > 0):
            raise ValueError("max_workers needs a positive min_workers: give min_workers too "
                             "(elastic), or num_workers alone (a fixed world)")
        if min_workers is not None and (num_workers or num_hosts):
            raise ValueError("give min_workers/max_workers (elastic) or num_workers/num_hosts "
                             "(a fixed world), not both")
        if min_workers is not None and min_workers < 1:
            raise ValueError(f"min_workers must be >= 1, got {min_workers}")
        if max_workers is not None and max_workers < min_workers:
            raise ValueError(f"min_workers={min_workers} is more than max_workers={max_workers}: "
                             f"give min_workers <= max_workers")
        if min_workers is None and num_workers and num_hosts:
            raise ValueError("give num_workers, or num_hosts with num_workers_per_host, not both")
        if min_workers is None and not (num_workers or num_hosts):
            raise ValueError("give num_workers (or num_hosts and num_workers_per_host), or "
                             "min_workers for an elastic job")
        if gpus_per_worker is not None and not use_gpu:
            raise ValueError("gpus_per_worker is set but use_gpu is False: set use_gpu=True")
        if use_gpu and gpus_per_worker is not None and gpus_per_worker < 1:
            raise ValueError(f"gpus_per_worker must be >= 1, got {gpus_per_worker}")
        if cpus_per_worker <= 0:
            raise ValueError(f"cpus_per_worker must be > 0, got {cpus_per_worker}")
        if world_sizes is not None and min_workers is None:
            raise ValueError("world_sizes chooses among elastic worlds: give min_workers too")
        if world_sizes is not None and not any(
                min_workers <= n <= (max_workers or n) for n in world_sizes):
            raise ValueError(f"no size in world_sizes={sorted(world_sizes)} lies within "
                             f"min_workers={min_workers}..max_workers={max_workers}")
        if reset_limit is not None and reset_limit < 0:
            raise ValueError(f"reset_limit must be >= 0, got {reset_limit}")
        del use_current_placement_group, cooldown_range, override_discovery  # Horovod's knobs
        ray()  # the extra is missing: say so now, not at start()
        self.settings = settings
        self.settings.elastic = min_workers is not None
        self.resources = Resources(cpus_per_worker, (gpus_per_worker or 1) if use_gpu else 0)
        self.num_hosts = num_hosts
        self.num_workers = num_workers or ((num_hosts or 0) * num_workers_per_host)
        self.min_workers, self.max_workers = min_workers, max_workers
        self.reset_limit, self.elastic_timeout = reset_limit, elastic_timeout
        self.allowed_world_sizes = world_sizes
        self._group: Optional[WorkerGroup] = None
        self._driver: Optional[ElasticDriver] = None
        self._extra_env: dict = {}

    # -- Horovod's API ---------------------------------------------------------------------

    def start(self, executable_cls: Optional[type] = None, executable_args: Optional[list] = None,
              executable_kwargs: Optional[dict] = None,
              extra_env_vars: Optional[dict] = None) -> None:
        """Place the workers and give them their environment (elastic: only remember it; each
        world's workers start in run()). executable_cls: made on every worker, for execute()."""
        self._extra_env = dict(extra_env_vars or {})
        if self.settings.elastic:
            if executable_cls is not None:
                raise ValueError("an elastic executor starts new workers in every world, so it "
                                 "keeps no executable_cls: build what fn needs inside it, and "
                                 "call run(fn)")
            self._driver = ElasticDriver(self.resources, self.min_workers, self.max_workers,
                                         self.reset_limit, self.elastic_timeout,
                                         self.settings.placement_group_timeout_s,
                                         self._extra_env, self.allowed_world_sizes)
            return
        if self._group is not None:
            raise RuntimeError("this executor is started already: shutdown() first")
        self._group = WorkerGroup(self.num_workers, self.resources,
                                  self.settings.placement_group_timeout_s, self._extra_env,
                                  self.num_hosts)
        if executable_cls is not None:
            check_picklable(executable_cls, executable_args, executable_kwargs)
            r = ray()
            r.get([a.start_executable.remote(executable_cls, executable_args, executable_kwargs)
                   for a in self._group.actors])

    def execute(self, fn: Callable[[Any], Any], callbacks=None) -> List[Any]:
        """fn(executable) on every rank; the values in rank order."""
        del callbacks  # Horovod's static executor ignores them too
        group = self._started("execute")
        check_picklable(fn)
        return ray().get([a.execute.remote(fn) for a in group.actors])

    def run(self, fn: Callable, args: Optional[list] = None, kwargs: Optional[dict] = None,
            callbacks=None) -> List[Any]:
        """fn(*args, **kwargs) on every rank; the values in rank order (elastic: the ranks of
        the world that finished). callbacks (elastic only, as in Horovod): callables, each
        called on the driver with every value a rank logs (tftorus.ray.ray_logger.log)."""
        check_picklable(fn, args, kwargs)
        if self.settings.elastic:
            if self._driver is None:
                raise RuntimeError("call start() before run()")
            if any(not callable(c) for c in callbacks or []):
                raise TypeError("callbacks must be a list of callables (functions, or objects "
                                "with __call__), each called with every logged value")
            return self._driver.run(fn, args, kwargs, callbacks)
        return ray().get(self.run_remote(fn, args, kwargs))  # Horovod's ignores callbacks here

    def run_remote(self, fn: Callable, args: Optional[list] = None,
                   kwargs: Optional[dict] = None) -> list:
        """As run(), without waiting: Ray's ObjectRefs, one per rank, in rank order."""
        if self.settings.elastic:
            raise NotImplementedError("an elastic executor's workers end with their world, so "
                                      "it returns no ObjectRefs: call run(fn)")
        group = self._started("run_remote")
        check_picklable(fn, args, kwargs)
        return [a.run.remote(fn, args, kwargs) for a in group.actors]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """fn(executable) on rank 0 alone; its value."""
        if self.settings.elastic:
            raise NotImplementedError("an elastic executor has no lasting rank 0: call run(fn)")
        group = self._started("execute_single")
        check_picklable(fn)
        return ray().get(group.actors[0].execute.remote(fn))

    def shutdown(self) -> None:
        """End the workers and free their resources."""
        if self._group is not None:
            self._group.stop()
            self._group = None
        if self._driver is not None:
            self._driver.stop()

    # -- beyond Horovod's ------------------------------------------------------------------

    def progress(self) -> Optional[dict]:
        """An elastic run's commits so far, its world and the last commit's plain attributes
        (epoch, batch, ...), read from the driver's store; None before run() or when fixed."""
        return self._driver.progress() if self._driver is not None else None

    @property
    def world_sizes(self) -> List[int]:
        """The sizes of the worlds an elastic run has had, in order."""
        return list(self._driver.world_sizes) if self._driver is not None else [self.num_workers]

    def _started(self, what: str) -> WorkerGroup:
        if self.settings.elastic:
            raise NotImplementedError(f"an elastic executor has no lasting workers for {what}: "
                                      f"call run(fn)")
        if self._group is None:
            raise RuntimeError(f"call start() before {what}()")
        return self._group


def check_picklable(*what) -> None:
    """Ray sends the function and its arguments to the workers by pickling them (cloudpickle):
    one that cannot be is refused here, in one line, before any worker runs."""
    import cloudpickle  # Ray's own dependency
    for item in what:
        try:
            cloudpickle.dumps(item)
        except Exception as e:  # pickling raises TypeError, PicklingError, AttributeError...
            raise TypeError(
                f"tftorus.ray: {getattr(item, '__name__', type(item).__name__)} cannot be sent "
                f"to the workers ({type(e).__name__}: {str(e)[:200]}): it or what it uses "
                f"(a lock, socket, open file, or a model or session made outside it) does not "
                f"pickle; build such things inside the function") from None
