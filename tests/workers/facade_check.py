"""Worker: Horovod's API on the facades without Horovod (the current stack's tf engine).

    python -m tftorus.run -np 2 tests/workers/facade_check.py   (or 2 TF_CONFIG processes)

`import tftorus as hvd` and `import tftorus.keras as hvd` as a Horovod user's script calls them:
the queries, allreduce (Average, Sum, prescale), allgather with sizes that differ per rank,
broadcast (floats, ints, bools), broadcast_variables, broadcast_object, allgather_object, and
DistributedGradientTape and PartialDistributedGradientTape, each against its exact value. Prints "facade_check: N checks, M failed".
"""
import numpy as np

import tftorus as hvd
import tftorus.keras as hvd_keras

hvd.init()
import tensorflow as tf  # noqa: E402  (after init: TF joins its cluster when its runtime starts)

rank, size = hvd.rank(), hvd.size()
checks, failed = 0, []


def check(name, got, want):
    global checks
    checks += 1
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or not np.array_equal(got, want):
        failed.append(name)
        print(f"[rank {rank}] MISMATCH {name}: got {got!r}, want {want!r}", flush=True)


check("queries", [hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(),
                  hvd_keras.rank(), hvd_keras.size(), hvd.is_initialized()],
      [rank, size, 0, 1, rank, size, True])
values = [np.arange(5, dtype=np.float32) * (r + 1) for r in range(size)]
check("allreduce average", hvd.allreduce(values[rank]), np.mean(values, axis=0))
check("allreduce sum", hvd.allreduce(values[rank], op=hvd.Sum), np.sum(values, axis=0))
check("allreduce int sum", hvd_keras.allreduce(tf.constant([rank + 1, 7]), op=hvd.Sum),
      [sum(range(1, size + 1)), 7 * size])
check("allreduce prescale", hvd.allreduce(values[rank], op=hvd.Sum, prescale_factor=0.5),
      np.sum(values, axis=0) * 0.5)
rows = [np.full((r + 1, 2), r, np.int32) for r in range(size)]  # a different size per rank
check("allgather", hvd.allgather(rows[rank]), np.concatenate(rows))
check("broadcast float", hvd.broadcast(values[rank], root_rank=size - 1), values[-1])
check("broadcast bool", hvd.broadcast(tf.constant([rank == 0, True]), root_rank=0),
      [True, True])
import keras  # noqa: E402
variable = keras.Variable(values[rank])  # a Keras 3 variable, as a model's weights are
hvd.broadcast_variables([variable], root_rank=0)
check("broadcast_variables", variable.numpy(), values[0])
check("broadcast_object", [hvd.broadcast_object({"rank": rank, "x": [1, 2]}, root_rank=1)
                           == {"rank": 1, "x": [1, 2]}], [True])
check("allgather_object", [hvd.allgather_object(("r", rank) * (rank + 1))
                           == [("r", r) * (r + 1) for r in range(size)]], [True])
w = tf.Variable([1.0, 2.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(w * w) * float(rank + 1)
grads = hvd.DistributedGradientTape(tape).gradient(loss, [w])
check("DistributedGradientTape", grads[0], np.array([2.0, 4.0]) * np.mean(
    [r + 1 for r in range(size)]))
# PartialDistributedGradientTape: a Keras layer's gradient stays local (over size), the
# other's is averaged
local, shared = keras.layers.Dense(1, use_bias=False), keras.layers.Dense(1, use_bias=False)
x = tf.constant([[float(rank + 1)]])
local(x), shared(x)
local.kernel.assign([[1.0]]), shared.kernel.assign([[1.0]])
with tf.GradientTape(persistent=True) as tape:
    loss = tf.reduce_sum(local(x) + shared(x))
partial = hvd.PartialDistributedGradientTape(tape, local_layers=local)
sources = [local.kernel, shared.kernel]
check("PartialDistributedGradientTape", np.array(partial.gradient(loss, sources)).ravel(),
      [(rank + 1) / size, np.mean([r + 1 for r in range(size)])])
mine, others = partial.get_local_and_global_gradients(loss, sources)
check("get_local_and_global_gradients", [len(mine), len(others), mine[0][0] is local.kernel,
                                         float(np.ravel(others[0][1])[0])],
      [1, 1, True, np.mean([r + 1 for r in range(size)])])
print(f"[rank {rank}] facade_check: {checks} checks, {len(failed)} failed", flush=True)
hvd.shutdown()
raise SystemExit(1 if failed else 0)
