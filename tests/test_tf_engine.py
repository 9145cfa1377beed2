"""The tf engine (TensorFlow collective ops): argument errors, cluster discovery, and real jobs.

The jobs are real local processes: N plain processes with TF_CONFIG, or `horovodrun --gloo`
(the engine then swaps server addresses through horovodrun's rendezvous). Each job runs every
check of tests/workers/tf_engine_check.py against float64 NumPy references. N = 12 is where TF's
member order (device names sorted as strings: task:10 before task:2) differs from rank order;
N <= 10 has task indices 0-9 only, so the order never differs there; N = 12 also has rows and
columns of 2, 3, 4 and 6 ranks (6x2 ... 2x6), so no N = 6 job (its grids' rows and columns of 2
and 3 are there; every variant of a check runs at N = 4, and the Horovod engine's N = 6 job runs
every variant of the algorithms on rows of 3).
Two jobs SIGKILL a worker: the survivors must exit non-zero, in time, saying what happened.
"""
import json
import os
import re
import unittest
from unittest import mock

import numpy as np
import tensorflow as tf

import tftorus
from tests import harness
from tftorus.cluster import discovery, tf_runtime
from tftorus.engines import shared_memory
from tftorus.engines.tf_engine import EagerTimeouts, explain, tf_member_order
from tftorus.runtime import process_state, reduction, stack


class ArgumentErrorTest(tf.test.TestCase):

    def test_unknown_engine(self):
        with self.assertRaisesRegex(ValueError, "unknown engine 'nccl'.*'horovod'.*'tf'"):
            tftorus.init(engine="nccl")

    def test_tf_options_need_the_tf_engine(self):
        with self.assertRaisesRegex(ValueError, "collective_timeout only apply to engine='tf'"):
            tftorus.init(engine="horovod", collective_timeout=10)
        with self.assertRaisesRegex(ValueError, "tf_host, tf_port only apply"):
            tftorus.init(engine="horovod", tf_host="10.0.0.1", tf_port=9000)

    def test_process_sets_are_horovods_where_horovod_runs(self):
        # classic: Horovod's sets belong to its engine; current: the tf engine's own
        # (tftorus.horovod_api.process_sets), which take hvd.ProcessSet objects
        if tftorus.runtime.stack.HOROVOD:
            with self.assertRaisesRegex(ValueError, "process_sets are Horovod's"):
                tftorus.init(engine="tf", process_sets=[object()])
        else:
            with self.assertRaisesRegex(TypeError, "process_sets takes hvd.ProcessSet objects"):
                tftorus.init(engine="tf", process_sets=[object()])

    def test_bad_timeout(self):
        with self.assertRaisesRegex(ValueError, "collective_timeout must be > 0"):
            tftorus.init(engine="tf", collective_timeout=0)

    def test_after_tensorflow_started(self):
        tf.constant(1.0)  # TF's runtime now runs in this process
        saved, process_state._state = process_state._state, None  # other tests may have run init()
        two = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                          "task": {"type": "worker", "index": 0}})
        try:
            with mock.patch.dict(os.environ, {"TF_CONFIG": two}), \
                    mock.patch.object(discovery, "_discovered", None), \
                    mock.patch.object(tf_runtime, "_cluster", None):
                self.check_too_late()
            # started alone there is no cluster to join: init() goes ahead
            with mock.patch.dict(os.environ, {v: "" for v in discovery.LAUNCHER_VARIABLES}), \
                    mock.patch.object(discovery, "_discovered", None), \
                    mock.patch.object(tf_runtime, "_cluster", None):
                tftorus.init(engine="tf")
                self.assertEqual(tftorus.runtime.world.size(), 1)
        finally:
            process_state._state = saved

    def check_too_late(self):
        with self.assertRaisesRegex(RuntimeError, r"already started.*tftorus.init\("
                                                  r"engine='tf'\).*before any other"):
            tftorus.init(engine="tf")
        with self.assertRaisesRegex(RuntimeError, "already started"):
            tf_runtime.bootstrap()


