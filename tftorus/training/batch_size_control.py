"""The paper's batch-size control as a Keras callback, for any model compiled with tftorus'
DistributedOptimizer:

    import tftorus.keras as hvd
    model.compile(optimizer=hvd.DistributedOptimizer(opt), loss=..., metrics=[...])
    model.fit(micro_batches, steps_per_epoch=..., callbacks=[
        hvd.BatchSizeControl([(0, 1), (30, 2)]), ...])      # 1, then 2 micro-batches per update

It sets the count of the optimizer's tftorus.training.accumulation.Accumulation at the epochs where
the schedule says, so one dataset of fixed micro-batches and one fit cover every range, and
changing the batch retraces nothing. A model whose train step accumulates itself through the
same Accumulation (official_resnet.model.recipe_model.RecipeModel) says so with
`model.micro_batch_accumulation`.
"""
import math
from typing import Callable, Iterable, Optional, Sequence, Tuple

import tensorflow as tf

from tftorus.training import accumulation as micro_batches


def _accumulation(model: tf.keras.Model, create: bool) -> Optional[micro_batches.Accumulation]:
    """The model's own (a train step that accumulates itself, `model.micro_batch_accumulation`,
    e.g. RecipeModel's), else its optimizer's (made when `create`, else None if none yet)."""
    own = getattr(model, "micro_batch_accumulation", None)
    if own is not None or model.optimizer is None:
        return own
    return micro_batches.of(model.optimizer, create=create)


def accumulation_of(model: tf.keras.Model) -> micro_batches.Accumulation:
    """The Accumulation whose count sets `model`'s micro-batches per update: its own when its
    train step accumulates itself, else its compiled optimizer's, which then accumulates in
    Keras' own train step. The train step is traced again if fit traced it before (at the
    first call of a fit, so at no cost)."""
    own = getattr(model, "micro_batch_accumulation", None)
    if own is not None:
        return own
    if model.optimizer is None:
        raise ValueError("BatchSizeControl needs a compiled model: model.compile(optimizer="
                         "tftorus.keras.DistributedOptimizer(...), loss=...) first")
    enabled = _accumulation(model, create=False) is not None
    accumulation = micro_batches.enable_for(model)
    if not enabled and model.train_function is not None:
        model.make_train_function(force=True)  # sets model.train_function (Keras 2 and 3)
    return accumulation


def micro_batches_per_update(model: tf.keras.Model) -> int:
    """1 unless `model` accumulates (BatchSizeControl or a model that accumulates itself)."""
    found = _accumulation(model, create=False)
    return int(found.count.numpy()) if found is not None else 1


class BatchSizeControl(tf.keras.callbacks.Callback):
    """Switches the number of micro-batches per update at epoch boundaries.

    schedule: (first epoch, micro-batches per update) pairs, the first at epoch 0, e.g.
    [(0, 1), (30, 2)]: batch B per update for epochs 0-29, 2B from epoch 30 (B = micro-batch
    x workers). `on_switch(epoch, accumulation)` is called when a new entry starts.
    """

    def __init__(self, schedule: Sequence[Tuple[int, int]],
                 on_switch: Optional[Callable[[int, int], None]] = None):
        super().__init__()
        schedule = sorted((int(e), int(k)) for e, k in schedule)
        if not schedule or schedule[0][0] != 0 or min(k for _, k in schedule) < 1:
            raise ValueError(f"BatchSizeControl: the schedule starts at epoch 0 and gives >= 1 "
                             f"micro-batches per update, got {schedule}")
        self.schedule, self.on_switch, self._current = schedule, on_switch, None

    def entry_at(self, epoch: int) -> Tuple[int, int]:
        return [entry for entry in self.schedule if entry[0] <= epoch][-1]

    @classmethod
    def from_total_batches(cls, ranges: Iterable[Tuple[int, int, int]], micro_batch: int,
                           workers: int, **kwargs) -> "BatchSizeControl":
        """From Table 3 style (first epoch, end epoch, total batch) ranges, a micro-batch per
        worker and the number of workers; each total must be a multiple of both."""
        schedule = []
        for start, end, total in ranges:
            if total % (micro_batch * workers):
                raise ValueError(f"BatchSizeControl: the total batch {total} of epochs "
                                 f"{start}-{end} is not a multiple of micro-batch {micro_batch} "
                                 f"x {workers} workers; choose a micro-batch that divides "
                                 f"{total // math.gcd(total, workers)}")
            schedule.append((start, total // (micro_batch * workers)))
        return cls(schedule, **kwargs)

    def on_train_begin(self, logs=None):
        self.accumulation = accumulation_of(self.model)
        steps = self.params.get("steps")
        bad = [k for _, k in self.schedule if steps and steps % k]
        if bad:
            raise ValueError(f"BatchSizeControl: {steps} steps per epoch is not a multiple of "
                             f"{bad} micro-batches per update: give fit a steps_per_epoch that is")
        self._current = None

    def on_epoch_begin(self, epoch, logs=None):
        entry = self.entry_at(epoch)
        if entry != self._current:  # also at the first epoch of a resumed fit
            k = entry[1]
            self.accumulation.set_count(k)
            self._current = entry
            if self.on_switch:
                self.on_switch(epoch, k)
