"""The training run behind run_scripts/train.py, as a library: plan, data, model, callbacks,
restore, fit and the closing summary, each a function a test can call in one process.

    spec = flags.config.resolve_run(FLAGS)         # official_resnet.plan.run_spec.RunSpec
    trainer.train(spec)                           # under horovodrun, or alone as one worker
    print(trainer.plan_text(spec, num_workers=3456))   # what the run would do, without running

`train` goes flags -> workers -> data -> model -> optimizer -> callbacks -> fit -> summary. A
job runs the phases on its own world size from where the run stands (its newest checkpoint)
and stops at the boundary where another world size starts (run_scripts/run_experiment.py
relaunches it). Rank 0 logs, writes TensorBoard scalars, checkpoints, config.json and run.json
under --model_dir, and ends with Table 5 and Table 6 style summaries.
"""
import dataclasses
import hashlib
import json
import logging
import os
import sys
import tempfile
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

import tensorflow as tf
from absl import logging as absl_logging

import tftorus
import tftorus.keras
from official_resnet.data import dataset_info, embedded_data, input_pipeline
from official_resnet.model.keras_generation import KERAS
from official_resnet.model.network import resnet
from official_resnet.model.recipe_model import RecipeModel
from official_resnet.optimizers.lars import LARS
from official_resnet.optimizers.schedules import Schedule
from official_resnet.plan import batch_plan, run_plan
from official_resnet.plan.run_spec import RUN_SPEC_FILE, RunSpec
from official_resnet.run import checkpointing
from official_resnet.run.callbacks import (BatchSizeControl, Evaluation, LRMomentumSchedule,
                                           MetricAverage)
from official_resnet.run.checkpointing import CheckpointState
from official_resnet.run.run_callbacks import (CheckpointSaver, EpochLogger, NonFiniteSteps,
                                               RunProgress, StopAtEpoch)
from official_resnet.run.run_state import RunState, epochs_per_keras_epoch
from official_resnet.run.run_summary import log_summary, run_summary
from official_resnet.run.workers import Workers
from tftorus.reliability import watchdog
from tftorus.runtime import process_state, world

EXCLUDE_FROM_LARS = ["_bn", "bias"]  # BN parameters and biases: no decay, no trust ratio

logger = logging.getLogger("train")


class DataInfo(NamedTuple):
    train_examples: int
    validation_examples: int
    num_classes: int


# ------------------------------------------------------------------------------------------------
# Planning: data sizes, the batch plan, where the run stands
# ------------------------------------------------------------------------------------------------
def sizes_without_reading(config) -> Optional[dataset_info.DataSizes]:
    """The data's sizes when known without reading records (manifest, ImageNet's standard
    layout, an earlier count); the embedded default's from its spec before it is generated
    (the set generated from that spec has those sizes); None: the records must be counted."""
    sizes = dataset_info.known_sizes(config.data_dir)
    if sizes is None and config.data_dir == embedded_data.DEFAULT_DATA_DIR:
        spec = embedded_data.EmbeddedSpec()
        return dataset_info.DataSizes(spec.num_train, spec.num_validation, spec.num_classes,
                                      "embedded spec")
    return sizes


def check_batch_fits(spec: RunSpec, train_examples: int) -> None:
    """One line naming the fix when the data cannot hold the experiment's largest batch (the
    card's `train.py --exp=2` on the embedded default, for one)."""
    largest = max(spec.total_batches)
    if largest <= train_examples:
        return
    data_dir = spec.config.data_dir
    where = (f"{data_dir} (the small set generated offline, the default --data_dir)"
             if data_dir == embedded_data.DEFAULT_DATA_DIR else data_dir)
    raise input_pipeline.DataError(
        f"{spec.experiment.name}'s largest total batch is {largest} images, more than the "
        f"{train_examples} training images in {where}: point --data_dir at ImageNet in TFRecord "
        f"form (train-*, validation-*), or run the scaled-down recipe with "
        f"--flagfile=run_scripts/embedded.flags (batches and LRs divided by --batch_divisor)")