class DiscoveryTest(tf.test.TestCase):

    def config(self, workers, index, task_type="worker", **extra):
        return json.dumps({"cluster": {"worker": workers, **extra},
                           "task": {"type": task_type, "index": index}})

    def test_tf_config(self):
        workers = ["hostA:2222", "hostA:2223", "hostB:2222", "localhost:1", "127.0.0.1:2"]
        c = discovery.from_tf_config(self.config(workers, 1), timeout=5)
        self.assertEqual((c.rank, c.size, c.local_rank, c.local_size), (1, 5, 1, 2))
        self.assertEqual(c.device, "/job:worker/replica:0/task:1/device:CPU:0")
        c = discovery.from_tf_config(self.config(workers, 4), timeout=5)
        self.assertEqual((c.local_rank, c.local_size), (1, 2))  # loopback names are one host

    def test_bad_tf_config(self):
        with self.assertRaisesRegex(ValueError, "TF_CONFIG must look like"):
            discovery.from_tf_config("{not json", timeout=5)
        with self.assertRaisesRegex(ValueError, "outside the 2 workers"):
            discovery.from_tf_config(self.config(["a:1", "b:1"], 2), timeout=5)
        with self.assertRaisesRegex(ValueError, "one job named 'worker'"):
            discovery.from_tf_config(self.config(["a:1"], 0, chief=["c:1"]), timeout=5)
        with self.assertRaisesRegex(ValueError, "not 'host:port'"):
            discovery.from_tf_config(self.config(["a"], 0), timeout=5)

    def test_member_order_is_device_name_string_order(self):
        device = lambda r: f"/job:worker/replica:0/task:{r}/device:CPU:0"  # noqa: E731
        self.assertEqual(tf_member_order((0, 1, 2, 10, 11), device), (0, 1, 10, 11, 2))
        self.assertEqual(tf_member_order((4, 10), device), (10, 4))
        self.assertEqual(tf_member_order((1, 3, 5), device), (1, 3, 5))

    def test_eager_timeouts_are_bounded_per_timeout_span(self):
        now = [0.0]
        timeouts = EagerTimeouts(300.0, limit=3, clock=lambda: now[0])
        self.assertEqual([timeouts.take() for _ in range(5)], [300.0, 300.0, 300.0, 0.0, 0.0])
        now[0] = 299.0
        self.assertEqual(timeouts.take(), 0.0)
        now[0] = 300.0  # the first three have let go of their threads
        self.assertEqual([timeouts.take() for _ in range(4)], [300.0, 300.0, 300.0, 0.0])

    def test_scaling_keeps_float64(self):
        x = np.array([1.0, 7.0])  # float64 times the float64 factor, rounded once
        self.assertAllEqual(reduction._scale(tf.constant(x), 1 / 3).numpy(), x * (1 / 3))
        self.assertAllEqual(reduction._finish(tf.constant(x), 1.0, 3).numpy(), x * (1 / 3))

    def test_explain(self):
        timeout = explain(tf.errors.DeadlineExceededError(
            None, None, "Collective has timed out waiting for other workers."), 30)
        self.assertIn("did not take part within the collective timeout of 30 s", timeout)
        self.assertIn("restart the job", timeout)
        gone = explain(tf.errors.UnavailableError(None, None, "Connection reset by peer"))
        self.assertIn("became unreachable", gone)


def _ok(test, result, checks_at_least=1):
    test.assertEqual(result.returncode, 0, harness.describe(result))
    test.assertFalse(result.timed_out, harness.describe(result))
    counts = [int(m) for m in re.findall(r"(\d+) checks, 0 failed", result.output)]
    test.assertTrue(counts and min(counts) >= checks_at_least, harness.describe(result))
    test.assertNotIn("MISMATCH", result.output)


