"""Process-wide state: the communicator and the grids whose groups it can reach.

Horovod fixes its process sets at `hvd.init()`, so `tftorus.init()` must know the grids before
Horovod starts. It reads the world size from the launcher's environment (horovodrun, OpenMPI,
PMI); where none is set it starts Horovod with dynamic process sets and registers them after.

Under Horovod's elastic driver (HOROVOD_ELASTIC=1) the world changes while the job runs: there
init() registers no process set (tftorus/engines/horovod_elastic_engine.py says why), and `reform()`
(called by tftorus.elastic.run on every reset) restarts Horovod on the new world and plans its grid.
Each world has a generation number; a reduction traced for an earlier one refuses to run
(`world_guard`) instead of reducing over groups that no longer exist.

`init(engine="tf")` runs the same algorithms on TensorFlow's collective ops instead
(tftorus/engines/tf_engine.py). It never starts Horovod: the cluster comes from TF_CONFIG or
horovodrun's rendezvous (tftorus/cluster/discovery.py), and it must be called before any other
TensorFlow call, because TF's runtime joins a cluster only when it starts.
"""
import logging
import os
import time
from typing import Iterable, List, NamedTuple, Optional, Tuple

import numpy as np
import tensorflow as tf

from tftorus.engines import graph_homes
from tftorus.planning import planner
from tftorus.runtime import stack
from tftorus.runtime.stack import hvd  # None on the current stack (no Horovod): the tf engine alone
from tftorus.torus.communicator import Communicator
from tftorus.torus.grid import (GridError, GridSpec, TorusGrid, divisors, hierarchical_grid,
                                resolve_grid)

logger = logging.getLogger(__name__)

_SIZE_VARS = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_LOCAL_SIZE_VARS = ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
ENGINES = ("horovod", "tf")


class _State:
    def __init__(self, comm: Communicator, grid: TorusGrid,
                 horovod_comm: Optional[Communicator] = None,
                 asked: Optional["_Asked"] = None):
        self.comm = comm
        self.grid = grid  # the default torus grid
        self.horovod_comm = horovod_comm  # the tf engine's Horovod companion under horovodrun
        self.asked = asked  # elastic jobs: what init() was asked for, to plan each new world
        self.links = None  # planner.Links measured at init or given (None: fixed rules)


class _Asked(NamedTuple):
    grid: GridSpec
    extra_grids: List[GridSpec]
    reduce_scatter_impl: str


_state: Optional[_State] = None
_generation = 0  # worlds formed in this process: 0 before init(), +1 per init() and reform()
_generation_variable: Optional[tf.Variable] = None  # the same number, for traced steps to check


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


def _grids_for(size: int, local_size: int, grid: GridSpec, extra_grids,
               engine: Optional[str] = None) -> List[TorusGrid]:
    given = planner.links_from_env() if grid is None and engine else None
    if given is not None and 1 < local_size < size and size % local_size == 0:
        grids = [_planned_grid(size, local_size, given, engine)]
    else:
        grids = [resolve_grid(grid, size, local_size)]
    if size % local_size == 0:  # hierarchical all-reduce's node rows, for comparisons
        grids.append(hierarchical_grid(size, local_size))
    grids.extend(resolve_grid(g, size, local_size) for g in extra_grids)
    return grids


