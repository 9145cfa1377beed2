"""Flags for run_scripts/train.py, and the frozen, validated configuration they resolve to.

`define_flags()` defines every flag (all optional, so tests import this without parsing argv).
`resolve(flag_values)` applies the experiment's row of Table 3, then the explicit overrides,
checks the result, and returns a `TrainConfig`, written next to the checkpoints as config.json.
`resolve_run(flag_values)` goes on to the run specification (official_resnet.plan.run_spec.RunSpec:
the experiment's phases, batches and workers), which every entry point reads.
"""
import dataclasses
import json
import math
from typing import Optional

from absl import flags

from official_resnet.data.embedded_data import DEFAULT_DATA_DIR
from official_resnet.plan.batch_plan import GPUS_PER_PHASE_HELP
from official_resnet.plan.experiments import PAPER_EPOCHS, get_experiment
from official_resnet.plan.run_spec import RunSpec

# A field that a run resumed from its checkpoints may change: where and how it communicates and
# how long it may take, not what it computes (official_resnet.run.checkpointing.check_config).
MAY_DIFFER = {"may_differ_on_resume": True}


def _may_differ():
    return dataclasses.field(metadata=MAY_DIFFER)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    # --- experiment (Table 3) ---
    exp: str
    lr_config: str  # 'A' or 'B'
    label_smoothing: float
    epochs: float  # run epochs; the paper's 90 map onto them proportionally
    batch_divisor: int  # every total batch of the table is divided by this
    max_micro_batch: Optional[int]  # per-worker cap; above it, gradients accumulate
    batch_schedule: Optional[str]  # 'TOTAL@START,...' replacing the experiment's batches
    # 'fixed', 'paper' or 'W1,W2,...' (official_resnet/plan/batch_plan.py)
    gpus_per_phase: str = _may_differ()
    # train as this many workers on a world that divides it (None: the world's own size)
    logical_workers: Optional[int] = _may_differ()
    # --- data ---
    data_dir: str = _may_differ()
    image_size: int
    label_offset: int
    num_classes: int  # 0: from the data set's manifest, else 1000 (ImageNet)
    # 'all', 'none' or a comma list (official_resnet.data.input_pipeline.AugmentConfig)
    augment: str
    min_crop_area: float  # random-resized-crop keeps at least this fraction of the image
    # --- model ---
    depth: int
    width: int
    small_inputs: bool
    precision: str  # 'mixed_float16' or 'float32'
    # --- optimizer ---
    optimizer: str  # 'lars', or 'sgd' (momentum SGD: LARS with trust ratio 1 everywhere)
    base_lr: Optional[float]  # configuration A's peak LR (None: 34, the paper's)
    warmup_epochs: Optional[float]  # run epochs of linear warm-up (None: the configuration's)
    trust_coefficient: float
    lars_epsilon: float
    weight_decay: float
    reference_batch: int  # batch at which momentum is 0.9 (paper: 32K); divided with the batches
    lr_scale: float  # multiplies the LR schedule: 1 / batch_divisor unless --lr_scale is given
    lr_scale_from: str  # 'batch_divisor' (the linear scaling rule) or 'flag' (--lr_scale)
    # --- communication ---
    algorithm: str = _may_differ()
    engine: str = _may_differ()
    collective_timeout: float = _may_differ()
    # seconds of silence after which a worker counts as lost
    heartbeat_timeout: float = _may_differ()
    # seconds without progress (while others moved on): a stalled worker
    stall_timeout: float = _may_differ()
    grid: str = _may_differ()
    compression: str
    fusion_threshold_mb: Optional[float] = _may_differ()  # None: planned
    # --- evaluation and output ---
    bn_stat_batches: int
    eval_every: float  # epochs between evaluations
    model_dir: str = _may_differ()
    seed: int
    # stop early (tests, smoke runs); None: the whole schedule
    max_steps: Optional[int] = _may_differ()
    # 'auto', 'never' or a checkpoint directory (official_resnet/run/checkpointing.py)
    resume: str = _may_differ()
    stop_at_epoch: Optional[float] = _may_differ()  # finish this epoch, checkpoint, exit 0
    # newest checkpoints kept (phase-boundary ones are always kept)
    keep_checkpoints: int = _may_differ()
    on_nonfinite: str = _may_differ()  # 'skip' or 'stop': a step with inf/NaN gradients or loss
    max_nonfinite_skips: int = _may_differ()  # consecutive skipped steps that stop the run anyway

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def may_differ_on_resume(cls) -> frozenset:
        return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get(
            "may_differ_on_resume"))


