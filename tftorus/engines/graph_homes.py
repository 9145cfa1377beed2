"""TF1 graphs: where `tf.init_scope()` lifts to, and how the tf engine's calls run in a session.

Code builds collectives in one of two homes. Eager code and every tf.function called from it
share eager execution: init_scope lifts their variables out to eager, TF's runtime knows the
cluster, and the tf engine's ordering tokens and the step's clocks are made there once. A TF1
graph (`with tf.Graph().as_default():` with a tf.compat.v1.Session, tf.test's `test_session`,
and tf.functions called inside it) is a home of its own, and nothing crosses between the two:
a variable made under init_scope in a TF1 graph fails anywhere else ("... is out of scope and
cannot be used here"), an eager one fails inside the graph ("Attempting to capture an
EagerTensor without building a function"), and a session without a target runs on this
process' devices only, with a collective executor that reaches no peer.

So where `lifted_graph()` names a TF1 graph, the tf engine makes each call (a whole reduction,
or one primitive) one py_function (`SessionCalls`) that runs its collectives eagerly, on the
cluster's runtime, when the session runs it; the step's clocks are off there (gradient_readiness.py)
and an elastic world's generation is read from Python (process_state.world_guard). Nothing made for
a TF1 graph is kept beyond it: what must be found again per graph is kept as plain values in a
WeakKeyDictionary keyed by the graph (a tensor or variable there would keep its graph alive).

A py_function holds one of the session's inter-op threads (as many as cores) until every rank
has joined its collectives. Calls a run starts in a different order on different ranks could
then hold every thread of each rank while waiting for calls the other rank has no thread left
to start (Horovod's own tests build a call, run every call so far, build the next, ...). So a
graph's calls run in the order they were built, on every rank alike: each one carries a control
dependency on the one built before it that needs the same feeds (the same placeholders among its
inputs' ancestors). A run of a call therefore runs the earlier calls of its feeds again (they
compute the same values; nothing is applied twice unless a call's own inputs assign), and never
asks for a feed the call itself does not need. Calls of different feeds are not ordered against
each other: a run of more such chains than the session has threads may wait until the
collective timeout (fuse them into one call, or run them apart).
"""
import weakref
from typing import Callable, List, Optional, Sequence

import tensorflow as tf
from tensorflow.python.framework import ops


def lifted_graph() -> Optional[tf.Graph]:
    """The TF1 graph `tf.init_scope()` lifts to from here, or None where it lifts to eager
    execution (eager code, and tf.functions called from it)."""
    with ops.init_scope():
        return None if tf.executing_eagerly() else ops.get_default_graph()


class SessionCalls:
    """The calls built in TF1 graphs: each one's number in its graph (every rank that builds
    the same graph numbers them alike), and the last one per set of feeds, which the next one
    follows. The number salts the call's instance keys, so no two calls share one: with keys
    shared along a chain of calls, as eager code shares them, Horovod's suite made TF abort
    the process (SIGABRT in test_horovod_allgather_variable_size_cpu, in graph mode)."""

    def __init__(self):
        self._graphs = weakref.WeakKeyDictionary()  # graph -> _Calls

    def call(self, graph: tf.Graph, fn: Callable[[int, List[tf.Tensor]], List[tf.Tensor]],
             tensors: Sequence[tf.Tensor], outputs: Sequence[tf.TensorSpec]) -> List[tf.Tensor]:
        """`fn(number, eager tensors)` as one py_function of `graph`, giving tensors like
        `outputs`; `number` is the call's number in the graph."""
        calls = self._graphs.setdefault(graph, _Calls())
        number, calls.count = calls.count, calls.count + 1
        here = ops.get_default_graph() is graph  # not in a tf.function (ordered there already)
        feeds = _feeds(tensors) if here else None
        after = calls.last.get(feeds) if here else None
        with tf.control_dependencies([graph.get_operation_by_name(after)] if after else []):
            results = tf.py_function(lambda *values: fn(number, list(values)), list(tensors),
                                     [o.dtype for o in outputs])
        for result, spec in zip(results, outputs):
            result.set_shape(spec.shape)
        if here:
            calls.last[feeds] = results[0].op.name
        return results


class _Calls:
    """One graph's calls: how many so far, and per set of feeds the op name of the last one
    built in the graph itself (a name: an op would keep the graph alive)."""

    def __init__(self):
        self.count = 0
        self.last = {}


def _feeds(tensors: Sequence[tf.Tensor]) -> frozenset:
    """The names of the placeholders among the ancestors of `tensors`: what a run of them must
    be fed."""
    found, seen, pending = set(), set(), [t.op for t in tensors]
    while pending:
        op = pending.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type == "Placeholder":
            found.add(op.name)
        pending.extend(t.op for t in op.inputs)
        pending.extend(op.control_inputs)
    return frozenset(found)
