"""The planner (tftorus/planning/planner.py) on synthetic links, the probe's fit (tftorus/planning/link_probe.py),
and both on real worlds: two loopback "hosts" on the tf engine, one host on Horovod's."""
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

from tests import harness
from tftorus.planning import cost_model as cm
from tftorus.planning import link_probe, planner
from tftorus.torus.grid import TorusGrid

MIB = 1 << 20
GB = 1e9
US = 1e-6
TF_ENGINE = planner.Engine(concurrent_groups=True)
HOROVOD_ENGINE = planner.Engine(concurrent_groups=False)


def resnet_like(total_mib: float = 48.0, count: int = 160):
    """`count` tensors, a few large and many small, like a CNN's gradients (forward order)."""
    sizes = [int(total_mib * MIB * w / sum(range(1, count + 1))) for w in range(1, count + 1)]
    return [(s - s % 2, "float16") for s in sizes]


def links(alpha_inter: float, gbytes_inter: float, lanes: float = 1.0) -> planner.Links:
    return planner.Links(intra=cm.Link(alpha=alpha_inter / 3, beta=1 / (4 * gbytes_inter * GB)),
                         inter=cm.Link(alpha=alpha_inter, beta=1 / (gbytes_inter * GB)),
                         lanes=lanes)


def even_profile(tensors, backward: float) -> planner.StepProfile:
    """Gradients ready from the last tensor to the first, evenly over the backward pass."""
    n = len(tensors)
    return planner.StepProfile(tuple(backward * (n - i) / n for i in range(n)), backward)


