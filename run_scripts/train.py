"""Train ResNet-50 on ImageNet with the recipe of Mikami et al. (arXiv 1811.05233).

    horovodrun -np 3456 -H ... python run_scripts/train.py --exp=2 --data_dir=/imagenet
    horovodrun --gloo -np 4 -H localhost:4 python run_scripts/train.py --exp=2 \
        --flagfile=run_scripts/embedded.flags          # the small run on the embedded data
    python run_scripts/train.py --exp=2 --flagfile=run_scripts/embedded.flags   # one process

`--exp` picks a row of the paper's Table 3 (batch-size control per epoch range, LR
configuration, label smoothing); flags override any part of it. Gradients are averaged with
tftorus' 2D-torus all-reduce; LARS updates in FP32; BN statistics are recomputed from training
batches before each evaluation. Rank 0 logs, writes TensorBoard scalars, checkpoints and
config.json under --model_dir, and ends with Table 5 and Table 6 style summaries.
"""
import json
import logging
import os
import sys
import tempfile
from typing import NamedTuple, Optional

from absl import app
from absl import flags as absl_flags
from absl import logging as absl_logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":  # before TensorFlow's threads start, so they inherit the mask
    import signal  # noqa: E402
    # The launcher's SIGTERM reaches tftorus.watchdog.handle_termination's thread (a Python
    # handler never runs while the main thread is blocked in a TF op).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    if any(a in ("--plan_only", "--plan_only=true", "--plan_only=True") for a in sys.argv[1:]):
        # A plan is for reading: without TensorFlow's start-up notices (oneDNN, CPU features),
        # which its C++ logging prints as TensorFlow loads, before any flag is parsed.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import tftorus  # noqa: E402
import tftorus.keras  # noqa: E402
from flags.config import EMBEDDED_DATA_DIR, define_flags, resolve  # noqa: E402
from official_resnet.experiments import get_experiment, with_batch_schedule  # noqa: E402
from official_resnet import batch_plan, dataset_info, embedded_data  # noqa: E402
from official_resnet import input_pipeline, run_plan  # noqa: E402
from official_resnet import checkpointing  # noqa: E402
from official_resnet.lars import LARS  # noqa: E402
from official_resnet.model import resnet  # noqa: E402
from official_resnet.schedules import Schedule, lr_overrides  # noqa: E402
from official_resnet.callbacks import (BatchSizeControl, BNStatistics, CheckpointSaver,  # noqa: E402
                                       EpochLogger, Evaluation, LRMomentumSchedule,
                                       MetricAverage, NonFiniteSteps, RunProgress, StopAtEpoch,
                                       StopAtStep, TensorBoardScalars, log_summary,
                                       progbar_verbosity, run_summary)
from official_resnet.lars import unwrap  # noqa: E402
from official_resnet.recipe_model import RecipeModel  # noqa: E402
from official_resnet.run_state import (NonFiniteLossError, RunState, World,  # noqa: E402
                                       epochs_per_keras_epoch)
from tftorus import watchdog  # noqa: E402
from tftorus.tf_collective_engine import CollectiveError, translate_errors  # noqa: E402

define_flags()
FLAGS = absl_flags.FLAGS


class DataInfo(NamedTuple):
    train_examples: int
    validation_examples: int
    num_classes: int


def sizes_without_reading(config) -> Optional[dataset_info.DataSizes]:
    """The data's sizes when known without reading records (manifest, ImageNet's standard
    layout, an earlier count); the embedded default's from its spec before it is generated."""
    if config.data_dir == EMBEDDED_DATA_DIR and not embedded_data.read_manifest(config.data_dir):
        spec = embedded_data.EmbeddedSpec()
        return dataset_info.DataSizes(spec.num_train, spec.num_validation, spec.num_classes,
                                      "embedded spec")
    return dataset_info.known_sizes(config.data_dir)


