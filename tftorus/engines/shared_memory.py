"""The tf engine's reduce-scatter and all-gather among ranks of one host, through shared memory.

Why: on CPUs TF moves every collective's bytes over gRPC, between processes of one host too, and
pays for each byte about seven copies (the RecvBuf response is serialized into a protobuf `Any`,
then into gRPC's buffer, and parsed twice on the other side; a perf profile of the torus gave 42 %
of its CPU to memmove). Where the cores are what limits the all-reduce (many ranks per host, a
CPU quota), the torus' row phases then cost more than its column crosses the network. Through
shared memory a member writes its data once and every member reads what it needs once:
measured on one host of 8 ranks (a 2 x 4 torus, both rows here), ResNet-50's 97.6 MiB FP32 set
took 2,491 ms over gRPC and 910 ms with the rows this way (`torus-tf-nochunks` against
`torus-tf-nochunks-shm` in studies/benchmark_allreduce.py, docs/studies/planner.md).

How: each rank leases a segment of its own (a file in /dev/shm, per group, reused from call to
call), writes its data there and tells the group which segment in a tiny all-gather over TF,
which is also the barrier: when it returns, every member's data is in place. Each member then
reads its part from every member's segment; a second tiny all-gather says that everyone is done
reading, and the segments return to their pools. Every wait is a TF collective, so a lost peer
surfaces as the engine's usual error (its peer health monitor), never as a hang here.

The bytes cross between TF and the segments through DLPack, not numpy: a py_function's input
turned `.numpy()` is a copy, and a numpy array it returns is copied again into a tensor. With
DLPack the write copies once and the read copies once, into a tensor TF owns (tf.stack of the
members' blocks, which TF never writes in place): a 24 MiB write took 7.6 ms against 13.7, its
read 4.9 ms against 17.6 (one rank, TF 2.15). Each block starts 64-byte aligned, as TF requires
of memory it is lent.

The bytes summed and their order are those of the gRPC path (the members' blocks stacked in TF's
member order, summed by the same `sum_in_fp32`), so the transport changes no bit of a result.

A segment's name is removed once every member of its group has mapped it (after its first
call), so nothing is left in /dev/shm when a process dies later; a segment is reserved with
posix_fallocate, so a full /dev/shm is an error that says so, not a SIGBUS.

Where: CPU devices (on GPUs NCCL moves the bytes), groups whose ranks share a host address and
see each other's segments with at least MIN_FREE_BYTES free in /dev/shm (checked once at start:
containers sharing a network but not /dev/shm do not; a container's 64 MiB /dev/shm is too
small), collectives moving at least MIN_BYTES (a reduce-scatter's input, an all-gather's output:
below it the two tiny all-gathers cost more than gRPC saves).
It is on by default; `TFTORUS_TF_SHARED_MEMORY=0` keeps every byte on gRPC.
"""
import atexit
import hashlib
import mmap
import os
import threading
from functools import partial
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

try:  # both stacks have them; a build without falls back to numpy's copies
    from tensorflow.experimental import dlpack as _dlpack
    _HAVE_DLPACK = hasattr(np, "from_dlpack")
except ImportError:  # pragma: no cover
    _dlpack, _HAVE_DLPACK = None, False

ENV = "TFTORUS_TF_SHARED_MEMORY"
SHM_DIR = "/dev/shm"
#: Smaller buffers stay on gRPC: each call here adds two tiny all-gathers and two Python calls,
#: and the CPU torus pipelines chunks of at most 2 MiB (tf_engine.CPU_MAX_CHUNK_BYTES), 4-16
#: per bucket. Measured under a one-core quota on the emulated 2 x 4 (ResNet-50 FP32): the fixed
#: torus in such chunks took 14.9 s with them here, 6.8 s over gRPC; unchunked (12-16 MiB
#: buckets) 4.4 s here, 4.6-5.0 s over gRPC (docs/studies/planner.md).
MIN_BYTES = 4 << 20
#: What /dev/shm must have free at start: each rank of a host leases about its gradients' bytes
#: (ResNet-50: 98 MiB in FP32), 8 ranks of a GPU-sized host near 1 GiB together.
MIN_FREE_BYTES = 1 << 30
_ALIGN = 1 << 20  # segments are made in whole MiB, so buffers of nearby sizes share one
#: Where every block starts in a segment: TF aborts on a lent buffer not aligned to 64 bytes.
BLOCK_ALIGN = 64
Group = Tuple[int, ...]


