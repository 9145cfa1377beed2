"""The training loop: phases of the batch plan, samples-keyed schedules, evaluation, checkpoints.

Every schedule is keyed on samples seen (epoch = samples / data-set size), the one unit the loop
counts in: the batch size changes between phases, so steps are not a stable clock. Each phase
rebuilds the input pipeline at its per-worker batch and traces its step once (its gradient
accumulation is fixed within the phase). Before each evaluation the BN statistics are recomputed
from training batches with the current weights, summed over all workers in FP32.
"""
import dataclasses
import json
import logging
import math
import os
import sys
import time
from typing import Callable, List, Optional

import numpy as np
import tensorflow as tf

from official_resnet.batch_plan import PhasePlan, steps_to_boundary
from tftorus import watchdog

logger = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """Non-finite loss or gradients over all workers, and the run is told to stop on them."""


NONFINITE_POLICIES = ("skip", "stop")


@dataclasses.dataclass
class World:
    """Who this process is, and how to sum over all of them."""

    rank: int = 0
    size: int = 1
    allreduce_sum: Optional[Callable[[tf.Tensor], tf.Tensor]] = None  # None: one process

    def sum(self, tensor):
        return tensor if self.allreduce_sum is None else self.allreduce_sum(tensor)

    @property
    def chief(self) -> bool:
        return self.rank == 0


@dataclasses.dataclass
class EpochLog:
    epoch: float
    phase: int
    loss: float
    train_top1: float
    lr: float
    momentum: float
    total_batch: int
    per_worker_batch: int
    accumulation: int
    images_per_sec: float
    elapsed: float
    skipped_steps: int = 0  # steps of this epoch not applied: inf/NaN gradients or loss
    skipped_at: List[int] = dataclasses.field(default_factory=list)  # their step numbers
    top1: Optional[float] = None  # validation, 1-crop, recomputed BN statistics


