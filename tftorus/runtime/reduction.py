"""Fused, checked all-reduce of a list of tensors: what a training step's gradients go through.

    tensors -> check dtypes -> prescale -> compress -> fuse into buckets (in the order a
            backward pass makes gradients) -> cross-rank check -> algorithm (torus / ring /
            hierarchical, or chosen per bucket by 'auto') per bucket -> unfuse -> decompress
            -> postscale

Nothing here joins the buckets: each bucket's collectives depend on its own tensors only, so in
a training step's graph the first bucket is on the wire while earlier layers still compute
their gradients (fusion.py).

`make_allreduce_grads_fn` wraps it with Horovod's gradient conventions (None gradients,
IndexedSlices, Average/Sum with a predivide factor, groups) so Horovod's own optimizer and tape
wrappers can call it in place of theirs.
"""
import dataclasses
import logging
import zlib
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tftorus.planning import planner
from tftorus.runtime import gradient_readiness, plan_guard, process_state, stack
from tftorus.torus import algorithms, fusion
from tftorus.torus.communicator import Communicator
from tftorus.torus.compression import Compression
from tftorus.torus.grid import GridSpec, TorusGrid

#: Dtypes the all-reduce takes. Integers are summed exactly; an integer Average truncates
#: toward zero, as Horovod's does.
SUPPORTED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)

_OPS = {stack.Average: "average", stack.Sum: "sum"}
logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TorusOptions:
    """The knobs tftorus adds to Horovod's optimizer arguments."""

    # 'auto' (per buffer: planned, or algorithms.choose), 'torus', 'ring', 'hierarchical'
    algorithm: str = "auto"
    grid: GridSpec = None  # None: the grid given to tftorus.init()
    # None: planned from the links (tftorus/planning/planner.py), 16 MiB where none are known
    fusion_threshold_bytes: Optional[int] = None
    check_consistency: bool = True  # one tiny all-reduce per step: mismatched ranks fail, not hang
    engine: Optional[str] = None  # 'horovod' or 'tf'; None: the engine tftorus.init() started
    pipeline_chunks: Optional[int] = None  # torus chunks per buffer; None: planned

    @classmethod
    def pop_from(cls, kwargs: dict) -> "TorusOptions":
        """The options from a call's keyword arguments, removed from them: `torus_options=`
        (a TorusOptions), or its fields by name (algorithm=, grid=, ...), not both."""
        given = {f.name: kwargs.pop(f.name) for f in dataclasses.fields(cls) if f.name in kwargs}
        options = kwargs.pop("torus_options", None)
        if options is not None and given:
            raise TypeError(f"give torus_options= or its fields ({', '.join(given)}), not both")
        if options is not None and not isinstance(options, cls):
            raise TypeError(f"torus_options must be a tftorus.TorusOptions, got {options!r}")
        return options or cls(**given)

    def __post_init__(self):
        algorithms.check_algorithm(self.algorithm)
        algorithms.check_chunks(self.pipeline_chunks)
        process_state.check_engine_name(self.engine)
        threshold = self.fusion_threshold_bytes
        if threshold is not None and (not isinstance(threshold, int) or threshold < 0):
            raise ValueError(f"fusion_threshold_bytes must be a whole number >= 0, got "
                             f"{threshold!r} (None: planned)")


def op_name(op) -> str:
    """Horovod's op constants (hvd.Average, hvd.Sum) or 'average'/'sum' -> 'average'/'sum'."""
    if isinstance(op, str) and op.lower() in ("average", "sum"):
        return op.lower()
    if not isinstance(op, str) and op in _OPS:
        return _OPS[op]
    raise ValueError(f"op must be hvd.Average or hvd.Sum (or 'average'/'sum'), got {op!r}")


def check_dtype(tensor, index: int) -> None:
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"tensor #{index} ({getattr(tensor, 'name', '?')}) has dtype {tensor.dtype.name}, "
            f"which the all-reduce cannot sum; cast it to one of "
            f"{[d.name for d in SUPPORTED_DTYPES]}")


