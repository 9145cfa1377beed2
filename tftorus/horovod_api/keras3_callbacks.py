"""Horovod's Keras callbacks (horovod.tensorflow.keras.callbacks, 0.28.1) for Keras 3, without
Horovod: the same classes, constructor arguments and behaviour, over tftorus.runtime.world (the tf
engine's collectives). On the classic stack `tftorus.keras.callbacks` is Horovod's own module.

    BroadcastGlobalVariablesCallback  root_rank's model and optimizer variables to every rank,
                                      once, around the first batch of the first fit
    MetricAverageCallback             the epoch's logs averaged over the workers, on every rank
    LearningRateScheduleCallback      lr = initial_lr * multiplier(epoch) in [start, end)
    LearningRateWarmupCallback        initial_lr / size -> initial_lr over warmup_epochs

(Horovod's BestModelCheckpoint, whose path its Spark estimator fills in, raises
HorovodRequired here.)

Where Keras 3 makes Horovod's way impossible or wrong, the class docstring says what happens
instead and why; in short:

- Keras 3 creates an optimizer's slots (momentum, ...) only while tracing the first train step
  (fit builds the optimizer beforehand only under a tf.distribute strategy), so the optimizer is
  broadcast at the end of the first batch, as Horovod does; the model's weights are also
  broadcast before that batch, so the first step already runs on root_rank's weights.
- Keras 3 reads a built-in optimizer's `momentum` (a Python float) when the step is traced, so
  Horovod's momentum correction (momentum *= new_lr / old_lr for one step) would never reach a
  traced step; the same correction is applied to the momentum slots instead.
- Every collective here is preceded by a check that the ranks agree on what they reduce (a
  worker with other logs or other variables raises instead of hanging the job).
"""
import zlib
from typing import Callable, Dict, List, Optional, Union

import keras
import tensorflow as tf

from tftorus.horovod_api.helpers import \
    is_version_greater_equal_than  # noqa: F401  Horovod's has it
from tftorus.runtime import stack, world

_VARIABLE_TYPES = (tf.Variable, keras.Variable)


def _same_on_every_rank(*values: int) -> bool:
    """Whether every rank passed the same small integers (taken mod 2**20), in one all-reduce of
    each value and its square. A rank sees sum(x) == size * x and sum(x**2) == size * x**2 only if
    the ranks' x have zero variance, i.e. are all equal, so every rank gets the same answer (sums
    exact in float64 up to 2**13 ranks). Call it on every rank or on none."""
    size = world.size()
    if size == 1:
        return True
    mine = [float(v % (1 << 20)) for v in values]
    mine += [x * x for x in mine]
    sums = world.allreduce_sum(tf.constant(mine, tf.float64), name="tftorus_same").numpy()
    return all(s == size * x for s, x in zip(sums, mine))


def _fingerprint(text: str) -> int:
    return zlib.crc32(text.encode())


def _tf_variables(variables) -> List[tf.Variable]:
    """The tf.Variables behind Keras 3 variables (read outside any autocast scope, as in a
    callback, `keras.Variable.value` is its tf.Variable)."""
    return [v if isinstance(v, tf.Variable) else v.value for v in variables]


def _number(value) -> float:
    """A Keras 3 or tf variable's (or a tensor's) value as a Python float."""
    return float(tf.convert_to_tensor(value))


def _describe(variables) -> str:
    return ";".join(f"{tuple(v.shape)}:{v.dtype}" for v in variables)


