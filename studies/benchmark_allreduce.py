"""Time Horovod's own all-reduce against tftorus' torus, ring and hierarchical, side by side.

Launcher mode (spawns `horovodrun --gloo -np N -H localhost:N` once per world size and prints
rank 0's tables):

    source .venv/bin/activate
    TF_CPP_MIN_LOG_LEVEL=2 python -m studies.benchmark_allreduce --np 4 8

Worker mode (what the launcher runs; can be started by hand too):

    TF_CPP_MIN_LOG_LEVEL=2 horovodrun --gloo -np 4 -H localhost:4 \\
        python -m studies.benchmark_allreduce --worker --grid 2x2

Every variant of one workload is a tf.function (as in training), warmed up, then timed once per
repeat in a rotating order, so machine noise hits all variants alike. A variant's time in one
repeat is the slowest rank's (a tiny all-reduce lines the ranks up before each call); the tables
give the median over repeats and its ratio to Horovod's reference:

  hvd      hvd.grouped_allreduce for a gradient set (what hvd.DistributedOptimizer runs),
           hvd.allreduce for a single buffer
  torus    tftorus.fused_allreduce(algorithm='torus'), row reduce-scatter as alltoall + local sum,
           chunk pipeline as tftorus chooses it (off on Horovod: its collectives run one at a time)
  torus-chunks<K>   the same, each fused buffer forced into K pipelined chunks (--chunks)
  torus-native   the same with hvd.reducescatter in the rows
  ring     tftorus' fusion + one hvd.allreduce over the world
  hierarchical   leader-based: all-reduce in each torus row (a host, on the emulated
           cluster), of the whole buffer among the rows' first ranks, then back along the row

With the tf engine (--engines ... tf, the default), a second job on the same hosts, started
after the first, runs the tf engine alone (tftorus.init(engine='tf'), no Horovod: as its users
run it) and times:

  torus-tf, ring-tf, hierarchical-tf   the same algorithms on TF's collective ops (ring-tf is one
           CollectiveReduceV2 over the world per fused buffer); torus-tf pipelines chunks as
           tftorus chooses (across hosts, from 2 MiB)
  torus-tf-nochunks   torus-tf without the chunk pipeline
  torus-tf-shm, torus-tf-nochunks-shm, planned-tf-shm   the same with the rows of a host through
           shared memory (tftorus/engines/shared_memory.py), in the same job as those without
           it; the tf engine's default on CPUs, so planned-tf-shm is what its users get and the
           names without -shm are TFTORUS_TF_SHARED_MEMORY=0
  torus-tf-chunks<K>  torus-tf with each fused buffer forced into K chunks (--chunks);
           torus-tf-chunks<K>-shm the same with the rows in shared memory
  planned, planned-tf  tftorus' default on each engine: algorithm 'auto', buckets, chunks and
           algorithm per bucket from the planner (tftorus/planning/planner.py) and the links init()
           measured (jobs of two hosts or more), not --fusion-threshold-mb
  mwms     tf.distribute.MultiWorkerMirroredStrategy's own all-reduce path (its
           CollectiveReplicaLauncher, RING, one pack, a fresh instance key per call)

Why two jobs: Horovod's background thread negotiates every HOROVOD_CYCLE_TIME even with nothing
to send. Measured with 8 ranks of `hvd.init()` then 10 s of sleep (2026-12-03, the main job at
271 images/s): 0.62-0.93 CPU-s per rank, 6.5 s of the 10 of a one-core CPU quota for the eight,
against 0.01 per rank for a tf-engine job. Timed in Horovod's processes, the tf engine paid for
that: under the quota its torus took 0.92 of `hvd.allreduce` (docs/studies/planner.md). Each
job's variants are still timed side by side, in rotation; `hvd` is in the first job, and the
second's sums are checked against the tf engine's own ring all-reduce (ring-tf).

The torus' steps are also timed as separate tf.functions (pack, row reduce-scatter, column
all-reduce, row all-gather, unpack, the consistency check), to show where its time goes; the two
row phases also with row 0 working and the other rows idle ("one row's ..."), as on a cluster
whose hosts each have their own cores. Results go to a CSV (--csv, default under /tmp); do not
commit them.
"""
import argparse
import copy
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, NamedTuple, Sequence

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DEFAULT_GRIDS = {4: "2x2", 8: "2x4"}
DEFAULT_OUT_DIR = os.path.join(tempfile.gettempdir(), "tftorus_bench")
SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
REFERENCE = "hvd"


