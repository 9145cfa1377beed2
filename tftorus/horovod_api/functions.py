"""Horovod's object collectives on the tf engine (`hvd.functions`): broadcast_object,
broadcast_object_fn, allgather_object, over the world or a process set.

They return Python objects, so they run now, eagerly, wherever they are called: in eager code,
and in a TF1 graph too (there Horovod runs its ops with the session it is given, or the
default one; here no session is needed and `session` is accepted and unused). Inside a
tf.function they cannot return an object and say so.

An object travels pickled (cloudpickle where installed, as Horovod's, so lambdas travel too),
its bytes packed four to an int32 (TF's CPU collectives move no 8-bit type): first its length,
then the bytes.
"""
import contextlib

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context as eager_context

from tftorus.horovod_api import mpi_ops, process_sets

try:
    import cloudpickle as _pickle
except ImportError:  # both stacks install it (pyproject.toml); plain pickle moves no lambda
    import pickle as _pickle

global_process_set = process_sets.global_process_set


@contextlib.contextmanager
def _now(what: str):
    """Run the collectives eagerly, now: in eager code as they are; in a TF1 graph by leaving
    it for eager execution; inside a tf.function, refuse."""
    if tf.executing_eagerly():
        yield
        return
    if not mpi_ops.in_session_graph():
        raise RuntimeError(f"hvd.{what} returns a Python object, which a tf.function cannot: "
                           f"call it outside the function (before tracing it)")
    with eager_context.eager_mode():
        yield


def _to_words(obj) -> np.ndarray:
    data = _pickle.dumps(obj)
    padded = data + b"\0" * (-len(data) % 4)
    return np.frombuffer(padded, np.int32), len(data)


def _from_words(words: np.ndarray, length: int):
    return _pickle.loads(np.ascontiguousarray(words, np.int32).tobytes()[:length])


def broadcast_object(obj, root_rank=0, session=None, name=None,
                     process_set=global_process_set):
    """root_rank's picklable object on every member of the process set."""
    del session
    scope = name or type(obj).__name__
    with _now("broadcast_object"):
        comm = mpi_ops._comm()
        process_sets.group_of(process_set)
        if comm.rank == root_rank:
            words, length = _to_words(obj)
        else:
            words, length = None, 0
        length = int(mpi_ops.broadcast(
            tf.constant([length], tf.int64), root_rank, name=f"{scope}.sz",
            process_set=process_set).numpy()[0])
        payload = words if words is not None else np.zeros([-(-length // 4)], np.int32)
        got = mpi_ops.broadcast(tf.constant(payload), root_rank, name=f"{scope}.t",
                                            process_set=process_set).numpy()
    return obj if comm.rank == root_rank else _from_words(got, length)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function obj -> root_rank's object (Horovod's, for TF1 graphs: there it builds its
    ops once; here each call runs its collectives now)."""
    del session

    def broadcast(obj):
        return broadcast_object(obj, root_rank, name=name or "broadcast_object_fn",
                                process_set=process_set)
    return broadcast


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Every member's picklable object, as a list in rank order."""
    del session
    scope = name or type(obj).__name__
    with _now("allgather_object"):
        words, length = _to_words(obj)
        lengths = mpi_ops.allgather(
            tf.constant([length], tf.int64), name=f"{scope}.sz",
            process_set=process_set).numpy()
        flat = mpi_ops.allgather(tf.constant(words), name=f"{scope}.t",
                                             process_set=process_set).numpy()
    out, start = [], 0
    for n in lengths:
        count = -(-int(n) // 4)
        out.append(_from_words(flat[start:start + count], int(n)))
        start += count
    return out
