"""Worker: Horovod 0.28.1's collectives on the tf engine (tftorus/horovod_api/mpi_ops.py,
process_sets.py, functions.py), each against NumPy, in three modes: eagerly, inside one
tf.function, and in a TF1 graph that a tf.compat.v1.Session runs.

    python -m tftorus.run -np N tests/workers/horovod_collectives_check.py   (N = 2, 3, 4)

Every rank holds row `rank` of tables drawn alike on every rank, so each expected value is NumPy
over the rows of the ranks taking part. Checked: allreduce (Sum, Average, Min, Max, Product;
Horovod's dtypes and bfloat16, int16; scale factors), grouped_allreduce, allgather and
grouped_allgather (first dimensions that differ), broadcast (bool, 8-, 16-bit, bfloat16),
broadcast_, alltoall (splits with zeros, equal splits), reducescatter (even and uneven),
grouped_reducescatter, process sets (at init, added, removed, one without rank 0), the *_op
ops, the gradients, the errors (mismatches, bad splits, a non-member's call) and that the ranks
go on after them, and the object collectives. Prints "horovod_collectives_check: N checks, M
failed".
"""
import json
import os

import numpy as np

import tftorus as hvd

SIZE = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
EVENS = hvd.ProcessSet(range(0, SIZE, 2))
ODDS = hvd.ProcessSet(range(1, SIZE, 2))
hvd.init(process_sets=[EVENS, ODDS])
import tensorflow as tf  # noqa: E402  (after init: TF joins its cluster when its runtime starts)

rank, size = hvd.rank(), hvd.size()
checks, failed = 0, []
MINE = EVENS if rank % 2 == 0 else ODDS


def record(name, ok, detail=""):
    global checks
    checks += 1
    if not ok:
        failed.append(name)
        print(f"[rank {rank}] MISMATCH {name}: {detail}", flush=True)


def compare(name, got, want, tol=0.0):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return record(name, False, f"shape {got.shape}, want {want.shape}")
    if want.dtype.kind in "iub" or tol == 0.0:
        ok = np.array_equal(got, want)
    else:
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    record(name, ok, "" if ok else f"got {got.ravel()[:8]}, want {want.ravel()[:8]}")


def table(shape, dtype, low=-100, high=100, seed=0):
    """[size, *shape] of `dtype`, the same on every rank; rank r uses row r."""
    values = np.random.RandomState(seed).uniform(low, high, [size] + list(shape))
    if np.dtype(dtype).kind in "iu":
        values = np.floor(values)
    return values.astype(dtype)


NP = {tf.uint8: np.uint8, tf.int8: np.int8, tf.int16: np.int16, tf.int32: np.int32,
      tf.int64: np.int64, tf.float16: np.float16, tf.float32: np.float32,
      tf.float64: np.float64, tf.bool: np.bool_}
TOL = {tf.float16: 2e-2, tf.bfloat16: 5e-2, tf.float32: 1e-5, tf.float64: 1e-12}


def in_rows(ranks):
    return list(ranks)


# -- the checks: (name, build() -> tensor(s), want, tolerance), built in any mode --------------

EVERY_DTYPE = (tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
               tf.float32, tf.float64)
SOME_DTYPES = (tf.int8, tf.float16, tf.float64)  # traced: the ops are built alike for each


