"""What the cost model (tftorus/planning/cost_model.py) is calibrated with and checked against.

Only the studies use this (studies/scale_model.py; docs/studies/scale.md), so it lives here
rather than in the library, which needs only the model itself:

  fitting   `Measurement`s of phases or whole algorithms, and `fit`: a least-squares fit of the
            model's parameters to measured times (the emulated cluster's, one host's)
  the paper Table 6's measured throughput, and `StepModel`: a training step of compute plus
            the exposed all-reduce, its compute derived from Table 6's 4-GPU point

Pure Python + numpy; `fit` also needs scipy (a study dependency, imported when called).
"""
import dataclasses
import math
from typing import Iterable, Optional, Sequence, Tuple

import numpy as np

from tftorus.planning.cost_model import (PARAM_NAMES, RESNET50_PARAMS, CostModel, Link, Params,
                                         Phase, grid_for_algorithm)
from tftorus.torus.grid import TorusGrid

#: Each parameter's unit, for the fit's report.
PARAM_UNITS = {"alpha_intra": "s/message", "beta_intra": "s/byte", "alpha_inter": "s/message",
               "beta_inter": "s/byte per NIC", "gamma": "s/byte summed",
               "per_op": "s/collective", "copy": "s/byte copied"}

#: Parameters that are CPU work when ranks run on CPUs (loopback messages are memcpys, sums and
#: copies are loops, a collective's set-up is a negotiation): with more ranks than cores they
#: stretch by ranks / cores (Measurement.cpu_factor). The inter-host link is a rate limit, not.
CPU_PARAMS = tuple(PARAM_NAMES.index(n) for n in ("alpha_intra", "beta_intra", "gamma", "per_op",
                                                   "copy"))


# ==================================================================================================
# Fitting
# ==================================================================================================

@dataclasses.dataclass(frozen=True)
class Measurement:
    """A measured time of some phases (one phase alone, or a whole algorithm)."""

    label: str
    phases: Tuple[Phase, ...]
    seconds: float
    cpu_factor: float = 1.0  # >1: ranks share cores, CPU-side costs stretch by this much

    def __post_init__(self):
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"measurement {self.label!r}: time must be > 0, got {self.seconds}")
        if not (math.isfinite(self.cpu_factor) and self.cpu_factor >= 1):
            raise ValueError(f"measurement {self.label!r}: cpu_factor must be >= 1, "
                             f"got {self.cpu_factor}")

    def features(self) -> np.ndarray:
        f = sum((p.features() for p in self.phases), np.zeros(len(PARAM_NAMES)))
        f[list(CPU_PARAMS)] *= self.cpu_factor
        return f

    def predict(self, params: Params) -> float:
        return float(self.features() @ params.vector())


@dataclasses.dataclass(frozen=True)
class FitResult:
    params: Params
    fitted: Tuple[str, ...]  # parameters the fit chose
    undetermined: Tuple[str, ...]  # free parameters no measurement depends on (left at base)
    predicted: Tuple[float, ...]  # seconds, in the order of the measurements
    measured: Tuple[float, ...]
    labels: Tuple[str, ...]

    @property
    def relative_errors(self) -> np.ndarray:
        """(predicted - measured) / measured per point."""
        return (np.array(self.predicted) - np.array(self.measured)) / np.array(self.measured)

    @property
    def rms_relative_error(self) -> float:
        return float(np.sqrt(np.mean(self.relative_errors ** 2)))


def fit(measurements: Sequence[Measurement], base: Optional[Params] = None,
        free: Iterable[str] = PARAM_NAMES) -> FitResult:
    """Least-squares fit of the `free` parameters, minimising relative error.

    The model is linear in its parameters (seconds = features @ params), so minimising
    sum(((predicted - measured) / measured)^2) is a weighted linear least-squares problem,
    solved with non-negative least squares (no parameter may go below 0). Parameters not in
    `free` stay at their `base` value (default 0); a free parameter no measurement depends on
    (e.g. inter-host ones when every run was on one host) stays at base too and is reported in
    `undetermined`.
    """
    from scipy.optimize import nnls

    measurements = list(measurements)
    if not measurements:
        raise ValueError("fit needs at least one measurement")
    free = tuple(free)
    unknown = set(free) - set(PARAM_NAMES)
    if unknown:
        raise ValueError(f"unknown parameter(s) {sorted(unknown)}; known: {PARAM_NAMES}")
    base = base or Params(Link(0.0, 0.0), Link(0.0, 0.0))
    A = np.array([m.features() for m in measurements])
    t = np.array([m.seconds for m in measurements])
    idx = [PARAM_NAMES.index(n) for n in free]
    fixed = [i for i in range(len(PARAM_NAMES)) if i not in idx]
    seen = [i for i in idx if np.any(A[:, i] != 0)]
    undetermined = tuple(PARAM_NAMES[i] for i in idx if i not in seen)
    residual_target = t - A[:, fixed] @ base.vector()[fixed]
    w = 1.0 / t  # relative error: each row divided by its measured time
    # Columns differ by ~15 orders of magnitude (steps vs bytes): scale them to unit norm so
    # the solver's tolerance treats every parameter alike.
    cols = A[:, seen] * w[:, None]
    norms = np.linalg.norm(cols, axis=0)
    norms[norms == 0] = 1.0
    solution, _ = nnls(cols / norms, residual_target * w)
    v = base.vector().copy()
    v[seen] = solution / norms
    params = Params.from_vector(v)
    return FitResult(params, tuple(PARAM_NAMES[i] for i in seen), undetermined,
                     tuple(float(m.predict(params)) for m in measurements), tuple(t.tolist()),
                     tuple(m.label for m in measurements))


