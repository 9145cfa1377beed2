"""Training-step throughput of our ResNet against Keras' ResNet50, side by side, on either stack,
and where the step time goes.

    .venv/bin/python -m studies.benchmark_model                 # ImageNet shapes, batch 16
    .venv/bin/python -m studies.benchmark_model --image-size 64 --batch-size 32 --classes 100
    .venv/bin/python -m studies.benchmark_model --main-job --breakdown          # classic stack
    .venv-current/bin/python -m studies.benchmark_model --main-job --breakdown  # current stack

The first lines name the stack (Python, TensorFlow and Keras versions) and the machine's load, so
the two stacks' runs, one after the other, read side by side.

Every model is built at the same input size, classes and precision policy, with the same
training step (SGD with momentum, cross-entropy on FP32 logits, loss scaling under
mixed_float16 through the recipe's keras_generation), compiled as a tf.function on synthetic
data. After warm-up, each repeat times every (policy, model) pair once, in an order rotated by
one per repeat, so machine noise hits all of them alike. The table gives medians over repeats,
and the ratio to the reference model at the same policy as the median over repeats of the
reference's time / the model's time in that repeat: pairing measurements taken moments apart
cancels the slow load changes of a shared machine (target: ours / keras >= 0.98).

Without a GPU, TensorFlow emulates FP16 convolutions: a mixed_float16 step is over 100x slower
than an FP32 one (about 2 minutes for batch 32 at 64 px on 2 cores). So on a CPU-only machine the
mixed_float16 models run, by default, at a smaller batch and image size (--mixed-batch-size,
--mixed-image-size); within a policy every model still gets the same inputs.

  ours           official_resnet.model.network.resnet (ResNet-50 unless --depth): v1.5, no
                 conv biases, the recipe's BatchNormalization (fused in training on both Keras
                 generations)
  ours-v1        the same with the stride on the first 1x1 conv, Keras' (v1) layout: the
                 difference to `ours` is the cost of v1.5's extra compute, the difference to
                 `keras` that of the implementation
  ours-keras-bn  `ours` with Keras' own BatchNormalization layer: on Keras 3 the unfused one (the
                 recipe's model before official_resnet/model/fused_batch_norm.py), on Keras 2
                 the same fused layer as `ours`
  keras          tf.keras.applications.ResNet50(weights=None, classifier_activation=None)

--main-job times one worker's step of the main job (`bash run_scripts/demo.sh`): the model and
image size of run_scripts/embedded.flags (a ResNet-14 of width 16 at 32 px, FP32), the
embedded data's classes, and Exp. 2's total batch divided by --batch_divisor over demo.sh's 4
workers (54 images); models `ours` and `ours-keras-bn`, the reference `ours-keras-bn`.

--breakdown also times the forward pass (training mode) and forward + backward (gradients, no
update) in the same rotation, then runs --profile-steps steps of each model under TensorFlow's
profiler and adds up its ops' time by the layer they belong to (conv, batch norm, ReLU, ...) and
direction (forward, or backward: under `gradient_tape/`). Op times are summed over TensorFlow's
threads, so they can add up to more than the wall-clock step, and the profiler slows a step a
little; compare shares and models.

Absolute images/s depend on the machine, printed above the table; compare ratios.
"""
import argparse
import collections
import glob
import importlib.metadata
import os
import platform
import re
import shutil
import statistics
import tempfile
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")  # one tf.function per model trips the retracing warning

from official_resnet.data.embedded_data import EmbeddedSpec  # noqa: E402
from official_resnet.model.keras_generation import KERAS  # noqa: E402
from official_resnet.model.network import resnet  # noqa: E402
from official_resnet.plan.experiments import EXPERIMENTS  # noqa: E402
from tftorus.runtime import stack  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN_JOB_FLAGS = os.path.join(REPO, "run_scripts", "embedded.flags")
MAIN_JOB_EXPERIMENT = "2"  # demo.sh's --exp=2
MAIN_JOB_WORKERS = 4  # demo.sh's -np 4