class PlannerTest(unittest.TestCase):
    def test_latency_bound_links_get_one_buffer_and_no_chunks(self):
        # 1 ms a message, 100 GB/s: every extra call costs more than its bytes
        p = planner.plan(64, 4, resnet_like(), links(1e-3, 100.0), TF_ENGINE)
        self.assertEqual(len(p.buckets), 1)
        self.assertEqual([b.chunks for b in p.buckets], [1])

    def test_bandwidth_bound_links_get_chunks_on_the_tf_engine_only(self):
        # no latency, a slow network: pipelined chunks let rows and columns run at once
        slow = links(0.0, 0.03)
        tf_plan = planner.plan(16, 4, resnet_like(), slow, TF_ENGINE)
        self.assertGreater(max(b.chunks for b in tf_plan.buckets), 1)
        hvd_plan = planner.plan(16, 4, resnet_like(), slow, HOROVOD_ENGINE)
        self.assertEqual({b.chunks for b in hvd_plan.buckets}, {1})
        self.assertLess(tf_plan.seconds, hvd_plan.seconds)

    def test_consecutive_torus_buckets_pipeline_as_one_on_the_tf_engine(self):
        class Phases:  # each torus phase as long as given, whatever its bytes
            def phase_seconds(self, algorithm, grid, nbytes):
                return [1.0, 2.0, 1.0] if algorithm == "torus" else [3.0]
        grid = TorusGrid(size=4, x=2)
        two = [("torus", 1.0, 1, 0.0), ("torus", 1.0, 1, 0.0)]
        # RS0 0-1, RS1 1-2 and AR0 1-3, AG0 3-4 beside AR1 3-5, AG1 5-6: the column waits for
        # no row phase between the buckets; one after the other they take 8
        self.assertEqual(planner.timeline(Phases(), grid, two, concurrent=True), 6.0)
        self.assertEqual(planner.timeline(Phases(), grid, two, concurrent=False), 8.0)
        # a ring bucket between them ends the pipeline: it holds both queues
        ring_between = [two[0], ("ring", 1.0, 1, 0.0), two[1]]
        self.assertEqual(planner.timeline(Phases(), grid, ring_between, concurrent=True), 11.0)
        # a bucket ready late starts the pipeline's row phase no earlier than it is ready
        late = [two[0], ("torus", 1.0, 1, 10.0)]
        self.assertEqual(planner.timeline(Phases(), grid, late, concurrent=True), 14.0)

    def test_an_engine_chunk_limit_cuts_the_torus_chunks_below_it(self):
        # a ms a call, 30 MB/s: the links alone favour a few long chunks
        slow = links(1e-3, 0.03)
        free = planner.plan(4, 2, resnet_like(), slow, TF_ENGINE)
        self.assertGreater(max(b.nbytes / b.chunks for b in free.buckets), 2 * MIB)
        capped_engine = dataclasses.replace(TF_ENGINE, max_bucket_bytes=32 * MIB,
                                            max_chunk_bytes=2 * MIB)
        capped = planner.plan(4, 2, resnet_like(), slow, capped_engine)
        for b in capped.buckets:
            if b.algorithm == "torus":
                self.assertLessEqual(b.nbytes / b.chunks, 2 * MIB)
        # a count the caller fixes is kept
        fixed = planner.plan(4, 2, resnet_like(), slow, capped_engine, chunks=2)
        self.assertEqual({b.chunks for b in fixed.buckets if b.algorithm == "torus"}, {2})

    def test_more_buckets_where_the_backward_pass_hides_them(self):
        tensors = resnet_like()
        slow = links(1e-6, 1.0)
        flat = planner.plan(64, 4, tensors, slow, HOROVOD_ENGINE)
        overlapped = planner.plan(64, 4, tensors, slow, HOROVOD_ENGINE,
                                  profile=even_profile(tensors, 0.05))
        self.assertEqual(len(flat.buckets), 1)
        self.assertGreater(len(overlapped.buckets), 1)
        self.assertLess(overlapped.exposed_seconds, flat.exposed_seconds)

    def test_the_last_ready_bucket_is_cut_finer_where_the_backward_pass_outlasts_it(self):
        tensors = resnet_like()
        slow = links(1e-6, 1.0)
        alone = planner.plan(64, 4, tensors, slow, HOROVOD_ENGINE).seconds
        long_backward = even_profile(tensors, 10 * alone)
        p = planner.plan(64, 4, tensors, slow, HOROVOD_ENGINE, profile=long_backward)
        self.assertIsNotNone(p.tail_threshold_bytes)
        self.assertIn("last-ready one in pieces of", p.describe())
        last = min(p.buckets, key=lambda b: min(b.indices))  # holds the first tensor
        self.assertLessEqual(last.nbytes, p.tail_threshold_bytes)
        self.assertLess(p.tail_threshold_bytes, p.threshold_bytes)
        # every tensor in exactly one bucket, each bucket of one dtype and in the caller's order
        self.assertEqual(sorted(i for b in p.buckets for i in b.indices), list(range(len(tensors))))
        self.assertTrue(all(list(b.indices) == sorted(b.indices) for b in p.buckets))
        # the same threshold without the re-cut leaves more past the backward pass
        uncut = planner.plan(64, 4, tensors, slow, HOROVOD_ENGINE, profile=long_backward,
                             threshold_bytes=p.threshold_bytes, grid=p.grid)
        self.assertIsNone(uncut.tail_threshold_bytes)
        self.assertLess(p.exposed_seconds, uncut.exposed_seconds * 0.5)
        # the pieces come in the order the backward pass makes them: the first tensor's last
        order = [min(b.indices) for b in p.buckets]
        self.assertEqual(order[-1], 0)
        self.assertEqual(planner.cut_buckets(tensors, 4 * MIB, 4 * MIB),
                         planner.bucket_indices(tensors, 4 * MIB))

    def test_the_first_ready_buckets_last_tensors_may_go_first(self):
        tensors = [(MIB, "float16")] * 64
        cut = planner.cut_buckets(tensors, 32 * MIB, head_bytes=4 * MIB)
        self.assertEqual(cut[0], tuple(range(60, 64)))  # ready first, sent first
        self.assertEqual(cut[1], tuple(range(32, 60)))
        self.assertEqual(cut[2], tuple(range(32)))
        # the link binds, calls cost (few buckets), and the first bucket is made late: its
        # head starts the link early
        slow = links(20e-3, 0.05)
        profile = even_profile(tensors, 0.5 * planner.plan(8, 4, tensors, slow,
                                                           HOROVOD_ENGINE).seconds)
        with_head = planner.plan(8, 4, tensors, slow, HOROVOD_ENGINE, profile=profile)
        self.assertIsNotNone(with_head.head_bytes)
        self.assertIn("first-ready one's first", with_head.describe())
        original = planner.HEAD_DIVISORS
        planner.HEAD_DIVISORS = (1,)
        try:
            without = planner.plan(8, 4, tensors, slow, HOROVOD_ENGINE, profile=profile)
        finally:
            planner.HEAD_DIVISORS = original
        self.assertIsNone(without.head_bytes)
        self.assertLess(with_head.exposed_seconds, without.exposed_seconds)

    def test_first_steps_are_planned_for_an_assumed_backward_pass(self):
        # before replan() there is no profile: one buffer would hide nothing
        tensors = resnet_like()
        slow = links(1e-6, 1.0)
        alone = planner.plan(64, 4, tensors, slow, HOROVOD_ENGINE)
        first = planner.first_plan(64, 4, tensors, slow, HOROVOD_ENGINE)
        self.assertEqual(len(alone.buckets), 1)
        self.assertGreater(len(first.buckets), 1)
        self.assertIn("backward passes of", first.describe())
        assumed = planner.assumed_profile(tensors, 2.0)
        self.assertAlmostEqual(assumed.ready[-1], 2.0 / len(tensors))  # the last layer first
        self.assertEqual(assumed.ready[0], 2.0)  # the first layer's gradient comes last
        self.assertEqual(list(assumed.ready), sorted(assumed.ready, reverse=True))
        # latency-bound links: still one buffer, as the step would hide little of more calls
        fast = planner.first_plan(64, 4, tensors, links(1e-3, 100.0), TF_ENGINE)
        self.assertEqual(len(fast.buckets), 1)

    def test_horovods_columns_in_turn_keep_buckets_small_on_rails_only(self):
        fast = links(1e-3, 100.0)  # latency-bound: alone, one buffer
        in_turn = dataclasses.replace(HOROVOD_ENGINE, columns_in_turn=True)
        one_link = planner.plan(64, 4, resnet_like(), fast, in_turn)
        self.assertEqual(len(one_link.buckets), 1)
        rails = planner.plan(64, 4, resnet_like(), dataclasses.replace(fast, lanes=4.0), in_turn)
        self.assertLessEqual(max(b.nbytes for b in rails.buckets),
                             planner.IN_TURN_MAX_BUCKET_BYTES)

    def test_one_host_runs_the_engines_all_reduce_without_chunks(self):
        p = planner.plan(8, 8, resnet_like(), links(0.0, 0.03), TF_ENGINE)
        self.assertEqual({(b.algorithm, b.chunks) for b in p.buckets}, {("ring", 1)})

    def test_what_the_caller_fixes_is_kept(self):
        grid = TorusGrid(size=64, x=8)
        p = planner.plan(64, 4, resnet_like(), links(0.0, 0.03), TF_ENGINE, grid=grid,
                         threshold_bytes=4 * MIB, algorithm="torus", chunks=2)
        self.assertEqual(p.grid, grid)
        self.assertEqual({(b.algorithm, b.chunks) for b in p.buckets}, {("torus", 2)})
        self.assertTrue(all(b.nbytes <= 4 * MIB or len(b.indices) == 1 for b in p.buckets))
        self.assertIn("fixed", p.why)

    def test_the_plan_is_exhaustive_over_its_candidates(self):
        """Against a brute force of every grid, threshold, algorithm and chunk count."""
        tensors = resnet_like(8.0, 40)
        lk = links(20 * US, 1.0, lanes=2)
        p = planner.plan(16, 4, tensors, lk, TF_ENGINE)
        costs = planner.ModelCosts(lk.cost_model(4), 4)
        best = float("inf")
        for x in (1, 2, 4, 8, 16):
            g = TorusGrid(size=16, x=x)
            algos = planner.candidate_algorithms(g, 4)
            for threshold in planner.THRESHOLDS:
                cut = threshold if threshold != planner.ONE_BUFFER else 8 * MIB
                total = 0.0
                for indices in planner.bucket_indices(tensors, cut):
                    n = sum(tensors[i][0] for i in indices)
                    total += min(costs.seconds(a, g, n, k, True) for a in algos
                                 for k in (planner.CHUNKS if a == "torus" else (1,)))
                best = min(best, total)
        self.assertLessEqual(p.seconds, best * (1 + planner.TIE_FRACTION) + 1e-12)
        self.assertEqual(planner.evaluate(p, costs, TF_ENGINE)[0], p.seconds)

    def test_plan_describes_itself_in_one_line(self):
        p = planner.plan(64, 4, resnet_like(), links(9.6 * US, 12.5), TF_ENGINE)
        text = p.describe()
        self.assertNotIn("\n", text)
        for word in ("grid", "bucket", "chunk", "links", "ms"):
            self.assertIn(word, text)

    def test_links_round_trip_through_their_spec(self):
        lk = links(9.6 * US, 12.5, lanes=2)
        back = planner.Links.parse(lk.spec())
        self.assertAlmostEqual(back.inter.alpha, lk.inter.alpha)
        self.assertAlmostEqual(back.inter.beta, lk.inter.beta)
        self.assertEqual(back.lanes, 2)
        gbit = planner.Links.parse("intra=0.1ms@8Gbit/s, inter=2 us @ 500 MB/s")
        self.assertAlmostEqual(gbit.intra.bandwidth / 1e9, 1.0)
        self.assertAlmostEqual(gbit.inter.bandwidth / 5e8, 1.0)

    def test_bad_links_say_what_to_write(self):
        for text in ("inter=1us@1GB/s", "intra=1us,inter=1us@1GB/s",
                     "intra=1us@0GB/s,inter=1us@1GB/s",
                     "intra=1us@1GB/s,inter=1us@1GB/s,lanes=0.5", "intra=1@1,inter=1us@1GB/s"):
            with self.assertRaises(planner.PlanError, msg=text) as ctx:
                planner.Links.parse(text)
            self.assertIn("TFTORUS_LINKS" if "lanes" not in text else "lanes", str(ctx.exception))


