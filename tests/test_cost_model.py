"""The cost model: formulas on hand-computed cases, the grids, the planner, the ABCI data.
Its fit and the paper's step model are tests/test_cost_calibration.py's."""

import pytest

from tftorus.planning import cost_model as cm
from tftorus.torus.grid import PAPER_GRIDS, GridError, TorusGrid, hierarchical_grid, plan_grid

ONE_HOST = cm.Topology(ranks_per_host=64)  # every world below fits on it: all links intra-host
RESNET50_FP16 = 2 * cm.RESNET50_PARAMS  # bytes, as the paper sends the gradients


def params(ai=1e-5, bi=1e-9, ae=1e-4, be=1e-8, gamma=0.0, per_op=0.0, copy=0.0):
    return cm.Params(cm.Link(ai, bi), cm.Link(ae, be), gamma=gamma, per_op=per_op, copy=copy)


def seconds(algorithm, grid, topo, nbytes, p, **kw):
    return cm.CostModel(p, topo).seconds(algorithm, grid, nbytes, **kw)


# ==================================================================================================
# Formulas
# ==================================================================================================

def test_ring_of_four_on_one_host_by_hand():
    # 2(N-1) = 6 steps of n/4: 6 * (alpha + n/4 * beta) + 3/4 n * gamma + one collective.
    p = params(ai=2e-6, bi=1e-9, gamma=1e-10, per_op=5e-6)
    n = 4_000_000
    expected = 6 * (2e-6 + 1_000_000 * 1e-9) + 3_000_000 * 1e-10 + 5e-6
    got = seconds("ring", TorusGrid(4, 2), cm.Topology(4), n, p)
    assert got == pytest.approx(expected, rel=1e-12)
    assert seconds("hvd", TorusGrid(4, 4), cm.Topology(4), n, p) == pytest.approx(expected)


def test_ring_across_hosts_pays_the_network_on_every_step():
    # 4 ranks, 2 per host: ring 0-1-2-3 crosses hosts at 1->2 and 3->0, one sender per host.
    p = params(ai=1e-6, bi=1e-10, ae=1e-5, be=1e-9)
    n = 1_000_000
    got = seconds("ring", TorusGrid(4, 4), cm.Topology(2), n, p)
    assert got == pytest.approx(6 * (1e-5 + 250_000 * 1e-9))


def test_torus_steps_and_bytes():
    for size, x in [(4, 2), (8, 4), (12, 3), (1024, 32), (3456, 72)]:
        g = TorusGrid(size, x)
        phases = cm.algorithm_phases("torus", g, cm.Topology(4), 1e6)
        assert sum(p.steps for p in phases) == 2 * (g.x - 1) + 2 * (g.y - 1) == g.sequential_steps
        ring, = cm.algorithm_phases("ring", g, cm.Topology(4), 1e6)
        assert ring.steps == 2 * (size - 1)
        # Per worker the torus sends exactly what a ring sends: 2(N-1)/N of the buffer.
        assert sum(p.sent_bytes for p in phases) == pytest.approx(ring.sent_bytes)
        assert ring.sent_bytes == pytest.approx(2 * (size - 1) / size * 1e6)
        # ... and sums (N-1)/N of it.
        assert sum(p.reduced_bytes for p in phases) == pytest.approx((size - 1) / size * 1e6)


def test_torus_phase_sizes_by_hand():
    g = TorusGrid(8, 4)  # 2 rows of 4
    rs, col, ag = cm.algorithm_phases("torus", g, ONE_HOST, 8e6)
    assert (rs.steps, rs.chunk) == (3, 2e6)  # X-1 steps of n/X
    assert (col.steps, col.chunk) == (2, 1e6)  # 2(Y-1) steps of n/(XY)
    assert (ag.steps, ag.chunk) == (3, 2e6)
    p = params(ai=1e-6, bi=1e-9)
    assert seconds("torus", g, ONE_HOST, 8e6, p) == pytest.approx(
        8 * 1e-6 + (6 * 2e6 + 2 * 1e6) * 1e-9)


