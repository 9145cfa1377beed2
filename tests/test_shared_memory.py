"""The tf engine's in-host transport (tftorus/engines/shared_memory.py): its rules on one
process, then a real job of four ranks as two hosts of two whose rows go through /dev/shm."""
import errno
import json
import os
import unittest
from unittest import mock

import numpy as np
import tensorflow as tf

from tests import harness
from tftorus.engines import shared_memory


class RulesTest(unittest.TestCase):
    def test_the_switch(self):
        for value, on in (("", True), ("0", False), ("off", False), ("1", True), ("on", True)):
            with mock.patch.dict(os.environ, {shared_memory.ENV: value}):
                self.assertIs(shared_memory.requested(), on, value)
        with mock.patch.dict(os.environ, {shared_memory.ENV: "shm"}):
            with self.assertRaisesRegex(ValueError, "must be 1 .on where it can be. or 0 .off., "
                                                    "got 'shm'"):
                shared_memory.requested()

    def test_only_several_ranks_on_cpus(self):
        with mock.patch.dict(os.environ, {shared_memory.ENV: "1"}):
            self.assertTrue(shared_memory.applies(2, gpu=False))
            self.assertFalse(shared_memory.applies(2, gpu=True))  # NCCL moves a GPU's bytes
            self.assertFalse(shared_memory.applies(1, gpu=False))
        with mock.patch.dict(os.environ, {shared_memory.ENV: "0"}):
            self.assertFalse(shared_memory.applies(2, gpu=False))

    def test_blocks_are_lent_to_tf_only_where_it_can_take_them(self):
        self.assertEqual(shared_memory._stride(1_100_003, np.dtype(np.float32)), 1_100_016)
        self.assertEqual(shared_memory._stride(32, np.dtype(np.float16)), 32)
        raw = np.zeros(4096, np.uint8)
        start = (-raw.ctypes.data) % 64
        aligned = [raw[start + 64 * i:start + 64 * i + 64].view(np.float32) for i in range(2)]
        self.assertTrue(shared_memory._lendable(aligned))
        # TF aborts the process on a lent buffer off a 64-byte boundary: such blocks are copied
        self.assertFalse(shared_memory._lendable([aligned[0], raw[start + 4:start + 68]
                                                  .view(np.float32)]))
        bf16 = np.dtype(tf.bfloat16.as_numpy_dtype)  # no DLPack type in numpy
        self.assertFalse(shared_memory._lendable([a.view(bf16) for a in aligned]))

    def transport(self, rank=0):
        return shared_memory.SharedMemoryTransport(
            rank, f"test{os.getpid()}", gather_ints=None, tf_order=tuple)

    def test_a_full_dev_shm_is_an_error_that_says_what_to_do(self):
        transport = self.transport()
        full = OSError(errno.ENOSPC, "No space left on device")
        with mock.patch.object(shared_memory.os, "posix_fallocate", side_effect=full):
            with self.assertRaisesRegex(OSError, r"no room in /dev/shm for a 2 MiB segment .*"
                                                 r"enlarge it \(docker run --shm-size\) or set "
                                                 r"TFTORUS_TF_SHARED_MEMORY=0"):
                transport._lease((0, 1), (1 << 20) + 1)
        self.assertFalse([p for p in os.listdir("/dev/shm") if transport.tag in p])

    def test_a_rank_that_cannot_see_its_host_mates_segments_turns_it_off_for_all(self):
        # rank 1 never makes its probe (another /dev/shm, as containers sharing only a network)
        transport = self.transport(rank=0)
        seen = transport.handshake(2, [0, 1], barrier=lambda: None,
                                   sum_ints=lambda mine: np.array([mine[0], 1]))
        self.assertEqual(seen, frozenset())
        self.assertFalse(transport.serves((0, 1), 1 << 30))
        self.assertFalse([p for p in os.listdir("/dev/shm") if transport.tag in p])

    def test_too_little_room_in_dev_shm_turns_it_off(self):
        transport = self.transport(rank=0)
        with mock.patch.object(shared_memory, "free_bytes",
                               return_value=shared_memory.MIN_FREE_BYTES - 1):
            seen = transport.handshake(1, [0], barrier=lambda: None, sum_ints=lambda mine: mine)
        self.assertEqual(seen, frozenset())
        with mock.patch.object(shared_memory, "free_bytes",
                               return_value=shared_memory.MIN_FREE_BYTES):
            seen = transport.handshake(1, [0], barrier=lambda: None, sum_ints=lambda mine: mine)
        self.assertEqual(seen, frozenset({0}))

    def test_a_segment_left_by_a_killed_job_on_the_same_addresses_is_replaced(self):
        transport = self.transport(rank=0)
        stale = transport.path(0, (0, 1), 0)
        with open(stale, "wb") as f:
            f.write(b"x" * 10)
        index = transport._lease((0, 1), 1 << 20)
        self.assertEqual(transport._own[(0, 1)][index].size, 1 << 20)
        transport.close()
        self.assertFalse(os.path.exists(stale))

    def test_which_groups_and_buffers_it_serves(self):
        transport = self.transport(rank=0)
        transport.ranks = frozenset({0, 1})
        self.assertTrue(transport.serves((0, 1), shared_memory.MIN_BYTES))
        self.assertFalse(transport.serves((0, 1), shared_memory.MIN_BYTES - 1))  # latency
        self.assertFalse(transport.serves((0, 2), 1 << 30))  # rank 2 is on another host
        self.assertFalse(transport.serves((0,), 1 << 30))

    def test_segments_are_leased_again_and_their_names_removed(self):
        transport = self.transport(rank=0)
        first = transport._lease((0, 1), 3 << 20)
        path = transport._own[(0, 1)][first].path
        self.assertTrue(os.path.exists(path))
        transport._release((0, 1), first)
        self.assertFalse(os.path.exists(path))  # every member had mapped it
        self.assertEqual(transport._lease((0, 1), 2 << 20), first)  # fits: no new segment
        self.assertNotEqual(transport._lease((0, 1), 1 << 20), first)  # in use: a new one
        transport.close()
        self.assertFalse([p for p in os.listdir("/dev/shm") if transport.tag in p])


class TwoHostsJobTest(unittest.TestCase):
    def test_rows_through_shared_memory_keep_every_bit(self):
        ports = harness.free_ports(4)
        workers = [f"127.0.0.{1 + i // 2}:{p}" for i, p in enumerate(ports)]
        result = harness.run_ranks(
            [harness.worker("shared_memory_check.py")], 4, lambda i: {
                "TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                         "task": {"type": "worker", "index": i}}),
                shared_memory.ENV: "1"}, timeout=300)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.assertEqual(result.output.count("shared memory: 33 checks, 0 failed"), 4,
                         harness.describe(result))


if __name__ == "__main__":
    unittest.main()
