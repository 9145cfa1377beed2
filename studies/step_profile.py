"""When ResNet-50's gradients are ready in the backward pass: a FLOP model (planner.StepProfile).

    .venv/bin/python -m studies.step_profile      # the profile, and the comparison below

A model of the step's shape, not a measurement. Keras' ResNet-50 (tf.keras.applications,
weights=None; 224 x 224 x 3 images, 1,000 classes: the variables of
studies.benchmark_allreduce.resnet50_shapes, in the same optimizer order) is built once, and
each layer's forward FLOPs per image are taken from its output shape and kernel:

  Conv2D              2 kh kw cin cout Hout Wout (the bias is noise)
  Dense               2 in out
  BatchNormalization  BN_FLOPS per output element (statistics, normalise, scale and shift)
  pooling             the pool's window per output element (the global pool: its input)
  anything else       one per output element (ReLU, the residual adds, padding)

A layer's backward pass costs twice its forward (the gradient of its input and of its
weights), except the first layer with weights, whose input needs no gradient (once), and the
layers before it, which need none. The backward pass walks the layers in reverse (Keras' layer
order is a topological order of the graph); a layer's gradients are ready once every layer
after it and the layer itself are done: ready = (their backward FLOPs / all backward FLOPs) x
backward seconds. The last layer's (the classifier) come first; the first convolution's exactly
at the end of the backward pass.

The step's compute (48.2 ms per V100 at 32 images: studies.cost_calibration.StepModel, from
Table 6) is split into forward and backward by `backward_share` (default 2/3: backward = 2 x
forward FLOPs; the FLOP model itself gives 0.663, the first layer skipping its input gradient).

Against the measurement (studies/gradient_readiness.py, docs/studies/emulated_step.md, one process
on this machine's CPU, 32 x 32 images and 10 classes, one intra-op thread; fractions of the
backward pass, (bucket ready - forward end) / (backward end - forward end)), `main` prints:

  FP16 buckets          measured first bucket      FLOP model: 32 px, 10 classes; 224 px
  16 MiB (3; 224 px 4)  0.25 (32 images), 0.36 (4)   0.11; 0.10
  4 MiB (15; 16)        0.10 (32 images)             0.04; 0.01

and the measured backward share of the compute, 0.62-0.64, against 2/3 here (the FLOP
model's own 0.663). The shape agrees in kind: the last layers' large gradients, cheap to
compute, come first (in the model 30 % of the bytes are ready after 10 % of the backward pass,
76 % after a third, 89 % at half). But the model puts the first bucket earlier than the CPU
measured: the classifier and stage 5 hold most of the bytes and few FLOPs per byte, and at one
thread on a CPU their small matrices run below the rate of the large early convolutions; the
measured clocks also carry the tape's and the buckets' bookkeeping. On a V100 (the paper's)
small late layers are also less efficient than the early ones, so this model is an optimistic
bound on how early buckets are ready: more overlap than a GPU may reach.
"""
import functools
import sys
from typing import List, Tuple

from tftorus.planning import planner

#: The paper's compute per step (s): studies.cost_calibration.StepModel's compute_seconds.
COMPUTE_SECONDS = 0.0482
BACKWARD_SHARE = 2.0 / 3.0
#: Forward FLOPs per output element of a batch normalisation in training.
BN_FLOPS = 4


@functools.lru_cache(maxsize=None)
def layer_table(image_size: int = 224, classes: int = 1000) -> Tuple[tuple, ...]:
    """(layer name, forward FLOPs per image, number of trainable variables, their shapes) of
    every layer of Keras' ResNet-50, in layer order (their variables concatenated: the
    optimizer's order, that of studies.benchmark_allreduce.resnet50_shapes)."""
    import tensorflow as tf
    model = tf.keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                           classes=classes)
    table = []
    ordered = []
    for layer in model.layers:
        table.append((layer.name, _forward_flops(layer), len(layer.trainable_weights),
                      tuple(tuple(v.shape.as_list()) for v in layer.trainable_weights)))
        ordered.extend(layer.trainable_weights)
    if len(ordered) != len(model.trainable_variables) or any(
            a is not b for a, b in zip(ordered, model.trainable_variables)):
        raise AssertionError("ResNet-50's layers do not hold its variables in the optimizer's "
                             "order; the profile would be misaligned")
    tf.keras.backend.clear_session()
    return tuple(table)


def _elements(shape) -> int:
    if isinstance(shape, list):  # an input layer: [(None, ...)]
        shape = shape[0]
    n = 1
    for d in shape[1:]:
        n *= int(d)
    return n


def _forward_flops(layer) -> float:
    kind = type(layer).__name__
    out = _elements(layer.output_shape)
    if kind == "Conv2D":
        kh, kw, cin, cout = (int(d) for d in layer.kernel.shape)
        return 2.0 * kh * kw * cin * out  # out = Hout Wout cout
    if kind == "Dense":
        cin, cout = (int(d) for d in layer.kernel.shape)
        return 2.0 * cin * cout
    if kind == "BatchNormalization":
        return float(BN_FLOPS * out)
    if kind in ("MaxPooling2D", "AveragePooling2D"):
        ph, pw = layer.pool_size
        return float(ph * pw * out)
    if kind in ("GlobalAveragePooling2D", "GlobalMaxPooling2D"):
        return float(_elements(layer.input_shape))
    if kind == "InputLayer":
        return 0.0
    return float(out)