def data_info(config, sizes: Optional[dataset_info.DataSizes], workers: Workers) -> DataInfo:
    """The sizes `train` read before it started (`sizes_without_reading`), or when they were
    not known (None), counted once by rank 0 and shared (never by every rank)."""
    if sizes is None:
        input_pipeline.list_files(config.data_dir, "train")  # a clear error for missing files
        counted = dataset_info.count_sizes(config.data_dir) if workers.chief else None
        train, val = (int(v) for v in workers.sum(tf.constant(
            [counted.train, counted.validation] if counted else [0, 0], tf.int64)).numpy())
        sizes = dataset_info.DataSizes(train, val, None, "counted")
    if not sizes.train:
        raise input_pipeline.DataError(f"{config.data_dir} holds no training records (train-*): "
                                       f"point --data_dir at ImageNet TFRecords")
    if not sizes.validation:  # found now, not after the first epoch of training
        raise input_pipeline.DataError(
            f"{config.data_dir} holds no validation records (validation-*): every evaluation "
            f"needs them; add ImageNet's validation TFRecords to the directory")
    return DataInfo(sizes.train, sizes.validation,
                    config.num_classes or sizes.num_classes or 1000)


def plan_text(spec: RunSpec, num_workers: Optional[int] = None,
              read_data_dir: bool = False) -> str:
    """--plan_only: the run's plan for `num_workers` workers (default: the experiment's GPUs in
    the paper), without Horovod or records; the data's own sizes when `read_data_dir`."""
    config = spec.config
    if read_data_dir:
        sizes = sizes_without_reading(config) or dataset_info.count_sizes(config.data_dir)
        present = sizes.source != "embedded spec"
        layout = run_plan.DataLayout(
            config.data_dir, sizes.train, sizes.validation,
            dataset_info.file_bytes(config.data_dir, "train") if present else [0],
            dataset_info.file_bytes(config.data_dir, "validation") if present else [0],
            estimated=not present)
        num_classes = config.num_classes or sizes.num_classes or 1000
    else:
        layout, num_classes = run_plan.DataLayout.imagenet(), config.num_classes or 1000
    check_batch_fits(spec, layout.train_records)
    world_size = num_workers or spec.experiment.max_gpus
    if not spec.fixed and num_workers and num_workers < max(spec.workers(None)):
        raise batch_plan.PlanError(
            f"--gpus_per_phase={config.gpus_per_phase} runs {spec.experiment.name}'s phases on "
            f"{list(spec.workers(None))} workers; --num_workers={num_workers} is fewer than "
            f"the largest")
    return run_plan.plan_table(
        experiment=spec.experiment, plans=spec.plans(layout.train_records, world_size),
        schedule=spec.schedule(), data=layout, grid=config.grid, algorithm=config.algorithm,
        compression=config.compression, model=(config.depth, config.width, num_classes),
        gpus_per_phase=config.gpus_per_phase, batch_divisor=config.batch_divisor)


def check_writable(model_dir: str) -> None:
    """Fail before any work when rank 0 cannot write its checkpoints and logs."""
    try:
        os.makedirs(model_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=model_dir, prefix=".write-test-"):
            pass
    except OSError as error:
        raise ValueError(f"--model_dir={model_dir} cannot be written ({error.strerror}): "
                         f"choose a directory this user can create and write") from error


@dataclasses.dataclass(frozen=True)
class Job:
    """What this process runs: the plan, where the run stands, and where this job stops."""

    spec: RunSpec
    workers: Workers
    info: DataInfo
    plans: List[batch_plan.PhasePlan]
    resume_from: Optional[Tuple[str, CheckpointState]]  # (checkpoint path, its state) or None
    stop_at_epoch: Optional[float]  # --stop_at_epoch, or the boundary before another world size
    relaunch: Optional[batch_plan.PhasePlan]  # the next phase, on another world size

    @property
    def config(self):
        return self.spec.config


