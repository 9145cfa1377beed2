"""Learning-rate and momentum schedules of the paper (section 3.2), keyed on fractional epochs.

Every function takes e = samples_seen / dataset_size, the one clock of this project: the total
batch changes between phases of batch-size control, so steps are not a stable unit.

- `lr_config_a`: configuration A (the TensorFlow TPU LARS utility): linear warm-up from 1e-5 to
  34.0 over 34 epochs, then polynomial decay (power 2) to 0 at epoch 90; momentum 0.9.
- `lr_config_b`: configuration B, exactly as printed:
      0.2 + (29 - 0.2) * e / 5     if e < 5
      29 * (1 - e/90)^2            if e < 30
      50 * (1 - e/90)^2            otherwise
  It is discontinuous twice, by design of the formula: at e = 5 the warm-up ends at 29 and the
  decay starts at 29 * (85/90)^2 = 25.87; at e = 30 the LR rises by 50/29 (12.89 -> 22.22).
- `momentum_for_batch`: Smith & Le's noise scale held at its value for 32K and momentum 0.9,
  m = 1 - 0.1 * 32768 / B (see /work/shared/reference/paper-notes.md for how the garbled formula
  is read). The LR cancels, so momentum depends only on the total batch B in force.

Shortened runs. The functions' keyword arguments are in the same unit as `epoch`, so a caller
can move every breakpoint by hand. The usual way is proportional: a run of T epochs follows the
paper's curve compressed by T / 90, i.e. it evaluates the paper's schedule at the paper epoch
`paper_epoch(e, T) = e * 90 / T`. `Schedule(total_epochs=T)` does exactly that, in one place:
warm-up, the switch at 30 and the end all scale together (a 9-epoch run warms up for 0.5 epochs
with B, switches at 3, ends at 9). The momentum rule needs its reference batch scaled instead:
see `scaled_reference_batch`.
"""
import dataclasses
import inspect
import math
from typing import Any, Callable, Dict, Mapping, Optional

PAPER_EPOCHS = 90.0  # the paper's run length; shortened runs map onto it proportionally
IMAGENET_TRAIN_SIZE = 1281167  # ILSVRC-2012 training images
REFERENCE_BATCH = 32768  # 32 x 1024: the total batch at which momentum is 0.9 (config B)
REFERENCE_MOMENTUM = 0.9
MAX_MOMENTUM = 0.999  # cap of the batch rule; a memory of ~1000 steps is already extreme


def _check_epoch(epoch: float) -> float:
    epoch = float(epoch)
    if not (epoch >= 0.0 and math.isfinite(epoch)):
        raise ValueError(f"epoch must be a finite number >= 0, got {epoch}")
    return epoch


def paper_epoch(epoch: float, total_epochs: float, paper_epochs: float = PAPER_EPOCHS) -> float:
    """The paper epoch a run of `total_epochs` is at, at its own epoch `epoch` (proportional)."""
    if not total_epochs > 0:
        raise ValueError(f"total_epochs must be > 0, got {total_epochs}")
    return _check_epoch(epoch) * paper_epochs / total_epochs


def lr_config_a(epoch: float, base_lr: float = 34.0, initial_lr: float = 1e-5,
                warmup_epochs: float = 34.0, total_epochs: float = 90.0,
                power: float = 2.0) -> float:
    """Configuration A: linear warm-up initial_lr -> base_lr, then (1 - progress)^power to 0.

    progress = (e - warmup_epochs) / (total_epochs - warmup_epochs); 0 from total_epochs on.
    """
    epoch = _check_epoch(epoch)
    if not 0 <= warmup_epochs < total_epochs:
        raise ValueError(f"need 0 <= warmup_epochs < total_epochs, got {warmup_epochs} and "
                         f"{total_epochs}")
    if epoch < warmup_epochs:
        return initial_lr + (base_lr - initial_lr) * epoch / warmup_epochs
    progress = min(1.0, (epoch - warmup_epochs) / (total_epochs - warmup_epochs))
    return base_lr * (1.0 - progress) ** power


def lr_config_b(epoch: float, initial_lr: float = 0.2, warmup_lr: float = 29.0,
                late_lr: float = 50.0, warmup_epochs: float = 5.0, switch_epoch: float = 30.0,
                total_epochs: float = 90.0, power: float = 2.0) -> float:
    """Configuration B as printed: warm-up to warmup_lr, decay from warmup_lr, then late_lr.

    warmup_lr (29) is the LARS paper's base LR, late_lr (50) the largest of Goyal et al.'s
    suggestion; both decay as (1 - e/total_epochs)^power, and the LR is 0 from total_epochs on.
    """
    epoch = _check_epoch(epoch)
    if not 0 < warmup_epochs <= switch_epoch <= total_epochs:
        raise ValueError("need 0 < warmup_epochs <= switch_epoch <= total_epochs, got "
                         f"{warmup_epochs}, {switch_epoch}, {total_epochs}")
    if epoch < warmup_epochs:
        return initial_lr + (warmup_lr - initial_lr) * epoch / warmup_epochs
    decay = max(0.0, 1.0 - epoch / total_epochs) ** power  # held at 0 after the end
    return (warmup_lr if epoch < switch_epoch else late_lr) * decay


LR_CONFIGS: Dict[str, Callable[..., float]] = {"A": lr_config_a, "B": lr_config_b}


