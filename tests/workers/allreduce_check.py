"""Worker: every algorithm on every grid of this world equals Horovod's own all-reduce.

Run under `horovodrun --gloo -np N` (or as one process). Each rank checks every case, prints
one line per failure, and exits 1 if any failed; the last line counts the checks.
References: `hvd.allreduce` where Horovod takes the dtype, and always an exact float64 sum of
every rank's input gathered with `hvd.allgather`. Also: the torus' chunk pipeline equals no
chunks bit for bit, and FP16/BF16 compression puts 16-bit tensors on the wire
(tests/workers/pipeline_and_wire.py). `--light` (wide worlds): only the grids with both a row
and a column phase, three dtypes, and the wire and bucket variants on the first case only
(each tensor alone, unfused, still goes through every case: that is what the grid shapes).
"""
import argparse
import os

import horovod.tensorflow as hvd
import numpy as np
import pipeline_and_wire  # noqa: E402  (tests/workers, the script's own folder)
import report  # noqa: E402
import tensorflow as tf

import tftorus
from tftorus.torus.grid import divisors, parse_grid

# Shapes: scalar, one element, odd sizes, sizes below any row length, multi-dim, empty, large odd.
SHAPES = [(), (1,), (3,), (7,), (5, 3), (2, 3, 5), (0,), (0, 4), (1001,), (13, 17, 3)]
DTYPES = [tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64]
TOLERANCE = {  # bound on |error| as a fraction of sum(|x|) over ranks, per wire dtype
    tf.float64: 1e-12, tf.float32: 1e-6, tf.float16: 2e-3, tf.bfloat16: 2e-2,
}

failures = []
checks = 0


def make_inputs(dtype, integer_valued, seed):
    rng = np.random.RandomState(seed)
    out = []
    for shape in SHAPES:
        if integer_valued or dtype.is_integer:
            values = rng.randint(-8, 9, size=shape)
        else:
            values = rng.standard_normal(size=shape)
        out.append(tf.cast(tf.constant(values, tf.float64), dtype))
    return out


def exact_sum(t):
    """float64 sum over ranks of every rank's tensor, and of their magnitudes."""
    wide = tf.cast(t, tf.float64)
    gathered = hvd.allgather(tf.expand_dims(wide, 0)).numpy()  # [N, ...]
    return gathered.sum(axis=0), np.abs(gathered).sum(axis=0)


_references = {}


def references(key, inputs):
    """Per input: (exact float64 sum over ranks, sum of magnitudes, Horovod's own sum or None).

    Every algorithm, grid and option is compared with the same references, so they are made
    once per input set: one allgather of the whole set, and hvd.allreduce per tensor where
    Horovod takes the dtype. (Per comparison they were 2 of every 3 collectives here.)"""
    if key not in _references:
        wide = [tf.reshape(tf.cast(t, tf.float64), [-1]) for t in inputs]
        gathered = hvd.allgather(tf.concat(wide, 0)[None]).numpy()  # [N, all elements]
        ends = np.cumsum([int(w.shape[0]) for w in wide])
        parts = np.split(gathered, ends[:-1], axis=1)
        refs = []
        for t, part in zip(inputs, parts):
            part = part.reshape((gathered.shape[0], *t.shape))
            horovod = (hvd.allreduce(t, op=hvd.Sum).numpy().astype(np.float64)
                       if t.dtype in (tf.float32, tf.float64, tf.int32, tf.int64) else None)
            refs.append((part.sum(axis=0), np.abs(part).sum(axis=0), horovod))
        _references[key] = refs
    return _references[key]


def compare(name, got, want, scale, tol):
    global checks
    checks += 1
    got = tf.cast(got, tf.float64).numpy()
    if got.shape != want.shape:
        failures.append(f"{name}: shape {got.shape} != {want.shape}")
        return
    err = np.abs(got - want)
    bound = tol * scale + (0.0 if tol == 0 else 1e-30)
    if np.any(err > bound):
        worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.ndim else ()
        failures.append(f"{name}: error {err[worst]:.3g} > bound {np.asarray(bound)[worst]:.3g} "
                        f"(got {got[worst]}, want {want[worst]})")


def check_case(label, inputs, wire_dtype, integer_valued, key, **kwargs):
    """key: names the input set (its references are made once, see references)."""
    out = tftorus.fused_allreduce(inputs, "sum", **kwargs)
    exact = bool(integer_valued or wire_dtype.is_integer)
    for shape, t, o, (want, scale, horovod) in zip(SHAPES, inputs, out, references(key, inputs)):
        tol = 0.0 if exact else TOLERANCE[wire_dtype]
        compare(f"{label} shape={shape}", o, want, scale, tol)
        if horovod is not None and not kwargs.get("compression"):
            compare(f"{label} shape={shape} vs hvd.allreduce", o, horovod, scale, tol)
        if o.dtype != t.dtype:
            failures.append(f"{label} shape={shape}: dtype {o.dtype.name} != {t.dtype.name}")


