"""The emulated cluster's training step on the simulator (studies/simulated_step.py), in seconds.

Horovod's loop and the CSV reader are plain Python; the steps need SimGrid's Python bindings
(Debian: python3-simgrid) and skip without them. SimGrid allows one engine per process, so the
steps run on tests/test_simulated_cluster.py's platform (built once for every test file): its
'emu' cluster, 2 hosts x 2 ranks with one link each. No processes are started.
"""
import csv
import os
import subprocess
import sys
import tempfile
import unittest

from studies import simulated_cluster as sc
from studies import simulated_step as ss
from tests import test_simulated_cluster as tsc
from tftorus.planning import planner

SIMGRID = sc.load_simgrid()
NEEDS_SIMGRID = unittest.skipIf(SIMGRID is None, f"SimGrid missing: {sc.SIMGRID_MISSING}")


def seconds(nbytes: float) -> float:
    """A collective's cost for the loop's tests: 10 ms and 1 us a byte."""
    return 0.010 + nbytes * 1e-6


class HorovodLoopTest(unittest.TestCase):
    def test_each_cycle_fuses_what_is_ready_at_its_start(self):
        ready = [0.0, 0.0005, 0.0030, 0.0031, 0.5]
        rs = ss.horovod_responses(ready, [100, 200, 300, 400, 50], seconds, cycle=1e-3)
        self.assertEqual([r.indices for r in rs], [(0,), (1, 2, 3), (4,)])
        self.assertEqual([r.nbytes for r in rs], [100, 900, 50])
        # the second cycle waits for the first one's collective, not only for its tick
        self.assertAlmostEqual(rs[1].start, rs[0].end)
        self.assertAlmostEqual(rs[0].end, 0.0101)
        self.assertAlmostEqual(rs[1].end, 0.0101 + 0.0109)
        # idle, the loop ticks every cycle from its last start: the tick at or after 0.5 s
        self.assertGreaterEqual(rs[2].start, 0.5 - 1e-12)
        self.assertLess(rs[2].start, 0.5 + 1e-3)

    def test_idle_loop_takes_a_gradient_at_the_next_tick(self):
        (r,) = ss.horovod_responses([0.0025], [10], seconds, cycle=1e-3)
        self.assertAlmostEqual(r.start, 0.003)

    def test_buffers_of_at_most_the_threshold_in_backward_order(self):
        # all ready at once: the backward pass' order (the last tensors first), cut greedily;
        # a tensor above the threshold goes alone
        rs = ss.horovod_responses([0.0] * 4, [500, 40, 30, 50], seconds, cycle=1e-3,
                                  threshold=100)
        self.assertEqual([r.indices for r in rs], [(3, 2), (1,), (0,)])
        self.assertEqual([r.start for r in rs[1:]], [rs[0].end, rs[1].end])
        self.assertAlmostEqual(rs[-1].end, 3 * 0.010 + 620 * 1e-6)


class MwmsPacksTest(unittest.TestCase):
    def test_packs_close_once_above_the_size_in_backward_order(self):
        self.assertEqual(ss.mwms_packs([10, 20, 30, 40], 35), [(3,), (2, 1), (0,)])
        self.assertEqual(ss.mwms_packs([10, 20, 30, 40], 0), [(3, 2, 1, 0)])  # TF's default


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=("hosts", "ranks_per_host", "link_gbit", "wire",
                                               "repeat", "variant", "step_s", "allreduce_s",
                                               "model"))
        writer.writeheader()
        for row in rows:
            writer.writerow(dict(zip(writer.fieldnames, row)))