def check_compression(compression) -> None:
    """A compressor is a class with compress/decompress (Horovod's interface), not a name."""
    if not (callable(getattr(compression, "compress", None))
            and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"compression must be tftorus.Compression.none, .fp16 or .bf16 (or a "
                        f"Horovod compressor with compress/decompress), got {compression!r}")


def _scale(tensor, factor: float):
    if factor == 1.0:
        return tensor
    if tensor.dtype.is_integer:
        if factor >= 1.0 and float(factor).is_integer():
            return tensor * tf.cast(int(factor), tensor.dtype)
        return tf.cast(tf.cast(tensor, tf.float64) * factor, tensor.dtype)  # truncates
    # tf.constant, not tf.cast: a Python float cast goes through float32 first, which would
    # round a float64 tensor's 1/3 to float32's (3e-8 apart)
    return tensor * tf.constant(factor, tensor.dtype)


def _finish(tensor, postscale_factor: float, divisor: int):
    """Postscale, then divide by the world size for an Average (integers: truncated, exactly)."""
    if tensor.dtype.is_integer:
        tensor = _scale(tensor, postscale_factor)
        return tensor if divisor == 1 else tf.truncatediv(tensor, tf.cast(divisor, tensor.dtype))
    return _scale(tensor, postscale_factor / divisor)


def _consistency_check(comm: Communicator, buckets, signature: str):
    """All ranks compare what they are about to reduce; a mismatch raises on every rank.

    Without it, ranks that hand in different shapes would post collectives of different
    sizes, which Horovod's alltoall and allgather accept and which then corrupt or hang.
    """
    digest = zlib.crc32(signature.encode()) & 0x7FFFFFFF
    sig = tf.constant([len(buckets), sum(b.length for b in buckets), digest], tf.int64)
    both = comm.all_reduce(tf.concat([sig, -sig], 0), comm.all_ranks(), op="max")
    return tf.debugging.assert_equal(
        both[:3], -both[3:],
        message="tftorus: ranks handed different tensors to the all-reduce (bucket count, "
                "element count or shape/dtype digest differ; first row max, second min). Every "
                "rank must reduce the same tensors, with the same shapes and dtypes, in the "
                "same order")


def fused_allreduce(tensors: Sequence[tf.Tensor], op="sum", *, algorithm: str = "torus",
                    grid: GridSpec = None, compression=Compression.none,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    fusion_threshold_bytes: Optional[int] = None,
                    check_consistency: bool = True, engine: Optional[str] = None,
                    pipeline_chunks: Optional[int] = None,
                    comm: Optional[Communicator] = None,
                    torus_grid: Optional[TorusGrid] = None) -> List[tf.Tensor]:
    """All-reduce dense tensors over every rank; returns them in order and shape.

    algorithm: 'torus', 'ring', 'hierarchical', or 'auto' (chosen per fused buffer by topology
    and size: algorithms.choose).
    op: 'sum' or 'average' (or hvd.Sum / hvd.Average). Average divides by the world size after
    the sum (and after `postscale_factor`); for integers it truncates toward zero, as Horovod.
    engine: 'horovod' or 'tf' (None: the one tftorus.init() started).
    pipeline_chunks: chunks per fused buffer for the torus' phase pipeline (None: chosen by
    buffer size and engine, see algorithms.pipeline_chunks; 1: off). Each element is summed by
    the same ranks either way; see algorithms.py for when the last bit can differ.
    """
    options = TorusOptions(algorithm=algorithm, grid=grid,
                           fusion_threshold_bytes=fusion_threshold_bytes,
                           check_consistency=check_consistency, engine=engine,
                           pipeline_chunks=pipeline_chunks)
    return _reduce(options, tensors, op, compression, prescale_factor, postscale_factor, comm,
                   torus_grid)