def init(grid: GridSpec = None, extra_grids: Iterable[GridSpec] = (),
         reduce_scatter_impl: Optional[str] = None, process_sets=None,
         engine: Optional[str] = None, collective_timeout: Optional[float] = None,
         tf_host: Optional[str] = None, tf_port: Optional[int] = None,
         with_horovod: bool = False):
    """Start Horovod with a process set per torus row and column, like `hvd.init()`.

    grid: the torus grid (None/'auto': planned from the world size; 'paper'; 'YxX'; row length).
    extra_grids: further grids to register for algorithms or grids picked per optimizer.
    process_sets: the caller's own Horovod process sets, registered too on the Horovod engine
      (on the tf engine hvd.init registers them: tftorus.horovod_api.process_sets.init).
    reduce_scatter_impl: 'alltoall' (default on CPUs) or 'native' (NCCL); see the engines.
    engine: 'horovod' (Horovod process sets) or 'tf' (TensorFlow's collective ops, no Horovod;
      call init() first thing, before any other TensorFlow call). None: 'horovod' where
      Horovod is installed (the classic stack), else 'tf' (the current stack).
    collective_timeout, tf_host, tf_port: tf engine only; see tftorus.cluster.tf_runtime.bootstrap.
    with_horovod: tf engine under horovodrun only: start Horovod too, with the same grids'
      process sets, so engine='horovod' and Horovod's own functions work beside the tf engine
      (to compare the engines). Off by default: Horovod's background thread costs CPU time.
    """
    global _state
    extra_grids = list(extra_grids)
    engine = engine or stack.DEFAULT_ENGINE
    _check_engine_args(engine, process_sets, collective_timeout, tf_host, tf_port)
    if engine == "tf":
        state = _init_tf(grid, extra_grids, reduce_scatter_impl, collective_timeout, tf_host,
                         tf_port, with_horovod)
        return state  # the caller's process sets: tftorus.horovod_api.process_sets.init
    if with_horovod:
        raise ValueError("with_horovod=True goes with engine='tf'; the Horovod engine always "
                         "runs Horovod")
    if not stack.HOROVOD:
        raise stack.horovod_required("engine='horovod'", "use engine='tf' (the default here)")
    from tftorus.engines.horovod_engine import HorovodCommunicator
    if _state is not None and _state.comm.engine != "horovod":
        raise RuntimeError(f"tftorus already runs on the {_state.comm.engine!r} engine; "
                           f"call init() once per process with one engine")
    reduce_scatter_impl = reduce_scatter_impl or "alltoall"
    if _state is not None and hvd.is_initialized():
        wanted = resolve_grid(grid, hvd.size(), hvd.local_size())
        if grid is not None and wanted != _state.grid:
            raise GridError(f"tftorus is already running on a {_state.grid} grid; {wanted} "
                            f"needs other process sets: pass it to the first init() call")
        return _state  # a second init() is a no-op, as hvd.init() is
    if hvd.is_initialized():
        return _adopt_running_horovod(grid, extra_grids, reduce_scatter_impl)
    user_sets = list(process_sets or [])
    if is_elastic():
        if user_sets:
            raise ValueError(
                "process_sets name ranks of one world, but under Horovod's elastic driver the "
                "world changes size while the job runs; leave process_sets out (tftorus adds "
                "the torus' own sets for every new world)")
        hvd.init()  # the size comes from the elastic rendezvous
        return _start_elastic(_Asked(grid, extra_grids, reduce_scatter_impl))
    _check_horovod_launch()
    size = _env_int(_SIZE_VARS)
    local_size = _env_int(_LOCAL_SIZE_VARS) or size
    if size is None and os.environ.get("HOROVOD_RANK") is None and not user_sets:
        size = local_size = 1  # plain `python train.py`: one process, no launcher
    if size is None:
        # Launched some other way: learn the size first, add the sets collectively after.
        hvd.init(process_sets="dynamic")
        return _adopt_running_horovod(grid, extra_grids, reduce_scatter_impl)
    grids = _grids_for(size, local_size, grid, extra_grids, "horovod")  # errors before collectives
    sets = [hvd.ProcessSet(list(g)) for g in _groups_of(grids)]
    hvd.init(process_sets=sets + user_sets)
    if hvd.size() != size:
        raise RuntimeError(f"the launcher's environment said {size} ranks but Horovod has "
                           f"{hvd.size()}: check HOROVOD_SIZE / OMPI_COMM_WORLD_SIZE")
    _state = _State(HorovodCommunicator(sets, reduce_scatter_impl), grids[0])
    _new_generation()
    _log_grid()
    _plan_links(grid_given=grid is not None)
    return _state


