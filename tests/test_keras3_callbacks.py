"""tftorus.horovod_api.keras3_callbacks (Horovod's Keras callbacks on Keras 3, the current stack)
in one process, with a tiny functional model: the warm-up's learning rate at every batch is Horovod's
formula, the schedule's multiplier per epoch, the momentum correction reaches a traced step (and
why it has to be done on the slots there), MetricAverage leaves one worker's logs alone and
averages two workers', Broadcast sends the model before the first batch and model + optimizer
after it, once, without changing a one-worker fit.

The world is faked (tftorus.runtime.world's rank/size/allreduce_sum/broadcast_variables patched),
since tftorus.init() must come before TensorFlow starts; the multi-process checks are in
tests/test_user_fit.py (Broadcast and MetricAverage in a user's fit on 3 workers).
"""
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from tftorus.runtime import stack, world

if not stack.KERAS_3:
    pytest.skip("Keras 3 (the current stack); the classic stack's callbacks are Horovod's",
                allow_module_level=True)

import keras  # noqa: E402

from tftorus.horovod_api import keras3_callbacks as hvd_callbacks  # noqa: E402

STEPS, BATCH = 4, 8


def data():
    rs = np.random.RandomState(0)
    x = rs.randn(STEPS * BATCH, 3).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3).astype("float32")
    return x, y


def tiny_model(optimizer, run_eagerly=False, dropout=False):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, activation="tanh")(inputs)
    if dropout:
        hidden = keras.layers.Dropout(0.25)(hidden)
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer, "mse", metrics=["mae"], run_eagerly=run_eagerly)
    return model


def fit(model, callbacks, epochs):
    x, y = data()
    return model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
                     callbacks=callbacks)


class FakeWorld:
    """Rank 0 of `size`. Every other rank holds this rank's values, except that the metric
    all-reduce adds `others` (their logs' values summed) when given, and the agreement check
    sees a disagreeing rank when `agree` is False. broadcast_variables records what it got."""

    def __init__(self, size, others=None, agree=True):
        self.size, self.others, self.agree = size, others, agree
        self.broadcasts = []

    def allreduce_sum(self, tensor, name="tftorus_sum"):
        t = tf.convert_to_tensor(tensor)
        if name == "tftorus_metric_average" and self.others is not None:
            return t + tf.constant(self.others, t.dtype)
        if name == "tftorus_same" and not self.agree:
            return t * self.size + 1
        return t * self.size

    def broadcast_variables(self, variables, root_rank=0):
        self.broadcasts.append((list(variables), root_rank))

    def patch(self):
        return mock.patch.multiple(world, rank=lambda: 0, size=lambda: self.size,
                                   allreduce_sum=self.allreduce_sum,
                                   broadcast_variables=self.broadcast_variables)


class LRProbe(keras.callbacks.Callback):
    """The learning rate each step runs with (put after the callbacks that set it)."""

    def on_train_begin(self, logs=None):
        self.lrs = []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(self.model.optimizer.learning_rate.numpy()))


class HorovodsMomentumCorrection(keras.callbacks.Callback):
    """Horovod's way, which works in an eager step: momentum *= new_lr / old_lr for the step,
    restored after it (put after the LR callback)."""

    def on_train_begin(self, logs=None):
        self.last_lr = float(self.model.optimizer.learning_rate.numpy())

    def on_train_batch_begin(self, batch, logs=None):
        lr = float(self.model.optimizer.learning_rate.numpy())
        self.restore = self.model.optimizer.momentum
        self.model.optimizer.momentum = self.restore * lr / self.last_lr
        self.last_lr = lr

    def on_train_batch_end(self, batch, logs=None):
        self.model.optimizer.momentum = self.restore


def horovod_warmup_lr(initial_lr, size, warmup_epochs, steps, epoch, batch):
    """Horovod 0.28.1's warm-up, written out: epoch' = epoch + (batch + 1) / steps,
    lr = initial_lr / size * (epoch' * (size - 1) / warmup_epochs + 1); after warmup_epochs the
    learning rate stays where the warm-up's last batch left it (initial_lr)."""
    if epoch >= warmup_epochs:
        return initial_lr
    e = epoch + (batch + 1) / steps
    return initial_lr / size * (e * (size - 1) / warmup_epochs + 1)