def _ours(**overrides):
    def build(*, input_shape, classes, args):
        kwargs = dict(depth=args.depth, width=args.width, small_inputs=args.small_inputs,
                      num_classes=classes, input_shape=input_shape)
        return resnet(**{**kwargs, **overrides})
    return build


def _keras(*, input_shape, classes, args):
    if args.depth != 50 or args.width != 64 or args.small_inputs:
        raise SystemExit("the keras model is ResNet-50 at width 64 with the ImageNet stem only: "
                         "leave it out of --models with --depth, --width or --small-inputs")
    return tf.keras.applications.ResNet50(weights=None, input_shape=input_shape, classes=classes,
                                          classifier_activation=None)


BUILDERS: Dict[str, Callable[..., tf.keras.Model]] = {
    "ours": _ours(),
    "ours-v1": _ours(stride_on_3x3=False),
    "ours-keras-bn": _ours(batch_norm=tf.keras.layers.BatchNormalization),
    "keras": _keras,
}
PHASES = ("forward", "fwd+bwd", "step")  # what --breakdown times; "step" alone otherwise


# ==================================================================================================
# Flags
# ==================================================================================================

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--main-job", action="store_true",
                   help="one worker's step of the main job (see above); sets the shapes, model, "
                        "policy and models unless given")
    p.add_argument("--image-size", type=int, default=None, help="square input side, px (224)")
    p.add_argument("--batch-size", type=int, default=None, help="images per training step (16)")
    p.add_argument("--classes", type=int, default=None, help="outputs of the classifier (1000)")
    p.add_argument("--depth", type=int, default=None, help="our ResNet's depth (50)")
    p.add_argument("--width", type=int, default=None, help="our ResNet's width (64)")
    p.add_argument("--small-inputs", action="store_true", default=None,
                   help="our ResNet's 3x3 stride-1 stem without max-pool")
    p.add_argument("--mixed-batch-size", type=int, default=None,
                   help="batch under mixed_float16; default --batch-size on GPU, 2 on CPU")
    p.add_argument("--mixed-image-size", type=int, default=None,
                   help="image side under mixed_float16; default --image-size on GPU, 32 on CPU")
    p.add_argument("--policies", nargs="+", default=None,
                   help="Keras precision policies to build every model under "
                        "(float32 mixed_float16)")
    p.add_argument("--models", nargs="+", default=None, choices=list(BUILDERS),
                   help="models to time (ours ours-v1 keras)")
    p.add_argument("--reference", default=None, choices=list(BUILDERS),
                   help="the model the ratios divide by (keras; ours-keras-bn with --main-job)")
    p.add_argument("--breakdown", action="store_true",
                   help="also time forward and forward+backward, and profile op time by layer")
    p.add_argument("--profile-steps", type=int, default=5, help="steps profiled per model")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model (tracing)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per model per repeat")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds over all models")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and synthetic data")
    args = p.parse_args(argv)
    defaults = main_job_settings() if args.main_job else dict(
        image_size=224, batch_size=16, classes=1000, depth=50, width=64, small_inputs=False,
        policies=["float32", "mixed_float16"], models=["ours", "ours-v1", "keras"],
        reference="keras")
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.reference not in args.models:
        args.reference = None
    return args


def read_flagfile(path: str) -> Dict[str, str]:
    """`--name=value` and `--name` lines of an absl flagfile ('' for a bare flag)."""
    found = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("--"):
                name, _, value = line[2:].partition("=")
                found[name] = value
    return found


