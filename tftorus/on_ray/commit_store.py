"""The elastic job's last commit, kept by the driver, not by a rank: a Ray actor pinned to the
driver's node (it needs no CPU), so it outlives the loss of any worker node; Ray's head node and
the driver going down end the job anyway. Rank 0 hands it each commit (one actor call, so a
commit is whole or absent), every rank of a new world reads it, and the driver asks through it
for the world to grow at the next commit. It also carries the values a worker's function logs
(ray_logger.py) to the driver, which hands them to run()'s callbacks.

RayCommitKeeper is the worker's side of it, as reliability/commit_keeper.py defines a keeper.
"""
import time
from typing import Optional


class CommitStore:
    def __init__(self):
        self._commit: Optional[dict] = None
        self._commits = 0
        self._grow = False
        self._world = {"number": 0, "size": 0, "loads": 0, "started": 0.0, "resumed": None}
        self._logged: list = []

    def new_world(self, number: int, size: int) -> None:
        self._grow = False
        self._world = {"number": number, "size": size, "loads": 0, "started": time.time(),
                       "resumed": None}

    def load(self) -> Optional[dict]:
        self._world["loads"] += 1
        if self._world["loads"] == self._world["size"]:
            self._world["resumed"] = time.time()  # every rank has its state
        return self._commit

    def save(self, commit: dict) -> bool:
        """Keep `commit`; True (once) when the driver asked the world to grow."""
        self._commit = commit
        self._commits += 1
        grow, self._grow = self._grow, False
        return grow

    def log(self, value) -> None:
        self._logged.append(value)

    def take_logged(self) -> list:
        """The values logged since the last call, in the order they came."""
        taken, self._logged = self._logged, []
        return taken

    def ask_to_grow(self) -> None:
        self._grow = True

    def progress(self) -> dict:
        """Commits so far, the running world, and the last commit's keyword attributes."""
        attributes = (self._commit or {}).get("attributes", {})
        return {"commits": self._commits, "world": dict(self._world),
                "attributes": {k: v for k, v in attributes.items()
                               if isinstance(v, (int, float, str, bool))}}


class RayCommitKeeper:
    """A keeper (reliability/commit_keeper.py) that calls the driver's CommitStore."""

    def __init__(self, store, resets: int):
        self._store = store
        self.resets = resets

    def load(self) -> Optional[dict]:
        import ray
        return ray.get(self._store.load.remote())

    def save(self, commit: Optional[dict]) -> bool:
        if commit is None:  # not rank 0: rank 0 hands the commit over
            return False
        import ray
        return ray.get(self._store.save.remote(commit))