def _check_horovod_launch() -> None:
    """HOROVOD_RANK without horovodrun's rendezvous or an MPI launcher (tftorus.run and the tf
    engine's init set it for scripts that read it): Horovod would wait for a rendezvous that
    never comes and abort after 30 s. Say so at once."""
    env = os.environ
    if env.get("HOROVOD_RANK", "").strip() and not env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR") \
            and not any(env.get(v) for v in ("OMPI_COMM_WORLD_RANK", "PMI_RANK")):
        raise RuntimeError(
            "HOROVOD_RANK is set but horovodrun did not start this process (no "
            "HOROVOD_GLOO_RENDEZVOUS_ADDR), so Horovod's engine has no world to join: launch "
            "with horovodrun, or use engine='tf' (python -m tftorus.run, TF_CONFIG, srun and "
            "mpirun set HOROVOD_* for scripts only)")


def _check_engine_args(engine, process_sets, collective_timeout, tf_host, tf_port):
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose 'horovod' (Horovod process sets, "
                         f"the default) or 'tf' (TensorFlow's collective ops)")
    tf_only = {"collective_timeout": collective_timeout, "tf_host": tf_host, "tf_port": tf_port}
    given = sorted(k for k, v in tf_only.items() if v is not None)
    if engine == "horovod" and given:
        raise ValueError(f"{', '.join(given)} only apply to engine='tf'; Horovod takes its "
                         f"timeouts and addresses from horovodrun (HOROVOD_* variables)")
    if engine == "tf" and process_sets and stack.HOROVOD:
        raise ValueError("process_sets are Horovod's; engine='tf' builds its own groups from "
                         "the grids: pass grid=/extra_grids= instead")
    if collective_timeout is not None and not collective_timeout > 0:
        raise ValueError(f"collective_timeout must be > 0 seconds, got {collective_timeout!r}")


def _init_tf(grid, extra_grids, reduce_scatter_impl, collective_timeout, tf_host, tf_port,
             with_horovod):
    """The tf engine: bootstrap TF's cluster (TF_CONFIG or horovodrun); Horovod only if asked."""
    global _state
    from tftorus.cluster import discovery, tf_runtime
    from tftorus.engines.tf_engine import TFCollectiveCommunicator

    if _state is not None:
        if _state.comm.engine != "tf":
            raise RuntimeError(f"tftorus already runs on the {_state.comm.engine!r} engine; "
                               f"call init() once per process with one engine")
        comm = _state.comm
        wanted = resolve_grid(grid, comm.size, comm.local_size)
        if grid is not None and wanted != _state.grid:
            raise GridError(f"tftorus is already running on a {_state.grid} grid; {wanted} "
                            f"was asked for: pass it to the first init() call")
        return _state
    if reduce_scatter_impl not in (None, "auto", "alltoall", "native"):
        raise ValueError(f"reduce_scatter_impl must be 'alltoall' or 'native' (or None for the "
                         f"engine's choice), got {reduce_scatter_impl!r}")
    tf_runtime.check_not_started()  # before horovodrun's rendezvous publishes a port
    cluster = discovery.discover(tf_host, tf_port, collective_timeout)
    # before TF starts
    grids = _grids_for(cluster.size, cluster.local_size, grid, extra_grids, "tf")
    cluster = tf_runtime.bootstrap(tf_host, tf_port, collective_timeout)
    comm = TFCollectiveCommunicator(cluster, _groups_of(grids), reduce_scatter_impl or "auto",
                                    collective_timeout)
    horovod_comm = None
    if with_horovod:
        if cluster.source != "horovodrun":
            raise ValueError(f"with_horovod=True needs horovodrun; this cluster came from "
                             f"{cluster.source}")
        if not stack.HOROVOD:
            raise stack.horovod_required("with_horovod=True")
        from tftorus.engines.horovod_engine import HorovodCommunicator
        sets = [hvd.ProcessSet(list(g)) for g in _groups_of(grids)]
        hvd.init(process_sets=sets)
        horovod_comm = HorovodCommunicator(sets, "alltoall")
    _state = _State(comm, grids[0], horovod_comm)
    _new_generation()
    _log_grid()
    _plan_links(grid_given=grid is not None)
    return _state


