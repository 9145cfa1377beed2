"""Training steps across emulated hosts: tftorus' DistributedOptimizer beside its peer.

The peer: Horovod's own DistributedOptimizer on the classic stack, MultiWorkerMirroredStrategy
on the current one.

    sudo .venv/bin/python -m studies.emulated_step                  # 1x4, 2x2, 2x4 at 0.25 Gbit/s
    sudo .venv/bin/python -m studies.emulated_step --clusters 2x2 --link-gbit 0.25 1 \\
        --wires fp16 fp32 --repeats 3
    sudo .venv-current/bin/python -m studies.emulated_step --clusters 2x2 1x4 \\
        --wires fp32 fp16 --variants mwms default --repeats 3     # the current stack

What a user measures: `model.fit` steps of Keras' ResNet-50 (32 x 32 images, 10 classes, SGD
with momentum, --batch images per rank, synthetic data made in each process) on the emulated
cluster of studies/emulated_cluster.py (a network namespace per host, rate-limited host links,
every rank on this machine's cores). Variants, each its own model and optimizer in the same
processes:

  hvd       horovod.tensorflow.keras.DistributedOptimizer (Horovod's own, the reference)
  default   tftorus.keras.DistributedOptimizer with nothing but the wire compression (the
            planner's first plan: an assumed backward pass)
  replanned the same after tftorus.keras.ReplanCallback (its plan for the step its clocks
            measured, made in three untimed steps before the repeats)
  torus, ring, hierarchical   the same with algorithm= forced
  default-tf  tftorus' default on its tf engine (TensorFlow's collective ops: its rows and
            columns run at once) under horovodrun, Horovod started beside it for hvd and the
            Horovod-engine variants (tftorus.init(engine='tf', with_horovod=True))
  default-grpc  (current stack) the default with the tf engine's rows of a host over gRPC
            instead of /dev/shm (tftorus/engines/shared_memory.py), in the same processes
  compute   the plain optimizer, no reduction: the compute alone, with every rank at work

--fusion-mb sets tftorus' bucket size for its variants (Horovod's optimizer keeps its own).

--model virtual trains studies/virtual_accelerator.py's VirtualResNet50 instead: ResNet-50's
variables, whose forward and backward passes wait (no CPU) as a GPU's would run, layer by layer,
so the all-reduce has the cores and overlap can show as on a GPU cluster. Its step takes
--compute-s seconds (the paper's V100 step profile scaled), or, with --ratio R (the classic
stack: hvd must be a variant), Horovod's all-reduce alone over R, measured in the launch before
the repeats and printed (pass that as --compute-s on the current stack to set MWMS and tftorus
against the same compute). The table then has a "bound" column: the most of the smaller of
compute and all-reduce any schedule can hide, as the model's first gradient is ready only after
the forward pass and the last layer's backward (studies/gradient_readiness.py's bound, exact
here).
Every rank gets its share of this machine's cores as TF_NUM_INTRAOP_THREADS (cores / ranks, at
least 1; --intra-op-threads sets it, 0 leaves TensorFlow's pool per core in every rank), as an
emulated host's ranks would have their host's cores.

For every variant also the all-reduce alone: its optimizer's reduction (`_allreduce_grads`, what
its compute_gradients calls) on gradient-shaped tensors, with no forward or backward pass.
Each repeat runs the variants in a rotated order; a variant's time is the slowest rank's median
step. The table gives medians over repeats and, per repeat then their median, the step's ratio
to hvd's and to max(compute, all-reduce), and how much of the smaller of the two the step hides:
(compute + all-reduce - step) / min(compute, all-reduce); then every rank's CPU seconds in a step
and in one all-reduce alone (what the reduction takes from the compute's cores where they
overlap; studies/gradient_readiness.py gives the other bound, when the buckets are ready).
Needs root; exits 77 where namespaces cannot be made. The CSV (default
/tmp/tftorus_step/steps.csv) is not for the repository.

On the current stack (TensorFlow >= 2.16, Keras 3, no Horovod; tftorus/runtime/stack.py tells) the
peer is tf.distribute.MultiWorkerMirroredStrategy, and no rank is started by horovodrun: each gets a
TF_CONFIG naming every rank at its host's address (emulated_cluster.launch_tf_config).

  mwms      the model built and compiled in MultiWorkerMirroredStrategy's scope, plain SGD with
            momentum, model.fit; its all-reduces on TF's ring (CommunicationOptions(
            implementation=RING), the CPU's collectives over gRPC), always FP32 (MWMS has no
            wire compression). Keras 3.15's fit cannot run under MWMS as shipped
            (keras-team/keras#20585): two calls of strategy.reduce fail, so this variant
            makes them work (see `mwms_keras3_shims`); `mwms-as-shipped` runs without that and
            shows the error.
  mwms-pack4, mwms-pack16, mwms-pack32   the same with CommunicationOptions(bytes_per_pack=)
            of 4, 16, 32 MiB (mwms: 0, TF's default, one pack), as its users tune it: the
            ratio column is to the fastest MWMS variant of the run.
  default, torus, ring, hierarchical, compute   as above, on tftorus' tf engine.

--timeline DIR (the classic stack, --model virtual, one cluster, link rate and wire) runs one
more step per variant after the repeats, every rank started together, with Horovod's timeline
on for the launch (DIR/horovod_timeline.json, rank 0's); rank 0 saves that step's waits and
buckets as DIR/step_<variant>.json. `python -m studies.step_timeline DIR --out step.png` draws
and tabulates them (studies/step_timeline.py).

MWMS and the tf engine each start a TF server from TF_CONFIG, so they cannot share a process:
each repeat is one launch of the tftorus variants (every wire, rotated order) and one of MWMS'
(in turn first and second), each with its own model and data, same shapes and batch per rank.
MWMS' all-reduce alone is its replica context's all_reduce(SUM) of the gradient-shaped tensors
(what Keras 3's optimizer calls under a strategy); its rows carry wire fp32, and stand beside
every wire's table as the peer. The ratio column is step / peer (hvd or mwms).
"""
import argparse
import contextlib
import csv
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Tuple