# ==================================================================================================
# Flags
# ==================================================================================================

def parse_size(text: str) -> int:
    """'4K', '16M', '1024' -> bytes."""
    match = re.fullmatch(r"(\d+)\s*([KMG]?)i?B?", text.strip().upper())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 4K, 64K, 1M, 16M)")
    return int(match.group(1)) * SIZE_UNITS[match.group(2)]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    mode = p.add_argument_group("mode")
    mode.add_argument("--np", type=int, nargs="+",
                      help="launcher: world sizes to run, one horovodrun each (e.g. --np 4 8)")
    mode.add_argument("--worker", action="store_true",
                      help="run as a horovodrun worker (the launcher passes this)")
    mode.add_argument("--grids", default="4=2x2,8=2x4",
                      help="launcher: torus grid per world size, 'N=YxX,...' (default: %(default)s)")
    mode.add_argument("--grid", default=None, help="worker: torus grid 'YxX' (default: planned)")
    mode.add_argument("--engines", nargs="+", choices=("horovod", "tf"), default=["horovod", "tf"],
                      help="engines to time beside Horovod's own all-reduce (default: both; the "
                           "tf engine in a job of its own, after Horovod's)")
    mode.add_argument("--tf-alone", action="store_true",
                      help="worker: the tf engine's job (tftorus.init(engine='tf'), no Horovod)")
    work = p.add_argument_group("workloads")
    work.add_argument("--sizes", nargs="*", type=parse_size,
                      default=[parse_size(s) for s in ("4K", "64K", "1M", "16M", "64M")],
                      help="single FP32 buffers to time (default: 4K 64K 1M 16M 64M)")
    work.add_argument("--resnet", nargs="*", choices=("fp32", "fp16"), default=["fp32", "fp16"],
                      help="ResNet-50 gradient set, uncompressed and/or FP16-compressed")
    work.add_argument("--shapes-file", default=None,
                      help="JSON list of gradient shapes (the launcher writes ResNet-50's once)")
    run = p.add_argument_group("timing")
    run.add_argument("--repeats", type=int, default=10, help="timed calls per variant")
    run.add_argument("--warmup", type=int, default=2, help="untimed calls per variant first")
    run.add_argument("--variants", nargs="*", default=None,
                     help="only these variants/phases (default: all); 'hvd' is always kept")
    run.add_argument("--no-phases", dest="phases", action="store_false",
                     help="skip the per-phase torus timings")
    run.add_argument("--chunks", type=int, default=4,
                     help="pipelined chunks per buffer of the torus-chunks<K> and torus-tf-chunks<K> variants")
    run.add_argument("--fusion-threshold-mb", type=float, default=128.0,
                     help="tftorus fusion threshold in MiB (default: 128, Horovod's default)")
    out = p.add_argument_group("output")
    out.add_argument("--csv", default=os.path.join(DEFAULT_OUT_DIR, "allreduce.csv"),
                     help="CSV to append results to (default: %(default)s)")
    out.add_argument("--tag", default="", help="free text stored in the CSV's 'tag' column")
    out.add_argument("--meta", nargs="*", default=[], metavar="KEY=VALUE",
                     help="extra CSV columns (studies/emulated_cluster.py adds hosts, "
                          "ranks_per_host, link_gbit)")
    args = p.parse_args(argv)
    if not args.np and not args.worker:
        p.error("give --np N [N ...] to launch, or --worker under horovodrun")
    return args


# ==================================================================================================
# Workloads
# ==================================================================================================