def _adopt_running_horovod(grid, extra_grids, reduce_scatter_impl):
    """Horovod already runs (the user called hvd.init()): add the sets if it allows that."""
    global _state
    from tftorus.engines.horovod_engine import HorovodCommunicator
    if is_elastic():
        return _start_elastic(_Asked(grid, list(extra_grids), reduce_scatter_impl))
    size, local_size = hvd.size(), hvd.local_size()
    grids = _grids_for(size, local_size, grid, extra_grids, "horovod")
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
    _new_generation()
    _log_grid()
    _plan_links(grid_given=grid is not None)
    return _state


def _start_elastic(asked: "_Asked", before: Optional[_State] = None) -> _State:
    """Horovod runs under its elastic driver: the world's grid, on the global set's all-to-all
    (tftorus/engines/horovod_elastic_engine.py says why no process set), planned from what init()
    was asked
    for; where that does not fit this world's size the grid is planned, and the log says why."""
    global _state
    from tftorus.engines.horovod_elastic_engine import GlobalSetCommunicator
    if asked.reduce_scatter_impl == "native":
        raise ValueError("reduce_scatter_impl='native' needs process sets, which an elastic job "
                         "cannot keep (tftorus/engines/horovod_elastic_engine.py): leave it at "
                         "'alltoall'")
    size = hvd.size()
    # Every rank must plan the same grid: hosts with unequal slot counts (elastic discovery can
    # give those) have no common node size, so plan as if each rank were its own node then.
    local_size = hvd.local_size() if hvd.is_homogeneous() else 1
    why = [] if hvd.is_homogeneous() else [
        "the hosts have unequal numbers of ranks, so rows are not fitted to hosts"]
    grid = asked.grid
    try:
        resolve_grid(grid, size, local_size)
    except GridError as e:
        if before is None:
            raise  # the first world: the user's grid is wrong, not the driver's new size
        why.append(f"the grid asked for does not fit ({e}), so one was planned")
        grid = None
    extra = []
    for g in asked.extra_grids:
        try:
            resolve_grid(g, size, local_size)
            extra.append(g)
        except GridError:
            why.append(f"extra grid {g!r} left out (it does not fit {size} ranks)")
    grids = _grids_for(size, local_size, grid, extra)
    _state = _State(GlobalSetCommunicator(), grids[0], asked=asked)
    _new_generation()
    g = grids[0]
    if min(g.x, g.y) == 1 and size > 1 and len(divisors(size)) == 2:
        why.append(f"{size} is prime, so the torus is one row of {size} (a ring)")
    if _state.comm.rank == 0:
        was = f", was {before.grid.size} ranks as {before.grid}" if before else ""
        logger.info("tftorus: world %d (elastic): %d ranks as a %s torus (%d rows of %d), %d "
                    "sequential steps per all-reduce%s%s", _generation, size, g, g.y, g.x,
                    g.sequential_steps, was, "".join(f"; {w}" for w in why))
    return _state


def is_elastic() -> bool:
    """Whether Horovod's elastic driver launched this process (horovodrun with --min-np,
    --max-np or --host-discovery-script sets HOROVOD_ELASTIC=1 for its workers)."""
    return os.environ.get("HOROVOD_ELASTIC", "0") not in ("", "0")


def generation() -> int:
    """How many worlds this process has formed: init() makes the first, each reform() one more."""
    return _generation


def _new_generation():
    global _generation
    _generation += 1
    if _generation_variable is not None:
        _generation_variable.assign(_generation)