class StepsCsvTest(unittest.TestCase):
    def test_classic_file_one_case_per_wire(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "steps.csv")
            write_csv(path, [
                (2, 2, 0.25, "fp16", 0, "compute", 1.2, 0, "virtual"),
                (2, 2, 0.25, "fp16", 1, "compute", 1.4, 0, "virtual"),
                (2, 2, 0.25, "fp16", 0, "hvd", 3.0, 2.5, "virtual"),
                (2, 2, 0.25, "fp16", 1, "hvd", 3.2, 2.7, "virtual"),
                (2, 2, 0.25, "fp16", 0, "default", 2.3, 1.8, "virtual"),
                (2, 2, 0.25, "fp32", 0, "compute", 2.4, 0, "virtual"),
                (2, 2, 0.25, "fp32", 0, "hvd", 5.8, 4.8, "virtual"),
                (2, 2, 0.25, "fp32", 0, "hvd", 9.9, 9.9, "resnet50"),  # the CPU model: not ours
            ])
            cases = ss.read_steps_csv(path)
        self.assertEqual([(c.wire, c.stack) for c in cases], [("fp16", "classic"),
                                                              ("fp32", "classic")])
        fp16, fp32 = cases
        self.assertAlmostEqual(fp16.compute_s, 1.3)
        self.assertEqual(fp16.measured_of("hvd"), (3.1, 2.6))
        self.assertEqual(fp16.measured_of("default"), (2.3, 1.8))
        self.assertEqual(fp16.variants(), ("hvd", "default"))
        self.assertEqual(fp32.measured_of("hvd"), (5.8, 4.8))
        self.assertEqual(fp32.measured_of("default"), (None, None))

    def test_the_runs_logged_links_and_plans(self):
        plan = "grid 2x2, 5 buckets of 11.1/10.6/... MiB, 1 chunk each, torus"
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "steps.csv")
            write_csv(path, [(2, 2, 0.25, w, 0, v, 1.0, 0, "virtual")
                             for w in ("fp16", "fp32") for v in ("compute", "default")])
            with open(os.path.join(d, "ranks_2x2_0.25_fp16.log"), "w") as f:
                f.write("[0]   tftorus: link probe 1.12 s; links measured: ... (TFTORUS_LINKS="
                        "'intra=3490us@1.432GB/s,inter=2474us@0.03207GB/s,lanes=1.012' gives "
                        f"them without the probe)\n[0]   tftorus: {plan}; predicted 1.56e+03 "
                        "ms per all-reduce; links measured: ...\n[0]   tftorus: the step's "
                        "gradients come 103.3 ms apart, first to last (214 tensors); planning "
                        "their all-reduce for the step\n")
            fp16, fp32 = ss.read_steps_csv(path)
        self.assertEqual(fp16.run_links, "intra=3490us@1.432GB/s,inter=2474us@0.03207GB/s,"
                                         "lanes=1.012")
        self.assertEqual(fp16.run_plans, (plan,))
        self.assertAlmostEqual(fp16.run_clocked_span_s, 0.1033)
        self.assertEqual((fp32.run_links, fp32.run_plans, fp32.run_clocked_span_s),
                         (None, (), None))  # its wire's log is absent

    def test_current_file_mwms_joins_the_fp32_case(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "steps.csv")
            write_csv(path, [
                (2, 4, 0.25, "fp16", 0, "compute", 1.3, 0, "virtual"),
                (2, 4, 0.25, "fp16", 0, "default", 2.2, 1.7, "virtual"),
                (2, 4, 0.25, "fp32", 0, "mwms", 6.0, 4.9, "virtual"),
            ])
            cases = ss.read_steps_csv(path)
        self.assertEqual([(c.cluster, c.wire, c.stack) for c in cases],
                         [("2x4", "fp16", "current"), ("2x4", "fp32", "current")])
        self.assertEqual(cases[0].variants(), ("default",))  # no MWMS on a 16-bit wire
        self.assertEqual(cases[1].variants(), ("mwms", "default"))
        self.assertAlmostEqual(cases[1].compute_s, 1.3)  # the one --compute-s of the run
        self.assertEqual(cases[1].measured_of("mwms"), (6.0, 4.9))


