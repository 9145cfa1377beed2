"""A virtual accelerator for the step studies: ResNet-50's gradients on a GPU's schedule, no CPU.

    from studies.virtual_accelerator import VirtualResNet50, PAPER_STEP_SECONDS
    model = VirtualResNet50(rank=hvd.rank(), step_seconds=PAPER_STEP_SECONDS * scale)
    model.compile(optimizer=hvd.DistributedOptimizer(SGD(...)), loss="mse")
    model.fit(x, y, batch_size=...)          # x: any float tensor of shape [batch, 1]

On a GPU cluster the forward and backward passes run on the device while the host's cores and
the network are free; on the emulated cluster (studies/emulated_step.py) the same cores run
the passes and the all-reduce, so overlap cannot show. This model stands in for the device.

`VirtualResNet50` is a Keras model whose trainable variables are ResNet-50's (names, shapes and
order as `ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)`, what the step study
trains): one Keras layer per ResNet-50 layer with variables, chained in that order. Nothing is
computed. Each layer is a tf.custom_gradient: its forward pass waits its forward time and hands
its input on; its backward pass waits its backward time, hands the upstream gradient on, then
makes its variables' gradients. So in a traced step the gradients appear layer by layer in
backward order, at the times a device would make them, and a DistributedOptimizer's buckets
can leave while earlier layers still "compute". The waits are a Python sleep in a
tf.numpy_function: the thread sleeps, the CPU is idle. Each sleeping layer holds one of
TensorFlow's inter-op threads for its wait (measured on TF 2.15: k independent 0.2 s waits
take ceil(k / threads) x 0.2 s), and Python's GIL only to start and end. The layers are a
chain, so a step holds one thread; with a pool of one (TF_NUM_INTEROP_THREADS=1) nothing could
run beside a wait, and the model refuses to be built.

Times: `layer_profile` splits a step (default: the paper's V100 step, Table 6 of
arXiv:1811.05233: 32 images per GPU in 48.2 ms) over the layers by their multiply-add count at
224 x 224 input, a third forward and two thirds backward. A study sets one number, the step's
seconds (the paper's times a scale), to put compute and all-reduce in the ratio it wants, and
may change it between steps (`set_step_seconds`: no retrace).

The waits follow the step's schedule, as a device runs its queue of kernels back to back while
the host launches ahead: the step's first wait (the first layer's forward) starts the clock,
and each wait ends its own time after the previous one's end, not after its own start. The
per-op overhead of the emulation (tens of microseconds per numpy_function) is thereby absorbed
instead of adding up over a step's 214 waits (107 layers, forward and backward); a wait that
starts late (its thread was held, e.g. by the GIL) sleeps less, down to zero, and the late
ends are in `wait_log` when `record=True`.

Gradients are real float32 tensors, one fill per variable: every element of variable i's
gradient is `gradient_value(rank, step, i)`, where step counts the model's forward passes in
training (a variable in the model, read as a tensor, so a traced step is not retraced). The
values are multiples of 2**-15 below 2, so sums over up to 256 ranks and averages over a power
of two of ranks are exact in float32 (an FP16 wire rounds them). They do not scale with the
upstream gradient (no loss scaling: the loss only carries the dependency); so under a
tf.distribute strategy, where Keras divides the loss by the replicas and sums the gradients,
they arrive summed (measured: MultiWorkerMirroredStrategy's update on 2 workers was the sum),
where a DistributedOptimizer averages them.

This is a study's tool: the tftorus package never imports it.
"""
import math
import os
import threading
import time
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

# Keras 2 (tf.keras, the classic stack) or Keras 3 (the current one): the one place that differs.
KERAS_3 = str(getattr(tf.keras, "__version__", "2")).startswith("3.")
if KERAS_3:
    import keras
else:
    keras = tf.keras