def momentum_for_batch(total_batch: float, reference_batch: float = REFERENCE_BATCH,
                       reference_momentum: float = REFERENCE_MOMENTUM,
                       max_momentum: float = MAX_MOMENTUM) -> float:
    """1 - (1 - reference_momentum) * reference_batch / total_batch, capped at max_momentum.

    Holds Smith & Le's noise scale LR * N / (B * (1 - m)) at its value for the reference batch:
    55296 (54K) -> 0.94074, 65536 -> 0.95, 32768 -> 0.9. A batch below
    (1 - reference_momentum) * reference_batch would need a negative momentum: that is a
    scaled-down run still using ImageNet's reference batch, and raises ValueError.
    """
    checks = [
        (total_batch > 0, f"total_batch must be > 0, got {total_batch}"),
        (reference_batch > 0, f"reference_batch must be > 0, got {reference_batch}"),
        (0 <= reference_momentum < 1,
         f"reference_momentum must be in [0, 1), got {reference_momentum}"),
        (0 < max_momentum < 1, f"max_momentum must be in (0, 1), got {max_momentum}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    momentum = 1.0 - (1.0 - reference_momentum) * reference_batch / total_batch
    if momentum < 0:
        raise ValueError(
            f"total batch {total_batch} is too small for reference_batch {reference_batch}: "
            f"the momentum rule gives {momentum:.3f} < 0. For a scaled-down run, lower "
            f"reference_batch with the data set, e.g. reference_batch = {REFERENCE_BATCH} * "
            f"dataset_size / {IMAGENET_TRAIN_SIZE} (see scaled_reference_batch), or divide it "
            f"by the same factor as the total batches.")
    return min(momentum, max_momentum)


def scaled_reference_batch(dataset_size: int, reference_batch: float = REFERENCE_BATCH,
                           full_size: int = IMAGENET_TRAIN_SIZE) -> float:
    """The reference batch for a data set of `dataset_size`: same fraction of an epoch per step.

    ImageNet's 32K is 2.6% of its 1.28M images; a smaller data set keeps that fraction so its
    batches (scaled the same way) get the paper's momenta.
    """
    if not dataset_size > 0:
        raise ValueError(f"dataset_size must be > 0, got {dataset_size}")
    return reference_batch * dataset_size / full_size


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One experiment's LR and momentum choice, evaluated at run epochs.

    Example: `Schedule("B", total_epochs=9, reference_batch=scaled_reference_batch(50000))`.
    """

    lr_config: str = "B"  # 'A' or 'B'
    total_epochs: float = PAPER_EPOCHS  # run length; the paper's 90 epochs map onto it
    lr_params: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # paper epochs
    lr_scale: float = 1.0  # multiplies the LR (1.0: the paper's values)
    batch_momentum: Optional[bool] = None  # None: the batch rule for B, constant for A
    constant_momentum: float = REFERENCE_MOMENTUM  # config A's momentum
    reference_batch: float = REFERENCE_BATCH  # batch rule: total batch at reference_momentum
    reference_momentum: float = REFERENCE_MOMENTUM
    max_momentum: float = MAX_MOMENTUM

    def __post_init__(self):
        config = str(self.lr_config).upper()
        if config not in LR_CONFIGS:
            raise ValueError(f"lr_config must be one of {sorted(LR_CONFIGS)}, "
                             f"got {self.lr_config!r}")
        object.__setattr__(self, "lr_config", config)
        object.__setattr__(self, "lr_params", dict(self.lr_params))
        accepted = set(inspect.signature(LR_CONFIGS[config]).parameters) - {"epoch"}
        unknown = set(self.lr_params) - accepted
        if unknown:
            raise ValueError(f"lr_params {sorted(unknown)} are not parameters of "
                             f"configuration {config}; accepted: {sorted(accepted)}")
        checks = [
            (self.total_epochs > 0, f"total_epochs must be > 0, got {self.total_epochs}"),
            (self.lr_scale > 0, f"lr_scale must be > 0, got {self.lr_scale}"),
            (0 <= self.constant_momentum < 1,
             f"constant_momentum must be in [0, 1), got {self.constant_momentum}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        # The batch rule's arguments are checked now, not at the first step.
        momentum_for_batch(self.reference_batch, self.reference_batch, self.reference_momentum,
                           self.max_momentum)

    @property
    def follows_batch(self) -> bool:
        """Whether momentum follows the total batch (config B's default) or is constant."""
        return self.lr_config == "B" if self.batch_momentum is None else self.batch_momentum

    def lr(self, epoch: float) -> float:
        """The learning rate at run epoch `epoch` (samples seen / data-set size)."""
        at = paper_epoch(epoch, self.total_epochs)
        return self.lr_scale * LR_CONFIGS[self.lr_config](at, **self.lr_params)

    def momentum(self, epoch: float, total_batch: float) -> float:
        """The momentum at `epoch` with `total_batch` in force (the epoch only is validated:
        the noise-scale rule cancels the LR)."""
        _check_epoch(epoch)
        if not self.follows_batch:
            return self.constant_momentum
        return momentum_for_batch(total_batch, self.reference_batch, self.reference_momentum,
                                  self.max_momentum)


def lr_overrides(lr_config: str, total_epochs: float, base_lr: Optional[float] = None,
                 warmup_epochs: Optional[float] = None) -> Dict[str, float]:
    """`Schedule.lr_params` for a peak LR (configuration A's base_lr) and a warm-up given in
    *run* epochs (lr_params are paper epochs: a run of T epochs maps its epoch e to e * 90 / T)."""
    params: Dict[str, float] = {}
    if base_lr is not None:
        if str(lr_config).upper() != "A":
            raise ValueError("base_lr is configuration A's peak LR; use lr_config 'A'")
        params["base_lr"] = float(base_lr)
    if warmup_epochs is not None:
        params["warmup_epochs"] = paper_epoch(warmup_epochs, total_epochs)
    return params

