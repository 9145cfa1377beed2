"""`hvd.elastic` on the classic stack (tftorus/elastic.py chooses): Horovod's elastic training
over the torus, with the world re-formed on every reset.

    import tftorus as hvd            # or tftorus.keras, whose elastic adds KerasState

    hvd.init()
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, step=0)

    @hvd.elastic.run
    def train(state):
        ...                          # steps; state.commit() every few

    train(state)

Run it under Horovod's elastic driver (`horovodrun -np 4 --min-np 3 --max-np 4
--host-discovery-script ./hosts.sh python train.py`). When a worker is lost, the others raise,
put back the last commit and wait for the driver's new world; when one is added, they stop at
the next commit. Either way Horovod's reset only restarts Horovod; this one (process_state.reform)
also plans the torus grid for the new size, adds its row and column process sets and logs the
grid it chose (and why, where the size has no two factors). Then the state is broadcast from
rank 0, so a worker that joined starts from the survivors' commit.

A reduction traces its collectives for one world. Keras' fit retraces by itself (the states
here forget a model's compiled functions on reset); a tf.function step of your own must be
created inside the function given to run(), so each world traces it anew. One traced before a
reset refuses to run after it (process_state.world_guard), instead of reducing over stale groups.
"""
import functools

import tensorflow as tf
from horovod.common.elastic import ObjectState, State, run_fn  # noqa: F401  Horovod's own
from horovod.common.exceptions import HorovodInternalError
from horovod.tensorflow import elastic as _horovod_elastic

from tftorus.runtime import process_state

#: Horovod's TensorFlow ops: an UnknownError from one of them means a peer was lost (Horovod's
#: own run() knows all but the all-to-all, which the torus' reduce-scatter runs on).
_HOROVOD_OPS = ("HorovodAllreduce", "HorovodAllgather", "HorovodBroadcast", "HorovodAlltoall",
                "HorovodReducescatter")


def run(func):
    """Decorator: run `func(state, ...)` across resets, as `horovod.tensorflow.elastic.run`,
    re-forming the torus for every new world (module docstring)."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.UnknownError as e:
            if any(op in e.message for op in _HOROVOD_OPS):
                raise HorovodInternalError(e) from e
            raise

    return run_fn(wrapper, _reset)


def _reset():
    if process_state.is_initialized():
        process_state.reform()
    else:  # Horovod started alone (hvd.init()): nothing of the torus to re-form yet
        _horovod_elastic._reset()


def _build_optimizer(model, optimizer) -> None:
    """Make a Keras optimizer's slots now: a worker that joins has none until its first step,
    and the state's broadcast needs the same variables on every rank."""
    inner = optimizer
    while hasattr(inner, "inner_optimizer"):  # LossScaleOptimizer
        inner = inner.inner_optimizer
    if isinstance(inner, tf.keras.optimizers.Optimizer):  # the new optimizers
        inner.build(model.trainable_variables)
    elif hasattr(inner, "_create_all_weights"):  # the legacy ones
        inner._create_all_weights(model.trainable_variables)


def forget_traced_functions(model) -> None:
    """Drop a Keras model's compiled train/test/predict functions: the next fit traces its step
    for the world that runs it."""
    for attr in ("train_function", "test_function", "predict_function"):
        if getattr(model, attr, None) is not None:
            setattr(model, attr, None)


class TensorFlowKerasState(_horovod_elastic.TensorFlowKerasState):
    """`horovod.tensorflow.elastic.TensorFlowKerasState`: the model's and optimizer's variables
    and `kwargs` (epoch=, batch=, ...), committed in memory and broadcast on reset. Two
    additions: the optimizer's slots exist from the start on every rank, and a reset drops the
    model's traced functions, whose collectives belong to the old world."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if getattr(model, "built", True):  # Horovod's own check says what to do otherwise
            _build_optimizer(model, optimizer or model.optimizer)
        super().__init__(model, optimizer=optimizer, backend=backend, **kwargs)

    def reset(self):
        forget_traced_functions(self.model)
        super().reset()


TensorFlowState = _horovod_elastic.TensorFlowState  # variables alone: nothing traced to drop

__all__ = ["run", "State", "ObjectState", "TensorFlowKerasState", "TensorFlowState"]
