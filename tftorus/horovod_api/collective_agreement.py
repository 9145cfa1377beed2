"""Before each of Horovod's collectives, its members agree on what they are about to do.

Horovod's coordinator compares every rank's request (op, dtype, shape, root rank, scale factors)
and fails every rank with a FailedPreconditionError where they differ. TF's collectives
compare nothing useful: a second collective under the same key with another shape or dtype
aborts the process' collective executor for good, and different sizes hang or mix. So each
call first gathers one small int64 row per member, the call's description, of the same shape
for every kind of call (a call of another kind at the same point is reported too, not
mismatched), and compares them. The rows also carry what the collective needs from every
member: allgather's first dimensions and alltoall's splits.

A member whose own arguments are wrong (splits that do not fit the tensor, say) still takes
part, with its error flag set, and raises InvalidArgumentError after the exchange; the others
raise FailedPreconditionError naming it. No member is left waiting in a collective the others
never start.

Errors: eagerly they are raised at once, with each member's description. In a traced function
they are ops the data collectives wait for: InvalidArgumentError from tf.debugging.Assert, and
FailedPreconditionError from reading a variable that does not exist, named by the message (TF
has no op that raises that error with a message of ours), after printing every member's row.
"""
import sys
import zlib
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tftorus.horovod_api import group_collectives

KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
         "grouped_allreduce", "grouped_allgather", "grouped_reducescatter")
OPS = {0: "Average", 1: "Sum", 2: "Adasum", 3: "Min", 4: "Max", 5: "Product", -1: "-"}
_DIMS = 8  # dimensions kept in full; more are in the digest
# column layout of a description row
KIND, DTYPE, NDIM, DIM0, OP, ROOT, ERROR, COUNT, DIGEST = 0, 1, 2, 3, 3 + _DIMS, 4 + _DIMS, \
    5 + _DIMS, 6 + _DIMS, 7 + _DIMS
HEAD = 8 + _DIMS  # then one column per member: alltoall's splits


def describe(kind: str, members: int, tensor: Optional[tf.Tensor] = None, op: int = -1,
             root: int = -1, count: int = 1, digest_of: str = "", splits=None,
             error=False) -> tf.Tensor:
    """This member's row: [kind, dtype, ndim, dims..., op, root, error, count, digest,
    splits...]. `tensor` gives dtype and shape (its dynamic first dimension in a traced
    function); `digest_of`, whatever else must agree (a group's shapes, scale factors);
    `error`, a bool (or bool tensor) this member's arguments are invalid."""
    head = np.full([HEAD], -1, np.int64)
    head[KIND] = KINDS.index(kind)
    head[OP], head[ROOT], head[COUNT] = op, root, count
    dims = []
    if tensor is not None:
        head[DTYPE] = tensor.dtype.as_datatype_enum
        shape = tensor.shape.as_list()
        head[NDIM] = len(shape)
        dims = [d if d is not None else -2 for d in shape]
        head[DIM0 + 1:DIM0 + _DIMS] = (dims[1:_DIMS] + [-1] * _DIMS)[:_DIMS - 1]
        digest_of = f"{digest_of}|{dims[_DIMS:]}"
    head[DIGEST] = zlib.crc32(digest_of.encode()) & 0x7FFFFFFF
    row = tf.constant(head)
    if tensor is not None and dims:
        first = tf.shape(tensor, out_type=tf.int64)[0]
        row = tf.tensor_scatter_nd_update(row, [[DIM0]], first[None])
        row = tf.tensor_scatter_nd_update(row, [[ERROR]], tf.cast(error, tf.int64)[None])
    else:
        row = tf.tensor_scatter_nd_update(row, [[ERROR]], tf.cast(error, tf.int64)[None])
    tail = (tf.zeros([members], tf.int64) if splits is None
            else tf.cast(tf.reshape(splits, [members]), tf.int64))
    return tf.concat([row, tail], 0)


