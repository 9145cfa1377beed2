"""Driver (current stack): a user's Keras 3 fit with hvd.elastic on a local Ray cluster of a
head (no CPUs) and two worker nodes of 2 logical CPUs, 2 to 4 workers, under
tftorus.ray.RayExecutor(min_workers=2, max_workers=4) or (`--ray-train`) under Ray Train's
TensorflowTrainer with ScalingConfig(num_workers=(2, 4)).

Mid-epoch one worker node is killed, later a new one is added. The job must go on with the
survivors from the last commit, grow once the new node is there, and end with the weights of a
float64 replay of the committed steps, each on the world size it had (every rank takes 4 rows
of a step's global batch, so a step's batch is 4 x the world size). Under the executor rank 0
also logs each step (tftorus.ray.ray_logger) to a callback of run(). Prints "RESUMED AFTER x s"
and one line "RESULT {json}" for tests/test_ray.py.
"""
import json
import os
import sys
import tempfile
import threading
import time

import numpy as np

FEATURES, ROWS, BATCHES, EPOCHS, LR = 5, 4, 10, 2, 0.05
STEP_SECONDS = 0.25  # each step waits, so the node is killed mid-epoch
WORK = tempfile.mkdtemp(prefix="tftorus_ray_")  # the nodes share this machine's disk
PROGRESS = os.path.join(WORK, "progress")  # rank 0's "size epoch batch" after each step
LOGS = "--ray-train" not in sys.argv  # run(callbacks=) is the executor's (as in Horovod)


def data(epoch: int, batch: int, rows: int):
    """A step's global batch: the same on every rank and in the replay."""
    rng = np.random.default_rng(1000 * epoch + batch)
    x = rng.normal(size=(rows, FEATURES))
    y = x @ np.arange(1.0, FEATURES + 1) + 0.5 + 0.1 * rng.normal(size=rows)
    return x, y[:, None]


def train_fn(config=None):
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
            if rank == 0:
                with open(PROGRESS, "a") as f:
                    f.write(f"{size} {state.epoch} {state.batch} {time.time()}\n")
                if LOGS:
                    from tftorus.ray import ray_logger
                    ray_logger.log({"epoch": state.epoch, "batch": self.start + batch})
            time.sleep(STEP_SECONDS)

        def on_epoch_end(self, epoch, logs=None):
            state.batch = 0

    @hvd.elastic.run
    def train(state):
        while state.epoch < EPOCHS:
            start = state.batch
            if start == BATCHES:  # the last step's commit came before the epoch's end
                state.epoch, state.batch = state.epoch + 1, 0
                continue
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

    result = train(state)
    with open(os.path.join(WORK, f"result.{rank}"), "w") as f:  # Ray Train returns no values
        json.dump(result, f)
    return result


def replay(steps):
    w, b = np.zeros((FEATURES, 1)), np.zeros(1)
    for epoch, batch, size in steps:
        x, y = data(epoch, batch, ROWS * 4)
        x, y = x[:ROWS * size], y[:ROWS * size]
        err = x @ w + b - y
        w, b = w - LR * 2 * x.T @ err / len(x), b - LR * 2 * err.mean(axis=0)
    return w, b


def progress():
    """(size, epoch, batch, time) of rank 0's last step, or None."""
    try:
        with open(PROGRESS) as f:
            last = f.read().split("\n")[-2]
    except (OSError, IndexError):
        return None
    size, epoch, batch, when = last.split()
    return int(size), int(epoch), int(batch), float(when)


LOGGED = []  # what run()'s callback received


def run_executor():
    from tftorus.ray import RayExecutor
    executor = RayExecutor(RayExecutor.create_settings(), min_workers=2, max_workers=4,
                           cpus_per_worker=1)
    executor.start()
    return ((lambda: executor.run(train_fn, callbacks=[LOGGED.append])),
            (lambda: executor.world_sizes), executor.shutdown)