from studies import emulated_cluster as cluster
from studies.out_dir import own_dir

DEFAULT_OUT = os.path.join(tempfile.gettempdir(), "tftorus_step")
VARIANTS = ("hvd", "default", "replanned", "torus", "ring", "hierarchical")
CLASSIC_VARIANTS = VARIANTS + ("default-tf",)  # the tf engine beside Horovod's
#: MWMS with CommunicationOptions(bytes_per_pack=) of these MiB: its gradients all-reduced in
#: packs, each as soon as its gradients are ready (0, TF's default: one pack after the last)
MWMS_PACKS = ("mwms-pack4", "mwms-pack16", "mwms-pack32")
MWMS_VARIANTS = ("mwms", "mwms-as-shipped") + MWMS_PACKS  # the current stack's peers, each
#                                                         # in its own launches
#: the current stack's default with the tf engine's rows of a host over gRPC, not /dev/shm
#: (TFTORUS_TF_SHARED_MEMORY=0 for this model alone), beside the default in the same processes
CURRENT_VARIANTS = MWMS_VARIANTS + VARIANTS[1:] + ("default-grpc",)
FIELDS = ("hosts", "ranks_per_host", "link_gbit", "wire", "repeat", "variant", "step_s",
          "allreduce_s", "step_cpu_s", "allreduce_cpu_s", "model")


def topology(text: str):
    """HOSTSxRANKS_PER_HOST as emulated_cluster reads it, both at least 1."""
    try:
        hosts, rph = cluster.topology(text)
    except argparse.ArgumentTypeError:
        hosts = rph = 0
    if hosts < 1 or rph < 1:
        raise argparse.ArgumentTypeError(
            f"--clusters takes HOSTSxRANKS_PER_HOST, e.g. 2x2, got {text!r}")
    return hosts, rph


# ==================================================================================================
# The stacks: the one place this study asks which one it runs on (tftorus/runtime/stack.py answers)
# ==================================================================================================

def horovod_here() -> bool:
    """True on the classic stack (Horovod, Keras 2), False on the current one (Keras 3)."""
    from tftorus.runtime import stack
    return stack.HOROVOD


def peer_of(horovod: bool) -> str:
    """The variant every other is set against: Horovod's optimizer, or TF's own strategy."""
    return "hvd" if horovod else "mwms"


