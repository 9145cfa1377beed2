"""Worker: gradient buckets go out while the backward pass is still running, on real collectives.

    horovodrun --gloo -np 4 -H localhost:4 python tests/workers/overlap.py ENGINE

ENGINE is 'horovod' or 'tf'. The model's first layer has a slow backward (a few hundred
stateless matmuls on its gradient path), so its weight gradient exists well after the last
layers'. Two clocks are read inside the training step's graph, by stateless NumPy functions
that sit in the data path (auto control dependencies order no stateless op, so neither waits
for the other):

  ready:  when the first layer's local weight gradient exists (the end of the backward pass)
  back:   when the last layer's *reduced* gradient is back from the all-reduce

With buckets in ready order, `back` comes before `ready` on every rank: the last layer's bucket
crossed all ranks while every rank was still in its slow backward. With one bucket of every
gradient (fusion threshold above the model's size) `back` must come after `ready`: the control
run, which shows the check can fail. The step is Keras' own minimize, split in its two halves
(optimizer.compute_gradients, which reduces, then apply_gradients), inside model.fit; then the
recipe's accumulating step (official_resnet.model.recipe_model), whose one reduction per update
should overlap the backward pass of the update's last micro-batch.

Also checked: every rank plans the same buckets and algorithms (gathered and compared). That
the reduced values are right is checked elsewhere (allreduce_check.py, gradient_semantics.py).
"""
import json
import os
import sys
import time
import zlib

ENGINE = sys.argv[1] if len(sys.argv) > 1 else "horovod"
GRID = "2x2"
# Four ranks share two cores. TF's default, an intra-op pool per core in every process, puts
# eight spinning threads on them, which starves Horovod's background thread and hides the
# overlap under scheduling delay (measured: the last bucket then came back with the slowest
# rank's backward pass, buckets or not). One intra-op thread per rank leaves cores for it.
# (An environment variable: the tf engine starts TF's runtime in init, before any tf.config.)
# (In tests/workers/suite.py TF has started already: the suite's launch sets it.)
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tftorus  # noqa: E402
import tftorus.keras  # noqa: E402
from official_resnet.model.recipe_model import RecipeModel  # noqa: E402
from tests.workers.report import finish  # noqa: E402
from tftorus.runtime import process_state, world  # noqa: E402
from tftorus.torus import algorithms, fusion

SLOW_MATMULS = 150  # of 512 x 512: 0.4 to 0.9 s per rank here, above the ranks' skew
STEPS = 4  # the first traces; three measured
clock = {"ready": [], "back": []}


def stamp(name, tensor):
    """`tensor`, unchanged, after the time it became available was noted as `name`."""
    def note(_):
        clock[name].append(time.monotonic())
        return np.float64(1.0)
    seen = tf.numpy_function(note, [tf.reshape(tensor, [-1])[:1]], tf.float64, stateful=False)
    seen = tf.reshape(seen, [])  # a scalar of known shape, so the result keeps the tensor's
    return tf.where(seen > 0, tensor, -tensor)  # data-dependent, so nothing prunes the clock


@tf.custom_gradient
def slow_backward(x):
    def grad(dy):
        m = tf.reshape(tf.tile(tf.reshape(dy, [-1])[:256], [1024]), [512, 512]) * 1e-3
        _, acc = tf.while_loop(lambda i, a: i < SLOW_MATMULS,
                               lambda i, a: (i + 1, tf.tanh(tf.matmul(a, m))), [0, m])
        # the first layer's weight gradient is x^T times this: noted as it leaves
        return stamp("ready", dy + 0.0 * tf.reduce_sum(acc))
    return tf.identity(x), grad


