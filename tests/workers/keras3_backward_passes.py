"""Worker: Horovod's backward_passes_per_step and average_aggregated_gradients in
`tftorus.keras.DistributedOptimizer` on Keras 3, against a float64 NumPy replay
(tests/test_keras3_optimizer.py; 2+ processes with TF_CONFIG).

Every case trains user_fit_accumulation's model (a tanh layer and a linear one, sparse
cross-entropy, SGD with momentum) from the same weights on each rank's own micro-batches:

  fit, k=2, mean          model.fit, 2 epochs of 8 micro-batches: 8 updates
  fit, k=4, sum           average_aggregated_gradients=False: the update is the sum of 4
  tf.function loop, k=3   tape, then apply_gradients, 8 calls: 2 updates, the last 2 calls'
                          gradients summed but never applied
  eager loop, k=2, sum    the same without tf.function, 6 calls

The replay: each call's gradient (at the weights of the last update) averaged over the ranks and
added up; every k-th call applies that sum (divided by k for the mean) as Keras' SGD does
(v = m v - lr g; w += v). The weights must match to 1e-5 relative and `iterations` must count the
updates. Prints "backward passes: N checks, M failed"; exits 1 on any failure.
"""
import numpy as np

import tftorus.keras as hvd
import user_fit_accumulation as model_math  # tests/workers: the model in float64 NumPy

hvd.init()
import keras  # noqa: E402  (after init: TF joins its cluster when its runtime starts)
import tensorflow as tf  # noqa: E402

import report  # noqa: E402

RANK, N = hvd.rank(), hvd.size()
STEPS, MICRO, FEATURES = model_math.STEPS, model_math.MICRO, model_math.FEATURES
MOMENTUM = model_math.MOMENTUM
X, Y = model_math.data(N)  # [STEPS, N, MICRO, ...]: micro-step s, rank r
checks, failures = 0, []


def replay(k, average, lr, calls):
    """(float64 weights after `calls` calls, updates) as the module docstring says."""
    weights, velocity = model_math.initial_weights(), [0.0] * 4
    summed = [np.zeros_like(w) for w in weights]
    for call in range(calls):
        s = call % STEPS
        ranks = [model_math.gradients(weights, X[s, r], Y[s, r]) for r in range(N)]
        summed = [a + np.mean([g[i] for g in ranks], axis=0) for i, a in enumerate(summed)]
        if (call + 1) % k == 0:
            update = [a / k if average else a for a in summed]
            velocity = [MOMENTUM * v - lr * u for v, u in zip(velocity, update)]
            weights = [w + v for w, v in zip(weights, velocity)]
            summed = [np.zeros_like(w) for w in weights]
    return weights, calls // k


def model_and_optimizer(k, average, lr):
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(model_math.HIDDEN, activation="tanh")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(model_math.CLASSES)(hidden))
    model.set_weights([w.astype(np.float32) for w in model_math.initial_weights()])
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.SGD(learning_rate=lr, momentum=MOMENTUM), backward_passes_per_step=k,
        average_aggregated_gradients=average)
    return model, optimizer


def compare(name, model, optimizer, k, average, lr, calls):
    global checks
    want, updates = replay(k, average, lr, calls)
    for i, (got, w) in enumerate(zip(model.get_weights(), want)):
        checks += 1
        rel = float(np.max(np.abs(got - w)) / np.max(np.abs(w)))
        if not rel < 1e-5:
            failures.append(f"{name}: variable {i} is {rel:.2e} off the replay")
    checks += 1
    if int(optimizer.iterations.numpy()) != updates:
        failures.append(f"{name}: iterations {int(optimizer.iterations.numpy())}, want the "
                        f"{updates} updates")


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
MINE = (X[:, RANK].astype(np.float32), Y[:, RANK])  # [STEPS, MICRO, ...]: this rank's


def fit_case(name, k, average, lr, epochs):
    model, optimizer = model_and_optimizer(k, average, lr)
    model.compile(optimizer=optimizer, loss=LOSS)
    data = tf.data.Dataset.from_tensor_slices(
        (MINE[0].reshape(-1, FEATURES), MINE[1].reshape(-1))).batch(MICRO).repeat()
    model.fit(data, epochs=epochs, steps_per_epoch=STEPS, shuffle=False, verbose=0)
    compare(name, model, optimizer, k, average, lr, epochs * STEPS)


def loop_case(name, k, average, lr, calls, traced):
    model, optimizer = model_and_optimizer(k, average, lr)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    step = tf.function(step) if traced else step
    for call in range(calls):
        step(tf.constant(MINE[0][call % STEPS]), tf.constant(MINE[1][call % STEPS]))
    compare(name, model, optimizer, k, average, lr, calls)


fit_case("fit, k=2, mean", 2, True, model_math.LR, epochs=2)
fit_case("fit, k=4, sum", 4, False, model_math.LR / 4, epochs=2)
loop_case("tf.function loop, k=3, mean", 3, True, model_math.LR, calls=8, traced=True)
loop_case("eager loop, k=2, sum", 2, False, model_math.LR / 2, calls=6, traced=False)
report.finish(RANK, checks, failures, what="backward passes: ")
