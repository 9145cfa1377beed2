"""The paper's Table 5 (accuracy, time) and Table 6 (throughput) lines for a finished run, and
its tail: the seconds from the end of the last epoch to the summary, which the trainer writes
once every worker has left model.fit (a worker late out of fit shows here, not only in the
job's end)."""
import dataclasses
import json
import logging
from typing import List, Optional

from official_resnet.run.run_state import RunState

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Summary:
    experiment: str
    workers: int
    workers_per_phase: List[int]
    grid: str
    top1_1crop: float
    seconds: float
    epochs: float
    steps: int
    images_per_sec: float
    paper_top1: float
    paper_seconds: float
    tail_seconds: float  # from the last epoch's end (its EpochLog) to this summary


def run_summary(state: RunState, experiment, grid: str) -> Summary:
    final = state.history[-1]
    rates = [h.images_per_sec for h in state.history[1:]] or [state.history[0].images_per_sec]
    return Summary(experiment=experiment.name, workers=state.workers.size,
                   workers_per_phase=[p.workers for p in state.plans], grid=grid,
                   top1_1crop=final.top1, seconds=final.elapsed, epochs=final.epoch,
                   steps=int(state.steps.numpy()), images_per_sec=sum(rates) / len(rates),
                   paper_top1=experiment.paper_top1, paper_seconds=experiment.paper_seconds,
                   tail_seconds=state.elapsed() - final.elapsed)


def log_summary(summary: Summary, state: RunState, experiment, path: Optional[str]) -> None:
    """The Table 5 and Table 6 lines; summary.json at `path`."""
    plans = state.plans
    logger.info("Table 5 style | %s | workers %s | batch %d-%d | top-1 1-crop %.2f%% | %.0f s "
                "(paper: %.2f%% in %d s on %d V100)", experiment.name,
                "->".join(str(p.workers) for p in plans) if len({p.workers for p in plans}) > 1
                else str(summary.workers),
                min(p.total_batch for p in plans), max(p.total_batch for p in plans),
                summary.top1_1crop, summary.seconds, experiment.paper_top1,
                experiment.paper_seconds, experiment.max_gpus)
    logger.info("Table 6 style | workers %d | %.1f images/s (mean over epochs after the "
                "first) | %.1f images/s per worker", summary.workers, summary.images_per_sec,
                summary.images_per_sec / summary.workers)
    logger.info("run end | %.1f s from the end of the last epoch to this summary (every worker "
                "out of fit)", summary.tail_seconds)
    if path:
        with open(path, "w") as f:
            json.dump(dataclasses.asdict(summary), f, indent=2)
