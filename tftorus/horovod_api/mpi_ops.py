"""Horovod 0.28.1's TensorFlow collectives on the tf engine (`hvd.mpi_ops` and the collectives of
`import tftorus as hvd` where Horovod is not installed): allreduce with every op but Adasum,
grouped_allreduce, allgather, grouped_allgather, broadcast, broadcast_, alltoall,
reducescatter, grouped_reducescatter, the *_op graph ops, over the whole world or a process
set (tftorus/horovod_api/process_sets.py), with Horovod's arguments, results, errors and gradients.

Every call works eagerly, inside tf.function and in a TF1 graph run by a tf.compat.v1.Session
(there it is one py_function that runs the call's collectives eagerly when the session runs
it: TFCollectiveCommunicator.as_one_call).

How a call runs: its arguments are checked where they are given (dtype, op, process set); its
members agree on the call (tftorus/horovod_api/collective_agreement.py: a mismatch is Horovod's
FailedPreconditionError on every member, never a hang); then the data moves
(tftorus/horovod_api/group_collectives.py), and a sum or average over the whole world goes over the
torus (tftorus/runtime/reduction.py's fused all-reduce, exact for integers). The gradients are
Horovod's: allreduce's is the same allreduce of the gradient, allgather's an average cut back to
this rank's rows, broadcast's an average kept on the root, alltoall's the reverse alltoall,
reducescatter's an allgather of the (scaled) gradient.

Scale factors as Horovod applies them: integers in float64 and truncated, 16-bit floats in
float32, others in their own dtype; an Average's division by the set's size joins the
postscale factor (integers: divided exactly, truncated toward zero).
"""
import collections
import re
import sys
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops

from tftorus.horovod_api import collective_agreement as agreement
from tftorus.horovod_api import group_collectives as moves
from tftorus.horovod_api import helpers, process_sets
from tftorus.horovod_api.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                              global_process_set, remove_process_set)
from tftorus.runtime import process_state, reduction, stack
from tftorus.runtime.stack import Adasum, Average, Max, Min, Product, Sum
from tftorus.torus.compression import Compression

# Autograph would convert this module's functions, and the closures each call makes, anew on
# every call inside a tf.function (measured: 15 s to trace a hundred calls, against 2.5 s);
# they branch on Python values only, so they run as they are.
_plain_python = tf.autograph.experimental.do_not_convert

#: What allreduce and reducescatter sum: Horovod's dtypes, and bfloat16, int16, uint16.
REDUCIBLE = (tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16,
             tf.bfloat16, tf.float32, tf.float64)
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}
_MERGE = {Sum: "sum", Average: "sum", Min: "min", Max: "max"}


# -- arguments ---------------------------------------------------------------------------------

def _comm():
    if not process_state.is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return process_state.communicator()


def _op(op, average):
    """Horovod's op from op= and the deprecated average= (default Average)."""
    op = helpers.handle_average_backwards_compatibility(op, average)
    if op not in _OP_NAMES:
        raise ValueError(f"op must be one of hvd.Average, hvd.Sum, hvd.Min, hvd.Max, "
                         f"hvd.Product; got {op!r}")
    return op


def _refuse_adasum(op) -> None:
    if op == Adasum:
        raise stack.horovod_required(
            "op=hvd.Adasum", "use op=hvd.Average (the torus all-reduce) or hvd.Sum")


def _scope(name: Optional[str], default: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name) if name else default


def _tensor(value, what: str, dtypes=moves.DTYPES) -> tf.Tensor:
    if isinstance(value, tf.IndexedSlices):
        raise TypeError(f"{what} takes a dense tensor; give an IndexedSlices' values and "
                        f"indices separately")
    tensor = tf.convert_to_tensor(value)
    if tensor.dtype not in dtypes:
        raise TypeError(f"{what} takes {sorted(d.name for d in dtypes)}; got "
                        f"{tensor.dtype.name}: cast the tensor to one of those")
    return tensor


def _static(tensor: tf.Tensor, what: str) -> None:
    """Shapes a traced function's collectives need; a TF1 graph's run eagerly (any shape)."""
    if not tensor.shape.is_fully_defined() and not in_session_graph():
        raise ValueError(f"{what} needs a shape known when the function is traced (the tf "
                         f"engine's keys depend on it), got {tensor.shape}: use tf.ensure_shape")