class Probe(tf.keras.Model):
    """Keras' minimize as its two halves, with the two clocks between them."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(y, self(x, training=True))
        variables = self.trainable_variables
        reduced = [g for g, _ in self.optimizer.compute_gradients(loss, variables, tape=tape)]
        reduced[-2] = stamp("back", reduced[-2])  # the last layer's kernel
        self.optimizer.apply_gradients(zip(reduced, variables))
        return {"loss": loss}


class RecipeProbe(RecipeModel):
    """The recipe's accumulating step, with the clock on its one reduction per update."""

    def _reduce(self, grads, loss):
        grads, loss = super()._reduce(grads, loss)
        grads[-2] = stamp("back", grads[-2])
        return grads, loss


def build(cls=Probe):
    tf.keras.utils.set_random_seed(1)
    inputs = tf.keras.Input([64])
    h = tf.keras.layers.Dense(256, name="first")(inputs)
    h = tf.keras.layers.Lambda(slow_backward)(h)
    for i in range(4):
        h = tf.keras.layers.Dense(256, activation="tanh", name=f"mid{i}")(h)
    outputs = tf.keras.layers.Dense(10, name="last")(h)
    return cls(inputs, outputs)


def run(threshold_bytes, algorithm="torus"):
    """Train STEPS steps; per step, back - ready on this rank (seconds)."""
    for v in clock.values():
        v.clear()
    model = build()
    opt = tftorus.keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), algorithm=algorithm,
                                             grid=GRID, fusion_threshold_bytes=threshold_bytes)
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rank = world.rank()
    x = tf.random.stateless_normal([16, 64], seed=[rank, 0])
    y = tf.constant(np.arange(16) % 10)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    model.fit(ds, steps_per_epoch=STEPS, verbose=0)
    return model, [b - r for r, b in zip(clock["ready"], clock["back"])]


def run_recipe(accumulation=2):
    """The recipe's step, `accumulation` micro-batches per update; per update, back - ready of
    its last micro-batch (whose backward pass the update's all-reduce can overlap)."""
    for v in clock.values():
        v.clear()
    model = build(RecipeProbe)
    model.compile(optimizer=tftorus.keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(0.01), algorithm="torus", grid=GRID,
        fusion_threshold_bytes=64 << 10))
    model.accumulation.assign(accumulation)
    rank = world.rank()
    x = tf.random.stateless_normal([16, 64], seed=[rank, 1])
    ds = tf.data.Dataset.from_tensors((x, tf.constant(np.arange(16) % 10))).repeat()
    model.fit(ds, steps_per_epoch=accumulation * STEPS, verbose=0)
    last_micro = clock["ready"][accumulation - 1::accumulation]
    return [b - r for r, b in zip(last_micro, clock["back"])]


def ring_ops(comm) -> dict:
    """How many of each op a traced 'ring' all-reduce of five tensors holds (traced, not run)."""
    tensors = [tf.TensorSpec(s, tf.float32) for s in [(3,), (5, 2), (), (7,), (4, 4)]]
    fn = tf.function(lambda ts: tftorus.fused_allreduce(ts, "sum", algorithm="ring", comm=comm))
    ops = {}
    for op in fn.get_concrete_function(tensors).graph.get_operations():
        ops[op.type] = ops.get(op.type, 0) + 1
    return ops


def every_rank(per_step) -> np.ndarray:
    """[step][rank] from this rank's list of per-step values."""
    mine = tf.one_hot(world.rank(), world.size(), dtype=tf.float64)[None, :] * \
        tf.constant(per_step, tf.float64)[:, None]
    return world.allreduce_sum(mine).numpy()