def requested() -> bool:
    """Whether to try it (the handshake then decides): unless TFTORUS_TF_SHARED_MEMORY is 0."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("0", "false", "off", "no"):
        return False
    if value in ("", "1", "true", "on", "yes"):
        return True
    raise ValueError(f"{ENV} must be 1 (on where it can be) or 0 (off), got {value!r}")


def applies(world_size: int, gpu: bool) -> bool:
    """Whether the tf engine tries it: a job of several ranks on CPUs (on GPUs NCCL moves the
    bytes, and a segment in host memory would add two copies across PCIe), unless turned off."""
    return world_size > 1 and not gpu and requested()


def free_bytes() -> int:
    stat = os.statvfs(SHM_DIR)
    return stat.f_bavail * stat.f_frsize


def job_tag(workers: Sequence[str]) -> str:
    """A name part every rank of one job on a host computes alike, and no other live job shares
    (its servers hold other ports, or it runs as another user)."""
    text = f"{os.getuid()}:{','.join(workers)}"
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


class _Segment:
    """A file in /dev/shm mapped into this process."""

    def __init__(self, path: str, size: int, create: bool):
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            # left by a killed job on the same addresses (a live one holds other ports): stale
            os.unlink(path)
            fd = os.open(path, flags, 0o600)
        try:
            if create:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as e:
                    os.unlink(path)
                    free = os.statvfs(SHM_DIR)
                    raise OSError(
                        f"tftorus: no room in {SHM_DIR} for a {size / 2**20:.0f} MiB segment of "
                        f"the shared-memory transport ({free.f_bavail * free.f_frsize / 2**20:.0f}"
                        f" MiB free): enlarge it (docker run --shm-size) or set {ENV}=0") from e
            else:
                size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.path, self.size, self.named = path, size, create

    def view(self, dtype, count: int, offset_items: int = 0) -> np.ndarray:
        return np.ndarray([count], dtype, buffer=self.map, offset=offset_items * dtype.itemsize)

    def unlink(self) -> None:
        if self.named:
            self.named = False
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


class SharedMemoryTransport:
    """Reduce-scatter and all-gather within groups of one host; `gather_ints(values, group)`
    (the engine's all-gather of a tiny int32 tensor, in group order) exchanges segment numbers
    and is the barrier."""

    def __init__(self, rank: int, tag: str, gather_ints: Callable[[tf.Tensor, Group], tf.Tensor],
                 tf_order: Callable[[Group], Tuple[int, ...]]):
        self.rank, self.tag = rank, tag
        self._gather_ints, self._tf_order = gather_ints, tf_order
        self._lock = threading.Lock()
        self._own: Dict[Group, List[_Segment]] = {}  # this rank's segments per group
        self._free: Dict[Group, List[int]] = {}
        self._peers: Dict[Tuple[int, Group, int], _Segment] = {}
        self.ranks: frozenset = frozenset()  # ranks reachable this way (`handshake`)
        self.reads = {"lent": 0, "copied": 0}  # how reads reached TF (DLPack, or numpy's copy)
        atexit.register(self.close)

    # -- which groups ---------------------------------------------------------------------

    def path(self, owner: int, group: Group, index: int) -> str:
        members = "-".join(map(str, group))
        return os.path.join(SHM_DIR, f"tftorus-{self.tag}-g{members}-r{owner}-{index}")

    def handshake(self, size: int, same_host: Sequence[int], barrier: Callable[[], None],
                  sum_ints: Callable[[np.ndarray], np.ndarray]) -> frozenset:
        """Called eagerly by every rank of the job at once: each makes a small segment, and
        checks that it can map those of the ranks with its host address (`same_host`, itself
        included). A group is served where all its members could (`ranks`): the same for every
        rank, from one sum over the job (`sum_ints`)."""
        try:
            probe = _Segment(self.path(self.rank, ("probe",), 0), mmap.PAGESIZE, create=True)
        except OSError:  # no /dev/shm, or not writable
            probe = None
        try:
            barrier()  # every rank's probe exists
            ok = int(probe is not None and free_bytes() >= MIN_FREE_BYTES)
            for peer in same_host if ok else ():
                if peer != self.rank:
                    try:
                        _Segment(self.path(peer, ("probe",), 0), 0, create=False).map.close()
                    except OSError:
                        ok = 0
            mine = np.zeros([size], np.int32)
            mine[self.rank] = ok
            fine = sum_ints(mine)  # after it, every rank has tried every probe
        finally:
            if probe is not None:
                probe.unlink()
                probe.map.close()
        mates = set(same_host)
        self.ranks = frozenset(r for r in mates if fine[r]) if all(fine[r] for r in mates) \
            else frozenset()
        return self.ranks

    def serves(self, group: Group, nbytes: int) -> bool:
        return len(group) > 1 and nbytes >= MIN_BYTES and set(group) <= self.ranks

    # -- segments -------------------------------------------------------------------------

    def _lease(self, group: Group, nbytes: int) -> int:
        with self._lock:
            own, free = self._own.setdefault(group, []), self._free.setdefault(group, [])
            fits = [i for i in free if own[i].size >= nbytes]
            if fits:
                index = min(fits, key=lambda i: own[i].size)
                free.remove(index)
                return index
            size = -(-nbytes // _ALIGN) * _ALIGN
            own.append(_Segment(self.path(self.rank, group, len(own)), size, create=True))
            return len(own) - 1

    def _release(self, group: Group, index: int) -> None:
        with self._lock:
            self._own[group][index].unlink()  # every member has mapped it by now
            self._free[group].append(index)

    def _segment(self, owner: int, group: Group, index: int) -> _Segment:
        if owner == self.rank:
            return self._own[group][index]
        key = (owner, group, index)
        with self._lock:
            if key not in self._peers:
                self._peers[key] = _Segment(self.path(owner, group, index), 0, create=False)
            return self._peers[key]

    def close(self) -> None:
        """Remove this rank's names still in /dev/shm (a segment whose first call never ended)."""
        with self._lock:
            for segments in self._own.values():
                for s in segments:
                    s.unlink()

    # -- the two collectives --------------------------------------------------------------

    def _write(self, group: Group, blocks: int, tensor: tf.Tensor) -> np.ndarray:
        """`tensor` into a leased segment as `blocks` equal blocks, each at an aligned start."""
        values = _as_numpy(tensor).reshape(blocks, -1)
        stride = _stride(values.shape[1], values.dtype)
        index = self._lease(group, blocks * stride * values.dtype.itemsize)
        segment = self._own[group][index]
        for block in range(blocks):
            np.copyto(segment.view(values.dtype, values.shape[1], block * stride), values[block])
        return np.array([index], np.int32)

    def _read(self, group: Group, dtype: np.dtype, count: int, block: int,
              owners: Sequence[int], indices: tf.Tensor):
        """Block number `block` (`count` items) of each owner's segment, stacked in `owners`'
        order, and a flag that exists only once they are read (what the second all-gather
        waits for)."""
        numbers = dict(zip(group, indices.numpy().tolist()))
        offset = block * _stride(count, dtype)
        views = [self._segment(owner, group, numbers[owner]).view(dtype, count, offset)
                 for owner in owners]
        if _lendable(views):
            # a tensor TF owns, complete when the stack returns (eager ops run in order here)
            out = tf.stack([_dlpack.from_dlpack(v.__dlpack__()) for v in views])
            self.reads["lent"] += 1
        else:
            out = np.stack(views)
            self.reads["copied"] += 1
        return out, np.zeros([1], np.int32)

    def _done(self, group: Group, indices: tf.Tensor, _all_read: tf.Tensor) -> np.ndarray:
        self._release(group, dict(zip(group, indices.numpy().tolist()))[self.rank])
        return np.zeros([1], np.int32)

    def _exchange(self, group: Group, tensor: tf.Tensor, read: Callable[[tf.Tensor], tuple],
                  gather_blocks: bool) -> tf.Tensor:
        """Write `tensor` (as one block per member where `gather_blocks`, for the reduce-scatter),
        swap segment numbers, `read(numbers)`, then agree that all have read.
        The flag of the second all-gather comes out of the reading op itself: a value merely
        computed from `out` (its size, say) is folded to a constant when the graph is
        optimized, and the segments would be given back while peers still read them."""
        blocks = len(group) if gather_blocks else 1
        mine = tf.py_function(partial(self._write, group, blocks), [tensor], tf.int32)
        mine.set_shape([1])
        indices = self._gather_ints(mine, group)  # every member's data is in place
        out, read_flag = read(indices)
        read_flag.set_shape([1])
        all_read = self._gather_ints(read_flag, group)
        done = tf.py_function(partial(self._done, group), [indices, all_read], tf.int32)
        with tf.control_dependencies([done]):
            return tf.identity(out)

    def reduce_scatter_blocks(self, tensor: tf.Tensor, group: Group) -> tf.Tensor:
        """[n, shard]: every member's block for this rank (its place in `group`), in TF's member
        order, as the gRPC path's all-to-all receives them; the caller sums them alike."""
        n = len(group)
        shard = tensor.shape[0] // n
        dtype = tensor.dtype.as_numpy_dtype
        owners = self._tf_order(group)

        def read(indices):
            out, flag = tf.py_function(partial(self._read, group, np.dtype(dtype), shard,
                                               group.index(self.rank), owners), [indices],
                                       [tensor.dtype, tf.int32])
            out.set_shape([n, shard])
            return out, flag
        return self._exchange(group, tensor, read, gather_blocks=True)

    def all_gather(self, tensor: tf.Tensor, group: Group) -> tf.Tensor:
        """Every member's equal-sized 1-D tensor, concatenated in group order."""
        count = tensor.shape[0]
        dtype = tensor.dtype.as_numpy_dtype

        def read(indices):
            out, flag = tf.py_function(partial(self._read, group, np.dtype(dtype), count, 0,
                                               group), [indices], [tensor.dtype, tf.int32])
            out.set_shape([len(group), count])
            return tf.reshape(out, [len(group) * count]), flag
        return self._exchange(group, tensor, read, gather_blocks=False)


def _stride(count: int, dtype: np.dtype) -> int:
    """Items from one block's start to the next's: `count` rounded up to BLOCK_ALIGN bytes."""
    per = BLOCK_ALIGN // np.dtype(dtype).itemsize
    return -(-count // per) * per


class _Lent:
    """A TF tensor as numpy's np.from_dlpack takes it (an object with the two methods)."""

    def __init__(self, tensor: tf.Tensor):
        self.tensor = tensor

    def __dlpack__(self, stream=None):
        return _dlpack.to_dlpack(self.tensor)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU, device 0


def _as_numpy(tensor: tf.Tensor) -> np.ndarray:
    """A py_function's CPU input as numpy without a copy where DLPack can lend it (numpy has no
    bfloat16: those are copied)."""
    if _HAVE_DLPACK and tensor.dtype != tf.bfloat16 and tensor.shape.num_elements():
        return np.from_dlpack(_Lent(tensor))
    return tensor.numpy()


def _lendable(views: Sequence[np.ndarray]) -> bool:
    """Whether TF can borrow these blocks: DLPack there, dtypes numpy and TF share, every start
    aligned, and eager ops synchronous (an async op could read a block after it is given back)."""
    return (_HAVE_DLPACK and len(views) > 1 and views[0].dtype.isbuiltin == 1  # not bfloat16
            and all(v.ctypes.data % BLOCK_ALIGN == 0 for v in views)
            and not context.context().is_async())
