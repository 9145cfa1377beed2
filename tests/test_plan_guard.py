"""The plan guard (tftorus/runtime/plan_guard.py) and the link probe on a busy CPU
(tftorus/planning/link_probe.py): their rules on given numbers, then on real worlds of two
loopback "hosts": a plan made slow on purpose is replaced by the fixed torus (and kept with the
guard off), and a probe with one rank stopped over and over still plans like a quiet one."""
import dataclasses
import json
import os
import subprocess
import sys
import unittest
from unittest import mock

from tests import harness
from tftorus.planning import cost_model as cm
from tftorus.planning import link_probe, planner
from tftorus.runtime import plan_guard
from tftorus.torus.grid import TorusGrid

MIB = 1 << 20
GRID = TorusGrid(size=4, x=2)
LINKS = planner.Links(intra=cm.Link(alpha=5e-6, beta=1 / 10e9),
                      inter=cm.Link(alpha=20e-6, beta=1 / 1e9))
ENGINE = planner.Engine(concurrent_groups=True)


def layout(*buckets, profile=None) -> planner.Plan:
    """A costed plan of buckets given as (tensor indices, MiB, algorithm, chunks)."""
    return planner.layout_plan(GRID, 16 * MIB, [(ix, int(mib * MIB), a, k)
                                                for ix, mib, a, k in buckets],
                               LINKS, 2, ENGINE, profile)