def test_leader_based_hierarchical_sends_a_hosts_torus_bytes_from_one_rank():
    g = TorusGrid(16, 4)
    topo = cm.Topology(4)  # rows are hosts
    hier = {p.name: p for p in cm.algorithm_phases("hierarchical", g, topo, 1.6e7)}
    torus = {p.name: p for p in cm.algorithm_phases("torus", g, topo, 1.6e7)}
    leaders, column = hier["leaders' all-reduce"], torus["column all-reduce"]
    # per host the same bytes cross: the leader sends the whole buffer's share, the torus' X
    # ranks 1/X of it each
    assert leaders.sent_bytes == pytest.approx(g.x * column.sent_bytes)
    assert (leaders.max_senders, column.max_senders) == (1, g.x)
    assert [p.name for p in hier.values()] == ["row all-reduce", "leaders' all-reduce",
                                                "row broadcast (all-reduce)"]
    assert hier["row all-reduce"].steps == 2 * (g.x - 1)
    assert hier["row all-reduce"].link == "intra"
    # one shared link per host: the crossing costs the same; one link per rank (rails): the
    # torus' columns each take their own link, the leader has one
    p = params(ai=0.0, bi=0.0, ae=0.0, be=1e-9)  # only the bytes across hosts cost
    one_link = cm.CostModel(p, topo)
    assert leaders.seconds(p) == pytest.approx(column.seconds(p))
    rails = cm.CostModel(p, cm.Topology(4, nics_per_host=4, nics_per_rank=1))
    lead = rails.phases("hierarchical", g, 1.6e7)[1].seconds(p)
    col = rails.phases("torus", g, 1.6e7)[1].seconds(p)
    assert lead == pytest.approx(4 * col)
    assert one_link.seconds("torus", g, 1.6e7) == pytest.approx(4 * col)


def test_nic_sharing_in_the_column_phase():
    # Rows are whole hosts, so every rank of a host crosses in the column phase at once: a host
    # with 4 ranks and 1 NIC gives each a quarter; with 2 NICs, a half.
    g = TorusGrid(16, 4)
    col = cm.torus_phase("column all-reduce", g, cm.Topology(4), 4e6)
    assert (col.link, col.max_senders) == ("inter", 4)
    assert col.inter_weighted_bytes == pytest.approx(col.sent_bytes * 4)
    col2 = cm.torus_phase("column all-reduce", g, cm.Topology(4, nics_per_host=2), 4e6)
    assert col2.inter_weighted_bytes == pytest.approx(col2.sent_bytes * 2)
    # The row phases stay inside hosts.
    assert cm.torus_phase("row reduce-scatter", g, cm.Topology(4), 4e6).link == "intra"
    # A ring leaving a host has one sender there: the whole NIC, or one of two NICs if a
    # rank may use only one.
    ring = cm.ring_phase("r", g, "world", cm.Topology(4, nics_per_host=2), 4e6, "all-reduce")
    assert ring.inter_weighted_bytes == pytest.approx(ring.sent_bytes * 0.5)
    ring1 = cm.ring_phase("r", g, "world", cm.Topology(4, 2, nics_per_rank=1), 4e6, "all-reduce")
    assert ring1.inter_weighted_bytes == pytest.approx(ring1.sent_bytes)


def test_alltoall_reduce_scatter_has_the_ring_bytes_and_more_senders():
    g = TorusGrid(8, 8)  # one row over two hosts of 4
    ring = cm.torus_phase("row reduce-scatter", g, cm.Topology(4), 8e6, "ring")
    a2a = cm.torus_phase("row reduce-scatter", g, cm.Topology(4), 8e6, "alltoall")
    assert a2a.sent_bytes == ring.sent_bytes and a2a.steps == ring.steps == 7
    assert ring.max_senders == 1 and a2a.max_senders == 4
    assert a2a.inter_weighted_bytes > ring.inter_weighted_bytes


def test_round_robin_placement_puts_columns_inside_hosts():
    g = TorusGrid(16, 4)  # 4 rows of 4; round-robin over 4 hosts: host = rank % 4 = column
    topo = cm.Topology(4, placement="round-robin")
    assert cm.torus_phase("column all-reduce", g, topo, 4e6).link == "intra"
    assert cm.torus_phase("row all-gather", g, topo, 4e6).link == "inter"


def test_groups_of_one_run_nothing_and_checks_and_copies_add_up():
    g = TorusGrid(4, 4)  # one row: no column phase
    names = [p.name for p in cm.algorithm_phases("torus", g, ONE_HOST, 1e6)]
    assert names == ["row reduce-scatter", "row all-gather"]
    p = params(ai=1e-6, bi=0.0, copy=1e-9)
    base = seconds("torus", g, ONE_HOST, 1e6, p)
    both = seconds("torus", g, ONE_HOST, 1e6, p, check=True, gradient_set=True)
    assert both - base == pytest.approx(6 * 1e-6 + 2e6 * 1e-9)  # check: 2(4-1) steps


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="Link.beta"):
        cm.Link(1e-6, -1.0)
    with pytest.raises(ValueError, match="ranks_per_host"):
        cm.Topology(0)
    with pytest.raises(ValueError, match="nics_per_rank"):
        cm.Topology(4, nics_per_host=2, nics_per_rank=3)
    with pytest.raises(GridError, match="multiple of 4"):
        cm.algorithm_phases("ring", TorusGrid(6, 3), cm.Topology(4), 1e6)
    with pytest.raises(ValueError, match="unknown algorithm"):
        cm.algorithm_phases("tree", TorusGrid(4, 2), cm.Topology(4), 1e6)
    with pytest.raises(ValueError, match="unknown parameter"):
        params().replace(alpha=1.0)


