"""ResNet-50 training recipe of Mikami et al. (1811.05233) over tftorus, grouped by concept.

    run/         the training run (trainer: `train`, `plan_text`), its own callbacks, run state,
                 checkpoints and summary; the recipe's callbacks for any `fit`; the workers
    plan/        what a run will do, decided before it starts (no TensorFlow): the paper's
                 experiments, each phase's batches, the run specification, the printed plan
    model/       ResNet, the recipe's train step, BN statistics, what Keras 2 and 3 spell
                 differently (keras_generation: the one place)
    optimizers/  LARS (one class per Keras generation), the LR and momentum schedules
    data/        the input pipeline, which records each worker reads, record counts, the
                 embedded data set

Each imports only the ones below it: run over plan over model, optimizers and data, which
import none of each other (tests/test_official_resnet_layout.py reads every import). The names
a user imports are re-exported here and by each subpackage, imported on first use:

    from official_resnet import LARS, LRMomentumSchedule, RecipeModel
"""
from official_resnet.lazy_exports import lazy_exports

# name -> the subpackage that exports it (which names its module)
__getattr__, __dir__ = lazy_exports(__name__, {
    "train": "run", "plan_text": "run", "Workers": "run", "BatchSizeControl": "run",
    "LRMomentumSchedule": "run", "MetricAverage": "run", "Evaluation": "run",
    "RunSpec": "plan", "get_experiment": "plan",
    "resnet": "model", "RecipeModel": "model",
    "LARS": "optimizers", "Schedule": "optimizers",
    "make_dataset": "data", "EmbeddedSpec": "data",
})