def parse_args(argv=None, horovod=None):
    """`horovod`: the stack (None: ask tftorus.runtime.stack); it sets the variants and the peer."""
    horovod = horovod_here() if horovod is None else horovod
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clusters", nargs="+", type=topology, default=[(1, 4), (2, 2), (2, 4)])
    p.add_argument("--link-gbit", nargs="+", type=float, default=[0.25])
    p.add_argument("--wires", nargs="+", choices=("fp16", "fp32"), default=["fp16", "fp32"])
    p.add_argument("--variants", nargs="+",
                   choices=CLASSIC_VARIANTS if horovod else CURRENT_VARIANTS,
                   default=[peer_of(horovod), "default"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=4, help="timed steps per fit call")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    p.add_argument("--batch", type=int, default=4, help="images per rank and step")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--model", choices=("resnet50", "virtual"), default="resnet50",
                   help="Keras' ResNet-50 on this machine's cores, or the virtual accelerator's "
                        "(studies/virtual_accelerator.py: its waits use no CPU)")
    p.add_argument("--compute-s", type=float, default=None,
                   help="--model virtual: its forward and backward pass in seconds a step")
    p.add_argument("--ratio", type=float, default=None,
                   help="--model virtual, classic stack: its compute = hvd's all-reduce alone / "
                        "RATIO, measured in the launch")
    p.add_argument("--fusion-mb", type=float, default=None,
                   help="tftorus' bucket size (fusion_threshold_bytes) in MiB; default: its own")
    p.add_argument("--intra-op-threads", type=int, default=None,
                   help="TF_NUM_INTRAOP_THREADS of every rank (default: this machine's cores "
                        "shared among the cluster's ranks, at least 1; 0: TensorFlow's own, a "
                        "pool per core in every rank)")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--timeline", default=None, metavar="DIR",
                   help="--model virtual, classic stack: one more step per variant after the "
                        "repeats, saved for studies/step_timeline.py in DIR (rank 0's waits "
                        "and Horovod's timeline)")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds per launch (one per cluster and wire on the classic stack, two "
                        "per cluster and repeat on the current one)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--meta", nargs=3, default=None, help=argparse.SUPPRESS)
    p.add_argument("--first-repeat", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--repeats and --steps must be >= 1, --warmup >= 0")
    virtual = args.model == "virtual"
    if not virtual and (args.compute_s is not None or args.ratio is not None):
        p.error("--compute-s and --ratio set the virtual accelerator's step: add --model virtual")
    if virtual and (args.compute_s is None) == (args.ratio is None):
        p.error("--model virtual takes one of --compute-s SECONDS or --ratio R (all-reduce alone "
                "/ compute)")
    if any(v is not None and v <= 0 for v in (args.compute_s, args.ratio)):
        p.error("--compute-s and --ratio must be > 0")
    if args.ratio is not None and (not horovod or "hvd" not in args.variants):
        p.error("--ratio measures Horovod's all-reduce alone: on the classic stack with hvd among "
                "--variants; elsewhere give --compute-s (a --ratio run prints the value)")
    if args.intra_op_threads is not None and args.intra_op_threads < 0:
        p.error(f"--intra-op-threads takes 0 (TensorFlow's default) or more threads per rank, "
                f"got {args.intra_op_threads}")
    if args.timeline is not None:
        if not horovod or not virtual:
            p.error("--timeline draws the virtual accelerator's step beside Horovod's timeline: "
                    "on the classic stack (.venv, with Horovod) and with --model virtual")
        if not args.worker and (len(args.clusters) != 1 or len(args.link_gbit) != 1
                                or len(args.wires) != 1):
            p.error("--timeline draws one launch: give one --clusters, one --link-gbit and one "
                    "--wires")
        args.timeline = os.path.abspath(args.timeline)
    args.horovod = horovod
    return args


# ==================================================================================================
# Worker: one process per rank, inside its host's namespace
# ==================================================================================================

def worker(args) -> None:
    if set(args.variants) & set(MWMS_VARIANTS):
        mwms_worker(args)
    else:
        torus_worker(args)


def runtime(tf):
    """(rank, line_up(), slowest(seconds), total(seconds)) of this process' runtime: Horovod's
    on the classic stack, tftorus' tf engine (started by tftorus.init() from TF_CONFIG) on the
    current one. line_up: a tiny all-reduce, so every rank starts a timing together; slowest:
    the largest of every rank's value; total: their sum."""
    if horovod_here():
        import horovod.tensorflow as hvd_tf
        return (hvd_tf.rank(),
                lambda: hvd_tf.allreduce(tf.constant(0.0), name="line_up"),
                lambda seconds: float(hvd_tf.allreduce(tf.constant(seconds, tf.float64),
                                                       op=hvd_tf.Max, name="slowest")),
                lambda seconds: float(hvd_tf.allreduce(tf.constant(seconds, tf.float64),
                                                       op=hvd_tf.Sum, name="total")))
    from tftorus.runtime import world
    rank, size = world.rank(), world.size()
    return (rank, lambda: world.allreduce_sum(tf.constant(0.0)),
            lambda seconds: largest(world.allreduce_sum, rank, size, seconds, tf),
            lambda seconds: float(world.allreduce_sum(tf.constant(seconds, tf.float64))))


def largest(sum_fn, rank: int, size: int, seconds: float, tf) -> float:
    """Every rank's value by a sum (each puts its own at its index, zeros elsewhere): exact, and
    any runtime has a sum."""
    mine = tf.one_hot(rank, size, dtype=tf.float64) * seconds
    return float(tf.reduce_max(sum_fn(mine)))


class _Timing:
    """A Keras callback's wall and CPU times of each train batch (the same on Keras 2 and 3: a
    step's function returns when its ops are done). CPU: this process' every thread
    (TensorFlow's, the collectives' and the engine's), from time.process_time."""

    @staticmethod
    def callback(tf):
        class StepTimes(tf.keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                self.times, self.cpu = [], []

            def on_train_batch_begin(self, batch, logs=None):
                self.start, self.cpu_start = time.perf_counter(), time.process_time()

            def on_train_batch_end(self, batch, logs=None):
                self.times.append(time.perf_counter() - self.start)
                self.cpu.append(time.process_time() - self.cpu_start)

        return StepTimes()


def model_and_data(tf, args, rank: int, global_batch: int):
    """(make_model() -> (model, loss), the data set) of --model: Keras' ResNet-50 on images, or
    the virtual accelerator's (its input only carries the dependency; its step takes
    --compute-s, or a placeholder until --ratio's measurement sets it)."""
    import numpy as np
    if args.model == "virtual":
        from studies.virtual_accelerator import PAPER_STEP_SECONDS, VirtualResNet50
        seconds = args.compute_s or PAPER_STEP_SECONDS
        x = tf.zeros((global_batch, 1))
        data = tf.data.Dataset.from_tensors((x, x)).repeat()
        return (lambda: (VirtualResNet50(rank, step_seconds=seconds,
                                         record=args.timeline is not None),
                         tf.keras.losses.MeanSquaredError()), data)
    shape = (args.image_size, args.image_size, 3)
    images = tf.random.uniform((global_batch,) + shape)
    labels = tf.constant(np.arange(global_batch) % 10)
    data = tf.data.Dataset.from_tensors((images, labels)).repeat()
    return (lambda: (tf.keras.applications.ResNet50(
        weights=None, input_shape=shape, classes=10, classifier_activation=None),
        tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)), data)


def log_tftorus_plans() -> None:
    """tftorus' INFO lines (its links, each plan and why; rank 0 writes them) into this rank's
    output, so the run's log says what each tftorus variant ran."""
    import logging
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("  %(message)s"))
    logging.getLogger("tftorus").addHandler(handler)
    logging.getLogger("tftorus").setLevel(logging.INFO)


