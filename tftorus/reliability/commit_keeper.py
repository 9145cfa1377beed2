"""Where an elastic job's commits live when its world restarts, on the current stack.

TensorFlow's collective runtime cannot re-form inside a process, so an elastic world on the tf
engine ends and a new one starts in new processes (tftorus/on_ray/ starts them). The state's
last commit must outlive every worker of the old world, so it is kept by whoever restarts the
world (the driver), not by a rank: a keeper installed here before the user's function runs.

  load()   the last commit (a dict of the state's saved values) or None before the first
  save(c)  keep this commit, atomically; True when workers can join (the world grows at it)
  resets   how many worlds came before this one (0: the first; its reset callbacks do not run)

elastic_on_tf_engine.py reads the keeper; without one the world keeps its size (no driver).
"""
from typing import Optional, Protocol


class CommitKeeper(Protocol):
    resets: int

    def load(self) -> Optional[dict]:
        ...

    def save(self, commit: dict) -> bool:
        ...


_keeper: Optional[CommitKeeper] = None


def install(keeper: Optional[CommitKeeper]) -> None:
    """Set (or with None, clear) this process' keeper; a restarting driver's worker calls it."""
    global _keeper
    _keeper = keeper


def current() -> Optional[CommitKeeper]:
    return _keeper


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's name: raised by every rank at a commit where workers can join; the driver
    then restarts the world, larger, from that commit (nothing after it was run)."""
