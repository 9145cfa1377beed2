"""LARS on Keras 3 (the current stack): a `keras.optimizers.Optimizer`.

Import `official_resnet.optimizers.lars`, which picks this class or lars_keras2's; the math and the
API are documented there, and the update itself is lars_core.lars_update (TensorFlow ops: the
package runs on Keras 3's TensorFlow backend).

What Keras 3 changes, and how this class answers it:
- `update_step(gradient, variable, learning_rate)` receives the backend's `tf.Variable`, whose
  name is the bare 'kernel:0' (Keras 3 keeps the unique name in the Keras variable's `path`,
  'conv1_bn/gamma'). `build` therefore decides each variable's terms (weight decay, trust
  ratio) once, from `stack.variable_name` (the path), and `update_step` finds them by index.
- The base class takes only a Python float as a constant learning rate (not an int or a NumPy
  number): numbers are converted. It holds the learning rate in a variable, as Keras 2 does.
- The momentum is a Keras variable made by `add_variable`, like the learning rate, so it is in
  `optimizer.variables` and saved with the optimizer (on Keras 2 it is an attribute only).
"""
import numbers
from typing import Optional, Sequence

import keras

from official_resnet.optimizers import lars_core as core
from tftorus.runtime import stack


@keras.saving.register_keras_serializable(package="tftorus")
class LARS(keras.optimizers.Optimizer):
    """SGD with momentum and a per-variable trust ratio (see official_resnet/optimizers/lars.py).

    Args:
      learning_rate: float or `LearningRateSchedule`; the global LR, multiplied by each
        variable's trust ratio. Settable each step when it is a float.
      momentum: float in [0, 1); settable each step (`lars.momentum = m`).
      weight_decay: L2 coefficient added to the gradient (coupled) and to the trust ratio's
        denominator.
      trust_coefficient: eta of the LARS paper (paper recipe 0.01, common elsewhere 0.001).
      epsilon: added to the trust ratio's denominator.
      exclude_from_weight_decay: regexes (`re.search` on the variable's path): matching
        variables get no weight decay, e.g. ['_bn', 'bias'] for Keras ResNet names
        (`conv1_bn/gamma`).
      exclude_from_layer_adaptation: regexes: matching variables get trust ratio 1 (plain SGD
        with momentum). None: the same list as exclude_from_weight_decay.
      nesterov: Nesterov momentum.
      name, **kwargs: the Keras base optimizer's arguments (clipnorm, use_ema,
        gradient_accumulation_steps, ...).
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
        if isinstance(learning_rate, numbers.Real) and not isinstance(learning_rate, bool):
            learning_rate = float(learning_rate)  # Keras 3 refuses an int or a NumPy float
        # The base class keeps `weight_decay` (so it shows in configs and `opt.weight_decay`);
        # its decoupled decay is switched off below, LARS folds decay into the gradient.
        super().__init__(learning_rate=learning_rate, name=name, weight_decay=weight_decay,
                         **kwargs)
        self._momentum = self.add_variable(
            shape=(), initializer=keras.initializers.Constant(float(momentum)),
            dtype="float32", aggregation="only_first_replica", name="momentum")
        self.trust_coefficient = float(trust_coefficient)
        self.epsilon = float(epsilon)
        self.nesterov = bool(nesterov)
        self._exclude_decay, self._exclude_adaptation = core.exclusions(
            exclude_from_weight_decay, exclude_from_layer_adaptation)

    # --- hyperparameters ----------------------------------------------------------------------
    @property
    def momentum(self):
        """The momentum variable; assign a float (`opt.momentum = 0.95`) or `.assign(0.95)`."""
        return self._momentum

    @momentum.setter
    def momentum(self, value):
        core.check_momentum(value)
        self._momentum.assign(value)

    # --- variables ----------------------------------------------------------------------------
    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        # Same dtype as the variable (FP32 under mixed_float16); name "<path>_velocity".
        self._velocities = [self.add_variable_from_reference(v, "velocity") for v in variables]
        # (weight decay, trust ratio?) per variable, by its path: update_step sees tf.Variables.
        self._lars_terms = tuple(
            (self.weight_decay if self._use_weight_decay(v) else 0.0,
             self._use_layer_adaptation(v)) for v in variables)

    def velocity(self, variable):
        """The momentum buffer of `variable` (after the optimizer is built)."""
        return self._velocities[self._get_variable_index(variable)]

    def _use_weight_decay(self, variable) -> bool:
        # The constructor's regexes, plus anything excluded through the base class' method.
        return (not core.matches(stack.variable_name(variable), self._exclude_decay)
                and super()._use_weight_decay(variable))

    def _use_layer_adaptation(self, variable) -> bool:
        return not core.matches(stack.variable_name(variable), self._exclude_adaptation)

    def _apply_weight_decay(self, variables):
        """No decoupled decay: LARS adds weight decay to the gradient in `update_step`."""

    # --- the update ---------------------------------------------------------------------------
    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        decay, adapt = self._lars_terms[index]
        velocity = self._velocities[index]
        new_velocity, step = core.lars_update(
            gradient, variable, velocity, learning_rate, self._momentum, decay=decay,
            adapt=adapt, trust_coefficient=self.trust_coefficient, epsilon=self.epsilon,
            nesterov=self.nesterov)
        self.assign(velocity, new_velocity)  # cast back to each variable's dtype
        self.assign_sub(variable, step)

    # --- serialization ------------------------------------------------------------------------
    def get_config(self):
        # Every constructor argument: tftorus' DistributedOptimizer rebuilds from this. The base
        # class serializes the learning rate (a float, or a schedule's config).
        config = super().get_config()
        config.update(core.lars_config(
            momentum=self._momentum.numpy(), weight_decay=self.weight_decay,
            trust_coefficient=self.trust_coefficient, epsilon=self.epsilon,
            exclude_decay=self._exclude_decay, exclude_adaptation=self._exclude_adaptation,
            nesterov=self.nesterov))
        return config