def _scale(tensor: tf.Tensor, factor: float) -> tf.Tensor:
    """Horovod's scaling: integers in float64 (truncated), 16-bit floats in float32."""
    if factor == 1.0:
        return tensor
    if tensor.dtype.is_integer:
        return tf.cast(tf.cast(tensor, tf.float64) * float(factor), tensor.dtype)
    if tensor.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tf.cast(tensor, tf.float32) * np.float32(factor), tensor.dtype)
    return tensor * tf.constant(factor, tensor.dtype)  # (tf.cast would round it to float32)


def _finish(tensor: tf.Tensor, postscale: float, divisor: int) -> tf.Tensor:
    """Postscale and an Average's division, as one factor (Horovod's); integers divided
    exactly when there is no postscale factor."""
    if tensor.dtype.is_integer and postscale == 1.0:
        return tensor if divisor == 1 else tf.truncatediv(tensor, tf.cast(divisor, tensor.dtype))
    return _scale(tensor, postscale / divisor)


def in_session_graph() -> bool:
    """Whether ops built here go into a TF1 graph that a tf.compat.v1.Session runs (where
    tf.init_scope() lifts to that graph, not to eager execution): there the tf engine runs a
    call's collectives from a py_function (TFCollectiveCommunicator.as_one_call)."""
    with ops.init_scope():
        return not tf.executing_eagerly()


# -- one call ----------------------------------------------------------------------------------

def _one_call(comm, what: str, impl, inputs: Sequence[tf.Tensor],
              outputs: Sequence[tf.TensorSpec]) -> List[tf.Tensor]:
    """impl(inputs) -> outputs. In a TF1 graph, one py_function (comm.as_one_call), across
    which Horovod's errors keep their type: a py_function turns ValueError into
    InvalidArgumentError, and a FailedPreconditionError comes back as a flag that an op of the
    graph raises (after each rank printed why)."""
    if not in_session_graph():
        return impl(list(inputs))

    def guarded(values):
        try:
            return [tf.constant(False)] + list(impl(values))
        except tf.errors.FailedPreconditionError as e:
            print(f"[rank {comm.rank}] {e.message}", file=sys.stderr, flush=True)
            return [tf.constant(True)] + [
                tf.zeros([d or 0 for d in s.shape.as_list()] if s.shape.rank is not None
                         else [0], s.dtype) for s in outputs]
        except tf.errors.InvalidArgumentError as e:
            raise ValueError(e.message) from None

    results = comm.as_one_call(guarded, list(inputs),
                               [tf.TensorSpec([], tf.bool)] + list(outputs))
    check = agreement.failed_precondition_unless(
        tf.logical_not(results[0]), f"{what}: the ranks' calls do not match, or a rank's "
                                    f"arguments were invalid, so none ran it; each rank "
                                    f"printed its reason")
    with tf.control_dependencies([check]):
        return [tf.identity(r) for r in results[1:]]


def _differentiable(forward, backward, inputs: Sequence[tf.Tensor]):
    """forward(inputs) -> outputs, whose gradient is backward(output gradients) -> input
    gradients (Horovod's registered gradients), for floating inputs."""
    if not any(t.dtype.is_floating for t in inputs):
        return forward(list(inputs))

    @tf.custom_gradient
    def run(*xs):
        ys = forward(list(xs))

        def grad(*dys, variables=None):
            dys = [tf.zeros_like(y) if d is None and y.dtype.is_floating else d
                   for d, y in zip(dys, ys)]
            dxs = backward(dys)
            dxs = [dx if x.dtype.is_floating else None for dx, x in zip(dxs, xs)]
            return (dxs, [None] * len(variables)) if variables else dxs
        return ys, grad
    return run(*inputs)


# -- allreduce ---------------------------------------------------------------------------------

