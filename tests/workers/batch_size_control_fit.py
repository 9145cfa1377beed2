"""Worker: BatchSizeControl in a user's own model.fit, and what it does to the updates.

    horovodrun --gloo -np 2 -H localhost:2 python tests/workers/batch_size_control_fit.py OUT
    python tests/workers/batch_size_control_fit.py OUT       # one process, the same totals

A small model without batch statistics, a mean loss and SGD with momentum: 2 workers at
micro-batch 4 and one process at micro-batch 8 see the same 8 examples per micro-step, so
with the same total batch per update the weights must agree. Epochs 0-1 take 1 micro-step per
update (total batch 8), epochs 2-3 take 2 (total batch 16). Each rank writes its weights and,
per epoch, the updates taken and the batch per update it saw.
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

import tftorus
import tftorus.keras as hvd  # the one-line change from horovod.tensorflow.keras
from official_resnet.model.recipe_model import RecipeModel
from official_resnet.run.callbacks import BatchSizeControl

STEPS, GLOBAL_MICRO, CLASSES, EPOCHS = 8, 8, 5, 4


class UpdateLog(tf.keras.callbacks.Callback):
    """Per epoch: optimizer updates taken, and the total batch of each update."""

    def __init__(self, micro_batch, workers):
        super().__init__()
        self.micro_batch, self.workers, self.epochs = micro_batch, workers, []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = int(self.model.optimizer.iterations.numpy())

    def on_epoch_end(self, epoch, logs=None):
        k = int(self.model.accumulation.numpy())
        self.epochs.append({"updates": int(self.model.optimizer.iterations.numpy()) - self._start,
                            "batch_per_update": k * self.micro_batch * self.workers})


def main():
    """Trains into sys.argv[1] (also inside tests/workers/suite.py)."""
    out_dir = sys.argv[1]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    rng = np.random.RandomState(1234)
    x = rng.standard_normal((STEPS * GLOBAL_MICRO, 8)).astype(np.float32)
    y = rng.randint(0, CLASSES, STEPS * GLOBAL_MICRO)
    micro = GLOBAL_MICRO // size
    # rank r's part of every global micro-batch
    x = x.reshape(STEPS, size, micro, 8)[:, rank].reshape(-1, 8)
    y = y.reshape(STEPS, size, micro)[:, rank].reshape(-1)
    tf.keras.utils.set_random_seed(rank)  # ranks start different: the broadcast fixes that
    net = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="tanh", input_shape=(8,)),
                               tf.keras.layers.Dense(CLASSES)])
    model = RecipeModel.wrap(net)
    tftorus.runtime.world.broadcast_variables(model.variables, root_rank=0)  # the first step too
    model.compile(optimizer=hvd.DistributedOptimizer(
        tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)))
    control = BatchSizeControl.from_total_batches([(0, 2, 8), (2, 4, 16)], micro_batch=micro,
                                                  workers=size)
    log = UpdateLog(micro, size)
    callbacks = [control, log]
    if size > 1:
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     hvd.callbacks.MetricAverageCallback()] + callbacks
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(micro).repeat()
    model.fit(data, epochs=EPOCHS, steps_per_epoch=STEPS, callbacks=callbacks, verbose=0)
    os.makedirs(out_dir, exist_ok=True)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"),
             *[v.numpy().astype(np.float64) for v in model.trainable_variables])
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(log.epochs, f)
    print(f"rank {rank}/{size} done", flush=True)


if __name__ == "__main__":
    main()
    tftorus.shutdown()