def _unwrap(optimizer):
    """The optimizer that holds the slots (LossScaleOptimizer keeps its inner one's)."""
    while getattr(optimizer, "inner_optimizer", None) is not None:
        optimizer = optimizer.inner_optimizer
    return optimizer


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Gives every rank root_rank's model weights and optimizer variables, once: the first batch
    of the first fit this callback is in (as Horovod's, a later fit with the same instance
    broadcasts nothing). Needed when training starts from random weights or when only
    root_rank restored a checkpoint.

    When: Horovod broadcasts everything at the end of the first batch because the optimizer's
    slots do not exist before the first step. That still holds on Keras 3.15 in a plain fit:
    `optimizer.build` runs while the first train step is traced (fit builds it earlier only under
    a tf.distribute strategy), so before the first batch the optimizer holds its iteration count
    and learning rate but no momentum or other slots - unless a rank restored a saved optimizer,
    in which case ranks can differ in what they hold. So, on Keras 3:
      - before the first batch: the model's weights (if every rank has the same ones), so the
        first step already runs on root_rank's weights and every rank computes the same update;
      - at the end of the first batch (Horovod's point): the model's weights and all of the
        optimizer's variables (iterations, learning rate, slots), which every rank now has.
    The second broadcast changes nothing in the usual case and makes a restored root's optimizer
    state everyone's.

    What: `model.weights` (trainable and non-trainable, e.g. batch-norm statistics) and
    `model.optimizer.variables`, minus `local_variables`. Keras 3's `model.variables` also holds
    the dropout layers' random-seed states; those are not broadcast (each worker keeps drawing its
    own dropout masks, as under Horovod on Keras 2, whose model.variables held no seed state).

    Args: root_rank; device (the device the broadcast runs on, '' = TensorFlow's choice);
    local_variables: variables (or one) that every rank keeps its own of (Horovod's argument).
    """

    def __init__(self, root_rank: int, device: str = "", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self._weights_sent = False
        self._local_vars: Dict[int, object] = {}
        if local_variables is None:
            local_variables = []
        elif isinstance(local_variables, _VARIABLE_TYPES):
            local_variables = [local_variables]
        elif not all(isinstance(v, _VARIABLE_TYPES) for v in local_variables):
            raise ValueError("All local variables must be of tf.Variable or keras.Variable type.")
        for variable in local_variables:
            self.register_local_var(variable)

    def register_local_var(self, var) -> None:
        """Keep `var` out of the broadcast (every rank keeps its own value)."""
        self._local_vars[id(var)] = var  # holding it keeps its id from being reused

    def _global(self, variables) -> list:
        return [v for v in variables if id(v) not in self._local_vars]

    def _broadcast(self, variables) -> None:
        with tf.device(self.device):
            world.broadcast_variables(_tf_variables(variables), root_rank=self.root_rank)

    def on_train_batch_begin(self, batch, logs=None):
        if self.broadcast_done or self._weights_sent:
            return
        self._weights_sent = True
        weights = self._global(self.model.weights)
        # A rank whose model is not built yet (a subclassed model builds in the first step)
        # has none: then only the end-of-batch broadcast runs, on every rank alike.
        if _same_on_every_rank(len(weights), _fingerprint(_describe(weights))):
            self._broadcast(weights)

    def on_train_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        variables = self._global(list(self.model.weights) + list(self.model.optimizer.variables))
        if not _same_on_every_rank(len(variables), _fingerprint(_describe(variables))):
            raise ValueError(
                f"BroadcastGlobalVariablesCallback: rank {world.rank()}'s model and optimizer "
                f"variables ({len(variables)}) differ in number, shape or dtype from another "
                f"rank's after the first batch: every worker must build the same model and "
                f"optimizer")
        self._broadcast(variables)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of every epoch, replaces each entry of `logs` (loss, metrics, val_*) by its
    mean over the workers, on every rank, so rank 0 logs the world's value and callbacks after
    this one in the list (ReduceLROnPlateau, TensorBoard, ModelCheckpoint, and Keras' own
    progress bar and History, which Keras 3 appends last) see it. Put it before them.

    As Horovod's: a plain mean of the workers' epoch values, in name order. Here in one float64
    all-reduce, the values written back as Python floats. With one worker the logs are left as
    they are. Workers whose logs differ (other names, a non-numeric entry) raise a ValueError on
    every rank instead of mixing up values.

    Args: device: the device the all-reduce runs on ('' = TensorFlow's choice).
    """

    def __init__(self, device: str = ""):
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch, logs=None):
        self._average_metrics_in_place(logs)

    def _average_metrics_in_place(self, logs) -> None:
        size = world.size()
        if size == 1:
            return
        logs = {} if logs is None else logs
        names = sorted(logs)
        try:
            values = [float(logs[n]) for n in names]
            numeric = 1
        except (TypeError, ValueError):
            values, numeric = [], 0
        if not _same_on_every_rank(len(names), _fingerprint("\0".join(names)), numeric):
            raise ValueError(
                f"MetricAverageCallback: the workers' epoch logs differ (rank {world.rank()} "
                f"has {names}{'' if numeric else ', not all numbers'}): every worker must log "
                f"the same numeric entries (same metrics, validation on all or none)")
        if not names:
            return
        with tf.device(self.device):
            sums = world.allreduce_sum(tf.constant(values, tf.float64),
                                       name="tftorus_metric_average").numpy()
        logs.update({n: float(s) / size for n, s in zip(names, sums)})


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the optimizer's learning rate to `initial_lr * multiplier(epoch)` from start_epoch to
    end_epoch (exclusive; None: to the end), as Horovod's: with staircase=True at the first
    batch of each epoch, with the integer epoch; with staircase=False at every batch, with
    epoch + batch / steps_per_epoch (steps_per_epoch: Keras' `params['steps']` when None). A
    number as `multiplier` means `multiplier ** (epoch - start_epoch)`. Outside the range the
    learning rate is left as it is. At each epoch end logs['lr'] is the learning rate.

    Keras 3: the learning rate is the optimizer's variable (set through `optimizer.learning_rate
    = lr`, which assigns it, so a traced step sees it); an optimizer made with a
    LearningRateSchedule cannot be set (Keras raises TypeError).

    Momentum correction (Goyal et al. 2017, as Horovod's): when the learning rate changes from
    old_lr to new_lr, the next step uses momentum * new_lr / old_lr, so the velocity that carries
    old_lr's steps is rescaled to the new rate. Horovod assigns `optimizer.momentum` for the
    step and restores it after. Keras 3's SGD and RMSprop keep `momentum` as a Python float that
    is read when the train step is traced, so assigning it after the first step changes nothing
    (measured on Keras 3.15: weights bit-identical with and without the change); and on TF 2.15
    Horovod 0.28.1's own callback fails on Keras 2's SGD(momentum>0) ("'float' object has no
    attribute 'dtype'") unless the legacy optimizer is used. Here, therefore:
      - SGD and RMSprop (and their subclasses, e.g. tftorus' DistributedOptimizer, also inside
        a LossScaleOptimizer): the momentum slots are multiplied by new_lr / old_lr before the
        step. Their updates are velocity = momentum * velocity +/- lr * (...), so this is the same
        update as momentum * new_lr / old_lr for one step (the correction of the paper; with
        nesterov=True the look-ahead term keeps the plain momentum). It is state, not a setting,
        so it takes effect in traced and eager steps alike, and over micro-batches per update
        the factors multiply to the ratio between the updates' learning rates.
      - a momentum held in a variable (e.g. a LARS): assigned for the step and restored at the
        batch's end, as Horovod.
      - any other optimizer with a non-zero float `momentum`: ValueError at the start of fit
        (the correction could not take effect); pass momentum_correction=False.
    Not corrected when old_lr is 0 (no ratio).
    """

    def __init__(self, initial_lr: float, multiplier: Union[float, Callable[[float], float]],
                 start_epoch: int = 0, end_epoch: Optional[int] = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.restore_momentum = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)
        self._kind = None  # how the momentum is corrected: see _momentum_kind
        self._scale_slots = None  # (the slots' ids, a tf.function scaling them)

    # -- the optimizer -----------------------------------------------------------------------
    def _lr(self) -> float:
        return _number(self.model.optimizer.learning_rate)

    def _momentum_kind(self) -> Optional[str]:
        """'slots', 'variable' or None (nothing to correct); raises if it cannot take effect."""
        optimizer = _unwrap(self.model.optimizer)
        momentum = getattr(optimizer, "momentum", None)
        if not self.momentum_correction or momentum is None:
            return None
        if isinstance(momentum, _VARIABLE_TYPES):
            return "variable"
        if isinstance(optimizer, (keras.optimizers.SGD, keras.optimizers.RMSprop)):
            return "slots"
        if float(momentum) == 0.0:
            return None
        raise ValueError(
            f"{type(self).__name__}(momentum_correction=True): {type(optimizer).__name__}."
            f"momentum is a Python number, which Keras 3 reads when the train step is traced, so "
            f"changing it per step would not take effect, and tftorus corrects the momentum "
            f"slots of SGD and RMSprop only. Pass momentum_correction=False (or hold the "
            f"momentum in a variable)")

    def _momentum_slots(self) -> list:
        optimizer = _unwrap(self.model.optimizer)
        if isinstance(optimizer, keras.optimizers.SGD):
            return list(getattr(optimizer, "momentums", None) or [])
        return list(getattr(optimizer, "_momentums", None) or [])  # RMSprop

    def _correct_momentum(self, ratio: float) -> None:
        if self._kind == "variable":
            momentum = _unwrap(self.model.optimizer).momentum
            self.restore_momentum = _number(momentum)
            momentum.assign(self.restore_momentum * ratio)
            return
        slots = self._momentum_slots()  # none before the first step traced: all zero then
        if not slots or ratio == 1.0:
            return
        ids = [id(s) for s in slots]
        if self._scale_slots is None or self._scale_slots[0] != ids:
            variables = _tf_variables(slots)

            def scale(r):
                for v in variables:
                    v.assign(v * tf.cast(r, v.dtype))
            self._scale_slots = (ids, tf.function(scale, autograph=False))
        self._scale_slots[1](tf.constant(ratio, tf.float64))

    def _adjust_learning_rate(self, epoch: float) -> None:
        old_lr = self._lr()
        new_lr = self.initial_lr * self.multiplier(epoch)
        self.model.optimizer.learning_rate = new_lr
        if self._kind is not None and old_lr != 0:
            self._correct_momentum(new_lr / old_lr)

    def _restore_momentum_if_needed(self) -> None:
        if self.restore_momentum is not None:
            _unwrap(self.model.optimizer).momentum.assign(self.restore_momentum)
            self.restore_momentum = None

    # -- Keras' calls --------------------------------------------------------------------------
    def _autodetect_steps_per_epoch(self) -> int:
        steps = (self.params or {}).get("steps")
        if steps:
            return steps
        raise ValueError(
            f"Could not autodetect the number of steps per epoch (Keras gives none for a "
            f"dataset of unknown length): pass steps_per_epoch to {type(self).__name__}() "
            f"(or to fit)")

    def on_train_begin(self, logs=None):
        self._kind = self._momentum_kind()
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.current_epoch < self.start_epoch
                or (self.end_epoch is not None and self.current_epoch >= self.end_epoch)):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = self._lr()


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warm-up (Goyal et al. 2017), as Horovod's: from initial_lr / size to initial_lr
    over warmup_epochs, set at every batch:

        lr = initial_lr / size * ((epoch + (batch + 1) / steps_per_epoch) * (size - 1)
                                  / warmup_epochs + 1)

    (the +1 batch makes the last batch of the warm-up reach initial_lr exactly), untouched from
    epoch warmup_epochs on; size is the world's at each batch. With momentum correction, as
    LearningRateScheduleCallback (see there for Keras 3). verbose > 0: rank 0 prints when the
    warm-up ends.
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                 verbose: int = 0):
        def multiplier(epoch):
            size = world.size()
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and world.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{self._lr():g}.")


__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback"]


def __getattr__(name):  # Horovod's callback that only its Spark estimator can complete
    if name == "BestModelCheckpoint":
        raise stack.horovod_required(
            "tftorus.keras.callbacks.BestModelCheckpoint",
            "Horovod's Spark estimator fills in its file path; use "
            "keras.callbacks.ModelCheckpoint(path, save_best_only=True) on rank 0")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
