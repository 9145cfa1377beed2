"""Worker (current stack, 2 ranks): hvd.elastic's states and run() over a world of fixed size.

Checks, as Horovod's own test_elastic_state does and beyond: TensorFlowState and ObjectState
sync from rank 0, restore the last commit, commit; KerasState with a Keras 3 model in fit,
committed by Horovod's three callbacks; run() syncs before the function. Last, rank 1 exits in
the middle of a run() while rank 0 waits in a collective: rank 0 must get CollectiveError
(also as hvd.elastic.HorovodInternalError) with the last commit back in its state, and prints
"[rank 0] LOST WORKER SEEN"; then it exits 0 with its count of checks.
"""
import os
import sys

import numpy as np

import tftorus as hvd
import tftorus.keras as hvd_keras

hvd.init(engine="tf")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

rank, size = hvd.rank(), hvd.size()
checks, failures = 0, []


def check(what, ok):
    global checks
    checks += 1
    if not ok:
        failures.append(what)


# -- TensorFlowState: Horovod's test_elastic_state, in words -------------------------------------
v = 1.0 if rank == 0 else 2.0
variables = [tf.Variable(np.full([2, 2], v)), tf.Variable(np.full([2], v))]
state = hvd.elastic.TensorFlowState(variables, batch=20 + rank, epoch=10 + rank)
state.sync()
check("TensorFlowState.sync takes rank 0's variables",
      all(np.all(x.numpy() == 1.0) for x in variables))
check("TensorFlowState.sync takes rank 0's attributes", (state.batch, state.epoch) == (20, 10))
variables[0].assign(np.full([2, 2], 5.0))
state.batch, state.epoch = 21, 11
state.restore()
check("restore puts back the variables", np.all(variables[0].numpy() == 1.0))
check("restore puts back the attributes", (state.batch, state.epoch) == (20, 10))
variables[0].assign(np.full([2, 2], 5.0))
state.batch = 22
state.commit()
state.restore()
check("commit then restore keeps the commit",
      np.all(variables[0].numpy() == 5.0) and state.batch == 22)

# -- ObjectState: attributes only, a mutable one copied on restore -------------------------------
objects = hvd.elastic.ObjectState(history=[rank], lr=0.1 * (rank + 1))
objects.sync()
check("ObjectState.sync", objects.history == [0] and objects.lr == 0.1)
objects.history.append(7)
objects.restore()
check("ObjectState.restore gives back the committed list", objects.history == [0])
resets = []
objects.register_reset_callbacks([lambda: resets.append(1)])
objects.on_reset()
check("reset callbacks run on on_reset", resets == [1])

# -- KerasState in fit, with Horovod's three Keras callbacks -------------------------------------
keras.utils.set_random_seed(rank)  # different initial weights per rank: sync must fix them
model = keras.Sequential([keras.Input([4]), keras.layers.Dense(3), keras.layers.Dense(1)])
optimizer = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
model.compile(optimizer=optimizer, loss="mse")
keras_state = hvd_keras.elastic.KerasState(model, batch=0, epoch=0)
check("KerasState made the optimizer's slots", len(optimizer.variables) > 1)


@hvd_keras.elastic.run
def train(state, epochs):
    x = np.random.RandomState(rank).rand(32, 4).astype("float32")
    y = x.sum(1, keepdims=True)
    model.fit(x, y, batch_size=8, epochs=epochs - state.epoch, verbose=0, callbacks=[
        hvd_keras.elastic.CommitStateCallback(state, batches_per_commit=3),
        hvd_keras.elastic.UpdateBatchStateCallback(state),
        hvd_keras.elastic.UpdateEpochStateCallback(state)])
    return [w.numpy() for w in model.weights]


weights = train(keras_state, 2)
gathered = hvd.allgather_object([w.tolist() for w in weights])
check("run() synced the model: every rank ends with the same weights",
      all(np.allclose(np.array(a), np.array(b)) for a, b in zip(gathered[0], gathered[-1])))
check("UpdateEpochStateCallback counts 2 epochs", keras_state.epoch == 2)
check("UpdateBatchStateCallback leaves 0 after an epoch", keras_state.batch == 0)
weights = train(keras_state, 3)  # one epoch more: Horovod's epochs=total - state.epoch
check("a second run counts on from the state's epoch", keras_state.epoch == 3)
model.layers[0].kernel.assign(np.zeros([4, 3]))
keras_state.restore()
check("KerasState.restore gives back the committed kernel",
      np.allclose(model.layers[0].kernel.numpy(), weights[0]))

# -- a lost worker inside run() ------------------------------------------------------------------
lost = hvd.elastic.ObjectState(step=0)


@hvd.elastic.run
def steps(state):
    for step in range(1, 1000):
        # rank 1 leaves at step 4, not 3: its step-3 all-reduce needed rank 0's share, so rank 0
        # is past step 2's commit; leaving at 3 could cut rank 0's step-2 all-reduce, whose
        # buffers rank 0 may still be fetching from rank 1 after rank 1's side is done
        if rank == 1 and step == 4:
            print("[rank 1] exits now", flush=True)
            sys.stdout.flush()
            os._exit(0)
        hvd.allreduce(tf.constant(1.0))
        state.step = step
        if step % 2 == 0:
            state.commit()


if rank == 0:
    try:
        steps(lost)
        failures.append("rank 0 went on without rank 1")
    except hvd.elastic.HorovodInternalError as e:
        check("the error says to restart", "restart" in str(e))
        check("the state holds the last commit", lost.step == 2)
        print("[rank 0] LOST WORKER SEEN", flush=True)
    for failure in failures:
        print(f"[rank 0] MISMATCH {failure}", flush=True)
    print(f"[rank 0] {checks} checks, {len(failures)} failed", flush=True)
    os._exit(1 if failures else 0)  # no shutdown: its barrier would wait for the lost rank
else:
    steps(lost)