def torus_worker(args) -> None:
    import tftorus
    log_tftorus_plans()
    both_engines = "default-tf" in args.variants
    tftorus.init(**(dict(engine="tf", with_horovod=True) if both_engines else {}))
    clock_at_init = None
    if args.timeline is not None:  # where Horovod's timeline read the wall clock, in init
        from studies import step_timeline
        clock_at_init = step_timeline.epoch_minus_perf()
    import tensorflow as tf

    import tftorus.keras
    from tftorus.runtime import reduction

    rank, line_up, slowest, total = runtime(tf)
    hvd_keras = None
    if args.horovod:
        import horovod.tensorflow.keras as hvd_keras
    tf.keras.utils.set_random_seed(rank)
    make_model, data = model_and_data(tf, args, rank, args.batch)

    def optimizer(variant, wire):
        sgd = tf.keras.optimizers.SGD(0.01, momentum=0.9)
        if variant == "compute":
            return sgd
        if variant == "hvd":
            return hvd_keras.DistributedOptimizer(sgd, compression=getattr(
                hvd_keras.Compression, "fp16" if wire == "fp16" else "none"))
        compression = getattr(tftorus.Compression, "fp16" if wire == "fp16" else "none")
        torus = {} if variant in ("default", "replanned", "default-tf", "default-grpc") else {
            "algorithm": variant}
        if both_engines:  # the tf engine is init's; the others stay on Horovod's
            torus["engine"] = "tf" if variant == "default-tf" else "horovod"
        if args.fusion_mb is not None:
            torus["fusion_threshold_bytes"] = int(args.fusion_mb * (1 << 20))
        return tftorus.keras.DistributedOptimizer(sgd, compression=compression, **torus)

    meta = dict(zip(("hosts", "ranks_per_host", "link_gbit"), args.meta))
    for wire in args.wires:
        variants = ["compute"] + list(args.variants)
        built, plans = {}, {}
        # the replanned model last: the others trace their steps (one untimed step each) before
        # its profile exists, which every plan of the same gradient set would take
        for variant in sorted(variants, key=lambda v: v == "replanned"):
            plans_before = set(reduction._plans)  # then the plans tftorus made for it
            model, loss = make_model()
            opt = optimizer(variant, wire)
            model.compile(opt, loss)
            grads = [tf.random.normal(v.shape, seed=1) * 1e-3 for v in model.trainable_variables]
            reduce_fn = None
            if variant != "compute":
                reduce_fn = tf.function(  # plain Python: nothing for AutoGraph to convert
                    lambda g, o=opt, m=model: o._allreduce_grads(g, m.trainable_variables),
                    autograph=False)
            built[variant] = (model, reduce_fn, grads)
            over_grpc = variant == "default-grpc"
            with rows_over_grpc(over_grpc):  # its graphs are traced here, so they keep it
                if variant != "replanned":  # it is clocked below, at the step it is timed at
                    model.fit(data, steps_per_epoch=1, epochs=1, verbose=0)
                if over_grpc:
                    reduce_fn.get_concrete_function(grads)
            plans[variant] = [p for key, p in reduction._plans.items() if key not in plans_before]
        if args.ratio is not None:  # the virtual step: hvd's all-reduce alone / ratio
            _, reduce_fn, grads = built["hvd"]
            alone, _ = time_allreduce(args, lambda: reduce_fn(grads), line_up)
            alone = slowest(alone)  # a collective: every rank calls it
            compute = alone / args.ratio
            for model, _, _ in built.values():
                model.set_step_seconds(compute)
            if rank == 0:
                print(f"  {wire} hvd's all-reduce alone {alone:.3f} s: the virtual "
                      f"step's compute {compute:.4f} s (--compute-s {compute:.4f} sets it)",
                      flush=True)
        if "replanned" in built:  # its clocks must see the step --ratio has set
            plans_before = set(reduction._plans)
            replan = tftorus.keras.ReplanCallback(after_steps=2)
            built["replanned"][0].fit(data, steps_per_epoch=3, epochs=1, verbose=0,
                                      callbacks=[replan])
            plans["replanned"] += [p for key, p in reduction._plans.items()
                                   if key not in plans_before]
            if rank == 0:
                print(f"  {wire} replanned: {replan.replanned}", flush=True)
        rows = []
        for repeat in range(args.first_repeat, args.first_repeat + args.repeats):
            shift = repeat % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                model, reduce_fn, grads = built[variant]
                line_up()  # start together
                step, step_cpu = fit_step(tf, args, model, data)
                step, step_cpu = slowest(step), total(step_cpu)
                allreduce = allreduce_cpu = 0.0
                if reduce_fn is not None:
                    allreduce, allreduce_cpu = time_allreduce(
                        args, lambda: reduce_fn(grads), line_up)
                    allreduce, allreduce_cpu = slowest(allreduce), total(allreduce_cpu)
                rows.append(row_of(meta, wire, repeat, variant, step, allreduce, step_cpu,
                                   allreduce_cpu, args.model))
                if rank == 0:
                    print(f"  {wire} repeat {repeat} {variant:12s} step {step:.3f} s, "
                          f"all-reduce alone {allreduce:.3f} s", flush=True)
        if rank == 0:
            append_csv(os.path.join(args.out, "steps.csv"), rows)
        for variant in args.variants if args.timeline is not None else ():
            model = built[variant][0]
            start, end = step_timeline.one_step(tf, model, data, line_up)
            if rank == 0:
                path = step_timeline.record_step(args.timeline, variant, wire, model, start, end,
                                                 clock_at_init, plans[variant])
                print(f"  {wire} {variant}: one step ({end - start:.3f} s) in {path}",
                      flush=True)
        del built
    tftorus.shutdown()