def value_checks(dtypes):
    out = []
    add = out.append
    for dtype in dtypes:
        np_dtype = NP.get(dtype, np.float32)
        small = dtype in (tf.uint8, tf.int8)
        low = 0 if dtype == tf.uint8 else (-3 if small else -100)
        rows = table([3, 4], np_dtype, low, 3 if small else 100, seed=dtype.as_datatype_enum)
        mine = rows[rank]
        tol = TOL.get(dtype, 0.0)

        def t(values=mine, d=dtype):
            return tf.cast(tf.constant(values), d)
        exact = rows.astype(np.float64) if dtype == tf.bfloat16 else rows
        want_sum = exact.sum(0).astype(np_dtype)  # wraps in the narrow type, as Horovod's
        add((f"allreduce Sum {dtype.name}", lambda t=t: hvd.allreduce(t(), op=hvd.Sum),
             want_sum, tol))
        if dtype.is_integer:
            want_avg = np.trunc(rows.astype(np.int64).sum(0) / size).astype(np_dtype)
        else:
            want_avg = exact.mean(0)
        add((f"allreduce Average {dtype.name}", lambda t=t: hvd.allreduce(t()), want_avg, tol))
        add((f"allreduce Min {dtype.name}", lambda t=t: hvd.allreduce(t(), op=hvd.Min),
             rows.min(0), tol))
        add((f"allreduce Max {dtype.name}", lambda t=t: hvd.allreduce(t(), op=hvd.Max),
             rows.max(0), tol))
        if dtype != tf.bfloat16:  # floats from [-3, 3): no overflow to compare
            factors = rows if dtype.is_integer else table([3, 4], np_dtype, -3, 3, seed=9)
            add((f"allreduce Product {dtype.name}",
                 lambda t=t, f=factors: hvd.allreduce(t(f[rank]), op=hvd.Product),
                 np.prod(factors, axis=0, dtype=np_dtype), 1e-2 if tol else 0.0))
    x = table([5], np.float32, seed=3)
    add(("allreduce Sum prescale 0.5 postscale 3",
         lambda: hvd.allreduce(tf.constant(x[rank]), op=hvd.Sum, prescale_factor=0.5,
                               postscale_factor=3.0), (x * 0.5).sum(0) * 3, 1e-5))
    xi = table([6], np.int32, seed=4)
    add(("allreduce Average int32 postscale 0.5 (float64, truncated)",
         lambda: hvd.allreduce(tf.constant(xi[rank]), postscale_factor=0.5),
         np.trunc(xi.sum(0).astype(np.float64) * (0.5 / size)).astype(np.int32)))
    add(("allreduce fp16 compression",
         lambda: hvd.allreduce(tf.constant(x[rank]), op=hvd.Sum,
                               compression=hvd.Compression.fp16), x.sum(0), 2e-2))
    a, b = table([2, 3], np.float32, seed=5), table([4], np.int64, seed=6)
    add(("grouped_allreduce Sum mixed dtypes",
         lambda: hvd.grouped_allreduce([tf.constant(a[rank]), tf.constant(b[rank])],
                                       op=hvd.Sum), [a.sum(0), b.sum(0)], 1e-5))
    add(("grouped_allreduce Max",
         lambda: hvd.grouped_allreduce([tf.constant(a[rank]), tf.constant(b[rank])],
                                       op=hvd.Max), [a.max(0), b.max(0)], 1e-6))
    # allgather: first dimensions differ (rank + 1 rows)
    for dtype in (tf.bool, tf.uint8, tf.int8, tf.int16, tf.int32, tf.float16, tf.bfloat16,
                  tf.float64):
        rows = [np.full([r + 1, 2], r % 2 == 1 if dtype == tf.bool else r + 1).astype(
            NP.get(dtype, np.float32)) for r in range(size)]
        add((f"allgather {dtype.name}",
             lambda rows=rows, d=dtype: hvd.allgather(tf.cast(rows[rank], d)),
             np.concatenate(rows)))
    empty_here = [np.arange(3 * r, dtype=np.float32).reshape(r, 3) for r in range(size)]
    add(("allgather where rank 0 has no rows",
         lambda: hvd.allgather(tf.constant(empty_here[rank])), np.concatenate(empty_here)))
    g1 = [np.full([r + 2, 3], r, np.int32) for r in range(size)]
    g2 = [np.full([size - r], 0.5 * r, np.float32) for r in range(size)]
    add(("grouped_allgather",
         lambda: hvd.grouped_allgather([tf.constant(g1[rank]), tf.constant(g2[rank])]),
         [np.concatenate(g1), np.concatenate(g2)]))
    # broadcast
    for dtype in (tf.bool, tf.uint8, tf.int8, tf.int16, tf.int64, tf.float16, tf.bfloat16,
                  tf.float32):
        rows = table([2, 3], np.float32, 0, 2, seed=7)
        want = rows[size - 1].astype(NP.get(dtype, np.float32)) if dtype != tf.bool else \
            rows[size - 1] > 1
        add((f"broadcast {dtype.name} from {size - 1}",
             lambda rows=rows, d=dtype: hvd.broadcast(
                 tf.cast(tf.constant(rows[rank]) > 1 if d == tf.bool else rows[rank], d),
                 size - 1), tf.cast(want, dtype).numpy() if dtype == tf.bfloat16 else want))
    zero = np.array([-0.0, np.nan, 1.0], np.float32)
    add(("broadcast keeps -0.0's sign bit",
         lambda: tf.bitcast(hvd.broadcast(tf.constant(zero if rank == 0 else -zero), 0),
                            tf.int32), zero.view(np.int32)))
    # alltoall: rank r sends (j + 1) * (r % 2) rows to rank j (odd ranks send, even send none)
    sends = np.array([[(j + 1) * (i % 2) for j in range(size)] for i in range(size)])
    data = [np.concatenate([np.full([sends[i, j], 2], 10 * i + j, np.int16)
                            for j in range(size)]) for i in range(size)]
    want = np.concatenate([np.full([sends[i, rank], 2], 10 * i + rank, np.int16)
                           for i in range(size)])
    add(("alltoall with splits (and zeros)",
         lambda: list(hvd.alltoall(tf.constant(data[rank]), splits=sends[rank])),
         [want, sends[:, rank].astype(np.int32)]))
    eq = [np.arange(2 * size, dtype=np.float64) + 100 * r for r in range(size)]
    add(("alltoall equal splits",
         lambda: hvd.alltoall(tf.constant(eq[rank])),
         np.concatenate([eq[i][2 * rank:2 * rank + 2] for i in range(size)])))
    # reducescatter: even and uneven first dimensions
    for first in (2 * size, 2 * size + 1, size - 1):
        rs = table([first, 3], np.float32, seed=first)
        lo = sum(len(p) for p in np.array_split(np.arange(first), size)[:rank])
        share = len(np.array_split(np.arange(first), size)[rank])
        add((f"reducescatter Sum first dimension {first}",
             lambda rs=rs: hvd.reducescatter(tf.constant(rs[rank]), op=hvd.Sum),
             rs.sum(0)[lo:lo + share], 1e-5))
        rsi = table([first], np.int32, seed=first + 1)
        add((f"reducescatter Average int32 first dimension {first}",
             lambda rsi=rsi: hvd.reducescatter(tf.constant(rsi[rank])),
             np.trunc(rsi.sum(0) / size).astype(np.int32)[lo:lo + share]))
    rg = table([size + 1, 2], np.float64, seed=11)
    rh = table([3 * size], np.float64, seed=12)
    add(("grouped_reducescatter Average, prescale 2",
         lambda: hvd.grouped_reducescatter([tf.constant(rg[rank]), tf.constant(rh[rank])],
                                           prescale_factor=2.0),
         [(2 * rg).mean(0)[np.array_split(np.arange(size + 1), size)[rank]],
          (2 * rh).mean(0)[3 * rank:3 * rank + 3]], 1e-12))
    # process sets: the set of my parity (registered at init), and the one without rank 0
    members = [r for r in range(size) if r % 2 == rank % 2]
    ps = table([4], np.float32, seed=13)
    add(("allreduce Sum on my parity's process set",
         lambda: hvd.allreduce(tf.constant(ps[rank]), op=hvd.Sum, process_set=MINE),
         ps[members].sum(0), 1e-5))
    add(("allgather on my parity's process set",
         lambda: hvd.allgather(tf.constant(ps[rank][:rank + 1]), process_set=MINE),
         np.concatenate([ps[r][:r + 1] for r in members]), 1e-6))
    add(("broadcast from the set's last member",
         lambda: hvd.broadcast(tf.constant(ps[rank]), members[-1], process_set=MINE),
         ps[members[-1]]))
    add(("alltoall on my parity's process set",
         lambda: hvd.alltoall(tf.fill([len(members)], rank), process_set=MINE),
         np.array(members, np.int32)))
    add(("reducescatter on my parity's process set",
         lambda: hvd.reducescatter(tf.constant(np.tile(ps[rank], 2)), op=hvd.Sum,
                                   process_set=MINE),
         np.array_split(np.tile(ps[members].sum(0), 2), len(members))[members.index(rank)],
         1e-5))
    add(("rank_op, local_rank_op, size_op, local_size_op",
         lambda: [hvd.rank_op(), hvd.local_rank_op(), hvd.size_op(), hvd.local_size_op()],
         [np.int32(rank), np.int32(rank), np.int32(size), np.int32(size)]))
    add(("size_op and process_set_included_op of a set",
         lambda: [hvd.size_op(EVENS.process_set_id),
                  hvd.process_set_included_op(EVENS.process_set_id),
                  hvd.process_set_included_op(99)],
         [np.int32(len(EVENS.ranks)), np.int32(rank % 2 == 0), np.int32(-3)]))
    return out