def run_ray_train():
    import ray.train
    from ray.train.tensorflow import TensorflowTrainer
    trainer = TensorflowTrainer(
        train_fn, scaling_config=ray.train.ScalingConfig(
            num_workers=(2, 4), resources_per_worker={"CPU": 1},
            # the added node is seen within 5 s: the last world of 4 has steps left to run
            elastic_resize_monitor_interval_s=5),
        run_config=ray.train.RunConfig(
            name="elastic_fit", storage_path=os.path.join(WORK, "ray_results"),
            failure_config=ray.train.FailureConfig(max_failures=3),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2)))
    def sizes():
        """The world sizes rank 0's steps ran on, in order (Ray Train reports no worlds)."""
        with open(PROGRESS) as f:
            seen = [int(line.split()[0]) for line in f if line.strip()]
        return [n for i, n in enumerate(seen) if i == 0 or seen[i - 1] != n]

    def fit():
        trainer.fit()
        return [json.load(open(os.path.join(WORK, f"result.{r}"))) for r in range(4)
                if os.path.exists(os.path.join(WORK, f"result.{r}"))]
    return fit, sizes, (lambda: None)


def main():
    # Ray Train: a smaller world after a loss without waiting a minute for the lost node. The
    # timeout bounds only the wait for the workers' CPUs (a placement group), which two live
    # nodes grant within a second; it runs out once or twice, while Ray still counts the lost
    # node (ray_cluster.HEALTH_CHECKS: a few seconds).
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "5")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ray_cluster  # tests/workers
    via_ray_train = "--ray-train" in sys.argv
    t0 = time.time()
    with ray_cluster.three_nodes(WORK) as (cluster, nodes):
        print(f"cluster up in {time.time() - t0:.1f} s", flush=True)
        run, world_sizes, stop = run_ray_train() if via_ray_train else run_executor()
        out = {}
        runner = threading.Thread(target=lambda: out.update(results=run()))
        runner.start()

        def wait_for(what, ok, timeout=300):
            deadline = time.time() + timeout
            while time.time() < deadline and runner.is_alive():
                p = progress()
                if p and ok(*p):
                    return p
                time.sleep(0.1)
            sys.exit(f"timed out waiting for {what}")

        # early in epoch 0: the epoch's end and the next epoch then run on the regrown world
        p = wait_for("4 workers mid-epoch 0", lambda n, e, b, t: n == 4 and e == 0 and b >= 3)
        cluster.remove_node(nodes[1])  # in the main thread: Ray's add_node needs it too
        lost = time.time()
        print(f"KILLED a worker node at epoch {p[1]} batch {p[2]}", flush=True)
        p = wait_for("2 workers", lambda n, e, b, t: n == 2)
        print(f"RESUMED AFTER {p[3] - lost:.1f} s (the first step of 2 workers, at epoch "
              f"{p[1]} batch {p[2]})", flush=True)
        p = wait_for("2 workers, 2 steps later",
                     lambda n, e, b, t: n == 2 and e * BATCHES + b >= p[1] * BATCHES + p[2] + 2)
        cluster.add_node(num_cpus=2)
        print(f"ADDED a worker node at epoch {p[1]} batch {p[2]}", flush=True)
        runner.join(400)
        results = out.get("results")
        if not results:
            sys.exit("the run returned nothing")
        first = results[0]
        w, b = replay(first["steps"])
        got_w, got_b = (np.array(v) for v in first["weights"])
        print("RESULT " + json.dumps({
            "world_sizes": world_sizes(), "sizes_seen": sorted({n for *_, n in first["steps"]}),
            "last_size": first["size"], "steps": len(first["steps"]),
            "positions": sorted({(e, b) for e, b, _ in first["steps"]}) == [
                (e, b) for e in range(EPOCHS) for b in range(BATCHES)],
            "resets": first["resets"], "ranks": [r["rank"] for r in results],
            "same_on_every_rank": all(r["weights"] == first["weights"] for r in results),
            "logged_every_step": sorted({(v["epoch"], v["batch"]) for v in LOGGED}) == [
                (e, b) for e in range(EPOCHS) for b in range(BATCHES)] if LOGS else None,
            "max_abs_diff": float(max(np.abs(got_w - w).max(), np.abs(got_b - b).max())),
            "scale": float(np.abs(w).max())}), flush=True)
        stop()


if __name__ == "__main__":
    main()