def _reduce(options: TorusOptions, tensors: Sequence[tf.Tensor], op, compression,
            prescale_factor: float, postscale_factor: float, comm: Optional[Communicator],
            torus_grid: Optional[TorusGrid], gradients: bool = False) -> List[tf.Tensor]:
    """fused_allreduce with its knobs as one TorusOptions (the optimizers hold one).
    gradients: a training step's, whose readiness the step may clock for replan()."""
    op = op_name(op)
    check_compression(compression)
    comm = comm or process_state.communicator(options.engine)
    torus_grid = torus_grid or process_state.grid_for(options.algorithm, options.grid,
                                                      options.engine)
    for i, t in enumerate(tensors):
        if t is None:
            raise ValueError(f"tensor #{i} is None: hand the all-reduce tensors only (a variable "
                             f"without a gradient gives None; leave it out)")
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for i, t in enumerate(tensors):
        check_dtype(t, i)
    # one unit, in order, where a TF1 session runs it (the tf engine: as_one_call)
    return comm.as_one_call(
        lambda ts: _reduce_checked(options, ts, op, compression, prescale_factor,
                                   postscale_factor, comm, torus_grid, gradients),
        tensors, [tf.TensorSpec(t.shape, t.dtype) for t in tensors])


def _reduce_checked(options, tensors, op, compression, prescale_factor, postscale_factor, comm,
                    torus_grid, gradients, layout=None) -> List[tf.Tensor]:
    """layout: the plan to run (the guard's trials); None: _plan's."""
    wire, ctxs = [], []
    for t in tensors:
        w, ctx = compression.compress(_scale(t, prescale_factor))
        wire.append(w)
        ctxs.append(ctx)
    if layout is None:
        trial = _Trial(options, [tf.TensorSpec(t.shape, t.dtype) for t in tensors], op,
                       compression, prescale_factor, postscale_factor, comm, torus_grid)
        buckets, chosen, chunks = _plan(options, comm, torus_grid, wire,
                                        tensors if gradients else None, trial)
    else:
        buckets = fusion.buckets_of(wire, [b.indices for b in layout.buckets])
        chosen, chunks = [b.algorithm for b in layout.buckets], [b.chunks for b in layout.buckets]
    checks = []
    if options.check_consistency and comm.size > 1:
        signature = f"{torus_grid}|{op}|" + ";".join(
            f"{name}:{b.dtype.name}{b.shapes}" for name, b in zip(chosen, buckets))
        checks = [c for c in [_consistency_check(comm, buckets, signature)] if c is not None]
    out: List[Optional[tf.Tensor]] = [None] * len(tensors)
    with tf.control_dependencies(checks):
        grids = [process_state.grid_for("hierarchical", engine=options.engine)
                 if name == "hierarchical" and options.algorithm != "hierarchical"  # planned
                 else torus_grid for name in chosen]
        summed = _reduce_buckets(comm, grids, chosen, wire, buckets, chunks)
        for bucket, pieces in zip(buckets, summed):
            for i, piece in zip(bucket.indices, pieces):
                out[i] = _finish(compression.decompress(piece, ctxs[i]), postscale_factor,
                                 comm.size if op == "average" else 1)
    return out