# ==================================================================================================
# The paper's training step (Table 6)
# ==================================================================================================

#: ResNet-50's gradients in FP16, as the paper communicates them.
RESNET50_FP16_BYTES = 2 * RESNET50_PARAMS

#: Table 6 of the paper: GPUs -> images/s (per-worker batch 32).
PAPER_TABLE6 = {4: 2565, 1024: 556_522, 2048: 1_091_357, 3456: 1_641_853, 4096: 1_929_054}
PAPER_TABLE6_EFFICIENCY = {1024: 84.75, 2048: 83.10, 3456: 74.08, 4096: 73.44}
PAPER_BATCH_PER_GPU = 32


@dataclasses.dataclass(frozen=True)
class StepModel:
    """One training step: compute, then (part of) the gradient all-reduce.

    overlap: fraction of the compute time the all-reduce may hide behind (0: it starts after
    the backward pass, as one fused buffer does; 2/3: it may run during the whole backward pass,
    about twice the forward's FLOPs). step = compute + max(0, comm - overlap * compute).
    compute: derived from the paper's 4-GPU throughput (Table 6) minus the model's own 4-GPU
    all-reduce, so efficiency is against the measured 4-GPU point, as the paper's is.
    """

    model: CostModel
    nbytes: float = RESNET50_FP16_BYTES
    batch_per_gpu: int = PAPER_BATCH_PER_GPU
    base_gpus: int = 4
    base_images_per_s: float = PAPER_TABLE6[4]
    overlap: float = 0.0

    def __post_init__(self):
        if not 0.0 <= self.overlap < 1.0:
            raise ValueError(f"overlap must be in [0, 1), got {self.overlap}")

    @property
    def base_step_seconds(self) -> float:
        """Measured step time at base_gpus: base_gpus * batch / images per second."""
        return self.base_gpus * self.batch_per_gpu / self.base_images_per_s

    def comm_seconds(self, algorithm: str, size: int, grid: Optional[TorusGrid] = None) -> float:
        grid = grid or grid_for_algorithm(algorithm, size, self.model.topology.ranks_per_host)
        return self.model.seconds(algorithm, grid, self.nbytes)

    def _exposed(self, comm: float, compute: float) -> float:
        return max(0.0, comm - self.overlap * compute)

    @property
    def compute_seconds(self) -> float:
        """Compute time per step: the measured base step less the exposed torus all-reduce of
        the base world (solved for the overlap case: compute + exposed(comm, compute) = base)."""
        base = self.base_step_seconds
        comm = self.comm_seconds("torus", self.base_gpus)
        if comm <= self.overlap * base:  # all hidden at the base size
            return base
        return (base - comm) / (1.0 - self.overlap)

    def step_seconds(self, algorithm: str, size: int, grid: Optional[TorusGrid] = None) -> float:
        compute = self.compute_seconds
        return compute + self._exposed(self.comm_seconds(algorithm, size, grid), compute)

    def images_per_second(self, algorithm: str, size: int,
                          grid: Optional[TorusGrid] = None) -> float:
        return size * self.batch_per_gpu / self.step_seconds(algorithm, size, grid)

    def efficiency(self, algorithm: str, size: int, grid: Optional[TorusGrid] = None) -> float:
        """Percent of base_images_per_s * size / base_gpus (the paper's definition)."""
        ideal = self.base_images_per_s * size / self.base_gpus
        return 100.0 * self.images_per_second(algorithm, size, grid) / ideal
