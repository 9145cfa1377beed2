"""Training-step throughput of our ResNet-50 against Keras' ResNet50, side by side.

    .venv/bin/python -m studies.benchmark_model                 # ImageNet shapes, batch 16
    .venv/bin/python -m studies.benchmark_model --image-size 64 --batch-size 32 --classes 100

Every model is built at the same input size, classes and precision policy, with the same
training step (SGD with momentum, cross-entropy on FP32 logits, loss scaling under
mixed_float16), compiled as a tf.function on synthetic data. After warm-up, each repeat times
every (policy, model) pair once, in an order rotated by one per repeat, so machine noise hits
all of them alike. The table gives medians over repeats, and the ratio to Keras at the same
policy as the median over repeats of keras' time / the model's time in that repeat: pairing
measurements taken moments apart cancels the slow load changes of a shared machine (target:
ours / keras >= 0.98).

Without a GPU, TensorFlow emulates FP16 convolutions: a mixed_float16 step is over 100x slower
than an FP32 one (about 2 minutes for batch 32 at 64 px on 2 cores). So on a CPU-only machine the
mixed_float16 models run, by default, at a smaller batch and image size (--mixed-batch-size,
--mixed-image-size); within a policy every model still gets the same inputs.

  ours     official_resnet.model.resnet(depth=50): v1.5, no conv biases
  ours-v1  the same with the stride on the first 1x1 conv, Keras' (v1) layout: the difference
           to `ours` is the cost of v1.5's extra compute, the difference to `keras` that of the
           implementation
  keras    tf.keras.applications.ResNet50(weights=None, classifier_activation=None)

Absolute images/s depend on the machine, printed above the table; compare ratios.
"""
import argparse
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")  # one tf.function per model trips the retracing warning

from official_resnet.model import resnet  # noqa: E402

REFERENCE = "keras"
BUILDERS: Dict[str, Callable[..., tf.keras.Model]] = {
    "ours": lambda *, input_shape, classes: resnet(
        depth=50, num_classes=classes, input_shape=input_shape),
    "ours-v1": lambda *, input_shape, classes: resnet(
        depth=50, num_classes=classes, input_shape=input_shape, stride_on_3x3=False),
    "keras": lambda *, input_shape, classes: tf.keras.applications.ResNet50(
        weights=None, input_shape=input_shape, classes=classes, classifier_activation=None),
}


# ==================================================================================================
# Flags
# ==================================================================================================

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--image-size", type=int, default=224, help="square input side, px")
    p.add_argument("--batch-size", type=int, default=16, help="images per training step")
    p.add_argument("--classes", type=int, default=1000, help="outputs of the classifier")
    p.add_argument("--mixed-batch-size", type=int, default=None,
                   help="batch under mixed_float16; default --batch-size on GPU, 2 on CPU")
    p.add_argument("--mixed-image-size", type=int, default=None,
                   help="image side under mixed_float16; default --image-size on GPU, 32 on CPU")
    p.add_argument("--policies", nargs="+", default=["float32", "mixed_float16"],
                   help="Keras precision policies to build every model under")
    p.add_argument("--models", nargs="+", default=list(BUILDERS), choices=list(BUILDERS),
                   help="models to time; keras is the reference of the ratios")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model (tracing)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per model per repeat")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds over all models")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and synthetic data")
    return p.parse_args(argv)


# ==================================================================================================
# Training step
# ==================================================================================================

def make_train_step(model: tf.keras.Model, mixed: bool) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """One SGD step, as a tf.function; returns the loss (FP32)."""
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    if mixed:
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=True), tf.float32)  # keras' are FP16 if mixed
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True))
            scaled = optimizer.get_scaled_loss(loss) if mixed else loss
        grads = tape.gradient(scaled, model.trainable_variables)
        if mixed:
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


class Variant(NamedTuple):
    policy: str
    name: str
    step: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
    params: int  # trainable
    images: tf.Tensor
    labels: tf.Tensor


def input_size(args, policy: str) -> Tuple[int, int]:
    """(batch, image side) of a policy; the CPU defaults of mixed_float16 are explained above."""
    if policy == "float32":
        return args.batch_size, args.image_size
    gpu = bool(tf.config.list_physical_devices("GPU"))
    batch = args.mixed_batch_size or (args.batch_size if gpu else 2)
    side = args.mixed_image_size or (args.image_size if gpu else 32)
    return batch, side


def build_all(args) -> List[Variant]:
    """Every (policy, model), built under its policy, with that policy's synthetic batch."""
    built = []
    for policy in args.policies:
        batch, side = input_size(args, policy)
        images = tf.random.normal([batch, side, side, 3])
        labels = tf.random.uniform([batch], maxval=args.classes, dtype=tf.int32)
        tf.keras.mixed_precision.set_global_policy(policy)
        try:
            for name in args.models:
                model = BUILDERS[name](input_shape=(side, side, 3), classes=args.classes)
                params = sum(v.shape.num_elements() for v in model.trainable_variables)
                step = make_train_step(model, mixed=policy != "float32")
                built.append(Variant(policy, name, step, params, images, labels))
        finally:
            tf.keras.mixed_precision.set_global_policy("float32")
    return built


# ==================================================================================================
# Timing
# ==================================================================================================

def run(args) -> Tuple[List[Variant], Dict[Tuple[str, str], List[float]]]:
    """The variants, and their seconds per step (one entry per repeat) by (policy, model)."""
    tf.keras.utils.set_random_seed(args.seed)
    built = build_all(args)
    for v in built:
        for _ in range(args.warmup):
            v.step(v.images, v.labels).numpy()

    times: Dict[Tuple[str, str], List[float]] = {(v.policy, v.name): [] for v in built}
    for repeat in range(args.repeats):
        shift = repeat % len(built)
        for v in built[shift:] + built[:shift]:
            start = time.perf_counter()
            for _ in range(args.steps):
                loss = v.step(v.images, v.labels)
            loss = loss.numpy()  # waits for the last step
            times[(v.policy, v.name)].append((time.perf_counter() - start) / args.steps)
            if not np.isfinite(loss):
                raise FloatingPointError(f"{v.name} under {v.policy}: loss {loss}")
    return built, times


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {len(os.sched_getaffinity(0))} cores usable, TensorFlow {tf.__version__}, "
            f"devices: {', '.join(d.device_type for d in tf.config.list_physical_devices())}")


def main(argv=None):
    args = parse_args(argv)
    print(f"machine: {machine()}")
    print(f"{args.classes} classes, {args.warmup} warm-up + {args.repeats} repeats x "
          f"{args.steps} timed steps per model; spread = (max - min) / median over repeats")
    built, times = run(args)
    print(f"\n{'policy':<14}{'input':>11}  {'model':<9}{'params':>12}{'ms/step':>10}"
          f"{'images/s':>10}{'vs ' + REFERENCE:>10}{'spread':>8}")
    for v in built:
        t, reference = times[(v.policy, v.name)], times.get((v.policy, REFERENCE))
        median = statistics.median(t)
        ratio = statistics.median(r / m for r, m in zip(reference, t)) if reference else float("nan")
        batch, side = v.images.shape[0], v.images.shape[1]
        print(f"{v.policy:<14}{f'{batch}x{side}px':>11}  {v.name:<9}{v.params:>12,}"
              f"{1e3 * median:>10.1f}{batch / median:>10.1f}{ratio:>10.3f}"
              f"{(max(t) - min(t)) / median:>8.0%}")


if __name__ == "__main__":
    main()
