"""Communicator on TensorFlow's own collective ops (CollectiveReduceV2, GatherV2, AllToAllV2).

No Horovod: the cluster comes from `tftorus.cluster.tf_runtime.bootstrap()`, and every collective
runs on this task's device with a group key, an instance key, an ordering token and a timeout.

Keys. TF identifies a collective by (group key, instance key). The *group key* says which
tasks take part; ours is a hash of the sorted rank tuple, so every member derives it alone, and
clashes among the groups the engine is told about are resolved in one canonical order that every
process walks identically. The *instance key* names one collective within a group. Measured on TF
2.15 (CPU, gRPC): a key may be used again and again for the same collective (same op, merge op,
dtype and shape), in later steps, eager calls and retraced functions, with no mixing of data even
when ranks are a whole collective apart (300 back-to-back rounds). Reusing a key with another
shape, dtype or op aborts the process' collective executor ("Shape mismatch in the collective
instance", "expected type 0 and data_type 1"). Keys are scoped per group key. A key's first use
costs one round trip to the leader (task 0) to resolve it, so a fresh key per call (what
tf.distribute does) measured ~3.5x slower per small all-reduce than a reused one. Ours is therefore
a hash of (primitive, merge op, dtype, shape, n-th such collective in this trace) within the
group: identical on every process, unchanged by retracing (the count restarts with each trace),
and different for every different signature. A hash clash in one process is resolved by probing.

Order. TF ranks the members of a group by the *string* order of their device names, so at 11+
tasks ".../task:10/..." comes before ".../task:2/..." (measured: a world all-gather at N = 12
returns ranks 0, 1, 10, 11, 2, ..., 9). The engine permutes chunks so all-gather output and
reduce-scatter shards are in ascending-rank group order, exactly as on the Horovod engine.

Ordering tokens: one resource variable per group; TF's automatic control dependencies then run a
group's collectives in program order on every member (tf.distribute does the same), so two
members never wait for each other's different collective.

TF1 graphs (`with tf.Graph().as_default():` and a tf.compat.v1.Session): such a session runs on
this process' devices alone, with a collective executor that reaches no peer, and objects made
for a TF1 graph are unusable anywhere else (tftorus/engines/graph_homes.py). There each call (a
whole reduction, or one primitive) becomes one py_function that runs its collectives eagerly on the
cluster's runtime when the session runs it (`as_one_call`).

Reduce-scatter: CollectiveReduceScatterV2 has only a NCCL (GPU) implementation in TF 2.15 (on a
CPU: "CollectiveRegistry::Lookup did not find collective implementation undef"). On CPUs the
row phase is an all-to-all plus a local FP32 sum: the same bytes as a reduce-scatter, never an
all-reduce plus a slice (N times the bytes out of the row). On GPUs the native op is used
(untested here: this machine has no GPU).

16-bit sums: TF's CPU ring sums FP16/BF16 in 16 bits at each hop (measured: 2048 + 1 + 1 + 1 in
FP16 gives 2048, and 256 + 1 + 1 + 1 in BF16 gives 256), so a 16-bit sum runs as reduce-scatter
(FP32 sum) + all-gather, like the Horovod engine's.

Message size: TF's CPU all-to-all and all-gather send each member's block as one message, and
their cost grows faster than the bytes (measured at N = 4, 2 x 2 torus: ResNet-50's gradients as
one 97.6 MiB buffer took 829 ms, as 16-32 MiB buffers 482-510 ms). Blocks above
`max_message_bytes` (TFTORUS_TF_MAX_MESSAGE_MB, default 16 MiB) are therefore split into equal
pieces, one collective each, and put back in place: the result's layout never changes. The ring
all-reduce (CollectiveReduceV2) splits its own messages and is left alone.

Empty tensors never reach TF: an all-gather or all-to-all of zero elements crashes the process
(SIGSEGV) in TF 2.15.

Failures: the timeout (TFTORUS_TF_TIMEOUT, default 300 s) is how long a peer may be gone.
Eager collectives (start-up, barriers, broadcasts) carry it as TF's per-op timeout, at most
EAGER_TIMED_LIMIT of them in any timeout's span (`EagerTimeouts`); collectives in a traced step
and eager ones beyond that carry none, because TF holds two threads asleep for the whole timeout
of every op given one (thousands per rank at a step's rate: tftorus/engines/peer_health.py; an eager
loop of `hvd.allreduce` calls piles them up alike), and a thread per process that probes the
peers (`PeerHealthMonitor`) aborts the collectives when one is lost. A
collective that fails (a peer died, was lost, or ran different code) aborts this process'
collective executor for good; every later collective fails at once. Eager calls raise
`CollectiveError` (a RuntimeError) saying so; inside tf.function wrap the step call in
`translate_errors()` for the same message.
"""
import collections
import contextlib
import hashlib
import logging
import os
import threading
import time
import weakref
from typing import Dict, Iterable, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import errors, ops
from tensorflow.python.ops import collective_ops, gen_collective_ops, resource_variable_ops

