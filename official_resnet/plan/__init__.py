"""What a run will do, decided before it starts: the paper's experiments (Table 3 as data), each
phase's workers and batches, the run specification resolved from the flags, and the plan
`train.py --plan_only` prints. Plain Python, no TensorFlow; imports optimizers (the schedules)
and data (sharding, record counts)."""
from official_resnet.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "EXPERIMENTS": "experiments", "Experiment": "experiments", "get_experiment": "experiments",
    "PhasePlan": "batch_plan", "PlanError": "batch_plan", "plan_phases": "batch_plan",
    "RunSpec": "run_spec",
})
