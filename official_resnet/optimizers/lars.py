"""LARS: layer-wise adaptive rate scaling (You, Gitman and Ginsburg, arXiv 1708.03888).

The optimizer of the paper's recipe ("LARS with a coefficient of 0.01 and eps of 1e-6"), as a
Keras optimizer of either generation: Keras 2.15's `tf.keras.optimizers.Optimizer` on the
classic stack, `keras.optimizers.Optimizer` on Keras 3 (see "Two generations" below). For each
variable w with gradient g, every step, all in FP32:

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
non-trainable FP32 variable, read inside the (compiled) train step, so changing them needs no
retrace:

    lars.learning_rate = 2.5          # or lars.learning_rate.assign(2.5)
    lars.momentum = 0.95              # or lars.momentum.assign(0.95)

The LossScaleOptimizer (`tf.keras.mixed_precision.LossScaleOptimizer` on Keras 2,
`keras.optimizers.LossScaleOptimizer` on Keras 3) delegates `learning_rate` but not `momentum`:
set them on `unwrap(optimizer)` (or `optimizer.inner_optimizer`). Horovod's and tftorus'
`DistributedOptimizer` rebuild the optimizer from `get_config()`: the rebuilt object has its own
variables, so set the hyperparameters on the optimizer the wrapper returned, not on the one given
to it. A learning rate given as a `LearningRateSchedule` is evaluated on `iterations` as usual and
cannot be assigned.

Two generations. `LARS` is lars_keras2.LARS on Keras 2 and lars_keras3.LARS on Keras 3 (beside
this file), chosen below by `tftorus.runtime.stack.KERAS_3`, the one place that tells them apart;
both call lars_core, which holds the update, the trust ratio, the argument checks and the
exclusions, so the math is one piece of code. They
differ only where their base classes do:
- Variable names for the exclusion regexes are `tftorus.runtime.stack.variable_name(v)`:
  tf.Variable's `name` on Keras 2 ('conv1_bn/gamma:0'), the Keras variable's `path` on Keras 3
  ('conv1_bn/gamma'; its `name` is just 'gamma'). The recipe's ['_bn', 'bias'] excludes the same
  variables of official_resnet.model.network's ResNet on both. Keras 3 hands `update_step` the
  backend's tf.Variable (named 'gamma:0'), so that class decides each variable's terms in
  `build`.
- The momentum variable: an attribute outside `optimizer.variables` on Keras 2 (whose
  `set_weights` order would change), a Keras variable in `optimizer.variables` on Keras 3 (as
  Keras 3 keeps the learning rate and iterations there), so a saved model keeps it.
- Keras 3 takes a constant learning rate only as a Python float: numbers are converted.
- Saving: a model compiled with plain LARS saves and loads with Keras alone on both (registered
  as 'tftorus>LARS'). On Keras 3 tftorus' DistributedOptimizer rebuilds LARS as an unregistered
  subclass, which Keras saves under the bare name 'LARS': load such a model with
  `keras.models.load_model(path, custom_objects={"LARS": LARS})` (or tftorus.keras.load_model,
  passing custom_optimizers=[LARS]).
"""
from official_resnet.optimizers import lars_core
from official_resnet.optimizers.lars_core import (DEFAULT_EPSILON,  # noqa: F401 (re-exported)
                                                  DEFAULT_TRUST_COEFFICIENT)
from tftorus.runtime import stack

if stack.KERAS_3:
    from official_resnet.optimizers.lars_keras3 import LARS
else:
    from official_resnet.optimizers.lars_keras2 import LARS

__all__ = ["LARS", "unwrap", "DEFAULT_TRUST_COEFFICIENT", "DEFAULT_EPSILON"]


def unwrap(optimizer) -> LARS:
    """The LARS optimizer inside `optimizer` (itself, or behind LossScaleOptimizer wrappers).

    Use it to set the momentum from a callback whatever wrapped the optimizer:
    `unwrap(model.optimizer).momentum = 0.95`.
    """
    return lars_core.unwrap(optimizer, LARS)