def gradient_checks():
    """Horovod's gradients: upstream gradients of ones (or rank-valued), tapes in any mode."""
    out = []
    add = out.append

    def grad(forward, x, upstream=None):
        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = forward(x)
        return tape.gradient(y, x, output_gradients=upstream)
    x = np.ones([3, 2], np.float32) * (rank + 1)
    add(("allreduce Sum gradient", lambda: grad(lambda v: hvd.allreduce(v, op=hvd.Sum), x),
         np.full([3, 2], size, np.float32), 1e-6))
    add(("allreduce Average gradient", lambda: grad(hvd.allreduce, x),
         np.ones([3, 2], np.float32), 1e-6))
    rows = [np.ones([r + 1, 2], np.float64) * r for r in range(size)]
    add(("allgather gradient (averaged, this rank's rows)",
         lambda: grad(hvd.allgather, rows[rank], tf.concat(
             [tf.ones([r + 1, 2], tf.float64) * r for r in range(size)], 0)),
         np.ones([rank + 1, 2]) * rank, 1e-12))
    add(("broadcast gradient (root keeps the average)",
         lambda: grad(lambda v: hvd.broadcast(v, size - 1), x),
         np.full([3, 2], float(rank == size - 1), np.float32), 1e-6))
    a2a = np.arange((rank + 1) * size * 2, dtype=np.float32).reshape(-1, 2)
    add(("alltoall gradient (sent back)",
         lambda: grad(lambda v: hvd.alltoall(v, splits=[rank + 1] * size)[0], a2a),
         np.ones_like(a2a), 1e-6))
    rs = np.ones([2 * size + 1, 3], np.float32)
    add(("reducescatter Sum gradient (gathered, times size)",
         lambda: grad(lambda v: hvd.reducescatter(v, op=hvd.Sum), rs),
         np.full_like(rs, size), 1e-6))
    g = [np.ones([2], np.float32), np.ones([3, 1], np.float64)]

    def grouped():
        xs = [tf.constant(v) for v in g]
        with tf.GradientTape() as tape:
            tape.watch(xs)
            ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
        return tape.gradient(ys, xs)
    add(("grouped_allreduce Sum gradients", grouped,
         [np.full([2], size, np.float32), np.full([3, 1], size, np.float64)], 1e-6))
    return out