def _reduce_buckets(comm: Communicator, grids, chosen, wire, buckets, chunks
                    ) -> List[List[tf.Tensor]]:
    """Every bucket's summed tensors, the buckets in ready order. Where the engine runs
    different groups' collectives at once, consecutive torus buckets go as one pipeline
    (algorithms.torus_pipeline: the column does not wait for a row phase between buckets);
    elsewhere one bucket after the other."""
    out: List[Optional[List[tf.Tensor]]] = [None] * len(buckets)
    run = []  # (bucket number, packed buffer, chunks): torus buckets waiting to go as one

    def flush():
        if run:
            results = algorithms.torus_pipeline(
                comm, grids[run[0][0]], [(packed, k, f"bucket{b}") for b, packed, k in run])
            for (b, _, _), result in zip(run, results):
                out[b] = fusion.unpack(result, buckets[b])
            run.clear()

    for b, (name, bucket) in enumerate(zip(chosen, buckets)):
        if (comm.concurrent_groups and name == "torus" and bucket.length > 0
                and algorithms.packs(name, comm, bucket.dtype)):
            k = algorithms.pipeline_chunks(name, grids[b], comm, bucket.nbytes, chunks[b],
                                           bucket.dtype)
            with tf.name_scope(f"bucket{b}"):
                packed = fusion.pack(wire, bucket, algorithms.alignment(name, grids[b], k))
            run.append((b, packed, k))
            continue
        flush()
        with tf.name_scope(f"bucket{b}"):  # names a bucket's ops in traces and timelines
            out[b] = _reduce_bucket(comm, grids[b], name, wire, bucket, chunks[b])
    flush()
    return out


_plans = {}  # (links, world, options, tensors, profile) -> the plan, made and logged once
_profiles = {}  # tensors -> planner.StepProfile measured by replan()


@dataclasses.dataclass(frozen=True)
class _Trial:
    """What the guard needs to run a candidate plan as the call would: the whole reduction
    (compression, scaling, the consistency check, buckets, unpacking) on zeros of its inputs."""

    options: TorusOptions
    specs: List[tf.TensorSpec]
    op: str
    compression: object
    prescale_factor: float
    postscale_factor: float
    comm: Communicator
    grid: TorusGrid

    def call(self, layout: planner.Plan, number: int):
        """A call that runs `layout` once, as a graph of its own."""
        def run(*tensors):
            with tf.name_scope(f"plan_guard{number}"):
                return _reduce_checked(self.options, list(tensors), self.op, self.compression,
                                       self.prescale_factor, self.postscale_factor, self.comm,
                                       self.grid, False, layout)

        fn = tf.function(run, input_signature=self.specs, autograph=False)
        zeros = [tf.zeros(s.shape, s.dtype) for s in self.specs]
        return lambda: fn(*zeros)


# Plain Python, never converted by autograph: the reduction is traced inside tf.functions that
# autograph converts (Keras' train step, the eager reduction's own), and the planner's search,
# converted call by call, took 90 s of a 4-rank job's first step across two hosts.
@tf.autograph.experimental.do_not_convert
def _plan(options: TorusOptions, comm: Communicator, grid: TorusGrid, wire,
          tensors: Optional[Sequence[tf.Tensor]], trial: _Trial):
    """Buckets, their algorithms and chunk counts: planned from the links where tftorus knows
    them (tftorus/planning/planner.py; what options fix is taken as given), else the fixed rules (16
    MiB buckets, algorithms.choose, algorithms.pipeline_chunks). Planned for the step once replan()
    has measured when the gradients are ready; until then for an assumed backward pass
    (planner.first_plan), while the step clocks them (gradient_readiness.py)."""
    links = process_state.links()
    threshold = options.fusion_threshold_bytes
    if links is None or comm.size == 1:
        buckets = fusion.plan_buckets(wire, fusion.DEFAULT_THRESHOLD_BYTES
                                      if threshold is None else threshold)
        chosen = [algorithms.choose(options.algorithm, grid, comm, b.nbytes) for b in buckets]
        return buckets, chosen, [options.pipeline_chunks] * len(buckets)
    sizes = [(nbytes, dtype.name) for nbytes, dtype in fusion.tensor_sizes(wire)]
    dtypes = {t.dtype for t in wire}
    engine = planner.Engine(concurrent_groups=comm.concurrent_groups, chunks_allowed=all(
        algorithms.chunks_keep_bits(grid, comm, d) for d in dtypes),
        max_bucket_bytes=comm.max_bucket_bytes, max_chunk_bytes=comm.max_chunk_bytes,
        columns_in_turn=comm.columns_in_turn)
    algorithm = None if options.algorithm == algorithms.AUTO else options.algorithm
    step = tensors is not None  # a training step's gradients, else tensors all ready at once
    profile = _profiles.get(tuple(sizes)) if step else None
    if profile is None and step and not tf.executing_eagerly():
        gradient_readiness.clock_for(tuple(sizes), len(tensors)).instrument(tensors)
    key = (links, comm.size, comm.local_size, grid, engine, algorithm, threshold,
           options.pipeline_chunks, tuple(sizes), profile, step, comm.transport)
    if key not in _plans:
        fixed = dict(grid=grid, threshold_bytes=threshold, algorithm=algorithm,
                     chunks=options.pipeline_chunks)

        def make(**change) -> planner.Plan:
            asked = {**fixed, **change}
            return (planner.plan(comm.size, comm.local_size, sizes, links, engine,
                                 profile=profile, **asked) if profile or not step else
                    planner.first_plan(comm.size, comm.local_size, sizes, links, engine,
                                       **asked))
        made = make()
        if comm.rank == 0:
            logger.info("%s", made.describe())
        _plans[key] = _guarded(made, make, trial, wire, links, engine, profile)
    p = _plans[key]
    return (fusion.buckets_of(wire, [b.indices for b in p.buckets]),
            [b.algorithm for b in p.buckets], [b.chunks for b in p.buckets])