class Trainer:
    """Runs the whole schedule. Inputs are built by the caller (see run_scripts/train.py)."""

    def __init__(self, *, model, optimizer, lars, train_step, eval_step, plans: List[PhasePlan],
                 schedule, make_train_data: Callable[[PhasePlan], tf.data.Dataset],
                 make_eval_data: Callable[[], tf.data.Dataset], recompute_bn: Callable,
                 dataset_size: int, world: World, model_dir: str, eval_every: float = 1.0,
                 bn_stat_batches: int = 10, max_steps: Optional[int] = None,
                 summary_writer=None, on_nonfinite: str = "skip", max_nonfinite_skips: int = 10,
                 checkpoint_writer=None, checkpoint_extra: Optional[dict] = None,
                 stop_at_epoch: Optional[float] = None):
        self.model, self.optimizer, self.lars = model, optimizer, lars
        self.train_step, self.eval_step = train_step, eval_step
        self.plans, self.schedule = plans, schedule
        self.make_train_data, self.make_eval_data = make_train_data, make_eval_data
        self.recompute_bn = recompute_bn
        self.dataset_size, self.world, self.model_dir = dataset_size, world, model_dir
        self.eval_every, self.bn_stat_batches, self.max_steps = eval_every, bn_stat_batches, max_steps
        self.writer = summary_writer
        if on_nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"on_nonfinite must be one of {NONFINITE_POLICIES}, got "
                             f"{on_nonfinite!r}")
        self.on_nonfinite, self.max_nonfinite_skips = on_nonfinite, max_nonfinite_skips
        self.skips_in_a_row = 0  # non-finite steps skipped in a row (checkpointed)
        self.elapsed_before = 0.0  # training seconds of the run before a resume (checkpointed)
        self.samples_seen = tf.Variable(0, dtype=tf.int64, trainable=False, name="samples_seen")
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                              samples_seen=self.samples_seen, steps=self.steps)
        self.history: List[EpochLog] = []
        self._phase = None  # 1-based phase in progress (for the watchdog's messages)
        self._step_fns = {}  # traced train steps by accumulation
        # Checkpoints and resume (official_resnet/checkpointing.py): the writer (rank 0), the
        # run's constants for state.json, and the input position: per-worker batches this worker
        # took from the current phase's (deterministic) dataset, training steps plus BN batches.
        self.checkpoint_writer, self.checkpoint_extra = checkpoint_writer, checkpoint_extra or {}
        if checkpoint_writer is not None and checkpoint_writer.checkpoint is None:
            checkpoint_writer.checkpoint = self.checkpoint
        self.stop_at_epoch, self.stopped_early = stop_at_epoch, False
        self.batches_in_phase = 0
        self._resume_position = None  # (phase index, batches to skip) after resume()

    # ----------------------------------------------------------------------------------------
    def epoch(self) -> float:
        return int(self.samples_seen.numpy()) / self.dataset_size

    def set_hyperparameters(self, plan: PhasePlan):
        """LR and momentum for the current fractional epoch and the total batch in force."""
        epoch = self.epoch()
        lr = self.schedule.lr(epoch)
        momentum = self.schedule.momentum(epoch, plan.total_batch)
        self.lars.learning_rate.assign(lr)
        self.lars.momentum.assign(momentum)
        return lr, momentum

    def _progress(self, what: str, shared: bool = True):
        """Tell the watchdog (tftorus/watchdog.py) what this worker starts now."""
        watchdog.progress(what, self._phase, round(self.epoch(), 4), int(self.steps.numpy()),
                          shared=shared)

    def evaluate(self, train_iterator, plan: PhasePlan) -> float:
        self._progress("BN statistics")
        batches = [next(train_iterator) for _ in range(self.bn_stat_batches)]
        self.batches_in_phase += self.bn_stat_batches
        # In the phase's micro-batches: training normalised over those, not the whole batch
        micro = [m for images, _ in batches for m in tf.split(images, plan.accumulation)]
        self.recompute_bn(self.model, micro, self.world.allreduce_sum)
        correct = total = 0.0
        self._progress("evaluation")
        for images, labels in self.make_eval_data():
            c, n = self.eval_step(images, labels)
            correct, total = correct + float(c), total + float(n)
        sums = self.world.sum(tf.constant([correct, total], tf.float64)).numpy()
        if sums[1] == 0:
            raise ValueError("the validation split is empty: check --data_dir")
        return 100.0 * sums[0] / sums[1]

    # ----------------------------------------------------------------------------------------
    def run(self) -> List[EpochLog]:
        start = time.monotonic() - self.elapsed_before  # a resumed run's clock continues
        end_epoch = self.plans[-1].end_epoch
        next_eval = self.eval_every
        while next_eval <= self.epoch() + 1e-9:  # resumed: the next evaluation after it
            next_eval += self.eval_every
        for plan in self.plans:
            if self.epoch() >= plan.end_epoch - 1e-9:
                continue  # resumed past this phase
            if plan.workers != self.world.size:  # train.py stops at such a boundary first
                raise ValueError(f"phase {plan.index + 1} runs on {plan.workers} workers; this "
                                 f"job has {self.world.size}: relaunch it with -np "
                                 f"{plan.workers} (run_scripts/run_experiment.py does)")
            self._phase = plan.index + 1
            self._progress("phase set-up")
            if plan.accumulation not in self._step_fns:  # phases alike in it share a trace
                self._step_fns[plan.accumulation] = self.train_step.build(plan.accumulation)
            step_fn = self._step_fns[plan.accumulation]
            skip = 0
            if self._resume_position and self._resume_position[0] == plan.index:
                skip = self._resume_position[1]  # resumed inside this phase
            iterator = iter(self.make_train_data(plan, skip) if skip else
                            self.make_train_data(plan))
            self.batches_in_phase = skip
            self._log_phase(plan)
            while self.epoch() < plan.end_epoch - 1e-9:
                epoch_start, t0 = self.epoch(), time.monotonic()
                steps = steps_to_boundary(epoch_start, plan, self.dataset_size)
                progbar = tf.keras.utils.Progbar(steps, verbose=1 if sys.stdout.isatty() else 2,
                                                 unit_name="step") if self.world.chief else None
                loss_sum = correct = 0.0
                skipped_at = []
                for i in range(steps):
                    self._progress("train step")
                    lr, momentum = self.set_hyperparameters(plan)
                    images, labels = next(iterator)
                    self.batches_in_phase += 1
                    loss, c, applied = step_fn(images, labels)
                    loss = float(loss)
                    self.samples_seen.assign_add(plan.total_batch)
                    self.steps.assign_add(1)
                    if not bool(applied) or not math.isfinite(loss):
                        skipped_at.append(int(self.steps.numpy()))
                        self._nonfinite_step(loss, mixed_precision=self.optimizer is not self.lars)
                    else:
                        self.skips_in_a_row = 0
                    if math.isfinite(loss):
                        loss_sum, correct = loss_sum + loss, correct + float(c)
                    if progbar:
                        progbar.update(i + 1, [("loss", loss), ("lr", lr)])
                    if self.max_steps and int(self.steps.numpy()) >= self.max_steps:
                        break
                seconds = time.monotonic() - t0
                self._progress("epoch metrics")
                train = self.world.sum(tf.constant([correct, (i + 1) * plan.per_worker_batch],
                                                   tf.float64)).numpy()
                applied_steps = i + 1 - len(skipped_at)
                log = EpochLog(epoch=self.epoch(), phase=plan.index,  # loss: of applied steps
                               loss=loss_sum / applied_steps if applied_steps else math.nan,
                               skipped_steps=len(skipped_at), skipped_at=skipped_at,
                               train_top1=100.0 * train[0] / train[1], lr=lr, momentum=momentum,
                               total_batch=plan.total_batch,
                               per_worker_batch=plan.per_worker_batch,
                               accumulation=plan.accumulation,
                               images_per_sec=(i + 1) * plan.total_batch / seconds,
                               elapsed=time.monotonic() - start)
                done = self.epoch() >= end_epoch - 1e-9 or (
                    self.max_steps and int(self.steps.numpy()) >= self.max_steps)
                if self.epoch() >= next_eval - 1e-9 or done:
                    log.top1 = self.evaluate(iterator, plan)
                    while next_eval <= self.epoch() + 1e-9:
                        next_eval += self.eval_every
                self._end_epoch(log)
                if (not done and self.stop_at_epoch is not None
                        and self.epoch() >= self.stop_at_epoch - 1e-9):
                    self.stopped_early = done = True
                    if self.world.chief:
                        logger.info("stopping after epoch %.3f (--stop_at_epoch=%g); resume with "
                                    "--resume=auto", self.epoch(), self.stop_at_epoch)
                if done:
                    return self.history
        return self.history

    # ----------------------------------------------------------------------------------------
    def _nonfinite_step(self, loss: float, mixed_precision: bool):
        """A step whose all-reduced gradients or loss held inf/NaN was skipped on every worker:
        report it with the step, and stop when the policy (or too long a run of them) says so."""
        step, epoch = int(self.steps.numpy()), self.epoch()
        self.skips_in_a_row += 1
        overflow = mixed_precision and math.isfinite(loss)  # FP16 gradients overflowed
        if self.world.chief:
            scale = (f"; loss scale lowered to {float(self.optimizer.loss_scale):g}"
                     if mixed_precision else "")
            logger.warning("step %d (epoch %.2f): %s over all workers; the step was skipped "
                           "(%d in a row)%s", step, epoch,
                           "FP16 gradients overflowed" if overflow else
                           f"non-finite gradients or loss ({loss})", self.skips_in_a_row, scale)
            if self.writer is not None:  # one point per skipped step, at its place in training
                with self.writer.as_default(step=int(self.samples_seen.numpy())):
                    tf.summary.scalar("skipped_step", step)
                    if mixed_precision:
                        tf.summary.scalar("loss_scale", float(self.optimizer.loss_scale))
        # Loss-scale overflows are routine while dynamic loss scaling finds its scale; they
        # count against the limit only once the scale is below 1 (then FP16 cannot help).
        if overflow and float(self.optimizer.loss_scale) >= 1.0:
            return
        stop_now = self.on_nonfinite == "stop"
        if stop_now or self.skips_in_a_row >= self.max_nonfinite_skips:
            why = ("--on_nonfinite=stop" if stop_now else
                   f"{self.skips_in_a_row} steps in a row (--max_nonfinite_skips)")
            raise NonFiniteLossError(
                f"non-finite gradients or loss (mean loss {loss}) at step {step} (epoch "
                f"{epoch:.2f}), stopping after {why}: training diverged; lower the learning rate "
                f"(--lr_scale) or the LARS --trust_coefficient"
                + (", or use --precision=float32" if mixed_precision else "")
                + ". The step was not applied"
                + ("; --on_nonfinite=skip would skip isolated bad steps instead" if stop_now
                   else ""))

    def resume(self, state: dict):
        """Continue from a restored checkpoint's state.json (the variables, samples_seen and steps
        were restored by checkpointing.restore). Inside a phase on the same world size, the
        phase's dataset is rebuilt and the batches this worker already took are skipped."""
        if not state.get("phase_boundary") and state["world_size"] == self.world.size:
            self._resume_position = (state["phase"], state["input_batches_in_phase"])
        # absent in checkpoints of older versions: then the clock and the count start again
        self.elapsed_before = float(state.get("elapsed", 0.0))
        self.skips_in_a_row = int(state.get("nonfinite_skips_in_a_row", 0))
        if self.world.chief:
            logger.info("resumed at epoch %.3f (%d samples, step %d) from phase %d%s",
                        self.epoch(), int(self.samples_seen.numpy()), int(self.steps.numpy()),
                        state["phase"] + 1,
                        f", skipping {self._resume_position[1]} input batches per worker"
                        if self._resume_position else " (its end: a phase boundary)")

    def checkpoint_state(self, log: EpochLog) -> dict:
        """state.json of the checkpoint written after `log`'s epoch."""
        plan = self.plans[log.phase]
        return dict(self.checkpoint_extra, epoch=self.epoch(),
                    samples_seen=int(self.samples_seen.numpy()), steps=int(self.steps.numpy()),
                    phase=plan.index, phase_boundary=bool(self.epoch() >= plan.end_epoch - 1e-9),
                    world_size=self.world.size, total_batch=plan.total_batch,
                    per_worker_batch=plan.per_worker_batch, accumulation=plan.accumulation,
                    input_batches_in_phase=self.batches_in_phase,
                    bn_stat_batches=self.bn_stat_batches, elapsed=log.elapsed,
                    nonfinite_skips_in_a_row=self.skips_in_a_row)

    def _log_phase(self, plan: PhasePlan):
        if self.world.chief:
            logger.info(
                "phase %d: epochs %.2f-%.2f, total batch %d = %d workers x %d per worker "
                "(%d micro-batch%s of %d), %d steps/epoch; from epoch %.3f: lr %.4g, momentum "
                "%.4f", plan.index + 1, plan.start_epoch,
                plan.end_epoch, plan.total_batch, plan.workers, plan.per_worker_batch,
                plan.accumulation, "es" if plan.accumulation > 1 else "", plan.micro_batch,
                plan.steps_per_epoch, self.epoch(), self.schedule.lr(self.epoch()),
                self.schedule.momentum(self.epoch(), plan.total_batch))

    def _end_epoch(self, log: EpochLog):
        self.history.append(log)
        if not self.world.chief:
            return
        top1 = f"top-1 {log.top1:.2f}%" if log.top1 is not None else "top-1 (not evaluated)"
        logger.info(
            "epoch %.2f | loss %.4f | train top-1 %.2f%% | %s | lr %.4g | momentum %.4f | "
            "batch %d total, %d/worker | %.0f images/s | %.0f s%s", log.epoch, log.loss,
            log.train_top1, top1, log.lr, log.momentum, log.total_batch,
            log.per_worker_batch, log.images_per_sec, log.elapsed,
            f" | {log.skipped_steps} step(s) skipped (inf/NaN): steps {log.skipped_at}"
            if log.skipped_steps else "")
        if self.writer is not None:
            with self.writer.as_default(step=int(self.samples_seen.numpy())):
                for name, value in dataclasses.asdict(log).items():
                    if isinstance(value, (int, float)):  # skipped_at: one point per skip
                        tf.summary.scalar(name, value)
            self.writer.flush()
        self._progress("checkpoint", shared=False)  # rank 0 only
        if self.checkpoint_writer is not None:
            self.checkpoint_writer.save(self.checkpoint_state(log))
        else:
            self.checkpoint.save(os.path.join(self.model_dir, "checkpoints", "ckpt"))
        with open(os.path.join(self.model_dir, "history.jsonl"), "a") as f:
            f.write(json.dumps(dataclasses.asdict(log)) + "\n")
