"""Keras callbacks of the paper's recipe, each usable in a user's own `model.fit`.

    BatchSizeControl     the paper's batch-size control (tftorus.batch_size_control's, here too)
    LRMomentumSchedule   LR and momentum (configurations A and B), keyed on samples seen
    NonFiniteSteps       reports every skipped update; stops per --on_nonfinite
    BNStatistics         BN statistics recomputed before each evaluation (FP32, over all workers)
    Evaluation           1-crop top-1 on the validation split, summed over all workers
    MetricAverage        Horovod's MetricAverageCallback for either engine
    RunProgress, EpochLogger, TensorBoardScalars, CheckpointSaver, StopAtEpoch, StopAtStep
                         the run's clock, its log lines and history.jsonl, TensorBoard, atomic
                         checkpoints, and the stops
    run_summary, log_summary   the Table 5 / Table 6 summaries of a finished run

BatchSizeControl works in any model's fit compiled with tftorus.keras.DistributedOptimizer
(tftorus.accumulation): one dataset of fixed micro-batches and one `fit` then cover every phase,
and changing the batch retraces nothing. LRMomentumSchedule too. The callbacks after these take
a RunState (official_resnet.run_state) where they share the run's clock.
"""
import dataclasses
import json
import logging
import math
import os
import sys
from typing import Callable, Iterable, List, Optional

import tensorflow as tf

from official_resnet import bn_statistics
from official_resnet.lars import unwrap
from official_resnet.recipe_model import make_eval_step
from official_resnet.run_state import (NONFINITE_POLICIES, EpochLog, NonFiniteLossError,
                                       RunState)
from tftorus import watchdog
from tftorus.batch_size_control import BatchSizeControl, micro_batches_per_update  # noqa: F401

logger = logging.getLogger(__name__)


def progbar_verbosity(chief: bool) -> int:
    """Keras' progress bar on rank 0 only: live in a terminal, one line per epoch in a log."""
    return (1 if sys.stdout.isatty() else 2) if chief else 0


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


class RunProgress(tf.keras.callbacks.Callback):
    """The run's clock: Keras epoch and batch, optimizer steps, samples seen, training time;
    tells the watchdog (tftorus/watchdog.py) what this worker starts."""

    def __init__(self, state: RunState, micro_batch: int):
        super().__init__()
        self.state, self.micro_batch = state, micro_batch
        self._updates, self._t0 = 0, 0.0

    def on_train_begin(self, logs=None):
        self.state.steps_per_epoch = self.params["steps"]
        self._updates = int(self.model.updates.numpy())

    def on_epoch_begin(self, epoch, logs=None):
        s = self.state
        s.keras_epoch, s.batch, s.skipped_at, s.updates_in_epoch = epoch, 0, [], 0
        s.finishing = epoch + 1 >= s.keras_epochs
        self._t0 = self.state.elapsed()

    def on_train_batch_begin(self, batch, logs=None):
        self.state.batch = batch
        progress(self.state, "train step")

    def on_train_batch_end(self, batch, logs=None):
        s = self.state
        s.batch, s.micro_batches_in_segment = batch + 1, s.micro_batches_in_segment + 1
        updates = int(self.model.updates.numpy())
        if updates != self._updates:  # this micro-batch completed an update
            self._updates = updates
            s.updates_in_epoch += 1
            s.steps.assign_add(1)
            s.samples_seen.assign_add(micro_batches_per_update(self.model) * self.micro_batch
                                      * s.world.size)

    def on_epoch_end(self, epoch, logs=None):
        self.state.train_seconds = self.state.elapsed() - self._t0
        progress(self.state, "epoch metrics")


def progress(state: RunState, what: str, shared: bool = True) -> None:
    watchdog.progress(what, state.plan_of(state.keras_epoch).index + 1, round(state.epoch(), 4),
                      int(state.steps.numpy()), shared=shared)


