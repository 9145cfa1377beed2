"""The tf engine's lost-peer detection (tftorus/engines/peer_health.py): the verdicts on a fake clock,
and in real processes that a step's collectives cost no threads and that a stopped peer, which
no connection error reveals, still ends the others within the timeout."""
import re

import tensorflow as tf
from tensorflow.python.framework import errors

from tests import harness
from tftorus.engines import peer_health
from tftorus.engines.tf_engine import EAGER_TIMED_LIMIT


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Peers:
    """What each peer's probe does now: 'ok', 'refused', 'silent' or 'restarted'."""

    def __init__(self, **state):
        self.state = state

    def __call__(self, task, timeout_ms):
        self.longest_wait_ms = max(getattr(self, "longest_wait_ms", 0), timeout_ms)
        what = self.state[task]
        if what == "refused":
            raise errors.UnavailableError(None, None, "connection refused")
        if what == "silent":
            raise errors.DeadlineExceededError(None, None, "deadline exceeded")
        if what == "restarted":
            raise errors.FailedPreconditionError(None, None, "incarnation changed")


def monitor(peers: Peers, clock, timeout=30.0, sleep=None):
    aborted = []
    m = peer_health.PeerHealthMonitor(
        [1, 2], task_of=lambda r: f"t{r}", address_of=lambda r: f"host{r}:7000",
        timeout=timeout, interval=1.0, clock=clock, probe=peers, abort=aborted.append,
        sleep=sleep or (lambda seconds: setattr(clock, "now", clock.now + seconds)))
    return m, aborted


