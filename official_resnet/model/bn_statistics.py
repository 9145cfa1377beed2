"""Batch Normalization without Moving Average (Akiba et al. 2017; used by Mikami et al.).

Before evaluation, the statistics a BN layer uses at inference are set to the exact mean and
population variance of its input over a set of training batches, computed with the current
weights, instead of the exponential moving averages gathered while the weights were changing.

`recompute_bn_statistics` runs each batch once through the model in training mode, so every BN
layer normalises with its batch's statistics, exactly as in training, and the input of a deeper BN
depends on the batch statistics of the shallower ones. A hook on every BN layer records the
per-channel sum and sum of squares of the layer's input in FP32, plus the element count. After
the last batch, one FP32 buffer holding all layers' sums goes through `allreduce_sum` (the paper
exchanges batch mean and batch squared mean in FP32), so every worker sets the same statistics:
those of the union of all workers' batches.

    mean = sum(x) / n          variance = sum(x^2) / n - mean^2   (population, not n - 1)

The hook is an instance attribute shadowing the layer's `call` (Keras looks `self.call` up at
every call), so it sees BN layers at any depth of nested models, Sequential or subclassed ones.
It is removed before returning. The training-mode passes update the moving averages of the BN
layers, and may advance other non-trainable state (random generators of augmentation layers):
the first are overwritten with the exact values, the rest are restored, so nothing else changes.
"""
import contextlib
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

import tensorflow as tf

from official_resnet.model.keras_generation import KERAS
from tftorus.runtime.stack import variable_key

AllreduceSum = Callable[[tf.Tensor], tf.Tensor]


class BNStatisticsSummary(NamedTuple):
    layers: Tuple[str, ...]  # BN layers whose moving_mean/moving_variance were set, model order
    examples: int  # examples seen, summed over all workers
    local_batches: int  # batches run on this worker


def batch_norm_layers(model: tf.keras.Model) -> List[tf.keras.layers.BatchNormalization]:
    """Every BatchNormalization layer of `model`, nested ones included, once each, in graph
    order where the model has one (so the summary reads from input to output)."""
    found, seen = [], set()

    def visit(layer):
        if id(layer) in seen:
            return
        seen.add(id(layer))
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            found.append(layer)
        for sublayer in getattr(layer, "layers", ()):  # functional models list them in graph order
            visit(sublayer)

    visit(model)
    for module in KERAS.sublayers(model):  # BN held by a subclassed layer (no `.layers`)
        if isinstance(module, tf.keras.layers.BatchNormalization) and id(module) not in seen:
            seen.add(id(module))
            found.append(module)
    return found


