"""Batch-size control: turn an experiment's phases into what each worker does per phase.

The total batch of each phase is the contract. For a run of W workers over a data set of D
examples, lasting E epochs (the paper's 90 epochs mapped proportionally onto E), each phase gets
  per-worker batch  = total / W                        (must divide: a clear error otherwise)
  accumulation      = ceil(per-worker / cap)           (micro-batches per optimizer step)
  micro-batch       = per-worker / accumulation        (must divide as well)
  steps per epoch   = D // total                       (optimizer steps; schedules use samples)
Scaled-down runs divide every total batch by `batch_divisor` (e.g. 256 on the embedded data).
"""
import dataclasses
import math
from typing import List, Optional

from flags.experiments import PAPER_EPOCHS, Experiment


class PlanError(ValueError):
    """An experiment that cannot be mapped onto this world size or data set."""


@dataclasses.dataclass(frozen=True)
class PhasePlan:
    index: int
    start_epoch: float  # run epochs [start, end)
    end_epoch: float
    total_batch: int  # examples per optimizer step over all workers
    per_worker_batch: int  # examples per optimizer step on one worker
    accumulation: int  # micro-batches per optimizer step
    micro_batch: int  # examples per forward/backward pass on one worker
    steps_per_epoch: int  # optimizer steps per epoch

    @property
    def epochs(self) -> float:
        return self.end_epoch - self.start_epoch


def _divisors_hint(total: int, limit: int = 16) -> str:
    return ", ".join(str(d) for d in range(1, limit + 1) if total % d == 0)


def plan_phases(experiment: Experiment, *, world_size: int, dataset_size: int,
                epochs: float = PAPER_EPOCHS, batch_divisor: int = 1,
                max_micro_batch: Optional[int] = None) -> List[PhasePlan]:
    """Per-phase batches for `world_size` workers; raises PlanError naming the fix."""
    if world_size < 1 or dataset_size < 1 or epochs <= 0 or batch_divisor < 1:
        raise PlanError(f"world_size, dataset_size, epochs and batch_divisor must be positive "
                        f"(got {world_size}, {dataset_size}, {epochs}, {batch_divisor})")
    if max_micro_batch is not None and max_micro_batch < 1:
        raise PlanError(f"max_micro_batch must be >= 1, got {max_micro_batch}")
    scale = epochs / PAPER_EPOCHS  # paper epoch -> run epoch
    plans = []
    for i, phase in enumerate(experiment.phases):
        if phase.total_batch % batch_divisor:
            raise PlanError(f"{experiment.name}: total batch {phase.total_batch} of epochs "
                            f"{phase.start + 1}-{phase.end} does not divide by batch_divisor "
                            f"{batch_divisor}; use a power of two up to 1024")
        total = phase.total_batch // batch_divisor
        if total % world_size:
            raise PlanError(
                f"{experiment.name}: the total batch {total} of epochs {phase.start + 1}-"
                f"{phase.end} does not split over {world_size} workers; run with a number of "
                f"workers that divides every total batch of the experiment "
                f"({[b // batch_divisor for b in experiment.total_batches]}), "
                f"e.g. one of: {_divisors_hint(math.gcd(*[b // batch_divisor for b in experiment.total_batches]))}")
        per_worker = total // world_size
        fewest = 1 if max_micro_batch is None else -(-per_worker // max_micro_batch)
        accumulation = fewest
        while per_worker % accumulation:  # smallest accumulation giving equal micro-batches
            accumulation += 1
        if accumulation > fewest and 2 * (per_worker // accumulation) <= max_micro_batch:
            # e.g. 17 per worker under a cap of 16: only 17 micro-batches of 1 are equal
            fits = [d for d in range(1, per_worker + 1) if per_worker % d == 0]
            raise PlanError(
                f"{experiment.name}: the per-worker batch {per_worker} of epochs "
                f"{phase.start + 1}-{phase.end} splits into equal micro-batches of at most "
                f"{max_micro_batch} only as {accumulation} x {per_worker // accumulation}, far "
                f"below the cap; set --max_micro_batch to one of {fits} (a micro-batch size "
                f"that divides {per_worker}), or run with a number of workers that gives a "
                f"per-worker batch with more divisors")
        steps = dataset_size // total
        if steps < 1:
            raise PlanError(f"{experiment.name}: the total batch {total} is larger than the "
                            f"data set ({dataset_size} examples); raise batch_divisor")
        plans.append(PhasePlan(index=i, start_epoch=phase.start * scale,
                               end_epoch=phase.end * scale, total_batch=total,
                               per_worker_batch=per_worker, accumulation=accumulation,
                               micro_batch=per_worker // accumulation, steps_per_epoch=steps))
    return plans


def phase_at(plans: List[PhasePlan], epoch: float) -> PhasePlan:
    for p in plans:
        if p.start_epoch <= epoch < p.end_epoch:
            return p
    return plans[-1]
