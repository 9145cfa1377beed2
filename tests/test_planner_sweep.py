"""The planner against the simulator (studies/planner_sweep.py) on 16 simulated ranks.

The quick sweep's machinery on a small cluster: SimulatedCosts (phases interpolated in bytes
between two simulated sizes), the simulated link probe, planner.plan on the probe's links judged
by planner.evaluate against the exhaustive best on simulated costs. Needs SimGrid's Python
bindings (Debian: python3-simgrid); skips without them. SimGrid allows one engine per process,
so this test simulates on tests/test_simulated_cluster.py's platform (built once for both): its
'flat' cluster, 4 hosts x 4 ranks with one NIC each. No processes are started.
"""
import contextlib
import io
import unittest

from studies import planner_sweep as ps
from studies import simulated_cluster as sc
from studies import step_profile
from tests import test_simulated_cluster as tsc
from tftorus.torus.grid import TorusGrid

SIMGRID = sc.load_simgrid()
NEEDS_SIMGRID = unittest.skipIf(SIMGRID is None, f"SimGrid missing: {sc.SIMGRID_MISSING}")


@NEEDS_SIMGRID
class PlannerSweepTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tensors = ps.tensor_sets(("fp16",))
        cls.rows, cls.checked, _ = ps.sweep_worlds(tsc.platform(), ["flat"], (16,),
                                                   ("compact",), cls.tensors,
                                                   profile=step_profile.resnet50_profile())

    def test_every_engine_has_a_row(self):
        self.assertEqual(sorted(r.engine for r in self.rows), sorted(ps.ENGINES))

    def test_planner_within_three_percent_of_the_best(self):
        for r in self.rows:
            with self.subTest(engine=r.engine):
                self.assertLessEqual(r.best.seconds, r.planner.seconds * (1 + 1e-9))
                self.assertLessEqual(r.miss, ps.WITHIN,
                                     f"planner {r.planner.what} {r.planner.seconds * 1e3:.3f} ms, "
                                     f"best {r.best.what} {r.best.seconds * 1e3:.3f} ms")
                # the exhaustive search also beats the rules it replaces
                self.assertLessEqual(r.best.seconds, r.fixed.seconds * (1 + 1e-9))
                self.assertLessEqual(r.best.seconds, r.paper.seconds * (1 + 1e-9))

    def test_training_step_with_the_profile(self):
        for r in self.rows:
            s = r.step
            with self.subTest(engine=r.engine):
                self.assertIsNotNone(s)
                self.assertLessEqual(s.best.seconds, s.paper.seconds * (1 + 1e-9))
                self.assertLessEqual(s.miss("profiled"), ps.WITHIN,
                                     f"planner after replan {s.profiled.what} "
                                     f"{s.profiled.seconds * 1e3:.3f} ms, best {s.best.what} "
                                     f"{s.best.seconds * 1e3:.3f} ms")
                self.assertGreaterEqual(s.best.seconds, s.compute)
                # the one buffer is ready when the backward pass ends: nothing of it is hidden
                self.assertAlmostEqual(s.paper.seconds, s.compute + r.paper.seconds)

    def test_first_plan_hedge_table(self):
        # the worst first-step row's table: five bucket sizes, each no better than the best
        # plan under every assumed backward pass (a regret >= 1)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            ps.print_first_plan_hedge(self.rows, self.tensors, step_profile.resnet50_profile())
        lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("| ")]
        self.assertEqual(len(lines), 1 + 5, out.getvalue())
        worst = [float(ln.split("|")[4]) for ln in lines[1:]]
        self.assertTrue(all(w >= 1.0 - 1e-9 for w in worst), worst)
        self.assertIn("### Why the first steps miss most at flat compact 16", out.getvalue())

    def test_interpolation_matches_direct_simulation(self):
        self.assertTrue(self.checked)
        self.assertEqual({c[5] for c in self.checked}, set(ps.CHECK_BYTES))
        for cluster, how, size, a, g, n, t_lin, t_sim in self.checked:
            with self.subTest(algorithm=a, grid=str(g), nbytes=n):
                self.assertAlmostEqual(t_lin / t_sim, 1.0, delta=0.02)

    def test_costs_pipeline_chunks_on_the_concurrent_engine_only(self):
        world = ps.World(ps.Batch(tsc.platform()), "flat", tsc.FLAT, 16, "compact")
        costs = ps.SimulatedCosts(world)
        grid = TorusGrid(size=16, x=4)
        nbytes = 8 * ps.MIB
        one = costs.seconds("torus", grid, nbytes, 1, True)
        phases = costs.phase_seconds("torus", grid, nbytes / 4)
        self.assertAlmostEqual(costs.seconds("torus", grid, nbytes, 4, False), 4 * sum(phases))
        piped = costs.seconds("torus", grid, nbytes, 4, True)
        self.assertLess(piped, 4 * sum(phases))
        self.assertAlmostEqual(one, sum(costs.phase_seconds("torus", grid, nbytes)))
        # the ring ignores the grid
        self.assertEqual(costs.seconds("ring", grid, nbytes, 1, True),
                         costs.seconds("ring", TorusGrid(size=16, x=2), nbytes, 1, True))


if __name__ == "__main__":
    unittest.main()