class StopAtStep(tf.keras.callbacks.Callback):
    """Ends the run after `max_steps` optimizer steps (smoke runs); the epoch is closed as the
    run's last (evaluation, checkpoint)."""

    def __init__(self, state: RunState, max_steps: Optional[int]):
        super().__init__()
        self.state, self.max_steps = state, max_steps

    def on_train_batch_end(self, batch, logs=None):
        if self.max_steps and int(self.state.steps.numpy()) >= self.max_steps:
            self.model.stop_training = True
            self.state.finishing = True


class NonFiniteSteps(tf.keras.callbacks.Callback):
    """An update whose all-reduced gradients or loss held inf/NaN was skipped on every worker
    (RecipeModel does that): report it with its step, and stop when the policy (or too long a
    run of them) says so. Loss-scale overflows count only once the scale is below 1."""

    def __init__(self, state: RunState, on_nonfinite: str = "skip", max_nonfinite_skips: int = 10,
                 writer=None):
        super().__init__()
        if on_nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"on_nonfinite must be one of {NONFINITE_POLICIES}, got "
                             f"{on_nonfinite!r}")
        self.state, self.policy, self.writer = state, on_nonfinite, writer
        self.max_skips = max_nonfinite_skips
        self._updates = 0

    def on_train_begin(self, logs=None):
        self._updates = int(self.model.updates.numpy())

    def on_train_batch_end(self, batch, logs=None):
        updates = int(self.model.updates.numpy())
        if updates == self._updates:
            return
        self._updates = updates
        if bool(self.model.last_applied.numpy()):
            self.state.skips_in_a_row = 0
            return
        s = self.state
        step, epoch, loss = int(s.steps.numpy()), s.epoch(), float(self.model.last_loss.numpy())
        s.skips_in_a_row += 1
        s.skipped_at.append(step)
        mixed = isinstance(self.model.optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
        overflow = mixed and math.isfinite(loss)  # FP16 gradients overflowed
        scale = float(self.model.optimizer.loss_scale) if mixed else None
        if s.world.chief:
            logger.warning("step %d (epoch %.2f): %s over all workers; the step was skipped "
                           "(%d in a row)%s", step, epoch,
                           "FP16 gradients overflowed" if overflow else
                           f"non-finite gradients or loss ({loss})", s.skips_in_a_row,
                           f"; loss scale lowered to {scale:g}" if mixed else "")
            if self.writer is not None:  # one point per skipped step, at its place in training
                with self.writer.as_default(step=int(s.samples_seen.numpy())):
                    tf.summary.scalar("skipped_step", step)
                    if mixed:
                        tf.summary.scalar("loss_scale", scale)
        # Overflows are routine while dynamic loss scaling finds its scale.
        if overflow and scale >= 1.0:
            return
        stop_now = self.policy == "stop"
        if stop_now or s.skips_in_a_row >= self.max_skips:
            why = ("--on_nonfinite=stop" if stop_now else
                   f"{s.skips_in_a_row} steps in a row (--max_nonfinite_skips)")
            raise NonFiniteLossError(
                f"non-finite gradients or loss (mean loss {loss}) at step {step} (epoch "
                f"{epoch:.2f}), stopping after {why}: training diverged; lower the learning rate "
                f"(--lr_scale) or the LARS --trust_coefficient"
                + (", or use --precision=float32" if mixed else "")
                + ". The step was not applied"
                + ("; --on_nonfinite=skip would skip isolated bad steps instead" if stop_now
                   else ""))


class MetricAverage(tf.keras.callbacks.Callback):
    """Horovod's MetricAverageCallback for any engine: the epoch's logs averaged over workers
    in one all-reduce (the tf engine has no Horovod runtime)."""

    def __init__(self, state: RunState):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        if logs and self.state.world.size > 1:
            names = sorted(logs)
            sums = self.state.world.sum(tf.constant([float(logs[n]) for n in names],
                                                    tf.float64)).numpy()
            logs.update({n: v / self.state.world.size for n, v in zip(names, sums)})


class _AtEvaluation(tf.keras.callbacks.Callback):
    """Runs at the end of epochs where an evaluation is due: every `every` data epochs and at
    the run's last epoch."""

    def __init__(self, state: RunState, every: float):
        super().__init__()
        self.state, self.every = state, every

    def due(self, epoch: int) -> bool:
        s = self.state
        after = s.epoch_after(epoch)
        return s.finishing or math.floor(after / self.every + 1e-9) > math.floor(
            (after - s.epoch_fraction) / self.every + 1e-9)


class BNStatistics(_AtEvaluation):
    """Before each evaluation, every BN layer's statistics set to those of `batches(epoch)`
    (training micro-batches, current weights) over all workers, in FP32
    (official_resnet/bn_statistics.py)."""

    def __init__(self, state: RunState, batches: Callable[[int], Iterable], every: float = 1.0):
        super().__init__(state, every)
        self.batches = batches

    def on_epoch_end(self, epoch, logs=None):
        if self.due(epoch):
            progress(self.state, "BN statistics")
            bn_statistics.recompute_bn_statistics(self.model, self.batches(epoch),
                                                  self.state.world.allreduce_sum)


class Evaluation(_AtEvaluation):
    """1-crop top-1 on `data()` (this worker's part of the validation split), summed over all
    workers: logs['val_top1']."""

    def __init__(self, state: RunState, data: Callable[[], Iterable], every: float = 1.0):
        super().__init__(state, every)
        self.data, self._step = data, None

    def on_epoch_end(self, epoch, logs=None):
        if not self.due(epoch):
            return
        progress(self.state, "evaluation")
        self._step = self._step or make_eval_step(self.model)
        correct = total = 0.0
        for images, labels in self.data():
            c, n = self._step(images, labels)
            correct, total = correct + float(c), total + float(n)
        sums = self.state.world.sum(tf.constant([correct, total], tf.float64)).numpy()
        if sums[1] == 0:
            raise ValueError("the validation split is empty: check --data_dir")
        logs["val_top1"] = 100.0 * sums[0] / sums[1]


class EpochLogger(tf.keras.callbacks.Callback):
    """One EpochLog per Keras epoch: into state.history, the log (rank 0), history.jsonl."""

    def __init__(self, state: RunState, micro_batch: int):
        super().__init__()
        self.state, self.micro_batch = state, micro_batch

    def on_epoch_end(self, epoch, logs=None):
        s, logs = self.state, logs or {}
        k = micro_batches_per_update(self.model)
        per_worker = k * self.micro_batch
        steps = s.updates_in_epoch
        applied = steps - len(s.skipped_at)
        log = EpochLog(
            epoch=s.epoch(), phase=s.plan_of(epoch).index,  # < the epoch's end after --max_steps
            loss=float(logs.get("loss", math.nan)) if applied else math.nan,
            train_top1=float(logs.get("top1", math.nan)), lr=float(logs.get("lr", math.nan)),
            momentum=float(logs.get("momentum", math.nan)),
            total_batch=per_worker * s.world.size, per_worker_batch=per_worker, accumulation=k,
            images_per_sec=steps * per_worker * s.world.size / max(s.train_seconds, 1e-9),
            elapsed=s.elapsed(), skipped_steps=len(s.skipped_at), skipped_at=list(s.skipped_at),
            top1=float(logs["val_top1"]) if "val_top1" in logs else None)
        s.history.append(log)
        if not s.world.chief:
            return
        top1 = f"top-1 {log.top1:.2f}%" if log.top1 is not None else "top-1 (not evaluated)"
        logger.info(
            "epoch %.2f | loss %.4f | train top-1 %.2f%% | %s | lr %.4g | momentum %.4f | "
            "batch %d total, %d/worker | %.0f images/s | %.0f s%s", log.epoch, log.loss,
            log.train_top1, top1, log.lr, log.momentum, log.total_batch,
            log.per_worker_batch, log.images_per_sec, log.elapsed,
            f" | {log.skipped_steps} step(s) skipped (inf/NaN): steps {log.skipped_at}"
            if log.skipped_steps else "")
        if s.model_dir:
            with open(os.path.join(s.model_dir, "history.jsonl"), "a") as f:
                f.write(json.dumps(dataclasses.asdict(log)) + "\n")


class TensorBoardScalars(tf.keras.callbacks.Callback):
    """Each epoch's loss, top-1 (train, validation), LR, momentum, batch and images/s, with
    samples seen as the step (the batch changes, so steps are no common axis)."""

    def __init__(self, state: RunState, writer):
        super().__init__()
        self.state, self.writer = state, writer

    def on_epoch_end(self, epoch, logs=None):
        if self.writer is None or not self.state.history:
            return
        log = self.state.history[-1]
        with self.writer.as_default(step=int(self.state.samples_seen.numpy())):
            for name, value in dataclasses.asdict(log).items():
                if isinstance(value, (int, float)):  # skipped_at: one point per skip
                    tf.summary.scalar(name, value)
        self.writer.flush()


class CheckpointSaver(tf.keras.callbacks.Callback):
    """Rank 0 writes an atomic, verified checkpoint (official_resnet/checkpointing.py) with
    `state_of(epoch)` as its state.json after every epoch."""

    def __init__(self, state: RunState, writer, state_of: Callable[[int], dict]):
        super().__init__()
        self.state, self.writer, self.state_of = state, writer, state_of

    def on_epoch_end(self, epoch, logs=None):
        if self.writer is not None:
            progress(self.state, "checkpoint", shared=False)  # rank 0 only
            self.writer.save(self.state_of(epoch))


class StopAtEpoch(tf.keras.callbacks.Callback):
    """Ends fit after the Keras epoch that reaches data epoch `stop_at` (--stop_at_epoch, or the
    end of the phases this job's world size runs)."""

    def __init__(self, state: RunState, stop_at: Optional[float]):
        super().__init__()
        self.state, self.stop_at, self.stopped = state, stop_at, False

    def on_epoch_end(self, epoch, logs=None):
        if (self.stop_at is not None and not self.state.finishing
                and self.state.epoch_after(epoch) >= self.stop_at - 1e-9):
            self.model.stop_training = self.stopped = True


@dataclasses.dataclass
class Summary:
    """The paper's Table 5 (accuracy, time) and Table 6 (throughput) for one run."""

    experiment: str
    workers: int
    workers_per_phase: List[int]
    grid: str
    top1_1crop: float
    seconds: float
    epochs: float
    steps: int
    images_per_sec: float
    paper_top1: float
    paper_seconds: float


def run_summary(state: RunState, experiment, grid: str) -> Summary:
    final = state.history[-1]
    rates = [h.images_per_sec for h in state.history[1:]] or [state.history[0].images_per_sec]
    return Summary(experiment=experiment.name, workers=state.world.size,
                   workers_per_phase=[p.workers for p in state.plans], grid=grid,
                   top1_1crop=final.top1, seconds=final.elapsed, epochs=final.epoch,
                   steps=int(state.steps.numpy()), images_per_sec=sum(rates) / len(rates),
                   paper_top1=experiment.paper_top1, paper_seconds=experiment.paper_seconds)


def log_summary(summary: Summary, state: RunState, experiment, path: Optional[str]) -> None:
    """The Table 5 and Table 6 lines; summary.json at `path`."""
    plans = state.plans
    logger.info("Table 5 style | %s | workers %s | batch %d-%d | top-1 1-crop %.2f%% | %.0f s "
                "(paper: %.2f%% in %d s on %d V100)", experiment.name,
                "->".join(str(p.workers) for p in plans) if len({p.workers for p in plans}) > 1
                else str(summary.workers),
                min(p.total_batch for p in plans), max(p.total_batch for p in plans),
                summary.top1_1crop, summary.seconds, experiment.paper_top1,
                experiment.paper_seconds, experiment.max_gpus)
    logger.info("Table 6 style | workers %d | %.1f images/s (mean over epochs after the "
                "first) | %.1f images/s per worker", summary.workers, summary.images_per_sec,
                summary.images_per_sec / summary.workers)
    if path:
        with open(path, "w") as f:
            json.dump(dataclasses.asdict(summary), f, indent=2)