from tftorus.cluster.discovery import Cluster, host_names
from tftorus.engines import graph_homes, peer_health, shared_memory
from tftorus.torus.communicator import Communicator, Group, choose_reduce_scatter, sum_in_fp32

#: 'alltoall': all-to-all + local FP32 sum (any device). 'native': CollectiveReduceScatterV2,
#: NCCL only. 'auto': native where this task has a GPU, else alltoall.

logger = logging.getLogger(__name__)

_MERGE_OPS = {"sum": "Add", "max": "Max", "min": "Min"}
_GROUP_KEY_FIRST = 1 << 20  # tf.distribute counts its group keys up from 1: stay clear of them
_KEY_LIMIT = (1 << 31) - 1  # keys are int32
_GATHERV_SPAN = 32  # a variable-size all-gather pads to a power of two: one key per power
_MOVE_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)  # GatherV2's types
DEFAULT_MAX_MESSAGE_BYTES = 16 << 20  # largest block one all-to-all / all-gather sends (see above)
CPU_MAX_BUCKET_BYTES = 32 << 20  # the largest bucket the planner makes on CPUs (see above)
#: The largest torus chunk the planner makes on CPUs: there a chunk's row phases (all-to-all,
#: sum, all-gather over gRPC) run on the cores its column's transfer needs, and stall the column
#: for a share that grows with the chunk. Measured on the emulated 2 x 2 with a link per rank,
#: ResNet-50's FP32 set in 16 MiB buckets: chunks of 16, 8, 4, 2, 1 MiB took 2094, 1983, 1954,
#: 1841, 1820 ms, where the planner's affine links (probed with messages up to 2 MiB) predict
#: the reverse order (docs/studies/planner.md).
CPU_MAX_CHUNK_BYTES = 2 << 20
EAGER_TIMED_LIMIT = 64  # eager collectives with TF's timeout at once: 2 threads each (above)


class CollectiveError(RuntimeError):
    """A TF collective failed; this process can run no further collective (restart the job)."""


class EagerTimeouts:
    """TF's per-op timeout for eager collectives, given to at most `limit` of them within any
    `timeout` seconds. Each one holds two threads for the whole timeout, finished or not, so an
    eager loop of collectives would pile up thousands; past the limit a call goes without one,
    covered by the peer health monitor like a traced step's. The few calls of start-up and
    barriers keep it, which also catches a live peer that never calls."""

    def __init__(self, timeout: float, limit: int = EAGER_TIMED_LIMIT, clock=time.monotonic):
        self.timeout, self.limit, self._clock = timeout, limit, clock
        self._started = collections.deque()
        self._lock = threading.Lock()

    def take(self) -> float:
        """The timeout for the next eager collective: `timeout`, or 0.0 (none) past the limit."""
        now = self._clock()
        with self._lock:
            while self._started and now - self._started[0] >= self.timeout:
                self._started.popleft()
            if len(self._started) >= self.limit:
                return 0.0
            self._started.append(now)
            return self.timeout


def _hash(text: str, low: int, high: int) -> int:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return low + int.from_bytes(digest, "big") % (high - low)


def tf_member_order(group: Sequence[int], device_of) -> Tuple[int, ...]:
    """The order TF ranks a group's members in: by the string order of their device names."""
    return tuple(sorted(group, key=device_of))