@contextlib.contextmanager
def rows_over_grpc(on: bool):
    """Graphs traced inside take the tf engine's rows over gRPC, not through /dev/shm."""
    from tftorus.runtime import process_state
    comm = process_state.communicator()
    transport = getattr(comm, "shared_memory", None)
    if on:
        comm.shared_memory = None
    try:
        yield
    finally:
        if on:
            comm.shared_memory = transport


def fit_step(tf, args, model, data) -> Tuple[float, float]:
    """This rank's median step and median CPU seconds a step over `args.steps` model.fit steps
    after `args.warmup`."""
    timer = _Timing.callback(tf)
    model.fit(data, steps_per_epoch=args.warmup + args.steps, epochs=1, verbose=0,
              callbacks=[timer])
    return (statistics.median(timer.times[args.warmup:]),
            statistics.median(timer.cpu[args.warmup:]))


def time_allreduce(args, reduce_once, line_up) -> Tuple[float, float]:
    """This rank's median time of the reduction alone (every result read back), each call
    started together, and its median CPU seconds a call."""
    calls, cpu = [], []
    for _ in range(args.warmup + args.steps):
        line_up()
        start, cpu_start = time.perf_counter(), time.process_time()
        for t in reduce_once():
            t.numpy()
        calls.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    return statistics.median(calls[args.warmup:]), statistics.median(cpu[args.warmup:])


def row_of(meta, wire, repeat, variant, step, allreduce, step_cpu=0.0,
           allreduce_cpu=0.0, model="resnet50") -> dict:
    """A CSV row; the CPU seconds are every rank's together."""
    return {**meta, "wire": wire, "repeat": repeat, "variant": variant,
            "step_s": f"{step:.4f}", "allreduce_s": f"{allreduce:.4f}",
            "step_cpu_s": f"{step_cpu:.4f}", "allreduce_cpu_s": f"{allreduce_cpu:.4f}",
            "model": model}


# ==================================================================================================
# MultiWorkerMirroredStrategy (the current stack's peer), in processes of its own
# ==================================================================================================

def mwms_keras3_shims(strategy, tf) -> None:
    """What Keras 3.15's model.fit needs of MultiWorkerMirroredStrategy and TF 2.21 does not give
    (keras-team/keras#20585, open; tensorflow/tensorflow#72388): its `strategy.reduce` takes one
    value, not a nest, and a MEAN along axis 0 fails on a scalar. Keras calls it on the whole
    (images, labels) batch before the first step (_maybe_symbolic_build: "Attempt to convert a
    value (PerReplica ...) to a Tensor"), and on each step's scalar loss with axis=0 ("Invalid
    reduction dimension 0 for input with 0 dimensions"). Here it takes a nest, and a scalar is
    reduced across replicas alone (axis=None), as Keras 2 did. Nothing of the step's gradient
    all-reduce changes."""
    reduce = strategy.reduce

    def one(op, value, axis):
        if axis is not None and all(t.shape.rank == 0
                                    for t in strategy.experimental_local_results(value)):
            axis = None
        return reduce(op, value, axis=axis)

    strategy.reduce = lambda op, value, axis=None: tf.nest.map_structure(
        lambda v: one(op, v, axis), value)