# ==================================================================================================
# The planner, the grids and the paper's machine
# ==================================================================================================

def test_planner_by_cost_picks_sensible_grids():
    model = cm.CostModel(cm.abci_params(), cm.abci_topology())
    for n in (1024, 2048, 2176, 4096):
        g = cm.plan_grid_by_cost(n, model, RESNET50_FP16, local_size=4)
        assert (g.y, g.x) == PAPER_GRIDS[n], n  # the paper's grid (Table 4)
    g = cm.plan_grid_by_cost(3456, model, RESNET50_FP16, local_size=4)
    best = model.seconds("torus", g, RESNET50_FP16)
    for x in (4, 8, 72, 3456):  # never worse than the paper's or degenerate grids
        assert best <= model.seconds("torus", TorusGrid(3456, x), RESNET50_FP16)
    # Tiny messages on a slow network: latency rules, and a square grid has the fewest steps.
    slow = cm.CostModel(params(ae=1e-3, be=1e-12), cm.Topology(1))
    assert str(cm.plan_grid_by_cost(64, slow, 64)) == "8x8"
    # One rank per host: every grid sends the same bytes (2(N-1)/N n) through the same NICs,
    # so the fewest steps win whatever the size.
    assert str(cm.plan_grid_by_cost(16, slow, 1e9)) == "4x4"
    # Bandwidth-bound, fast nodes (NVLink-like inside, slow NICs): rows of one node keep the
    # reduce-scatter and all-gather off the network; only 1/4 of the buffer crosses.
    fat = cm.CostModel(params(ai=1e-7, bi=1e-12, ae=1e-7, be=1e-8), cm.Topology(4))
    assert str(cm.plan_grid_by_cost(64, fat, 1e9, local_size=4)) == "16x4"
    # Defaults unchanged without a model.
    assert str(plan_grid(3456, 4)) == "54x64"


def test_planner_arguments_checked():
    model = cm.CostModel(cm.abci_params(), cm.abci_topology())
    with pytest.raises(ValueError, match="nbytes must be > 0"):
        cm.plan_grid_by_cost(16, model, 0)
    with pytest.raises(GridError, match="differs"):
        cm.plan_grid_by_cost(16, model, 1e6, local_size=8)


def test_grid_for_algorithm_is_what_tftorus_would_pick():
    # A row per host for hierarchical (a world within one host: one row), the planner's grid
    # for the torus and the rings.
    assert cm.grid_for_algorithm("hierarchical", 16, 4) == hierarchical_grid(16, 4)
    assert str(cm.grid_for_algorithm("hierarchical", 2, 4)) == "1x2"
    for algorithm in ("torus", "ring", "hvd"):
        assert cm.grid_for_algorithm(algorithm, 3456, 4) == plan_grid(3456, 4)
    with pytest.raises(GridError, match="do not split into nodes"):
        cm.grid_for_algorithm("hierarchical", 18, 4)


def test_modelled_algorithms_are_the_registry_s_and_horovod_s_ring():
    from tftorus.torus.algorithms import ALGORITHMS

    assert set(cm.MODELLED_ALGORITHMS) == set(ALGORITHMS) | {"hvd"}
    # 'hvd' is the flat ring, phase for phase.
    g, topo = TorusGrid(16, 4), cm.Topology(4)
    assert cm.algorithm_phases("hvd", g, topo, 1e6) == cm.algorithm_phases("ring", g, topo, 1e6)


def test_abci_data_the_plan_uses():
    # The plan's all-reduce line quotes these numbers (official_resnet/plan/run_plan.py).
    p, topo = cm.abci_params(), cm.abci_topology()
    assert (topo.ranks_per_host, topo.nics_per_host, topo.nics_per_rank) == (4, 2, None)
    assert p.intra.bandwidth == pytest.approx(50 * cm.GB)
    assert p.inter.bandwidth == pytest.approx(12.5 * cm.GB)
    assert cm.RESNET50_PARAMS == 25_583_592
    model = cm.CostModel(p, topo)
    assert model.seconds("torus", plan_grid(3456, 4), RESNET50_FP16) * 1e3 == pytest.approx(
        6.70, abs=0.005)  # Exp. 2's plan: 54x64, 6.70 ms per step
