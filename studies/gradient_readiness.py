"""When a training step hands its gradient buckets to the all-reduce: the bound on overlap.

    .venv/bin/python -m studies.gradient_readiness                       # the step study's model
    .venv/bin/python -m studies.gradient_readiness --batch 32 --wire fp16 --fusion-mb 4
    .venv-current/bin/python -m studies.gradient_readiness --batch 32    # the current stack

One process, no collectives: Keras' ResNet-50 (as studies/emulated_step.py trains it: 32 x 32
images, 10 classes, SGD with momentum) takes training steps in a tf.function, and clocks
inside the step say when the forward pass ends and when each of tftorus' buckets (the plan
tftorus.torus.fusion makes for the wire's dtype and --fusion-mb) has every gradient it holds.
A bucket's collectives can start no earlier: inside a graph they depend on nothing else.

The printout is the step's shape and what it allows. A data-parallel step runs the previous
update, the forward pass and the backward pass up to the first full bucket before its first
byte can leave, so of a compute step of C seconds at most C - (first bucket's time) can run
beside the all-reduce, and less where the update can only start once every bucket's sum is
back (in the plain step it runs beside the backward pass). That bounds the step study's
"hidden" column (its share of the compute hidden under the all-reduce, where the all-reduce is
the longer) for any optimizer and any network. The clocks are TensorFlow's own (tf.timestamp),
made in the order the buckets are ready: a tf.function runs such stateful ops in the order they
were made, so each waits for the ones before it as well as for its bucket.

--threads sets TensorFlow's intra-op threads (default 1: what each of four ranks on two cores
gets in the emulated cluster's studies). Times are medians over --steps after --warmup.
"""
import argparse
import os
import statistics
import sys
import time
from typing import Dict, List


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=4, help="images per step (the step study's)")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--wire", choices=("fp16", "fp32"), default="fp16",
                   help="the dtype the buckets are planned in (tftorus' FP16 compression)")
    p.add_argument("--fusion-mb", type=float, default=None,
                   help="tftorus' bucket size (default: tftorus.torus.fusion's)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (0: TF's default)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    if args.batch < 1 or args.image_size < 32 or args.steps < 1 or args.warmup < 0:
        p.error("--batch >= 1, --image-size >= 32 (ResNet-50's smallest), --steps >= 1 and "
                "--warmup >= 0")
    if args.threads < 0:
        p.error(f"--threads takes 0 (TensorFlow's default) or more, got {args.threads}")
    if args.fusion_mb is not None and args.fusion_mb < 0:
        p.error(f"--fusion-mb takes 0 (no fusion) or more MiB, got {args.fusion_mb}")
    return args


def bucket_plan(variables, wire, threshold_bytes: int):
    """tftorus' buckets of these variables' gradients on the wire's dtype, in ready order."""
    import tensorflow as tf

    from tftorus.torus import fusion
    specs = [tf.TensorSpec(v.shape, wire) for v in variables]
    return fusion.plan_buckets(specs, threshold_bytes)


def readiness(model, optimizer, loss_fn, images, labels, buckets, steps: int,
              warmup: int) -> Dict[str, object]:
    """Medians, in seconds from the step's start: 'forward', 'buckets' (one per bucket, when
    its last gradient exists), 'backward' (every gradient), and 'step' (the same steps with
    their update, timed from outside: the clocks' own runs), 'update' (the update alone, of
    gradients made before)."""
    import tensorflow as tf
    variables = model.trainable_variables

    @tf.function
    def clocked():
        start = tf.timestamp()
        with tf.control_dependencies([start]):
            x = tf.identity(images)
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(x, training=True))
        with tf.control_dependencies([loss]):
            forward = tf.timestamp()
        grads = tape.gradient(loss, variables)
        ready = []
        for bucket in buckets:  # in ready order (see the docstring)
            with tf.control_dependencies([grads[i] for i in bucket.indices]):
                ready.append(tf.timestamp())
        with tf.control_dependencies(grads + ready):
            backward = tf.timestamp()
        optimizer.apply_gradients(zip(grads, variables))
        return tf.stack([forward - start] + [t - start for t in ready] + [backward - start])

    fixed = [tf.random.normal(v.shape, seed=1) * 1e-3 for v in variables]

    @tf.function
    def update():
        optimizer.apply_gradients(zip(fixed, variables))
        return tf.constant(0)

    def timed(fn):
        out = []
        for _ in range(warmup + steps):
            start = time.perf_counter()
            fn().numpy()
            out.append(time.perf_counter() - start)
        return statistics.median(out[warmup:])

    clocks, walls = [], []
    for _ in range(warmup + steps):
        start = time.perf_counter()
        clocks.append(clocked().numpy())
        walls.append(time.perf_counter() - start)
    clocks = clocks[warmup:]
    column = [statistics.median(c[k] for c in clocks) for k in range(len(clocks[0]))]
    return {"forward": column[0], "buckets": column[1:-1], "backward": column[-1],
            "step": statistics.median(walls[warmup:]), "update": timed(update)}


def report(result: Dict[str, object], buckets) -> List[str]:
    """The table and the bound, as printed."""
    step = result["step"]
    ms = (lambda s: f"{s * 1e3:8.1f} ms  {s / step:5.2f} of the step")
    lines = [f"{'forward pass ends':<40}{ms(result['forward'])}"]
    for k, (bucket, t) in enumerate(zip(buckets, result["buckets"])):
        what = f"bucket {k} ({bucket.nbytes / 2**20:.1f} MiB, {len(bucket.indices)} tensors)"
        lines.append(f"{what + ' ready':<40}{ms(t)}")
    lines += [f"{'backward pass ends':<40}{ms(result['backward'])}",
              f"{'the step (with its update)':<40}{ms(step)}",
              f"{'the update alone':<40}{ms(result['update'])}"]
    first = result["buckets"][0] if result["buckets"] else result["backward"]
    bound = max(0.0, (step - first) / step)
    after_all = max(0.0, (step - first - result["update"]) / step)
    lines.append(f"\nAt most {bound:.2f} of the step's compute can run beside its all-reduce: "
                 f"the first bucket is ready {first * 1e3:.1f} ms into a {step * 1e3:.1f} ms "
                 f"step.\nAt most {after_all:.2f} where the update waits for the whole "
                 f"all-reduce (every bucket's result at once, as from one fused column): it then "
                 f"runs after it, before the next forward pass.")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        os.environ["TF_NUM_INTRAOP_THREADS"] = str(args.threads)
    import numpy as np
    import tensorflow as tf

    from tftorus.torus import fusion
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.keras.utils.set_random_seed(0)
    shape = (args.image_size, args.image_size, 3)
    model = tf.keras.applications.ResNet50(weights=None, input_shape=shape, classes=10,
                                           classifier_activation=None)
    optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    images = tf.random.uniform((args.batch,) + shape)
    labels = tf.constant(np.arange(args.batch) % 10)
    threshold = (fusion.DEFAULT_THRESHOLD_BYTES if args.fusion_mb is None
                 else int(args.fusion_mb * (1 << 20)))
    wire = tf.float16 if args.wire == "fp16" else tf.float32
    buckets = bucket_plan(model.trainable_variables, wire, threshold)
    print(f"ResNet-50, {args.batch} images of {args.image_size} px, {args.wire} wire, buckets of "
          f"{threshold / 2**20:g} MiB, intra-op threads {args.threads or 'default'}", flush=True)
    result = readiness(model, optimizer, loss_fn, images, labels, buckets, args.steps,
                       args.warmup)
    print("\n".join(report(result, buckets)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