def _channel_sums(layer: tf.keras.layers.BatchNormalization,
                  inputs: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Per-channel sum and sum of squares of a BN input, in FP32, and the count per channel."""
    x = tf.cast(inputs, tf.float32)  # FP16 squares overflow past 256
    rank = x.shape.rank
    axes = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]  # Keras 3: int
    channel_axes = {a % rank for a in axes}
    reduce_axes = [i for i in range(rank) if i not in channel_axes]
    total = tf.reshape(tf.reduce_sum(x, axis=reduce_axes), [-1])
    total_sq = tf.reshape(tf.reduce_sum(tf.square(x), axis=reduce_axes), [-1])
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), reduce_axes)), tf.float32)
    return total, total_sq, count


@contextlib.contextmanager
def _recording_inputs(layers, record: Callable):
    """Makes every layer in `layers` call `record(layer, inputs)` before its own `call`."""
    shadowed = {}  # a `call` already set on the instance (someone else's hook) is put back
    for layer in layers:
        if "call" in vars(layer):
            shadowed[id(layer)] = vars(layer)["call"]

        def call(inputs, *args, _layer=layer, _call=layer.call, **kwargs):
            record(_layer, inputs)
            return _call(inputs, *args, **kwargs)
        # object.__setattr__: keep the hook out of Keras' attribute tracking (and checkpoints).
        object.__setattr__(layer, "call", call)
    try:
        yield
    finally:
        for layer in layers:
            if id(layer) in shadowed:
                object.__setattr__(layer, "call", shadowed[id(layer)])
            else:
                object.__delattr__(layer, "call")


def recompute_bn_statistics(model: tf.keras.Model, batches: Iterable,
                            allreduce_sum: Optional[AllreduceSum] = None) -> BNStatisticsSummary:
    """Sets every BN layer's moving_mean/moving_variance to its input's exact statistics.

    Args:
      model: a built Keras model (functional, Sequential, subclassed, nested, mixed precision).
      batches: model inputs, one batch each (tensors or arrays; a `(x, y)` or `(x, y, weights)`
        tuple from a training dataset is used as `x`). Every worker must call this function, even
        with no batches of its own, because of the collective.
      allreduce_sum: sums an FP32 tensor over all workers, e.g.
        `lambda t: hvd.allreduce(t, op=hvd.Sum)`; called once. None: a single process.

    Returns:
      BNStatisticsSummary: the layers set and the number of examples used.
    """
    bn_layers = batch_norm_layers(model)
    if not bn_layers:
        return BNStatisticsSummary(layers=(), examples=0, local_batches=0)
    unbuilt = [layer.name for layer in bn_layers if not layer.built]
    if unbuilt:
        raise ValueError(f"BN layers {unbuilt} are not built: call the model on a batch first")

    # The buffer's layout follows the layers, not the batches, so a worker with no batches still
    # joins the all-reduce with zeros: [sum, sum of squares, count] per layer, then examples.
    sizes = [int(layer.moving_mean.shape.num_elements()) for layer in bn_layers]
    buffer_size = sum(2 * size + 1 for size in sizes) + 1
    index = {id(layer): i for i, layer in enumerate(bn_layers)}
    recorded: Dict[int, List[Tuple[tf.Tensor, tf.Tensor, tf.Tensor]]] = {}

    def record(layer, inputs):
        recorded.setdefault(index[id(layer)], []).append(_channel_sums(layer, inputs))

    @tf.function(reduce_retracing=True)
    def batch_sums(x):
        recorded.clear()  # runs at trace time: each trace records its own symbolic tensors
        model(x, training=True)
        parts = []
        for i, size in enumerate(sizes):
            calls = recorded.get(i, [])  # a shared layer records once per call; add them up
            parts.append(tf.add_n([c[0] for c in calls]) if calls else tf.zeros([size]))
            parts.append(tf.add_n([c[1] for c in calls]) if calls else tf.zeros([size]))
            parts.append(tf.reshape(tf.add_n([c[2] for c in calls]) if calls else 0.0, [1]))
        examples = tf.shape(tf.nest.flatten(x)[0])[0]
        parts.append(tf.cast(tf.reshape(examples, [1]), tf.float32))
        return tf.concat(parts, axis=0)

    moving = {variable_key(v) for layer in bn_layers
              for v in (layer.moving_mean, layer.moving_variance)}
    state = [v for v in model.non_trainable_variables if variable_key(v) not in moving]
    saved = [tf.identity(v) for v in state]

    totals = tf.zeros([buffer_size], tf.float32)
    local_batches = 0
    try:
        with _recording_inputs(bn_layers, record):
            for batch in batches:
                x, _, _ = tf.keras.utils.unpack_x_y_sample_weight(batch)
                totals += batch_sums(x)  # FP32 accumulation across batches
                local_batches += 1
    finally:
        for variable, value in zip(state, saved):
            variable.assign(value)

    if allreduce_sum is not None:
        totals = tf.convert_to_tensor(allreduce_sum(totals))
        if totals.dtype != tf.float32 or totals.shape != [buffer_size]:
            raise ValueError(f"allreduce_sum returned {totals.dtype} {totals.shape}; it must "
                             "return a tensor like its input (FP32, same shape)")
    examples = int(totals[-1].numpy())
    if examples == 0:
        raise ValueError("no examples on any worker: pass at least one training batch")

    updated, offset = [], 0
    for layer, size in zip(bn_layers, sizes):
        total, total_sq = totals[offset:offset + size], totals[offset + size:offset + 2 * size]
        count = totals[offset + 2 * size]
        offset += 2 * size + 1
        if count.numpy() == 0:
            continue  # never called on this path of the model: leave its statistics alone
        mean = total / count
        variance = tf.maximum(total_sq / count - tf.square(mean), 0.0)  # rounding can dip below 0
        for variable, value in ((layer.moving_mean, mean), (layer.moving_variance, variance)):
            variable.assign(tf.cast(tf.reshape(value, variable.shape), variable.dtype))
        updated.append(layer.name)
    return BNStatisticsSummary(layers=tuple(updated), examples=examples,
                               local_batches=local_batches)