def _step_counter(layer) -> object:
    """A non-trainable int64 counter, local to each replica (under a tf.distribute strategy every
    replica counts its own steps; no cross-replica sync when it is incremented)."""
    if KERAS_3:
        return keras.Variable(0, dtype="int64", trainable=False, name="steps",
                              synchronization="on_read", aggregation="only_first_replica")
    return layer.add_weight(name="steps", shape=(), dtype=tf.int64, initializer="zeros",
                            trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


PAPER_STEP_SECONDS = 0.0482  # arXiv:1811.05233 Table 6: one V100's step of 32 images
# A layer's backward pass computes two products of its forward's size (the input's gradient and
# the weights'), so it takes twice the forward's time.
BACKWARD_OVER_FORWARD = 2.0
CLASSES = 10  # the step study's model (studies/emulated_step.py)
PROFILE_IMAGE_SIZE, PROFILE_CLASSES = 224, 1000  # the paper's ImageNet model


class LayerSpec(NamedTuple):
    name: str
    variables: Tuple[Tuple[str, Tuple[int, ...]], ...]  # (short name, shape), in Keras' order
    flops: int  # forward multiply-adds x 2 at the given image size; 0 for BatchNormalization


class LayerTime(NamedTuple):
    name: str
    variables: Tuple[str, ...]  # the variables' full names, 'conv1_conv/kernel'
    forward_s: float
    backward_s: float


def resnet50_layers(classes: int = CLASSES, image_size: int = PROFILE_IMAGE_SIZE
                    ) -> List[LayerSpec]:
    """Keras' ResNet50 (keras.applications, v1: the stride on each stage's first 1x1
    convolution, convolutions with a bias) as its layers with variables, in the order of its
    `trainable_variables`: within a block with a projection shortcut Keras orders by depth, so
    the shortcut's convolution comes after the block's 3x3 one. FLOPs: a convolution's
    2 k k c_in c_out h_out w_out, the classifier's 2 x 2048 x classes; BatchNormalization,
    ReLU, the additions and the pooling are counted as 0 (a few operations per element, under
    1 % of the convolutions' work; their time in the paper's step is spread over the
    convolutions with the rest). tests/test_virtual_accelerator.py checks the list against Keras'
    own model."""
    if image_size < 32:
        raise ValueError(f"ResNet-50 needs images of 32 x 32 or more, got {image_size}")
    layers: List[LayerSpec] = []

    def conv(name, k, c_in, c_out, size):
        layers.append(LayerSpec(f"{name}_conv", (("kernel", (k, k, c_in, c_out)),
                                                 ("bias", (c_out,))),
                                2 * k * k * c_in * c_out * size * size))

    def bn(name, channels):
        layers.append(LayerSpec(f"{name}_bn", (("gamma", (channels,)), ("beta", (channels,))),
                                0))

    size = (image_size + 2 * 3 - 7) // 2 + 1  # conv1: padded by 3, 7x7, stride 2
    conv("conv1", 7, 3, 64, size)
    bn("conv1", 64)
    size = (size + 2 * 1 - 3) // 2 + 1  # pool1: padded by 1, 3x3, stride 2
    channels = 64
    for stage, filters, blocks in ((2, 64, 3), (3, 128, 4), (4, 256, 6), (5, 512, 3)):
        if stage > 2:
            size = (size - 1) // 2 + 1  # the first block's 1x1 convolutions have stride 2
        for block in range(1, blocks + 1):
            name = f"conv{stage}_block{block}"
            conv(f"{name}_1", 1, channels, filters, size)
            bn(f"{name}_1", filters)
            conv(f"{name}_2", 3, filters, filters, size)
            bn(f"{name}_2", filters)
            if block == 1:  # the projection shortcut
                conv(f"{name}_0", 1, channels, 4 * filters, size)
                conv(f"{name}_3", 1, filters, 4 * filters, size)
                bn(f"{name}_0", 4 * filters)
                bn(f"{name}_3", 4 * filters)
            else:
                conv(f"{name}_3", 1, filters, 4 * filters, size)
                bn(f"{name}_3", 4 * filters)
            channels = 4 * filters
    layers.append(LayerSpec("predictions", (("kernel", (channels, classes)),
                                            ("bias", (classes,))), 2 * channels * classes))
    return layers


def layer_profile(total_seconds: float = PAPER_STEP_SECONDS) -> List[LayerTime]:
    """Each layer's forward and backward seconds: `total_seconds` split by the layers' FLOPs on
    the paper's model (224 x 224 images, 1,000 classes), each layer's backward
    BACKWARD_OVER_FORWARD times its forward. Sums to total_seconds."""
    if not (total_seconds >= 0 and math.isfinite(total_seconds)):
        raise ValueError(f"a step's seconds must be a finite number >= 0, got {total_seconds}")
    specs = resnet50_layers(PROFILE_CLASSES, PROFILE_IMAGE_SIZE)
    total_flops = sum(s.flops for s in specs)
    forward_share = total_seconds / (1.0 + BACKWARD_OVER_FORWARD)
    profile = []
    for spec in specs:
        forward = forward_share * spec.flops / total_flops
        profile.append(LayerTime(spec.name, tuple(f"{spec.name}/{v}" for v, _ in spec.variables),
                                 forward, forward * BACKWARD_OVER_FORWARD))
    return profile


def gradient_value(rank: int, step: int, index: int) -> float:
    """Every element of the index-th variable's gradient at this rank and step: a multiple of
    2**-15 in [1/32, 1.03], distinct for neighbouring variables, ranks and steps (each mod 32)."""
    return (index % 32 + 1) / 32 + (rank % 32 + 1) / 1024 + (step % 32) / 32768


def expected_gradients(rank: int, step: int, classes: int = CLASSES) -> List[np.ndarray]:
    """The gradients VirtualResNet50(rank) makes at its step-th training step, as float32."""
    shapes = [shape for spec in resnet50_layers(classes) for _, shape in spec.variables]
    return [np.full(shape, gradient_value(rank, step, i), np.float32)
            for i, shape in enumerate(shapes)]


class WaitRecord(NamedTuple):
    phase: str  # 'forward' or 'backward'
    layer: str
    started: float  # time.perf_counter() seconds
    due: float  # when the step's schedule ends it
    ended: float


class VirtualAccelerator:
    """The device's state, outside Keras' tracking: each layer's seconds and the step's
    schedule. One model, one accelerator; its waits run one at a time (the layers are a
    chain)."""

    def __init__(self, step_seconds: float, record: bool = False):
        self.profile: List[LayerTime] = []
        self.set_step_seconds(step_seconds)
        self._due = 0.0
        self._lock = threading.Lock()
        self.wait_log: Optional[List[WaitRecord]] = [] if record else None

    def set_step_seconds(self, step_seconds: float) -> None:
        self.profile = layer_profile(step_seconds)
        self.step_seconds = float(step_seconds)

    def seconds(self, phase: str, layer: int) -> float:
        times = self.profile[layer]
        return times.forward_s if phase == "forward" else times.backward_s

    def wait(self, phase: str, layer: int) -> None:
        """Sleep until this layer's end on the step's schedule (the first layer's forward
        starts the schedule)."""
        seconds = self.seconds(phase, layer)
        with self._lock:
            started = time.perf_counter()
            if phase == "forward" and layer == 0:
                self._due = started
            self._due += seconds
            due = self._due
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if self.wait_log is not None:
            self.wait_log.append(WaitRecord(phase, self.profile[layer].name, started, due,
                                            time.perf_counter()))


class StepCounter(keras.layers.Layer):
    """Outputs the number of training forward passes before this one (int64 scalar), then
    counts this one."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False  # Keras 3's jit_compile='auto' then stays off
        self.steps = _step_counter(self)

    def call(self, inputs, training=None):
        step = tf.identity(tf.convert_to_tensor(self.steps))
        if training:
            with tf.control_dependencies([step]):
                self.steps.assign_add(1)
        return step


class VirtualLayer(keras.layers.Layer):
    """One ResNet-50 layer's variables, its time on the accelerator, its gradients' values.
    Called on [activation, step]; returns the activation unchanged (after the forward wait)."""

    def __init__(self, spec: LayerSpec, position: int, first_variable: int, rank: int,
                 accelerator: VirtualAccelerator, **kwargs):
        super().__init__(name=spec.name, **kwargs)
        self.supports_jit = False  # numpy_function has no XLA kernel
        self._shapes = [shape for _, shape in spec.variables]
        self._short_names = [name for name, _ in spec.variables]
        self._position, self._first_variable, self._rank = position, first_variable, rank
        self._accelerator = accelerator

    def build(self, input_shape):
        # zeros: the values are never read for compute, and zeros make no random numbers
        self.virtual_variables = [
            self.add_weight(name=name, shape=shape, initializer="zeros", trainable=True)
            for name, shape in zip(self._short_names, self._shapes)]
        super().build(input_shape)

    def _wait(self, phase: str, tensor, step, after=None):
        """(tensor, step), both handed through the layer's wait, which starts once `after` (a
        tensor) exists too. Whatever should follow the wait must use these outputs: grappler
        turns a stateless op whose outputs nobody reads into a NoOp, control edges or not. A
        layer of no time (BatchNormalization) waits too, for 0 s: its gradients then follow the
        layer after it in the backward pass, as they would on a device."""
        accelerator, position = self._accelerator, self._position

        def wait(value, step_value, *_after):
            accelerator.wait(phase, position)
            return value, step_value
        # stateless: tf.function orders stateful ops without a resource input in program order,
        # which would put every collective made after the backward pass behind its last wait
        out, step_out = tf.numpy_function(
            wait, [tensor, step] + ([] if after is None else [after]),
            [tensor.dtype, step.dtype], stateful=False, name=f"{phase}_wait")
        out.set_shape(tensor.shape)
        step_out.set_shape(step.shape)
        return out, step_out

    def _gradient_values(self, step):
        """This layer's variables' gradient values at `step` (float32 scalars, exact)."""
        step_part = tf.cast(tf.math.floormod(step, 32), tf.float32) * (1.0 / 32768)
        return [tf.constant(gradient_value(self._rank, 0, i), tf.float32) + step_part
                for i in range(self._first_variable,
                               self._first_variable + len(self._shapes))]

    def call(self, inputs):
        activation, step = inputs
        weights = [tf.convert_to_tensor(v) for v in self.virtual_variables]

        @tf.custom_gradient
        def on_the_accelerator(x, step_, *values):
            y, _ = self._wait("forward", x, step_)

            def backward(upstream):
                # after the forward pass's end, even where the loss' gradient is a constant
                passed, step_after = self._wait("backward", upstream, step_, after=y)
                grads = [tf.fill(shape, value) for shape, value in
                         zip(self._shapes, self._gradient_values(step_after))]
                return [passed, None] + grads
            return y, backward

        return on_the_accelerator(activation, step, *weights)


def inter_op_threads() -> int:
    """TensorFlow's inter-op pool size: as configured, else TF_NUM_INTEROP_THREADS, else one
    thread per core this process may use (TensorFlow's default)."""
    configured = tf.config.threading.get_inter_op_parallelism_threads()
    if not configured:
        configured = int(os.environ.get("TF_NUM_INTEROP_THREADS") or 0)
    return configured or len(os.sched_getaffinity(0))


class VirtualResNet50(keras.Model):
    """Keras' ResNet-50's trainable variables (zeros), trained in `step_seconds` per step on the
    virtual accelerator, with gradients `expected_gradients(rank, step)`.

    Input: float32 [batch, 1] (the values are passed through to the output; a loss of them,
    'mse' against zeros say, only carries the dependency). `record=True` keeps every wait in
    `model.accelerator.wait_log`."""

    def __init__(self, rank: int, step_seconds: float = PAPER_STEP_SECONDS,
                 classes: int = CLASSES, record: bool = False, name: str = "virtual_resnet50"):
        if int(rank) != rank or rank < 0:
            raise ValueError(f"rank must be an integer >= 0, got {rank!r}")
        if inter_op_threads() < 2:
            raise ValueError(
                "TensorFlow has one inter-op thread here, and each wait of the virtual "
                "accelerator holds one: no collective or other op could run beside the "
                "'compute'. Set TF_NUM_INTEROP_THREADS=2 (or "
                "tf.config.threading.set_inter_op_parallelism_threads(2)) or more")
        accelerator = VirtualAccelerator(step_seconds, record)
        specs = resnet50_layers(classes)
        inputs = keras.Input(shape=(1,), dtype="float32", name="activation")
        step = StepCounter(name="step_counter")(inputs)
        x, first = inputs, 0
        for position, spec in enumerate(specs):
            x = VirtualLayer(spec, position, first, int(rank), accelerator)([x, step])
            first += len(spec.variables)
        super().__init__(inputs=inputs, outputs=x, name=name)
        self.accelerator = accelerator
        self.rank, self.classes = int(rank), classes

    def set_step_seconds(self, step_seconds: float) -> None:
        """The next steps' time (the profile scaled); takes effect without retracing."""
        self.accelerator.set_step_seconds(step_seconds)

    @property
    def steps_taken(self) -> int:
        return int(self.get_layer("step_counter").steps.numpy())

    def expected_gradients(self, step: int) -> List[np.ndarray]:
        return expected_gradients(self.rank, step, self.classes)


def readiness(profile: Sequence[LayerTime]) -> List[float]:
    """Seconds from the step's start at which each layer's gradients exist, per layer in the
    model's order (the last layer's come first): the whole forward pass, then the backward
    pass down to that layer."""
    forward = sum(t.forward_s for t in profile)
    ready, elapsed = [0.0] * len(profile), forward
    for position in reversed(range(len(profile))):
        elapsed += profile[position].backward_s
        ready[position] = elapsed
    return ready
