"""Worker: tftorus.keras.SyncBatchNormalization (Keras 3, the tf engine) against float64 NumPy
of the whole batch, every rank's samples together.

    python -m tftorus.run -np 3 tests/workers/sync_batch_norm_check.py   (or TF_CONFIG processes)

Every rank has a batch of its own size (one rank an empty one in `empty`). Per case, each rank
checks its training-mode output, its gradients (the input's: of the sum of every rank's loss,
through the all-reduce; gamma's and beta's: of its own loss), the moving statistics after the
step, and the inference output after it (those moving statistics, no collective):
    eager     4-D channels-last input, eagerly
    traced    the same step in a tf.function, on a new layer
    masked    3-D input with a mask (only the unmasked positions count)
    empty     one rank without samples
    fit       model.fit with DistributedOptimizer, a different batch size per rank: weights and
              moving statistics the same on every rank, bit for bit
and the layer's config, Horovod's `fused` and Keras' `synchronized` arguments.
Prints "sync_batch_norm_check: N checks, M failed".
"""
import numpy as np

import tftorus as hvd
import tftorus.keras as hvd_keras

hvd.init()
import keras  # noqa: E402  (after init: TF joins its cluster when its runtime starts)
import tensorflow as tf  # noqa: E402

from tests.workers import report  # noqa: E402

rank, size = hvd.rank(), hvd.size()
checks, failed = 0, []
MOMENTUM, EPSILON = 0.8, 1e-3


def check(name, got, want, rtol=2e-5, atol=2e-5):
    global checks
    checks += 1
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
        error = np.max(np.abs(got - want)) if got.shape == want.shape else "shapes differ"
        failed.append(f"{name}: max error {error}, got {got.ravel()[:6]}, want "
                      f"{want.ravel()[:6]}")


def check_true(name, condition):
    global checks
    checks += 1
    if not condition:
        failed.append(name)


def batch_sizes(case):
    sizes = [3 + 2 * r for r in range(size)]  # unequal: 3, 5, 7, ...
    if case == "empty":
        sizes[1] = 0
    return sizes


def case_data(case, seed, shape_after_batch):
    """Every rank's inputs, upstream gradients and (for `masked`) masks; the same on every rank."""
    rng = np.random.RandomState(seed)
    channels = shape_after_batch[-1]
    offset, spread = rng.uniform(-2, 2, channels), rng.uniform(0.5, 3, channels)
    xs, cs, masks = [], [], []
    for b in batch_sizes(case):
        xs.append(offset + spread * rng.standard_normal((b, *shape_after_batch)))
        cs.append(rng.standard_normal((b, *shape_after_batch)))
        masks.append(rng.uniform(size=(b, *shape_after_batch[:-1])) < 0.7)
    params = [rng.uniform(0.5, 1.5, channels), rng.uniform(-1, 1, channels),  # gamma, beta
              rng.uniform(-1, 1, channels), rng.uniform(0.5, 2, channels)]  # moving mean, var
    return xs, cs, (masks if case == "masked" else None), params


def reference(xs, cs, masks, params):
    """float64 NumPy: this rank's output, input gradient (of every rank's loss sum(y * c)),
    gamma and beta gradients (of its own loss), the moving statistics after the step, and the
    inference output after the step."""
    gamma, beta, moving_mean, moving_var = params
    channels = len(gamma)
    flat = np.concatenate([x.reshape(-1, channels) for x in xs])
    up = np.concatenate([c.reshape(-1, channels) for c in cs])
    weight = (np.ones(len(flat)) if masks is None
              else np.concatenate([m.reshape(-1) for m in masks]).astype(np.float64))[:, None]
    n = weight.sum()
    mean = (weight * flat).sum(0) / n
    var = (weight * (flat - mean) ** 2).sum(0) / n
    inv = 1.0 / np.sqrt(var + EPSILON)
    xhat = (flat - mean) * inv
    dxhat = up * gamma
    # through the weighted mean and variance (only the weighted positions move them)
    dx = inv * (dxhat - weight * (dxhat.sum(0) + xhat * (dxhat * xhat).sum(0)) / n)
    start = sum(len(x.reshape(-1, channels)) for x in xs[:rank])
    mine = slice(start, start + len(xs[rank].reshape(-1, channels)))
    shape = xs[rank].shape
    moving_mean = moving_mean * MOMENTUM + mean * (1 - MOMENTUM)
    moving_var = moving_var * MOMENTUM + var * (1 - MOMENTUM)
    return {
        "output": (gamma * xhat + beta)[mine].reshape(shape),
        "dx": dx[mine].reshape(shape),
        "dgamma": (up * xhat)[mine].sum(0),
        "dbeta": up[mine].sum(0),
        "moving_mean": moving_mean,
        "moving_variance": moving_var,
        # after the step: the moving statistics it left
        "inference": gamma * (xs[rank] - moving_mean) / np.sqrt(moving_var + EPSILON) + beta,
    }