def _fixed_rules(options: TorusOptions, comm: Communicator, grid: TorusGrid, wire):
    """What runs without a plan: buckets of the fusion threshold (16 MiB unless fixed), the
    algorithm algorithms.choose gives each (the torus across hosts), the engine's chunk rule;
    as (indices, bytes, algorithm, chunks) per bucket."""
    threshold = options.fusion_threshold_bytes
    buckets = fusion.plan_buckets(wire, fusion.DEFAULT_THRESHOLD_BYTES
                                  if threshold is None else threshold)
    out = []
    for b in buckets:
        name = algorithms.choose(options.algorithm, grid, comm, b.nbytes)
        out.append((b.indices, b.nbytes, name, algorithms.pipeline_chunks(
            name, grid, comm, b.nbytes, options.pipeline_chunks, b.dtype)))
    return out


def _guarded(made: planner.Plan, make, trial: _Trial, wire, links, engine, profile
             ) -> planner.Plan:
    """The plan, or what the guard measured faster in its place (tftorus/runtime/plan_guard.py)
    among `_candidates`."""
    options, comm, grid = trial.options, trial.comm, trial.grid
    if not plan_guard.enabled():  # before the candidates: each is a search of its own
        return made
    threshold = options.fusion_threshold_bytes
    fixed = fusion.DEFAULT_THRESHOLD_BYTES if threshold is None else threshold
    layouts = _fixed_rules(options, comm, grid, wire)
    rules = planner.layout_plan(grid, fixed, layouts, links, comm.local_size, engine, profile,
                                why="the fixed rules")
    unpipelined = planner.layout_plan(grid, fixed, [(i, n, a, 1) for i, n, a, _ in layouts],
                                      links, comm.local_size, engine, profile,
                                      why="the fixed rules without chunks")
    candidates = _candidates(made, rules, unpipelined, make, options)
    if len(plan_guard.distinct(candidates)) < 2:
        return made
    with tf.init_scope():  # the trial runs now, at the trace, on every rank alike
        if not tf.executing_eagerly():  # a TF1 graph: nothing can run while it is built
            return made
        tf_logger = tf.get_logger()
        level = tf_logger.level
        tf_logger.setLevel(logging.ERROR)  # each candidate is a graph: TF warns of "retracing"
        try:
            kept = plan_guard.check(
                comm, candidates, lambda c: trial.call(c.plan, candidates.index(c)),
                what=f"{len(wire)} tensors, "
                     f"{sum(b.nbytes for b in made.buckets) / planner.MIB:.3g} MiB")
        finally:
            tf_logger.setLevel(level)
    if kept.plan is made:
        return made
    return dataclasses.replace(kept.plan, why=f"{kept.name}, which the plan guard measured "
                                              f"faster than the plan")


