"""ResNet v1.5 (bottleneck) as a Keras functional model, with Keras' stable layer names.

`resnet(depth=50)` is ResNet-50 in the v1.5 layout: the stride-2 of a stage's first block sits
on the 3x3 conv, not on the first 1x1 as in v1 (Keras' `applications.ResNet50`). The paper cites
ResNet-50 [7], the v1 paper; v1.5 is our choice, the layout of the large-batch ResNet-50
references (MLPerf, TensorFlow's and NVIDIA's official models): about 6% more compute than v1
for about 0.5% more top-1. `stride_on_3x3=False` builds v1.

Layer names follow Keras' `resnet.py` exactly (`conv1_conv`, `conv2_block1_1_conv`,
`conv2_block1_1_bn`, `conv2_block1_0_conv` for a projection shortcut, ..., `predictions`), so
- a regex on variable names (`_bn|bias`) excludes BN parameters and biases from LARS and weight
  decay;
- checkpoints restore by name, and the conv kernels have the shapes of Keras' ResNet50 under the
  same names.

Choices, each a reading of the paper (see docs and /work/shared/reference/paper-notes.md):
- Convolutions have no bias (the BN that follows has its own shift), so ResNet-50 with 1000
  classes has 25,557,032 trainable parameters, the usual published count. Keras' ResNet50 has
  26,560 more: its conv biases.
- He (MSRA) initialisation of every conv kernel: untruncated normal, std sqrt(2 / fan_out), with
  fan_out = kernel_h * kernel_w * filters (He et al. 2015; as torchvision and the LARS reference
  models do). The classifier starts from N(0, 0.01) weights and zero bias (Goyal et al. 2017).
- `zero_init_residual`: the last BN's gamma of every residual block starts at zero, so each block
  starts as the identity (its shortcut) and the network as a shallow one. That keeps early
  activations and gradients small at the very large learning rates of large-batch training.
- BN: epsilon 1e-5, momentum 0.9. The momentum barely matters: the statistics used for
  evaluation are recomputed exactly from training batches (`bn_statistics.py`). Training
  normalises with TensorFlow's fused kernel on both Keras generations (Keras 3's own layer is
  not fused; `fused_batch_norm.py` is Keras 3's layer with the fused kernel).
- No weight decay in the model: it lives in the optimizer (LARS applies it inside the trust
  ratio, with the name-based exclusions above), so it is never applied twice or in FP16.
- Mixed precision: under `tf.keras.mixed_precision.set_global_policy('mixed_float16')` every
  layer computes in FP16 with FP32 variables, except global pooling and the classifier, which run
  in FP32. The model returns FP32 logits, no softmax: use losses with `from_logits=True`.
"""
from typing import Dict, Optional, Sequence, Tuple

import tensorflow as tf

from official_resnet.model.keras_generation import KERAS

layers = tf.keras.layers