def backward_fractions(image_size: int = 224, classes: int = 1000) -> List[float]:
    """Per variable (the optimizer's order), the fraction of the backward pass's FLOPs done
    when its gradient is ready; the first variable's is 1."""
    table = layer_table(image_size, classes)
    first = next(i for i, (_, _, nvars, _) in enumerate(table) if nvars)
    backward = [0.0 if i < first else (1.0 if i == first else 2.0) * flops
                for i, (_, flops, _, _) in enumerate(table)]
    done, per_layer = 0.0, [0.0] * len(table)
    for i in reversed(range(len(table))):
        done += backward[i]
        per_layer[i] = done
    total = done  # == per_layer[first]: the first variable's fraction is exactly 1
    out = []
    for (_, _, nvars, _), d in zip(table, per_layer):
        out.extend([d / total] * nvars)
    return out


def flop_backward_share(image_size: int = 224, classes: int = 1000) -> float:
    """Backward FLOPs over forward + backward FLOPs in this model."""
    table = layer_table(image_size, classes)
    first = next(i for i, (_, _, nvars, _) in enumerate(table) if nvars)
    fwd = sum(row[1] for row in table)
    bwd = sum(0.0 if i < first else (1.0 if i == first else 2.0) * f
              for i, (_, f, _, _) in enumerate(table))
    return bwd / (fwd + bwd)


def variable_shapes() -> List[Tuple[int, ...]]:
    """The shapes of ResNet-50's trainable variables, the optimizer's order (224 px, 1000
    classes)."""
    return [shape for row in layer_table() for shape in row[3]]


def forward_seconds(compute_seconds: float = COMPUTE_SECONDS,
                    backward_share: float = BACKWARD_SHARE) -> float:
    return compute_seconds * (1.0 - backward_share)


@functools.lru_cache(maxsize=None)
def resnet50_profile(compute_seconds: float = COMPUTE_SECONDS,
                     backward_share: float = BACKWARD_SHARE) -> planner.StepProfile:
    """ResNet-50's gradients' ready times (s from the start of the backward pass, the
    optimizer's order) and the backward pass's seconds, of a step of `compute_seconds`
    (forward + backward) of which `backward_share` is the backward pass. The forward pass is
    `forward_seconds(compute_seconds, backward_share)`."""
    if not (compute_seconds > 0 and 0 < backward_share <= 1):
        raise ValueError(f"compute_seconds > 0 and 0 < backward_share <= 1, got "
                         f"{compute_seconds} and {backward_share}")
    backward = compute_seconds * backward_share
    return planner.StepProfile(tuple(f * backward for f in backward_fractions()), backward)


def first_bucket_fraction(threshold_bytes: int, image_size: int = 224, classes: int = 1000,
                          wire_bytes: int = 2) -> Tuple[float, int]:
    """(fraction of the backward pass when tftorus' first bucket is ready, buckets), for
    buckets of `threshold_bytes` cut by tftorus.torus.fusion from this model's gradients."""
    import tensorflow as tf

    from tftorus.torus.fusion import bucket_indices
    model = tf.keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                           classes=classes)
    sizes = [(int(v.shape.num_elements()) * wire_bytes, "w") for v in model.trainable_variables]
    tf.keras.backend.clear_session()
    fractions = backward_fractions(image_size, classes)
    buckets = bucket_indices(sizes, threshold_bytes)
    return min(max(fractions[i] for i in b) for b in buckets), len(buckets)


#: studies/gradient_readiness.py's clocks (docs/studies/emulated_step.md, 2026-11-27), fractions of
#: the step: (images, bucket MiB) -> (forward ends, first bucket ready, backward ends).
MEASURED = {(4, 16): (0.34, 0.56, 0.95), (32, 16): (0.38, 0.53, 0.99), (32, 4): (0.37, 0.43, 0.99)}


def main(argv=None) -> int:
    profile = resnet50_profile()
    ready = profile.ready
    print(f"ResNet-50, {len(ready)} gradients; compute {COMPUTE_SECONDS * 1e3:.1f} ms: forward "
          f"{forward_seconds() * 1e3:.2f} ms, backward {profile.backward_seconds * 1e3:.2f} ms "
          f"(the FLOP model's own backward share {flop_backward_share():.3f})")
    for k in (len(ready) - 1, len(ready) - 3, len(ready) // 2, 3, 0):
        print(f"  variable {k:3d} ready at {ready[k] * 1e3:6.2f} ms "
              f"({ready[k] / profile.backward_seconds:.3f} of the backward pass)")
    print("\nFirst FP16 bucket ready, fraction of the backward pass:")
    print("| buckets | measured (images: value) | FLOP model 32 px, 10 classes | "
          "FLOP model 224 px, 1000 classes |")
    print("|---|---|---|---|")
    for mib in (16, 4):
        measured = "; ".join(f"{img}: {(b - f) / (e - f):.2f}"
                             for (img, m), (f, b, e) in MEASURED.items() if m == mib)
        small, n_small = first_bucket_fraction(mib << 20, 32, 10)
        big, n_big = first_bucket_fraction(mib << 20)
        print(f"| {mib} MiB ({n_small}; {n_big}) | {measured} | {small:.2f} | {big:.2f} |")
    shares = [(e - f) / e for f, _, e in MEASURED.values()]
    print(f"\nMeasured backward share of forward + backward: {min(shares):.2f}-{max(shares):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