class GuardRulesTest(unittest.TestCase):
    def test_the_plan_stays_unless_another_is_faster_by_the_margin(self):
        plan = plan_guard.Candidate("the plan", layout(((0, 1), 8, "ring", 1)))
        fixed = plan_guard.Candidate("the fixed torus", layout(((0, 1), 8, "torus", 1)))
        self.assertEqual(plan_guard.decide([plan, fixed], [1.00, 0.98]), 0)  # noise
        self.assertEqual(plan_guard.decide([plan, fixed], [1.00, 0.90]), 1)
        self.assertEqual(plan_guard.decide([plan, fixed], [0.50, 0.90]), 0)

    def test_predicted_hiding_counts_for_the_plan_that_hides(self):
        """With the step's clocks, small buckets that the backward pass hides are judged by
        what stays exposed, not by their all-reduce alone."""
        profile = planner.StepProfile((0.008, 0.004), 0.01)  # tensor 1 ready first, 0 last
        hiding = plan_guard.Candidate("plan", layout(((1,), 4, "torus", 1),
                                                     ((0,), 4, "torus", 1), profile=profile))
        one = plan_guard.Candidate("fixed", layout(((0, 1), 8, "torus", 1), profile=profile))
        more = hiding.predicted_hidden - one.predicted_hidden
        self.assertGreater(more, 0.001)
        # slower alone by less than it hides: kept; by more: replaced
        self.assertEqual(plan_guard.decide([hiding, one], [0.02 + more / 2, 0.02]), 0)
        self.assertEqual(plan_guard.decide([hiding, one], [0.02 + 2 * more, 0.02]), 1)

    def test_candidates_that_run_alike_are_timed_once(self):
        a = layout(((0, 1), 8, "torus", 2))
        b = layout(((0, 1), 8, "torus", 2))
        c = layout(((0, 1), 8, "torus", 4))
        names = [x.name for x in plan_guard.distinct([plan_guard.Candidate("a", a),
                                                      plan_guard.Candidate("b", b),
                                                      plan_guard.Candidate("c", c)])]
        self.assertEqual(names, ["a", "c"])

    def test_what_the_planner_chose_between_is_timed_beside_the_plan(self):
        """Each choice the planner made (buckets, leaving the torus) and the fixed rules' chunk
        pipeline has a candidate without it; what the user fixed has none."""
        from tftorus.runtime import reduction
        rules = layout(((0, 1), 16, "torus", 4))
        unpipelined = layout(((0, 1), 16, "torus", 1))
        asked = []

        def make(**change):
            asked.append(change)
            return layout(((0, 1), 16, "torus", 2))

        plan = layout(((0,), 4, "ring", 1), ((1,), 12, "torus", 4))
        names = [c.name for c in reduction._candidates(plan, rules, unpipelined, make,
                                                        reduction.TorusOptions())]
        self.assertEqual(names, ["the plan", "the fixed 16 MiB torus",
                                 "the fixed 16 MiB torus without chunks",
                                 "16 MiB buckets as planned", "the planned torus"])
        self.assertEqual(asked, [{"threshold_bytes": 16 * MIB}, {"algorithm": "torus"}])
        asked.clear()
        fixed = reduction.TorusOptions(algorithm="torus", fusion_threshold_bytes=16 * MIB,
                                       pipeline_chunks=4)
        names = [c.name for c in reduction._candidates(plan, rules, unpipelined, make, fixed)]
        self.assertEqual((names, asked), (["the plan", "the fixed 16 MiB torus"], []))

    def test_a_clear_loser_is_timed_once_and_a_close_pair_more(self):
        """The rounds a choice costs: those far behind after one call are timed no more, a
        clear choice ends after one round, a close pair is timed until MAX_ROUNDS."""
        four = [plan_guard.Candidate(n, layout(((0, 1), 8, "torus", k)))
                for n, k in (("plan", 1), ("fixed", 4), ("unchunked", 2), ("as planned", 8))]
        # the quota's 2 x 4 FP32 trial: plan 6.06 s, fixed 7.23, the torus without chunks 4.22
        one_round = [[6.06], [7.23], [4.22], [4.40]]
        self.assertEqual(plan_guard.contenders(four, one_round, [0, 1, 2, 3]), [2, 3])
        # one within DROP of the leader's call: decided after one round
        self.assertEqual(plan_guard.contenders(four, [[6.06], [7.23], [4.22], [5.40]],
                                               [0, 1, 2, 3]), [])
        # stalls only add: a slow call does not drop a candidate whose fastest call is close
        self.assertEqual(plan_guard.contenders(four, [[6.06], [7.23], [4.22, 4.30],
                                                      [6.50, 4.30]], [2, 3]), [2, 3])
        # after ROUNDS: the best two while within CLOSE; the third is done even if close
        close = [[6.0] * 3, [4.30, 4.25, 4.28], [4.20, 4.22, 4.21], [4.26, 4.27, 4.29]]
        self.assertEqual(plan_guard.contenders(four, close, [0, 1, 2, 3]), [2, 3])
        apart = [c[:] for c in close]
        apart[3] = [4.60, 4.61, 4.62]
        apart[1] = [4.70, 4.71, 4.72]
        self.assertEqual(plan_guard.contenders(four, apart, [1, 2, 3]), [])
        settled = [c + c[:2] for c in close]  # MAX_ROUNDS calls
        self.assertEqual(len(settled[2]), plan_guard.MAX_ROUNDS)
        self.assertEqual(plan_guard.contenders(four, settled, [2, 3]), [])

    def test_what_a_candidate_hides_keeps_it_timed(self):
        """A plan whose buckets hide is not dropped for summing slower by less than it hides."""
        profile = planner.StepProfile((0.008, 0.004), 0.01)
        hiding = plan_guard.Candidate("plan", layout(((1,), 4, "torus", 1),
                                                     ((0,), 4, "torus", 1), profile=profile))
        one = plan_guard.Candidate("fixed", layout(((0, 1), 8, "torus", 1), profile=profile))
        more = hiding.predicted_hidden - one.predicted_hidden
        slow = 0.02 + plan_guard.DROP * 0.02 + more / 2  # past DROP alone, not after hiding
        self.assertEqual(plan_guard.contenders([hiding, one], [[slow], [0.02]], [0, 1]),
                         [0, 1])
        self.assertEqual(plan_guard.contenders([hiding, one], [[slow + more], [0.02]],
                                               [0, 1]), [])

    def test_a_bad_setting_says_what_to_write(self):
        with mock.patch.dict(os.environ, {plan_guard.GUARD_ENV: "maybe"}):
            with self.assertRaisesRegex(ValueError, "set 1 .* or 0"):
                plan_guard.enabled()
        with mock.patch.dict(os.environ, {plan_guard.GUARD_ENV: "0"}):
            self.assertFalse(plan_guard.enabled())