@_plain_python
def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Horovod's allreduce: `tensor` reduced over the process set with op (Average by default,
    Sum, Min, Max, Product), scaled before and after. An IndexedSlices is gathered (values and
    indices), as Horovod does. Over the whole world a Sum or Average goes over the torus."""
    del device_dense, device_sparse, ignore_name_scope
    op = _op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse([tensor], op, prescale_factor, postscale_factor, process_set, name)[0]
    _refuse_adasum(op)
    return _reduce([tensor], op, compression, prescale_factor, postscale_factor, process_set,
                   name, "allreduce")[0]


@_plain_python
def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Horovod's grouped_allreduce: every tensor of the list reduced as allreduce does, in one
    fused call (IndexedSlices gathered)."""
    del device_dense, device_sparse, ignore_name_scope
    if not tensors:
        return tensors
    op = _op(op, average)
    tensors = list(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i in range(len(tensors)) if i not in sparse]
    out = [None] * len(tensors)
    if sparse:
        for i, t in zip(sparse, _sparse([tensors[i] for i in sparse], op, prescale_factor,
                                        postscale_factor, process_set, name)):
            out[i] = t
    if dense:
        _refuse_adasum(op)
        for i, t in zip(dense, _reduce([tensors[i] for i in dense], op, compression,
                                       prescale_factor, postscale_factor, process_set, name,
                                       "grouped_allreduce")):
            out[i] = t
    return out


def _sparse(slices, op, prescale_factor, postscale_factor, process_set, name):
    """IndexedSlices: their values and indices gathered (Horovod's sparse allreduce)."""
    if op == Adasum:
        raise NotImplementedError("The Adasum reduction does not currently support sparse "
                                  "tensors. As a workaround please pass sparse_as_dense=True "
                                  "to DistributedOptimizer")
    if op not in (Sum, Average):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
    values = grouped_allgather([s.values for s in slices], name=name, process_set=process_set)
    indices = grouped_allgather([s.indices for s in slices], name=name, process_set=process_set)
    size = len(process_sets.group_of(process_set))
    return [tf.IndexedSlices(v / tf.cast(size, v.dtype) if op == Average else v, i,
                             dense_shape=s.dense_shape)
            for v, i, s in zip(values, indices, slices)]


def _reduce(tensors, op, compression, prescale, postscale, process_set, name, kind):
    """Dense tensors reduced with Horovod's op: one agreement, one fused reduction."""
    comm = _comm()
    group = process_sets.group_of(process_set)
    what = f"hvd.{kind}"
    tensors = [_tensor(t, what, REDUCIBLE) for t in tensors]
    for t in tensors:
        _static(t, what)
    reduction.check_compression(compression)
    scales = f"{prescale}|{postscale}|{getattr(compression, '__name__', compression)}"

    def impl(values):
        with tf.name_scope(_scope(name, f"Horovod{kind.title().replace('_', '')}")):
            digest = scales + ("|" + ";".join(f"{v.dtype.name}{v.shape}" for v in values)
                               if len(values) > 1 else "")
            mine = agreement.describe(kind, len(group), values[0] if len(values) == 1 else None,
                                      op=op, count=len(values), digest_of=digest)
            _, checks = agreement.agree(comm, group, mine, what)
            with tf.control_dependencies(checks):
                return _reduce_values(comm, group, values, op, compression, prescale,
                                      postscale)

    def forward(values):
        return _one_call(comm, what, impl, values,
                         [tf.TensorSpec(t.shape, t.dtype) for t in values])

    def backward(grads):  # Horovod's: the same reduction of the gradients
        return _reduce(grads, op, Compression.none, prescale, postscale, process_set, None,
                       "grouped_allreduce" if len(grads) > 1 else "allreduce")
    return _differentiable(forward, backward, tensors)


def _reduce_values(comm, group, values, op, compression, prescale, postscale):
    wires, ctxs = [], []
    for v in values:
        wire, ctx = compression.compress(v)
        wires.append(_scale(wire, prescale))
        ctxs.append(ctx)
    if op == Product:
        reduced = _product(comm, group, wires)
    elif op in (Sum, Average) and group == comm.all_ranks():
        # the torus, exact for integers; the narrow ones in int32 (a cast back wraps as
        # Horovod's narrow sum does)
        wide = [tf.cast(w, tf.int32) if w.dtype.size < 4 and w.dtype.is_integer else w
                for w in wires]
        reduced = [tf.cast(s, w.dtype) for s, w in zip(_torus_sum(comm, wide), wires)]
    else:
        reduced = _per_dtype(wires, lambda same: moves.reduce(comm, same, group, _MERGE[op]))
    divisor = len(group) if op == Average else 1
    return [_finish(compression.decompress(r, ctx), postscale, divisor)
            for r, ctx in zip(reduced, ctxs)]


_TORUS_FUNCTIONS = collections.OrderedDict()  # eager calls' traced torus sums, newest last
_TORUS_FUNCTIONS_KEPT = 64


