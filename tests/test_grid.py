"""The torus geometry and the planner: pure Python, no collectives."""
import tensorflow as tf

from tftorus.torus import grid as G


class GridTest(tf.test.TestCase):

    def test_rank_layout_rows_are_contiguous(self):
        g = G.TorusGrid(size=6, x=3)  # 2 rows of 3
        self.assertEqual(g.y, 2)
        self.assertEqual(g.rows(), ((0, 1, 2), (3, 4, 5)))
        self.assertEqual(g.cols(), ((0, 3), (1, 4), (2, 5)))
        self.assertEqual((g.row_of(4), g.col_of(4)), (1, 1))
        self.assertEqual(g.row_group(4), (3, 4, 5))
        self.assertEqual(g.col_group(4), (1, 4))
        self.assertEqual(str(g), "2x3")

    def test_every_rank_in_exactly_one_row_and_one_column(self):
        for n in (1, 2, 6, 8, 12):
            for x in G.divisors(n):
                g = G.TorusGrid(size=n, x=x)
                self.assertCountEqual([r for row in g.rows() for r in row], range(n))
                self.assertCountEqual([r for col in g.cols() for r in col], range(n))

    def test_sequential_steps_match_the_paper(self):
        g = G.TorusGrid(size=3456, x=72)  # 48 x 72
        self.assertEqual(g.sequential_steps, 2 * 71 + 2 * 47)  # 236, against a ring's 6910
        self.assertEqual(g.sequential_steps, 236)

    def test_paper_table4_grids(self):
        for n, (y, x) in G.PAPER_GRIDS.items():
            g = G.resolve_grid("paper", n)
            self.assertEqual((g.y, g.x), (y, x))
            self.assertEqual(G.resolve_grid(f"{y}x{x}", n), g)

    def test_planner_reproduces_table4_where_most_square(self):
        # With 4 GPUs per node (ABCI), the planner picks the paper's grid for 1024, 2048, 2176
        # and 4096; for 3456 the most square grid is 54x64 where the paper used 48x72.
        for n in (1024, 2048, 2176, 4096):
            self.assertEqual(G.plan_grid(n, local_size=4), G.resolve_grid("paper", n), n)
        self.assertEqual(str(G.plan_grid(3456, local_size=4)), "54x64")

    def test_planner_small_worlds(self):
        self.assertEqual(str(G.plan_grid(4)), "2x2")
        self.assertEqual(str(G.plan_grid(8)), "2x4")
        self.assertEqual(str(G.plan_grid(6)), "2x3")
        self.assertEqual(str(G.plan_grid(1)), "1x1")
        self.assertEqual(str(G.plan_grid(24)), "4x6")
        self.assertEqual(str(G.plan_grid(24, local_size=8)), "3x8")  # rows are whole nodes
        self.assertEqual(str(G.plan_grid(4, local_size=4)), "2x2")  # one node: just square

    def test_prime_world_degrades_to_one_row_with_a_warning(self):
        with self.assertLogs("tftorus.torus.grid", level="WARNING") as logs:
            g = G.plan_grid(7)
        self.assertEqual(str(g), "1x7")
        self.assertIn("prime", logs.output[0])

    def test_grids_that_do_not_fit_are_clear_errors(self):
        with self.assertRaisesRegex(G.GridError, "has 9 ranks but the world has 4"):
            G.resolve_grid("3x3", 4)
        with self.assertRaisesRegex(G.GridError, r"does not divide the world of 6.*\[1, 2, 3, 6\]"):
            G.resolve_grid(4, 6)
        with self.assertRaisesRegex(G.GridError, "not of the form"):
            G.resolve_grid("2by2", 4)
        with self.assertRaisesRegex(G.GridError, "only for"):
            G.resolve_grid("paper", 8)
        with self.assertRaisesRegex(G.GridError, "is for 4 ranks"):
            G.resolve_grid(G.TorusGrid(4, 2), 8)
        with self.assertRaisesRegex(G.GridError, "hierarchical"):
            G.hierarchical_grid(6, 4)


if __name__ == "__main__":
    tf.test.main()