def new_layer(params, shape):
    layer = hvd_keras.SyncBatchNormalization(momentum=MOMENTUM, epsilon=EPSILON)
    layer.build((None, *shape))
    for variable, value in zip([layer.gamma, layer.beta, layer.moving_mean,
                                layer.moving_variance], params):
        variable.assign(value.astype(np.float32))
    return layer


def step(layer, x, c, mask):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True, mask=mask)
        loss = tf.reduce_sum(y * c)
    dx, dgamma, dbeta = tape.gradient(loss, [x, layer.gamma, layer.beta])
    return y, dx, dgamma, dbeta


def run_case(case, seed, shape, traced=False):
    xs, cs, masks, params = case_data(case, seed, shape)
    want = reference(xs, cs, masks, params)
    layer = new_layer(params, shape)
    x, c = tf.constant(xs[rank], tf.float32), tf.constant(cs[rank], tf.float32)
    mask = None if masks is None else tf.constant(masks[rank])
    run = tf.function(step) if traced else step
    y, dx, dgamma, dbeta = run(layer, x, c, mask)
    for name, got in [("output", y), ("dx", dx), ("dgamma", dgamma), ("dbeta", dbeta),
                      ("moving_mean", layer.moving_mean), ("moving_variance",
                                                           layer.moving_variance)]:
        check(f"{case} {name}", np.asarray(got), want[name])
    check(f"{case} inference", layer(x, training=False), want["inference"])


run_case("eager", 1, (3, 2, 4))
run_case("traced", 2, (3, 2, 4), traced=True)
run_case("masked", 3, (5, 3))
run_case("empty", 4, (2, 2, 3))


# -- model.fit: a different batch size per rank, the same weights and statistics on each -----
def fit_check():
    batch, steps = 4 + 2 * rank, 3
    rng = np.random.RandomState(100 + rank)  # each rank its own data
    x = rng.standard_normal((batch * steps, 6)).astype(np.float32) * 2 + 1
    y = rng.standard_normal((batch * steps, 1)).astype(np.float32)
    keras.utils.set_random_seed(5 + rank)  # different initial weights: the broadcast evens them
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5),
                              hvd_keras.SyncBatchNormalization(momentum=0.5),
                              keras.layers.Dense(1)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.05)),
                  loss="mse")
    model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    bn = model.layers[1]
    mine = np.concatenate([np.ravel(w) for w in model.get_weights()]).astype(np.float32)
    every = hvd.allgather(tf.constant(mine[None])).numpy()
    check_true("fit: weights and moving statistics the same on every rank",
               all(np.array_equal(row, mine) for row in every))
    check_true("fit: the moving statistics moved",
               not np.allclose(bn.moving_mean.numpy(), 0.0)
               and not np.allclose(bn.moving_variance.numpy(), 1.0))
    check_true("fit: finite", np.all(np.isfinite(mine)))


fit_check()

# -- arguments and config --------------------------------------------------------------------
layer = hvd_keras.SyncBatchNormalization(momentum=0.7, name="bn_a")
check_true("config round trip", hvd.SyncBatchNormalization.from_config(
    layer.get_config()).get_config() == layer.get_config())
for kwargs, words in [({"fused": True}, "fused=True"), ({"fused": None}, "fused=None"),
                      ({"synchronized": True}, "synchronized=True")]:
    try:
        hvd_keras.SyncBatchNormalization(**kwargs)
        check_true(f"{kwargs} refused", False)
    except ValueError as e:
        check_true(f"{kwargs} refused naming it", words in str(e))

report.finish(rank, checks, failed, "sync_batch_norm_check: ")