def _torus_sum(comm, tensors):
    """The torus' sum over the world (tftorus.runtime.reduction). Eagerly it runs as a tf.function
    traced once per world, shapes and dtypes: eager collectives would carry TF's per-op
    timeout, which holds two threads asleep for its whole length per collective
    (group_collectives' docstring), where a traced one carries none."""
    def run(*values):
        return reduction.fused_allreduce(list(values), "sum", algorithm="auto",
                                         check_consistency=False, comm=comm)
    if not tf.executing_eagerly():
        return run(*tensors)
    # inside a TF1 session's call its keys carry the call's salt: one function per salt
    salt = comm.session_salt() if hasattr(comm, "session_salt") else ()
    key = (process_state.generation(), salt, tuple((t.dtype, tuple(t.shape)) for t in tensors))
    if key not in _TORUS_FUNCTIONS:
        _TORUS_FUNCTIONS[key] = tf.function(run, autograph=False)
        while len(_TORUS_FUNCTIONS) > _TORUS_FUNCTIONS_KEPT:
            _TORUS_FUNCTIONS.popitem(last=False)
    _TORUS_FUNCTIONS.move_to_end(key)
    # the gradient is the caller's (tf.custom_gradient): a tape must not try to differentiate
    # the function's collectives, which have none
    return _TORUS_FUNCTIONS[key](*[tf.stop_gradient(t) for t in tensors])


def _per_dtype(tensors, run) -> List[tf.Tensor]:
    """run(tensors of one dtype) -> results, once per dtype; results in the tensors' order."""
    out = [None] * len(tensors)
    by_dtype = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for indices in by_dtype.values():
        for i, r in zip(indices, run([tensors[i] for i in indices])):
            out[i] = r
    return out


def _product(comm, group, tensors):
    """Every member's tensors gathered, multiplied in rank order in their own dtype."""
    def run(same):
        flat = tf.concat([tf.reshape(t, [-1]) for t in same], 0)
        product = tf.reduce_prod(moves.gather_rows(comm, flat, group), axis=0)
        sizes = [t.shape.num_elements() for t in same]
        return [tf.reshape(p, t.shape) for p, t in zip(tf.split(product, sizes), same)]
    return _per_dtype(tensors, run)


# -- allgather ---------------------------------------------------------------------------------

@_plain_python
def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Horovod's allgather: every member's tensor concatenated along the first dimension in
    rank order; the first dimensions may differ, the others may not."""
    del ignore_name_scope
    return _gather([tensor], name, process_set, "allgather")[0]


@_plain_python
def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """Horovod's grouped_allgather: allgather of each tensor of the list, in one call."""
    del ignore_name_scope
    if not tensors:
        return tensors
    return _gather(list(tensors), name, process_set, "grouped_allgather")


def _gather(tensors, name, process_set, kind):
    comm = _comm()
    group = process_sets.group_of(process_set)
    what = f"hvd.{kind}"
    tensors = [_tensor(t, what) for t in tensors]
    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError(f"{what} needs tensors of rank >= 1 (Horovod's rule): reshape a "
                             f"scalar to [1]")
        moves._rest(t, what)
    n, single = len(group), len(tensors) == 1

    def impl(values):
        with tf.name_scope(_scope(name, f"Horovod{kind.title().replace('_', '')}")):
            mine = agreement.describe(
                kind, n, values[0] if single else None, count=len(values),
                digest_of=";".join(f"{v.dtype.name}{v.shape[1:]}" for v in values))
            table, checks = agreement.agree(comm, group, mine, what, ignore=[agreement.DIM0])
            with tf.control_dependencies(checks):
                if single:
                    rows = table[:, agreement.DIM0:agreement.DIM0 + 1]
                else:  # a second exchange: every tensor's first dimension
                    firsts = tf.stack([tf.shape(v, out_type=tf.int64)[0] for v in values])
                    rows = moves.gather_rows(comm, firsts, group)
                gathered = moves.gather_varying(comm, values, rows, group)
            return gathered + [tf.cast(rows, tf.int32)]

    def forward(values):
        return _one_call(comm, what, impl, values,
                         [tf.TensorSpec([None] + v.shape.as_list()[1:], v.dtype)
                          for v in values] + [tf.TensorSpec([n, len(values)], tf.int32)])

    me = group.index(comm.rank)

    def backward(grads):  # Horovod's: averaged, then this member's rows
        grads, rows = grads[:-1], outputs[-1]
        out = []
        for k, g in enumerate(grads):
            g = allreduce(g, op=Average, process_set=process_set)
            out.append(tf.split(g, rows[:, k], num=n)[me])
        return out
    outputs = _differentiable(lambda values: forward(values), lambda dys: backward(dys),
                              tensors)
    return list(outputs[:-1])