def check_batch_fits(config, experiment, train_examples: int) -> None:
    """One line naming the fix when the data cannot hold the experiment's largest batch (the
    card's `train.py --exp=2` on the embedded default, for one)."""
    largest = max(batch_plan.divided_totals(experiment, config.batch_divisor))
    if largest <= train_examples:
        return
    where = (f"{config.data_dir} (the small set generated offline, the default --data_dir)"
             if config.data_dir == EMBEDDED_DATA_DIR else config.data_dir)
    raise input_pipeline.DataError(
        f"{experiment.name}'s largest total batch is {largest} images, more than the "
        f"{train_examples} training images in {where}: point --data_dir at ImageNet in TFRecord "
        f"form (train-*, validation-*), or run the scaled-down recipe with "
        f"--flagfile=run_scripts/embedded.flags (batches and LRs divided by --batch_divisor)")


def data_info(config, sizes: Optional[dataset_info.DataSizes], world: "World") -> DataInfo:
    """Sizes known beforehand, or counted once by rank 0 and shared (never by every rank)."""
    if sizes is None or sizes.source == "embedded spec":
        sizes = dataset_info.known_sizes(config.data_dir)
    if sizes is None:
        input_pipeline.list_files(config.data_dir, "train")  # a clear error for missing files
        counted = dataset_info.count_sizes(config.data_dir) if world.chief else None
        train, val = (int(v) for v in world.sum(tf.constant(
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


def print_plan(config, experiment) -> None:
    """--plan_only: the run's plan for --num_workers workers, without Horovod or records."""
    if FLAGS["data_dir"].present:  # the data's own sizes and files
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
    check_batch_fits(config, experiment, layout.train_records)
    if config.gpus_per_phase == "fixed":
        workers = batch_plan.phase_workers(experiment, "fixed",
                                           FLAGS.num_workers or experiment.max_gpus)
    else:
        workers = batch_plan.phase_workers(experiment, config.gpus_per_phase,
                                           batch_divisor=config.batch_divisor)
        if FLAGS.num_workers and FLAGS.num_workers < max(workers):
            raise batch_plan.PlanError(
                f"--gpus_per_phase={config.gpus_per_phase} runs {experiment.name}'s phases on "
                f"{list(workers)} workers; --num_workers={FLAGS.num_workers} is fewer than "
                f"the largest")
    plans = batch_plan.plan_phases(experiment, workers=workers, dataset_size=layout.train_records,
                                   epochs=config.epochs, batch_divisor=config.batch_divisor,
                                   max_micro_batch=config.max_micro_batch)
    print(run_plan.plan_table(
        experiment=experiment, plans=plans, schedule=make_schedule(config), data=layout,
        grid=config.grid, algorithm=config.algorithm, compression=config.compression,
        model=(config.depth, config.width, num_classes), gpus_per_phase=config.gpus_per_phase,
        batch_divisor=config.batch_divisor), flush=True)


EXCLUDE_FROM_LARS = ["_bn", "bias"]  # BN parameters and biases: no decay, no trust ratio

# Errors that mean "the input is wrong": one clear line and exit status 2, no traceback.
USER_ERRORS = (ValueError, FileNotFoundError, tftorus.GridError, NonFiniteLossError)

logger = logging.getLogger("train")


def make_schedule(config) -> Schedule:
    """The run's LR and momentum schedule. The LR is the paper's times config.lr_scale (1/D for
    batches divided by D); the momentum rule compares the total batch with the paper's 32K, and
    a scaled-down run divides both by D, so momentum keeps the paper's values."""
    return Schedule(config.lr_config, total_epochs=config.epochs, lr_scale=config.lr_scale,
                    reference_batch=config.reference_batch / config.batch_divisor,
                    lr_params=lr_overrides(config.lr_config, config.epochs, config.base_lr,
                                           config.warmup_epochs))


def check_writable(model_dir: str) -> None:
    """Fail before any work when rank 0 cannot write its checkpoints and logs."""
    try:
        os.makedirs(model_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=model_dir, prefix=".write-test-"):
            pass
    except OSError as error:
        raise ValueError(f"--model_dir={model_dir} cannot be written ({error.strerror}): "
                         f"choose a directory this user can create and write") from error


class Job(NamedTuple):
    """What this process runs: the plan, where the run stands, and where this job stops."""

    config: object
    experiment: object
    world: World
    info: DataInfo
    plans: list
    resume_from: Optional[tuple]  # (checkpoint path, its state.json) or None
    stop_at_epoch: Optional[float]  # --stop_at_epoch, or the boundary before another world size
    relaunch: object  # the next phase on another world size, or None


def start_world(config) -> World:
    """One process per worker; the torus grid's groups at start-up (the tf engine joins
    TensorFlow's cluster here, so this comes before any other TensorFlow call)."""
    tftorus.init(grid=config.grid, engine=config.engine, **(
        {"collective_timeout": config.collective_timeout} if config.engine == "tf" else {}))
    rank, size = tftorus.world.rank(), tftorus.world.size()
    if rank == 0:
        check_writable(config.model_dir)
    # Heartbeats beside the collectives: a dead or stalled worker stops every worker with an
    # error naming it (a collective: every rank starts it here).
    watchdog.start(config.heartbeat_timeout, config.stall_timeout)
    absl_logging.set_verbosity(absl_logging.INFO if rank == 0 else absl_logging.WARNING)
    return World(rank=rank, size=size,
                 allreduce_sum=tftorus.world.allreduce_sum if size > 1 else None)


def plan_job(config, experiment, world: World, sizes) -> Job:
    """Data sizes, the batch plan on this world size, the checkpoint to resume from, and the
    phases this job runs (those on its own world size from where the run stands)."""
    if config.data_dir == EMBEDDED_DATA_DIR:
        if world.chief:  # one writer (it skips a complete set); the others wait at the barrier
            embedded_data.generate(config.data_dir)
        tftorus.world.barrier()
    info = data_info(config, sizes, world)
    check_batch_fits(config, experiment, info.train_examples)
    plans = batch_plan.plan_phases(
        experiment, dataset_size=info.train_examples, epochs=config.epochs,
        batch_divisor=config.batch_divisor, max_micro_batch=config.max_micro_batch,
        workers=batch_plan.phase_workers(experiment, config.gpus_per_phase, world.size,
                                         config.batch_divisor))
    # Resume: the newest valid checkpoint (--resume=auto), a given one, or none (never).
    if config.resume == "never" and checkpointing.list_checkpoints(config.model_dir):
        raise checkpointing.CheckpointError(
            f"--resume=never but {config.model_dir} holds checkpoints of a run; use another "
            f"--model_dir, or --resume=auto to continue it")
    resume_from = checkpointing.find_resume(config.resume, config.model_dir)
    if resume_from:
        checkpointing.check_world(resume_from[1], resume_from[0], plans, world.size,
                                  config.model_dir)
    # Phases on another world size (--gpus_per_phase) are run by a relaunch: this job runs the
    # phases on its own size from where the run stands, and stops at the boundary after them.
    first = checkpointing.phase_to_run(resume_from[1] if resume_from else None)
    if first < len(plans) and plans[first].workers != world.size:
        raise batch_plan.PlanError(
            f"phase {first + 1} of {experiment.name} runs on {plans[first].workers} workers "
            f"(--gpus_per_phase={config.gpus_per_phase}); this job has {world.size}: launch it "
            f"with -np {plans[first].workers}, or let run_scripts/run_experiment.py launch every "
            f"phase")
    last = first
    while last + 1 < len(plans) and plans[last + 1].workers == world.size:
        last += 1
    relaunch = plans[last + 1] if last + 1 < len(plans) else None
    stop_at_epoch = min([e for e in (config.stop_at_epoch,
                                     relaunch and relaunch.start_epoch) if e] or [None])
    for split in ("train", "validation"):  # bad records fail now, before anything is written
        input_pipeline.validate_split(config.data_dir, split, num_workers=world.size,
                                      worker_index=world.rank, num_classes=info.num_classes,
                                      label_offset=config.label_offset)
    return Job(config, experiment, world, info, plans, resume_from, stop_at_epoch, relaunch)


def make_data(job: Job):
    """The input functions: a segment's training micro-batches (deterministic, so a resumed run
    re-derives its position), BN-statistics micro-batches, and the validation split."""
    config, world, info = job.config, job.world, job.info
    augment = input_pipeline.AugmentConfig.from_names(
        config.augment, area_range=(config.min_crop_area, 1.0))

    def common(split, batch, **kwargs):
        return input_pipeline.make_dataset(
            config.data_dir, split, batch, image_size=config.image_size,
            num_workers=world.size, worker_index=world.rank, label_offset=config.label_offset,
            num_classes=info.num_classes, validate_records=0, **kwargs)  # validated already

    def train_data(segment, skip_batches=0):
        return common("train", segment.micro_batch, training=True, augment=augment,
                      seed=config.seed + 1000 * segment.phases[0].index, deterministic=True,
                      skip_batches=skip_batches)

    def bn_batches(micro_batch, count, keras_epoch):
        return common("train", micro_batch, training=True, augment=augment,
                      seed=config.seed + 500_000 + keras_epoch, deterministic=True,
                      shuffle_buffer=max(256, 4 * micro_batch)).take(count)

    def eval_data():
        return common("validation", 64, training=False)

    return train_data, bn_batches, eval_data


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
        fusion_threshold_bytes=int(config.fusion_threshold_mb * 1024 * 1024))


def make_callbacks(job: Job, state: RunState, segment, schedule, data, writer, saver):
    """The recipe as Keras callbacks, in the order their epoch ends must run."""
    config, world = job.config, job.world
    _, bn_batches, eval_data = data
    micro = segment.micro_batch

    def phase_line(keras_epoch, accumulation):
        plan = state.plan_of(keras_epoch)
        epoch = keras_epoch * state.epoch_fraction
        if world.chief:
            logger.info(
                "phase %d: epochs %.2f-%.2f, total batch %d = %d workers x %d per worker "
                "(%d micro-batch%s of %d), %d steps/epoch; from epoch %.3f: lr %.4g, momentum "
                "%.4f", plan.index + 1, plan.start_epoch, plan.end_epoch, plan.total_batch,
                plan.workers, plan.per_worker_batch, plan.accumulation,
                "es" if plan.accumulation > 1 else "", plan.micro_batch, plan.steps_per_epoch,
                epoch, schedule.lr(epoch), schedule.momentum(epoch, plan.total_batch))

    def checkpoint_state(keras_epoch):
        plan = state.plan_of(keras_epoch)
        return {"seed": config.seed, "exp": config.exp, "epochs": config.epochs,
                "epoch": state.epoch(), "keras_epoch": keras_epoch + 1,
                "samples_seen": int(state.samples_seen.numpy()),
                "steps": int(state.steps.numpy()), "phase": plan.index,
                "phase_boundary": state.is_phase_end(keras_epoch), "world_size": world.size,
                "total_batch": plan.total_batch, "per_worker_batch": plan.per_worker_batch,
                "accumulation": plan.accumulation, "micro_batch": plan.micro_batch,
                "input_batches_in_phase": state.micro_batches_in_segment,
                "bn_stat_batches": config.bn_stat_batches, "elapsed": state.history[-1].elapsed,
                "nonfinite_skips_in_a_row": state.skips_in_a_row}

    def bn_data(keras_epoch):
        count = config.bn_stat_batches * state.plan_of(keras_epoch).accumulation
        return bn_batches(micro, count, keras_epoch)

    engine_callbacks = [MetricAverage(state)]
    if config.engine == "horovod" and world.size > 1:  # Horovod's own, as a Keras user has them
        engine_callbacks = [tftorus.keras.callbacks.MetricAverageCallback(),
                            tftorus.keras.callbacks.BroadcastGlobalVariablesCallback(0)]
    return engine_callbacks + [
        RunProgress(state, micro),
        BatchSizeControl([(0 if i == 0 else round(p.start_epoch / state.epoch_fraction),
                           p.accumulation) for i, p in enumerate(segment.phases)],
                         on_switch=phase_line),
        LRMomentumSchedule(schedule.lr, schedule.momentum, micro, world.size,
                           state.epoch_fraction),
        NonFiniteSteps(state, config.on_nonfinite, config.max_nonfinite_skips, writer),
        StopAtStep(state, config.max_steps),
        BNStatistics(state, bn_data, config.eval_every),
        Evaluation(state, eval_data, config.eval_every),
        EpochLogger(state, micro),
        TensorBoardScalars(state, writer),
        CheckpointSaver(state, saver, checkpoint_state),
        StopAtEpoch(state, job.stop_at_epoch),
    ]


def restore(job: Job, model, state: RunState, checkpoint) -> None:
    """The resumed checkpoint's variables and clock; newer checkpoints and history set aside."""
    config, (path, saved) = job.config, job.resume_from
    checkpointing.restore(checkpoint, path, optimizers=[unwrap(model.optimizer)],
                          variables=model.trainable_variables)
    state.elapsed_before = float(saved.get("elapsed", 0.0))
    state.skips_in_a_row = int(saved.get("nonfinite_skips_in_a_row", 0))
    if job.world.chief:
        logger.info("restored %s", path)
        for moved in checkpointing.set_aside_newer(config.model_dir, path):
            logger.warning("moved newer checkpoint to %s (this run trains its epochs again)",
                           moved)
        dropped = checkpointing.trim_history(config.model_dir, saved["epoch"])
        if dropped:
            logger.warning("history.jsonl: dropped %d line(s) past epoch %.3f (they are "
                           "trained again)", dropped, saved["epoch"])
        logger.info("resumed at epoch %.3f (%d samples, step %d) from phase %d%s",
                    saved["epoch"], int(state.samples_seen.numpy()), int(state.steps.numpy()),
                    saved["phase"] + 1, " (its end: a phase boundary)"
                    if saved.get("phase_boundary") else "")


def fit(job: Job, model, state: RunState, schedule, data, writer, saver) -> bool:
    """model.fit once per segment of the phases this job runs; True when the run is complete."""
    train_data = data[0]
    start = round(job.resume_from[1]["epoch"] / state.epoch_fraction) if job.resume_from else 0
    verbose = progbar_verbosity(job.world.chief)
    for segment in batch_plan.fit_segments(job.plans, job.info.train_examples,
                                           state.epoch_fraction):
        if segment.end_epoch <= start:
            continue  # resumed past it
        if segment.workers != job.world.size:
            return False  # the next phases run on another world size: relaunch
        first = max(start, segment.first_epoch)
        skip = (first - segment.first_epoch) * segment.steps_per_epoch
        state.micro_batches_in_segment = skip
        progress_setup(state, first)
        callbacks = make_callbacks(job, state, segment, schedule, data, writer, saver)
        model.fit(train_data(segment, skip), initial_epoch=first, epochs=segment.end_epoch,
                  steps_per_epoch=segment.steps_per_epoch, callbacks=callbacks,
                  verbose=verbose)
        if model.stop_training:  # --stop_at_epoch, --max_steps or the end of this world size
            return bool(state.finishing)
        start = segment.end_epoch
    return True


def progress_setup(state: RunState, keras_epoch: int) -> None:
    state.keras_epoch, state.batch = keras_epoch, 0
    watchdog.progress("phase set-up", state.plan_of(keras_epoch).index + 1,
                      round(state.epoch(), 4), int(state.steps.numpy()))


def main(argv):
    del argv
    # absl (app.run) owns the log handler: a short format, so the log reads
    # "21:29:06 epoch 1.00 | ..." rather than absl's thread id and source line.
    absl_logging.get_absl_handler().setFormatter(
        logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    config = resolve(FLAGS)
    experiment = get_experiment(config.exp)
    if config.batch_schedule:
        experiment = with_batch_schedule(experiment, config.batch_schedule)
    if FLAGS.plan_only:
        print_plan(config, experiment)
        return
    sizes = sizes_without_reading(config)
    if sizes is not None:  # before any collective: the card's command on the embedded default
        check_batch_fits(config, experiment, sizes.train)
    # A run already in --model_dir must have this configuration (world size, engine, grid and
    # timeouts may differ); checked on every rank before anything is written.
    existing_run = checkpointing.check_config(config.model_dir, json.loads(config.to_json()))

    # Flags -> world -> data -> model -> optimizer -> callbacks -> fit -> summary.
    world = start_world(config)
    tf.keras.utils.set_random_seed(config.seed)  # same initial weights everywhere; broadcast below
    job = plan_job(config, experiment, world, sizes)
    data = make_data(job)
    model = build_model(config, job.info)
    model.compile(optimizer=build_optimizer(config))
    tftorus.world.broadcast_variables(model.variables, root_rank=0)  # all start from rank 0's
    schedule = make_schedule(config)
    state = RunState(world=world, plans=job.plans, dataset_size=job.info.train_examples,
                     epoch_fraction=epochs_per_keras_epoch(job.plans),
                     model_dir=config.model_dir)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer,
                                     samples_seen=state.samples_seen, steps=state.steps)
    os.makedirs(config.model_dir, exist_ok=True)
    writer = saver = None
    if world.chief:
        log_start(job, existing_run, model)
        writer = tf.summary.create_file_writer(os.path.join(config.model_dir, "tensorboard"))
        saver = checkpointing.CheckpointWriter(checkpoint, config.model_dir,
                                               keep=config.keep_checkpoints)
    if job.resume_from:
        restore(job, model, state, checkpoint)
    complete = fit(job, model, state, schedule, data, writer, saver)

    if world.chief:
        log_end(job, state, complete)
    watchdog.stop()  # this rank finished: its silence from now on is no loss
    tftorus.shutdown()  # every worker is past its last collective before any exits


def log_start(job: Job, existing_run: bool, model) -> None:
    config, info = job.config, job.info
    logger.info("configuration:\n%s", config.to_json())
    logger.info("%s on %d worker(s), torus grid %s, data: %d train / %d validation images, "
                "%d classes", job.experiment.name, job.world.size,
                tftorus.context.default_grid(), info.train_examples, info.validation_examples,
                info.num_classes)
    logger.info("LR schedule x %.6g of the paper's (%s); momentum reference batch %g",
                config.lr_scale,
                f"1/{config.batch_divisor}: the batches are divided by --batch_divisor="
                f"{config.batch_divisor} (linear scaling rule)"
                if config.lr_scale_from == "batch_divisor" else "--lr_scale",
                config.reference_batch / config.batch_divisor)
    if isinstance(model.optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
        logger.info("mixed precision: FP16 compute, FP32 variables and LARS, dynamic loss "
                    "scale starting at %g", float(model.optimizer.initial_scale))
    if not existing_run:  # a resumed run keeps the config.json it started with
        checkpointing.write_json_atomic(os.path.join(config.model_dir, "config.json"),
                                        config.to_json())


def log_end(job: Job, state: RunState, complete: bool) -> None:
    """The paper's Table 5 (accuracy, time) and Table 6 (throughput) lines for a finished run;
    for a stopped one, how to continue."""
    config, relaunch = job.config, job.relaunch
    epoch = state.history[-1].epoch if state.history else None
    if complete and state.history:
        summary = run_summary(state, job.experiment, str(tftorus.context.default_grid()))
        log_summary(summary, state, job.experiment,
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
                    job.resume_from[1]["epoch"] if job.resume_from else 0.0)


def run(argv):
    watchdog.handle_termination()  # the launcher's SIGTERM: one line saying what this rank did
    try:
        # the tf engine's failed collectives, and records failing a check mid-run, in words
        with translate_errors(), input_pipeline.data_errors_in_words():
            main(argv)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)
    except CollectiveError as error:  # a peer died or stalled: nothing to wait for
        # who was lost, if the heartbeats know (or learn within their timeout); a lost or
        # stalled worker is then why the run stops, with the watchdog's status on every rank,
        # whether its verdict or a peer's closed connection reached this rank first
        verdict = watchdog.verdict_after_failure()
        print(f"error: {error}" + (f" Watchdog: {verdict}." if verdict else ""), file=sys.stderr,
              flush=True)
        os._exit(watchdog.EXIT_STATUS if verdict else 3)


if __name__ == "__main__":
    app.run(run)
