"""Worker: a user's own Keras model, loss and metrics over the torus, with batch-size control.

    horovodrun --gloo -np 3 -H localhost:3 python tests/workers/user_fit_accumulation.py OUT
    (or 3 processes with TF_CONFIG, or started by `python -m tftorus.run -np 3`, srun or
    mpirun: the tf engine, without Horovod; on the current stack (Keras 3) the only way)

A functional two-layer model compiled with `tftorus.keras.DistributedOptimizer(SGD(lr,
momentum=0.9))`, Keras' sparse cross-entropy and a metric named `hit_rate`, trained by
`model.fit` with `hvd.BatchSizeControl(SCHEDULE)`: 1 micro-batch per update in epochs 0-1, 2 in
epoch 2, 4 in epoch 3, in two fits (epoch 0, then 1-3: the second starts inside the first
range). Where Horovod's callbacks can run (Horovod's runtime, or Keras 3's own over the tf
engine) `hvd.callbacks.BroadcastGlobalVariablesCallback(0)` and `MetricAverageCallback()` broadcast
the weights and average the metrics. Each rank writes its weights and fit's logs; the test
compares the weights with `reference`, float64 NumPy of the same updates.

Before the fit, `order_check` shows where the gradients are reduced: after a LossScaleOptimizer's
division and before clipping (see its docstring). The report also names every function of
tftorus that AutoGraph converted while the steps were traced: none should be
(tftorus/runtime/plain_python.py). This module's top level is NumPy only, for the test to import.
"""
import json
import os
import sys

import numpy as np

SCHEDULE = [(0, 1), (2, 2), (3, 4)]
EPOCHS, STEPS, MICRO, FEATURES, HIDDEN, CLASSES = 4, 8, 4, 5, 7, 3
FIRST_FIT_EPOCHS = 1  # the second fit starts at epoch 1, inside the first range
# order_check: a loss scale at which one rank's scaled gradient overflows FP16 (the wire), and
# a clip norm that the mean gradient and one rank's exceed
SCALE, CLIP_NORM = 2.0 ** 16, 1.0
LR, MOMENTUM = 0.2, 0.9


def data(workers: int):
    """x [STEPS, workers, MICRO, FEATURES], y [STEPS, workers, MICRO]: micro-step s, worker r."""
    rng = np.random.RandomState(7)
    x = rng.standard_normal((STEPS, workers, MICRO, FEATURES))
    y = rng.randint(0, CLASSES, (STEPS, workers, MICRO))
    return x, y


def initial_weights():
    rng = np.random.RandomState(11)
    return [rng.standard_normal((FEATURES, HIDDEN)) * 0.5, rng.standard_normal(HIDDEN) * 0.1,
            rng.standard_normal((HIDDEN, CLASSES)) * 0.5, rng.standard_normal(CLASSES) * 0.1]


def gradients(weights, x, y):
    """Of the mean sparse cross-entropy of tanh(x W1 + b1) W2 + b2 over the micro-batch."""
    w1, b1, w2, b2 = weights
    h = np.tanh(x @ w1 + b1)
    logits = h @ w2 + b2
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    d = (p - np.eye(CLASSES)[y]) / len(y)
    dh = (d @ w2.T) * (1 - h ** 2)
    return [x.T @ dh, dh.sum(0), h.T @ d, d.sum(0)]


def count_at(epoch: int) -> int:
    return [k for start, k in SCHEDULE if start <= epoch][-1]


def reference(workers: int):
    """The weights after every update: the mean over workers of the mean over the update's k
    micro-batches, then SGD with momentum as Keras' (v = m v - lr g; w += v)."""
    x, y = data(workers)
    weights, velocity = initial_weights(), [0.0] * 4
    for epoch in range(EPOCHS):
        k = count_at(epoch)
        for first in range(0, STEPS, k):
            grads = [np.mean([np.mean([gradients(weights, x[s, r], y[s, r])[i]
                                       for s in range(first, first + k)], axis=0)
                              for r in range(workers)], axis=0) for i in range(4)]
            velocity = [MOMENTUM * v - LR * g for v, g in zip(velocity, grads)]
            weights = [w + v for w, v in zip(weights, velocity)]
    return weights


def order_gradients(rank: int) -> np.ndarray:
    """Rank r's gradient for order_check, all along one direction: norms 0.2, 0.4 and 3.0. The
    mean's norm, 1.2, is clipped to CLIP_NORM; clipping each rank's first would give a mean of
    norm 0.53. Rank 2's, scaled by SCALE, exceeds FP16's largest value (65504)."""
    return np.full(4, [0.1, 0.2, 1.5][rank % 3], np.float64)


def order_reference(workers: int) -> np.ndarray:
    """w after one SGD(1.0, clipnorm=CLIP_NORM) step from 0 with the mean of the ranks'
    gradients, clipped after the mean."""
    mean = np.mean([order_gradients(r) for r in range(workers)], axis=0)
    return -mean * min(1.0, CLIP_NORM / np.linalg.norm(mean))


