"""An elastic Keras job over the torus (tests/test_elastic.py runs it under Horovod's elastic
driver): `import tftorus.keras as hvd`, KerasState, hvd.elastic.run around model.fit.

    python elastic_fit.py WORKDIR STEPS KILL_AT GROW_AFTER

Every step trains on step s's global batch of GLOBAL_BATCH rows, each rank on rows r::size, so
the averaged gradient is the same for any world size that divides GLOBAL_BATCH (3 and 4). The
state commits every COMMIT_EVERY steps; rank 0 appends the steps of each commit (with the
world's size and grid) to WORKDIR/committed.jsonl. The worker on elastic-host-3 kills itself
after step KILL_AT (uncommitted: the others roll back to the commit before); once GROW_AFTER
steps are committed on three workers, rank 0 adds elastic-host-4 to the discovery file.
WORKDIR/initial.npz and final.npz: the weights before the first step and after the last.
"""
import json
import logging
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

import tftorus.keras as hvd

FEATURES, CLASSES, GLOBAL_BATCH, COMMIT_EVERY = 6, 3, 12, 2
HOST = os.environ.get("HOROVOD_HOSTNAME", "")


def global_batch(step: int):
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal((GLOBAL_BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, GLOBAL_BATCH).astype(np.int64)
    return x, y


def build_model(dtype="float32"):
    model = tf.keras.Sequential([
        tf.keras.Input((FEATURES,), dtype=dtype),
        tf.keras.layers.Dense(8, activation="tanh", dtype=dtype),
        tf.keras.layers.Dense(CLASSES, dtype=dtype)])
    return model


LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
LR, MOMENTUM = 0.1, 0.9


def main(workdir: str, steps: int, kill_at: int, grow_after: int):
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    hvd.init()
    tf.keras.utils.set_random_seed(hvd.rank())  # different initial weights: sync must fix them
    model = build_model()
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(LR, momentum=MOMENTUM),
                                         algorithm="torus")
    model.compile(optimizer=optimizer, loss=LOSS)
    state = hvd.elastic.KerasState(model, step=0)
    pending = []  # steps done since the last commit: (step, size, grid)

    class CommitSteps(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            from tftorus.runtime import process_state
            pending.append((state.step, hvd.size(), str(process_state.state().grid)))
            state.step += 1
            if HOST == "elastic-host-3" and state.step == kill_at + 1:
                os.kill(os.getpid(), signal.SIGKILL)  # lost mid-epoch, after an uncommitted step
            if state.step % COMMIT_EVERY == 0 or state.step == steps:
                self.commit()

        def commit(self):
            hosts = os.path.join(workdir, "hosts")
            joining = "elastic-host-4" in open(hosts).read()
            if joining and hvd.size() == 3:
                time.sleep(1.0)  # give the driver time to start the new worker and tell us
            try:
                state.commit()  # saves, then raises HostsUpdatedInterrupt if a worker joins
            finally:  # the steps are committed once saved, whatever the host check raised
                if hvd.rank() == 0:
                    with open(os.path.join(workdir, "committed.jsonl"), "a") as f:
                        for step, size, grid in pending:
                            f.write(json.dumps({"step": step, "size": size, "grid": grid}) + "\n")
                pending.clear()
            on_three = sum(1 for s in committed(workdir) if s["size"] == 3)
            if hvd.rank() == 0 and hvd.size() == 3 and on_three >= grow_after and not joining:
                with open(hosts, "a") as f:
                    f.write("elastic-host-4:1\n")

    @hvd.elastic.run
    def train(state):
        pending.clear()  # a reset put back the last commit: those steps will run again
        if state.step == 0 and hvd.rank() == 0:
            np.savez(os.path.join(workdir, "initial.npz"), *model.get_weights())
        rank, size = hvd.rank(), hvd.size()
        batches = [global_batch(s) for s in range(state.step, steps)]
        x = np.stack([b[0][rank::size] for b in batches])
        y = np.stack([b[1][rank::size] for b in batches])
        data = tf.data.Dataset.from_tensor_slices((x, y))
        model.fit(data, epochs=1, steps_per_epoch=len(batches), verbose=0,
                  callbacks=[CommitSteps()])

    train(state)
    if hvd.rank() == 0:
        np.savez(os.path.join(workdir, "final.npz"), *model.get_weights())
        print(f"elastic_fit: done, {state.step} steps on {hvd.size()} workers", flush=True)
    hvd.shutdown()


def committed(workdir: str):
    path = os.path.join(workdir, "committed.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:5]))