def mwms_worker(args) -> None:
    """One rank of MWMS' launch: its model.fit steps and all-reduce alone, per repeat given."""
    import tensorflow as tf
    (variant,) = args.variants
    pack_mib = int(variant.rsplit("pack", 1)[1]) if variant in MWMS_PACKS else 0
    ring = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=pack_mib << 20,
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=ring)
    if variant != "mwms-as-shipped":
        mwms_keras3_shims(strategy, tf)
    rank, size = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync

    @tf.function(autograph=False)  # eager, MWMS warns of its overhead at every call
    def sum_fn(value):  # a sum over the workers: each contributes its own
        return strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(tf.identity, args=(value,)), axis=None)

    def line_up():
        sum_fn(tf.constant(0.0))

    def slowest(seconds):
        return largest(sum_fn, rank, size, seconds, tf)

    def total(seconds):
        return float(sum_fn(tf.constant(seconds, tf.float64)))

    tf.keras.utils.set_random_seed(rank)
    # MWMS takes the global batch and gives each worker its share: args.batch images a rank.
    make_model, data = model_and_data(tf, args, rank, args.batch * size)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = data.with_options(options)
    first = next(iter(strategy.experimental_distribute_dataset(data)))[0]
    local = strategy.experimental_local_results(first)
    if [int(t.shape[0]) for t in local] != [args.batch]:
        raise RuntimeError(f"MWMS gave this worker batches of {[t.shape for t in local]}, "
                           f"not one of {args.batch}")
    with strategy.scope():
        model, loss = make_model()
        model.compile(tf.keras.optimizers.SGD(0.01, momentum=0.9), loss)
    grads = [tf.random.normal(v.shape, seed=1) * 1e-3 for v in model.trainable_variables]

    @tf.function(autograph=False)
    def reduce_once():  # what Keras 3's optimizer calls in a strategy's replica context
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, grads))

    meta = dict(zip(("hosts", "ranks_per_host", "link_gbit"), args.meta))
    rows = []
    for repeat in range(args.first_repeat, args.first_repeat + args.repeats):
        line_up()
        try:
            mine, mine_cpu = fit_step(tf, args, model, data)
        except Exception as error:  # as shipped: Keras 3's fit under MWMS (mwms_keras3_shims)
            text = " ".join(str(error).split())
            short = text if len(text) < 240 else f"{text[:120]} ... {text[-110:]}"
            print(f"  {variant}: model.fit failed: {type(error).__name__}: {short}", flush=True)
            raise SystemExit(1)
        step, step_cpu = slowest(mine), total(mine_cpu)
        allreduce, allreduce_cpu = time_allreduce(args, lambda: [
            strategy.experimental_local_results(t)[0] for t in reduce_once()], line_up)
        allreduce, allreduce_cpu = slowest(allreduce), total(allreduce_cpu)
        rows.append(row_of(meta, "fp32", repeat, variant, step, allreduce, step_cpu,
                           allreduce_cpu, args.model))
        if rank == 0:
            print(f"  fp32 repeat {repeat} {variant:12s} step {step:.3f} s, "
                  f"all-reduce alone {allreduce:.3f} s", flush=True)
    if rank == 0:
        append_csv(os.path.join(args.out, "steps.csv"), rows)


def append_csv(path: str, rows: List[dict]) -> None:
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerows(rows)


# ==================================================================================================
# Report
# ==================================================================================================