# -- broadcast ---------------------------------------------------------------------------------

@_plain_python
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """Horovod's broadcast: global rank root_rank's tensor on every member, bit for bit."""
    del ignore_name_scope
    return _broadcast([tensor], root_rank, name, process_set)[0]


def _broadcast(tensors, root_rank, name, process_set):
    comm = _comm()
    group = process_sets.group_of(process_set)
    what = "hvd.broadcast"
    tensors = [_tensor(t, what) for t in tensors]
    for t in tensors:
        _static(t, what)
    root = int(root_rank)
    n, single = len(group), len(tensors) == 1

    def impl(values):
        with tf.name_scope(_scope(name, "HorovodBroadcast")):
            mine = agreement.describe(
                "broadcast", n, values[0] if single else None, root=root, count=len(values),
                digest_of=";".join(f"{v.dtype.name}{v.shape}" for v in values),
                error=root not in group)
            root_error = f"root_rank {root} is not a member of the process set {list(group)}"
            _, checks = agreement.agree(comm, group, mine, what, own_error=lambda: root_error,
                                        own_error_traced=root_error)
            with tf.control_dependencies(checks):
                return _per_dtype(values, lambda same: moves.broadcast(comm, same, root, group))

    def forward(values):
        return _one_call(comm, what, impl, values,
                         [tf.TensorSpec(v.shape, v.dtype) for v in values])

    def backward(grads):  # Horovod's: averaged, kept on the root only
        grads = _reduce(grads, Average, Compression.none, 1.0, 1.0, process_set, None,
                        "grouped_allreduce" if len(grads) > 1 else "allreduce")
        return [g if comm.rank == root else g * 0 for g in grads]
    return _differentiable(forward, backward, tensors)


@_plain_python
def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Horovod's in-place broadcast: root_rank's values assigned to `variables` on every
    member (one collective per dtype); returns their new values."""
    variables = list(variables)
    if not variables:
        return []
    values = _broadcast([tf.convert_to_tensor(v) for v in variables], root_rank, name,
                        process_set)
    assigns = [v.assign(x) for v, x in zip(variables, values)]
    if tf.executing_eagerly():
        return [tf.convert_to_tensor(v) for v in variables]
    with tf.control_dependencies(assigns):
        return [tf.identity(x) for x in values]


@_plain_python
def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Horovod's broadcast_variables: assign root_rank's values to `variables` on every member
    (eagerly now; in a graph, the returned op does)."""
    del inplace  # assigned in place either way
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    values = broadcast_(variables, root_rank, process_set=process_set)
    return None if tf.executing_eagerly() else tf.group(*values)