# ------------------------------------------------------------------------------------------------
# Learning rate
# ------------------------------------------------------------------------------------------------
def test_warmup_sets_horovods_lr_at_every_batch():
    probe = LRProbe()
    with FakeWorld(4).patch():
        warmup = hvd_callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=2)
        history = fit(tiny_model(keras.optimizers.SGD(0.1, momentum=0.9)), [warmup, probe], 3)
        assert warmup.multiplier(0.0) == pytest.approx(1 / 4 * ((1 / STEPS) * 3 / 2 + 1))
    assert warmup.steps_per_epoch == STEPS  # Keras' params['steps']
    expected = [horovod_warmup_lr(0.1, 4, 2, STEPS, e, b) for e in range(3) for b in range(STEPS)]
    np.testing.assert_allclose(probe.lrs, expected, rtol=1e-6)
    assert expected[0] == pytest.approx(0.1 / 4 * (1 + 3 / 8))  # starts near initial_lr / size
    np.testing.assert_allclose(history.history["lr"], [expected[3], 0.1, 0.1], rtol=1e-6)
    with FakeWorld(1).patch():  # one worker: no warm-up
        assert [warmup.multiplier(e / STEPS) for e in range(8)] == [1.0] * 8


def test_schedule_multiplier_per_epoch_staircase_and_per_batch():
    probe = LRProbe()
    with FakeWorld(2).patch():
        schedule = hvd_callbacks.LearningRateScheduleCallback(
            0.2, multiplier=0.25, start_epoch=1, end_epoch=3)
        history = fit(tiny_model(keras.optimizers.SGD(0.1, momentum=0.9)),
                      [schedule, probe], 4)
    # epoch 0: before start_epoch, the optimizer's own 0.1; then 0.2 * 0.25 ** (epoch - 1) at
    # each epoch's first batch; epoch 3: from end_epoch on, left as it was
    per_epoch = [0.1, 0.2, 0.05, 0.05]
    np.testing.assert_allclose(probe.lrs, np.repeat(per_epoch, STEPS), rtol=1e-6)
    np.testing.assert_allclose(history.history["lr"], per_epoch, rtol=1e-6)

    probe = LRProbe()
    with FakeWorld(2).patch():
        smooth = hvd_callbacks.LearningRateScheduleCallback(
            0.2, multiplier=lambda epoch: 1 / (1 + epoch), staircase=False)
        fit(tiny_model(keras.optimizers.SGD(0.1)), [smooth, probe], 2)
    expected = [0.2 / (1 + e + b / STEPS) for e in range(2) for b in range(STEPS)]
    np.testing.assert_allclose(probe.lrs, expected, rtol=1e-6)


def test_steps_per_epoch_needed_when_keras_does_not_know_it():
    x, y = data()
    unknown_length = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True).batch(8)
    model = tiny_model(keras.optimizers.SGD(0.1))
    with FakeWorld(2).patch(), pytest.raises(ValueError, match="steps_per_epoch"):
        model.fit(unknown_length, epochs=1, verbose=0, shuffle=False,
                  callbacks=[hvd_callbacks.LearningRateWarmupCallback(0.1)])