def step_table(rows: List[Dict[str, str]], peer: str = None) -> str:
    """One cluster, rate and wire: per variant the medians and the ratios (see the docstring).
    `peer`: the variant of the ratio column (None: mwms where it was run, else hvd).
    The last two columns (where the CSV has them): every rank's CPU seconds in one step and in
    one all-reduce alone (each rank's median, summed): what the reduction takes from the
    compute's cores where the two overlap. Their sum against the cores times the step tells
    whether the cores or the order of the work set the step."""
    by, cpu = {}, {}
    for r in rows:
        by.setdefault(r["variant"], {})[int(r["repeat"])] = (float(r["step_s"]),
                                                             float(r["allreduce_s"]))
        if r.get("step_cpu_s"):
            cpu.setdefault(r["variant"], {})[int(r["repeat"])] = (float(r["step_cpu_s"]),
                                                                  float(r["allreduce_cpu_s"]))
    if peer is None:  # MWMS as its users would tune it: the fastest of its packings
        tuned = [v for v in by if v in MWMS_VARIANTS and v != "mwms-as-shipped"]
        peer = (min(tuned, key=lambda v: statistics.median(s for s, _ in by[v].values()))
                if tuned else "hvd")
    # the virtual model: compute that can run beside any all-reduce, as a share of its step
    beside = (virtual_overlap_share() if any(r.get("model") == "virtual" for r in rows)
              else None)
    compute = by.get("compute", {})
    base = by.get(peer, {})
    fmt = (lambda v: f"{statistics.median(v):.2f}" if v else "n/a")

    def cpu_of(variant, which):
        return [c[which] for c in cpu.get(variant, {}).values()]

    lines = [f"{'variant':<14}{'step s':>8}{'compute s':>11}{'all-reduce s':>14}"
             f"{'hidden':>8}" + (f"{'bound':>7}" if beside else "")
             + f"{'step/' + peer:>{max(10, len(peer) + 6)}}{'step/max(c,a)':>15}"
             + (f"{'CPU s':>7}{'all-reduce CPU s':>18}" if cpu else "")]
    for variant, reps in by.items():
        if variant == "compute":
            continue
        step = statistics.median(s for s, _ in reps.values())
        alone = statistics.median(a for _, a in reps.values())
        comp = statistics.median(compute[r][0] for r in reps if r in compute) if compute else 0
        to_peer = [s / base[r][0] for r, (s, _) in reps.items() if r in base]
        to_max = [s / max(compute[r][0], a) for r, (s, a) in reps.items() if r in compute]
        hidden = [(compute[r][0] + a - s) / min(compute[r][0], a)
                  for r, (s, a) in reps.items() if r in compute and min(compute[r][0], a) > 0]
        line = f"{variant:<14}{step:>8.3f}{comp:>11.3f}{alone:>14.3f}{fmt(hidden):>8}"
        if beside:
            bound = [min(1.0, beside * compute[r][0] / min(compute[r][0], a))
                     for r, (s, a) in reps.items() if r in compute and min(compute[r][0], a) > 0]
            line += f"{fmt(bound):>7}"
        line += f"{fmt(to_peer):>{max(10, len(peer) + 6)}}{fmt(to_max):>15}"
        if cpu:
            line += f"{fmt(cpu_of(variant, 0)):>7}{fmt(cpu_of(variant, 1)):>18}"
        lines.append(line)
    if cpu and "compute" in cpu:
        lines.append(f"(CPU s: every rank's; compute alone {fmt(cpu_of('compute', 0))} CPU s "
                     f"a step)")
    return "\n".join(lines)


def virtual_overlap_share() -> float:
    """The share of the virtual model's compute after its first gradient is ready (the forward
    pass and the last layer's backward come first): the most any schedule can run beside the
    all-reduce."""
    from studies.virtual_accelerator import layer_profile, readiness
    profile = layer_profile(1.0)
    return 1.0 - min(readiness(profile))


def report(path: str) -> str:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return report_rows(rows)


def report_rows(rows: List[Dict[str, str]]) -> str:
    """A table per cluster, rate and wire. MWMS has no wire compression: its rows (wire fp32)
    stand in every wire's table of their cluster, and make no table of their own."""
    groups = {}
    for r in rows:
        key = (r["hosts"], r["ranks_per_host"], r["link_gbit"], r["wire"])
        groups.setdefault(key, []).append(r)
    peers = {}
    for (hosts, rph, gbit, wire), group in groups.items():
        for r in group:
            if r["variant"] in MWMS_VARIANTS:
                peers.setdefault((hosts, rph, gbit), []).append(r)
    out = []
    for (hosts, rph, gbit, wire), group in groups.items():
        if peers:
            group = [r for r in group if r["variant"] not in MWMS_VARIANTS]
            if not group:
                continue  # MWMS alone: it stands in the tftorus tables of its cluster
            group = peers.get((hosts, rph, gbit), []) + group
        link = "" if hosts == "1" else f", {gbit} Gbit/s host links"
        note = ("; mwms sends FP32 (no compression)" if wire != "fp32" and any(
            r["variant"] in MWMS_VARIANTS for r in group) else "")
        out.append(f"\n== {hosts} host(s) x {rph} ranks{link}, {wire} wire{note} ==\n"
                   + step_table(group))
    return "\n".join(out)


# ==================================================================================================
# Launcher
# ==================================================================================================

def worker_argv(args, wire, meta, variants=None, first_repeat=None) -> List[str]:
    """The command of one rank: `--worker` with the launcher's settings, one wire (or a list),
    and `meta` (hosts, ranks per host, link) for the CSV rows; `variants` and one repeat from
    `first_repeat` where the launch is not every repeat of the launcher's variants."""
    wires = [wire] if isinstance(wire, str) else list(wire)
    repeats = args.repeats if first_repeat is None else 1
    return [sys.executable, "-m", "studies.emulated_step", "--worker", "--wires", *wires,
            "--variants", *(variants or args.variants), "--repeats", str(repeats),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
            "--image-size", str(args.image_size), "--out", args.out, "--model", args.model,
            *(["--compute-s", str(args.compute_s)] if args.compute_s is not None else []),
            *(["--ratio", str(args.ratio)] if args.ratio is not None else []),
            *(["--fusion-mb", str(args.fusion_mb)] if args.fusion_mb is not None else []),
            *(["--first-repeat", str(first_repeat)] if first_repeat is not None else []),
            *(["--timeline", args.timeline] if args.timeline is not None else []),
            "--meta", *meta]