class ProbeFitTest(unittest.TestCase):
    def _timings(self, k_host, k_cols, intra, alone, crowded):
        out = []
        for level, k, (a, bw) in (("intra", k_host, intra), ("inter-alone", k_cols, alone),
                                  ("inter-all", k_cols, crowded)):
            for n in (link_probe.SMALL_BYTES, link_probe.LARGE_BYTES):
                out.append(link_probe.Timing(level, k, n,
                                             2 * (k - 1) * a + 2 * (k - 1) / k * n / bw))
        return out

    def test_fit_recovers_the_links_and_the_lanes(self):
        # hosts of 4, 8 hosts; one NIC per host: four ranks crossing share it
        lk = link_probe.fit(self._timings(4, 8, (3e-6, 50e9), (10e-6, 12e9), (10e-6, 3e9)), 4)
        self.assertAlmostEqual(lk.intra.alpha, 3e-6, delta=1e-9)
        self.assertAlmostEqual(lk.inter.bandwidth / 12e9, 1.0, places=6)
        self.assertAlmostEqual(lk.lanes, 1.0, places=6)
        rails = link_probe.fit(self._timings(4, 8, (3e-6, 50e9), (10e-6, 12e9), (10e-6, 12e9)), 4)
        self.assertAlmostEqual(rails.lanes, 4.0, places=6)

    def test_a_level_at_one_size_is_refused(self):
        t = [link_probe.Timing("intra", 4, 1024, 1e-3)]
        with self.assertRaises(planner.PlanError):
            link_probe.fit(t, 4)


