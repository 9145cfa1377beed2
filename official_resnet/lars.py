"""LARS: layer-wise adaptive rate scaling (You, Gitman and Ginsburg, arXiv 1708.03888).

The optimizer of the paper's recipe ("LARS with a coefficient of 0.01 and eps of 1e-6"), as a
Keras 2.15 optimizer (the new `tf.keras.optimizers.Optimizer`). For each variable w with
gradient g, every step, all in FP32:

    wd_w   = weight_decay            (0 if the name matches exclude_from_weight_decay)
    g'     = g + wd_w * w
    trust  = trust_coefficient * ||w|| / (||g|| + wd_w * ||w|| + epsilon)
             if ||w|| > 0 and ||g|| > 0, else 1
             (1 also if the name matches exclude_from_layer_adaptation)
    v      = momentum * v + learning_rate * trust * g'
    w      = w - v            (nesterov: w - (momentum * v + learning_rate * trust * g'))

Where this comes from, and where implementations differ:
- The trust ratio is the LARS paper's local LR, eta * ||w|| / (||g|| + beta * ||w||), with the
  epsilon and the zero-norm guard of TF 1.x `tf.contrib.opt.LARSOptimizer.compute_lr`. ||g|| is
  the norm of the raw gradient, before weight decay is added.
- The momentum form is the LARS paper's Algorithm 1 (v = m v + gamma * lambda * (g + beta w);
  w -= v): the learning rate and trust ratio scale the new gradient before it enters the buffer.
  `tf.contrib.opt.LARSOptimizer` instead keeps the buffer unscaled (v = m v + g';
  w -= lr * trust * v), which differs whenever lr or trust changes between steps, as it does in
  every warm-up and decay. With the LARS-paper form, changing the learning rate does not rescale
  the momentum already accumulated.
- The paper's trust coefficient is 0.01 (our recipe default); most public implementations
  (tf.contrib, the TPU ResNet, MLPerf references) use 0.001.
- Weight decay is coupled (added to the gradient, so the trust ratio scales it too), not the
  decoupled AdamW form that the Keras base class applies for its own `weight_decay` argument:
  `_apply_weight_decay` is therefore a no-op here.

Gradients arriving in FP16 or BF16 (gradient compression, pure half-precision models) are cast up
to FP32 before the norms; the update is cast back to the variable's dtype. Under the
`mixed_float16` policy the variables are FP32, so the whole update is FP32. Sparse gradients
(`tf.IndexedSlices`) are densified: the trust ratio needs the norm of the whole gradient.

Setting the hyperparameters every step. The learning rate and the momentum are each held in a
non-trainable FP32 `tf.Variable`, read inside the (compiled) train step, so changing them needs no
retrace:

    lars.learning_rate = 2.5          # or lars.learning_rate.assign(2.5)
    lars.momentum = 0.95              # or lars.momentum.assign(0.95)

`tf.keras.mixed_precision.LossScaleOptimizer` delegates `learning_rate` but not `momentum`: set
them on `unwrap(optimizer)` (or `optimizer.inner_optimizer`). Horovod's and tftorus'
`DistributedOptimizer` rebuild the optimizer from `get_config()`: the rebuilt object has its own
variables, so set the hyperparameters on the optimizer the wrapper returned, not on the one given
to it. A learning rate given as a `LearningRateSchedule` is evaluated on `iterations` as usual and
cannot be assigned.
"""
import numbers
import re
from typing import Iterable, Optional, Sequence

import tensorflow as tf

DEFAULT_TRUST_COEFFICIENT = 0.01  # the paper's value; public implementations mostly use 0.001
DEFAULT_EPSILON = 1e-6  # the paper's value
COMPUTE_DTYPE = tf.float32  # LARS needs FP32's range (section 3.2 of the paper)