@NEEDS_SIMGRID
class SimulatedStepTest(unittest.TestCase):
    """The step's limits on the simulated 2 x 2: compute much longer than the all-reduce leaves
    only what is ready last after it; compute next to nothing leaves the all-reduce alone."""

    PER_CALL, PER_COLLECTIVE = 0.005, 0.002

    @classmethod
    def setUpClass(cls):
        cls.cluster = ss.SimulatedCluster(tsc.platform(), "emu", cls.PER_CALL, cls.PER_COLLECTIVE)
        cls.tensors = ss.gradient_set("fp16")

    def case(self, compute: float, stack: str, wire: str = "fp16") -> dict:
        c = ss.Case(2, 2, 0.25, wire, stack, compute)
        return {p.variant: p for p in ss.predict(self.cluster, c)}

    def test_long_compute_leaves_the_last_bucket_and_the_update(self):
        compute = 1000.0
        for stack, engine in ss.STACK_ENGINES.items():
            with self.subTest(stack=stack):
                p, caps = ss.tftorus_plan(self.cluster, self.tensors, engine)
                last = p.buckets[-1]  # the buckets come in ready order: the first layers last
                self.assertIn(0, last.indices)
                alone = planner.timeline(self.cluster.costs, p.grid,
                                         [(last.algorithm, last.nbytes, last.chunks, 0.0)],
                                         caps.concurrent_groups)
                step = self.case(compute, stack)["default"].step_s
                # compute = forward + backward + update: the last bucket between the two
                self.assertAlmostEqual(step, compute + alone, delta=1e-9 * compute)
        # Horovod: the first layer's kernel and bias, the last cycle's only ring
        conv1 = self.tensors[0][0] + self.tensors[1][0]
        step = self.case(compute, "classic")["hvd"].step_s
        self.assertGreaterEqual(step, compute + self.cluster.ring_seconds(conv1) - 1e-9)
        self.assertLessEqual(step, compute + self.cluster.ring_seconds(conv1)
                             + ss.HOROVOD_CYCLE_SECONDS + 1e-9)

    def test_tiny_compute_leaves_the_all_reduce_alone(self):
        compute = ss.UPDATE_SECONDS + 1e-3  # a millisecond of forward and backward pass
        for stack in ss.STACKS:
            for variant, p in self.case(compute, stack, "fp32").items():
                with self.subTest(stack=stack, variant=variant):
                    network = p.alone_s - self.PER_CALL  # no call inside a traced step
                    self.assertGreater(network, 0.1)
                    self.assertGreaterEqual(p.step_s, network + ss.UPDATE_SECONDS - 1e-9)
                    self.assertLessEqual(p.step_s, network + compute + 1e-9)

    def test_mwms_sums_after_the_backward_pass(self):
        compute = 3.0
        p = self.case(compute, "current", "fp32")["mwms"]
        ring = self.cluster.ring_seconds(sum(b for b, _ in ss.gradient_set("fp32")))
        self.assertAlmostEqual(p.step_s, compute + ring)
        self.assertAlmostEqual(p.alone_s, ring + self.PER_CALL)
        # in packs of 16 MiB the first ones leave during the backward pass
        case = ss.Case(2, 2, 0.25, "fp32", "current", compute, (("mwms-pack16", None, None),))
        packed = {q.variant: q for q in ss.predict(self.cluster, case)}["mwms-pack16"]
        self.assertLess(packed.step_s, p.step_s - 1.0)
        self.assertGreater(packed.alone_s, p.alone_s)  # a collective's fixed cost per pack

    def test_overlap_hides_compute(self):
        # a backward pass as long as the all-reduce: every optimizer that sends early ends
        # before compute + all-reduce, MWMS (one ring after the backward pass) exactly there
        for stack in ss.STACKS:
            preds = self.case(3.0, stack, "fp32")
            for variant, p in preds.items():
                with self.subTest(stack=stack, variant=variant):
                    no_overlap = 3.0 + p.alone_s - self.PER_CALL
                    if variant == "mwms":
                        self.assertAlmostEqual(p.step_s, no_overlap)
                    else:
                        self.assertLess(p.step_s, no_overlap - 0.5)


class QuotedStepsTest(unittest.TestCase):
    """Every step docs/studies/emulated_step.md quotes (simulated_step.MEASURED: Horovod's
    optimizer, tftorus on both engines, MultiWorkerMirroredStrategy) predicted within 10 %, as
    the page says; a run of its own, for the 2 x 4 cluster the shared platform lacks."""

    @NEEDS_SIMGRID
    def test_every_quoted_step_within_ten_percent(self):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        run = subprocess.run([sys.executable, "-m", "studies.simulated_step"], cwd=root,
                             capture_output=True, text=True, timeout=600)
        self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
        self.assertIn("Worst step error", run.stdout)
        rows = [line for line in run.stdout.splitlines() if line.startswith("| 2x")]
        self.assertGreaterEqual(len(rows), len(ss.MEASURED))
        self.assertTrue(any("| mwms" in line for line in rows), "no MWMS row predicted")


if __name__ == "__main__":
    unittest.main()
