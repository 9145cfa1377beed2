"""Process-wide state: the communicator and the grids whose groups it can reach.

Horovod fixes its process sets at `hvd.init()`, so `tftorus.init()` must know the grids before
Horovod starts. It reads the world size from the launcher's environment (horovodrun, OpenMPI,
PMI); where none is set it starts Horovod with dynamic process sets and registers them after.
"""
import logging
import os
from typing import Iterable, List, Optional, Tuple

import horovod.tensorflow as hvd
import tensorflow as tf

from tftorus.grid import GridError, GridSpec, TorusGrid, hierarchical_grid, resolve_grid
from tftorus.horovod_engine import HorovodCommunicator

logger = logging.getLogger(__name__)

_SIZE_VARS = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_LOCAL_SIZE_VARS = ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


class _State:
    def __init__(self, comm: HorovodCommunicator, grid: TorusGrid):
        self.comm = comm
        self.grid = grid  # the default torus grid


_state: Optional[_State] = None


def _env_int(names) -> Optional[int]:
    for name in names:
        if os.environ.get(name, "").strip().isdigit():
            return int(os.environ[name])
    return None


def _groups_of(grids: Iterable[TorusGrid]) -> List[Tuple[int, ...]]:
    """Row and column groups that need a process set (not single ranks, not the whole world)."""
    groups = []
    for g in grids:
        for group in g.rows() + g.cols():
            if 1 < len(group) < g.size and group not in groups:
                groups.append(group)
    return groups


def _grids_for(size: int, local_size: int, grid: GridSpec, extra_grids) -> List[TorusGrid]:
    grids = [resolve_grid(grid, size, local_size)]
    if size % local_size == 0:  # hierarchical all-reduce's node rows, for comparisons
        grids.append(hierarchical_grid(size, local_size))
    grids.extend(resolve_grid(g, size, local_size) for g in extra_grids)
    return grids


def init(grid: GridSpec = None, extra_grids: Iterable[GridSpec] = (),
         reduce_scatter_impl: str = "alltoall", process_sets=None):
    """Start Horovod with a process set per torus row and column, like `hvd.init()`.

    grid: the torus grid (None/'auto': planned from the world size; 'paper'; 'YxX'; row length).
    extra_grids: further grids to register for algorithms or grids picked per optimizer.
    process_sets: the caller's own Horovod process sets, registered too.
    """
    global _state
    extra_grids = list(extra_grids)
    if _state is not None and hvd.is_initialized():
        wanted = resolve_grid(grid, hvd.size(), hvd.local_size())
        if grid is not None and wanted != _state.grid:
            raise GridError(f"tftorus is already running on a {_state.grid} grid; {wanted} "
                            f"needs other process sets: pass it to the first init() call")
        return _state  # a second init() is a no-op, as hvd.init() is
    if hvd.is_initialized():
        return _adopt_running_horovod(grid, extra_grids, reduce_scatter_impl)
    size = _env_int(_SIZE_VARS)
    local_size = _env_int(_LOCAL_SIZE_VARS) or size
    user_sets = list(process_sets or [])
    if size is None and os.environ.get("HOROVOD_RANK") is None and not user_sets:
        size = local_size = 1  # plain `python train.py`: one process, no launcher
    if size is None:
        # Launched some other way: learn the size first, add the sets collectively after.
        hvd.init(process_sets="dynamic")
        return _adopt_running_horovod(grid, extra_grids, reduce_scatter_impl)
    grids = _grids_for(size, local_size, grid, extra_grids)  # errors before any collective
    sets = [hvd.ProcessSet(list(g)) for g in _groups_of(grids)]
    hvd.init(process_sets=sets + user_sets)
    if hvd.size() != size:
        raise RuntimeError(f"the launcher's environment said {size} ranks but Horovod has "
                           f"{hvd.size()}: check HOROVOD_SIZE / OMPI_COMM_WORLD_SIZE")
    _state = _State(HorovodCommunicator(sets, reduce_scatter_impl), grids[0])
    _log_grid()
    return _state


def _adopt_running_horovod(grid, extra_grids, reduce_scatter_impl):
    """Horovod already runs (the user called hvd.init()): add the sets if it allows that."""
    global _state
    size, local_size = hvd.size(), hvd.local_size()
    grids = _grids_for(size, local_size, grid, extra_grids)
    groups = _groups_of(grids)
    dynamic = os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "0") not in ("", "0")
    sets = []
    if groups and not dynamic:
        raise GridError(
            f"Horovod was started without the torus' process sets (grid {grids[0]} needs "
            f"{len(groups)}). Call tftorus.init() in place of hvd.init(), or start Horovod with "
            f"hvd.init(process_sets='dynamic') so tftorus can add them.")
    for g in groups:  # collective: every rank adds the same sets in the same order
        sets.append(hvd.add_process_set(list(g)))
    _state = _State(HorovodCommunicator(sets, reduce_scatter_impl), grids[0])
    _log_grid()
    return _state


def _log_grid():
    if hvd.rank() == 0:
        g = _state.grid
        logger.info("tftorus: %d ranks as a %s torus (%d rows of %d), %d sequential steps "
                    "per all-reduce (a ring takes %d)", g.size, g, g.y, g.x,
                    g.sequential_steps, 2 * (g.size - 1))


def state() -> _State:
    """The running state; starts it if Horovod runs but tftorus.init() was not called."""
    if _state is None:
        if not hvd.is_initialized():
            raise RuntimeError("call tftorus.init() (in place of hvd.init()) before building "
                               "a tftorus optimizer or all-reduce")
        _adopt_running_horovod(None, [], "alltoall")
    return _state


def communicator() -> HorovodCommunicator:
    return state().comm


def default_grid() -> TorusGrid:
    return state().grid


def grid_for(algorithm: str, grid: GridSpec = None) -> TorusGrid:
    """The grid an algorithm runs on: the node grid for 'hierarchical', else the torus grid."""
    comm = communicator()
    if algorithm == "hierarchical":
        return hierarchical_grid(comm.size, comm.local_size)
    if grid is None:
        return default_grid()
    return resolve_grid(grid, comm.size, comm.local_size)


def shutdown():
    """End the job cleanly: wait until every rank is done, then stop Horovod.

    Call it once after a rank's last collective on success. Without the barrier, the first rank
    to exit shuts Horovod down while a slower peer may still be finishing its last row or column
    operation, which then fails with "Horovod has been shut down" (seen in this project's tests).
    Not for error paths: a barrier there could wait for ranks that will never arrive.
    """
    global _state
    if hvd.is_initialized():
        if hvd.size() > 1:
            hvd.allreduce(tf.constant(0), op=hvd.Sum, name="tftorus_shutdown_barrier")
        hvd.shutdown()
    _state = None