def main_job_settings() -> Dict:
    """The main job's model and one worker's batch, from the files demo.sh runs with."""
    flags = read_flagfile(MAIN_JOB_FLAGS)
    divisor = int(flags.get("batch_divisor", 1))
    total = EXPERIMENTS[MAIN_JOB_EXPERIMENT].phases[0].total_batch // divisor
    return dict(image_size=int(flags["image_size"]), batch_size=total // MAIN_JOB_WORKERS,
                classes=EmbeddedSpec().num_classes, depth=int(flags["depth"]),
                width=int(flags["width"]), small_inputs="small_inputs" in flags,
                policies=[flags.get("precision", "float32")],
                models=["ours", "ours-keras-bn"], reference="ours-keras-bn")


# ==================================================================================================
# Training step
# ==================================================================================================

def make_train_step(model: tf.keras.Model, mixed: bool) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """One SGD step, as a tf.function; returns the loss (FP32). Under mixed_float16 the loss
    scaling is the recipe's (keras_generation), which either Keras generation runs."""
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    if mixed:
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
        KERAS.build_optimizer(optimizer, model.trainable_variables)  # not inside tf.cond

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=True), tf.float32)  # keras' are FP16 if mixed
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True))
            scaled = KERAS.scale_loss(optimizer, loss) if mixed else loss
        grads = tape.gradient(scaled, model.trainable_variables)
        if mixed:
            grads = KERAS.unscale(optimizer, grads)
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
            KERAS.apply_or_skip(optimizer, grads, model.trainable_variables, finite,
                                lambda: tf.constant(False))
        else:
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def make_forward(model: tf.keras.Model) -> Callable:
    """The forward pass in training mode (batch statistics), as a tf.function."""
    @tf.function
    def forward(images, labels):
        del labels
        return tf.reduce_sum(tf.cast(model(images, training=True), tf.float32))
    return forward


def make_forward_backward(model: tf.keras.Model) -> Callable:
    """Forward and the gradients of the loss, no update, as a tf.function."""
    @tf.function
    def forward_backward(images, labels):
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=True), tf.float32)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True))
        return loss, tape.gradient(loss, model.trainable_variables)
    return forward_backward


class Variant(NamedTuple):
    policy: str
    name: str
    functions: Dict[str, Callable]  # phase -> tf.function of (images, labels)
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
                model = BUILDERS[name](input_shape=(side, side, 3), classes=args.classes,
                                       args=args)
                params = sum(v.shape.num_elements() for v in model.trainable_variables)
                functions = {"step": make_train_step(model, mixed=policy != "float32")}
                if args.breakdown:
                    functions.update(forward=make_forward(model),
                                     **{"fwd+bwd": make_forward_backward(model)})
                functions = {phase: functions[phase] for phase in PHASES if phase in functions}
                built.append(Variant(policy, name, functions, params, images, labels))
        finally:
            tf.keras.mixed_precision.set_global_policy("float32")
    return built


# ==================================================================================================
# Timing
# ==================================================================================================

Key = Tuple[str, str, str]  # policy, model, phase


def run(args) -> Tuple[List[Variant], Dict[Key, List[float]], Dict[Key, List[float]]]:
    """The variants, and their wall-clock and CPU seconds per call (one entry per repeat) by
    (policy, model, phase)."""
    tf.keras.utils.set_random_seed(args.seed)
    built = build_all(args)
    timed = [(v, phase) for v in built for phase in v.functions]
    for v, phase in timed:
        for _ in range(args.warmup):
            tf.nest.map_structure(lambda t: t.numpy(), v.functions[phase](v.images, v.labels))

    times: Dict[Key, List[float]] = {(v.policy, v.name, phase): [] for v, phase in timed}
    cpu_times: Dict[Key, List[float]] = {key: [] for key in times}
    for repeat in range(args.repeats):
        shift = repeat % len(timed)
        for v, phase in timed[shift:] + timed[:shift]:
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                out = v.functions[phase](v.images, v.labels)
            out = tf.nest.flatten(out)[0].numpy()  # a tf.function's outputs are all ready here
            times[(v.policy, v.name, phase)].append((time.perf_counter() - start) / args.steps)
            cpu_times[(v.policy, v.name, phase)].append(
                (time.process_time() - cpu_start) / args.steps)
            if phase == "step" and not np.isfinite(out):
                raise FloatingPointError(f"{v.name} under {v.policy}: loss {out}")
    return built, times, cpu_times