def start_workers(config) -> Workers:
    """One process per worker; the torus grid's groups at start-up (the tf engine joins
    TensorFlow's cluster here, so this comes before any other TensorFlow call)."""
    tftorus.init(grid=config.grid, engine=config.engine, **(
        {"collective_timeout": config.collective_timeout} if config.engine == "tf" else {}))
    workers = Workers.current()
    if workers.chief:
        check_writable(config.model_dir)
    # Heartbeats beside the collectives: a dead or stalled worker stops every worker with an
    # error naming it (a collective: every rank starts it here).
    watchdog.start(config.heartbeat_timeout, config.stall_timeout)
    absl_logging.set_verbosity(absl_logging.INFO if workers.chief else absl_logging.WARNING)
    absl_logging.get_absl_logger().addFilter(_quiet_checkpoint_writes)
    return workers


def _quiet_checkpoint_writes(record: logging.LogRecord) -> bool:
    """TensorFlow >= 2.16 logs a line at INFO on every checkpoint write ('Sharding callback
    duration: N microseconds'); the log keeps the classic stack's lines."""
    return not str(record.msg).startswith("Sharding callback duration")


def plan_job(spec: RunSpec, workers: Workers, sizes: Optional[dataset_info.DataSizes]) -> Job:
    """Data sizes, the batch plan on this world size, the checkpoint to resume from, and the
    phases this job runs (those on its own world size from where the run stands). `sizes`:
    `sizes_without_reading(spec.config)`, read once by the caller (None: counted here)."""
    config = spec.config
    if config.data_dir == embedded_data.DEFAULT_DATA_DIR:
        if workers.chief:  # one writer (it skips a complete set); the others wait at the barrier
            embedded_data.generate(config.data_dir)
        workers.barrier()
    info = data_info(config, sizes, workers)
    if sizes is None:  # counted just now (train checked the sizes it knew before starting)
        check_batch_fits(spec, info.train_examples)
    plans = spec.plans(info.train_examples, workers.size)  # the phase plan: built here, once
    # Resume: the newest valid checkpoint (--resume=auto), a given one, or none (never).
    if config.resume == "never" and checkpointing.list_checkpoints(config.model_dir):
        raise checkpointing.CheckpointError(
            f"--resume=never but {config.model_dir} holds checkpoints of a run; use another "
            f"--model_dir, or --resume=auto to continue it")
    resume_from = checkpointing.find_resume(config.resume, config.model_dir)
    if resume_from and config.resume != "auto":  # another run's checkpoint: its configuration
        checkpointing.check_resume_path(resume_from[0], config.model_dir,
                                        dataclasses.asdict(config),
                                        type(config).may_differ_on_resume())
    agree_with_chief(workers, config, info, resume_from)
    if resume_from:
        checkpointing.check_generation(resume_from[1], resume_from[0])
        checkpointing.check_world(resume_from[1], resume_from[0], plans, workers.size,
                                  config.model_dir, config.logical_workers)
    # Phases on another world size (--gpus_per_phase) are run by a relaunch: this job runs the
    # phases on its own size from where the run stands, and stops at the boundary after them.
    first = checkpointing.phase_to_run(resume_from[1] if resume_from else None)
    if first < len(plans) and plans[first].workers != workers.size:
        raise batch_plan.PlanError(
            f"phase {first + 1} of {spec.experiment.name} runs on {plans[first].workers} workers "
            f"(--gpus_per_phase={config.gpus_per_phase}); this job has {workers.size}: launch "
            f"it with -np {plans[first].workers}, or let run_scripts/run_experiment.py launch "
            f"every phase")
    last = first
    while last + 1 < len(plans) and plans[last + 1].workers == workers.size:
        last += 1
    relaunch = plans[last + 1] if last + 1 < len(plans) else None
    stop_at_epoch = min([e for e in (config.stop_at_epoch,
                                     relaunch and relaunch.start_epoch) if e] or [None])
    for split in ("train", "validation"):  # bad records fail now, before anything is written
        input_pipeline.validate_split(config.data_dir, split, num_workers=workers.size,
                                      worker_index=workers.rank, num_classes=info.num_classes,
                                      label_offset=config.label_offset)
    return Job(spec, workers, info, plans, resume_from, stop_at_epoch, relaunch)


