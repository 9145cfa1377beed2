"""LARS on Keras 2.15 (the classic stack): `tf.keras.optimizers.Optimizer`, the new optimizer.

Import `official_resnet.optimizers.lars`, which picks this class or lars_keras3's; the math and the
API are documented there, and the update itself is lars_core.lars_update.
"""
from typing import Optional, Sequence

import tensorflow as tf

from official_resnet.optimizers import lars_core as core
from tftorus.runtime import stack


@tf.keras.saving.register_keras_serializable(package="tftorus")
class LARS(tf.keras.optimizers.Optimizer):
    """SGD with momentum and a per-variable trust ratio (see official_resnet/optimizers/lars.py).

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
        trust_coefficient: float = core.DEFAULT_TRUST_COEFFICIENT,
        epsilon: float = core.DEFAULT_EPSILON,
        exclude_from_weight_decay: Optional[Sequence[str]] = None,
        exclude_from_layer_adaptation: Optional[Sequence[str]] = None,
        nesterov: bool = False,
        name: str = "LARS",
        **kwargs,
    ):
        weight_decay = core.check_arguments(momentum, weight_decay, trust_coefficient, epsilon)
        # The base class keeps `weight_decay` (so it shows in configs and `opt.weight_decay`);
        # its decoupled decay is switched off below, LARS folds decay into the gradient.
        super().__init__(name=name, weight_decay=weight_decay, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)
        self._momentum = self._build_hyperparameter(momentum, "momentum")
        self.trust_coefficient = float(trust_coefficient)
        self.epsilon = float(epsilon)
        self.nesterov = bool(nesterov)
        self._exclude_decay, self._exclude_adaptation = core.exclusions(
            exclude_from_weight_decay, exclude_from_layer_adaptation)

    # --- hyperparameters ----------------------------------------------------------------------
    def _build_hyperparameter(self, value, name: str) -> tf.Variable:
        # Like the base class' learning rate: created outside any tf.function, FP32, tracked by
        # checkpoints as an attribute (not in `variables`, whose order set_weights relies on).
        with tf.init_scope():
            return tf.Variable(value, name=name, dtype=core.COMPUTE_DTYPE, trainable=False)

    @property
    def momentum(self) -> tf.Variable:
        """The momentum variable; assign a float (`opt.momentum = 0.95`) or `.assign(0.95)`."""
        return self._momentum

    @momentum.setter
    def momentum(self, value):
        core.check_momentum(value)
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
        return (not core.matches(stack.variable_name(variable), self._exclude_decay)
                and super()._use_weight_decay(variable))

    def _use_layer_adaptation(self, variable) -> bool:
        return not core.matches(stack.variable_name(variable), self._exclude_adaptation)

    def _apply_weight_decay(self, variables):
        """No decoupled decay: LARS adds weight decay to the gradient in `update_step`."""

    # --- the update ---------------------------------------------------------------------------
    def update_step(self, gradient, variable):
        # Which terms apply is decided by the variable's name, once, at trace time.
        velocity = self.velocity(variable)
        new_velocity, step = core.lars_update(
            gradient, variable, velocity, self.learning_rate, self._momentum,
            decay=self.weight_decay if self._use_weight_decay(variable) else 0.0,
            adapt=self._use_layer_adaptation(variable),
            trust_coefficient=self.trust_coefficient, epsilon=self.epsilon,
            nesterov=self.nesterov)
        velocity.assign(tf.cast(new_velocity, velocity.dtype))
        variable.assign_sub(tf.cast(step, variable.dtype))

    # --- serialization ------------------------------------------------------------------------
    def get_config(self):
        # Every constructor argument: Horovod's DistributedOptimizer rebuilds from this.
        config = super().get_config()
        learning_rate = self._serialize_hyperparameter(self._learning_rate)
        config.update(
            # A float, or a schedule's config dict (from_config deserializes it).
            learning_rate=learning_rate if isinstance(learning_rate, dict)
            else float(learning_rate),
            **core.lars_config(
                momentum=self._momentum.numpy(), weight_decay=self.weight_decay,
                trust_coefficient=self.trust_coefficient, epsilon=self.epsilon,
                exclude_decay=self._exclude_decay, exclude_adaptation=self._exclude_adaptation,
                nesterov=self.nesterov))
        return config