# ==================================================================================================
# Where the time goes: op time by layer kind, from TensorFlow's profiler
# ==================================================================================================

# A layer's kind by its name (official_resnet.model.network and Keras' ResNet50 share the names); an
# op's node name holds its layer's name scope, which Keras 3 suffixes with _1, _2, ...
KINDS = (("conv", re.compile(r"_conv$")), ("batch norm", re.compile(r"_bn$")),
         ("relu", re.compile(r"(_relu|_out)$")), ("add", re.compile(r"_add$")),
         ("pad, pool", re.compile(r"(_pad|_pool)$")),
         ("classifier", re.compile(r"^(avg_pool|predictions)$")))
# Outside the layers' scopes: the gradient tape sums the gradients of a tensor used by several
# ops in top-level AddN ops (a block's input feeds its shortcut and its first conv; in Keras 3's
# unfused BN the input feeds the moments and the normalisation); the optimizer's update.
GRADIENT_SUMS, OPTIMIZER, OTHER = "gradient sums (AddN)", "optimizer", "loss, other"
CALLS = {"PartitionedCall", "StatefulPartitionedCall"}  # contain other ops' events


def kind_of(node: str) -> Tuple[str, str]:
    """(layer kind, 'forward' or 'backward') of an op's node name."""
    if re.fullmatch(r"AddN(_\d+)?", node):
        return GRADIENT_SUMS, "backward"
    direction = "backward" if node.startswith("gradient_tape/") else "forward"
    for segment in node.split("/"):
        segment = re.sub(r"_\d+$", "", segment)
        for kind, pattern in KINDS:
            if pattern.search(segment):
                return kind, direction
    if re.match(r"(sgd|SGD)(_\d+)?/", node):
        return OPTIMIZER, "forward"  # neither pass: counted in the "forward" column
    return OTHER, direction