class ProbeRulesTest(unittest.TestCase):
    def test_rounds_go_on_while_a_best_still_falls(self):
        self.assertTrue(link_probe.steady([1.0, 2.0], [0.95, 2.0]))
        self.assertFalse(link_probe.steady([1.0, 2.0], [0.85, 2.0]))
        self.assertTrue(link_probe.steady([float("inf"), 2.0], [0.5, 2.0]))  # first round

    def test_the_in_host_link_is_never_slower_than_across(self):
        slow_inside = planner.Links(intra=cm.Link(alpha=50e-6, beta=1 / 0.04e9),
                                    inter=cm.Link(alpha=20e-6, beta=1 / 0.03e9),
                                    source="measured")
        self.assertIs(link_probe.bounded_by_inter(LINKS), LINKS)
        bounded = link_probe.bounded_by_inter(dataclasses.replace(
            slow_inside, intra=cm.Link(alpha=50e-6, beta=1 / 0.02e9)))
        self.assertEqual(bounded.intra, bounded.inter)
        self.assertIn("in-host link taken as fast as across", bounded.source)
        latency_only = link_probe.bounded_by_inter(slow_inside)
        self.assertEqual(latency_only.intra.alpha, 20e-6)
        self.assertEqual(latency_only.intra.beta, 1 / 0.04e9)

    def test_cpu_wait_reads_this_process(self):
        got = link_probe.cpu_wait()
        if got is None:
            self.skipTest("no /proc/self/task/*/schedstat here")
        ran, waited = got
        self.assertGreater(ran, 0)
        self.assertGreaterEqual(waited, 0)


def two_hosts_tf_config(i: int, workers) -> dict:
    return {"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                     "task": {"type": "worker", "index": i}}),
            "TFTORUS_ENGINE": "tf"}


#: Links that make init() plan without probing (the guard's workers plan from them).
GIVEN_LINKS = "intra=20us@1GB/s,inter=40us@0.5GB/s,lanes=1"


class GuardJobTest(unittest.TestCase):
    """tests/workers/plan_guard_check.py on four ranks as two hosts of two."""

    def check(self, output: str) -> None:
        self.assertEqual(output.count("plan guard: 3 checks, 0 failed"), 4, output[-6000:])
        # rank 0 says so once per guarded trace: the loop, the fit's first step, after replan()
        switched = output.count("the plan is slower here: running ")
        self.assertGreaterEqual(switched, 3, output[-6000:])

    def test_tf_engine(self):
        ports = harness.free_ports(4)
        workers = [f"127.0.0.{1 + i // 2}:{p}" for i, p in enumerate(ports)]
        result = harness.run_ranks(
            [harness.worker("plan_guard_check.py")], 4,
            lambda i: {**two_hosts_tf_config(i, workers), "TFTORUS_LINKS": GIVEN_LINKS},
            timeout=300)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.check(result.output)

    @unittest.skipUnless(harness.HOROVOD, "Horovod's engine: the classic stack")
    def test_horovod_engine(self):
        runner = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        env = {**harness._env(), "TFTORUS_LINKS": GIVEN_LINKS}
        proc = subprocess.run(
            [runner, "--gloo", "-np", "4", "-H", "localhost:2,127.0.0.1:2", sys.executable,
             harness.worker("plan_guard_check.py")], cwd=harness.ROOT, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout[-6000:])
        self.check(proc.stdout)


class StalledProbeJobTest(unittest.TestCase):
    def test_a_rank_stopped_over_and_over_plans_like_a_quiet_world(self):
        """tests/workers/probe_stall_check.py: rank 1 SIGSTOPped 20 ms of every 80 during the
        second probe; its plan judged on the quiet links within 10 % of the quiet plan."""
        ports = harness.free_ports(4)
        workers = [f"127.0.0.{1 + i // 2}:{p}" for i, p in enumerate(ports)]
        result = harness.run_ranks(
            [harness.worker("probe_stall_check.py")], 4,
            lambda i: two_hosts_tf_config(i, workers), timeout=300)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.assertEqual(result.output.count("probe stall: 3 checks, 0 failed"), 4,
                         harness.describe(result))
        self.assertIn("[rank 1] stopped", result.output)


if __name__ == "__main__":
    unittest.main()