@_plain_python
def broadcast_global_variables(root_rank):
    """Horovod's, for TF1 graphs: an op assigning root_rank's values to every global variable
    (tf.compat.v1.global_variables()). Eagerly there are none, as in Horovod: use
    broadcast_variables(model.variables, root_rank)."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. "
                           "Please use `hvd.broadcast_variables(<model/optimizer variables>)` "
                           "instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


# -- alltoall ----------------------------------------------------------------------------------

@_plain_python
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Horovod's alltoall: splits[j] rows (in order, along the first dimension) go to the
    set's j-th member; without splits the first dimension is cut into equal parts. Returns
    what this member received from each member, concatenated in rank order, and, when splits
    were given, the numbers of rows received (int32, one per member)."""
    del ignore_name_scope
    comm = _comm()
    group = process_sets.group_of(process_set)
    what = "hvd.alltoall"
    tensor = _tensor(tensor, what)
    if tensor.shape.rank == 0:
        raise ValueError(f"{what} needs a tensor of rank >= 1: reshape a scalar to [1]")
    moves._rest(tensor, what)
    n = len(group)
    given = splits is not None
    if given:
        splits = tf.convert_to_tensor(splits)
        if not splits.dtype.is_integer:
            raise tf.errors.InvalidArgumentError(
                None, None, f"alltoall expects splits to contain integers, got "
                            f"{splits.dtype.name}")
        if splits.shape.rank is not None and splits.shape.rank > 1:
            raise tf.errors.InvalidArgumentError(None, None, "alltoall expects a 1D splits "
                                                             "tensor")
        if splits.shape.num_elements() not in (None, n):
            raise tf.errors.InvalidArgumentError(
                None, None, f"Number of entries in splits ({splits.shape.num_elements()}) "
                            f"does not equal number of workers ({n}).")
        splits = tf.cast(tf.reshape(splits, [n]), tf.int64)
    else:
        splits = tf.zeros([n], tf.int64)  # stands in until the tensor's first dimension is known

    def impl(values):
        value, split = values
        with tf.name_scope(_scope(name, "HorovodAlltoall")):
            first = tf.shape(value, out_type=tf.int64)[0]
            if given:
                error = tf.logical_or(tf.reduce_any(split < 0), tf.reduce_sum(split) > first)
            else:
                error = tf.not_equal(first % n, 0)
                split = tf.fill([n], first // n)
            split = tf.where(error, tf.zeros_like(split), split)

            def own_error():
                if given:
                    return (f"Sum of splits entries is greater than the first dimension of "
                            f"tensor, or an entry is negative: splits {values[1].numpy()}, "
                            f"first dimension {int(first)}")
                return (f"splits not provided, but first dimension of tensor ({int(first)}) "
                        f"is not an even multiple of the number of workers ({n})")
            mine = agreement.describe("alltoall", n, value, splits=split, error=error)
            table, checks = agreement.agree(
                comm, group, mine, what, own_error=own_error, own_error_traced=(
                    "splits do not fit the tensor (an entry is negative, or they sum to more "
                    "than its first dimension), or, without splits, its first dimension is not "
                    "a multiple of the process set's size"),
                ignore=[agreement.DIM0] + list(range(agreement.HEAD, agreement.HEAD + n)))
            with tf.control_dependencies(checks):
                sends = table[:, agreement.HEAD:]
                out = moves.all_to_all(comm, value, sends, group)
            return [out, tf.cast(sends[:, group.index(comm.rank)], tf.int32)]

    def forward(values):
        return _one_call(comm, what, impl, values + [splits],
                         [tf.TensorSpec([None] + tensor.shape.as_list()[1:], tensor.dtype),
                          tf.TensorSpec([n], tf.int32)])

    def backward(grads):  # Horovod's: the gradient sent back where its rows came from
        return [alltoall(grads[0], splits=outputs[1], process_set=process_set)[0]]
    outputs = _differentiable(lambda values: forward(values), lambda dys: backward(dys),
                              [tensor])
    return (outputs[0], outputs[1]) if given else outputs[0]


# -- reducescatter -----------------------------------------------------------------------------

@_plain_python
def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average,
                  name=None, process_set=global_process_set, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Horovod's reducescatter: `tensor` summed (or averaged) over the set, and member j keeps
    its part of the first dimension: dimension // members rows, one more for the first
    dimension % members members."""
    del device_dense, ignore_name_scope
    return _reduce_scatter([tensor], op, compression, prescale_factor, postscale_factor,
                           process_set, name, "reducescatter")[0]


@_plain_python
def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Horovod's grouped_reducescatter: reducescatter of each tensor, one collective per
    dtype."""
    del device_dense
    if not tensors:
        return tensors
    return _reduce_scatter(list(tensors), op, compression, prescale_factor, postscale_factor,
                           process_set, None, "grouped_reducescatter")


def _shares(first: int, n: int) -> List[int]:
    """Horovod's uneven split: the first (first % n) members get one row more."""
    base, extra = divmod(first, n)
    return [base + (1 if j < extra else 0) for j in range(n)]


def _reduce_scatter(tensors, op, compression, prescale, postscale, process_set, name, kind):
    comm = _comm()
    group = process_sets.group_of(process_set)
    what = f"hvd.{kind}"
    if op not in (Sum, Average):
        raise ValueError(f"{what} takes op=hvd.Sum or hvd.Average; got "
                         f"{_OP_NAMES.get(op, op)}")
    reduction.check_compression(compression)
    tensors = [_tensor(t, what, REDUCIBLE) for t in tensors]
    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError(f"{what} needs tensors of rank >= 1 (it splits the first "
                             f"dimension): reshape a scalar to [1]")
        _static(t, what)
    n, me = len(group), group.index(comm.rank)
    scales = f"{prescale}|{postscale}|{getattr(compression, '__name__', compression)}|"

    def impl(values):
        with tf.name_scope(_scope(name, f"Horovod{kind.title().replace('_', '')}")):
            digest = scales + ";".join(f"{v.dtype.name}{v.shape}" for v in values)
            mine = agreement.describe(kind, n, values[0] if len(values) == 1 else None, op=op,
                                      count=len(values), digest_of=digest)
            _, checks = agreement.agree(comm, group, mine, what)
            with tf.control_dependencies(checks):
                wires, ctxs = [], []
                for v in values:
                    wire, ctx = compression.compress(v)
                    wires.append(_scale(wire, prescale))
                    ctxs.append(ctx)
                mine = _per_dtype(wires, lambda same: _scatter_one_dtype(comm, group, same))
            return [_finish(compression.decompress(m, ctx), postscale,
                            n if op == Average else 1) for m, ctx in zip(mine, ctxs)]

    def share(first):
        return None if first is None else _shares(first, n)[me]

    def forward(values):
        return _one_call(comm, what, impl, values,
                         [tf.TensorSpec([share(t.shape[0])] + t.shape.as_list()[1:], t.dtype)
                          for t in values])

    def backward(grads):  # Horovod's: scaled as the forward sum was, then gathered
        factor = (n if op == Sum else 1) * prescale * postscale
        return [allgather(g if factor == 1 else g * tf.constant(factor, g.dtype),
                          process_set=process_set) for g in grads]
    return _differentiable(forward, backward, tensors)


def _scatter_one_dtype(comm, group, tensors):
    """Each tensor's rows cut into the members' shares, padded to the largest share, all
    tensors side by side: one reduce-scatter, then each member's own share cut out."""
    n, me = len(group), group.index(comm.rank)
    blocks, layout = [], []
    for t in tensors:
        shares = _shares(int(t.shape[0]), n)
        capacity = max(shares)
        rest = t.shape.as_list()[1:]
        pieces = tf.split(t, shares) if n > 1 else [t]
        padded = [tf.pad(p, [[0, capacity - s]] + [[0, 0]] * len(rest))
                  for p, s in zip(pieces, shares)]
        blocks.append(tf.reshape(tf.stack(padded), [n, -1]))
        layout.append((capacity, rest, shares[me]))
    widths = [int(b.shape[1]) for b in blocks]
    summed = moves.reduce_scatter(comm, tf.concat(blocks, 1), group)
    out = []
    for part, (capacity, rest, share) in zip(tf.split(summed, widths), layout):
        out.append(tf.reshape(part, [capacity] + rest)[:share])
    return out


# -- graph ops for the queries -----------------------------------------------------------------

@_plain_python
def rank_op(name=None):
    """This process' rank as an int32 scalar tensor."""
    return tf.constant(_comm().rank, tf.int32, name=name)


@_plain_python
def local_rank_op(name=None):
    from tftorus.cluster import tf_runtime
    _comm()
    return tf.constant(tf_runtime.current().local_rank, tf.int32, name=name)


@_plain_python
def size_op(process_set_id=0, name=None):
    """The number of ranks in the process set with this id (0: the world), int32 scalar."""
    _comm()
    return tf.constant(process_sets.by_id(process_set_id).size(), tf.int32, name=name)


@_plain_python
def local_size_op(name=None):
    return tf.constant(_comm().local_size, tf.int32, name=name)


#: Horovod's codes for process_set_included_op
PROCESS_SET_ERROR_INIT, PROCESS_SET_ERROR_UNKNOWN_SET = -1, -3


@_plain_python
def process_set_included_op(process_set_id=0, name=None):
    """1 if this process is in the process set with this id, 0 if not, or Horovod's error code
    (-1: not initialized, -3: no such set), as an int32 scalar."""
    if not process_state.is_initialized():
        return tf.constant(PROCESS_SET_ERROR_INIT, tf.int32, name=name)
    try:
        included = process_sets.by_id(process_set_id).included()
    except ValueError:
        return tf.constant(PROCESS_SET_ERROR_UNKNOWN_SET, tf.int32, name=name)
    return tf.constant(int(bool(included)), tf.int32, name=name)