class TFEngineJobsTest(tf.test.TestCase):
    """Each launch runs every check once; N = 12 runs fewer variants (--light: 2 cores)."""

    def run_check(self, np_, timeout, *extra):
        """np_ TF_CONFIG processes (four under horovodrun: tests/harness.four_rank_tf_suite)."""
        argv = [harness.worker("tf_engine_check.py"), "--timeout", "120", *extra]
        return harness.run_tf_config(argv, np_, timeout=timeout)

    def test_one_plain_process(self):
        result = harness.run([harness.worker("tf_engine_check.py")], timeout=120)
        _ok(self, result)
        self.assertIn("tf engine (single)", result.output)

    def test_two_ranks_tf_config(self):
        result = self.run_check(2, 180)
        _ok(self, result, 100)
        self.assertEqual(result.output.count("tf engine (TF_CONFIG)"), 2)

    @unittest.skipUnless(stack.HOROVOD, "the current stack has no horovodrun: "
                                        "test_four_ranks_tf_config runs the four ranks there")
    def test_four_ranks_horovodrun_rendezvous(self):
        # in the four-rank tf-engine world other tests share (tests/harness.four_rank_tf_suite)
        _, result = harness.four_rank_tf_suite()
        failure = harness.suite_report(result, "tf_engine_check", 4, harness.TF_SUITE)
        self.assertFalse(failure, failure)
        counts = [int(c) for c in re.findall(r"tf_engine_check: tf engine \(horovodrun\), "
                                             r".*?(\d+) checks, 0 failed", result.output)]
        self.assertEqual(len(counts), 4, harness.describe(result))
        self.assertGreaterEqual(min(counts), 100, harness.describe(result))

    @unittest.skipIf(stack.HOROVOD, "the classic stack runs the four ranks under horovodrun, "
                                    "in a world other tests share (test_four_ranks_horovodrun_"
                                    "rendezvous)")
    def test_four_ranks_tf_config(self):
        _ok(self, self.run_check(4, 300), 100)

    def test_twelve_ranks_task_name_order(self):
        result = self.run_check(12, 480, "--light")
        _ok(self, result, 100)
        differs = [int(k) for k in re.findall(r"order differs from rank order in (\d+)",
                                              result.output)]
        self.assertEqual(len(differs), 12, harness.describe(result))
        self.assertTrue(all(k > 0 for k in differs), "at N = 12 every rank is in the world "
                                                      "group, whose TF order is 0, 1, 10, 11, 2..")


class KilledWorkerTest(tf.test.TestCase):
    """A SIGKILLed worker: the others exit non-zero within the timeout, naming the cause."""

    def test_killed_mid_collective(self):
        timeout = 20
        result = harness.run_tf_config(
            [harness.worker("tf_engine_kill.py"), "--timeout", str(timeout), "--victim", "0"],
            np=4, timeout=180)
        self.assertFalse(result.timed_out, harness.describe(result))
        self.assertEqual(result.returncodes[0], -9, harness.describe(result))
        self.assertEqual(result.returncodes[1:], (3, 3, 3), harness.describe(result))
        failed = re.findall(r"FAILED after ([\d.]+)s .*: (tftorus tf engine: .*)", result.output)
        self.assertEqual(len(failed), 3, harness.describe(result))
        for seconds, message in failed:
            # killed ~2 s into the loop; a survivor notices at once or after the timeout (TF's
            # timer fired up to 8 s late while other jobs loaded this 2-core machine)
            self.assertLess(float(seconds), 2 + timeout + 15, harness.describe(result))
            # TF's own error (a server unreachable, its timeout) or the peer health monitor's
            # verdict when it came first, naming the victim
            self.assertRegex(message, "unreachable|collective timeout|peer check: rank 0 lost",
                             harness.describe(result))
            self.assertIn("restart the job", message, harness.describe(result))

    def test_dead_before_collective_times_out(self):
        timeout = 8
        result = harness.run_tf_config(
            [harness.worker("tf_engine_kill.py"), "--timeout", str(timeout), "--victim", "2",
             "--kill_before_first"], np=3, timeout=180,
            # the shared-memory handshake runs collectives inside init(); this rank must die
            # before its first (with it, a survivor hears "unreachable" at once, as above)
            env={shared_memory.ENV: "0"})
        self.assertFalse(result.timed_out, harness.describe(result))
        self.assertEqual(result.returncodes, (3, 3, -9), harness.describe(result))
        failed = re.findall(r"FAILED after ([\d.]+)s \(([\d.]+)s since init.*?: "
                            r"(tftorus tf engine: .*)", result.output)
        self.assertEqual(len(failed), 2, harness.describe(result))
        # rank 2 died between its init and its first collective, so a survivor sees one of:
        refused = r"peer check: rank 2 lost: .* refused \d+ probes in a row"  # it had answered
        # init's wait (no answer from it), TF's per-op timeout (eager collectives) or the
        # monitor's silence verdict: none before the timeout (TF's timer counts from the first
        # collective, init's and the monitor's from init())
        timed = (r"did not all come up: rank 2 \(.*, refused: not started or exited\) did not "
                 rf"answer within \d+ s|did not take part within the collective timeout of "
                 rf"{timeout} s|peer check: rank 2 lost: .* for \d+ s")
        for seconds, since_init, message in failed:
            self.assertLess(float(seconds), timeout + 15, message)
            self.assertRegex(message, f"{refused}|{timed}")
            if re.search(timed, message):
                waited = (float(since_init) if "peer check" in message or "come up" in message
                          else float(seconds))
                self.assertGreaterEqual(waited, timeout - 0.5, message)


if __name__ == "__main__":
    tf.test.main()