def define_flags():
    """Define the training flags once (safe to call twice)."""
    if "exp" in flags.FLAGS:
        return
    d = flags
    d.DEFINE_string("exp", "2", "paper experiment (Table 3): ref, 1, 2, 3 or 4")
    d.DEFINE_string("lr_config", None, "override the experiment's LR configuration: A or B")
    d.DEFINE_float("label_smoothing", None, "override the experiment's label smoothing (0.1 = on)")
    d.DEFINE_float("epochs", PAPER_EPOCHS, "run length in epochs; phases scale with it")
    d.DEFINE_integer("batch_divisor", 1, "divide every total batch of the table, and the LR "
                     "schedule with it (the linear scaling rule), for scaled-down runs")
    d.DEFINE_integer("max_micro_batch", None, "largest per-worker forward pass; more accumulates")
    d.DEFINE_string("batch_schedule", None, "replace the experiment's total batches: "
                    "TOTAL@START_PAPER_EPOCH,... e.g. 512@0,1024@30 (divided by --batch_divisor)")
    d.DEFINE_string("gpus_per_phase", "fixed", "workers per phase: " + GPUS_PER_PHASE_HELP +
                    ". Phases on other counts than the job's are run by relaunching "
                    "(run_scripts/run_experiment.py)")
    d.DEFINE_integer("logical_workers", None, "train as this many workers on any world size "
                     "that divides it: each worker reads the data of logical_workers / world "
                     "size of them, one micro-batch each (batch norm over each one's batch), "
                     "and accumulates their gradients; so a smaller world after a loss "
                     "(run_scripts/train_on_ray.py) trains as the full one")
    d.DEFINE_bool("plan_only", False, "print what the run would do (phases, batches, LR and "
                  "momentum, grid, input per worker, all-reduce time on the paper's cluster) and "
                  "exit, without starting Horovod or reading records")
    d.DEFINE_integer("num_workers", None, "plan mode: the job's number of workers (default: "
                     "the experiment's GPUs in the paper)")
    d.DEFINE_enum("optimizer", "lars", ["lars", "sgd"],
                  "lars (the paper's), or sgd: momentum SGD, the same update with trust ratio 1")
    d.DEFINE_float("base_lr", None, "peak LR of configuration A (default 34, the paper's)")
    d.DEFINE_float("warmup_epochs", None, "run epochs of linear LR warm-up (default: the LR "
                   "configuration's, scaled to --epochs); 0 for none (configuration A only)")
    d.DEFINE_string("data_dir", DEFAULT_DATA_DIR,
                    "ImageNet TFRecords (train-*, validation-*); the default is generated offline")
    d.DEFINE_integer("image_size", 224, "training and evaluation crop size in pixels")
    d.DEFINE_integer("label_offset", 1, "subtracted from image/class/label (ImageNet: 1-based)")
    d.DEFINE_integer("num_classes", 0, "classes; 0: the data set's manifest, else 1000")
    d.DEFINE_string("augment", "all", "training augmentations: all, none, or e.g. crop,flip,noise")
    d.DEFINE_float("min_crop_area", 0.08, "smallest area fraction a random crop keeps (ImageNet: "
                   "0.08; small images need more, e.g. 0.25)")
    d.DEFINE_integer("depth", 50, "ResNet depth (50; 14, 26 or 101 too)")
    d.DEFINE_integer("width", 64, "ResNet base width (64 = standard); smaller for CPU runs")
    d.DEFINE_bool("small_inputs", False, "3x3 stride-1 stem, no max-pool (for 32-64 px images)")
    d.DEFINE_enum("precision", "mixed_float16", ["mixed_float16", "float32"], "Keras policy")
    d.DEFINE_float("trust_coefficient", 0.01, "LARS trust coefficient (paper: 0.01)")
    d.DEFINE_float("lars_epsilon", 1e-6, "LARS epsilon (paper: 1e-6)")
    d.DEFINE_float("weight_decay", 5e-5, "L2 weight decay, not on BN or bias (paper: unstated)")
    d.DEFINE_integer("reference_batch", 32768, "total batch at which momentum is 0.9 (config B)")
    d.DEFINE_float("lr_scale", None, "multiply the LR schedule; default 1 / --batch_divisor "
                   "(the paper's values at the paper's batches)")
    d.DEFINE_enum("algorithm", "auto", ["auto", "torus", "ring", "hierarchical"],
                  "gradient all-reduce (auto: by topology and size, see tftorus.torus.algorithms.choose)")
    d.DEFINE_enum("engine", None, ["horovod", "tf"],
                  "collectives under the all-reduce: Horovod process sets, or TensorFlow's own "
                  "collective ops (also on TF_CONFIG clusters without horovodrun). Default: "
                  "horovod on the classic stack, tf on the current one (no Horovod there)")
    d.DEFINE_float("collective_timeout", 300.0,
                   "tf engine: seconds a collective may wait for its peers before the job stops "
                   "with an error naming the cause (a dead or stalled worker)")
    d.DEFINE_float("heartbeat_timeout", 60.0,
                   "seconds without a heartbeat after which a worker counts as lost: every "
                   "worker then stops with an error naming it (both engines)")
    d.DEFINE_float("stall_timeout", 900.0,
                   "seconds a worker may make no progress while the others moved on before it "
                   "counts as stalled and every worker stops")
    d.DEFINE_string("grid", "auto", "torus grid: auto, paper, or YxX (rows x row length)")
    d.DEFINE_enum("compression", "fp16", ["none", "fp16", "bf16"],
                  "gradient wire format (paper: fp16)")
    d.DEFINE_float("fusion_threshold_mb", None, "largest fused gradient buffer (bucket) in MiB; "
                   "default: planned from the measured links (16 MiB on one host)")
    d.DEFINE_integer("bn_stat_batches", 10, "training batches per worker for BN statistics")
    d.DEFINE_float("eval_every", 1.0, "epochs between evaluations")
    d.DEFINE_string("model_dir", None, "checkpoints, TensorBoard and config (default: runs/exp<N>)")
    d.DEFINE_integer("seed", 0, "random seed (weights, shuffling, augmentation)")
    d.DEFINE_integer("max_steps", None, "stop after this many optimizer steps (smoke runs)")
    d.DEFINE_string("resume", "auto", "auto: continue from the newest valid checkpoint in "
                    "--model_dir if there is one; never: start fresh; or a checkpoint directory")
    d.DEFINE_float("stop_at_epoch", None, "finish this epoch, write its checkpoint and exit 0 "
                   "(time limits; changing the world size at a phase boundary)")
    d.DEFINE_integer("keep_checkpoints", 3, "newest checkpoints kept, besides every "
                     "phase-boundary one")
    d.DEFINE_enum("on_nonfinite", "skip", ["skip", "stop"],
                  "a step whose all-reduced gradients or loss hold inf/NaN: skip it (as dynamic "
                  "loss scaling does; logged with its step) or stop the run at once")
    d.DEFINE_integer("max_nonfinite_skips", 10,
                     "stop anyway after this many skipped steps in a row (a diverged run)")


