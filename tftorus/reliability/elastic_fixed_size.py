"""`hvd.elastic` where Horovod is not installed (the current stack): Horovod's state objects and
run(), over a world that keeps its size.

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...                    # steps; state.commit() every few

    train(state)               # state synced from rank 0 first

What is Horovod's here: the states commit (save) in memory, restore the last commit, and sync
from rank 0 (variables by broadcast, the keyword attributes as one pickled object); reset
callbacks can be registered; run() syncs the state, then calls the function.

What differs, and why: Horovod's elastic driver re-forms a smaller or larger world when a worker
is lost or added. The tf engine cannot: TensorFlow aborts a process' collective executor for good
when a peer is lost (tftorus/engines/tf_engine.py), so a running process never joins a new
world. A lost worker therefore ends the job here: run() puts the last commit back into the state
(the variables too), then raises the engine's CollectiveError, so a handler can save that commit
before the process exits. Restart the job (on any number of workers) and resume from the saved
checkpoint; run_scripts/train.py does this with --resume=auto. No host is ever added, so commit()
has no host updates to check.
"""
import copy
import functools
from typing import Callable, List

import tensorflow as tf

from tftorus.engines.tf_engine import CollectiveError, translate_errors
from tftorus.horovod_api.functions import broadcast_object
from tftorus.horovod_api.mpi_ops import broadcast_variables
from tftorus.runtime import process_state


def _rank() -> int:
    return process_state.rank()


class State:
    """Horovod's State: what a training loop commits, restores and syncs. Subclasses define
    save(), restore() and sync()."""

    def __init__(self, bcast_object: Callable = broadcast_object, get_rank: Callable = _rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: List[Callable] = []

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions run after a reset (kept for Horovod's code; a fixed world never resets)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res) -> None:
        """Horovod's driver calls it; no driver runs here, so no host update ever arrives."""

    def commit(self) -> None:
        """Save the state in memory (Horovod's commit also checks for host updates: none here)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """No elastic driver sends host updates on this stack: nothing to check."""

    def save(self) -> None:
        raise NotImplementedError("a State subclass saves its own values")

    def restore(self) -> None:
        raise NotImplementedError("a State subclass restores its own values")

    def sync(self) -> None:
        raise NotImplementedError("a State subclass syncs its own values")

    def reset(self) -> None:
        """Called before the callbacks of a reset."""


class ObjectState(State):
    """Horovod's ObjectState: each keyword argument becomes an attribute; commit() saves their
    current values, restore() puts the saved ones back, sync() takes rank 0's saved ones."""

    def __init__(self, bcast_object: Callable = broadcast_object, get_rank: Callable = _rank,
                 **kwargs):
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.copy(value))


class _VariablesState(ObjectState):
    """Variables saved as NumPy copies, put back by assign, synced by broadcast from rank 0."""

    def _variables(self) -> list:
        raise NotImplementedError

    def _save_variables(self) -> None:
        self._values = [v.numpy() for v in self._variables()]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self._variables(), self._values):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        variables = self._variables()
        if variables:
            broadcast_variables(variables, root_rank=0)
        self._save_variables()
        super().sync()


class TensorFlowState(_VariablesState):
    """Horovod's TensorFlowState: a list of tf.Variables and keyword attributes (eager code;
    TF2 has no global variables to default to)."""

    def __init__(self, variables=None, session=None, **kwargs):
        del session  # the tf engine needs no session (tftorus/horovod_api/functions.py)
        if variables is None:
            variables = tf.compat.v1.global_variables()
        if not tf.executing_eagerly():
            raise RuntimeError("hvd.elastic.TensorFlowState runs in eager code on this stack "
                               "(Horovod's does too on TensorFlow 2): build it outside "
                               "tf.function and TF1 graphs")
        self.variables = list(variables)
        self._save_variables()
        super().__init__(**kwargs)

    def _variables(self) -> list:
        return self.variables


class TensorFlowKerasState(_VariablesState):
    """Horovod's TensorFlowKerasState for Keras 3: the model's and optimizer's variables (the
    optimizer's slots made now, so every rank has the same ones to broadcast) and keyword
    attributes. backend: accepted for Horovod's signature (Keras 3 has no TF1 session)."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        del backend
        if not getattr(model, "built", True):
            raise ValueError("the model must be built before its state is tracked: call "
                             "model.build(input_shape) or run one batch through it first")
        self.model = model
        self.optimizer = optimizer or model.optimizer
        if self.optimizer is None:
            raise ValueError("no optimizer: pass optimizer= or compile the model first")
        if not getattr(self.optimizer, "built", True):
            self.optimizer.build(model.trainable_variables)
        self._save_variables()
        super().__init__(**kwargs)

    def _variables(self) -> list:
        return list(self.model.variables) + list(self.optimizer.variables)

    def reset(self) -> None:
        for attr in ("train_function", "test_function", "predict_function"):
            if getattr(self.model, attr, None) is not None:
                setattr(self.model, attr, None)


#: What a lost worker raises (Horovod's name for it; `except HorovodInternalError` catches it)
HorovodInternalError = CollectiveError


def run(func):
    """Decorator, Horovod's `hvd.elastic.run`: sync the state from rank 0, then run
    `func(state, ...)`. A lost worker (CollectiveError) puts the last commit back into the state
    and raises CollectiveError: this world cannot be re-formed (module docstring)."""
    return run_fn(func, reset=None)


def run_fn(func, reset):
    """Horovod's run_fn: run() with the reset Horovod would call between worlds, which never
    comes here (`reset` is kept for Horovod's signature and not called)."""
    del reset

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        state.sync()
        try:
            with translate_errors():  # a traced step's failed collective, as eager code's
                return func(state, *args, **kwargs)
        except CollectiveError as e:
            state.restore()
            raise CollectiveError(
                f"{e}\nhvd.elastic on this stack cannot re-form the world without the lost "
                f"worker: the state holds its last commit; save it, restart the job and resume "
                f"from it") from e

    return wrapper


__all__ = ["run", "State", "ObjectState", "TensorFlowKerasState", "TensorFlowState"]