def world_guard(size: int, grid: TorusGrid):
    """In a traced step for a world of `size` ranks on `grid`, an op that fails unless the
    world is still the one it was traced for (elastic jobs only, else None). A step traced
    before a reset would otherwise run Horovod collectives on process sets that no longer
    exist, or divide by the old world size."""
    global _generation_variable
    if not is_elastic():
        return None
    if graph_homes.lifted_graph() is not None:
        # a TF1 graph's session cannot read the eager variable below
        # (tftorus/engines/graph_homes.py)
        now = tf.numpy_function(lambda: np.int64(_generation), [], tf.int64)
    else:
        if _generation_variable is None:
            with tf.init_scope():  # made eagerly, once, even when first asked for in a trace
                _generation_variable = tf.Variable(_generation, dtype=tf.int64,
                                                   trainable=False,
                                                   name="tftorus_world_generation")
        now = _generation_variable
    traced = _generation
    return tf.debugging.assert_equal(
        now, tf.constant(traced, tf.int64),
        message=f"tftorus: this step was traced for world {traced} ({size} ranks, "
                f"a {grid} torus), but the world has re-formed since (elastic reset); a "
                f"traced step cannot follow it. Create the tf.function inside the function "
                f"given to hvd.elastic.run, so each world traces its own; Keras' fit retraces "
                f"by itself with hvd.elastic.KerasState")


def reform() -> _State:
    """After Horovod's elastic driver changed the world (tftorus.elastic.run's reset): restart
    Horovod on it and plan its grid (_start_elastic). Reductions traced before refuse to run."""
    global _state
    if _state is None or _state.asked is None:
        raise RuntimeError("tftorus re-forms a world it started under Horovod's elastic driver "
                           "(horovodrun with --min-np/--max-np or --host-discovery-script); "
                           "call tftorus.init() there first")
    before = _state
    _state = None
    hvd.shutdown()
    hvd.init()
    return _start_elastic(before.asked, before)


#: The gradient set the grid is planned for at init, before the model is known (groups and
#: process sets are made then): about ResNet-50's in FP16. Buckets, chunks and algorithms are
#: planned later, per traced step, for the real gradients (tftorus/runtime/reduction.py).
GRID_PLAN_BYTES = 64 << 20
PROBE_ENV = "TFTORUS_PROBE"


def _engine_caps(engine: str) -> "planner.Engine":
    """What the planner needs of an engine before its communicator exists (the grid)."""
    gloo = engine == "horovod" and not tf.config.list_physical_devices("GPU")
    return planner.Engine(concurrent_groups=engine == "tf", columns_in_turn=gloo)


def _planned_grid(size: int, local_size: int, links, engine: str) -> TorusGrid:
    return planner.plan(size, local_size, [(GRID_PLAN_BYTES, "grid")], links,
                        _engine_caps(engine)).grid


def _plan_links(grid_given: bool) -> None:
    """The links the planner works from: TFTORUS_LINKS, else measured
    (tftorus/planning/link_probe.py)
    on jobs of two hosts or more; none on one host (nothing to plan there), under the elastic
    driver (the world changes), or with TFTORUS_PROBE=0 (the fixed rules)."""
    comm = _state.comm
    given = planner.links_from_env()
    size, local_size = comm.size, comm.local_size
    if local_size >= size or size % local_size or is_elastic():
        return
    if given is None and os.environ.get(PROBE_ENV, "1").strip() == "0":
        if comm.rank == 0:
            logger.info("tftorus: %s=0: no link probe; fixed rules for buckets, chunks and "
                        "algorithms", PROBE_ENV)
        return
    links = given
    if links is None:
        start = time.perf_counter()
        from tftorus.planning import link_probe
        links = link_probe.probe(comm, local_size)
        if comm.rank == 0:
            logger.info("tftorus: link probe %.2f s; links %s (%s=%r gives them without the "
                        "probe)", time.perf_counter() - start, links.describe(),
                        planner.LINKS_ENV, links.spec())
    _state.links = links
    if grid_given:
        return
    best = _planned_grid(size, local_size, links, comm.engine)
    if best == _state.grid:
        return
    if hasattr(comm, "register_groups"):  # the tf engine makes groups on demand: re-plan
        comm.register_groups(_groups_of([best]))
        _state.grid = best
        if comm.rank == 0:
            logger.info("tftorus: grid re-planned for the measured links: %s", best)
            _log_grid()
    elif comm.rank == 0:
        logger.info("tftorus: the measured links favour a %s grid over %s; Horovod's process "
                    "sets are fixed at init: set %s=%r (or grid=%r) to start on it",
                    best, _state.grid, planner.LINKS_ENV, links.spec(), str(best))