# ------------------------------------------------------------------------------------------------
# Momentum correction
# ------------------------------------------------------------------------------------------------
def test_keras3_reads_a_float_momentum_when_it_traces_the_step():
    """Why Horovod's momentum correction cannot work on Keras 3 as Horovod does it."""

    class MomentumOffAfterFirstStep(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 1:
                self.model.optimizer.momentum = 0.0

    plain = tiny_model(keras.optimizers.SGD(0.1, momentum=0.9))
    changed = tiny_model(keras.optimizers.SGD(0.1, momentum=0.9))
    fit(plain, [], 1)
    fit(changed, [MomentumOffAfterFirstStep()], 1)
    for a, b in zip(plain.get_weights(), changed.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("make_optimizer", [
    lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    lambda: keras.optimizers.RMSprop(0.01, momentum=0.9),
], ids=["SGD", "RMSprop"])
def test_momentum_correction_reaches_a_traced_step(make_optimizer):
    """Ours (slots scaled, traced step) equals Horovod's (momentum changed for the step) where
    Horovod's works, an eager step; and it is not a no-op."""
    def run(callbacks, run_eagerly=False):
        model = tiny_model(make_optimizer(), run_eagerly=run_eagerly)
        with FakeWorld(4).patch():
            fit(model, callbacks, 2)
        return model.get_weights()

    warmup = hvd_callbacks.LearningRateWarmupCallback
    ours = run([warmup(0.1, warmup_epochs=2)])
    horovods = run([warmup(0.1, warmup_epochs=2, momentum_correction=False),
                    HorovodsMomentumCorrection()], run_eagerly=True)
    uncorrected = run([warmup(0.1, warmup_epochs=2, momentum_correction=False)])
    for a, b, c in zip(ours, horovods, uncorrected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert max(np.max(np.abs(a - c)) for a, c in zip(ours, uncorrected)) > 1e-4


def test_momentum_correction_refused_where_it_cannot_take_effect():
    class HeavyBall(keras.optimizers.Adam):  # a float momentum Keras reads at trace time
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.momentum = 0.9

    with FakeWorld(2).patch():
        with pytest.raises(ValueError, match="momentum_correction=False"):
            fit(tiny_model(HeavyBall(learning_rate=0.01)),
                [hvd_callbacks.LearningRateWarmupCallback(0.01)], 1)
        fit(tiny_model(HeavyBall(learning_rate=0.01)),
            [hvd_callbacks.LearningRateWarmupCallback(0.01, momentum_correction=False)], 1)


# ------------------------------------------------------------------------------------------------
# MetricAverage
# ------------------------------------------------------------------------------------------------
def test_metric_average_leaves_one_workers_logs_unchanged():
    logs = {"loss": 0.5, "mae": np.float32(0.25), "val_loss": 1.0}
    before = dict(logs)
    with FakeWorld(1).patch():
        hvd_callbacks.MetricAverageCallback().on_epoch_end(0, logs)
        plain = fit(tiny_model(keras.optimizers.SGD(0.1)), [], 2).history
        averaged = fit(tiny_model(keras.optimizers.SGD(0.1)),
                       [hvd_callbacks.MetricAverageCallback()], 2).history
    assert logs == before and all(type(logs[k]) is type(before[k]) for k in logs)
    assert averaged == plain


def test_metric_average_two_workers_collectives_faked():
    logs = {"loss": 1.0, "mae": 3.0}
    with FakeWorld(2, others=[2.0, 5.0]).patch():  # the other rank logged loss 2, mae 5
        hvd_callbacks.MetricAverageCallback().on_epoch_end(0, logs)
    assert logs == {"loss": 1.5, "mae": 4.0}
    with FakeWorld(2, agree=False).patch(), pytest.raises(ValueError, match="logs differ"):
        hvd_callbacks.MetricAverageCallback().on_epoch_end(0, {"loss": 1.0})


# ------------------------------------------------------------------------------------------------
# Broadcast
# ------------------------------------------------------------------------------------------------
def test_broadcast_model_before_first_batch_model_and_optimizer_after_it_once():
    fake = FakeWorld(1)
    reference = tiny_model(keras.optimizers.SGD(0.1, momentum=0.9), dropout=True)
    model = tiny_model(keras.optimizers.SGD(0.1, momentum=0.9), dropout=True)
    kept = model.layers[-1].bias
    with fake.patch():
        broadcast = hvd_callbacks.BroadcastGlobalVariablesCallback(0, local_variables=kept)
        fit(reference, [], 2)
        fit(model, [broadcast], 2)
        for a, b in zip(reference.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(a, b)  # one worker: the broadcast changes nothing
        assert broadcast.broadcast_done
        fit(model, [broadcast], 1)  # as Horovod's: once per callback, not once per fit
    assert len(fake.broadcasts) == 2
    (first, root0), (second, root1) = fake.broadcasts
    assert root0 == root1 == 0
    assert all(isinstance(v, tf.Variable) for v in first + second)
    weights = [v.value for v in model.weights if v is not kept]  # no seed state, no `kept`
    assert [id(v) for v in first] == [id(v) for v in weights]
    optimizer = [v.value for v in model.optimizer.variables]
    assert [id(v) for v in second] == [id(v) for v in weights + optimizer]
    # Keras 3 made the momentum slots in the first step: they are in the second broadcast
    assert sum("momentum" in v.name for v in second) == 4


def test_broadcast_refuses_ranks_with_other_variables():
    with FakeWorld(2, agree=False).patch(), pytest.raises(ValueError, match="differ"):
        fit(tiny_model(keras.optimizers.SGD(0.1)),
            [hvd_callbacks.BroadcastGlobalVariablesCallback(0)], 1)
