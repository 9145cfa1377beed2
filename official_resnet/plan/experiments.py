"""The paper's experiments (Table 3, results from Table 5) as data.

Each row gives, per range of epochs, the per-worker batch and the total batch. The total batch is
what the optimizer sees, so it is the contract: a run derives its per-worker batch (and gradient
accumulation) from its own world size. How the table's uneven rows are resolved:

- "K" is 1024 wherever that makes the GPU counts whole: 34K = 34816 = 2176 x 16,
  54K = 55296 = 3456 x 16, 68K = 69632, 85K = 87040, 119K = 121856, 64K = 65536.
- The GPUs a phase uses are total / per-worker batch: Exp. 2 uses 3456 GPUs in epochs 1-30 and
  1728 after; Exp. 3 uses 2048 after epoch 30 (`Experiment.gpus`). By default a run keeps its
  world size and its total batch, and changes the per-worker batch instead; with
  `--gpus_per_phase=paper` each phase runs on the table's GPU count
  (official_resnet/plan/batch_plan.py).
- Exp. 4's 68K at 16 per worker would need 4352 GPUs, more than its 4096. Our reading of that
  phase: 4096 GPUs at 17 per worker (69632 = 4096 x 17); so with `--gpus_per_phase=paper` Exp. 4
  runs on 2176, 4096, 2720 and 3808 GPUs. On one fixed world size, its 85K (87040) and 119K
  (121856) do not divide by 4096 (nor by 2048): a fixed world size must divide every total
  batch, for Exp. 4 a divisor of 17408 = gcd of its batches, e.g. 2176 workers (16, 32, 40, 56
  per worker).
- Table 3 prints a tick in the LS column of Exp. 4, while the text says Exp. 4 uses batch-size
  control alone ("Using only batch-size control technique (Exp. 4 in Table 5)"). We follow the
  text: no label smoothing for Exp. 4 (a flag turns it on).
- The reference row: the paper says only that it uses the LARS paper's settings [10] (32K batch,
  no label smoothing). Our reading: configuration B's schedule (its base LR 29, and 50 after
  epoch 30 as B prints it) with momentum 0.9 at 32K from the batch rule. [10]'s own schedule
  (polynomial decay from its base LR) is not in the paper, so the late LR of this row is a
  reading, not the LARS paper's value.
"""
import dataclasses
from typing import Tuple

K = 1024
PAPER_EPOCHS = 90


@dataclasses.dataclass(frozen=True)
class Phase:
    """Paper epochs [start, end) (the paper's "epoch 1-30" is [0, 30)) with one batch size."""

    start: int
    end: int
    per_worker_batch: int  # as printed in Table 3
    total_batch: int

    @property
    def paper_gpus(self) -> float:
        return self.total_batch / self.per_worker_batch


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    max_gpus: int
    lr_config: str  # 'A' or 'B' (official_resnet.optimizers.schedules)
    label_smoothing: float
    phases: Tuple[Phase, ...]
    paper_top1: float  # Table 5, percent
    paper_seconds: float  # Table 5

    @property
    def total_batches(self) -> Tuple[int, ...]:
        return tuple(p.total_batch for p in self.phases)

    def gpus(self, phase: Phase) -> int:
        """GPUs the phase runs on in the paper: total / per-worker batch, at most max_gpus
        (Exp. 4's 68K at 16 per GPU would need 4352 of its 4096: 4096 at 17 each)."""
        gpus = min(round(phase.paper_gpus), self.max_gpus)
        if phase.total_batch % gpus:
            raise ValueError(f"{self.name}: total batch {phase.total_batch} does not split over "
                             f"{gpus} GPUs")
        return gpus


EXPERIMENTS = {
    "ref": Experiment("Reference", 1024, "B", 0.0, (Phase(0, 90, 32, 32 * K),), 75.40, 505),
    "1": Experiment("Exp. 1", 2176, "A", 0.0,
                    (Phase(0, 30, 16, 34 * K), Phase(30, 90, 32, 68 * K)), 75.03, 224),
    "2": Experiment("Exp. 2", 3456, "B", 0.1,
                    (Phase(0, 30, 16, 54 * K), Phase(30, 90, 32, 54 * K)), 75.29, 122),
    "3": Experiment("Exp. 3", 3456, "B", 0.1,
                    (Phase(0, 30, 16, 54 * K), Phase(30, 90, 32, 64 * K)), 74.62, 115),
    "4": Experiment("Exp. 4", 4096, "A", 0.0,
                    (Phase(0, 30, 16, 34 * K), Phase(30, 45, 16, 68 * K),
                     Phase(45, 75, 32, 85 * K), Phase(75, 90, 32, 119 * K)), 75.23, 129),
}


def get_experiment(name: str) -> Experiment:
    key = str(name).strip().lower()
    if key in ("reference", "0"):
        key = "ref"
    if key not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}: choose one of "
                         f"{', '.join(EXPERIMENTS)} (Table 3 of the paper)")
    return EXPERIMENTS[key]


def with_batch_schedule(experiment: Experiment, spec: str) -> Experiment:
    """The experiment with its batch-size control replaced: `spec` is 'TOTAL@START,...', total
    batches (before --batch_divisor) and the paper epoch (0-90) each starts at, e.g.
    '512@0,1024@30' (half the batch for the first third, as Exp. 2/3 switch at epoch 30)."""
    items = []
    for part in filter(None, (p.strip() for p in str(spec).split(","))):
        total, _, start = part.partition("@")
        try:
            items.append((int(total), float(start or 0)))
        except ValueError:
            raise ValueError(f"--batch_schedule item {part!r} is not TOTAL@START_EPOCH "
                             f"(e.g. 512@0,1024@30)") from None
    starts = [s for _, s in items]
    if not items or starts[0] != 0 or starts != sorted(set(starts)) or starts[-1] >= PAPER_EPOCHS \
            or min(t for t, _ in items) < 1:
        raise ValueError(f"--batch_schedule={spec!r}: give positive total batches with start "
                         f"epochs rising from 0 and below {PAPER_EPOCHS}, e.g. 512@0,1024@30")
    ends = starts[1:] + [PAPER_EPOCHS]
    phases = tuple(Phase(int(s), int(e), t, t) for (t, s), e in zip(items, ends))
    if any(p.start != s for p, (_, s) in zip(phases, items)):
        raise ValueError(f"--batch_schedule={spec!r}: start epochs must be whole paper epochs")
    return dataclasses.replace(experiment, name=f"{experiment.name}, batches {spec}",
                               phases=phases)