def resolve_run(fv=None) -> RunSpec:
    """The flags resolved (`resolve`), then the run they specify; ValueError naming fixes.
    Every check that needs no TensorFlow comes first (the run's plan included), so a bad value
    fails before the engine's check loads it."""
    fv = fv or flags.FLAGS
    config = _checked(fv)
    spec = RunSpec.from_config(config)  # the engine plays no part in the run's plan
    return dataclasses.replace(spec, config=_with_engine(config, fv))


def resolve_engine(engine: Optional[str]) -> str:
    """--engine, or the stack's default (tftorus.runtime.stack.DEFAULT_ENGINE: horovod on the classic
    stack, tf on the current one); horovod where Horovod is not installed fails in one line."""
    if engine == "tf":
        return engine
    from tftorus.runtime import stack  # here: importing tftorus starts TensorFlow
    engine = engine or stack.DEFAULT_ENGINE
    if engine == "horovod" and not stack.HOROVOD:
        raise ValueError(str(stack.horovod_required(
            "--engine=horovod", "leave --engine out, or pass --engine=tf (TensorFlow's own "
            "collectives, the default here)")))
    return engine


def resolve(fv=None) -> TrainConfig:
    """Experiment row, then explicit flags; every value checked. Raises ValueError naming fixes."""
    fv = fv or flags.FLAGS
    return _with_engine(_checked(fv), fv)


