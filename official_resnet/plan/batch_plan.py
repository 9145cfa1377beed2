"""Batch-size control: turn an experiment's phases into what each worker does per phase.

The total batch of each phase is the contract. Each phase runs on W workers: by default the
job's own world size in every phase ('fixed': keep W and the total batch, change the per-worker
batch and accumulate when needed), or Table 3's GPU count of the phase ('paper': the per-worker
batch of the table, 16 then 32, as the paper ran it), or a list given per phase (`phase_workers`).
For a data set of D examples and a run of E epochs (the paper's 90 mapped proportionally onto
E), each phase gets
  per-worker batch  = total / W                        (must divide: a clear error otherwise)
  accumulation      = ceil(per-worker / cap)           (micro-batches per optimizer step)
  micro-batch       = per-worker / accumulation        (must divide as well)
  steps per epoch   = D // total                       (optimizer steps; schedules use samples)
Scaled-down runs divide every total batch by `batch_divisor` (e.g. 256 on the embedded data);
'paper' then divides Table 3's GPU counts by it too, keeping the table's per-worker batches.
"""
import dataclasses
import math
from typing import List, Optional, Sequence, Tuple

from official_resnet.plan.experiments import PAPER_EPOCHS, Experiment


class PlanError(ValueError):
    """An experiment that cannot be mapped onto this world size or data set."""


@dataclasses.dataclass(frozen=True)
class PhasePlan:
    index: int
    workers: int  # world size the phase runs on
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


GPUS_PER_PHASE_HELP = ("fixed (every phase on the job's world size), paper (Table 3's GPU count "
                      "of each phase, divided by --batch_divisor), or one count per phase, "
                      "e.g. 4,2")


