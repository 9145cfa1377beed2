"""Driver (current stack): a user's Keras 3 fit under tftorus.ray.RayExecutor with min 2 / max 4
workers on a local Ray cluster of a head (no CPUs) and two worker nodes of 2 logical CPUs.

Mid-epoch one worker node is killed, later a new one is added. The job must go on with the
survivors from the last commit, grow at a commit once the new node is there, and end with the
weights of a float64 replay of the committed steps, each on the world size it had (every rank
takes 4 rows of a step's global batch, so a step's batch is 4 x the world size). Prints one
line "RESULT {json}" for tests/test_ray.py.
"""
import json
import sys
import threading
import time

import numpy as np

FEATURES, ROWS, BATCHES, EPOCHS, LR = 5, 4, 10, 3, 0.05
STEP_SECONDS = 0.25  # each step waits, so the node is killed mid-epoch


def data(epoch: int, batch: int, rows: int):
    """A step's global batch: the same on every rank and in the replay."""
    rng = np.random.default_rng(1000 * epoch + batch)
    x = rng.normal(size=(rows, FEATURES))
    y = x @ np.arange(1.0, FEATURES + 1) + 0.5 + 0.1 * rng.normal(size=rows)
    return x, y[:, None]


def train_fn():
    import tftorus.keras as hvd
    hvd.init()
    import keras
    import tensorflow as tf
    rank, size = hvd.rank(), hvd.size()
    model = keras.Sequential([keras.Input((FEATURES,)),
                              keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
    state = hvd.elastic.KerasState(model, epoch=0, batch=0, steps=[])
    resets = []
    state.register_reset_callbacks([lambda: resets.append(size)])

    class Record(keras.callbacks.Callback):
        """Before the commit: where the next step starts, and this step's world size."""
        def __init__(self, start):
            super().__init__()
            self.start = start

        def on_train_batch_end(self, batch, logs=None):
            state.steps = state.steps + [(state.epoch, self.start + batch, size)]
            state.batch = self.start + batch + 1
            time.sleep(STEP_SECONDS)

        def on_epoch_end(self, epoch, logs=None):
            state.batch = 0

    @hvd.elastic.run
    def train(state):
        while state.epoch < EPOCHS:
            start = state.batch
            xs, ys = zip(*(data(state.epoch, b, ROWS * 4) for b in range(start, BATCHES)))
            mine = slice(ROWS * rank, ROWS * (rank + 1))
            ds = tf.data.Dataset.from_tensor_slices(
                (np.stack([x[mine] for x in xs]).astype("float32"),
                 np.stack([y[mine] for y in ys]).astype("float32")))
            model.fit(ds, epochs=1, verbose=0,
                      callbacks=[Record(start), hvd.elastic.UpdateEpochStateCallback(state),
                                 hvd.elastic.CommitStateCallback(state)])
        return {"rank": rank, "size": size, "resets": resets, "steps": state.steps,
                "weights": [w.tolist() for w in model.get_weights()]}

    return train(state)


def replay(steps):
    w, b = np.zeros((FEATURES, 1)), np.zeros(1)
    for epoch, batch, size in steps:
        x, y = data(epoch, batch, ROWS * 4)
        x, y = x[:ROWS * size], y[:ROWS * size]
        err = x @ w + b - y
        w, b = w - LR * 2 * x.T @ err / len(x), b - LR * 2 * err.mean(axis=0)
    return w, b


def main():
    import ray
    from ray.cluster_utils import Cluster
    from tftorus.ray import RayExecutor
    t0 = time.time()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [cluster.add_node(num_cpus=2) for _ in range(2)]
    ray.init(address=cluster.address, include_dashboard=False)
    print(f"cluster up in {time.time() - t0:.1f} s", flush=True)
    executor = RayExecutor(RayExecutor.create_settings(), min_workers=2, max_workers=4,
                           cpus_per_worker=1)
    executor.start()
    out = {}
    runner = threading.Thread(target=lambda: out.update(results=executor.run(train_fn)))
    runner.start()
    events = []

    def wait_for(what, ok, timeout=240):
        deadline = time.time() + timeout
        while time.time() < deadline and runner.is_alive():
            p = executor.progress()
            if p and ok(p):
                return p
            time.sleep(0.2)
        sys.exit(f"timed out waiting for {what}")

    p = wait_for("world 1 mid-epoch", lambda p: p["world"]["number"] == 1
                 and p["attributes"].get("epoch") == 1 and p["attributes"].get("batch", 0) >= 3)
    cluster.remove_node(nodes[1])
    events.append(("killed", time.time(), p["attributes"]))
    print(f"KILLED a worker node at {p['attributes']}", flush=True)
    p = wait_for("world 2 steps", lambda p: p["world"]["number"] == 2
                 and p["world"]["resumed"] and p["commits"] >= 0 and
                 p["attributes"].get("epoch", 0) * BATCHES + p["attributes"].get("batch", 0)
                 >= 2 * BATCHES - 2)
    cluster.add_node(num_cpus=2)
    print(f"ADDED a worker node at {p['attributes']}", flush=True)
    runner.join(300)
    results = out.get("results")
    if not results:
        sys.exit("the run returned nothing")
    w, b = replay(results[0]["steps"])
    got_w, got_b = (np.array(v) for v in results[0]["weights"])
    print("RESULT " + json.dumps({
        "world_sizes": executor.world_sizes, "sizes_seen": sorted({s for *_, s in results[0]["steps"]}),
        "steps": len(results[0]["steps"]), "resets": results[0]["resets"],
        "ranks": [r["rank"] for r in results],
        "same_on_every_rank": all(r["weights"] == results[0]["weights"] for r in results),
        "max_abs_diff": float(max(np.abs(got_w - w).max(), np.abs(got_b - b).max())),
        "scale": float(np.abs(w).max())}), flush=True)
    executor.shutdown()
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