def op_time_by_kind(xplane_path: str) -> Dict[Tuple[str, str], float]:
    """Seconds of op execution by (kind, direction) in one profile (the host plane's events
    named 'node:OpType')."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # both stacks' TensorFlow ship it
    space = xplane_pb2.XSpace()
    with open(xplane_path, "rb") as f:
        space.ParseFromString(f.read())
    totals: Dict[Tuple[str, str], float] = collections.defaultdict(float)
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        for line in plane.lines:
            for event in line.events:
                meta = plane.event_metadata[event.metadata_id]
                node, sep, op_type = meta.name.rpartition(":")
                if not sep or not node or op_type in CALLS or op_type != meta.display_name:
                    continue
                totals[kind_of(node)] += event.duration_ps * 1e-12
    return totals


def profile(v: Variant, steps: int) -> Tuple[Dict[Tuple[str, str], float], float]:
    """Op seconds per step by (kind, direction), and wall seconds per step, of `steps` training
    steps under the profiler."""
    logdir = tempfile.mkdtemp(prefix="benchmark_model_profile_")
    try:
        step = v.functions["step"]
        tf.profiler.experimental.start(logdir)
        start = time.perf_counter()
        for _ in range(steps):
            loss = step(v.images, v.labels)
        loss.numpy()
        wall = (time.perf_counter() - start) / steps
        tf.profiler.experimental.stop()
        paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))
        if not paths:
            raise RuntimeError(f"TensorFlow's profiler wrote no *.xplane.pb under {logdir}")
        totals = op_time_by_kind(paths[-1])
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    return {key: seconds / steps for key, seconds in totals.items()}, wall


def print_breakdown(built: List[Variant], steps: int) -> None:
    profiles = [(v, *profile(v, steps)) for v in built]
    kinds = [kind for kind, _ in KINDS] + [GRADIENT_SUMS, OPTIMIZER, OTHER]
    print(f"\nop time per training step by layer kind, ms, forward + backward (TensorFlow's "
          f"profiler, {steps} steps per model; summed over threads; the optimizer's in the "
          f"first column)")
    width = 26
    several = len({v.policy for v in built}) > 1
    print(f"{'':<24}" + "".join(f"{v.name + (' ' + v.policy if several else ''):>{width}}"
                                for v in built))
    for kind in kinds + ["all ops", "wall clock per step"]:
        cells = []
        for v, ops, wall in profiles:
            if kind == "wall clock per step":
                cells.append(f"{1e3 * wall:.1f}")
                continue
            chosen = kinds if kind == "all ops" else [kind]
            fwd = sum(ops.get((k, "forward"), 0.0) for k in chosen)
            bwd = sum(ops.get((k, "backward"), 0.0) for k in chosen)
            cells.append(f"{1e3 * fwd:.1f} + {1e3 * bwd:.1f} = {1e3 * (fwd + bwd):.1f}")
        print(f"{kind:<24}" + "".join(f"{c:>{width}}" for c in cells))


# ==================================================================================================
# Report
# ==================================================================================================

def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {len(os.sched_getaffinity(0))} cores usable, "
            f"devices: {', '.join(d.device_type for d in tf.config.list_physical_devices())}")


def stack_line() -> str:
    horovod = "Horovod" if stack.HOROVOD else "no Horovod"
    try:  # the installed Keras package (TF 2.15's tf.keras reports no version of its own)
        keras_version = importlib.metadata.version("keras")
    except importlib.metadata.PackageNotFoundError:
        keras_version = stack.KERAS_VERSION
    return (f"{stack.NAME} stack: Python {platform.python_version()}, TensorFlow "
            f"{tf.__version__}, Keras {keras_version}, {horovod}")


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1, 5, 15 min)"


def main(argv=None):
    args = parse_args(argv)
    print(f"stack: {stack_line()}")
    print(f"machine: {machine()}")
    model = (f"ResNet-{args.depth} width {args.width}"
             + (", small-input stem" if args.small_inputs else ""))
    print(f"{'the main job, one worker: ' if args.main_job else ''}{model}, {args.classes} "
          f"classes; {args.warmup} warm-up + {args.repeats} repeats x {args.steps} timed calls "
          f"per model; spread = (max - min) / median over repeats")
    print(f"before: {load()}")
    built, times, cpu_times = run(args)
    print(f"after:  {load()}")
    reference = args.reference
    print("\nms: wall clock per call; CPU ms: this process' CPU time per call (all its threads: on a "
          "shared machine it moves less with the load than wall clock does)")
    print(f"\n{'policy':<14}{'input':>11}  {'model':<15}{'phase':<9}{'params':>12}{'ms':>9}"
          f"{'images/s':>10}{'vs ' + (reference or '-'):>18}{'spread':>8}{'CPU ms':>9}")
    for v in built:
        for phase in v.functions:
            t = times[(v.policy, v.name, phase)]
            ref = times.get((v.policy, reference, phase))
            median = statistics.median(t)
            ratio = statistics.median(r / m for r, m in zip(ref, t)) if ref else float("nan")
            batch, side = v.images.shape[0], v.images.shape[1]
            print(f"{v.policy:<14}{f'{batch}x{side}px':>11}  {v.name:<15}{phase:<9}"
                  f"{v.params:>12,}{1e3 * median:>9.1f}{batch / median:>10.1f}{ratio:>18.3f}"
                  f"{(max(t) - min(t)) / median:>8.0%}"
                  f"{1e3 * statistics.median(cpu_times[(v.policy, v.name, phase)]):>9.1f}")
    if args.breakdown:
        print_breakdown(built, args.profile_steps)
        print(f"after profiling: {load()}")


if __name__ == "__main__":
    main()