def _with_engine(config: "TrainConfig", fv) -> "TrainConfig":
    """`config` with its engine resolved and its grid parsed: both import tftorus, which loads
    TensorFlow, so they come after every plain check."""
    engine = resolve_engine(fv.engine)
    if str(fv.grid).strip().lower() not in ("auto", "paper"):
        from tftorus.torus.grid import grid_shape
        grid_shape(fv.grid)  # malformed: now; whether it fits the world: at tftorus.init()
    return dataclasses.replace(config, engine=engine)


def _checked(fv) -> "TrainConfig":
    """The flags as a TrainConfig, every value checked but the engine (left as given)."""
    experiment = get_experiment(fv.exp)
    key = str(fv.exp).strip().lower()
    lr_config = (fv.lr_config or experiment.lr_config).upper()
    if lr_config not in ("A", "B"):
        raise ValueError(f"--lr_config must be A or B, got {fv.lr_config!r}")
    smoothing = experiment.label_smoothing if fv.label_smoothing is None else fv.label_smoothing
    gpus_per_phase = str(fv.gpus_per_phase).strip().lower().replace(" ", "")
    values = fv.flag_values_dict() if hasattr(fv, "flag_values_dict") else vars(fv)
    for name, value in sorted(values.items()):  # inf would pass every "> 0" below
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--{name} must be a finite number, got {value}")
    checks = [
        (fv.base_lr is None or fv.base_lr > 0, f"--base_lr must be > 0, got {fv.base_lr}"),
        (fv.base_lr is None or lr_config == "A",
         "--base_lr sets configuration A's peak LR; use it with --lr_config=A"),
        (fv.warmup_epochs is None or 0 <= fv.warmup_epochs < fv.epochs,
         f"--warmup_epochs must be in [0, --epochs), got {fv.warmup_epochs}"),
        (fv.warmup_epochs is None or fv.warmup_epochs > 0 or lr_config == "A",
         "--warmup_epochs=0 needs --lr_config=A (configuration B always warms up)"),
        (0.0 <= smoothing < 1.0, f"--label_smoothing must be in [0, 1), got {smoothing}"),
        (fv.epochs > 0, f"--epochs must be positive, got {fv.epochs}"),
        (fv.batch_divisor >= 1, f"--batch_divisor must be >= 1, got {fv.batch_divisor}"),
        (fv.logical_workers is None or fv.logical_workers >= 1,
         f"--logical_workers must be >= 1, got {fv.logical_workers}"),
        (fv.max_micro_batch is None or fv.max_micro_batch >= 1,
         f"--max_micro_batch must be >= 1, got {fv.max_micro_batch}"),
        (fv.image_size >= 16, f"--image_size must be >= 16, got {fv.image_size}"),
        (fv.num_classes >= 0, f"--num_classes must be >= 0, got {fv.num_classes}"),
        (0 < fv.min_crop_area <= 1, f"--min_crop_area must be in (0, 1], got {fv.min_crop_area}"),
        (fv.width >= 1, f"--width must be >= 1, got {fv.width}"),
        (fv.trust_coefficient > 0, f"--trust_coefficient must be > 0"),
        (fv.weight_decay >= 0, f"--weight_decay must be >= 0"),
        (fv.reference_batch >= 1, f"--reference_batch must be >= 1"),
        (fv.lr_scale is None or fv.lr_scale > 0, f"--lr_scale must be > 0, got {fv.lr_scale}"),
        (fv.fusion_threshold_mb is None or fv.fusion_threshold_mb >= 0,
         f"--fusion_threshold_mb must be >= 0"),
        (fv.bn_stat_batches >= 1, f"--bn_stat_batches must be >= 1"),
        (fv.eval_every > 0, f"--eval_every must be positive"),
        (fv.max_steps is None or fv.max_steps >= 1, f"--max_steps must be >= 1"),
        (fv.stop_at_epoch is None or fv.stop_at_epoch > 0, f"--stop_at_epoch must be > 0"),
        (fv.keep_checkpoints >= 1, f"--keep_checkpoints must be >= 1"),
        (bool(fv.resume), f"--resume must be auto, never or a checkpoint directory"),
        (fv.max_nonfinite_skips >= 1, f"--max_nonfinite_skips must be >= 1, got "
                                      f"{fv.max_nonfinite_skips}"),
        (fv.collective_timeout > 0, f"--collective_timeout must be > 0 seconds"),
        (fv.heartbeat_timeout > 0, f"--heartbeat_timeout must be > 0 seconds, got "
                                   f"{fv.heartbeat_timeout}"),
        (fv.stall_timeout > 0, f"--stall_timeout must be > 0 seconds, got {fv.stall_timeout}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    # The scale-down rule: a run whose total batches are the paper's divided by D takes the
    # paper's LRs divided by D too (Goyal et al.'s linear scaling, which the paper's LRs were
    # set by), so every variable LARS leaves unadapted (BN, biases) steps as it would at the
    # paper's batch. Momentum follows the divided batches through the divided reference batch.
    lr_scale = 1.0 / fv.batch_divisor if fv.lr_scale is None else fv.lr_scale
    return TrainConfig(
        exp=key if key in ("1", "2", "3", "4") else "ref", lr_config=lr_config,
        label_smoothing=smoothing, epochs=fv.epochs, batch_divisor=fv.batch_divisor,
        max_micro_batch=fv.max_micro_batch, logical_workers=fv.logical_workers,
        batch_schedule=fv.batch_schedule or None,
        gpus_per_phase=gpus_per_phase,
        optimizer=fv.optimizer, base_lr=fv.base_lr, warmup_epochs=fv.warmup_epochs,
        data_dir=fv.data_dir, image_size=fv.image_size,
        label_offset=fv.label_offset, num_classes=fv.num_classes, augment=fv.augment,
        min_crop_area=fv.min_crop_area, depth=fv.depth, width=fv.width,
        small_inputs=fv.small_inputs, precision=fv.precision,
        trust_coefficient=fv.trust_coefficient, lars_epsilon=fv.lars_epsilon,
        weight_decay=fv.weight_decay, reference_batch=fv.reference_batch, lr_scale=lr_scale,
        lr_scale_from="batch_divisor" if fv.lr_scale is None else "flag",
        algorithm=fv.algorithm, engine=fv.engine,
        collective_timeout=fv.collective_timeout, heartbeat_timeout=fv.heartbeat_timeout,
        stall_timeout=fv.stall_timeout, grid=fv.grid, compression=fv.compression,
        fusion_threshold_mb=fv.fusion_threshold_mb, bn_stat_batches=fv.bn_stat_batches,
        eval_every=fv.eval_every, model_dir=fv.model_dir or f"runs/exp{key}", seed=fv.seed,
        max_steps=fv.max_steps, resume=fv.resume, stop_at_epoch=fv.stop_at_epoch,
        keep_checkpoints=fv.keep_checkpoints, on_nonfinite=fv.on_nonfinite,
        max_nonfinite_skips=fv.max_nonfinite_skips)