def links():
    """The planner's links (measured at init or given), or None: fixed rules."""
    return _state.links if _state is not None else None


def _log_grid():
    if _state.comm.rank == 0:
        g = _state.grid
        logger.info("tftorus: %d ranks as a %s torus (%d rows of %d), %d sequential steps "
                    "per all-reduce (a ring takes %d)", g.size, g, g.y, g.x,
                    g.sequential_steps, 2 * (g.size - 1))


def is_initialized() -> bool:
    """Whether tftorus.init() (or a tftorus call under a running Horovod) started tftorus."""
    return _state is not None


def state() -> _State:
    """The running state; starts it if Horovod runs but tftorus.init() was not called."""
    if _state is None:
        if not horovod_running():
            raise RuntimeError("call tftorus.init() (in place of hvd.init()) before building "
                               "a tftorus optimizer or all-reduce")
        _adopt_running_horovod(None, [], "alltoall")
    return _state


def check_engine_name(engine: Optional[str]) -> None:
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose 'horovod' (Horovod process sets) "
                         f"or 'tf' (TensorFlow's collective ops), or None for the engine "
                         f"tftorus.init() started")


def communicator(engine: Optional[str] = None) -> Communicator:
    """The running communicator of `engine` (None: the one tftorus.init() was asked for)."""
    check_engine_name(engine)
    comm = state().comm
    if engine is None or engine == comm.engine:
        return comm
    if engine == "horovod" and horovod_running():
        # The tf engine under horovodrun starts Horovod too: its process sets are the same grids.
        if _state.horovod_comm is None:
            raise RuntimeError("Horovod runs without tftorus' process sets; call tftorus.init("
                               "engine='tf') before hvd.init() so both engines get their groups")
        return _state.horovod_comm
    raise RuntimeError(
        f"engine={engine!r} was asked for, but tftorus.init() started the {comm.engine!r} engine "
        f"only. Start it with tftorus.init(engine='tf') under horovodrun to have both, or drop "
        f"engine= to use the running one")


def horovod_running() -> bool:
    """Whether Horovod is installed and started in this process."""
    return hvd is not None and hvd.is_initialized()


def is_whole_world(process_set) -> bool:
    """True for None, Horovod's global set, and the stand-ins for it on the tf engine
    (tftorus.training.optimizer_horovod.WorldProcessSet, tftorus.training.optimizer_keras3's
    world)."""
    if process_set is None or getattr(process_set, "whole_world", False):
        return True
    return hvd is not None and (process_set is hvd.global_process_set
                                or process_set == hvd.global_process_set)


def default_grid() -> TorusGrid:
    return state().grid


def grid_for(algorithm: str, grid: GridSpec = None, engine: Optional[str] = None) -> TorusGrid:
    """The grid an algorithm runs on: the node grid for 'hierarchical', else the torus grid."""
    comm = communicator(engine)
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
    if _state is not None:
        # On the tf engine task 0 resolves every group: it must outlive the last collective.
        _state.comm.barrier()
        if hasattr(_state.comm, "stop_health_checks"):  # tf engine: peers may now exit
            _state.comm.stop_health_checks()
    if horovod_running():
        if _state is None or _state.comm.engine != "horovod":
            # Horovod beside the tf engine (or started alone): its own world waits too, so no
            # rank stops it, or leaves task 0's barrier, while a peer is still in either.
            from tftorus.engines.horovod_engine import HorovodCommunicator
            HorovodCommunicator().barrier()
        hvd.shutdown()
    _state = None
