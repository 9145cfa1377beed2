"""The recipe's training step as a Keras model: `RecipeModel(...).fit(...)` trains as the paper.

One `train_step` call is one micro-batch. Its gradients (and loss) are added to the sums of the
optimizer's tftorus.training.accumulation.Accumulation, the one that accumulates in any user's fit
too; when `accumulation` micro-batches (its count, which
official_resnet.run.callbacks.BatchSizeControl sets per epoch) are in, one update happens:

    micro-batch -> forward (mixed precision) -> label-smoothed loss -> scaled backward -> accumulate
    ... k-th micro-batch: mean of the k gradients -> one all-reduce over the torus through the
    compiled tftorus DistributedOptimizer (the loss rides along) -> unscale -> skip the update if
    any reduced gradient or the loss is inf/NaN, else LARS updates in FP32 (under mixed precision
    the LossScaleOptimizer skips it and lowers the loss scale)

The check runs on the *reduced* values, which are the same on every worker, so all workers take
(or skip) every update together and none is left waiting in a collective. A skipped update
leaves no trace: the BN moving statistics its forward passes moved are put back too. Keras
already has `backward_passes_per_step` in Horovod's wrapper, but as a constant fixed when the
optimizer is built; the paper's batch-size control changes it between epochs.
"""
from typing import List

import tensorflow as tf

from official_resnet.model.keras_generation import KERAS
from tftorus.runtime.reduction import reduce_gradients
from tftorus.training import accumulation as micro_batches


def smoothed_cross_entropy(labels, logits, num_classes: int, label_smoothing: float):
    """Mean cross-entropy against one-hot labels smoothed by `label_smoothing`, in FP32."""
    one_hot = tf.one_hot(tf.cast(labels, tf.int32), num_classes)
    loss = tf.keras.losses.categorical_crossentropy(
        one_hot, tf.cast(logits, tf.float32), from_logits=True, label_smoothing=label_smoothing)
    return tf.reduce_mean(loss)


def correct_count(labels, logits) -> tf.Tensor:
    """Top-1 hits in the batch, FP32."""
    return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32),
                                          tf.cast(labels, tf.int32)), tf.float32))


def all_finite(tensors: List[tf.Tensor]) -> tf.Tensor:
    """True when no tensor holds an inf or a NaN (one boolean for the whole list)."""
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(tf.cast(t, tf.float32)))
                          for t in tensors])


class _StepState:
    """The step's own variables, kept out of Keras' tracking (a plain object, not a Layer), so
    they are neither model weights nor broadcast nor checkpointed."""

    def __init__(self):
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False)  # taken or skipped
        self.last_applied = tf.Variable(True, trainable=False)
        self.last_loss = tf.Variable(0.0, trainable=False)  # global mean loss of the last update
        self.state_before = None  # BN moving statistics at the update's first micro-batch
        self.loss = tf.keras.metrics.Mean("loss")  # of applied updates, global
        self.top1 = tf.keras.metrics.Mean("top1")  # this worker's micro-batches, in %