def what_this_rank_sees(config, info: DataInfo, resume_from) -> Dict[str, str]:
    """What every worker must see alike to run one job: the data's sizes, its files (names and
    bytes), and the checkpoint to resume from (name, epoch, its manifest's digest)."""
    files = []
    for split in ("train", "validation"):
        for path in input_pipeline.list_files(config.data_dir, split):
            files.append(f"{os.path.basename(path)}:{tf.io.gfile.stat(path).length}")
    resume = "none"
    if resume_from:
        path, state = resume_from
        with open(os.path.join(path, checkpointing.MANIFEST), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        resume = f"{os.path.basename(path)} (epoch {state.epoch:.3f}, manifest {digest})"
    return {"the data's sizes": f"{info.train_examples} train / {info.validation_examples} "
                                f"validation images",
            "the data files": f"{len(files)} files, digest "
                              f"{hashlib.sha256(' '.join(files).encode()).hexdigest()[:16]}",
            "the checkpoint to resume from": resume}


def agree_with_chief(workers: Workers, config, info: DataInfo, resume_from) -> None:
    """Rank 0 decides what the job resumes from and reads; a worker whose disk shows another
    run (per-host scratch, a stale NFS view) stops the job, each such worker naming what it
    sees, before any worker restores or trains (they would resume different epochs, or call
    different collectives and hang)."""
    mine = what_this_rank_sees(config, info, resume_from)
    chief = json.loads(workers.from_chief(json.dumps(mine, sort_keys=True)))
    differs = [k for k in sorted(mine) if mine[k] != chief.get(k)]
    apart = workers.count(bool(differs))
    if not apart:
        return
    if differs:
        raise checkpointing.CheckpointError(
            f"rank {workers.rank} sees another run than rank 0: "
            + "; ".join(f"{k}: rank 0 {chief.get(k)}, rank {workers.rank} {mine[k]}"
                        for k in differs)
            + f". Every worker must see the same --model_dir ({config.model_dir}) and "
              f"--data_dir ({config.data_dir}): a shared file system, not per-host copies")
    raise checkpointing.CheckpointError(
        f"{apart} worker(s) see another --model_dir or --data_dir than rank 0 (their lines say "
        f"what differs); nothing was restored or written")


# ------------------------------------------------------------------------------------------------
# Data, model, optimizer
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Data:
    """The input functions: a segment's training micro-batches (deterministic, so a resumed run
    re-derives its position), BN-statistics micro-batches, and the validation split."""

    train: Callable[[batch_plan.FitSegment, int], tf.data.Dataset]  # (segment, skip_batches)
    bn_batches: Callable[[int, int, int], Iterable]  # (micro_batch, count, keras_epoch)
    validation: Callable[[], tf.data.Dataset]


def make_data(job: Job) -> Data:
    """The input functions. Under --logical_workers a worker reads as the logical workers it
    stands in for (ranks rank * k ... rank * k + k - 1 of logical_workers, k = logical_workers /
    world size), their micro-batches in turn: the data, augmentation seeds and batch-norm
    batches of a world of logical_workers, whatever the world's size."""
    config, workers, info = job.config, job.workers, job.info
    augment = input_pipeline.AugmentConfig.from_names(
        config.augment, area_range=(config.min_crop_area, 1.0))
    logical = config.logical_workers or workers.size
    if logical % workers.size:
        raise ValueError(f"--logical_workers={logical} is not a multiple of the {workers.size} "
                         f"workers: give a world size that divides it")
    stands_for = range(workers.rank * (logical // workers.size),
                       (workers.rank + 1) * (logical // workers.size))

    def common(split, batch, num_workers=workers.size, worker_index=workers.rank, **kwargs):
        return input_pipeline.make_dataset(
            config.data_dir, split, batch, image_size=config.image_size,
            num_workers=num_workers, worker_index=worker_index,
            label_offset=config.label_offset, num_classes=info.num_classes,
            validate_records=0, **kwargs)  # validated already

    def in_turn(make, batches=0):
        """One stream per logical worker, a micro-batch of each in turn."""
        if len(stands_for) == 1:
            return make(logical, stands_for[0], batches)
        each = batches // len(stands_for)
        streams = tuple(make(logical, index, each) for index in stands_for)
        return tf.data.Dataset.zip(streams).flat_map(
            lambda *parts: tf.data.Dataset.from_tensor_slices(
                tuple(tf.stack(column) for column in zip(*parts))))

    def train(segment, skip_batches=0):
        return in_turn(lambda n, i, skip: common(
            "train", segment.micro_batch, n, i, training=True, augment=augment,
            seed=config.seed + 1000 * segment.phases[0].index, deterministic=True,
            skip_batches=skip), skip_batches)

    def bn_batches(micro_batch, count, keras_epoch):
        return in_turn(lambda n, i, each: common(
            "train", micro_batch, n, i, training=True, augment=augment,
            seed=config.seed + 500_000 + keras_epoch, deterministic=True,
            shuffle_buffer=max(256, 4 * micro_batch)).take(each), count)

    def validation():
        return common("validation", 64, training=False)

    return Data(train, bn_batches, validation)


def build_model(config, info: DataInfo) -> RecipeModel:
    """ResNet (mixed precision under --precision=mixed_float16) with the recipe's train step."""
    if config.precision == "mixed_float16":
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
    net = resnet(depth=config.depth, num_classes=info.num_classes, width=config.width,
                 input_shape=(config.image_size, config.image_size, 3),
                 small_inputs=config.small_inputs)
    return RecipeModel.wrap(net, label_smoothing=config.label_smoothing)


def build_optimizer(config):
    """LARS in FP32 behind tftorus' DistributedOptimizer (compile adds dynamic loss scaling
    under mixed precision). --optimizer=sgd: the same update with a trust ratio of 1 for every
    variable (momentum SGD with coupled weight decay), so the two differ in layer adaptation."""
    lars = LARS(learning_rate=0.0, momentum=0.9, weight_decay=config.weight_decay,
                trust_coefficient=config.trust_coefficient, epsilon=config.lars_epsilon,
                exclude_from_weight_decay=EXCLUDE_FROM_LARS,
                exclude_from_layer_adaptation=[".*"] if config.optimizer == "sgd" else None)
    compression = {"none": tftorus.Compression.none, "fp16": tftorus.Compression.fp16,
                   "bf16": tftorus.Compression.bf16}[config.compression]
    return tftorus.keras.DistributedOptimizer(
        lars, compression=compression, algorithm=config.algorithm, engine=config.engine,
        fusion_threshold_bytes=None if config.fusion_threshold_mb is None
        else int(config.fusion_threshold_mb * 1024 * 1024))


# ------------------------------------------------------------------------------------------------
# Callbacks, checkpoints, restore
# ------------------------------------------------------------------------------------------------
def new_run_state(job: Job) -> RunState:
    """The run state, with the clock and skip count of the checkpoint it resumes."""
    saved = job.resume_from[1] if job.resume_from else None
    return RunState(workers=job.workers, plans=job.plans, dataset_size=job.info.train_examples,
                    epoch_fraction=epochs_per_keras_epoch(job.plans),
                    model_dir=job.config.model_dir,
                    elapsed_before=saved.elapsed if saved else 0.0,
                    skips_in_a_row=saved.nonfinite_skips_in_a_row if saved else 0)


def checkpoint_state(job: Job, state: RunState, keras_epoch: int) -> CheckpointState:
    """Where the run stands after `keras_epoch`, as its checkpoint records it."""
    config, plan = job.config, state.plan_of(keras_epoch)
    return CheckpointState(
        seed=config.seed, exp=config.exp, epochs=config.epochs, epoch=state.epoch(),
        keras_epoch=keras_epoch + 1, samples_seen=int(state.samples_seen.numpy()),
        steps=int(state.steps.numpy()), phase=plan.index,
        phase_boundary=state.is_phase_end(keras_epoch), world_size=job.workers.size,
        total_batch=plan.total_batch, per_worker_batch=plan.per_worker_batch,
        accumulation=plan.accumulation, micro_batch=plan.micro_batch,
        input_batches_in_phase=state.micro_batches_in_segment,
        bn_stat_batches=config.bn_stat_batches, elapsed=state.history[-1].elapsed,
        logical_workers=config.logical_workers,
        nonfinite_skips_in_a_row=state.skips_in_a_row, keras=KERAS.generation)


def progbar_verbosity(chief: bool) -> int:
    """Keras' progress bar on rank 0 only: live in a terminal, one line per epoch in a log."""
    return (1 if sys.stdout.isatty() else 2) if chief else 0


def make_callbacks(job: Job, state: RunState, segment: batch_plan.FitSegment, first_epoch: int,
                   schedule: Schedule, data: Data, writer, saver) -> list:
    """The recipe as Keras callbacks for one segment's fit, started at Keras epoch
    `first_epoch`. Keras runs them in list order, and the order carries data: RunProgress first
    (every trainer callback reads its clock); the LR schedule and Evaluation put the logs
    EpochLogger reads; CheckpointSaver reads EpochLogger's epoch; StopAtEpoch ends the fit."""
    config, workers = job.config, job.workers
    micro = segment.micro_batch

    def phase_line(keras_epoch, accumulation):
        plan = state.plan_of(keras_epoch)
        epoch = keras_epoch * state.epoch_fraction
        if workers.chief:
            logger.info(
                "phase %d: epochs %.2f-%.2f, total batch %d = %d workers x %d per worker "
                "(%d micro-batch%s of %d), %d steps/epoch; from epoch %.3f: lr %.4g, momentum "
                "%.4f", plan.index + 1, plan.start_epoch, plan.end_epoch, plan.total_batch,
                plan.workers, plan.per_worker_batch, plan.accumulation,
                "es" if plan.accumulation > 1 else "", plan.micro_batch, plan.steps_per_epoch,
                epoch, schedule.lr(epoch), schedule.momentum(epoch, plan.total_batch))

    def bn_batches(keras_epoch):
        count = config.bn_stat_batches * state.plan_of(keras_epoch).accumulation
        return data.bn_batches(micro, count, keras_epoch)

    averaging = [MetricAverage(workers)]
    if config.engine == "horovod" and workers.size > 1:  # Horovod's own, as a Keras user has them
        averaging = [tftorus.keras.callbacks.MetricAverageCallback(),
                     tftorus.keras.callbacks.BroadcastGlobalVariablesCallback(0)]
    skip = (first_epoch - segment.first_epoch) * segment.steps_per_epoch
    return [
        RunProgress(state, micro, first_epoch, skip, config.max_steps),
        *averaging,
        # across hosts: after 3 steps, the all-reduce planned for the step (a no-op on one host)
        tftorus.keras.ReplanCallback(),
        BatchSizeControl([(0 if i == 0 else round(p.start_epoch / state.epoch_fraction),
                           p.accumulation) for i, p in enumerate(segment.phases)],
                         on_switch=phase_line),
        LRMomentumSchedule(schedule.lr, schedule.momentum, micro, workers.size,
                           state.epoch_fraction),
        NonFiniteSteps(state, config.on_nonfinite, config.max_nonfinite_skips, writer),
        Evaluation(data.validation, workers, config.eval_every, state.epoch_fraction,
                   bn_batches=bn_batches, last_epoch=state.keras_epochs - 1),
        EpochLogger(state, micro, writer),
        CheckpointSaver(state, saver, lambda keras_epoch: checkpoint_state(job, state,
                                                                          keras_epoch)),
        StopAtEpoch(state, job.stop_at_epoch),
    ]


def restore(job: Job, model, checkpoint: tf.train.Checkpoint) -> None:
    """The resumed checkpoint's variables; newer checkpoints and history set aside."""
    config, (path, saved) = job.config, job.resume_from
    checkpointing.restore(checkpoint, path, optimizers=[model.optimizer],
                          variables=model.trainable_variables)
    if job.workers.chief:
        logger.info("restored %s", path)
        for moved in checkpointing.set_aside_newer(config.model_dir, path):
            logger.warning("moved newer checkpoint to %s (this run trains its epochs again)",
                           moved)
        dropped = checkpointing.trim_history(config.model_dir, saved.epoch)
        if dropped:
            logger.warning("history.jsonl: dropped %d line(s) past epoch %.3f (they are "
                           "trained again)", dropped, saved.epoch)
        logger.info("resumed at epoch %.3f (%d samples, step %d) from phase %d%s",
                    saved.epoch, saved.samples_seen, saved.steps, saved.phase + 1,
                    " (its end: a phase boundary)" if saved.phase_boundary else "")


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------
def fit(job: Job, model, state: RunState, schedule: Schedule, data: Data, writer, saver) -> bool:
    """model.fit once per segment of the phases this job runs; True when the run is complete."""
    start = round(job.resume_from[1].epoch / state.epoch_fraction) if job.resume_from else 0
    verbose = progbar_verbosity(job.workers.chief)
    for segment in batch_plan.fit_segments(job.plans, job.info.train_examples,
                                           state.epoch_fraction):
        if segment.end_epoch <= start:
            continue  # resumed past it
        if segment.workers != job.workers.size:
            return False  # the next phases run on another world size: relaunch
        first = max(start, segment.first_epoch)
        callbacks = make_callbacks(job, state, segment, first, schedule, data, writer, saver)
        skip = (first - segment.first_epoch) * segment.steps_per_epoch
        model.fit(data.train(segment, skip), initial_epoch=first, epochs=segment.end_epoch,
                  steps_per_epoch=segment.steps_per_epoch, callbacks=callbacks,
                  verbose=verbose, shuffle=False)  # the dataset shuffles (Keras 3 warns else)
        if model.stop_training:  # --stop_at_epoch, --max_steps or the end of this world size
            return bool(state.finishing)
        start = segment.end_epoch
    return True


def train(spec: RunSpec) -> None:
    """The whole job (see the module docstring); raises the errors train.py reports."""
    config = spec.config
    sizes = sizes_without_reading(config)  # read once, here; passed on (None: counted later)
    if sizes is not None:  # before any collective: the card's command on the embedded default
        check_batch_fits(spec, sizes.train)
    # A run already in --model_dir must have this configuration (world size, engine, grid and
    # timeouts may differ); checked on every rank before anything is written.
    existing_run = checkpointing.check_config(config.model_dir, dataclasses.asdict(config),
                                              type(config).may_differ_on_resume())

    workers = start_workers(config)
    # one job per model_dir, for this job's life: a second one is refused before it writes;
    # released on bad input too, so the directory's bytes are as they were before this job
    lock = checkpointing.ModelDirLock(config.model_dir) if workers.chief else None
    try:
        train_holding_model_dir(spec, workers, sizes, existing_run)
    finally:
        if lock is not None:
            lock.release()


def train_holding_model_dir(spec: RunSpec, workers: Workers,
                            sizes: Optional[dataset_info.DataSizes],
                            existing_run: bool) -> None:
    """The job once its workers are up and rank 0 holds --model_dir."""
    config = spec.config
    tf.keras.utils.set_random_seed(config.seed)  # same initial weights everywhere; broadcast below
    job = plan_job(spec, workers, sizes)  # the data's sizes and the phase plan, from here on
    data = make_data(job)
    model = build_model(config, job.info)
    model.compile(optimizer=build_optimizer(config))
    state = new_run_state(job)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer,
                                     samples_seen=state.samples_seen, steps=state.steps)
    os.makedirs(config.model_dir, exist_ok=True)
    writer = saver = None
    if workers.chief:
        log_start(job, existing_run, model)
        writer = tf.summary.create_file_writer(os.path.join(config.model_dir, "tensorboard"))
        saver = checkpointing.CheckpointWriter(checkpoint, config.model_dir,
                                               keep=config.keep_checkpoints)
    if job.resume_from:
        restore(job, model, checkpoint)
    # all start from rank 0's weights: fresh ones, or what rank 0 restored (after the restore,
    # so a rank that read its checkpoint otherwise still starts from rank 0's)
    world.broadcast_variables(model.variables, root_rank=0)
    complete = fit(job, model, state, spec.schedule(), data, writer, saver)
    # The summary once every worker is out of fit: its tail_seconds covers the slowest one.
    workers.barrier()

    if workers.chief:
        log_end(job, state, complete)
    watchdog.stop()  # this rank finished: its silence from now on is no loss
    tftorus.shutdown()  # every worker is past its last collective before any exits


def log_start(job: Job, existing_run: bool, model) -> None:
    config, info, spec = job.config, job.info, job.spec
    logger.info("configuration:\n%s", config.to_json())
    logger.info("%s on %d worker(s), torus grid %s, data: %d train / %d validation images, "
                "%d classes", spec.experiment.name, job.workers.size,
                process_state.default_grid(), info.train_examples, info.validation_examples,
                info.num_classes)
    logger.info("LR schedule x %.6g of the paper's (%s); momentum reference batch %g",
                spec.lr_scale,
                f"1/{config.batch_divisor}: the batches are divided by --batch_divisor="
                f"{config.batch_divisor} (linear scaling rule)"
                if config.lr_scale_from == "batch_divisor" else "--lr_scale",
                spec.reference_batch)
    if isinstance(model.optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
        logger.info("mixed precision: FP16 compute, FP32 variables and LARS, dynamic loss "
                    "scale starting at %g", float(model.optimizer.initial_scale))
    if not existing_run:  # a resumed run keeps the config.json it started with
        checkpointing.write_json_atomic(os.path.join(config.model_dir, "config.json"),
                                        config.to_json())
    # What the flags resolved to on this world size; rewritten by every job of the run (a
    # relaunch on another world size says so). The phase lines below log the same per phase.
    path = os.path.join(config.model_dir, RUN_SPEC_FILE)
    checkpointing.write_json_atomic(path, spec.to_json(job.workers.size))
    logger.info("run specification (phases, batches, workers, LR scale, grid): %s", path)


def log_end(job: Job, state: RunState, complete: bool) -> None:
    """The paper's Table 5 (accuracy, time) and Table 6 (throughput) lines for a finished run;
    for a stopped one, how to continue."""
    config, relaunch = job.config, job.relaunch
    epoch = state.history[-1].epoch if state.history else None
    if complete and state.history:
        summary = run_summary(state, job.spec.experiment, str(process_state.default_grid()))
        log_summary(summary, state, job.spec.experiment,
                    os.path.join(config.model_dir, "summary.json"))
    elif state.history and relaunch and epoch >= relaunch.start_epoch - 1e-9:
        logger.info("stopped at epoch %.3f, the end of phase %d: phase %d runs on %d "
                    "workers; relaunch with -np %d and the same flags (run_scripts/"
                    "run_experiment.py does this)", epoch, relaunch.index,
                    relaunch.index + 1, relaunch.workers, relaunch.workers)
    elif state.history:
        logger.info("stopping after epoch %.3f (--stop_at_epoch=%s); run again with the same "
                    "flags (--resume=auto) to continue", epoch, config.stop_at_epoch)
    else:
        logger.info("nothing to do: the run in %s is complete (its checkpoint is at epoch "
                    "%.3f, the end; its summary.json was written then); to train again, "
                    "pass another --model_dir", config.model_dir,
                    job.resume_from[1].epoch if job.resume_from else 0.0)