def _patterns(value, argument: str) -> tuple:
    """A list of regexes from None, one string or a sequence of strings; each must compile."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    patterns = tuple(value)
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise TypeError(f"{argument} must be regex strings, got {pattern!r}")
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"{argument}: {pattern!r} is not a valid regex ({error})") from None
    return patterns


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(re.search(pattern, name) for pattern in patterns)


@tf.keras.saving.register_keras_serializable(package="tftorus")
class LARS(tf.keras.optimizers.Optimizer):
    """SGD with momentum and a per-variable trust ratio (see the module docstring for the math).

    Args:
      learning_rate: float or `LearningRateSchedule`; the global LR, multiplied by each
        variable's trust ratio. Settable each step when it is a float.
      momentum: float in [0, 1); settable each step (`lars.momentum = m`).
      weight_decay: L2 coefficient added to the gradient (coupled) and to the trust ratio's
        denominator.
      trust_coefficient: eta of the LARS paper (paper recipe 0.01, common elsewhere 0.001).
      epsilon: added to the trust ratio's denominator.
      exclude_from_weight_decay: regexes (`re.search` on the variable name): matching variables
        get no weight decay, e.g. ['_bn', 'bias'] for Keras ResNet names (`conv1_bn/gamma:0`).
      exclude_from_layer_adaptation: regexes: matching variables get trust ratio 1 (plain SGD
        with momentum). None: the same list as exclude_from_weight_decay.
      nesterov: Nesterov momentum.
      name, **kwargs: the Keras base optimizer's arguments (clipnorm, use_ema, jit_compile, ...).
    """

    def __init__(
        self,
        learning_rate=0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = DEFAULT_TRUST_COEFFICIENT,
        epsilon: float = DEFAULT_EPSILON,
        exclude_from_weight_decay: Optional[Sequence[str]] = None,
        exclude_from_layer_adaptation: Optional[Sequence[str]] = None,
        nesterov: bool = False,
        name: str = "LARS",
        **kwargs,
    ):
        weight_decay = 0.0 if weight_decay is None else float(weight_decay)
        checks = [
            (weight_decay >= 0, f"weight_decay must be >= 0, got {weight_decay}"),
            (trust_coefficient > 0, f"trust_coefficient must be > 0, got {trust_coefficient}"),
            (epsilon >= 0, f"epsilon must be >= 0, got {epsilon}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        _check_momentum(momentum)
        # The base class keeps `weight_decay` (so it shows in configs and `opt.weight_decay`);
        # its decoupled decay is switched off below, LARS folds decay into the gradient.
        super().__init__(name=name, weight_decay=weight_decay, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)
        self._momentum = self._build_hyperparameter(momentum, "momentum")
        self.trust_coefficient = float(trust_coefficient)
        self.epsilon = float(epsilon)
        self.nesterov = bool(nesterov)
        self._exclude_decay = _patterns(exclude_from_weight_decay, "exclude_from_weight_decay")
        self._exclude_adaptation = (
            self._exclude_decay
            if exclude_from_layer_adaptation is None
            else _patterns(exclude_from_layer_adaptation, "exclude_from_layer_adaptation"))

    # --- hyperparameters ----------------------------------------------------------------------
    def _build_hyperparameter(self, value, name: str) -> tf.Variable:
        # Like the base class' learning rate: created outside any tf.function, FP32, tracked by
        # checkpoints as an attribute (not in `variables`, whose order set_weights relies on).
        with tf.init_scope():
            return tf.Variable(value, name=name, dtype=COMPUTE_DTYPE, trainable=False)

    @property
    def momentum(self) -> tf.Variable:
        """The momentum variable; assign a float (`opt.momentum = 0.95`) or `.assign(0.95)`."""
        return self._momentum

    @momentum.setter
    def momentum(self, value):
        _check_momentum(value)
        self._momentum.assign(value)

    # --- variables ----------------------------------------------------------------------------
    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        # Same dtype as the variable (FP32 under mixed_float16); name "velocity/<variable>".
        self._velocities = [self.add_variable_from_reference(v, "velocity") for v in var_list]
        self._built = True

    def velocity(self, variable) -> tf.Variable:
        """The momentum buffer of `variable` (after the optimizer is built)."""
        return self._velocities[self._index_dict[self._var_key(variable)]]

    def _use_weight_decay(self, variable) -> bool:
        # The constructor's regexes, plus anything excluded through the base class' method.
        return (not _matches(variable.name, self._exclude_decay)
                and super()._use_weight_decay(variable))

    def _use_layer_adaptation(self, variable) -> bool:
        return not _matches(variable.name, self._exclude_adaptation)

    def _apply_weight_decay(self, variables):
        """No decoupled decay: LARS adds weight decay to the gradient in `update_step`."""

    # --- the update ---------------------------------------------------------------------------
    def update_step(self, gradient, variable):
        if isinstance(gradient, tf.IndexedSlices):
            gradient = tf.convert_to_tensor(gradient)
        grad = tf.cast(gradient, COMPUTE_DTYPE)
        weight = tf.cast(tf.convert_to_tensor(variable), COMPUTE_DTYPE)
        lr = tf.cast(self.learning_rate, COMPUTE_DTYPE)
        momentum = tf.cast(self._momentum, COMPUTE_DTYPE)
        # Which terms apply is decided by the variable's name, once, at trace time.
        decay = self.weight_decay if self._use_weight_decay(variable) else 0.0

        decayed_grad = grad + decay * weight if decay else grad
        if self._use_layer_adaptation(variable):
            w_norm = tf.norm(weight)
            g_norm = tf.norm(grad)
            ratio = self.trust_coefficient * w_norm / (g_norm + decay * w_norm + self.epsilon)
            # A zero weight (fresh zero-init) or a zero gradient has no scale to adapt to.
            trust = tf.where((w_norm > 0.0) & (g_norm > 0.0), ratio, tf.ones_like(ratio))
        else:
            trust = tf.constant(1.0, COMPUTE_DTYPE)

        velocity = self.velocity(variable)
        scaled_grad = lr * trust * decayed_grad
        new_velocity = momentum * tf.cast(velocity, COMPUTE_DTYPE) + scaled_grad
        velocity.assign(tf.cast(new_velocity, velocity.dtype))
        step = momentum * new_velocity + scaled_grad if self.nesterov else new_velocity
        variable.assign_sub(tf.cast(step, variable.dtype))

    # --- serialization ------------------------------------------------------------------------
    def get_config(self):
        # Every constructor argument: Horovod's DistributedOptimizer rebuilds from this.
        config = super().get_config()
        learning_rate = self._serialize_hyperparameter(self._learning_rate)
        config.update({
            # A float, or a schedule's config dict (from_config deserializes it).
            "learning_rate": learning_rate if isinstance(learning_rate, dict)
            else float(learning_rate),
            "momentum": float(self._momentum.numpy()),
            "weight_decay": float(self.weight_decay),
            "trust_coefficient": self.trust_coefficient,
            "epsilon": self.epsilon,
            "exclude_from_weight_decay": list(self._exclude_decay),
            "exclude_from_layer_adaptation": list(self._exclude_adaptation),
            "nesterov": self.nesterov,
        })
        return config


def _check_momentum(value) -> None:
    # Only Python/NumPy numbers can be checked here; tensors are the caller's responsibility.
    if isinstance(value, numbers.Real) and not 0.0 <= value < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {value}")


def unwrap(optimizer) -> LARS:
    """The LARS optimizer inside `optimizer` (itself, or behind LossScaleOptimizer wrappers).

    Use it to set the momentum from a callback whatever wrapped the optimizer:
    `unwrap(model.optimizer).momentum = 0.95`.
    """
    inner = optimizer
    while not isinstance(inner, LARS):
        inner = getattr(inner, "inner_optimizer", None)
        if inner is None:
            raise TypeError(f"no LARS optimizer inside {type(optimizer).__name__}")
    return inner