class VerdictTest(tf.test.TestCase):
    def test_refused_after_answering_is_lost_after_three_probes(self):
        clock, peers = FakeClock(), Peers(t1="ok", t2="ok")
        m, aborted = monitor(peers, clock)
        self.assertIsNone(m.check_once())
        peers.state["t2"] = "refused"
        for _ in range(peer_health.MISSES_WHEN_REFUSED - 1):
            clock.now += 1
            self.assertIsNone(m.check_once())
        clock.now += 1
        message = m.check_once()
        self.assertRegex(message, r"^tftorus peer check: rank 2 lost: its TF server "
                                  r"\(host2:7000\) refused 3 probes in a row")
        self.assertEqual(aborted, [message])

    def test_one_answer_between_refusals_starts_the_count_again(self):
        clock, peers = FakeClock(), Peers(t1="ok", t2="ok")
        m, aborted = monitor(peers, clock)
        m.check_once()
        for state in ("refused", "refused", "ok", "refused", "refused"):
            peers.state["t2"] = state
            clock.now += 1
            self.assertIsNone(m.check_once(), state)
        self.assertEqual(aborted, [])

    def test_silent_peer_is_lost_after_the_timeout_since_its_last_answer(self):
        clock, peers = FakeClock(), Peers(t1="ok", t2="ok")
        m, aborted = monitor(peers, clock, timeout=30)
        m.check_once()
        peers.state["t1"] = "silent"
        clock.now += 29.5
        self.assertIsNone(m.check_once())
        clock.now += 1
        self.assertRegex(m.check_once(), r"rank 1 lost: .* answered no probe for 30 s \(the "
                                         r"collective timeout is 30 s")
        self.assertEqual(len(aborted), 1)

    def test_a_peer_not_yet_up_gets_the_timeout_from_start(self):
        clock, peers = FakeClock(), Peers(t1="refused", t2="ok")
        m, aborted = monitor(peers, clock, timeout=30)
        for _ in range(29):  # refusals before a first answer: still starting
            clock.now += 1
            self.assertIsNone(m.check_once())
        clock.now += 1
        self.assertRegex(m.check_once(), r"rank 1 lost: .* never answered a probe since "
                                         r"start-up for 30 s")

    def test_start_up_waits_until_every_peer_answers(self):
        clock, peers = FakeClock(), Peers(t1="refused", t2="ok")

        def sleep(seconds):  # peer 1's server comes up 5 s after the monitor's start
            clock.now += seconds
            if clock.now >= 105:
                peers.state["t1"] = "ok"
        m, aborted = monitor(peers, clock, timeout=30, sleep=sleep)
        self.assertIsNone(m.wait_until_up())
        self.assertAlmostEqual(clock.now, 105, delta=peer_health.START_POLL)
        self.assertEqual(aborted, [])  # waiting aborts nothing
        self.assertIsNone(m.check_once())

    def test_start_up_names_the_peers_that_never_answered(self):
        clock, peers = FakeClock(), Peers(t1="refused", t2="silent")
        m, aborted = monitor(peers, clock, timeout=30)
        message = m.wait_until_up()
        self.assertRegex(message, r"^rank 1 \(host1:7000, refused: not started or exited\), "
                                  r"rank 2 \(host2:7000, silent\) did not answer within 30 s "
                                  r".*TFTORUS_TF_TIMEOUT \(now 30 s\)")
        self.assertEqual(aborted, [])

    def test_restarted_peer_is_lost_at_once(self):
        clock, peers = FakeClock(), Peers(t1="ok", t2="restarted")
        m, aborted = monitor(peers, clock)
        self.assertRegex(m.check_once(), r"rank 2 lost: .* restarted")
        self.assertIsNone(m.check_once())  # aborted once only
        self.assertEqual(len(aborted), 1)

    def test_which_peers_are_probed(self):
        self.assertEqual(peer_health.peers_to_probe(2, 4, [(0, 1, 2, 3), (2, 3), (0, 2)]),
                         [0, 1, 3])
        # 128 ranks on a 16 x 8 grid: rank 17's row (16-31), column (1, 17, 33, ...), and the
        # world's ring neighbours 16 and 18; not the world group itself
        size, x = 128, 16
        rows = [tuple(range(r * x, (r + 1) * x)) for r in range(size // x)]
        cols = [tuple(range(c, size, x)) for c in range(x)]
        peers = peer_health.peers_to_probe(17, size, rows + cols + [tuple(range(size))])
        self.assertEqual(peers, sorted((set(range(16, 32)) | set(range(1, size, x))) - {17}))

    def test_a_probe_waits_briefly(self):
        """TF's probe holds the GIL while it waits: every Python thread stops that long."""
        peers, clock = Peers(t1="silent", t2="ok"), FakeClock()
        m, _ = monitor(peers, clock, timeout=300.0)
        m.check_once()
        self.assertLessEqual(peers.longest_wait_ms, peer_health.PROBE_TIMEOUT * 1000)

    def test_interval(self):
        self.assertEqual(peer_health.probe_interval(300), 5.0)
        self.assertEqual(peer_health.probe_interval(8), 0.8)
        self.assertEqual(peer_health.probe_interval(1), 0.5)


class RealPeersTest(tf.test.TestCase):
    def test_collectives_take_few_threads(self):
        result = harness.run_tf_config([harness.worker("thread_count.py")], np=2, timeout=180)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        grown = [int(g) for g in re.findall(r"threads grew by (-?\d+) over 1000 collectives",
                                             result.output)]
        self.assertEqual(len(grown), 2, harness.describe(result))
        for g in grown:  # TF's per-op timeout would add 2 threads per collective: 2000
            self.assertLess(g, 50, harness.describe(result))
        eager = [int(g) for g in re.findall(r"threads grew by (-?\d+) over 1000 eager",
                                            result.output)]
        self.assertEqual(len(eager), 2, harness.describe(result))
        for g in eager:  # at most EAGER_TIMED_LIMIT calls hold TF's 2 threads each
            self.assertLess(g, 2 * EAGER_TIMED_LIMIT + 50, harness.describe(result))

    def test_a_rank_that_starts_late_joins(self):
        """Without the start-up wait, a probe refused before the late rank listened left gRPC's
        channel backing off, and the first collective's fail-fast data call aborted both."""
        result = harness.run_tf_config([harness.worker("late_start.py"), "--late", "1",
                                        "--delay", "3"], np=2, timeout=180,
                                       env={"TFTORUS_TF_TIMEOUT": "30"})
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.assertEqual(len(re.findall(r"gathered \[0\.0, 1\.0\]", result.output)), 2,
                         harness.describe(result))

    def test_a_stopped_peer_ends_the_others_within_the_timeout(self):
        timeout = 8
        result = harness.run_tf_config(
            [harness.worker("tf_engine_kill.py"), "--timeout", str(timeout), "--victim", "1",
             "--stop"], np=3, timeout=180, after_a_failure=3)
        self.assertEqual(result.returncodes[0], 3, harness.describe(result))
        self.assertEqual(result.returncodes[2], 3, harness.describe(result))
        failed = re.findall(r"FAILED after ([\d.]+)s .*: (tftorus tf engine: .*)", result.output)
        self.assertEqual(len(failed), 2, harness.describe(result))
        for seconds, message in failed:  # stopped ~2 s into the loop
            self.assertLess(float(seconds), 2 + timeout + 15, message)
            self.assertRegex(message, r"a peer was lost.*restart the job.*rank 1 lost: .* "
                                      r"answered no probe for \d+ s")


if __name__ == "__main__":
    tf.test.main()
