"""Where an elastic job's commits live when its world restarts, on the current stack.

TensorFlow's collective runtime cannot re-form inside a process, so an elastic world on the tf
engine ends and a new one starts in new processes (tftorus/on_ray/ starts them). The state's
last commit must outlive every worker of the old world, so it is kept by whoever restarts the
world (the driver), not by a rank: a keeper installed here before the user's function runs.

  load()   the last commit (a dict of the state's saved values) or None before the first
  save(c)  called by every rank at each commit, with the commit on rank 0 and None elsewhere:
           keep it, atomically; True when workers can join (the world grows at it)
  resets   how many worlds came before this one (0: the first; its reset callbacks do not run)

A driver's worker installs its keeper; one that the process' surroundings imply (a Ray Train
worker) is found by a finder that the public faces register. elastic_on_tf_engine.py uses the
keeper; without one the world keeps its size (no driver).
"""
from typing import Callable, List, Optional, Protocol


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


_finders: List[Callable[[], Optional[CommitKeeper]]] = []


def add_finder(finder: Callable[[], Optional[CommitKeeper]]) -> None:
    if finder not in _finders:
        _finders.append(finder)


def find() -> Optional[CommitKeeper]:
    """The installed keeper, else the first a finder gives (then installed), else None."""
    if _keeper is None:
        for finder in _finders:
            keeper = finder()
            if keeper is not None:
                install(keeper)
                break
    return _keeper


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's name: raised by every rank at a commit where workers can join; the driver
    then restarts the world, larger, from that commit (nothing after it was run)."""