def _candidates(made: planner.Plan, rules: planner.Plan, unpipelined: planner.Plan, make,
                options: TorusOptions) -> List[plan_guard.Candidate]:
    """What the guard times: the plan; the fixed rules (`rules`); where these pipeline chunks
    and the user did not ask for them, the same without (`unpipelined`: the paper's torus); and,
    by `make(**change)` (the planner with one more choice fixed), what else the planner chose
    between: where it chose the buckets, its choices on buckets of the fixed threshold; where it
    left the torus for a bucket, the best torus."""
    fixed = rules.threshold_bytes
    kinds = "/".join(sorted({b.algorithm for b in rules.buckets}))
    out = [plan_guard.Candidate("the plan", made),
           plan_guard.Candidate(f"the fixed {fixed / planner.MIB:g} MiB {kinds}", rules)]
    if options.pipeline_chunks is None and any(b.chunks > 1 for b in rules.buckets):
        # chunks in flight at once pay off while the CPU keeps up; under a CPU quota that
        # throttles a rank's bursts the unpipelined torus was 1.3x faster (docs/studies/planner.md)
        out.append(plan_guard.Candidate(f"the fixed {fixed / planner.MIB:g} MiB {kinds} "
                                        f"without chunks", unpipelined))
    if options.fusion_threshold_bytes is None:
        out.append(plan_guard.Candidate(f"{fixed / planner.MIB:g} MiB buckets as planned",
                                        make(threshold_bytes=fixed)))
    if options.algorithm == algorithms.AUTO and any(b.algorithm != "torus"
                                                    for b in made.buckets):
        out.append(plan_guard.Candidate("the planned torus", make(algorithm="torus")))
    return out


def replan(engine: Optional[str] = None) -> bool:
    """Plan every clocked gradient set for the training step: read when its gradients were
    ready in the steps so far (gradient_readiness.py), averaged over the ranks, and let the planner
    judge its buckets by the communication the step cannot hide. Collective: call it on every rank
    at the same point, eagerly, after a few steps (tftorus.keras.ReplanCallback does in `fit`);
    then trace the step again (Keras: make_train_function(force=True)). True when a gradient
    set got a profile; False on one host (nothing is planned there) or before any step ran."""
    if process_state.links() is None:
        return False
    comm = process_state.communicator(engine)
    got = gradient_readiness.measured(comm)
    for key, (ready, span) in got.items():
        _profiles[key] = planner.StepProfile(tuple(float(r) for r in ready), span)
        gradient_readiness.forget(key)
        if comm.rank == 0:
            logger.info("tftorus: the step's gradients come %.1f ms apart, first to last (%d "
                        "tensors); planning their all-reduce for the step", span * 1e3,
                        len(ready))
    return bool(got)


def _reduce_bucket(comm: Communicator, grid: TorusGrid, algorithm: str, wire, bucket,
                   pipeline_chunks: Optional[int]) -> List[tf.Tensor]:
    """One bucket: pack its tensors, sum them over the world with `algorithm`, cut them apart
    (or hand them to `algorithm` one by one, where it does not pack: algorithms.packs)."""
    if bucket.length == 0:  # nothing to send: every rank agrees (checked before)
        return [tf.reshape(wire[i], s) for i, s in zip(bucket.indices, bucket.shapes)]
    reduce = algorithms.ALGORITHMS[algorithm]
    if not algorithms.packs(algorithm, comm, bucket.dtype):  # each tensor as soon as it exists
        return [reduce(comm, grid, wire[i], 1) for i in bucket.indices]
    chunks = algorithms.pipeline_chunks(algorithm, grid, comm, bucket.nbytes, pipeline_chunks,
                                        bucket.dtype)
    packed = fusion.pack(wire, bucket, algorithms.alignment(algorithm, grid, chunks))
    return fusion.unpack(reduce(comm, grid, packed, chunks), bucket)