class Workload(NamedTuple):
    name: str
    shapes: List[List[int]]
    compression: str  # 'none' or 'fp16'

    @property
    def wire_size(self) -> int:
        """Bytes per element on the wire."""
        return 2 if self.compression == "fp16" else 4

    @property
    def is_set(self) -> bool:
        return len(self.shapes) > 1

    @property
    def elements(self) -> int:
        return int(sum(np.prod(s, dtype=np.int64) for s in self.shapes))


def resnet50_shapes() -> List[List[int]]:
    """Shapes of ResNet-50's trainable variables (the model is built, no weights downloaded)."""
    import tensorflow as tf
    model = tf.keras.applications.ResNet50(weights=None)
    shapes = [v.shape.as_list() for v in model.trainable_variables]
    tf.keras.backend.clear_session()
    return shapes


def load_shapes(path) -> List[List[int]]:
    if path:
        with open(path) as f:
            return json.load(f)
    return resnet50_shapes()


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if n == int(n) else f"{n:.1f} {unit}"
        n /= 1024


def build_workloads(args) -> List[Workload]:
    loads = [Workload(f"flat {human_bytes(b)}", [[b // 4]], "none") for b in args.sizes]
    if args.resnet:
        shapes = load_shapes(args.shapes_file)
        loads += [Workload(f"resnet50 {c}", shapes, "none" if c == "fp32" else "fp16")
                  for c in args.resnet]
    return loads


def make_tensors(workload: Workload, seed: int):
    import tensorflow as tf
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.standard_normal(s, dtype=np.float32)) for s in workload.shapes]


# ==================================================================================================
# Variants: each a tf.function over the workload's tensors
# ==================================================================================================

class Setup(NamedTuple):
    """What every variant needs: the communicators and grid tftorus runs on."""
    comm: object  # HorovodCommunicator, alltoall reduce-scatter; None in the tf engine's job
    native: object  # the same with hvd.reducescatter
    grid: object  # TorusGrid
    fusion_bytes: int
    tf_comm: object  # TFCollectiveCommunicator, or None in Horovod's job
    shared_memory: object = None  # the tf engine's in-host transport, for the *-shm variants

    @property
    def job_comm(self):
        """The job's own engine: its barrier lines the ranks up, it gathers the times."""
        return self.comm if self.comm is not None else self.tf_comm


#: The reference each job checks its sums against: Horovod's all-reduce where Horovod runs, else
#: the tf engine's ring (CollectiveReduceV2 over the world, fused as tftorus' ring is)
TF_REFERENCE = "ring-tf"


def is_tf_item(name: str) -> bool:
    """Whether a variant or phase runs on the tf engine (and so in the tf engine's job)."""
    return name.startswith("tf ") or name.endswith("-tf") or "-tf-" in name or name == "mwms"


def jobs(engines: Sequence[str], variants) -> List[tuple]:
    """(variants, tf_alone) of each job to launch, in order: Horovod's (hvd always,
    and tftorus on Horovod's engine), then, where the tf engine is asked for and any of its
    items selected, the tf engine alone (module docstring: why not in Horovod's processes)."""
    horovod_items = None if variants is None else [v for v in variants if not is_tf_item(v)]
    out = [(horovod_items, False)]
    if "tf" in engines:
        tf_items = None if variants is None else [v for v in variants if is_tf_item(v)]
        if tf_items is None or tf_items:
            out.append((tf_items, True))
    return out


def start_tftorus(grid_spec, fusion_bytes: int, tf_alone: bool,
                  shared_memory: bool = False) -> Setup:
    """shared_memory: start the tf engine's in-host transport for the *-shm variants; the other
    variants are traced without it (variant_fns)."""
    import tftorus
    from tftorus.runtime import process_state
    if tf_alone:  # before any other TF call: TF joins its cluster when it starts
        # the transport (on by default) only where *-shm variants are asked: its handshake and
        # segments are no part of the others
        os.environ["TFTORUS_TF_SHARED_MEMORY"] = "1" if shared_memory else "0"
        tftorus.init(grid=grid_spec, engine="tf")
        from tftorus.runtime.stack import hvd
        if hvd is not None and hvd.is_initialized():  # its idle cycles are what we avoid
            raise RuntimeError("the tf engine's job started Horovod")
        tf_comm = process_state.communicator("tf")
        transport, tf_comm.shared_memory = tf_comm.shared_memory, None  # the variants set it
        return Setup(None, None, process_state.default_grid(), fusion_bytes, tf_comm, transport)
    tftorus.init(grid=grid_spec)
    comm = process_state.communicator("horovod")
    native = copy.copy(comm)  # shares the process sets; only the reduce-scatter differs
    native.reduce_scatter_impl = "native"
    return Setup(comm, native, process_state.default_grid(), fusion_bytes, None)


_MWMS = {}  # one launcher per process, as one strategy has: its instance keys never repeat


def mwms_allreduce_fn(tf_comm):
    """Sum a list of tensors the way MultiWorkerMirroredStrategy does for dense gradients."""
    from tensorflow.python.distribute import collective_util, cross_device_utils
    options = collective_util.Options(
        implementation=collective_util.CommunicationImplementation.RING)
    if "launcher" not in _MWMS:
        # tf.distribute numbers its group keys from 1; the tf engine's start at 2**20.
        device = tf_comm.device_name(tf_comm.rank)
        keys = cross_device_utils.CollectiveKeys(group_key_start=1)
        _MWMS["launcher"] = cross_device_utils.CollectiveReplicaLauncher(
            group_key=keys.get_group_key([device]), group_size=tf_comm.size,
            collective_keys=keys, device=device, options=options)
    launcher = _MWMS["launcher"]
    return lambda ts: launcher.batch_all_reduce([list(ts)], options)


def graph(fn):
    """A tf.function as training builds one (no Python control flow to convert here)."""
    import tensorflow as tf
    return tf.function(fn, autograph=False)


def compressions(name: str, horovod: bool = True):
    """(Horovod's compression or None without Horovod, tftorus') for 'none' or 'fp16'."""
    import tftorus
    hvd_comp = None
    if horovod:
        import horovod.tensorflow as hvd
        hvd_comp = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[name]
    return hvd_comp, {"none": tftorus.Compression.none, "fp16": tftorus.Compression.fp16}[name]


def variant_fns(setup: Setup, workload: Workload, chunks: int) -> Dict[str, Callable]:
    """name -> tf.function(list of tensors) for the all-reduce variants of one workload."""
    import tftorus
    hvd_comp, torus_comp = compressions(workload.compression, setup.comm is not None)

    def reference(ts):
        import horovod.tensorflow as hvd
        if workload.is_set:
            return hvd.grouped_allreduce(ts, op=hvd.Sum, compression=hvd_comp)
        return [hvd.allreduce(ts[0], op=hvd.Sum, compression=hvd_comp)]

    def tftorus_fn(algorithm, comm, pipeline_chunks=None, planned=False, shared_memory=False):
        def fn(ts):  # runs when traced: the transport is set for this variant's graph alone
            if comm is setup.tf_comm:
                transport, comm.shared_memory = comm.shared_memory, (
                    setup.shared_memory if shared_memory else None)
                try:
                    return traced(ts)
                finally:
                    comm.shared_memory = transport
            return traced(ts)

        def traced(ts):
            if planned:  # what a user's optimizer does with no knob set
                return tftorus.fused_allreduce(ts, "sum", algorithm="auto",
                                               compression=torus_comp, comm=comm)
            return tftorus.fused_allreduce(
                ts, "sum", algorithm=algorithm, compression=torus_comp, comm=comm,
                torus_grid=setup.grid, fusion_threshold_bytes=setup.fusion_bytes,
                pipeline_chunks=pipeline_chunks)
        return fn

    fns = {}
    if setup.comm is not None:
        fns = {
            REFERENCE: graph(reference),
            "torus": graph(tftorus_fn("torus", setup.comm)),
            f"torus-chunks{chunks}": graph(tftorus_fn("torus", setup.comm, chunks)),
            "torus-native": graph(tftorus_fn("torus", setup.native)),
            "ring": graph(tftorus_fn("ring", setup.comm)),
            "hierarchical": graph(tftorus_fn("hierarchical", setup.comm)),
            "planned": graph(tftorus_fn("auto", setup.comm, planned=True)),
        }
    if setup.tf_comm is not None:
        fns["torus-tf"] = graph(tftorus_fn("torus", setup.tf_comm))
        fns["torus-tf-nochunks"] = graph(tftorus_fn("torus", setup.tf_comm, 1))
        fns[f"torus-tf-chunks{chunks}"] = graph(tftorus_fn("torus", setup.tf_comm, chunks))
        fns["ring-tf"] = graph(tftorus_fn("ring", setup.tf_comm))
        fns["hierarchical-tf"] = graph(tftorus_fn("hierarchical", setup.tf_comm))
        fns["planned-tf"] = graph(tftorus_fn("auto", setup.tf_comm, planned=True))
        if setup.shared_memory is not None:
            fns["torus-tf-shm"] = graph(tftorus_fn("torus", setup.tf_comm, shared_memory=True))
            fns["torus-tf-nochunks-shm"] = graph(tftorus_fn("torus", setup.tf_comm, 1,
                                                            shared_memory=True))
            fns[f"torus-tf-chunks{chunks}-shm"] = graph(tftorus_fn(
                "torus", setup.tf_comm, chunks, shared_memory=True))
            fns["planned-tf-shm"] = graph(tftorus_fn("auto", setup.tf_comm, planned=True,
                                                     shared_memory=True))
        if workload.compression == "none":  # MWMS sends what it is given: FP32 here
            fns["mwms"] = graph(mwms_allreduce_fn(setup.tf_comm))
    return fns


def phase_fns(setup: Setup, workload: Workload, tensors) -> Dict[str, tuple]:
    """name -> (tf.function, its inputs) for each step the torus variant takes, on its own."""
    import tensorflow as tf

    from tftorus.torus import fusion
    _, comp = compressions(workload.compression, setup.comm is not None)
    comm, native, grid = setup.comm, setup.native, setup.grid
    rank = setup.job_comm.rank
    row, col = grid.row_group(rank), grid.col_group(rank)
    first_row = row == grid.row_group(0)
    wire = [comp.compress(t)[0] for t in tensors]
    buckets = fusion.plan_buckets(wire, setup.fusion_bytes)
    flats = [fusion.pack(wire, b, grid.x) for b in buckets]
    shards = [f[: f.shape[0] // grid.x] for f in flats]  # contents do not matter for timing

    def pack(ts):
        w = [comp.compress(t)[0] for t in ts]
        return [fusion.pack(w, b, grid.x) for b in buckets]

    def unpack(fs):
        return [comp.decompress(p, t.dtype) for f, b in zip(fs, buckets)
                for p, t in zip(fusion.unpack(f, b), [tensors[i] for i in b.indices])]

    def check(_):
        return comm.all_reduce(tf.zeros([6], tf.int64), comm.all_ranks(), op="max")

    tf_comm = setup.tf_comm
    tf_phases = {} if tf_comm is None else {
        "tf reduce-scatter (alltoall)": (
            graph(lambda fs: [tf_comm.reduce_scatter(f, row) for f in fs]), flats),
        "tf column all-reduce": (graph(lambda ss: [tf_comm.all_reduce(s, col) for s in ss]),
                                 shards),
        # the column as the tf torus sums it at 3+ rows: in rank order (algorithms.ordered_column)
        "tf column in rank order": (
            graph(lambda ss: [tf_comm.sum_in_rank_order(s, col) for s in ss]), shards),
        "tf row all-gather": (
            graph(lambda ss: [tf_comm.all_gather(s, row, equal_sizes=True) for s in ss]), shards),
    }
    if comm is None:  # the tf engine's job
        return tf_phases
    return {
        **tf_phases,
        "pack": (graph(pack), tensors),
        "reduce-scatter (alltoall)": (
            graph(lambda fs: [comm.reduce_scatter(f, row) for f in fs]), flats),
        "reduce-scatter (native)": (
            graph(lambda fs: [native.reduce_scatter(f, row) for f in fs]), flats),
        "column all-reduce": (graph(lambda ss: [comm.all_reduce(s, col) for s in ss]), shards),
        "row all-gather": (
            graph(lambda ss: [comm.all_gather(s, row, equal_sizes=True) for s in ss]), shards),
        # The same, only row 0 working and every other rank idle: what the row phases take
        # where a host has its cores to itself (on an emulated cluster every host's rows share
        # this machine's cores). Other rows return at once, so the slowest rank is row 0's.
        "one row's reduce-scatter": (
            graph(lambda fs: [comm.reduce_scatter(f, row) if first_row else f for f in fs]),
            flats),
        "one row's all-gather": (
            graph(lambda ss: [comm.all_gather(s, row, equal_sizes=True) if first_row else s
                              for s in ss]), shards),
        "unpack": (graph(unpack), flats),
        "consistency check": (graph(check), [tf.zeros([1])]),
    }


# ==================================================================================================
# Timing
# ==================================================================================================

def run_fn(fn, inputs) -> list:
    """Call a variant; tf.function returns finished tensors (listed, for the caller)."""
    out = fn(inputs)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def run_once(comm, fn, inputs) -> float:
    comm.barrier()  # the job's engine's: every call starts with the ranks lined up
    start = time.perf_counter()
    run_fn(fn, inputs)
    return time.perf_counter() - start


def time_interleaved(comm, items: Dict[str, tuple], repeats: int, warmup: int) -> np.ndarray:
    """[item, repeat] seconds on this rank; each repeat visits the items in a rotated order."""
    names = list(items)
    for _ in range(warmup):
        for name in names:
            run_once(comm, *items[name])
    times = np.zeros((len(names), repeats))
    for r in range(repeats):
        shift = r % len(names)
        for i in list(range(shift, len(names))) + list(range(shift)):
            times[i, r] = run_once(comm, *items[names[i]])
    return times


def max_errors(items: Dict[str, tuple], kinds: Dict[str, str],
               reference: tuple) -> Dict[str, float]:
    """Each variant's largest deviation from the reference result (`reference`: fn, inputs),
    relative to its largest magnitude (one untimed call each): a fast variant that sums wrong
    is no result."""
    ref = [t.numpy() for t in run_fn(*reference)]
    scale = max(float(np.abs(r).max()) for r in ref) or 1.0
    errors = {}
    for name, kind in kinds.items():
        if kind == "variant":
            out = [t.numpy() for t in run_fn(*items[name])]
            errors[name] = max(float(np.abs(o.astype(np.float64) - r).max())
                               for o, r in zip(out, ref)) / scale
    return errors


def slowest_rank(comm, times: np.ndarray) -> np.ndarray:
    """Per (item, repeat), the largest time over all ranks."""
    import tensorflow as tf
    everyone = comm.all_gather(tf.constant(times[None]), comm.all_ranks(), equal_sizes=True)
    return everyone.numpy().max(axis=0)


# ==================================================================================================
# Reporting
# ==================================================================================================

class Row(NamedTuple):
    workload: str
    kind: str  # 'variant' or 'phase'
    name: str
    median_ms: float
    p25_ms: float
    p75_ms: float
    ratio: float  # median / reference median (phases: / torus median)
    max_err: float  # variants: largest deviation from the reference's result, relative


def summarise(workload: str, kinds: Dict[str, str], times: np.ndarray,
              errors: Dict[str, float]) -> List[Row]:
    names = list(kinds)
    ms = times * 1e3
    med = {n: float(np.median(ms[i])) for i, n in enumerate(names)}
    rows = []
    for i, n in enumerate(names):
        base = med.get(REFERENCE, np.nan) if kinds[n] == "variant" else med.get("torus", np.nan)
        rows.append(Row(workload, kinds[n], n, med[n], float(np.percentile(ms[i], 25)),
                        float(np.percentile(ms[i], 75)), med[n] / base,
                        errors.get(n, float("nan"))))
    return rows


def print_table(title: str, rows: List[Row]) -> None:
    print(f"\n{title}")
    print(f"  {'variant':<28}{'median ms':>11}{'p25-p75 ms':>16}{'x hvd':>8}{'max err':>10}")
    for r in rows:
        if r.kind != "variant":
            continue
        ratio = "-" if np.isnan(r.ratio) else f"{r.ratio:.2f}"  # no hvd in the tf job
        print(f"  {r.name:<28}{r.median_ms:>11.1f}{f'{r.p25_ms:.1f}-{r.p75_ms:.1f}':>16}"
              f"{ratio:>8}{r.max_err:>10.1e}")
    phases = [r for r in rows if r.kind == "phase"]
    if phases:
        print(f"  {'torus phase (alone)':<28}{'median ms':>11}{'p25-p75 ms':>16}{'/torus':>8}")
        for r in phases:
            print(f"  {r.name:<28}{r.median_ms:>11.1f}{f'{r.p25_ms:.1f}-{r.p75_ms:.1f}':>16}"
                  f"{r.ratio:>8.2f}")
    sys.stdout.flush()


def append_csv(path: str, rows: List[Row], meta: Dict[str, object]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fields = list(meta) + list(Row._fields)
    if os.path.exists(path):
        with open(path, newline="") as f:
            header = next(csv.reader(f), None)
        if header != fields:  # written by another version or with other --meta: keep it apart
            os.replace(path, path + ".old")
            print(f"{path} had other columns; moved it to {path}.old", file=sys.stderr)
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(fields)
        for r in rows:
            writer.writerow(list(meta.values()) + [f"{v:.4g}" if isinstance(v, float) else v
                                                   for v in r])


# ==================================================================================================
# Worker
# ==================================================================================================

def wanted(name: str, selection) -> bool:
    return selection is None or name == REFERENCE or name in selection


def bench_workload(setup: Setup, workload: Workload, args) -> List[Row]:
    comm = setup.job_comm
    tensors = make_tensors(workload, seed=comm.rank)
    items, kinds = {}, {}
    fns = variant_fns(setup, workload, args.chunks)
    for name, fn in fns.items():
        if wanted(name, args.variants):
            items[name], kinds[name] = (fn, tensors), "variant"
    if args.phases:
        for name, item in phase_fns(setup, workload, tensors).items():
            if wanted(name, args.variants):
                items[name], kinds[name] = item, "phase"
    reference = fns[REFERENCE if REFERENCE in fns else TF_REFERENCE]
    errors = max_errors(items, kinds, (reference, tensors))
    times = slowest_rank(comm, time_interleaved(comm, items, args.repeats, args.warmup))
    return summarise(workload.name, kinds, times, errors)


def worker(args) -> None:
    import logging
    logging.basicConfig(format="%(message)s")  # tftorus' plan and links, from rank 0 only
    logging.getLogger("tftorus").setLevel(logging.INFO)
    setup = start_tftorus(args.grid, int(args.fusion_threshold_mb * (1 << 20)), args.tf_alone,
                          any(v.endswith("-shm") for v in args.variants or ()))
    rank, size = setup.job_comm.rank, setup.job_comm.size
    env = {k: os.environ.get(k, "") for k in ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD")}
    meta = {"np": size, "grid": str(setup.grid), "repeats": args.repeats,
            "fusion_mb": args.fusion_threshold_mb, "cycle_time": env["HOROVOD_CYCLE_TIME"],
            "hvd_fusion": env["HOROVOD_FUSION_THRESHOLD"], "tag": args.tag,
            **dict(item.split("=", 1) for item in args.meta)}
    if rank == 0:
        job = ("the tf engine alone (no Horovod in these processes; sums checked against "
               f"{TF_REFERENCE})" if args.tf_alone else f"Horovod ({REFERENCE} and its engine)")
        print(f"N={size} grid {setup.grid}, {job}: {args.repeats} repeats after {args.warmup} "
              f"warm-up, slowest rank per call, median over repeats; env {env}")
    for workload in build_workloads(args):
        rows = bench_workload(setup, workload, args)
        if rank == 0:
            title = (f"== N={size} grid {setup.grid} | {workload.name}: "
                     f"{len(workload.shapes)} tensor(s), {workload.elements / 1e6:.2f}M elements, "
                     f"{human_bytes(workload.elements * 4)} FP32 ==")
            print_table(title, rows)
            # bytes: the FP32 tensors' (what studies/scale_model.py reads); wire_bytes: what
            # the all-reduce sends, half of them with the FP16 wire (the floors' bytes)
            append_csv(args.csv, rows, {**meta, "bytes": workload.elements * 4,
                                        "wire_bytes": workload.elements * workload.wire_size})
    if rank == 0:
        print(f"\nCSV: {args.csv}")


# ==================================================================================================
# Launcher
# ==================================================================================================

RANK_PREFIX = re.compile(r"^\[(\d+)(?:,\d+)?\]<(stdout|stderr)>:?")


def grid_for(np_: int, grids: str) -> str:
    table = dict(DEFAULT_GRIDS)
    for item in filter(None, grids.split(",")):
        n, g = item.split("=")
        table[int(n)] = g.strip()
    return table.get(np_, "auto")


def worker_argvs(args, np_: int, shapes_file: str) -> List[tuple]:
    """(name, argv) of each job's worker (`jobs`), to run one after the other."""
    out = []
    for variants, tf_alone in jobs(args.engines, args.variants):
        argv = [sys.executable, os.path.abspath(__file__), "--worker",
                "--grid", grid_for(np_, args.grids), "--shapes-file", shapes_file,
                "--repeats", str(args.repeats), "--warmup", str(args.warmup),
                "--fusion-threshold-mb", str(args.fusion_threshold_mb),
                "--csv", os.path.abspath(args.csv), "--tag", args.tag, "--meta", *args.meta,
                "--sizes", *[str(b) for b in args.sizes], "--resnet", *args.resnet]
        if variants is not None:
            argv += ["--variants", *variants]
        if not args.phases:
            argv.append("--no-phases")
        if tf_alone:
            argv.append("--tf-alone")
        out.append(("tf" if tf_alone else "horovod", argv + ["--chunks", str(args.chunks)]))
    return out


def launch(args, np_: int, shapes_file: str) -> int:
    """horovodrun one world size, a job at a time (`jobs`); echo rank 0's stdout, keep
    everything in a log file per job."""
    rc = 0
    for name, argv in worker_argvs(args, np_, shapes_file):
        rc = launch_job(np_, argv, os.path.join(os.path.dirname(os.path.abspath(args.csv)),
                                                f"np{np_}-{name}.log")) or rc
    return rc


def launch_job(np_: int, argv: List[str], log_path: str) -> int:
    runner = os.path.join(os.path.dirname(sys.executable), "horovodrun")  # the venv's, unactivated
    cmd = [runner if os.path.exists(runner) else "horovodrun", "--gloo", "-np", str(np_),
           "-H", f"localhost:{np_}", "--start-timeout", "120", *argv]
    print(f"\n$ {' '.join(cmd)}\n  (full log: {log_path})", flush=True)
    with open(log_path, "w") as log, subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in proc.stdout:
            log.write(line)
            match = RANK_PREFIX.match(line)
            if match and match.group(1) == "0" and match.group(2) == "stdout":
                print(line[match.end():], end="", flush=True)
        rc = proc.wait()
    if rc:
        with open(log_path) as f:
            print("".join(f.readlines()[-40:]), file=sys.stderr)
    return rc


def launcher(args) -> int:
    # here, not at the top: the ranks run this file as a script, without the studies package
    from studies.out_dir import own_dir
    own_dir(os.path.dirname(os.path.abspath(args.csv)))
    shapes_file = os.path.join(os.path.dirname(os.path.abspath(args.csv)), "resnet50_shapes.json")
    if args.resnet and not os.path.exists(shapes_file):
        with open(shapes_file, "w") as f:
            json.dump(resnet50_shapes(), f)
    rc = 0
    for np_ in args.np:
        rc = launch(args, np_, shapes_file) or rc
    print(f"\nCSV: {os.path.abspath(args.csv)}")
    return rc


def main(argv: Sequence[str] = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    return launcher(args)


if __name__ == "__main__":
    sys.exit(main())