def explain(error: "errors.OpError", timeout: Optional[float] = None) -> str:
    """What a failed TF collective means, in words."""
    text = str(error.message if hasattr(error, "message") else error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    if peer_health.MARK in text:  # our monitor aborted: its message names the lost rank
        lost = text[text.index(peer_health.MARK):].splitlines()[0]
        return (f"tftorus tf engine: a peer was lost, so TF aborted this process' collective "
                f"executor and no further collective can run: stop and restart the job. "
                f"{lost}")
    if isinstance(error, errors.DeadlineExceededError) or "timed out" in text.lower() \
            or "deadline" in text.lower():
        what = (f"a peer did not take part within the collective timeout"
                f"{f' of {timeout:g} s' if timeout else ''} (it died, hangs, or runs other "
                f"collectives; raise TFTORUS_TF_TIMEOUT if it is only slow)")
    elif isinstance(error, errors.UnavailableError) or "connection" in text.lower() \
            or "socket closed" in text.lower():
        what = "a peer's TF server became unreachable (the process died or its host is down)"
    elif "mismatch" in text.lower() or "expected type" in text.lower():
        what = "ranks ran different collectives (shape, dtype or op differ) at the same point"
    else:
        what = "a TF collective failed"
    return (f"tftorus tf engine: {what}. TF aborted this process' collective executor, so no "
            f"further collective can run: stop and restart the job. TF said: {first}")


@contextlib.contextmanager
def translate_errors(timeout: Optional[float] = None):
    """Re-raise a failed TF collective (inside a tf.function step) as a `CollectiveError`."""
    try:
        yield
    except errors.OpError as e:
        text = str(e)
        if "Collective" not in text and "collective" not in text \
                and not isinstance(e, (errors.DeadlineExceededError, errors.UnavailableError)):
            raise
        raise CollectiveError(explain(e, timeout)) from e


class TFCollectiveCommunicator(Communicator):
    engine = "tf"
    # Each group's collectives are ordered by its own token; those of different groups are
    # independent ops that TF's executor runs at the same time.
    concurrent_groups = True

    def __init__(self, cluster: Cluster, groups: Iterable[Sequence[int]] = (),
                 reduce_scatter_impl: str = "auto", timeout: Optional[float] = None,
                 max_message_bytes: Optional[int] = None):
        """cluster: from tf_runtime.bootstrap(). groups: every group the grids will use, so
        group keys are assigned in one canonical order on every process (others are hashed when
        first used). timeout: seconds per collective (default: the cluster's).
        max_message_bytes: largest block of one all-to-all or all-gather; larger ones go as
        several collectives (default: TFTORUS_TF_MAX_MESSAGE_MB, else 16 MiB)."""
        self._cluster = cluster
        self.timeout = float(timeout if timeout is not None else cluster.timeout)
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self._eager_timeouts = EagerTimeouts(self.timeout)
        gpu = bool(tf.config.list_logical_devices("GPU")) if cluster.size > 1 else False
        self._device = (f"{cluster.task(cluster.rank)}/device:GPU:0" if gpu else cluster.device)
        self._hint = "nccl" if gpu else "auto"
        self.reduce_scatter_impl = choose_reduce_scatter(
            reduce_scatter_impl, gpu, "reduce_scatter_impl='native' (CollectiveReduceScatterV2) "
            "exists only for GPUs (NCCL) in TF 2.15; use 'alltoall' on CPUs")
        self.max_message_bytes = _max_message_bytes(max_message_bytes)
        # TF's CPU all-to-all and all-gather grow faster than their bytes (module docstring):
        # ResNet-50's 97.6 MiB in one buffer took 1.6x its time in 16-32 MiB buckets.
        self.max_bucket_bytes = None if gpu else CPU_MAX_BUCKET_BYTES
        self.max_chunk_bytes = None if gpu else CPU_MAX_CHUNK_BYTES
        self._lock = threading.Lock()
        self._group_keys: Dict[Group, int] = {}
        self._group_of_key: Dict[int, Group] = {}
        self._instance_keys: Dict[Group, Dict[tuple, int]] = {}
        self._used_instance_keys: Dict[Group, set] = {}
        self._tokens: Dict[Group, tf.Variable] = {}
        self._session_calls = graph_homes.SessionCalls()
        self._session_call = threading.local()  # the TF1 call this thread runs (as_one_call)
        self._trace_counts = weakref.WeakKeyDictionary()  # graph -> {signature: calls so far}
        canonical = sorted({tuple(sorted(g)) for g in groups} | {self.all_ranks()},
                           key=lambda g: (len(g), g))
        for g in canonical:
            if len(g) > 1:
                self.group_key(g)
        self.health = peer_health.PeerHealthMonitor(
            peer_health.peers_to_probe(self.rank, self.size, canonical), cluster.task,
            lambda r: cluster.workers[r], self.timeout)
        if cluster.size > 1:
            not_up = self.health.wait_until_up()
            if not_up:
                raise CollectiveError(f"tftorus tf engine: the job's processes did not all "
                                      f"come up: {not_up}")
            self.health.start()
        # ranks of this host exchange row data through /dev/shm where they can (shared_memory.py)
        self.shared_memory = None
        if shared_memory.applies(cluster.size, gpu):
            self.shared_memory = self._start_shared_memory()

    def _start_shared_memory(self) -> "shared_memory.SharedMemoryTransport":
        hosts = host_names(self._cluster.workers)
        transport = shared_memory.SharedMemoryTransport(
            self.rank, shared_memory.job_tag(self._cluster.workers),
            lambda ints, group: self._gather_equal(ints, group), self.tf_order)
        mates = [r for r, h in enumerate(hosts) if h == hosts[self.rank]]
        transport.handshake(
            self.size, mates, self.barrier,
            lambda ints: self.all_reduce(tf.constant(ints), self.all_ranks()).numpy())
        if self.rank == 0 and len(mates) > 1:
            if transport.ranks:
                logger.info("tftorus tf engine: ranks of a host exchange their rows through "
                            "/dev/shm (%s=0: over gRPC)", shared_memory.ENV)
            else:
                logger.info("tftorus tf engine: ranks of a host exchange their rows over gRPC: "
                            "not all could map each other's segments in /dev/shm with %d MiB "
                            "free there", shared_memory.MIN_FREE_BYTES >> 20)
        return transport

    def register_groups(self, groups: Iterable[Sequence[int]]) -> None:
        """Groups of a grid planned after start (the planner, tftorus.runtime.process_state):
        keys in the same
        canonical order on every process, as at construction. Every process calls it alike."""
        for g in sorted({tuple(sorted(g)) for g in groups}, key=lambda g: (len(g), g)):
            if len(g) > 1:
                self.group_key(g)

    def stop_health_checks(self) -> None:
        """After the last collective (shutdown): peers may exit from here on."""
        self.health.stop()
        if self.shared_memory is not None:
            self.shared_memory.close()

    # -- identity ---------------------------------------------------------------------------

    @property
    def rank(self):
        return self._cluster.rank

    @property
    def size(self):
        return self._cluster.size

    @property
    def local_size(self):
        return self._cluster.local_size

    def device_name(self, rank: int) -> str:
        return f"{self._cluster.task(rank)}/device:{self._device.rsplit('device:', 1)[1]}"

    def tf_order(self, group: Group) -> Tuple[int, ...]:
        return tf_member_order(group, self.device_name)

    # -- keys and tokens --------------------------------------------------------------------

    def group_key(self, group: Group) -> int:
        with self._lock:
            if group not in self._group_keys:
                key = _hash(f"group{group}", _GROUP_KEY_FIRST, _KEY_LIMIT)
                while key in self._group_of_key:
                    key = key + 1 if key + 1 < _KEY_LIMIT else _GROUP_KEY_FIRST
                self._group_keys[group] = key
                self._group_of_key[key] = group
            return self._group_keys[group]

    def _signature_count(self, signature: tuple) -> int:
        """How many collectives of this signature the current trace already holds (0 eagerly)."""
        if tf.executing_eagerly():
            return 0
        graph = ops.get_default_graph()
        while getattr(graph, "is_control_flow_graph", False):  # tf.cond / while bodies
            graph = graph.outer_graph
        counts = self._trace_counts.setdefault(graph, {})
        n = counts.get(signature, 0)
        counts[signature] = n + 1
        return n

    def instance_key(self, group: Group, signature: tuple, span: int = 1) -> int:
        """A key (or the first of `span` consecutive keys) for this collective in `group`."""
        with self._lock:
            signature = (signature + (self._signature_count((group,) + signature),)
                         + self.session_salt())
            keys = self._instance_keys.setdefault(group, {})
            used = self._used_instance_keys.setdefault(group, set())
            if signature not in keys:
                key = _hash(repr(signature), 1, _KEY_LIMIT - span)
                while any(k in used for k in range(key, key + span)):
                    key = key + span if key + 2 * span < _KEY_LIMIT else 1
                keys[signature] = key
                used.update(range(key, key + span))
            return keys[signature]

    def session_salt(self) -> tuple:
        """Inside a TF1 session's call (`as_one_call`), the call's number in its graph: two
        calls a session runs at once then never share an instance key."""
        call = getattr(self._session_call, "number", None)
        return () if call is None else ("session call", call)

    def _token(self, group: Group):
        """The group's ordering token. Collectives are built only where init_scope lifts to
        eager execution (a TF1 graph's go through `as_one_call`), so one resource variable per
        group serves eager code and every tf.function."""
        with self._lock:
            if group not in self._tokens:
                with ops.init_scope(), tf.device(self._device):
                    # not tf.Variable: a distribution strategy's variable creator would
                    # make it a strategy's variable
                    self._tokens[group] = resource_variable_ops.ResourceVariable(
                        0.0, trainable=False, name=f"tftorus_order_{len(self._tokens)}")
            return self._tokens[group].handle

    # -- TF1 graphs -------------------------------------------------------------------------

    def as_one_call(self, fn, tensors, outputs):
        """In a TF1 graph, `fn`'s collectives as one py_function that runs them eagerly, on the
        cluster's runtime, when the session runs it (tftorus/engines/graph_homes.py says why and in
        which order). The call's number in its graph goes into its instance keys
        (`session_salt`), so calls a session runs at the same time never share one. Elsewhere
        (and for no outputs: each primitive is then a call of its own): fn(tensors)."""
        graph = graph_homes.lifted_graph()
        if graph is None or not outputs:
            return fn(list(tensors))

        def salted(number, values):
            self._session_call.number = number
            try:
                return fn(values)
            finally:
                self._session_call.number = None
        return self._session_calls.call(graph, salted, tensors, outputs)

    def _in_session_graph(self, primitive, tensor, shape):
        """One primitive as its own `as_one_call` in a TF1 graph, else None."""
        if graph_homes.lifted_graph() is None:
            return None
        tensor = tf.convert_to_tensor(tensor)
        return self.as_one_call(lambda values: [primitive(values[0])], [tensor],
                                [tf.TensorSpec(shape, tensor.dtype)])[0]

    # -- the three primitives ---------------------------------------------------------------

    def run_collectives(self, build):
        """Build (graph) or run (eager) collectives; eager failures become CollectiveError."""
        if not tf.executing_eagerly():
            with tf.device(self._device):
                return build()
        with translate_errors(self.timeout), tf.device(self._device):
            return build()

    def collective_args(self, group: Group, signature: tuple, span: int = 1):
        """The keys, token and timeout of one TF collective op over `group` (its keyword
        arguments; tftorus/horovod_api/group_collectives.py builds ops of its own with them)."""
        # TF's per-op timeout only eagerly and a bounded number at once: it costs two threads
        # per op for the whole timeout; the peer health monitor covers the rest (docstring)
        return dict(group_size=len(group), group_key=self.group_key(group),
                    instance_key=self.instance_key(group, signature, span),
                    communication_hint=self._hint,
                    timeout=self._eager_timeouts.take() if tf.executing_eagerly() else 0.0,
                    ordering_token=self._token(group))

    def _reduce_scatter(self, tensor, group):
        tensor = tf.convert_to_tensor(tensor)
        n = len(group)
        shard = None if tensor.shape[0] is None else tensor.shape[0] // n
        in_session = self._in_session_graph(lambda t: self._reduce_scatter(t, group), tensor,
                                            [shard])
        if in_session is not None:
            return in_session
        _static_shape(tensor, "reduce-scatter")
        if tensor.shape.num_elements() == 0:
            return tensor
        if self._through_shared_memory(tensor, group):
            return self.run_collectives(lambda: sum_in_fp32(
                self.shared_memory.reduce_scatter_blocks(tensor, group)))
        chunks = tf.reshape(tensor, [n, -1])
        order = self.tf_order(group)
        if order != group:  # row j goes to TF's j-th member
            chunks = tf.gather(chunks, [group.index(m) for m in order])
        if self.reduce_scatter_impl == "native":
            def build():
                args = self.collective_args(group, ("reduce_scatter", "Add", tensor.dtype.name,
                                          tuple(tensor.shape.as_list())))
                return gen_collective_ops.collective_reduce_scatter_v2(
                    tf.reshape(chunks, [-1]), group_size=args["group_size"],
                    group_key=args["group_key"], instance_key=args["instance_key"],
                    ordering_token=[args["ordering_token"]], merge_op="Add", final_op="Id",
                    communication_hint=args["communication_hint"],
                    timeout_seconds=args["timeout"])
            return self.run_collectives(build)

        def build():
            received = [collective_ops.all_to_all_v2(
                piece, **self.collective_args(group, ("all_to_all", tensor.dtype.name,
                                            tuple(piece.shape.as_list()))))
                for piece in self._pieces(chunks)]
            received = received[0] if len(received) == 1 else tf.concat(received, axis=1)
            return sum_in_fp32(received)  # [n, shard] from every member -> this member's sum
        return self.run_collectives(build)

    def _all_reduce(self, tensor, group, op):
        tensor = tf.convert_to_tensor(tensor)
        in_session = self._in_session_graph(lambda t: self._all_reduce(t, group, op), tensor,
                                            tensor.shape)
        if in_session is not None:
            return in_session
        _static_shape(tensor, "all-reduce")
        if tensor.shape.num_elements() == 0:
            return tensor
        if op == "sum" and tensor.dtype in (tf.float16, tf.bfloat16):
            return self.sum_in_rank_order(tensor, group)

        def build():
            return collective_ops.all_reduce_v2(
                tensor, merge_op=_MERGE_OPS[op], final_op="Id",
                **self.collective_args(group, ("all_reduce", _MERGE_OPS[op], tensor.dtype.name,
                                     tuple(tensor.shape.as_list()))))
        return self.run_collectives(build)

    def _all_gather(self, tensor, group, equal_sizes=False):
        tensor = tf.convert_to_tensor(tensor)
        if tensor.shape.rank == 0:
            raise ValueError("all-gather concatenates along dimension 0: pass a tensor of rank "
                             ">= 1 (tf.reshape(t, [1]) for a scalar)")
        if tensor.dtype == tf.bfloat16:  # GatherV2 takes no bfloat16; its bits travel as FP16
            return tf.bitcast(self._all_gather(tf.bitcast(tensor, tf.float16), group,
                                               equal_sizes), tf.bfloat16)
        if tensor.dtype not in _MOVE_DTYPES:
            raise TypeError(f"the tf engine's all-gather takes {[d.name for d in _MOVE_DTYPES]} "
                            f"and bfloat16, not {tensor.dtype.name}")
        rows = len(group) * tensor.shape[0] if equal_sizes and tensor.shape[0] else None
        in_session = self._in_session_graph(lambda t: self._all_gather(t, group, equal_sizes),
                                            tensor, tf.TensorShape([rows]) + tensor.shape[1:])
        if in_session is not None:
            return in_session
        if equal_sizes:
            return self._gather_equal(tensor, group)
        return self._gather_sizes_differ(tensor, group)

    def _gather_equal(self, tensor, group):
        shape = _static_shape(tensor, "all-gather")
        n = len(group)
        if tensor.shape.num_elements() == 0:
            return tf.zeros([n * shape[0]] + shape[1:], tensor.dtype)
        if self._through_shared_memory(tensor, group, moved_factor=n):
            return self.run_collectives(lambda: tf.reshape(self.shared_memory.all_gather(
                tf.reshape(tensor, [-1]), group), [n * shape[0]] + shape[1:]))

        def build():
            pieces = self._pieces(tf.reshape(tensor, [1, -1]))
            outs = [collective_ops.all_gather_v2(
                piece, **self.collective_args(group, ("all_gather", tensor.dtype.name,
                                            tuple(piece.shape.as_list()))))
                for piece in pieces]  # each [n, piece]: member j's piece in TF's row j
            out = outs[0] if len(outs) == 1 else tf.concat(outs, axis=1)
            out = tf.reshape(out, [n * shape[0]] + shape[1:])
            return self._to_group_order(out, group, shape[0])
        return self.run_collectives(build)

    @property
    def transport(self) -> str:
        return "tf engine" if self.shared_memory is None else "tf engine, rows in /dev/shm"

    def _through_shared_memory(self, tensor, group, moved_factor: int = 1) -> bool:
        """Whether this row collective goes through /dev/shm: judged by the bytes it moves,
        the input of a reduce-scatter, the output of an all-gather (`moved_factor` = members), so
        a torus chunk's two row phases take the same path."""
        return self.shared_memory is not None and self.shared_memory.serves(
            group, tensor.shape.num_elements() * tensor.dtype.size * moved_factor)

    def _pieces(self, blocks):
        """Split [n, m] blocks along m so one member's block is at most max_message_bytes;
        concatenating the collectives' results along axis 1 restores the layout."""
        m = int(blocks.shape[1])
        piece_count = -(-m * blocks.dtype.size // self.max_message_bytes)
        if piece_count <= 1:
            return [blocks]
        size = -(-m // piece_count)
        return tf.split(blocks, [size] * (m // size) + ([m % size] if m % size else []), axis=1)

    def _to_group_order(self, out, group, rows):
        order = self.tf_order(group)
        if order == group:
            return out
        blocks = tf.reshape(out, tf.concat([[len(group), rows], tf.shape(out)[1:]], 0))
        blocks = tf.gather(blocks, [order.index(m) for m in group])
        return tf.reshape(blocks, tf.shape(out))

    def _gather_sizes_differ(self, tensor, group):
        """Members may pass different first dimensions (Horovod's allgather allows it; sparse
        gradients need it). Sizes are exchanged, every tensor is padded to the next power of two
        of the largest, so one of a few fixed keys and shapes serves every size."""
        rest = tensor.shape.as_list()[1:]
        if any(d is None for d in rest):
            raise ValueError(f"all-gather needs every dimension but the first known when the "
                             f"step is traced, got {tensor.shape}")
        n = len(group)
        rows = tf.shape(tensor, out_type=tf.int32)[:1]
        sizes = self._gather_equal(rows, group)  # [n], group order
        row_elems = int(np.prod(rest, dtype=np.int64))
        if row_elems == 0:
            return tf.zeros(tf.concat([[tf.reduce_sum(sizes)], rest], 0), tensor.dtype)
        powers = tf.constant([1 << i for i in range(_GATHERV_SPAN - 1)], tf.int32)
        exponent = tf.searchsorted(powers, tf.maximum(tf.reduce_max(sizes), 1)[None])[0]
        capacity = tf.gather(powers, exponent)
        padded = tf.pad(tensor, [[0, capacity - rows[0]]] + [[0, 0]] * len(rest))

        def build():
            args = self.collective_args(group, ("all_gather_v", tensor.dtype.name, tuple(rest)),
                              span=_GATHERV_SPAN)
            args["instance_key"] = args["instance_key"] + exponent  # one key per capacity
            return collective_ops.all_gather_v2(padded, **args)
        out = self.run_collectives(build)
        blocks = tf.reshape(out, tf.concat([[n, capacity], rest], 0))
        order = self.tf_order(group)
        pieces = [blocks[order.index(m), :sizes[i]] for i, m in enumerate(group)]
        return tf.concat(pieces, 0)


def _max_message_bytes(value: Optional[int]) -> int:
    if value is None:
        mb = os.environ.get("TFTORUS_TF_MAX_MESSAGE_MB", "")
        try:
            value = int(float(mb) * (1 << 20)) if mb else DEFAULT_MAX_MESSAGE_BYTES
        except ValueError:
            raise ValueError(f"TFTORUS_TF_MAX_MESSAGE_MB must be a number of MiB, got {mb!r}")
    if value < 1024:
        raise ValueError(f"max_message_bytes must be at least 1024 (1 KiB), got {value}: a "
                         f"collective per few bytes would only add latency")
    return int(value)


def _static_shape(tensor, what):
    if not tensor.shape.is_fully_defined():
        raise ValueError(f"the tf engine's {what} needs a shape known when the step is traced "
                         f"(its instance key depends on it), got {tensor.shape}")
    return tensor.shape.as_list()