def _partition(grads, vars, groups) -> List[List[int]]:
    """Indices of non-None dense gradients, split per Horovod's `groups` argument."""
    present = [i for i, g in enumerate(grads) if g is not None]
    if groups is None or groups == 0:
        return [present] if present else []
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError(f"groups must be >= 0 or a list of lists of variables, got {groups}")
        return [list(part) for part in np.array_split(present, groups) if len(part)]
    by_name = {stack.variable_name(vars[i]): i for i in present}
    parts = []
    for group in groups:
        part = [by_name.pop(stack.variable_name(v)) for v in group
                if stack.variable_name(v) in by_name]
        if part:
            parts.append(sorted(part))
    parts.extend([i] for i in sorted(by_name.values()))  # ungrouped: one group each
    return parts


def _densify(grad, var):
    """IndexedSlices -> dense, keeping the variable's static shape (fusion needs it; a
    densified IndexedSlices inside a tf.function has an unknown first dimension)."""
    if not isinstance(grad, tf.IndexedSlices):
        return grad
    dense = tf.convert_to_tensor(grad)
    return tf.ensure_shape(dense, var.shape) if var is not None else dense


def make_allreduce_grads_fn(name: str, compression, sparse_as_dense: bool, op,
                            gradient_predivide_factor: float, groups, process_set,
                            options: TorusOptions):
    """A `allreduce_grads(grads, vars=None, use_generic_names=False)` with Horovod's contract."""
    op = op_name(op)
    check_compression(compression)
    if gradient_predivide_factor <= 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
    # A sub-set of ranks has no grid: 'auto' takes Horovod's all-reduce on it, as 'ring' does.
    flat_on_subset = options.algorithm in ("ring", algorithms.AUTO)
    if not process_state.is_whole_world(process_set) and not flat_on_subset:
        raise ValueError(
            "tftorus lays its grid over all ranks; for a sub-set of ranks use "
            "algorithm='ring' (Horovod's all-reduce on that process set) or "
            "hvd.DistributedOptimizer")
    process_state.grid_for(options.algorithm, options.grid, options.engine)  # grid errors, now
    group = None if process_state.is_whole_world(process_set) else tuple(sorted(process_set.ranks))

    def world():
        """The communicator, grid and divisor of the world this trace runs in: read per trace,
        so a step traced after an elastic reset reduces over the new world's groups."""
        comm = process_state.communicator(options.engine)
        torus_grid = process_state.grid_for(options.algorithm, options.grid, options.engine)
        return comm, torus_grid, len(group) if group else comm.size

    # Average as Horovod splits it: divide by the predivide factor before the sum, the rest after.
    pre = 1.0 / gradient_predivide_factor if op == "average" else 1.0

    def reduce_dense(dense, comm, torus_grid, set_size):
        post = gradient_predivide_factor / set_size if op == "average" else 1.0
        if group and flat_on_subset:  # a sub-set: Horovod's ring on that set
            out = []
            for t in dense:
                wire, ctx = compression.compress(_scale(t, pre))
                out.append(_scale(compression.decompress(comm.all_reduce(wire, group), ctx), post))
            return out
        return _reduce(options, dense, "sum", compression, pre, post, comm, torus_grid,
                       gradients=True)

    def reduce_sparse(grad: tf.IndexedSlices, comm, set_size):
        # As Horovod does: gather every rank's rows; duplicates are summed when applied.
        values = comm.all_gather(grad.values, group or comm.all_ranks())
        indices = comm.all_gather(grad.indices, group or comm.all_ranks())
        if op == "average":
            values = values / tf.cast(set_size, values.dtype)
        return tf.IndexedSlices(values, indices, grad.dense_shape)

    def allreduce_grads(grads, vars=None, use_generic_names=False):
        del use_generic_names  # op names are generated per trace, identically on every rank
        comm, torus_grid, set_size = world()
        guard = process_state.world_guard(comm.size, torus_grid)  # elastic: not in a later world
        with tf.name_scope(f"{name}_TorusAllreduce"), tf.control_dependencies(
                [guard] if guard is not None else []):
            if sparse_as_dense:
                grads = [_densify(g, v) for g, v in zip(grads, vars or [None] * len(grads))]
            out = list(grads)
            sparse = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
            for i in sparse:
                out[i] = reduce_sparse(grads[i], comm, set_size)
            dense = [g if i not in sparse else None for i, g in enumerate(grads)]
            for part in _partition(dense, vars, groups):
                reduced_part = reduce_dense([dense[i] for i in part], comm, torus_grid, set_size)
                for i, reduced in zip(part, reduced_part):
                    out[i] = reduced
            return out

    # Called eagerly (a tape outside tf.function), the reduction runs as a graph of its own.
    # Called inside a traced step, its ops go straight into the step's graph: as a nested
    # tf.function call the tf engine's collectives waited for every gradient (measured with
    # tests/workers/overlap.py; Horovod's ops overlapped either way).
    # One graph per world (an elastic reset forms a new one; a graph keeps its old groups).
    eager_fns = {}

    def reduce_in_place(grads, vars=None, use_generic_names=False):
        if not tf.executing_eagerly():
            return allreduce_grads(grads, vars, use_generic_names)
        if process_state.generation() not in eager_fns:
            eager_fns.clear()
            eager_fns[process_state.generation()] = tf.function(allreduce_grads,
                                                                autograph=False)
        return eager_fns[process_state.generation()](grads, vars, use_generic_names)

    return reduce_in_place


