"""What the training callbacks share: who this worker is, the run's clock, and its history.

Keras counts epochs and batches; the recipe counts data epochs and samples. A Keras epoch here
is `epoch_fraction` of a data epoch (1, or 1/2, 1/3, ... so that every phase boundary of the
batch plan falls on a Keras epoch boundary), and one Keras step is one micro-batch. Within one
`fit` the micro-batch is fixed, so samples seen grow linearly with the step: the schedules'
epoch, `(keras_epoch + batch / steps_per_epoch) * epoch_fraction`, is the samples seen in units
of the run's epochs.
"""
import dataclasses
import math
import time
from typing import List, Optional

import tensorflow as tf

from official_resnet.plan.batch_plan import PhasePlan, phase_at
from official_resnet.run.workers import Workers


class NonFiniteLossError(FloatingPointError):
    """Non-finite loss or gradients over all workers, and the run is told to stop on them."""


NONFINITE_POLICIES = ("skip", "stop")


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
    skipped_steps: int = 0  # updates of this epoch not applied: inf/NaN gradients or loss
    skipped_at: List[int] = dataclasses.field(default_factory=list)  # their update numbers
    top1: Optional[float] = None  # validation, 1-crop, recomputed BN statistics


def epochs_per_keras_epoch(plans: List[PhasePlan], limit: int = 12) -> float:
    """The largest 1/s (s <= limit) that puts every phase boundary on a whole Keras epoch."""
    for s in range(1, limit + 1):
        if all(abs(p.end_epoch * s - round(p.end_epoch * s)) < 1e-6 for p in plans):
            return 1.0 / s
    raise ValueError(f"the phases end at epochs {[round(p.end_epoch, 4) for p in plans]}, not "
                     f"on a 1/{limit} epoch grid: choose --epochs so that the paper's epochs "
                     f"30, 45 and 75 of 90 map to simple fractions (e.g. a multiple of 6)")


@dataclasses.dataclass
class RunState:
    """The run as the trainer's callbacks (official_resnet/run/run_callbacks.py) see it. Each field
    is written by the one named beside it; the trainer sets the rest when it builds the state
    (from the checkpoint it resumes). samples_seen and steps (optimizer updates, skipped ones
    included) are variables: they go into every checkpoint."""

    workers: Workers
    plans: List[PhasePlan]
    dataset_size: int
    epoch_fraction: float = 1.0
    model_dir: Optional[str] = None
    elapsed_before: float = 0.0  # training seconds before a resume (checkpointed)
    skips_in_a_row: int = 0  # NonFiniteSteps: non-finite updates skipped in a row (checkpointed)
    skipped_at: List[int] = dataclasses.field(default_factory=list)  # NonFiniteSteps: this epoch's
    history: List[EpochLog] = dataclasses.field(default_factory=list)  # EpochLogger
    # RunProgress, the clock:
    samples_seen: tf.Variable = None
    steps: tf.Variable = None
    keras_epoch: int = 0  # the Keras epoch in progress (counted over the whole run)
    batch: int = 0  # its micro-batch in progress
    steps_per_epoch: int = 1  # micro-batches per Keras epoch in the running fit
    micro_batches_in_segment: int = 0  # input position: taken from the fit's dataset
    updates_in_epoch: int = 0
    train_seconds: float = 0.0  # of the Keras epoch just finished, training steps only
    finishing: bool = False  # this epoch is the run's last (end of schedule or --max_steps)
    started: float = dataclasses.field(default_factory=time.monotonic)

    def __post_init__(self):
        if self.samples_seen is None:
            self.samples_seen = tf.Variable(0, dtype=tf.int64, trainable=False,
                                            name="samples_seen")
        if self.steps is None:
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")

    @property
    def keras_epochs(self) -> int:
        return round(self.plans[-1].end_epoch / self.epoch_fraction)

    def epoch(self) -> float:
        """Data epochs done, from the position in the running Keras epoch."""
        return (self.keras_epoch + self.batch / self.steps_per_epoch) * self.epoch_fraction

    def epoch_after(self, keras_epoch: int) -> float:
        return (keras_epoch + 1) * self.epoch_fraction

    def plan_of(self, keras_epoch: int) -> PhasePlan:
        return phase_at(self.plans, keras_epoch * self.epoch_fraction)

    def elapsed(self) -> float:
        return time.monotonic() - self.started + self.elapsed_before

    def is_phase_end(self, keras_epoch: int) -> bool:
        return math.isclose(self.epoch_after(keras_epoch),
                            self.plan_of(keras_epoch).end_epoch, abs_tol=1e-6)
