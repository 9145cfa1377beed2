"""Worker: a user's own model under `mixed_float16`, one rank's batch overflowing float16.

    python -m tftorus.run -np 2 tests/workers/mixed_precision_overflow.py OUT MODE[,MODE...]
    horovodrun --gloo -np 2 -H localhost:2 python tests/workers/mixed_precision_overflow.py OUT fit

A two-layer model with `tftorus.keras.DistributedOptimizer(SGD(LR, momentum=MOMENTUM))`, the
global policy `mixed_float16`, trained STEPS steps by MODE: `fit` (`model.fit`, with a
LossScaleOptimizer around ours), `tape` (a tape loop with `DistributedGradientTape` and a
loss-scaled plain SGD: Horovod's way on both stacks) or `tape-optimizer` (a tape loop calling
`apply` of a LossScaleOptimizer around ours: Keras 3 only, as Horovod's Keras 2 wrapper reduces
in `fit`'s gradient computation, never in `apply_gradients`) or `fit-accumulate` (`fit` with
backward_passes_per_step=PASSES: the skipped micro-batch is left out of every rank's sum). At step
BAD_STEP the last rank's batch holds a value float16 cannot hold, so its local gradients are not
finite; the other ranks' are. Every rank must skip that same step (the loss scale halves once
everywhere) and go on: no collective split, the same weights on every rank. Each rank writes its
weights, the optimizer's step count and the loss scale to OUT/MODE-rank{R}.npz; the test
compares the weights with `reference`, float64 NumPy of the other steps. This module's top level
is NumPy only, for the test to import.
"""
import os
import sys

import numpy as np

STEPS, BAD_STEP, BATCH, FEATURES, HIDDEN = 5, 2, 4, 3, 5
PASSES = 2  # fit-accumulate: micro-batches per update (backward_passes_per_step)
LR, MOMENTUM = 0.1, 0.9
INITIAL_SCALE = 2.0 ** 10  # small enough that no finite step's scaled gradients overflow
TOO_LARGE = 1e6  # float16 holds at most 65504: the cast to the compute dtype gives inf


def data(workers: int):
    """x [STEPS, workers, BATCH, FEATURES], y [STEPS, workers, BATCH, 1]; finite, small."""
    rng = np.random.RandomState(3)
    x = rng.standard_normal((STEPS, workers, BATCH, FEATURES)) * 0.5
    y = rng.standard_normal((STEPS, workers, BATCH, 1)) * 0.5
    return x, y


def initial_weights():
    rng = np.random.RandomState(4)
    return [rng.standard_normal((FEATURES, HIDDEN)) * 0.5, rng.standard_normal(HIDDEN) * 0.1,
            rng.standard_normal((HIDDEN, 1)) * 0.5, rng.standard_normal(1) * 0.1]


def gradients(weights, x, y):
    """Of the mean squared error of tanh(x W1 + b1) W2 + b2 over the batch."""
    w1, b1, w2, b2 = weights
    h = np.tanh(x @ w1 + b1)
    d = 2.0 * (h @ w2 + b2 - y) / y.size
    dh = (d @ w2.T) * (1 - h ** 2)
    return [x.T @ dh, dh.sum(0), h.T @ d, d.sum(0)]


def reference(workers: int, skipped=(BAD_STEP,), passes: int = 1):
    """Float64 weights after SGD with momentum on the rank-averaged gradients of every step
    but `skipped`, the gradients of `passes` kept steps summed per update."""
    x, y = data(workers)
    weights = initial_weights()
    velocity = [np.zeros_like(w) for w in weights]
    kept = [step for step in range(STEPS) if step not in skipped]
    for first in range(0, len(kept) - passes + 1, passes):
        total = [np.zeros_like(w) for w in weights]
        for step in kept[first:first + passes]:
            per_rank = [gradients(weights, x[step, r], y[step, r]) for r in range(workers)]
            total = [t + np.mean([g[i] for g in per_rank], axis=0)
                     for i, t in enumerate(total)]
        velocity = [MOMENTUM * v - LR * g for v, g in zip(velocity, total)]
        weights = [w + v for w, v in zip(weights, velocity)]
    return weights


def train(mode: str, rank: int, size: int):
    """One model trained by `mode` (see the module docstring); its weights, the optimizer's step
    count and the loss scale."""
    import tensorflow as tf

    import tftorus
    import tftorus.keras as hvd

    keras = tf.keras
    keras3 = hasattr(keras.optimizers.Optimizer, "stateless_apply")  # Keras 3 only
    model = keras.Sequential([keras.Input((FEATURES,)),
                              keras.layers.Dense(HIDDEN, activation="tanh"),
                              keras.layers.Dense(1, dtype="float32")])
    model.set_weights([w.astype(np.float32) for w in initial_weights()])
    x, y = data(size)
    x = x[:, rank].astype(np.float32)
    y = y[:, rank].astype(np.float32)
    if rank == size - 1:
        x[BAD_STEP, 0, 0] = TOO_LARGE

    def loss_scaled(optimizer):
        return keras.mixed_precision.LossScaleOptimizer(optimizer, **(
            {"initial_scale": INITIAL_SCALE} if keras3 else
            {"dynamic": True, "initial_scale": INITIAL_SCALE}))

    sgd = keras.optimizers.SGD(LR, momentum=MOMENTUM)
    if mode == "tape":  # Horovod's way: the tape reduces; a plain loss-scaled optimizer
        optimizer = loss_scaled(sgd)
    else:
        passes = PASSES if mode == "fit-accumulate" else 1
        optimizer = loss_scaled(hvd.DistributedOptimizer(sgd, backward_passes_per_step=passes))
    variables = model.trainable_variables
    if mode.startswith("fit"):  # compile keeps a LossScaleOptimizer it is given
        model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
        model.fit(x.reshape(-1, FEATURES), y.reshape(-1, 1), batch_size=BATCH, epochs=1,
                  shuffle=False, verbose=0)
    else:
        loss_fn = keras.losses.MeanSquaredError()

        @tf.function(jit_compile=False)
        def step(images, targets):
            with tf.GradientTape() as tape:
                loss = loss_fn(targets, model(images, training=True))
                scaled = (optimizer.scale_loss(loss) if keras3 else
                          optimizer.get_scaled_loss(loss))
            if mode == "tape":
                tape = tftorus.DistributedGradientTape(tape)  # horovod.tensorflow's
            grads = tape.gradient(scaled, variables)
            if keras3:
                optimizer.apply(grads, variables)
            else:
                optimizer.apply_gradients(zip(optimizer.get_unscaled_gradients(grads),
                                              variables))

        for i in range(STEPS):
            step(tf.constant(x[i]), tf.constant(y[i]))
    scale = optimizer.dynamic_scale if keras3 else optimizer.loss_scale
    return ([v.numpy() for v in model.weights], int(optimizer.iterations.numpy()),
            float(np.asarray(scale)))


def main():
    import tensorflow as tf

    import tftorus.keras as hvd

    out, modes = sys.argv[1], sys.argv[2].split(",")
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    for mode in modes:
        weights, steps, scale = train(mode, rank, size)
        np.savez(os.path.join(out, f"{mode}-rank{rank}.npz"), *weights, steps=steps, scale=scale)
        print(f"[rank {rank}] {mode}: steps {steps}, loss scale {scale}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