# Bottleneck blocks per stage (conv2..conv5). 14 and 26 are small variants for tests and demos.
BLOCKS: Dict[int, Tuple[int, int, int, int]] = {
    14: (1, 1, 1, 1),
    26: (2, 2, 2, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
}
EXPANSION = 4  # a bottleneck's output has 4x the filters of its 3x3 conv
BN_EPSILON = 1e-5
BN_MOMENTUM = 0.9
STANDARD_WIDTH = 64  # filters of the stem and of conv2's 3x3 in the published model


def conv_initializer() -> tf.keras.initializers.Initializer:
    """He (MSRA) init: untruncated normal with std sqrt(2 / fan_out)."""
    return tf.keras.initializers.VarianceScaling(
        scale=2.0, mode="fan_out", distribution="untruncated_normal")


def _conv(x, *, filters: int, kernel_size: int, strides: int, name: str):
    """Conv without bias; a strided conv pads explicitly and symmetrically, like the reference
    models (TF's 'same' would pad only bottom/right for even inputs)."""
    if strides > 1 and kernel_size > 1:
        x = layers.ZeroPadding2D(padding=(kernel_size - 1) // 2, name=name + "_pad")(x)
        padding = "valid"
    else:
        padding = "same"
    return layers.Conv2D(filters=filters, kernel_size=kernel_size, strides=strides,
                         padding=padding, use_bias=False,
                         kernel_initializer=conv_initializer(), name=name + "_conv")(x)


def _bn(x, *, name: str, batch_norm: type, zero_gamma: bool = False):
    return batch_norm(
        axis=-1, momentum=BN_MOMENTUM, epsilon=BN_EPSILON,
        gamma_initializer="zeros" if zero_gamma else "ones", name=name + "_bn")(x)


def _bottleneck(x, *, filters: int, strides: int, stride_on_3x3: bool,
                zero_init_residual: bool, batch_norm: type, name: str):
    """1x1 -> 3x3 -> 1x1 (4x filters), added to the shortcut, then ReLU."""
    out_filters = EXPANSION * filters
    if strides != 1 or x.shape[-1] != out_filters:
        shortcut = _conv(x, filters=out_filters, kernel_size=1, strides=strides, name=name + "_0")
        shortcut = _bn(shortcut, name=name + "_0", batch_norm=batch_norm)
    else:
        shortcut = x
    stride_1x1, stride_3x3 = (1, strides) if stride_on_3x3 else (strides, 1)

    y = _conv(x, filters=filters, kernel_size=1, strides=stride_1x1, name=name + "_1")
    y = _bn(y, name=name + "_1", batch_norm=batch_norm)
    y = layers.Activation("relu", name=name + "_1_relu")(y)
    y = _conv(y, filters=filters, kernel_size=3, strides=stride_3x3, name=name + "_2")
    y = _bn(y, name=name + "_2", batch_norm=batch_norm)
    y = layers.Activation("relu", name=name + "_2_relu")(y)
    y = _conv(y, filters=out_filters, kernel_size=1, strides=1, name=name + "_3")
    y = _bn(y, name=name + "_3", batch_norm=batch_norm, zero_gamma=zero_init_residual)

    y = layers.Add(name=name + "_add")([shortcut, y])
    return layers.Activation("relu", name=name + "_out")(y)


def resnet(*, depth: int = 50, num_classes: int = 1000, width: int = STANDARD_WIDTH,
           input_shape: Sequence[Optional[int]] = (224, 224, 3), small_inputs: bool = False,
           zero_init_residual: bool = True, stride_on_3x3: bool = True,
           batch_norm: Optional[type] = None, name: Optional[str] = None) -> tf.keras.Model:
    """Builds a bottleneck ResNet returning FP32 logits of shape (batch, num_classes).

    Args:
      depth: a key of `BLOCKS` (50 for the paper's ResNet-50).
      num_classes: outputs of the final Dense layer `predictions`.
      width: filters of the stem and of conv2's 3x3 conv; every filter count scales with it
        (64 = the published model; 8 or 16 give tiny models that train fast on CPU).
      input_shape: (height, width, channels), channels last; height and width may be None.
      small_inputs: a 3x3 stride-1 stem without max-pool, for 32-64 px images (CIFAR-style),
        in place of the 7x7 stride-2 conv and 3x3 stride-2 max-pool for ImageNet.
      zero_init_residual: start the last BN gamma of every residual block at zero.
      stride_on_3x3: True is v1.5 (our default); False puts a stage's stride-2 on the
        first 1x1 conv, the v1 layout of Keras' ResNet50 (for side-by-side benchmarks).
      batch_norm: the BatchNormalization layer class; default the recipe's,
        `keras_generation.KERAS.batch_normalization()`: Keras 2's own layer, or on Keras 3 a
        subclass that trains with TensorFlow's fused kernel (Keras 3's own layer is unfused and
        3x slower per BN on CPU). `tf.keras.layers.BatchNormalization` builds the model
        with Keras' own layer (studies/benchmark_model.py compares the two).
      name: model name; default `resnet{depth}`.
    """
    if depth not in BLOCKS:
        raise ValueError(f"depth={depth} is not one of {sorted(BLOCKS)}; add its block counts to "
                         "official_resnet.model.network.BLOCKS")
    if width < 1 or num_classes < 1:
        raise ValueError(f"width ({width}) and num_classes ({num_classes}) must be positive")
    if len(input_shape) != 3:
        raise ValueError(f"input_shape must be (height, width, channels), got {input_shape}")

    batch_norm = batch_norm or KERAS.batch_normalization()
    inputs = layers.Input(shape=tuple(input_shape), name="images")
    if small_inputs:
        x = _conv(inputs, filters=width, kernel_size=3, strides=1, name="conv1")
        x = _bn(x, name="conv1", batch_norm=batch_norm)
        x = layers.Activation("relu", name="conv1_relu")(x)
    else:
        x = _conv(inputs, filters=width, kernel_size=7, strides=2, name="conv1")
        x = _bn(x, name="conv1", batch_norm=batch_norm)
        x = layers.Activation("relu", name="conv1_relu")(x)
        x = layers.ZeroPadding2D(padding=1, name="pool1_pad")(x)
        x = layers.MaxPooling2D(pool_size=3, strides=2, name="pool1_pool")(x)

    for stage, num_blocks in enumerate(BLOCKS[depth]):
        for block in range(num_blocks):
            # conv2 keeps the resolution (the stem already reduced it); conv3..conv5 halve it.
            strides = 2 if stage > 0 and block == 0 else 1
            x = _bottleneck(x, filters=width * 2 ** stage, strides=strides,
                            stride_on_3x3=stride_on_3x3, zero_init_residual=zero_init_residual,
                            batch_norm=batch_norm, name=f"conv{stage + 2}_block{block + 1}")

    # FP32 from here on: averaging and the logits stay accurate under mixed_float16.
    x = layers.GlobalAveragePooling2D(name="avg_pool", dtype="float32")(x)
    outputs = layers.Dense(num_classes, kernel_initializer=tf.keras.initializers.RandomNormal(
        stddev=0.01), bias_initializer="zeros", dtype="float32", name="predictions")(x)
    return tf.keras.Model(inputs, outputs, name=name or f"resnet{depth}")
