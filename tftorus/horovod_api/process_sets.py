"""Horovod's process sets on the tf engine: `ProcessSet`, `global_process_set`,
`add_process_set`, `remove_process_set`, and `hvd.init(process_sets=[...])`.

A process set is a group of global ranks whose members alone run its collectives. On the tf
engine a set is a TF collective group: its key is a hash of the sorted ranks
(tftorus/engines/tf_engine.py), resolved in one canonical order on every process. So every process
registers every set, in the same order, members or not (Horovod asks the same of
add_process_set: every process calls it); add_process_set checks that they did.

Horovod's rules kept: ids count up from 1 (the global set is 0) and a removed set's id is
given out again first; a set with the same ranks as a registered one is refused; `size()` and
`rank()` are None before registration, `rank()` refuses a process outside the set, ranks are
the global ones (a broadcast's root_rank too). Horovod needs HOROVOD_DYNAMIC_PROCESS_SETS=1 to
add sets after init; the tf engine needs nothing, so sets can always be added.
"""
import collections
import functools
import zlib
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from tftorus.runtime import process_state, stack

Group = tuple


class ProcessSet:
    """A set of global ranks that run collectives together (Horovod's ProcessSet): give it to
    hvd.init(process_sets=[...]) or hvd.add_process_set(), then as `process_set=` to a
    collective, which only its members call."""

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks: Sequence[int]):
        if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
            raise ValueError(f"ProcessSet takes a list of ranks here (an MPI communicator is "
                             f"Horovod's, with MPI); got {ranks!r}")
        ranks = sorted(ranks)
        if any(not isinstance(r, (int, np.integer)) or isinstance(r, bool) for r in ranks):
            raise ValueError(f"ProcessSet should be initialized with a list of process ranks; "
                             f"got {ranks!r}")
        self.ranks = [int(r) for r in ranks]

    @property
    def whole_world(self) -> bool:
        """The global set (process_state.is_whole_world asks)."""
        return self.process_set_id == 0

    def size(self) -> Optional[int]:
        """The number of ranks in the set, or None before it is registered."""
        if self.process_set_id is None:
            return None
        return len(_registered(self).ranks)

    def rank(self) -> Optional[int]:
        """This process' index among the set's ranks (None before registration). Collectives
        still name ranks by their global rank (a broadcast's root_rank, for one)."""
        if self.process_set_id is None:
            return None
        ranks = _registered(self).ranks
        if process_state.communicator().rank not in ranks:
            raise ValueError("Process is not part of provided process set.")
        return ranks.index(process_state.communicator().rank)

    def included(self) -> Optional[bool]:
        """Whether this process is in the set (None for a set without ranks)."""
        if self.whole_world:
            return True
        if self.ranks is None:
            return None
        return process_state.communicator().rank in self.ranks

    def __str__(self) -> str:
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")

    __repr__ = __str__

    def _invalidate(self):
        self.process_set_id = None


#: Every rank, id 0; its ranks are filled in by init().
global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


class _Table:
    """The registered sets of one world (one tftorus.init())."""

    def __init__(self, generation: int, size: int):
        self.generation = generation
        self.sets: Dict[int, ProcessSet] = {0: global_process_set}
        self.next_id = 1
        self.free_ids = collections.deque()
        global_process_set.ranks = list(range(size))


_table: Optional[_Table] = None


def _current() -> _Table:
    """This world's table (a new world, after shutdown and init, starts a new one)."""
    global _table
    if not process_state.is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    if _table is None or _table.generation != process_state.generation():
        _table = _Table(process_state.generation(), process_state.communicator().size)
    return _table


def _registered(process_set) -> ProcessSet:
    table = _current()
    known = table.sets.get(process_set.process_set_id)
    if known is None or (process_set.process_set_id != 0 and known.ranks != process_set.ranks):
        raise ValueError("Process set does not exist or has not been registered.")
    return known


def _check_ranks(ranks: List[int], size: int) -> None:
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"a process set lists each rank once; got {ranks}")
    if ranks and (ranks[0] < 0 or ranks[-1] >= size):
        raise ValueError(f"process set {ranks} names ranks outside a world of {size} "
                         f"(0 .. {size - 1})")
    if not ranks:
        raise ValueError("a process set needs at least one rank")


