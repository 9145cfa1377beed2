"""`hvd.elastic` where Horovod is not installed (the current stack): Horovod's state objects and
run(), on the tf engine.

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...                    # steps; state.commit() every few

    train(state)               # state synced first

What is Horovod's here: the states commit (save) in memory, restore the last commit, and sync
(variables by broadcast from rank 0, the keyword attributes as one pickled object); reset
callbacks can be registered; run() syncs the state, then calls the function.

TensorFlow aborts a process' collective executor for good when a peer is lost
(tftorus/engines/tf_engine.py), so a running process never joins a new world: an elastic world
here restarts as new processes. Two cases:
- Under a driver that restarts worlds (tftorus.ray.RayExecutor with min_workers/max_workers),
  a keeper holds the last commit outside the workers (commit_keeper.py): rank 0 hands it every
  commit, sync() in a new world takes it (so a new world resumes where the old one committed),
  the reset callbacks run there, and a commit at which workers can join raises
  HostsUpdatedInterrupt on every rank, so the driver restarts the world larger from it.
- Without one (tftorus.run, srun, mpirun, TF_CONFIG) the world keeps its size: a lost worker
  ends the job. run() puts the last commit back into the state (the variables too), then raises
  the engine's CollectiveError, so a handler can save that commit before the process exits;
  restart the job on any number of workers and resume from it (run_scripts/train.py
  --resume=auto does).
"""
import copy
import functools
from typing import Callable, List

import tensorflow as tf

from tftorus.engines.tf_engine import CollectiveError, translate_errors
from tftorus.horovod_api.functions import broadcast_object
from tftorus.horovod_api.mpi_ops import broadcast_variables
from tftorus.reliability import commit_keeper
from tftorus.reliability.commit_keeper import HostsUpdatedInterrupt
from tftorus.runtime import world


def _rank() -> int:
    return world.rank()


class State:
    """Horovod's State: what a training loop commits, restores and syncs. Subclasses define
    save(), restore() and sync()."""

    def __init__(self, bcast_object: Callable = broadcast_object, get_rank: Callable = _rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: List[Callable] = []

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions run after a reset: in each restarted world, once the state is synced."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res) -> None:
        """Horovod's driver calls it; here the keeper's answer to a commit says it instead."""

    def commit(self) -> None:
        """Save the state in memory; under a restarting driver, hand it to the keeper too, and
        stop every rank here (HostsUpdatedInterrupt) when workers can join."""
        self.save()
        keeper = commit_keeper.current()
        grow = False
        if keeper is not None:
            grow = keeper.save(self.committed() if self._rank() == 0 else None)
            grow = self._bcast_object(grow)  # every rank stops at the same commit
        if grow:
            raise HostsUpdatedInterrupt("workers can join: the world restarts larger from "
                                        "this commit")
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Horovod's hook; the keeper's answer in commit() carries the host updates here."""

    def committed(self) -> dict:
        """The last commit as plain values, for a keeper outside this process."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot be kept across worlds: a State subclass of your own "
            f"needs committed() and load_committed(); ObjectState, TensorFlowState and "
            f"TensorFlowKerasState have them")

    def load_committed(self, commit: dict) -> None:
        """Make `commit` (from committed()) the last commit and restore it."""
        raise NotImplementedError(f"{type(self).__name__} defines no load_committed()")

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

    def committed(self) -> dict:
        return {"attributes": dict(self._saved_state)}

    def load_committed(self, commit: dict) -> None:
        self._saved_state = dict(commit["attributes"])
        self.restore()

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

    def committed(self) -> dict:
        return {**super().committed(), "variables": list(self._values)}

    def load_committed(self, commit: dict) -> None:
        values = commit["variables"]
        shapes = [tuple(v.shape) for v in self._variables()]
        if [tuple(v.shape) for v in values] != shapes:
            raise ValueError(f"the kept commit has {len(values)} variables of other shapes than "
                             f"this state's {len(shapes)}: build the same model in every world")
        self._values = list(values)
        super().load_committed(commit)


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
    """Decorator, Horovod's `hvd.elastic.run`: sync the state, then run `func(state, ...)`.
    Under a restarting driver the state comes from the keeper's last commit (and, in a world
    after the first, the reset callbacks run); otherwise from rank 0. A lost worker
    (CollectiveError) puts the last commit back into the state and raises (module docstring)."""
    return run_fn(func, reset=None)


def _sync(state) -> None:
    keeper = commit_keeper.find()
    kept = keeper.load() if keeper is not None else None
    if kept is None:
        state.sync()
        if keeper is not None:  # the first world's start is a commit too
            keeper.save(state.committed() if state._rank() == 0 else None)
    else:
        state.load_committed(kept)  # every rank takes the same commit from the keeper
    if keeper is not None and keeper.resets:
        state.on_reset()


def run_fn(func, reset):
    """Horovod's run_fn: run() with the reset Horovod would call between worlds. Worlds here
    are new processes, so `reset` is kept for Horovod's signature and not called; the state's
    reset callbacks run in each world after the first."""
    del reset

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        _sync(state)
        try:
            with translate_errors():  # a traced step's failed collective, as eager code's
                return func(state, *args, **kwargs)
        except CollectiveError as e:
            state.restore()
            if commit_keeper.current() is not None:
                raise  # the driver restarts the world from the keeper's commit
            raise CollectiveError(
                f"{e}\nhvd.elastic without a restarting driver cannot re-form the world without "
                f"the lost worker: the state holds its last commit; save it, restart the job "
                f"and resume from it (or run under tftorus.ray.RayExecutor with min_workers)"
            ) from e

    return wrapper


__all__ = ["run", "HostsUpdatedInterrupt", "State", "ObjectState", "TensorFlowKerasState",
           "TensorFlowState"]