def phase_workers(experiment: Experiment, spec: str, world_size: Optional[int] = None,
                  batch_divisor: int = 1) -> Tuple[int, ...]:
    """The world size of each phase under --gpus_per_phase=`spec` (see GPUS_PER_PHASE_HELP);
    'fixed' needs the job's `world_size`."""
    spec = str(spec or "fixed").strip().lower()
    n = len(experiment.phases)
    if spec == "fixed":
        if world_size is None:
            raise PlanError("--gpus_per_phase=fixed runs every phase on the job's world size: "
                            "give the number of workers (--num_workers in plan mode)")
        return (world_size,) * n
    if spec == "paper":
        gpus = [experiment.gpus(p) for p in experiment.phases]
        if any(g % batch_divisor for g in gpus):
            raise PlanError(
                f"--gpus_per_phase=paper: {experiment.name} runs on {gpus} GPUs, which "
                f"--batch_divisor={batch_divisor} does not divide; use a divisor of "
                f"{math.gcd(*gpus)} (e.g. {_divisors_hint(math.gcd(*gpus), 1024)}), or give the "
                f"counts per phase (--gpus_per_phase=" + ",".join(["W"] * n) + ")")
        return tuple(g // batch_divisor for g in gpus)
    try:
        counts = tuple(int(c) for c in spec.split(","))
    except ValueError:
        counts = ()
    if len(counts) != n or min(counts, default=0) < 1:
        raise PlanError(f"--gpus_per_phase={spec!r}: {experiment.name} has {n} phase(s); give "
                        f"{GPUS_PER_PHASE_HELP}")
    return counts


def divided_totals(experiment: Experiment, batch_divisor: int) -> List[int]:
    """The experiment's total batches divided by batch_divisor; PlanError when one does not."""
    for phase in experiment.phases:
        if phase.total_batch % batch_divisor:
            raise PlanError(f"{experiment.name}: total batch {phase.total_batch} of epochs "
                            f"{phase.start + 1}-{phase.end} does not divide by batch_divisor "
                            f"{batch_divisor}; use a power of two up to 1024")
    return [p.total_batch // batch_divisor for p in experiment.phases]


def plan_phases(experiment: Experiment, *, world_size: Optional[int] = None, dataset_size: int,
                epochs: float = PAPER_EPOCHS, batch_divisor: int = 1,
                max_micro_batch: Optional[int] = None,
                workers: Optional[Sequence[int]] = None,
                logical_workers: Optional[int] = None) -> List[PhasePlan]:
    """Per-phase batches, every phase on `world_size` workers or phase i on `workers[i]`;
    raises PlanError naming the fix. logical_workers: each worker stands in for
    logical_workers / its world size of them, one micro-batch each (so the micro-batch is a
    logical worker's batch, or a divisor of it under max_micro_batch)."""
    if workers is None:
        workers = (world_size or 0,) * len(experiment.phases)
    if len(workers) != len(experiment.phases):
        raise PlanError(f"{experiment.name} has {len(experiment.phases)} phases, got world "
                        f"sizes for {len(workers)}")
    fixed = len(set(workers)) == 1
    if min(workers) < 1 or dataset_size < 1 or epochs <= 0 or batch_divisor < 1:
        raise PlanError(f"world_size, dataset_size, epochs and batch_divisor must be positive "
                        f"(got {list(workers)}, {dataset_size}, {epochs}, {batch_divisor})")
    if max_micro_batch is not None and max_micro_batch < 1:
        raise PlanError(f"max_micro_batch must be >= 1, got {max_micro_batch}")
    scale = epochs / PAPER_EPOCHS  # paper epoch -> run epoch
    plans = []
    for i, (phase, total) in enumerate(zip(experiment.phases,
                                           divided_totals(experiment, batch_divisor))):
        world_size = workers[i]
        if total % world_size:
            totals = [b // batch_divisor for b in experiment.total_batches]
            common = math.gcd(*totals)
            near = [d for d in range(1, common + 1) if common % d == 0 and d <= world_size][-4:]
            raise PlanError(
                f"{experiment.name}: the total batch {total} of epochs {phase.start + 1}-"
                f"{phase.end} does not split over {world_size} workers. "
                + (f"On one world size for every phase, the number of workers must divide "
                   f"every total batch of the experiment ({totals}, gcd {common}): e.g. "
                   f"{', '.join(map(str, near))} workers; or run each phase on Table 3's GPU "
                   f"count with --gpus_per_phase=paper" if fixed else
                   f"Give phase {i + 1} a number of workers that divides {total}"))
        per_worker = total // world_size
        cap = max_micro_batch
        if logical_workers is not None:
            if logical_workers % world_size or total % logical_workers:
                raise PlanError(
                    f"{experiment.name}: {world_size} workers cannot stand in for "
                    f"--logical_workers={logical_workers} at the total batch {total}: the "
                    f"logical workers must be a multiple of the world size and divide the "
                    f"total batch")
            cap = min(cap or total, total // logical_workers)
        fewest = 1 if cap is None else -(-per_worker // cap)
        accumulation = fewest
        while per_worker % accumulation:  # smallest accumulation giving equal micro-batches
            accumulation += 1
        if logical_workers is not None and (total // logical_workers) % (per_worker //
                                                                          accumulation):
            raise PlanError(
                f"{experiment.name}: a logical worker's batch {total // logical_workers} does "
                f"not split into micro-batches of {per_worker // accumulation}: set "
                f"--max_micro_batch to a divisor of {total // logical_workers}")
        if accumulation > fewest and 2 * (per_worker // accumulation) <= (cap or per_worker):
            # e.g. 17 per worker under a cap of 16: only 17 micro-batches of 1 are equal
            fits = [d for d in range(1, per_worker + 1) if per_worker % d == 0]
            raise PlanError(
                f"{experiment.name}: the per-worker batch {per_worker} of epochs "
                f"{phase.start + 1}-{phase.end} splits into equal micro-batches of at most "
                f"{cap} only as {accumulation} x {per_worker // accumulation}, far "
                f"below the cap; set --max_micro_batch to one of {fits} (a micro-batch size "
                f"that divides {per_worker}), or run with a number of workers that gives a "
                f"per-worker batch with more divisors")
        steps = dataset_size // total
        if steps < 1:
            raise PlanError(f"{experiment.name}: the total batch {total} is larger than the "
                            f"data set ({dataset_size} examples); raise batch_divisor")
        plans.append(PhasePlan(index=i, workers=world_size, start_epoch=phase.start * scale,
                               end_epoch=phase.end * scale, total_batch=total,
                               per_worker_batch=per_worker, accumulation=accumulation,
                               micro_batch=per_worker // accumulation, steps_per_epoch=steps))
    return plans


def phase_at(plans: List[PhasePlan], epoch: float) -> PhasePlan:
    """The phase run epoch `epoch` is in; at a boundary (up to float error) the one it starts;
    past the end the last."""
    at = epoch + 1e-9
    return next((p for p in plans if p.start_epoch - 1e-9 <= at < p.end_epoch), plans[-1])


def steps_to_boundary(epoch: float, plan: PhasePlan, dataset_size: int) -> int:
    """Whole optimizer steps from `epoch` to the next epoch boundary or the phase's end, enough
    to reach it (never a 1-step sliver after it): one unit of the trainer's loop."""
    stop_at = min(plan.end_epoch, math.floor(epoch + 1e-9) + 1.0)
    return max(1, math.ceil((stop_at - epoch) * dataset_size / plan.total_batch - 1e-9))


def steps_in_phases(plans: List[PhasePlan], dataset_size: int) -> List[int]:
    """Optimizer steps of each phase as the trainer takes them (samples seen are the clock)."""
    samples, out = 0, []
    for plan in plans:
        steps = 0
        while samples / dataset_size < plan.end_epoch - 1e-9:
            chunk = steps_to_boundary(samples / dataset_size, plan, dataset_size)
            samples += chunk * plan.total_batch
            steps += chunk
        out.append(steps)
    return out


@dataclasses.dataclass(frozen=True)
class FitSegment:
    """Consecutive phases on one world size with one micro-batch: one dataset, one `fit`.

    A Keras epoch is `epoch_fraction` of a data epoch; the segment runs Keras epochs
    [first_epoch, end_epoch) of `steps_per_epoch` micro-batches each, a multiple of every
    phase's accumulation (updates never straddle an epoch)."""

    phases: Tuple[PhasePlan, ...]
    first_epoch: int
    end_epoch: int
    micro_batch: int
    steps_per_epoch: int

    @property
    def workers(self) -> int:
        return self.phases[0].workers


def fit_segments(plans: List[PhasePlan], dataset_size: int,
                 epoch_fraction: float) -> List[FitSegment]:
    """The run's phases grouped into fits: a new fit where the world size or the micro-batch
    changes (a dataset's batch is fixed; the micro-batches per update are not)."""
    groups: List[List[PhasePlan]] = []
    for plan in plans:
        last = groups[-1][-1] if groups else None
        if last and (last.workers, last.micro_batch) == (plan.workers, plan.micro_batch):
            groups[-1].append(plan)
        else:
            groups.append([plan])
    segments = []
    for group in groups:
        lcm = math.lcm(*(p.accumulation for p in group))
        per_step = group[0].workers * group[0].micro_batch
        steps = int(dataset_size * epoch_fraction) // (per_step * lcm) * lcm
        if steps < 1:
            raise PlanError(f"phase {group[0].index + 1}: a Keras epoch ({epoch_fraction:g} of "
                            f"{dataset_size} examples) holds no update of {per_step * lcm} "
                            f"examples; use more data or a larger --batch_divisor")
        segments.append(FitSegment(tuple(group), round(group[0].start_epoch / epoch_fraction),
                                   round(group[-1].end_epoch / epoch_fraction),
                                   group[0].micro_batch, steps))
    return segments
