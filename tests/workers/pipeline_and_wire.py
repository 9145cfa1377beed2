"""Two checks both engine workers make: the torus' chunk pipeline changes no bit of the result,
and FP16/BF16 wire compression hands 16-bit tensors to the collectives.

The wire check runs the real engine: a subclass of the job's communicator records the dtype and
element count of every tensor its collectives are given (after the group-of-one shortcut, so
exactly what goes to Horovod or TF), then calls the engine's own method.
"""
import copy

import numpy as np
import tensorflow as tf

import tftorus
from tftorus import context


def two_phase_grids(grids, size):
    """The grids whose torus has both a row and a column phase: what chunks can overlap."""
    return [g for g in grids if 1 < tftorus.resolve_grid(g, size).x < size]


def check_chunks(label, inputs, grid, failures, compression=tftorus.Compression.none,
                 in_function=False) -> int:
    """Chunked (2 and 3 chunks) == unchunked, bit for bit. Returns the number of checks."""
    def run(chunks):
        def reduce(ts):
            return tftorus.fused_allreduce(ts, "sum", algorithm="torus", grid=grid,
                                           compression=compression, pipeline_chunks=chunks)
        out = tf.function(reduce)(inputs) if in_function else reduce(inputs)
        return [t.numpy() for t in out]

    base, checks = run(1), 0
    for chunks in (2, 3):
        for i, (want, got) in enumerate(zip(base, run(chunks))):
            checks += 1
            if got.shape != want.shape or got.tobytes() != want.tobytes():
                diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max() \
                    if got.shape == want.shape else float("nan")
                failures.append(f"{label} grid {grid} {chunks} chunks tensor #{i}: not bit-equal "
                                f"to no chunks (largest difference {diff:.3g})")
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
    of FP32 tensors gets a 16-bit tensor; uncompressed, FP32. Returns the number of checks."""
    comm, checks = context.communicator(), 0
    rng = np.random.RandomState(rank)
    inputs = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in ((301,), (7, 40))]
    for algorithm in ("torus", "ring", "hierarchical"):
        torus_grid = context.grid_for(algorithm, grid if algorithm == "torus" else None)
        for compression, wire in ((tftorus.Compression.none, tf.float32),
                                  (tftorus.Compression.fp16, tf.float16),
                                  (tftorus.Compression.bf16, tf.bfloat16)):
            seen = []
            out = tftorus.fused_allreduce(inputs, "sum", algorithm=algorithm,
                                          compression=compression, check_consistency=False,
                                          comm=recording(comm, seen), torus_grid=torus_grid)
            checks += 1
            wrong = [s for s in seen if s[1] != wire]
            label = f"wire {algorithm} {torus_grid} {wire.name}"
            if not seen and comm.size > 1:
                failures.append(f"{label}: no collective was called")
            elif wrong:
                failures.append(f"{label}: collectives got {sorted({s[1].name for s in wrong})}")
            elif any(o.dtype != tf.float32 for o in out):
                failures.append(f"{label}: result not FP32")
    return checks
