"""Worker: train a small model for 20 steps and save its weights.

With N ranks each rank takes its 1/N slice of every global batch; one process takes whole
global batches. A model without batch statistics (no BatchNorm) and a mean loss give the same
gradient either way, so the final weights must agree. Modes:

  fit          model.fit, Keras 2.15 (new) SGD with momentum, tftorus.keras.DistributedOptimizer
  fit_legacy   model.fit, tf.keras.optimizers.legacy.SGD
  tape         custom loop, tftorus.DistributedGradientTape, new SGD
  accumulate   model.fit with backward_passes_per_step=2 on half-size batches (legacy SGD)
  mixed        model.fit under the mixed_float16 policy (LossScaleOptimizer around ours)

    horovodrun --gloo -np 4 -H localhost:4 python tests/workers/train_equivalence.py fit OUT
    python tests/workers/train_equivalence.py fit,tape,mixed OUT   # one-process references

Several modes (comma-separated) run one after the other in the same processes, each writing
OUT/MODE/rankR.npz and printing "[MODE] ..." lines, so one launch serves several tests.

TFTORUS_ENGINE=tf runs the same on the tf engine (TensorFlow's collective ops), under horovodrun
or as TF_CONFIG processes: no Horovod runtime then, so Horovod's callbacks are left out (the
initial broadcast is explicit anyway) and rank, size and broadcast come from tftorus.runtime.world.
"""
import os
import sys

import numpy as np
import tensorflow as tf

import tftorus
import tftorus.keras as hvd  # the one-line change from `import horovod.tensorflow.keras as hvd`

STEPS, GLOBAL_BATCH, CLASSES = 20, 32, 5
ENGINE = os.environ.get("TFTORUS_ENGINE", "horovod")
# TFTORUS_ALGORITHM forces one (the engines' comparison: 'auto' takes each engine's own
# all-reduce on one host, whose sums round differently)
TORUS = {"algorithm": os.environ["TFTORUS_ALGORITHM"]} if os.environ.get("TFTORUS_ALGORITHM") \
    else {}


def data():
    rng = np.random.RandomState(1234)
    x = rng.standard_normal((STEPS * GLOBAL_BATCH, 8, 8, 3)).astype(np.float32)
    y = rng.randint(0, CLASSES, STEPS * GLOBAL_BATCH)
    return x, y


def shard(array, rank, size):
    """Rank r's part of each global batch: rows [r*b, (r+1)*b) of every batch of 32."""
    per = GLOBAL_BATCH // size
    return array.reshape(STEPS, size, per, *array.shape[1:])[:, rank].reshape(-1, *array.shape[1:])


def model(seed):
    tf.keras.utils.set_random_seed(seed)  # ranks start different: the broadcast must fix that
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(4, 3, activation="relu", input_shape=(8, 8, 3)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="tanh"),
        tf.keras.layers.Dense(CLASSES),
    ])


def main():
    """Trains the modes of sys.argv[1] into sys.argv[2] (also inside tests/workers/suite.py)."""
    modes, out_dir = sys.argv[1], sys.argv[2]
    hvd.init(engine=ENGINE)
    for mode in modes.split(","):
        tf.keras.backend.clear_session()
        tf.keras.mixed_precision.set_global_policy("mixed_float16" if mode == "mixed" else
                                                   "float32")
        train(mode, os.path.join(out_dir, mode))


def train(mode, out_dir):
    rank, size = tftorus.runtime.world.rank(), tftorus.runtime.world.size()
    x, y = data()
    x, y = shard(x, rank, size), shard(y, rank, size)
    net = model(seed=rank)
    tftorus.runtime.world.broadcast_variables(net.variables, root_rank=0)  # all start from rank 0's weights
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    legacy = mode in ("fit_legacy", "accumulate")
    sgd = tf.keras.optimizers.legacy.SGD if legacy else tf.keras.optimizers.SGD
    passes = 2 if mode == "accumulate" else 1
    per_rank = GLOBAL_BATCH // size // passes

    if mode == "tape":
        opt = sgd(learning_rate=0.1, momentum=0.9)
        for step in range(STEPS):
            xb = x[step * per_rank:(step + 1) * per_rank]
            yb = y[step * per_rank:(step + 1) * per_rank]
            with tf.GradientTape() as tape:
                value = loss(yb, net(xb, training=True))
            tape = tftorus.DistributedGradientTape(tape, **TORUS)
            grads = tape.gradient(value, net.trainable_variables)
            opt.apply_gradients(zip(grads, net.trainable_variables))
    else:
        opt = hvd.DistributedOptimizer(
            sgd(learning_rate=0.1, momentum=0.9), backward_passes_per_step=passes, **TORUS,
            average_aggregated_gradients=True)
        net.compile(optimizer=opt, loss=loss)
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # Horovod's, as they are
                     hvd.callbacks.MetricAverageCallback()] if ENGINE == "horovod" else []
        net.fit(x, y, batch_size=per_rank, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        if rank == 0:
            print(f"[{mode}] optimizer class: {type(net.optimizer).__name__}"
                  f"{'/' + type(net.optimizer.inner_optimizer).__name__ if mode == 'mixed' else ''}")
    os.makedirs(out_dir, exist_ok=True)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"),
             *[v.numpy().astype(np.float64) for v in net.trainable_variables])
    if mode == "fit" and rank == 0:  # a saved model loads back with the torus optimizer
        path = os.path.join(out_dir, "model.h5")
        net.save(path)
        loaded = hvd.load_model(path)
        print(f"[{mode}] reloaded optimizer: {type(loaded.optimizer).__name__}, "
              f"torus: {hasattr(loaded.optimizer, '_allreduce_grads')}")
    print(f"[{mode}] rank {rank}/{size} done", flush=True)


if __name__ == "__main__":
    main()
    tftorus.shutdown()  # every rank is past its last collective before any exits