def error_checks():
    """(name, build, error class): every rank makes the same bad call."""
    members = [r for r in range(size) if r % 2 == rank % 2]
    others = ODDS if rank % 2 == 0 else EVENS
    out = [
        ("shapes differ -> FailedPreconditionError",
         lambda: hvd.allreduce(tf.ones([3 + rank])), tf.errors.FailedPreconditionError),
        ("dtypes differ -> FailedPreconditionError",
         lambda: hvd.allgather(tf.ones([2], tf.int32 if rank % 2 else tf.float32)),
         tf.errors.FailedPreconditionError),
        ("roots differ -> FailedPreconditionError",
         lambda: hvd.broadcast(tf.ones([2]), rank), tf.errors.FailedPreconditionError),
        ("allgather's second dimensions differ -> FailedPreconditionError",
         lambda: hvd.allgather(tf.ones([2, rank + 1])), tf.errors.FailedPreconditionError),
        ("alltoall splits longer than the tensor -> InvalidArgumentError",
         lambda: hvd.alltoall(tf.ones([size]), splits=[2] * size),
         tf.errors.InvalidArgumentError),
        ("alltoall without splits, indivisible -> InvalidArgumentError",
         lambda: hvd.alltoall(tf.ones([size + 1])), tf.errors.InvalidArgumentError),
        ("a collective on a set this rank is not in -> InvalidArgumentError",
         lambda: hvd.allreduce(tf.ones([2]), process_set=others),
         tf.errors.InvalidArgumentError),
        ("reducescatter of a scalar -> ValueError", lambda: hvd.reducescatter(tf.ones([])),
         ValueError),
    ]
    if len(members) > 1:  # only rank `members[0]`'s splits are bad: the others are told
        out.append(("one rank's bad splits -> Invalid there, FailedPrecondition elsewhere",
                    lambda: hvd.alltoall(tf.ones([len(members)]), process_set=MINE,
                                         splits=[5 if rank == members[0] else 1] * len(members)),
                    tf.errors.InvalidArgumentError if rank == members[0]
                    else tf.errors.FailedPreconditionError))
    return out


# -- running them in each mode -----------------------------------------------------------------

def evaluate(tensors, session=None):
    if session is not None:
        return session.run(tensors)
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, tensors)


def run_all(mode):
    dtypes = EVERY_DTYPE if mode == "eager" else SOME_DTYPES
    found = [c if len(c) == 4 else c + (0.0,) for c in value_checks(dtypes) + gradient_checks()]
    if mode == "eager":
        got = evaluate([build() for _, build, _, _ in found])
    elif mode == "tf.function":
        # autograph=False: converting these lambdas parses this file once per lambda
        got = evaluate(tf.function(lambda: [build() for _, build, _, _ in found],
                                   autograph=False)())
    else:
        with tf.Graph().as_default():
            outs = [build() for _, build, _, _ in found]
            with tf.compat.v1.Session() as session:
                got = evaluate(outs, session)
    for (name, _, want, tol), value in zip(found, got):
        if isinstance(want, list):
            for k, (v, w) in enumerate(zip(value, want)):
                compare(f"{mode}: {name} [{k}]", v, w, tol)
        else:
            compare(f"{mode}: {name}", value, want, tol)


