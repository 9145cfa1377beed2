"""Worker: one rank feeds a NaN batch at step 1; every rank must skip that same step.

    horovodrun --gloo -np 2 -H localhost:2 python tests/workers/nonfinite_step.py
    python -m tftorus.run -np 2 tests/workers/nonfinite_step.py       # the current stack

The verdict comes from the all-reduced gradients, so ranks agree without any extra message;
weights and LARS velocities stay bit for bit what they were, and the next step applies.
"""
import numpy as np
import tensorflow as tf

import tftorus
import tftorus.keras
from official_resnet.model.recipe_model import RecipeModel
from official_resnet.optimizers.lars import LARS
import report  # noqa: E402  (tests/workers)


def main():
    tftorus.init()
    rank, size = tftorus.rank(), tftorus.size()
    tf.keras.utils.set_random_seed(5)
    model = RecipeModel.wrap(tf.keras.Sequential([
        tf.keras.layers.Dense(8, activation="tanh", input_shape=(6,)), tf.keras.layers.Dense(4)]),
        label_smoothing=0.1)
    model.compile(optimizer=tftorus.keras.DistributedOptimizer(
        LARS(learning_rate=0.1, momentum=0.9)))
    optimizer = model.optimizer
    rng = np.random.RandomState(rank)
    checks, failures, verdicts = 0, [], []
    for i in range(3):
        images = rng.standard_normal((8, 6)).astype(np.float32)
        if i == 1 and rank == size - 1:
            images[3, 2] = np.nan  # only the last rank sees the bad value
        before = [v.numpy().copy() for v in model.variables + optimizer.variables]
        model.train_on_batch(tf.constant(images), tf.constant(rng.randint(0, 4, 8)))
        applied = model.last_applied.numpy()
        after = [v.numpy() for v in model.variables + optimizer.variables]
        verdicts.append(bool(applied))
        unchanged = all(np.array_equal(a, b) for a, b in zip(before, after))
        checks += 1
        if i == 1 and (bool(applied) or not unchanged):
            failures.append(f"step {i}: applied={bool(applied)}, state unchanged={unchanged}")
        if i != 1 and (not bool(applied) or unchanged):
            failures.append(f"step {i}: a finite step was not applied")
    # Every rank holds the same weights after the skipped step (no rank went its own way).
    mine = tf.concat([tf.reshape(v, [-1]) for v in model.variables], 0)
    every = tftorus.allgather(tf.reshape(mine, [1, -1]))  # (Max/Min are Horovod's alone)
    checks += 1
    if float(tf.reduce_max(tf.abs(every - every[:1]))) != 0.0:
        failures.append("ranks' weights differ after the skipped step")
    print(f"[rank {rank}] verdicts {verdicts}", flush=True)
    report.finish(rank, checks, failures, what="non-finite step: ")


if __name__ == "__main__":
    main()