def _text(row: np.ndarray, rank: int) -> str:
    kind = KINDS[row[KIND]] if 0 <= row[KIND] < len(KINDS) else "?"
    parts = [f"rank {rank}: {kind}"]
    if row[DTYPE] >= 0:
        dims = [int(row[DIM0])] + [int(d) for d in row[DIM0 + 1:DIM0 + _DIMS]]
        parts.append(f"{tf.dtypes.as_dtype(int(row[DTYPE])).name}{dims[:int(row[NDIM])]}")
    if row[OP] != -1:
        parts.append(f"op {OPS.get(int(row[OP]), row[OP])}")
    if row[ROOT] != -1:
        parts.append(f"root_rank {row[ROOT]}")
    if row[COUNT] != 1:
        parts.append(f"{row[COUNT]} tensors")
    return " ".join(parts)


def agree(comm, group, mine: tf.Tensor, what: str, ignore: Sequence[int] = (),
          own_error: Callable[[], str] = lambda: "invalid arguments",
          own_error_traced: str = "this rank's arguments are invalid"):
    """Gather every member's row (mine) and check them. Returns (table [members, row], deps):
    deps are the checks a traced function's data collectives must wait for (none eagerly, where
    a mismatch raises here). ignore: columns that may differ (allgather's first dimension,
    alltoall's splits). own_error: this member's error message when its row flags one (eagerly;
    own_error_traced in a traced function, where the values are not known when it is built)."""
    table = group_collectives.gather_rows(comm, mine, group)
    if len(group) == 1:
        return table, []
    columns = [c for c in range(int(mine.shape[0])) if c not in set(ignore) and c != ERROR]
    compared = tf.gather(table, columns, axis=1)
    same = tf.reduce_all(tf.equal(compared, compared[:1]))
    errors = table[:, ERROR]
    # from the gathered table, not from `mine`: a check that could fail before the gather
    # ends would cancel this member's part of it and leave the others waiting
    my_error = tf.not_equal(errors[list(group).index(comm.rank)], 0)
    peer_error = tf.reduce_any(tf.not_equal(errors, 0))
    ranks = list(group)
    if tf.executing_eagerly():
        if bool(my_error):
            raise tf.errors.InvalidArgumentError(None, None, f"{what}: {own_error()}")
        if bool(peer_error):
            bad = [ranks[i] for i in np.flatnonzero(errors.numpy())]
            raise tf.errors.FailedPreconditionError(
                None, None, f"{what}: rank(s) {bad} called it with invalid arguments (their own "
                            f"error says which); no rank ran it")
        if not bool(same):
            rows = table.numpy()
            raise tf.errors.FailedPreconditionError(
                None, None, f"{what}: the ranks' calls do not match, so none ran it. Every "
                            f"member of the process set must call the same collective with the "
                            f"same dtype, shape (allgather and alltoall: all but the first "
                            f"dimension), op, root_rank and scale factors at the same point. "
                            f"The calls: " + "; ".join(_text(r, k) for r, k in zip(rows, ranks)))
        return table, []
    # one error per member: its own arguments, else a peer's or the calls' mismatch
    others_ok = tf.logical_or(my_error, tf.logical_and(tf.logical_not(peer_error), same))
    checks = [tf.debugging.Assert(tf.logical_not(my_error), [f"{what}: {own_error_traced}"]),
              failed_precondition_unless(
                  others_ok, f"{what}: the ranks' calls do not match (dtype, shape, op, "
                             f"root_rank, scale factors or the collective itself) or a rank's "
                             f"arguments were invalid, so none ran it; the printed table has "
                             f"one row per member: kind, dtype, ndim, dims, op, root, error, "
                             f"count, digest, splits", [table])]
    return table, checks


def failed_precondition_unless(ok, message: str, show: Sequence[tf.Tensor] = ()):
    """An op that raises FailedPreconditionError (Horovod's error for ranks that disagree)
    unless `ok`, after printing `show` to stderr. Eagerly: raises at once."""
    if tf.executing_eagerly():
        if not bool(ok):
            raise tf.errors.FailedPreconditionError(None, None, message)
        return tf.no_op()

    def fail():
        printed = tf.print("tftorus:", message, *show, output_stream=sys.stderr,
                           summarize=-1)
        with tf.control_dependencies([printed]):
            # Reading a variable that was never made is TF's one FailedPreconditionError
            # whose message we choose: the variable's name.
            missing = tf.raw_ops.VarHandleOp(dtype=tf.int32, shape=[], container="tftorus",
                                             shared_name=f"tftorus: {message}")
            return tf.raw_ops.ReadVariableOp(resource=missing, dtype=tf.int32)
    return tf.cond(ok, lambda: tf.constant(0), fail)
