"""Worker: tftorus' tape gives what Horovod's own tape gives, for every Horovod argument.

Same gradients, same arguments (op, gradient_predivide_factor, groups, sparse_as_dense,
compression): `tftorus.DistributedGradientTape` must match `hvd.DistributedGradientTape`.
Gradients cover dense float32/float64, an IndexedSlices from an embedding lookup, an unused
variable (None gradient), a scalar, and a mixed-dtype set fused in one call.
"""

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import report  # noqa: E402  (tests/workers, the script's own folder)
import tftorus

failures = []
checks = 0


def variables():
    tf.random.set_seed(7)
    return [tf.Variable(tf.random.normal([5, 3]), name="w"),
            tf.Variable(tf.random.normal([3], dtype=tf.float64), name="b64"),
            tf.Variable(tf.zeros([10, 4]), name="embedding"),
            tf.Variable(1.5, name="scalar"),
            tf.Variable(tf.ones([2]), name="unused")]


def loss_fn(vs, rank):
    w, b64, emb, scalar, _ = vs
    x = tf.constant(np.arange(10, dtype=np.float32).reshape(2, 5) * (rank + 1) / 10)
    rows = tf.gather(emb, [rank % 10, (3 * rank + 1) % 10])  # -> IndexedSlices gradient
    return (tf.reduce_sum(tf.tanh(x @ w)) + tf.reduce_sum(tf.cast(b64, tf.float32) ** 2) * rank
            + tf.reduce_sum(rows * (rank + 1.0)) + scalar * scalar * (rank + 2.0))


def gradients(make_tape, vs, sources, rank, **kwargs):
    with tf.GradientTape() as tape:
        value = loss_fn(vs, rank)
    return make_tape(tape, **kwargs).gradient(value, sources)


def as_dense(g):
    return None if g is None else tf.convert_to_tensor(g).numpy().astype(np.float64)


def compare(label, ours, theirs, tol):
    global checks
    for i, (a, b) in enumerate(zip(ours, theirs)):
        checks += 1
        if (a is None) != (b is None):
            failures.append(f"{label} var {i}: None-ness differs ({a is None} vs {b is None})")
        elif a is not None and not np.allclose(as_dense(a), as_dense(b), rtol=tol, atol=tol):
            failures.append(f"{label} var {i}: max diff "
                            f"{np.max(np.abs(as_dense(a) - as_dense(b))):.3g}")
        elif a is not None and tf.convert_to_tensor(a).dtype != tf.convert_to_tensor(b).dtype:
            failures.append(f"{label} var {i}: dtype differs")


def main():
    tftorus.init()
    rank = hvd.rank()
    vs = variables()
    cases = {
        "average": {},
        "sum": {"op": hvd.Sum},
        # Horovod refuses a predivide factor with IndexedSlices; compare on dense gradients
        "predivide": {"gradient_predivide_factor": 2.0, "sparse_as_dense": True},
        "sparse_as_dense": {"sparse_as_dense": True},
        # Horovod's grouped all-reduce takes one dtype per group and no IndexedSlices:
        # compare those on the float32 variables, densified
        "groups=2": {"groups": 2, "sparse_as_dense": True},
        "groups=lists": {"groups": [[vs[0], vs[3]], [vs[2]]], "sparse_as_dense": True},
        "fp16-wire": {"compression": hvd.Compression.fp16},
    }
    for label, kwargs in cases.items():
        sources = [v for v in vs if v.dtype == tf.float32] if "groups" in kwargs else vs
        for algorithm in ("torus", "ring", "hierarchical"):
            ours = gradients(tftorus.DistributedGradientTape, vs, sources, rank,
                             algorithm=algorithm, **kwargs)
            theirs = gradients(hvd.DistributedGradientTape, vs, sources, rank, **kwargs)
            compare(f"{label}/{algorithm}", ours, theirs, 2e-3 if "fp16" in label else 1e-6)
            if not kwargs.get("sparse_as_dense") and not isinstance(ours[2], tf.IndexedSlices):
                failures.append(f"{label}/{algorithm}: embedding gradient is no IndexedSlices")
    # PartialDistributedGradientTape: a local layer's gradients stay on the worker (scaled by
    # 1/size, as Horovod's scale_local_gradients), the others are averaged over the torus.
    local = tf.keras.layers.Dense(2, kernel_initializer="ones", name="local")
    local.build((None, 3))

    def partial(make_tape, **kwargs):
        with tf.GradientTape() as tape:
            value = loss_fn(vs, rank) + tf.reduce_sum(local(tf.ones([1, 3]) * (rank + 1.0)))
        return make_tape(tape, local_layers=[local], **kwargs).gradient(
            value, vs[:2] + local.trainable_weights)

    for algorithm in ("torus", "ring"):
        compare(f"partial/{algorithm}",
                partial(tftorus.PartialDistributedGradientTape, algorithm=algorithm),
                partial(hvd.PartialDistributedGradientTape), 1e-6)
    # Mixed dtypes in one fused call.
    mixed = [tf.fill([3], float(rank)), tf.fill([2], np.float16(rank)),
             tf.fill([4], np.int32(rank)), tf.fill([1], np.float64(rank))]
    n = hvd.size()
    for t, got in zip(mixed, tftorus.fused_allreduce(mixed, "sum")):
        global checks
        checks += 1
        if got.dtype != t.dtype or not np.all(got.numpy() == n * (n - 1) / 2):
            failures.append(f"mixed dtypes {t.dtype.name}: got {got.numpy()}")
    report.finish(rank, checks, failures)


if __name__ == "__main__":
    main()