def loss_scale_optimizer(tf, optimizer):
    """A fixed loss scale of SCALE around `optimizer`, in this Keras generation's spelling."""
    if hasattr(tf.keras.optimizers, "LossScaleOptimizer"):  # Keras 3
        return tf.keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=SCALE)
    return tf.keras.mixed_precision.LossScaleOptimizer(optimizer, dynamic=False,
                                                       initial_scale=SCALE)


def order_check(tf, hvd, rank):
    """One apply_gradients of the scaled gradients through LossScaleOptimizer(ours, FP16 wire):
    the result equals order_reference only if the reduction comes after the division (before
    it, the FP16 wire overflows to inf) and before clipping (after it, each rank's gradient
    would be clipped alone: none is, and the mean would not be either)."""
    variable = tf.Variable(tf.zeros([4]), name="order_check")
    optimizer = loss_scale_optimizer(tf, hvd.DistributedOptimizer(
        tf.keras.optimizers.SGD(learning_rate=1.0, clipnorm=CLIP_NORM),
        compression=hvd.Compression.fp16))
    scaled = tf.constant(order_gradients(rank) * SCALE, tf.float32)
    optimizer.apply_gradients([(scaled, variable)])
    return [float(v) for v in variable.numpy()]


def count_conversions():
    """The names of the functions AutoGraph converts from now on (TensorFlow's private hook:
    every conversion passes through api._convert_actual)."""
    from tensorflow.python.autograph.impl import api
    names, convert = [], api._convert_actual

    def counting(entity, program_ctx):
        names.append(f"{getattr(entity, '__module__', '?')}.{getattr(entity, '__qualname__', '?')}")
        return convert(entity, program_ctx)
    api._convert_actual = counting
    return names


def main(out_dir):
    import tensorflow as tf

    converted = count_conversions()
    import tftorus
    import tftorus.keras as hvd  # the one-line change from horovod.tensorflow.keras

    engine = os.environ.get("TFTORUS_ENGINE")  # None: the stack's default
    hvd.init(engine=engine)
    rank, size = tftorus.runtime.world.rank(), tftorus.runtime.world.size()
    ordered = order_check(tf, hvd, rank)
    x, y = data(size)
    inputs = tf.keras.Input((FEATURES,))
    hidden = tf.keras.layers.Dense(HIDDEN, activation="tanh")(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(CLASSES)(hidden))
    # The same start on every rank: Horovod's broadcast callback runs after the first step.
    model.set_weights([w.astype(np.float32) for w in initial_weights()])
    model.compile(optimizer=hvd.DistributedOptimizer(
        tf.keras.optimizers.SGD(learning_rate=LR, momentum=MOMENTUM)),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name="hit_rate")])
    logs = []
    record = tf.keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, l: logs.append(
        {"epoch": epoch, "updates": int(model.optimizer.iterations.numpy()),
         **{key: float(v) for key, v in l.items()}}))
    if hvd.is_initialized():  # Horovod's runtime, or the current stack's own callbacks
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     hvd.callbacks.MetricAverageCallback()]
    else:  # the classic stack's tf engine: Horovod's callbacks need its runtime
        callbacks = []
    averaged_metrics = bool(callbacks) and size > 1
    callbacks += [hvd.BatchSizeControl(SCHEDULE), record]
    ds = tf.data.Dataset.from_tensor_slices(
        (x[:, rank].reshape(-1, FEATURES).astype(np.float32), y[:, rank].reshape(-1)))
    ds = ds.batch(MICRO).repeat()
    model.fit(ds, epochs=FIRST_FIT_EPOCHS, steps_per_epoch=STEPS, callbacks=callbacks, verbose=0)
    model.fit(ds, initial_epoch=FIRST_FIT_EPOCHS, epochs=EPOCHS, steps_per_epoch=STEPS, callbacks=callbacks,
              verbose=0)

    reduce = tftorus.gradient_reducer()

    @tf.function
    def user_step(x):  # a custom loop's step: AutoGraph converts it, and only it
        if x < 0:
            x = -x
        return reduce([x])[0]
    stepped = float(user_step(tf.constant(-float(rank + 1))))  # the mean of 1..size
    os.makedirs(out_dir, exist_ok=True)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"),
             *[w.astype(np.float64) for w in model.get_weights()])
    saved = os.path.join(out_dir, f"model{rank}.keras")
    model.save(saved)
    reloaded = tf.keras.models.load_model(saved)  # Keras alone: nothing of tftorus needed
    same = all(np.array_equal(a, b) for a, b in zip(reloaded.get_weights(), model.get_weights()))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"logs": logs, "reloaded": type(reloaded.optimizer).__name__,
                   "reloaded_weights_equal": same, "order_check": ordered,
                   "averaged_metrics": averaged_metrics,
                   "tftorus_converted": [n for n in converted if n.startswith("tftorus.")],
                   "user_converted": [n for n in converted if n.endswith(".user_step")],
                   "user_step": stepped}, f)
    tftorus.shutdown()
    print(f"rank {rank}/{size} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
