"""Two checks both engine workers make: what the torus' chunk pipeline does to the result, and
that FP16/BF16 wire compression hands 16-bit tensors to the collectives.

Chunks change no bit where every sum is taken in a fixed order: FP16/BF16 wires (their sums run
as all-to-all plus an FP32 sum in rank order), FP32 with columns of at most 2 ranks (a + b ==
b + a), and FP32 columns of 3 or more ranks on the tf engine, which sums them in rank order
(algorithms.ordered_column). On Horovod such a column is summed by Gloo's ring, whose order for
an element depends on where it sits in the buffer, so forced chunks may change the last bit
there: those cases are held to FP32 rounding (1e-6 of the tensor's largest value) instead.

The wire check runs the real engine: a subclass of the job's communicator records the dtype and
element count of every tensor its collectives are given (after the group-of-one shortcut, so
exactly what goes to Horovod or TF), then calls the engine's own method.
"""
import copy

import numpy as np
import tensorflow as tf

import tftorus
from tftorus.runtime import process_state
from tftorus.torus import algorithms


def two_phase_grids(grids, size):
    """The grids whose torus has both a row and a column phase: what chunks can overlap."""
    return [g for g in grids if 1 < tftorus.resolve_grid(g, size).x < size]


def check_chunks(label, inputs, grid, failures, compression=tftorus.Compression.none,
                 in_function=False) -> int:
    """Chunked (2 and 3 chunks; 2 chunks of 64-byte buckets, which go as one pipeline on the
    tf engine: algorithms.torus_pipeline) against unchunked: bit for bit where the sums' order
    is fixed (see above), else within FP32 rounding. Returns the number of checks."""
    comm = process_state.communicator()
    torus_grid = tftorus.resolve_grid(grid, comm.size)
    fixed_order = (compression is not tftorus.Compression.none or torus_grid.y <= 2
                   or algorithms.ordered_column(torus_grid, comm, tf.float32))
    def run(chunks, threshold=None):
        def reduce(ts):
            return tftorus.fused_allreduce(ts, "sum", algorithm="torus", grid=grid,
                                           compression=compression, pipeline_chunks=chunks,
                                           fusion_threshold_bytes=threshold)
        out = tf.function(reduce)(inputs) if in_function else reduce(inputs)
        return [t.numpy() for t in out]

    base, checks = run(1), 0
    for chunks, threshold in ((2, None), (3, None), (2, 64)):
        for i, (want, got) in enumerate(zip(base, run(chunks, threshold))):
            checks += 1
            if got.shape != want.shape:
                failures.append(f"{label} grid {grid} {chunks} chunks ({threshold} B buckets) "
                                f"tensor #{i}: shape "
                                f"{got.shape} != {want.shape}")
                continue
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            # FP32 rounding of sums of a few unit-normal values: relative to the largest
            bound = 0.0 if fixed_order else 1e-6 * float(np.abs(want).max(initial=1.0))
            if (got.tobytes() != want.tobytes()) if fixed_order else np.any(diff > bound):
                failures.append(f"{label} grid {grid} {chunks} chunks ({threshold} B buckets) "
                                f"tensor #{i}: differs from "
                                f"no chunks by up to {diff.max():.3g} "
                                f"({'bit for bit expected' if fixed_order else 'FP32 rounding'})")
    return checks


def recording(comm, seen):
    """A copy of `comm` whose collectives append (primitive, dtype, elements) to `seen`."""
    base = type(comm)

    class Recording(base):
        def _reduce_scatter(self, tensor, group):
            seen.append(("reduce_scatter", tensor.dtype, tensor.shape.num_elements()))
            return base._reduce_scatter(self, tensor, group)

        def _all_reduce(self, tensor, group, op):
            seen.append(("all_reduce", tensor.dtype, tensor.shape.num_elements()))
            return base._all_reduce(self, tensor, group, op)

        def _all_gather(self, tensor, group, equal_sizes=False):
            seen.append(("all_gather", tensor.dtype, tensor.shape.num_elements()))
            return base._all_gather(self, tensor, group, equal_sizes)

    spy = copy.copy(comm)  # shares the engine's process sets / keys / tokens
    spy.__class__ = Recording
    return spy


def check_wire(grid, rank, failures) -> int:
    """Every data collective of an FP16 / BF16-compressed torus, ring and hierarchical all-reduce
    of FP32 tensors gets a 16-bit tensor (the tf engine moves BF16 bits as FP16, which its
    gather ops take); uncompressed, FP32. Returns the number of checks."""
    comm, checks = process_state.communicator(), 0
    rng = np.random.RandomState(rank)
    inputs = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in ((301,), (7, 40))]
    for algorithm in ("torus", "ring", "hierarchical"):
        torus_grid = process_state.grid_for(algorithm, grid if algorithm == "torus" else None)
        for compression, wire in ((tftorus.Compression.none, tf.float32),
                                  (tftorus.Compression.fp16, tf.float16),
                                  (tftorus.Compression.bf16, tf.bfloat16)):
            seen = []
            out = tftorus.fused_allreduce(inputs, "sum", algorithm=algorithm,
                                          compression=compression, check_consistency=False,
                                          comm=recording(comm, seen), torus_grid=torus_grid)
            checks += 1
            wrong = [s for s in seen if s[1].size != wire.size or not s[1].is_floating]
            label = f"wire {algorithm} {torus_grid} {wire.name}"
            if not seen and comm.size > 1:
                failures.append(f"{label}: no collective was called")
            elif wrong:
                failures.append(f"{label}: collectives got {sorted({s[1].name for s in wrong})}")
            elif any(o.dtype != tf.float32 for o in out):
                failures.append(f"{label}: result not FP32")
    return checks