def run_errors(mode):
    for name, build, error in error_checks():
        try:
            if mode == "eager":
                build()
            elif mode == "tf.function":
                tf.function(build, autograph=False)()
            else:
                with tf.Graph().as_default():
                    out = build()
                    with tf.compat.v1.Session() as session:
                        session.run(out)
            record(f"{mode}: {name}", False, "no error")
        except error:
            record(f"{mode}: {name}", True)
        except Exception as e:  # noqa: BLE001  (the wrong error is the finding)
            record(f"{mode}: {name}", False, f"{type(e).__name__}: {str(e)[:300]}")
    # the ranks go on after the errors
    compare(f"{mode}: an allreduce after the errors",
            hvd.allreduce(tf.constant([1.0]), op=hvd.Sum), [float(size)])


def process_set_api():
    record("ProcessSet size, rank, included",
           (MINE.size(), MINE.rank(), MINE.included(), EVENS.included(),
            hvd.global_process_set.size(), hvd.global_process_set.rank())
           == (len(MINE.ranks), MINE.ranks.index(rank), True, rank % 2 == 0, size, rank))
    try:
        (ODDS if rank % 2 == 0 else EVENS).rank()
        record("rank() outside the set refused", False, "no error")
    except ValueError:
        record("rank() outside the set refused", True)
    tail_ranks = list(range(1, size))
    try:
        tail = hvd.add_process_set(tail_ranks)
        added = size > 2
    except ValueError:  # at 2 ranks [1] is the odd set already
        tail, added = None, False
    record("add_process_set (a duplicate refused)", added == (size > 2))
    if tail is not None:
        record("added set's id", tail.process_set_id == 3, str(tail))
        if rank in tail_ranks:  # a group without task 0, TF's group leader
            compare("allreduce on a set without rank 0",
                    hvd.allreduce(tf.constant([rank]), op=hvd.Sum, process_set=tail),
                    [sum(tail_ranks)])
        record("remove_process_set", hvd.remove_process_set(tail) and tail.size() is None
               and not hvd.remove_process_set(hvd.global_process_set))
        again = hvd.add_process_set(hvd.ProcessSet(tail_ranks))
        record("a removed set's id is given out again", again.process_set_id == 3, str(again))
    try:
        fake = hvd.ProcessSet([0])
        fake.process_set_id = 10
        hvd.allreduce(tf.ones([1]), process_set=fake)
        record("an unregistered set refused", False, "no error")
    except ValueError:
        record("an unregistered set refused", True)


def objects(mode):
    def body():
        got = hvd.broadcast_object({"from": rank, "list": [rank] * 3}, root_rank=size - 1)
        record(f"{mode}: broadcast_object", got == {"from": size - 1, "list": [size - 1] * 3},
               str(got))
        gathered = hvd.allgather_object(("r", rank) * (rank + 1))
        record(f"{mode}: allgather_object",
               gathered == [("r", r) * (r + 1) for r in range(size)], str(gathered))
        fn = hvd.broadcast_object_fn(root_rank=0)
        record(f"{mode}: broadcast_object_fn", fn(lambda: rank)() == 0)
        mine = hvd.broadcast_object(rank * 10, root_rank=MINE.ranks[0], process_set=MINE)
        record(f"{mode}: broadcast_object on a process set", mine == MINE.ranks[0] * 10)
    if mode == "eager":
        body()
    else:
        with tf.Graph().as_default():
            body()


import time  # noqa: E402

T0 = time.time()
process_set_api()
print(f"[rank {rank}] sets {time.time() - T0:.1f}", flush=True)
for execution in ("eager", "tf.function", "TF1 graph"):
    run_all(execution)
    print(f"[rank {rank}] {execution} values {time.time() - T0:.1f}", flush=True)
    run_errors(execution)
    print(f"[rank {rank}] {execution} errors {time.time() - T0:.1f}", flush=True)
objects("eager")
objects("TF1 graph")
print(f"[rank {rank}] objects {time.time() - T0:.1f}", flush=True)
variable = tf.Variable(tf.fill([3], float(rank)))
values = hvd.broadcast_(  # in place
    [variable], root_rank=size - 1)
compare("broadcast_ assigns and returns", [variable.numpy(), values[0]],
        [np.full([3], size - 1.0)] * 2)
print(f"[rank {rank}] horovod_collectives_check: {checks} checks, {len(failed)} failed",
      flush=True)
hvd.shutdown()
raise SystemExit(1 if failed else 0)
