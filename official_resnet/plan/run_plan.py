"""What a run would do, printed before paying for it (`run_scripts/train.py --plan_only`).

One table per experiment: each phase's epochs, workers, total and per-worker batch, gradient
accumulation, optimizer steps, LR and momentum at the phase's start and end, the torus grid and
its sequential steps, the files and bytes each worker reads per epoch, and the gradient
all-reduce time per step that tftorus.planning.cost_model predicts on the paper's cluster (ABCI: 4
V100 per node over NVLink, 2 InfiniBand EDR HCAs per node; documented hardware numbers, nothing
fitted). Nothing here starts Horovod or reads a record.
"""
import dataclasses
from typing import List, Sequence, Tuple

from official_resnet.data import sharding
from official_resnet.plan import batch_plan

# The ILSVRC-2012 archives (ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar): the TFRecords
# hold the same JPEGs, so their sizes stand in for the converted files' when no data is given.
IMAGENET_BYTES = {"train": 147_897_477_120, "validation": 6_744_924_160}
RESNET50 = (50, 64, 1000)  # depth, width, classes: the model the cost model's size is for
WIRE_BYTES = {"none": 4, "fp16": 2, "bf16": 2}  # bytes per gradient element on the wire


@dataclasses.dataclass(frozen=True)
class DataLayout:
    """What the plan assumes about the data: records and file sizes per split."""

    description: str
    train_records: int
    validation_records: int
    train_file_bytes: Sequence[int]
    validation_file_bytes: Sequence[int]
    estimated: bool  # file sizes are the archive's average, not the files'

    @classmethod
    def imagenet(cls) -> "DataLayout":
        from official_resnet.data.dataset_info import IMAGENET_FILES, IMAGENET_RECORDS

        files = {s: [IMAGENET_BYTES[s] // n] * n for s, n in IMAGENET_FILES.items()}
        return cls("ImageNet: ILSVRC-2012's split sizes, as no --data_dir was given",
                   IMAGENET_RECORDS["train"], IMAGENET_RECORDS["validation"], files["train"],
                   files["validation"], estimated=True)


def read_per_worker(file_bytes: Sequence[int], workers: int) -> Tuple[int, int]:
    """(files, bytes) the busiest worker reads per pass (official_resnet/data/sharding.py)."""
    files = [f"{i}" for i in range(len(file_bytes))]
    busiest = (0, 0)
    for w in range(min(workers, len(files))):  # workers beyond F repeat files 0..F-1
        shards = sharding.shard_files(files, workers, w)
        busiest = max(busiest, (len(shards), sum(file_bytes[int(s.path)] for s in shards)))
    return busiest


def _num(x: float) -> str:
    return f"{x:.4g}" if abs(x) >= 1e-6 else "0"  # the schedules' ends are 0 up to rounding


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def plan_table(*, experiment, plans: List[batch_plan.PhasePlan], schedule, data: DataLayout,
               grid: str = "auto", algorithm: str = "torus", compression: str = "fp16",
               model: tuple = RESNET50, gpus_per_phase: str = "fixed",
               batch_divisor: int = 1) -> str:
    """The plan as text (see the module docstring)."""
    from tftorus.planning import cost_model
    from tftorus.torus.grid import resolve_grid

    # On the paper's cluster (many hosts) 'auto' sends ResNet-50's gradient buffers by the torus.
    algorithm = "torus" if algorithm == "auto" else algorithm
    topology = cost_model.abci_topology()
    costs = cost_model.CostModel(cost_model.abci_params(), topology)
    nbytes = (cost_model.RESNET50_PARAMS * WIRE_BYTES[compression]
              if tuple(model) == RESNET50 else None)
    steps = batch_plan.steps_in_phases(plans, data.train_records)
    lines = [
        f"{experiment.name}: {len(plans)} phase(s), {plans[-1].end_epoch:g} epochs of "
        f"{data.train_records:,} images ({data.description}); workers per phase: "
        f"{gpus_per_phase}" + (f"; batches / {batch_divisor}" if batch_divisor > 1 else ""),
        f"paper (Table 5): {experiment.paper_top1:.2f}% top-1 in {experiment.paper_seconds:g} s "
        f"on up to {experiment.max_gpus} GPUs",
        "",
    ]
    header = ("phase", "epochs", "workers", "total", "per worker", "accum x micro",
              "steps/epoch", "steps", "LR start -> end", "momentum start -> end", "grid YxX",
              "torus steps", "files/worker", "read/worker/epoch", f"{algorithm} ms/step")
    rows = []
    for plan, n in zip(plans, steps):
        g = resolve_grid(grid, plan.workers, local_size=min(topology.ranks_per_host,
                                                            plan.workers))
        files, nread = read_per_worker(data.train_file_bytes, plan.workers)
        end = plan.end_epoch - 1e-6
        allreduce = (f"{1e3 * costs.seconds(algorithm, g, nbytes):.2f}" if nbytes else "n/a")
        rows.append((
            str(plan.index + 1), f"{plan.start_epoch:g}-{plan.end_epoch:g}", str(plan.workers),
            str(plan.total_batch), str(plan.per_worker_batch),
            f"{plan.accumulation} x {plan.micro_batch}", str(plan.steps_per_epoch), str(n),
            f"{_num(schedule.lr(plan.start_epoch))} -> {_num(schedule.lr(end))}",
            f"{schedule.momentum(plan.start_epoch, plan.total_batch):.4f} -> "
            f"{schedule.momentum(end, plan.total_batch):.4f}",
            f"{g.y}x{g.x}", str(2 * (g.x - 1) + 2 * (g.y - 1)), str(files),
            ("~" if data.estimated else "") + _size(nread), allreduce))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for row in (header,) + tuple(rows):
        lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    total_steps = sum(steps)
    vfiles, vread = read_per_worker(data.validation_file_bytes, plans[-1].workers)
    lines += [
        "",
        f"optimizer steps: {total_steps:,}; evaluation on {data.validation_records:,} images "
        f"({vfiles} file(s), {'~' if data.estimated else ''}{_size(vread)} per worker on "
        f"{plans[-1].workers} workers)",
        "all-reduce: " + (
            f"ResNet-50's {cost_model.RESNET50_PARAMS:,} gradients in {compression} "
            f"({_size(nbytes)}) per optimizer step, tftorus' cost model on ABCI (4 V100 per node, "
            f"NVLink 50 GB/s per pair, 2 x EDR 12.5 GB/s per node); accumulation does not add "
            f"all-reduces" if nbytes else
            f"n/a: the cost model's gradient size is ResNet-50's (--depth=50 --width=64, 1000 "
            f"classes); this model is depth {model[0]}, width {model[1]}, {model[2]} classes"),
    ]
    return "\n".join(lines)