def threads_note(args, ranks: int) -> str:
    """What each rank of a launch gets as TF_NUM_INTRAOP_THREADS, for the launch's title."""
    threads = cluster.intra_op_threads(args.intra_op_threads, ranks)
    return f"TF_NUM_INTRAOP_THREADS {threads or 'default'} per rank"


def current_launches(args, repeat: int) -> List[tuple]:
    """The current stack's launches of one repeat, in order: (name, variants, wires). tftorus'
    variants (and compute) share one launch over every wire, where any is asked; each MWMS
    variant has its own (FP32). The order turns with the repeat, so none always runs first."""
    torus = [v for v in args.variants if v not in MWMS_VARIANTS]
    launches = [("tftorus", torus, args.wires)] if torus else []
    launches += [(v, [v], ["fp32"]) for v in args.variants if v in MWMS_VARIANTS]
    shift = repeat % len(launches)
    return launches[shift:] + launches[:shift]


def run_current(args) -> List[str]:
    """Every cluster of the current stack: per repeat a TF_CONFIG launch of tftorus' variants
    and one of each MWMS variant (they cannot share a process: each starts a TF server).
    The titles of failed launches."""
    failed, launched = [], 0
    for hosts, rph in args.clusters:
        for gbit in (args.link_gbit if hosts > 1 else args.link_gbit[:1]):
            title = f"{hosts}x{rph}" + (f" at {gbit:g} Gbit/s" if hosts > 1 else "")
            print(f"emulated cluster {title}, {threads_note(args, hosts * rph)}", flush=True)
            meta = (str(hosts), str(rph), f"{gbit:g}")
            with cluster.Cluster(hosts, gbit):
                for repeat in range(args.repeats):
                    for name, variants, wires in current_launches(args, repeat):
                        print(f" repeat {repeat}: {name} ({' '.join(variants)}, "
                              f"{' '.join(wires)})", flush=True)
                        argv_worker = worker_argv(args, wires, meta, variants, repeat)
                        log = os.path.join(args.out,
                                           f"ranks_{hosts}x{rph}_{gbit:g}_{name}_{repeat}.log")
                        port = cluster.TF_PORT + 100 * (launched % 50)  # none in TIME_WAIT
                        launched += 1
                        if cluster.launch_tf_config(args, hosts, rph, argv_worker, log, port):
                            failed.append(f"{title}, {name}, repeat {repeat}")
    return failed


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    reason = cluster.why_not_possible()
    if reason:
        print(f"emulated step benchmark skipped: {reason}", file=sys.stderr)
        return cluster.SKIPPED
    own_dir(args.out)
    csv_path = os.path.join(args.out, "steps.csv")
    if os.path.exists(csv_path):
        os.remove(csv_path)  # the tables are of this run
    if args.timeline is not None:  # rank 0 writes Horovod's timeline of the launch there
        os.makedirs(args.timeline, exist_ok=True)
        for old in os.listdir(args.timeline):
            if old.startswith("step_") or old == "horovod_timeline.json":
                os.remove(os.path.join(args.timeline, old))
        os.environ["HOROVOD_TIMELINE"] = os.path.join(args.timeline, "horovod_timeline.json")
    failed = [] if args.horovod else run_current(args)
    for hosts, rph in (args.clusters if args.horovod else []):
        for gbit in (args.link_gbit if hosts > 1 else args.link_gbit[:1]):
            # One launch per wire: every variant's model lives in the same processes, and at
            # 2 x 4 two wires' worth of ResNet-50s (3 GB a rank) ran this machine out of memory.
            for wire in args.wires:
                title = f"{hosts}x{rph}" + (f" at {gbit:g} Gbit/s" if hosts > 1 else "")
                title += f", {wire} wire"
                print(f"emulated cluster {title}, {threads_note(args, hosts * rph)}", flush=True)
                argv_worker = worker_argv(args, wire, (str(hosts), str(rph), f"{gbit:g}"))
                log = os.path.join(args.out, f"ranks_{hosts}x{rph}_{gbit:g}_{wire}.log")
                with cluster.Cluster(hosts, gbit):
                    rc = cluster.launch(args, hosts, rph, argv_worker, log)
                if rc:
                    failed.append(title)
    if os.path.exists(csv_path):
        print(report(csv_path))
        print(f"\nCSV: {csv_path}")
    if args.timeline is not None and not failed:
        print(f"the step per variant: python -m studies.step_timeline {args.timeline} "
              f"--out step_timeline.png")
    return cluster.exit_status(failed)


if __name__ == "__main__":
    sys.exit(main())
