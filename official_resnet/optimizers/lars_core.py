"""What both generations of LARS share: argument checks, name exclusions and the update itself.

The math is documented in lars.py (beside this file); lars_keras2.py and lars_keras3.py hold
one small optimizer class each, which only adapt this module to their Keras' optimizer base class.
Everything here is TensorFlow or plain Python, so both classes run the very same ops.
"""
import numbers
import re
from typing import Iterable, Optional, Sequence

import tensorflow as tf

DEFAULT_TRUST_COEFFICIENT = 0.01  # the paper's value; public implementations mostly use 0.001
DEFAULT_EPSILON = 1e-6  # the paper's value
COMPUTE_DTYPE = tf.float32  # LARS needs FP32's range (section 3.2 of the paper)


def patterns(value, argument: str) -> tuple:
    """A list of regexes from None, one string or a sequence of strings; each must compile."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    found = tuple(value)
    for pattern in found:
        if not isinstance(pattern, str):
            raise TypeError(f"{argument} must be regex strings, got {pattern!r}")
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"{argument}: {pattern!r} is not a valid regex ({error})") from None
    return found


def matches(name: str, regexes: Iterable[str]) -> bool:
    """`re.search` of any of `regexes` in the variable name."""
    return any(re.search(pattern, name) for pattern in regexes)


def check_momentum(value) -> None:
    # Only Python/NumPy numbers can be checked here; tensors are the caller's responsibility.
    if isinstance(value, numbers.Real) and not 0.0 <= value < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {value}")


def check_arguments(momentum, weight_decay, trust_coefficient, epsilon) -> float:
    """Refuses out-of-range hyperparameters; returns weight_decay as a float (None is 0)."""
    weight_decay = 0.0 if weight_decay is None else float(weight_decay)
    checks = [
        (weight_decay >= 0, f"weight_decay must be >= 0, got {weight_decay}"),
        (trust_coefficient > 0, f"trust_coefficient must be > 0, got {trust_coefficient}"),
        (epsilon >= 0, f"epsilon must be >= 0, got {epsilon}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    check_momentum(momentum)
    return weight_decay


def exclusions(exclude_from_weight_decay: Optional[Sequence[str]],
               exclude_from_layer_adaptation: Optional[Sequence[str]]):
    """(weight-decay regexes, layer-adaptation regexes); the second defaults to the first."""
    decay = patterns(exclude_from_weight_decay, "exclude_from_weight_decay")
    adaptation = decay if exclude_from_layer_adaptation is None else patterns(
        exclude_from_layer_adaptation, "exclude_from_layer_adaptation")
    return decay, adaptation


def trust_ratio(weight, grad, decay: float, trust_coefficient: float, epsilon: float):
    """eta * ||w|| / (||g|| + wd * ||w|| + eps), or 1 where ||w|| or ||g|| is 0 (FP32 inputs)."""
    w_norm = tf.norm(weight)
    g_norm = tf.norm(grad)
    ratio = trust_coefficient * w_norm / (g_norm + decay * w_norm + epsilon)
    # A zero weight (fresh zero-init) or a zero gradient has no scale to adapt to.
    return tf.where((w_norm > 0.0) & (g_norm > 0.0), ratio, tf.ones_like(ratio))


def lars_update(gradient, weight, velocity, learning_rate, momentum, *, decay: float,
                adapt: bool, trust_coefficient: float, epsilon: float, nesterov: bool):
    """One LARS step in FP32: returns (the new velocity, the step to subtract from the weight).

    gradient, weight, velocity: tensors (or variables) of any float dtype, cast to FP32 here;
    a `tf.IndexedSlices` gradient is densified (the trust ratio needs the whole gradient's norm).
    learning_rate, momentum: scalars (variables read inside the step, so no retrace).
    decay: the weight decay of this variable (0 when excluded); adapt: whether the trust ratio
    applies. Both are Python values, decided once per variable by its name.
    """
    if isinstance(gradient, tf.IndexedSlices):
        gradient = tf.convert_to_tensor(gradient)
    grad = tf.cast(gradient, COMPUTE_DTYPE)
    weight = tf.cast(tf.convert_to_tensor(weight), COMPUTE_DTYPE)
    lr = tf.cast(tf.convert_to_tensor(learning_rate), COMPUTE_DTYPE)
    momentum = tf.cast(tf.convert_to_tensor(momentum), COMPUTE_DTYPE)

    decayed_grad = grad + decay * weight if decay else grad
    if adapt:
        trust = trust_ratio(weight, grad, decay, trust_coefficient, epsilon)
    else:
        trust = tf.constant(1.0, COMPUTE_DTYPE)
    scaled_grad = lr * trust * decayed_grad
    new_velocity = momentum * tf.cast(tf.convert_to_tensor(velocity), COMPUTE_DTYPE) \
        + scaled_grad
    step = momentum * new_velocity + scaled_grad if nesterov else new_velocity
    return new_velocity, step


def lars_config(*, momentum: float, weight_decay: float, trust_coefficient: float,
                epsilon: float, exclude_decay: tuple, exclude_adaptation: tuple,
                nesterov: bool) -> dict:
    """LARS' own constructor arguments in a config (the base class adds the others)."""
    return {
        "momentum": float(momentum),
        "weight_decay": float(weight_decay),
        "trust_coefficient": trust_coefficient,
        "epsilon": epsilon,
        "exclude_from_weight_decay": list(exclude_decay),
        "exclude_from_layer_adaptation": list(exclude_adaptation),
        "nesterov": nesterov,
    }


def unwrap(optimizer, lars_class):
    """The `lars_class` optimizer inside `optimizer` (itself, or behind `inner_optimizer`s)."""
    inner = optimizer
    while not isinstance(inner, lars_class):
        inner = getattr(inner, "inner_optimizer", None)
        if inner is None:
            raise TypeError(f"no LARS optimizer inside {type(optimizer).__name__}")
    return inner
