"""The trainer's own callbacks (official_resnet/run/trainer.py): they share its RunState, so they
are not for a user's model.fit (official_resnet/run/callbacks.py has those).

    RunProgress      the run's clock: position, optimizer steps, samples seen, training time,
                     the watchdog's note of what this worker does, --max_steps
    NonFiniteSteps   reports every skipped update; stops per --on_nonfinite
    EpochLogger      one EpochLog per Keras epoch: the log line, history.jsonl, TensorBoard
    CheckpointSaver  rank 0's atomic checkpoint after every epoch
    StopAtEpoch      ends fit at --stop_at_epoch or where the next world size starts

Every field of RunState has one writer, named beside the field. RunProgress comes first in the
list: the others read the clock it advances. EpochLogger reads logs that earlier callbacks put
(official_resnet/run/callbacks.py's lr, momentum and val_top1); CheckpointSaver reads the epoch's
log. trainer.make_callbacks orders them so, and tests/test_trainer.py checks it.
"""
import dataclasses
import json
import logging
import math
import os
from typing import Callable, Optional

import tensorflow as tf

from official_resnet.model.keras_generation import KERAS
from official_resnet.run.checkpointing import CheckpointState
from official_resnet.run.run_state import NONFINITE_POLICIES, EpochLog, NonFiniteLossError, RunState
from tftorus.reliability import watchdog
from tftorus.training.batch_size_control import micro_batches_per_update

logger = logging.getLogger(__name__)


def progress(state: RunState, what: str, shared: bool = True) -> None:
    """Tell the watchdog what this worker starts, at the run's place."""
    watchdog.progress(what, state.plan_of(state.keras_epoch).index + 1, round(state.epoch(), 4),
                      int(state.steps.numpy()), shared=shared)


class RunProgress(tf.keras.callbacks.Callback):
    """The run's clock, for the fit of one segment that starts at Keras epoch `first_epoch`
    with `input_batches` micro-batches of its dataset already taken (a resumed run): Keras epoch
    and batch, optimizer steps, samples seen, training time. Ends the run after `max_steps`
    optimizer steps (smoke runs; that epoch is closed as the run's last)."""

    def __init__(self, state: RunState, micro_batch: int, first_epoch: int = 0,
                 input_batches: int = 0, max_steps: Optional[int] = None):
        super().__init__()
        self.state, self.micro_batch, self.max_steps = state, micro_batch, max_steps
        self.first_epoch, self.input_batches = first_epoch, input_batches
        self._updates, self._t0 = 0, 0.0

    def on_train_begin(self, logs=None):
        s = self.state
        s.keras_epoch, s.batch = self.first_epoch, 0
        s.micro_batches_in_segment = self.input_batches
        s.steps_per_epoch = self.params["steps"]
        self._updates = int(self.model.updates.numpy())
        progress(s, "phase set-up")

    def on_epoch_begin(self, epoch, logs=None):
        s = self.state
        s.keras_epoch, s.batch, s.updates_in_epoch = epoch, 0, 0
        s.finishing = epoch + 1 >= s.keras_epochs
        self._t0 = s.elapsed()

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
                                      * s.workers.size)
            if self.max_steps and int(s.steps.numpy()) >= self.max_steps:
                self.model.stop_training = True
                s.finishing = True

    def on_epoch_end(self, epoch, logs=None):
        self.state.train_seconds = self.state.elapsed() - self._t0
        progress(self.state, "epoch metrics")


class NonFiniteSteps(tf.keras.callbacks.Callback):
    """An update whose all-reduced gradients or loss held inf/NaN was skipped on every worker
    (RecipeModel does that): report it with its step, and stop when the policy (or too long a
    run of them) says so. Loss-scale overflows count only once the scale is below 1. The one
    writer of RunState.skips_in_a_row and skipped_at."""

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

    def on_epoch_begin(self, epoch, logs=None):
        self.state.skipped_at = []

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
        scale = KERAS.loss_scale(self.model.optimizer) if mixed else None
        if s.workers.chief:
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


class EpochLogger(tf.keras.callbacks.Callback):
    """One EpochLog per Keras epoch from the clock and the epoch's logs: appended to
    state.history (its one writer); on rank 0 a log line, a line of history.jsonl and
    TensorBoard scalars with samples seen as the step (the batch changes, so steps are no
    common axis)."""

    def __init__(self, state: RunState, micro_batch: int, writer=None):
        super().__init__()
        self.state, self.micro_batch, self.writer = state, micro_batch, writer

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
            total_batch=per_worker * s.workers.size, per_worker_batch=per_worker,
            accumulation=k,
            images_per_sec=steps * per_worker * s.workers.size / max(s.train_seconds, 1e-9),
            elapsed=s.elapsed(), skipped_steps=len(s.skipped_at), skipped_at=list(s.skipped_at),
            top1=float(logs["val_top1"]) if "val_top1" in logs else None)
        s.history.append(log)
        if not s.workers.chief:
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
        if self.writer is not None:
            with self.writer.as_default(step=int(s.samples_seen.numpy())):
                for name, value in dataclasses.asdict(log).items():
                    if isinstance(value, (int, float)):  # skipped_at: one point per skip
                        tf.summary.scalar(name, value)
            self.writer.flush()


class CheckpointSaver(tf.keras.callbacks.Callback):
    """Rank 0 writes an atomic, verified checkpoint (official_resnet/run/checkpointing.py) with
    `state_of(epoch)` as its state.json after every epoch."""

    def __init__(self, state: RunState, writer,
                 state_of: Callable[[int], CheckpointState]):
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