class QuotaStallTest(unittest.TestCase):
    """A CPU quota's stalls, read around the probe: they mark the links and warn once."""

    def _tree(self, files):
        root = self.enterContext(tempfile.TemporaryDirectory())
        for path, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        return root

    def test_stalls_summed_over_the_cgroup_and_its_ancestors(self):
        v1 = self._tree({"cpu,cpuacct/pods/p1/cpu.stat": "nr_periods 10\nnr_throttled 4\n",
                         "cpu,cpuacct/pods/p1/c1/cpu.stat": "nr_periods 9\nnr_throttled 1\n"})
        self.assertEqual(link_probe.throttled_periods(
            "12:cpu,cpuacct:/pods/p1/c1\n3:memory:/elsewhere\n", v1), 5)
        os.symlink(os.path.join(v1, "cpu,cpuacct"), os.path.join(v1, "cpu"))  # counted once
        self.assertEqual(link_probe.throttled_periods("12:cpu,cpuacct:/pods/p1/c1\n", v1), 5)
        v2 = self._tree({"a/b/cpu.stat": "usage_usec 5\nnr_periods 3\nnr_throttled 2\n"})
        self.assertEqual(link_probe.throttled_periods("0::/a/b\n", v2), 2)
        self.assertIsNone(link_probe.throttled_periods("0::/a/b\n", v2 + "/missing"))