def check_fp16_pairs(grids, rank):
    """An FP16 sum over two ranks (Horovod's all-reduce on the engine: a world or a column of 2)
    has the bits of the FP32 sum rounded once to FP16, as over 3+ ranks (summed in rank order)."""
    global checks
    comm = tftorus.runtime.process_state.communicator(None)
    groups = {tuple(range(comm.size))} if comm.size == 2 else set()
    for spec in grids:
        y, x = (int(v) for v in spec.split("x"))
        if y == 2:
            groups.add(tuple(sorted({rank % x, rank % x + x})))
    rng = np.random.RandomState(rank)
    # magnitudes apart by up to 2^12, so most pair sums round
    mine = (rng.standard_normal(4096) * 2.0 ** rng.randint(-6, 7, 4096)).astype(np.float16)
    for group in sorted(groups):
        got = comm.all_reduce(tf.constant(mine), group).numpy()
        both = hvd.allgather(tf.constant(mine[None])).numpy()[list(group)]
        want = (both[0].astype(np.float32) + both[1].astype(np.float32)).astype(np.float16)
        checks += 1
        differ = int(np.sum(got.view(np.uint16) != want.view(np.uint16)))
        if differ:
            failures.append(f"fp16 pair sum over {group}: {differ} of {got.size} elements differ "
                            f"in their bits from the FP32 sum rounded to FP16")


def main():
    global checks
    parser = argparse.ArgumentParser()
    parser.add_argument("--light", action="store_true", help="fewer grids and dtypes")
    light = parser.parse_args().light
    n = int(os.environ.get("HOROVOD_SIZE", "1"))  # the grids must be known before init
    grids = [f"{n // x}x{x}" for x in divisors(n)]
    tftorus.init(grid=grids[0], extra_grids=grids[1:])
    rank = hvd.rank()
    two_phase = pipeline_and_wire.two_phase_grids(grids, n)
    cases = [("torus", g) for g in (two_phase if light else grids)]
    cases += [("ring", None), ("hierarchical", None)]
    # leader-based hierarchical on grids with a row and a column phase (the node grid of one
    # host has one row, so its leaders' step would be local): nodes of X ranks, as on hosts
    cases += [("hierarchical", g) for g in two_phase]
    dtypes = [tf.float32, tf.float16, tf.int32] if light else DTYPES
    for c, (algorithm, grid) in enumerate(cases):
        # --light: what depends on the grid (each tensor alone on it: sizes below a row, empty,
        # scalars) on every case; the wire and bucket variants on the first grid only
        every_variant = not light or c == 0
        for dtype in dtypes:
            for integer_valued in ([True, False] if dtype.is_floating else [True]):
                key = (dtype.name, integer_valued)
                inputs = make_inputs(dtype, integer_valued, seed=100 * rank + DTYPES.index(dtype))
                label = f"{algorithm} {grid or ''} {dtype.name} {'int-valued' if integer_valued else 'random'}"
                where = (dict(torus_grid=parse_grid(grid, n)) if algorithm == "hierarchical"
                         and grid else dict(grid=grid))
                check_case(label, inputs, dtype, integer_valued, key, algorithm=algorithm,
                           **where)
                if dtype == tf.float32 and not integer_valued:
                    wires = [("fp16", tftorus.Compression.fp16, tf.float16),
                             ("bf16", tftorus.Compression.bf16, tf.bfloat16)]
                    for name, comp, wire in wires if every_variant else []:
                        check_case(f"{label} {name}-wire", inputs, wire, False, key,
                                   algorithm=algorithm, compression=comp, **where)
                    check_case(f"{label} unfused", inputs, dtype, False, key,
                               algorithm=algorithm, fusion_threshold_bytes=0, **where)
                    if every_variant:
                        check_case(f"{label} 64B-buckets", inputs, dtype, False, key,
                                   algorithm=algorithm, fusion_threshold_bytes=64, **where)
    # The chunk pipeline: bit for bit the same as none, eagerly and in a tf.function.
    for k, grid in enumerate(two_phase[:1] if light else two_phase):
        inputs = make_inputs(tf.float32, False, seed=100 * rank + 50 + k)
        checks += pipeline_and_wire.check_chunks("chunks float32", inputs, grid, failures)
        if not light:  # the wide worlds: chunks eagerly (N <= 6 trace them as well)
            checks += pipeline_and_wire.check_chunks("chunks fp16-wire", inputs, grid, failures,
                                                     tftorus.Compression.fp16, in_function=True)
    checks += pipeline_and_wire.check_wire(two_phase[0] if two_phase else None, rank, failures)
    check_fp16_pairs(grids, rank)
    # Average, as Horovod defines it (integers truncate).
    for dtype in (tf.float32, tf.int32):
        t = tf.cast(tf.range(-7, 8) * (rank + 1), dtype)
        got = tftorus.fused_allreduce([t], "average")[0]
        want = hvd.allreduce(t, op=hvd.Average)
        compare(f"average {dtype.name}", got, want.numpy().astype(np.float64),
                np.ones(t.shape), 1e-6 if dtype.is_floating else 0.0)
    # Inside a tf.function, as a training step runs it.
    step = tf.function(lambda ts: tftorus.fused_allreduce(ts, "sum"))
    inputs = make_inputs(tf.float32, False, seed=rank)
    for shape, t, o in zip(SHAPES, inputs, step(inputs)):
        want, scale = exact_sum(t)
        compare(f"tf.function shape={shape}", o, want, scale, TOLERANCE[tf.float32])

    report.finish(rank, checks, failures, what=f"grids {grids}: ")


if __name__ == "__main__":
    main()