class RecipeModel(tf.keras.Model):
    """A functional Keras model whose `fit` trains with the paper's step (see the module text).

        model = RecipeModel(net.inputs, net.outputs, label_smoothing=0.1)
        model.compile(optimizer=tftorus.keras.DistributedOptimizer(LARS(...)))
        model.fit(micro_batches, callbacks=[BatchSizeControl(...), ...])

    `net` is any functional model with logits out; data are (images, integer labels). On one
    process a plain optimizer works too. `updates`, `last_applied` and `last_loss` tell callbacks
    what the last update did.
    """

    def __init__(self, *args, label_smoothing: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.label_smoothing = float(label_smoothing)
        self._step = _StepState()

    @classmethod
    def wrap(cls, net: tf.keras.Model, **kwargs) -> "RecipeModel":
        """The same layers and weights as the functional `net`, with the recipe's step."""
        return cls(inputs=net.inputs, outputs=net.outputs, name=net.name, **kwargs)

    @property
    def micro_batch_accumulation(self) -> micro_batches.Accumulation:
        """The compiled optimizer's Accumulation, through which this step accumulates (the
        model accumulates itself: BatchSizeControl sets its count, nothing else)."""
        return micro_batches.of(self.optimizer)

    @property
    def accumulation(self) -> tf.Variable:
        """Micro-batches per update (the Accumulation's count)."""
        return self.micro_batch_accumulation.count

    @property
    def updates(self) -> tf.Variable:
        return self._step.updates

    @property
    def last_applied(self) -> tf.Variable:
        return self._step.last_applied

    @property
    def last_loss(self) -> tf.Variable:
        return self._step.last_loss

    @property
    def metrics(self):
        return [self._step.loss, self._step.top1]

    def make_train_function(self, force=False):
        # The step's variables made eagerly, before fit traces its step: a tf.function whose
        # first call creates variables is traced twice, and each variable's initialisation
        # becomes a tf.cond (140 of them for the embedded recipe), which doubled the time to
        # the first step.
        with tf.init_scope():
            self._make_step_variables()
        return super().make_train_function(force)

    def _make_step_variables(self):
        """Before the first trace (make_train_function), or at it when train_step is called
        in a user's own tf.function; outside any tf.cond (TensorFlow creates no variables
        there)."""
        step = self._step
        if step.state_before is None:
            step.state_before = [tf.Variable(v, trainable=False)
                                 for v in self.non_trainable_variables]
            # the slots (and a loss scale) too: the update sits in a tf.cond
            KERAS.build_optimizer(self.optimizer, self.trainable_variables)
            self.micro_batch_accumulation.build(list(self.trainable_variables)
                                                + [tf.zeros([], tf.float32)])  # + the loss

    def train_step(self, data):
        images, labels = data[0], data[1]
        step, variables = self._step, self.trainable_variables
        self._make_step_variables()
        accumulation = self.micro_batch_accumulation
        state = self.non_trainable_variables

        def snapshot():
            for v, saved in zip(state, step.state_before):
                saved.assign(v)
            return tf.constant(True)

        # Read before the forward pass moves them (TF orders a variable's reads and writes).
        tf.cond(tf.equal(accumulation.seen, 0), snapshot, lambda: tf.constant(False))
        with tf.GradientTape() as tape:
            logits = self(images, training=True)
            loss = smoothed_cross_entropy(labels, logits, self.output_shape[-1],
                                          self.label_smoothing)
            scaled = KERAS.scale_loss(self.optimizer, loss)
        grads = tape.gradient(scaled, variables)
        step.top1.update_state(100.0 * correct_count(labels, logits)
                               / tf.cast(tf.shape(labels)[0], tf.float32))
        # The loss rides along with the gradients: its mean over the update's micro-batches.
        accumulation.step(list(grads) + [loss], lambda means: self._update(means[:-1], means[-1]),
                          lambda sums: tf.constant(False))
        return {m.name: m.result() for m in self.metrics}

    def _reduce(self, grads: List[tf.Tensor], loss: tf.Tensor):
        """The mean gradient and loss over the workers: one fused all-reduce, the loss riding
        along, so every worker sees the global mean loss and a non-finite one at the same
        update."""
        reduced = reduce_gradients(self.optimizer, grads + [tf.reshape(loss, [1])],
                                   list(self.trainable_variables) + [None])
        return reduced[:-1], tf.reshape(reduced[-1], [])

    def _update(self, means: List[tf.Tensor], loss_mean: tf.Tensor):
        """The update's last micro-batch: reduce the mean gradient and the loss over the
        workers, check, apply or skip."""
        step, variables = self._step, self.trainable_variables
        grads, loss = self._reduce(means, loss_mean)
        grads = KERAS.unscale(self.optimizer, grads)
        finite = all_finite(grads + [loss])  # the same verdict on every worker

        def discard_state_updates():
            for v, before in zip(self.non_trainable_variables, step.state_before):
                v.assign(before)
            return tf.constant(False)

        # A LossScaleOptimizer lowers its scale on a skipped update
        applied = KERAS.apply_or_skip(self.optimizer, grads, variables, finite,
                                      discard_state_updates)
        step.updates.assign_add(1)
        step.last_applied.assign(applied)
        step.last_loss.assign(loss)

        def record_loss():
            step.loss.update_state(loss)
            return tf.constant(True)
        tf.cond(applied, record_loss, lambda: tf.constant(False))
        return applied


def make_eval_step(model: tf.keras.Model):
    """`eval_step(images, labels) -> (correct, count)` with the BN statistics in the model."""

    @tf.function
    def eval_step(images, labels):
        logits = model(images, training=False)
        return correct_count(labels, logits), tf.cast(tf.shape(labels)[0], tf.float32)

    return eval_step
