"""The training run: the trainer (`train`, `plan_text`), its callbacks over the run state, its
checkpoints and summary; the recipe's callbacks for any `model.fit`; the workers. Top layer:
imports plan, model, optimizers and data."""
from official_resnet.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "train": "trainer", "plan_text": "trainer",
    "BatchSizeControl": "callbacks", "LRMomentumSchedule": "callbacks",
    "MetricAverage": "callbacks", "Evaluation": "callbacks",
    "Workers": "workers",
    "RunState": "run_state", "NonFiniteLossError": "run_state",
    "CheckpointState": "checkpointing", "CheckpointError": "checkpointing",
})