class ProbeJobTest(unittest.TestCase):
    def test_tf_engine_two_hosts_probe_plan_and_sum(self):
        """Four ranks as two hosts of two (127.0.0.1, 127.0.0.2): init() probes, every rank
        plans alike, the planned all-reduce equals NumPy's sum. Rank 3 reads a CPU quota's
        stalls during the probe: every rank's links say so, and rank 0 warns."""
        ports = harness.free_ports(4)
        workers = [f"127.0.0.{1 + i // 2}:{p}" for i, p in enumerate(ports)]
        result = harness.run_ranks(
            [harness.worker("planner_check.py")], 4,
            lambda i: {"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                                "task": {"type": "worker", "index": i}}),
                       "TFTORUS_ENGINE": "tf", "PLANNER_CHECK_STALLED_TASK": "3"}, timeout=240)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.assertEqual(result.output.count("planner: 12 checks, 0 failed"), 4,
                         harness.describe(result))
        self.assertIn("plan tftorus: grid", result.output)
        self.assertEqual(len(re.findall(r"\[rank \d\] links measured while a CPU quota stalled "
                                        r"1 of 4 ranks", result.output)), 4,
                         harness.describe(result))
        self.assertEqual(result.output.count("tftorus: a CPU quota (cgroup cpu.max / "
                                             "cpu.cfs_quota_us) stalled 1 of 4 ranks"), 1,
                         harness.describe(result))

    @unittest.skipUnless(harness.HOROVOD, "Horovod's engine: the classic stack")
    def test_horovod_engine_two_hosts_probe_plan_and_sum(self):
        """The same on Horovod's engine: horovodrun counts localhost and 127.0.0.1 as two hosts
        (HOROVOD_LOCAL_SIZE 2), both run here."""
        harness.refuse_in_quick_tier()
        runner = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        proc = subprocess.run(
            [runner, "--gloo", "-np", "4", "-H", "localhost:2,127.0.0.1:2", sys.executable,
             harness.worker("planner_check.py")], cwd=harness.ROOT, env=harness._env(),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
        self.assertEqual(proc.returncode, 0, proc.stdout[-4000:])
        self.assertEqual(proc.stdout.count("planner: 12 checks, 0 failed"), 4,
                         proc.stdout[-4000:])
        self.assertIn("plan tftorus: grid", proc.stdout)

if __name__ == "__main__":
    unittest.main()


class ReadinessClockTest(unittest.TestCase):
    def test_clocks_tell_when_each_tensor_was_made(self):
        """Two tensors made one after the other inside a tf.function, ~0.1 s of work apart:
        the clocks see the gap, and the later one's clock does not run early."""
        import numpy as np
        import tensorflow as tf

        from tftorus.runtime import gradient_readiness

        clock = gradient_readiness.Clock(2)
        m = tf.constant(np.random.RandomState(0).standard_normal((400, 400)).astype(np.float32))

        def work(x, n):
            for _ in range(n):
                x = tf.tanh(tf.matmul(x, m) / 20.0)
            return x

        @tf.function
        def step(x):
            first = work(x, 2)
            second = work(first, 120)
            clock.instrument([second, first])  # the optimizer's order: the earlier layer first
            return second

        step(m)  # traces
        start = tf.timestamp()
        step(m)
        ready, steps = clock.read()
        self.assertEqual(steps, 2)
        self.assertEqual(ready[1], 0.0)  # `first` is the first ready
        self.assertGreater(ready[0], 0.02)  # 120 matmuls later
        self.assertGreater(float(clock.stamps[1] - start), 0.0)


class GivenLinksTest(unittest.TestCase):
    """TFTORUS_LINKS at init(): the grid planned from them before any process set is made, and
    a malformed value refused before anything starts."""

    def test_the_grid_is_planned_from_given_links(self):
        from unittest import mock

        from tftorus.runtime import process_state
        rails = "intra=4us@257GB/s,inter=10.2us@46GB/s,lanes=8"
        with mock.patch.dict(os.environ, {planner.LINKS_ENV: rails}):
            grids = process_state._grids_for(256, 8, None, [], "tf")
        want = planner.plan(256, 8, [(process_state.GRID_PLAN_BYTES, "grid")],
                            planner.Links.parse(rails), TF_ENGINE).grid
        self.assertEqual(grids[0], want)
        with mock.patch.dict(os.environ, {planner.LINKS_ENV: rails}):  # a grid given wins
            self.assertEqual(process_state._grids_for(256, 8, "16x16", [], "tf")[0],
                             TorusGrid(size=256, x=16))

    def test_a_malformed_value_says_what_to_write(self):
        from unittest import mock

        from tftorus.runtime import process_state
        with mock.patch.dict(os.environ, {planner.LINKS_ENV: "inter=fast"}):
            with self.assertRaises(planner.PlanError) as ctx:
                process_state._grids_for(256, 8, None, [], "horovod")
        self.assertIn("intra=3.4us@50GB/s", str(ctx.exception))