def main():
    # Before anything runs on TF's runtime (the tf engine starts it). In a suite the world is
    # up already, on its own default grid: the 2 x 2 grid is then one of its extra grids.
    tftorus.init(engine=ENGINE, extra_grids=[GRID])
    rank, failures, checks = world.rank(), [], 0
    model, overlap = run(threshold_bytes=64 << 10)  # several buckets, ready order
    _, joined = run(threshold_bytes=1 << 30)  # one bucket: the control
    recipe = run_recipe()
    comm = process_state.communicator()
    # On Horovod a flat sum goes tensor by tensor (Horovod fuses what is ready): it overlaps as
    # Horovod's own optimizer does, with no bucket of ours, even with one 'bucket' planned.
    flat = every_rank(run(threshold_bytes=1 << 30, algorithm="ring")[1]) if ENGINE == "horovod" \
        else None
    overlap, joined, recipe = every_rank(overlap), every_rank(joined), every_rank(recipe)
    # Steps after the first (which traces and warms up). Without overlap no rank can have a
    # bucket back before every rank's backward pass is over, so back - ready > 0 on every rank.
    # With it the bucket is back while the slowest rank (the last to finish its backward) is
    # still in its slow layer: below 0 there. (Ranks share two cores, so which rank is slowest
    # varies; the clock is the machine's, the same for every rank.)
    # Ranks share two cores, so one step can see a rank scheduled late enough to hide the
    # overlap; a design that overlaps shows it in most steps, one that cannot in none. So the
    # overlap must show in a majority of the steps, and the control in none.
    measured = range(1, STEPS)
    checks += 2 + len(measured)  # overlap, recipe, and the control at every step
    checks += flat is not None
    for name, runs in (("", overlap), ("the recipe's step, ", recipe),
                       ("'ring' tensor by tensor, ", flat)):
        if runs is None:
            continue
        seen = [step for step in measured if runs[step].min() < 0]
        if 2 * len(seen) <= len(measured):
            failures.append(f"{ENGINE}: {name}back - ready per step and rank "
                            f"{np.round(runs[1:], 3).tolist()} s; the last layer's bucket should "
                            f"be back before some rank's backward pass ends in most steps "
                            f"(seen in {len(seen)} of {len(measured)})")
    for step in measured:
        if not joined[step].min() > 0:
            failures.append(f"{ENGINE}: control (one bucket), step {step}: back - ready per rank "
                            f"{np.round(joined[step], 3).tolist()} s; expected > 0 on every rank")
    # Every rank plans the same buckets and algorithms.
    grads = [tf.zeros(v.shape, v.dtype) for v in model.trainable_variables]
    grid = process_state.grid_for("torus", GRID)
    plan = [(algorithms.choose("auto", grid, comm, b.nbytes), b.indices,
             b.shapes) for b in fusion.plan_buckets(grads, 64 << 10)]
    digest = zlib.crc32(json.dumps(plan, default=str).encode())
    digests = world.allreduce_sum(tf.one_hot(rank, world.size(), dtype=tf.float64) * digest)
    checks += 1
    if len(set(digests.numpy().tolist())) != 1:
        failures.append(f"{ENGINE}: ranks planned different buckets: {digests.numpy()}")
    # What the ring sends: five sums and the consistency check's on Horovod, with no pack of
    # ours (the one concat is the check's); one packed buffer on the tf engine, whose
    # collectives do not fuse.
    ops, checks = ring_ops(comm), checks + 1
    sums = ops.get("HorovodAllreduce", 0) + ops.get("CollectiveReduceV2", 0)
    want = (6, 1) if ENGINE == "horovod" else (2, 2)
    if (sums, ops.get("ConcatV2", 0)) != want:
        failures.append(f"{ENGINE}: a 'ring' all-reduce of five tensors traced to {sums} sums "
                        f"and {ops.get('ConcatV2', 0)} concats, expected {want}: {ops}")
    if rank == 0:
        print(f"back - ready, seconds, [step][rank]: ready order {np.round(overlap, 3).tolist()}, "
              f"one bucket {np.round(joined, 3).tolist()}, recipe {np.round(recipe, 3).tolist()}, "
              f"ring {None if flat is None else np.round(flat, 3).tolist()}; "
              f"{len(plan)} buckets", flush=True)
    finish(rank, checks, failures, f"{ENGINE} overlap: ")


if __name__ == "__main__":
    main()