def gradient_reducer(op=stack.Average, compression=Compression.none, *,
                     name: str = "GradientReducer", **torus):
    """`reduce(grads, vars=None) -> grads` averaged (or summed) over all workers on the torus.

    For custom training steps that accumulate or scale gradients themselves before one
    all-reduce per optimizer step (the trainer in official_resnet does). Same semantics as the
    reduction inside DistributedOptimizer; `torus`: TorusOptions' fields by name (algorithm=,
    grid=, fusion_threshold_bytes=, check_consistency=, engine=, pipeline_chunks=) or
    torus_options=.
    """
    options = TorusOptions.pop_from(torus)
    if torus:
        raise TypeError(f"gradient_reducer() got unexpected arguments {sorted(torus)}")
    return make_allreduce_grads_fn(name, compression, False, op, 1.0, None, None, options)


def reducing_optimizer(optimizer):
    """The optimizer that reduces (ours, inside a LossScaleOptimizer if any), or the innermost
    one when none does."""
    inner = optimizer
    while not hasattr(inner, "_allreduce_grads") and hasattr(inner, "inner_optimizer"):
        inner = inner.inner_optimizer  # LossScaleOptimizer around ours
    return inner


def reduce_gradients(optimizer, grads, variables):
    """Average `grads` over the workers with the reduction `optimizer` was built with (a tftorus
    DistributedOptimizer, or a LossScaleOptimizer around one): for train steps that accumulate
    micro-batches themselves and reduce once per update, with the optimizer's own algorithm,
    grid, compression and fusion. Extra tensors may ride in the same fused all-reduce with None
    as their variable (a loss, for one). A plain optimizer on one process: returned unchanged."""
    inner = reducing_optimizer(optimizer)
    if hasattr(inner, "_allreduce_grads"):  # set by Horovod's wrapper to tftorus' reduction
        return list(inner._allreduce_grads(list(grads), list(variables)))
    if process_state._state is not None and process_state._state.comm.size > 1:
        raise TypeError(f"{type(optimizer).__name__} does not reduce gradients over the "
                        f"workers: wrap it, tftorus.keras.DistributedOptimizer(optimizer)")
    return list(grads)
