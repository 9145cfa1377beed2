"""Keras callbacks of the paper's recipe for any `model.fit`, each standing alone.

    BatchSizeControl     the paper's batch-size control (tftorus.training.batch_size_control's,
                         here too)
    LRMomentumSchedule   LR and momentum (configurations A and B), keyed on samples seen
    MetricAverage        Horovod's MetricAverageCallback for either engine
    Evaluation           1-crop top-1 on the validation split over all workers, with the BN
                         statistics recomputed from training batches first (the paper's way)

Each talks to the rest of fit through `self.model`, `self.params` and `logs` only: the LR
schedule puts logs['lr'] and logs['momentum'], Evaluation logs['val_top1'], for any callback
after them (Keras runs callbacks in list order). BatchSizeControl and LRMomentumSchedule work in
a model compiled with tftorus.keras.DistributedOptimizer (tftorus.training.accumulation): one
dataset of fixed micro-batches and one `fit` cover every phase, and changing the batch retraces
nothing. A `Workers` (official_resnet.run.workers) says who this process is and sums over all of
them: `Workers.current()` after tftorus.init(), `Workers()` in one process.

The trainer's own callbacks, which share its run state, are in official_resnet.run.run_callbacks.
"""
import math
from typing import Callable, Iterable, Optional

import tensorflow as tf

from official_resnet.model import bn_statistics
from official_resnet.model.recipe_model import make_eval_step
from official_resnet.optimizers.lars import unwrap
from official_resnet.run.workers import Workers
from tftorus.reliability import watchdog
from tftorus.training.batch_size_control import (BatchSizeControl,  # noqa: F401
                                                 micro_batches_per_update)


class LRMomentumSchedule(tf.keras.callbacks.Callback):
    """Sets the LR and the momentum of the (LARS) optimizer at the first micro-batch of every
    update: `lr(epoch)` and `momentum(epoch, total_batch)`, epoch being the samples seen in
    epochs, `(keras epoch + batch / steps) * epoch_fraction` (the micro-batch is fixed within a
    fit). total_batch = micro-batches per update x micro_batch x workers."""

    def __init__(self, lr: Callable[[float], float],
                 momentum: Callable[[float, int], float], micro_batch: int, workers: int,
                 epoch_fraction: float = 1.0):
        super().__init__()
        self.lr, self.momentum = lr, momentum
        self.micro_batch, self.workers, self.epoch_fraction = micro_batch, workers, epoch_fraction
        self._epoch, self.values = 0, (0.0, 0.0)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        k = micro_batches_per_update(self.model)
        if batch % k:
            return
        epoch = (self._epoch + batch / self.params["steps"]) * self.epoch_fraction
        lr, momentum = self.lr(epoch), self.momentum(epoch, k * self.micro_batch * self.workers)
        optimizer = unwrap(self.model.optimizer)  # LossScaleOptimizer delegates no momentum
        optimizer.learning_rate.assign(lr)
        optimizer.momentum.assign(momentum)
        self.values = (lr, momentum)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"], logs["momentum"] = self.values


class MetricAverage(tf.keras.callbacks.Callback):
    """Horovod's MetricAverageCallback for any engine: the epoch's logs averaged over workers
    in one all-reduce (the tf engine has no Horovod runtime)."""

    def __init__(self, workers: Workers):
        super().__init__()
        self.workers = workers

    def on_epoch_end(self, epoch, logs=None):
        if logs and self.workers.size > 1:
            names = sorted(logs)
            sums = self.workers.sum(tf.constant([float(logs[n]) for n in names],
                                                tf.float64)).numpy()
            logs.update({n: v / self.workers.size for n, v in zip(names, sums)})


class Evaluation(tf.keras.callbacks.Callback):
    """1-crop top-1 on `data()` (this worker's part of the validation split), summed over all
    workers: logs['val_top1']. Due every `every` data epochs (a Keras epoch is
    `epoch_fraction` of one), after `last_epoch` (default: the fit's last) and when training
    stops early. With `bn_batches`, every BN layer's statistics are first set to those of
    `bn_batches(epoch)` (training micro-batches, current weights) over all workers, in FP32
    (official_resnet/model/bn_statistics.py): the recipe keeps no moving averages."""

    def __init__(self, data: Callable[[], Iterable], workers: Workers = Workers(),
                 every: float = 1.0, epoch_fraction: float = 1.0,
                 bn_batches: Optional[Callable[[int], Iterable]] = None,
                 last_epoch: Optional[int] = None):
        super().__init__()
        self.data, self.workers, self.bn_batches = data, workers, bn_batches
        self.every, self.epoch_fraction, self.last_epoch = every, epoch_fraction, last_epoch
        self._step = None

    def due(self, epoch: int) -> bool:
        last = self.params["epochs"] - 1 if self.last_epoch is None else self.last_epoch
        after = (epoch + 1) * self.epoch_fraction
        return (epoch >= last or self.model.stop_training
                or math.floor(after / self.every + 1e-9)
                > math.floor((after - self.epoch_fraction) / self.every + 1e-9))

    def on_epoch_end(self, epoch, logs=None):
        if not self.due(epoch):
            return
        if self.bn_batches is not None:
            watchdog.progress("BN statistics")
            bn_statistics.recompute_bn_statistics(self.model, self.bn_batches(epoch),
                                                  self.workers.allreduce_sum)
        watchdog.progress("evaluation")
        self._step = self._step or make_eval_step(self.model)
        correct = total = 0.0
        for images, labels in self.data():
            c, n = self._step(images, labels)
            correct, total = correct + float(c), total + float(n)
        sums = self.workers.sum(tf.constant([correct, total], tf.float64)).numpy()
        if sums[1] == 0:
            raise ValueError("the validation split is empty: check --data_dir")
        if logs is not None:
            logs["val_top1"] = 100.0 * sums[0] / sums[1]
