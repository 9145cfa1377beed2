"""The run specification: one training run, resolved once from its configuration.

The flags (flags.config.TrainConfig) say what the user asked for; a `RunSpec` adds what follows
from it, derived here and nowhere else: the experiment with --batch_schedule applied, its total
batches divided by --batch_divisor, the number of workers of each phase (--gpus_per_phase), the
LR scale and the momentum rule's reference batch (the scale-down rule), and the grid. The
trainer, plan mode and the phase launcher (run_scripts/run_experiment.py) all read it; rank 0
writes it beside the checkpoints as run.json (and logs the config, the LR scale, the momentum
reference batch and every phase as it starts).

    spec = RunSpec.from_config(config)
    plans = spec.plans(dataset_size=1281167, world_size=hvd_size)
"""
import dataclasses
import json
from typing import Any, List, Optional, Tuple

from official_resnet.optimizers.schedules import Schedule, lr_overrides
from official_resnet.plan import batch_plan
from official_resnet.plan.experiments import Experiment, get_experiment, with_batch_schedule

RUN_SPEC_FILE = "run.json"


@dataclasses.dataclass(frozen=True)
class RunSpec:
    config: Any  # flags.config.TrainConfig: the flags, checked
    experiment: Experiment  # Table 3's row, with --batch_schedule's batches if given
    phase_workers: Optional[Tuple[int, ...]]  # per phase; None: each on the job's world size
    lr_scale: float  # multiplies the paper's LR schedule (1 / batch_divisor by default)
    reference_batch: float  # the momentum rule's total batch at 0.9, divided with the batches
    total_batches: Tuple[int, ...]  # Table 3's per phase, divided by --batch_divisor

    @classmethod
    def from_config(cls, config) -> "RunSpec":
        """Raises ValueError (PlanError) naming the fix for an experiment that cannot run so."""
        experiment = get_experiment(config.exp)
        if config.batch_schedule:
            experiment = with_batch_schedule(experiment, config.batch_schedule)
        if config.gpus_per_phase == "paper" and config.batch_schedule:
            raise ValueError("--gpus_per_phase=paper follows Table 3's GPU counts, which "
                             "--batch_schedule replaces; give one count per phase instead "
                             "(--gpus_per_phase=W1,W2,...)")
        workers = None
        if config.gpus_per_phase != "fixed":
            workers = batch_plan.phase_workers(experiment, config.gpus_per_phase,
                                               batch_divisor=config.batch_divisor)
        return cls(config=config, experiment=experiment, phase_workers=workers,
                   lr_scale=config.lr_scale,
                   reference_batch=config.reference_batch / config.batch_divisor,
                   total_batches=tuple(batch_plan.divided_totals(experiment,
                                                                 config.batch_divisor)))

    @property
    def fixed(self) -> bool:
        """Every phase on the job's own world size (--gpus_per_phase=fixed)."""
        return self.phase_workers is None

    def workers(self, world_size: Optional[int]) -> Tuple[int, ...]:
        """The world size of each phase; a job of `world_size` workers under 'fixed'."""
        if self.phase_workers is not None:
            return self.phase_workers
        return batch_plan.phase_workers(self.experiment, "fixed", world_size)

    def plans(self, dataset_size: int, world_size: Optional[int] = None
              ) -> List[batch_plan.PhasePlan]:
        """What every worker does in each phase, on a data set of `dataset_size` examples."""
        c = self.config
        return batch_plan.plan_phases(self.experiment, dataset_size=dataset_size,
                                      epochs=c.epochs, batch_divisor=c.batch_divisor,
                                      max_micro_batch=c.max_micro_batch,
                                      workers=self.workers(world_size),
                                      logical_workers=c.logical_workers)

    def schedule(self) -> Schedule:
        """The LR and momentum schedule. The LR is the paper's times lr_scale (1/D for batches
        divided by D); the momentum rule compares the total batch with the paper's 32K divided
        by D too, so a scaled-down run keeps the paper's momentum values."""
        c = self.config
        return Schedule(c.lr_config, total_epochs=c.epochs, lr_scale=self.lr_scale,
                        reference_batch=self.reference_batch,
                        lr_params=lr_overrides(c.lr_config, c.epochs, c.base_lr,
                                               c.warmup_epochs))

    def to_dict(self, world_size: Optional[int] = None) -> dict:
        """What the run resolved to (run.json): the phases with their batches and workers."""
        workers = self.workers(world_size) if world_size or not self.fixed else None
        return {
            "experiment": self.experiment.name,
            "phases": [{"paper_epochs": [p.start, p.end], "total_batch": total,
                        "workers": workers[i] if workers else "the job's"}
                       for i, (p, total) in enumerate(zip(self.experiment.phases,
                                                          self.total_batches))],
            "epochs": self.config.epochs, "batch_divisor": self.config.batch_divisor,
            "lr_config": self.config.lr_config, "lr_scale": self.lr_scale,
            "momentum_reference_batch": self.reference_batch, "grid": self.config.grid,
            "config": dataclasses.asdict(self.config),
        }

    def to_json(self, world_size: Optional[int] = None) -> str:
        return json.dumps(self.to_dict(world_size), indent=2, sort_keys=True)