def _register(process_set: ProcessSet) -> ProcessSet:
    table = _current()
    comm = process_state.communicator()
    _check_ranks(process_set.ranks, comm.size)
    if any(s.ranks == process_set.ranks for s in table.sets.values()):
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    if len(process_set.ranks) > 1 and hasattr(comm, "register_groups"):
        comm.register_groups([tuple(process_set.ranks)])  # its group key, as on every rank
    set_id = table.free_ids.popleft() if table.free_ids else table.next_id
    if set_id == table.next_id:
        table.next_id += 1
    process_set.process_set_id = set_id
    table.sets[set_id] = process_set
    return process_set


@functools.wraps(process_state.init)
def init(*args, process_sets=None, **kwargs):
    # `hvd.init()` (tftorus.init; its docstring is the runtime's): the process' runtime, then
    # on the tf engine without Horovod the caller's process sets, in this table. The Horovod
    # engine hands them to Horovod's own init. So the runtime never calls up into this layer.
    state = process_state.init(*args, process_sets=process_sets, **kwargs)
    if not stack.HOROVOD:  # the current stack: the tf engine, whose sets live here
        register_at_init(process_sets)
    return state


def register_at_init(process_sets) -> None:
    """hvd.init(process_sets=[...]): register the caller's sets in their order (a set whose
    ranks repeat an earlier one's, or the global set's, keeps no id, as Horovod leaves it).
    'dynamic' (Horovod's switch for adding sets later) needs nothing here."""
    if process_sets is None or process_sets == "dynamic":
        return
    for process_set in process_sets:
        if not isinstance(process_set, ProcessSet):
            raise TypeError(f"process_sets takes hvd.ProcessSet objects; got {process_set!r}")
        if _current().sets.get(process_set.process_set_id) is process_set:
            continue  # a second init() with the same sets
        try:
            _register(process_set)
        except ValueError as e:
            if "duplicate" not in str(e):
                raise
            process_set._invalidate()


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Register a set after init and return it. Collective: every process calls it with the
    same ranks in the same order; a process that does not is told so, on every process."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    _current()
    _check_same_everywhere(process_set.ranks)
    return _register(process_set)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set (not the global one); whether it was registered. Its id may be given
    to the next set added."""
    table = _current()
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0 or table.sets.get(set_id) is not process_set:
        return False
    del table.sets[set_id]
    table.free_ids.append(set_id)
    process_set._invalidate()
    return True


def _check_same_everywhere(ranks: List[int]) -> None:
    """One all-gather over the world: every process is adding the same set now."""
    comm = process_state.communicator()
    if comm.size == 1:
        return
    from tftorus.horovod_api import group_collectives  # noqa: WPS433  (imports the engine's TF ops)
    digest = zlib.crc32(repr(list(ranks)).encode())
    with _eagerly():
        mine = tf.constant([len(ranks), digest], tf.int64)
        everyone = group_collectives.gather_rows(comm, mine, comm.all_ranks()).numpy()
    if not (everyone == everyone[0]).all():
        raise ValueError(f"add_process_set is collective: every process must add the same set "
                         f"at the same point; this one added {ranks}, and the processes' "
                         f"(size, digest) differ: {everyone.tolist()}")


def _eagerly():
    from tensorflow.python.eager import context as eager_context
    return eager_context.eager_mode()


def by_id(process_set_id: int) -> ProcessSet:
    """The registered set with this id (Horovod's *_op functions name sets by id)."""
    known = _current().sets.get(int(process_set_id))
    if known is None:
        raise ValueError("Process set does not exist or has not been registered.")
    return known


def group_of(process_set) -> Group:
    """The sorted global ranks a collective on `process_set` runs over. Raises ValueError for a
    set that is not registered, and InvalidArgumentError (Horovod's error) on a process that
    is not one of its members."""
    comm = process_state.communicator()
    if process_state.is_whole_world(process_set):
        return comm.all_ranks()
    if not hasattr(process_set, "process_set_id") or getattr(process_set, "ranks", None) is None:
        raise TypeError(f"process_set takes an hvd.ProcessSet; got {process_set!r}")
    ranks = _registered(process_set).ranks
    if comm.rank not in ranks:
        raise tf.errors.InvalidArgumentError(
            None, None, f"rank {comm.rank} is not a member of {process_set}: only its members "
                        f"may call its collectives (check process_set.included() first)")
    return tuple(ranks)
