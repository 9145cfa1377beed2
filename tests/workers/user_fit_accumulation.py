"""Worker: batch-size control in a user's own Keras model, loss and metrics (not RecipeModel).

    horovodrun --gloo -np 3 -H localhost:3 python tests/workers/user_fit_accumulation.py OUT
    (or 3 TF_CONFIG processes with TFTORUS_ENGINE=tf: the tf engine without Horovod)

A functional two-layer model compiled with `tftorus.keras.DistributedOptimizer(SGD)`, Keras'
sparse cross-entropy and a metric named `hit_rate`, trained by `model.fit` with
BatchSizeControl(SCHEDULE): 1 micro-batch per update in epoch 0, 2 in epochs 1-2, 3 in epoch
3, in two fits (epochs 0-1, then 2-3: the second starts inside the 2-micro-batch range). On the
Horovod engine Horovod's own callbacks broadcast the weights and average the metrics. Each rank
writes its weights and fit's logs; the test compares the weights with `reference`, float64
NumPy of the same updates. This module's top level is NumPy only, for the test to import.
"""
import json
import os
import sys

import numpy as np

SCHEDULE = [(0, 1), (1, 2), (3, 3)]
EPOCHS, STEPS, MICRO, FEATURES, HIDDEN, CLASSES = 4, 6, 4, 5, 7, 3
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


def main(out_dir):
    import tensorflow as tf
    import tftorus
    import tftorus.keras as hvd  # the one-line change from horovod.tensorflow.keras
    from official_resnet.callbacks import BatchSizeControl

    engine = os.environ.get("TFTORUS_ENGINE", "horovod")
    hvd.init(engine=engine)
    rank, size = tftorus.world.rank(), tftorus.world.size()
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
    if engine == "horovod":
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     hvd.callbacks.MetricAverageCallback()]
    else:  # no Horovod runtime
        callbacks = []
    callbacks += [BatchSizeControl(SCHEDULE), record]
    ds = tf.data.Dataset.from_tensor_slices(
        (x[:, rank].reshape(-1, FEATURES).astype(np.float32), y[:, rank].reshape(-1)))
    ds = ds.batch(MICRO).repeat()
    model.fit(ds, epochs=2, steps_per_epoch=STEPS, callbacks=callbacks, verbose=0)
    model.fit(ds, initial_epoch=2, epochs=EPOCHS, steps_per_epoch=STEPS, callbacks=callbacks,
              verbose=0)
    os.makedirs(out_dir, exist_ok=True)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"),
             *[w.astype(np.float64) for w in model.get_weights()])
    saved = os.path.join(out_dir, f"model{rank}.keras")
    model.save(saved)
    reloaded = tf.keras.models.load_model(saved)  # Keras alone: nothing of tftorus needed
    same = all(np.array_equal(a, b) for a, b in zip(reloaded.get_weights(), model.get_weights()))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"logs": logs, "reloaded": type(reloaded.optimizer).__name__,
                   "reloaded_weights_equal": same}, f)
    tftorus.shutdown()
    print(f"rank {rank}/{size} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
