"""Worker: the collectives of elastic jobs (tftorus/engines/horovod_elastic_engine.py: every group over
Horovod's global set, an all-to-all with a split per rank) give the sums of allreduce_check's
references, for the torus on every grid, the ring and the leader-based hierarchical all-reduce;
and a group's all-gather with unequal first dimensions and its max/min equal Horovod's.

Run in a world started by tftorus.init() on the Horovod engine (the four-rank suite, after
allreduce_check, whose inputs and references it reuses); the GlobalSetCommunicator is made
here, beside the process sets of that world, as an elastic job's init() would make it.
"""
import allreduce_check as ac  # noqa: E402  (tests/workers, the script's own folder)
import horovod.tensorflow as hvd
import numpy as np
import pipeline_and_wire  # noqa: E402
import report  # noqa: E402
import tensorflow as tf

import tftorus
from tftorus.engines.horovod_elastic_engine import GlobalSetCommunicator
from tftorus.torus.grid import divisors, parse_grid


def main():
    ac.failures.clear()  # this worker's own count, in a suite after allreduce_check
    ac.checks = 0
    rank, n = hvd.rank(), hvd.size()
    comm = GlobalSetCommunicator()
    grids = [f"{n // x}x{x}" for x in divisors(n)]
    cases = [("torus", g) for g in grids] + [("ring", grids[0])]
    cases += [("hierarchical", g) for g in pipeline_and_wire.two_phase_grids(grids, n)]
    for algorithm, grid in cases:
        for dtype in (tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32):
            for integer_valued in ([True, False] if dtype.is_floating else [True]):
                inputs = ac.make_inputs(dtype, integer_valued,
                                        seed=100 * rank + ac.DTYPES.index(dtype))
                label = f"global set {algorithm} {grid} {dtype.name} {integer_valued}"
                where = dict(algorithm=algorithm, comm=comm, torus_grid=parse_grid(grid, n))
                ac.check_case(label, inputs, dtype, integer_valued, (dtype.name, integer_valued),
                              **where)
                if dtype == tf.float32 and not integer_valued:
                    ac.check_case(f"{label} fp16-wire", inputs, tf.float16, False,
                                  (dtype.name, integer_valued),
                                  compression=tftorus.Compression.fp16, **where)
                    ac.check_case(f"{label} 64B-buckets", inputs, dtype, False,
                                  (dtype.name, integer_valued), fusion_threshold_bytes=64,
                                  **where)
    # Within one row or column: an all-gather of unequal row counts (sparse gradients' values)
    # and max/min, against Horovod's all-gather of the whole world.
    rows = tf.constant(np.full((rank + 1, 3), rank, np.float32))
    everyone = hvd.allgather(rows).numpy()
    owner = np.repeat(np.arange(n), np.arange(1, n + 1))
    mine = tf.constant(np.arange(5, dtype=np.float32) * (rank - 1.5))
    all_mine = hvd.allgather(mine[None]).numpy()
    for grid in grids:
        g = parse_grid(grid, n)
        for group in (g.row_group(rank), g.col_group(rank)):
            got = comm.all_gather(rows, group).numpy()
            ac.compare(f"global set all_gather {group}", got,
                       everyone[np.isin(owner, group)].astype(np.float64), np.ones(got.shape), 0.0)
            for op, reduce in (("max", np.max), ("min", np.min)):
                got = comm.all_reduce(mine, group, op=op)
                want = reduce(all_mine[list(group)], axis=0).astype(np.float64)
                ac.compare(f"global set {op} {group}", got, want, np.ones(want.shape), 0.0)
    report.finish(rank, ac.checks, ac.failures, what=f"grids {grids}: ")


if __name__ == "__main__":
    tftorus.init()
    main()
