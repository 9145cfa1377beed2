"""The cost model: formulas on hand-computed cases, the fit, the planner. Pure numpy, fast."""

import numpy as np
import pytest

from tftorus import cost_model as cm
from tftorus.grid import PAPER_GRIDS, GridError, TorusGrid, plan_grid

ONE_HOST = cm.Topology(ranks_per_host=64)  # every world below fits on it: all links intra-host


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
    assert seconds("torus", g, ONE_HOST, 8e6, p) == pytest.approx(8 * 1e-6 + (6 * 2e6 + 2 * 1e6) * 1e-9)


def test_hierarchical_column_moves_x_times_the_torus_column():
    g = TorusGrid(16, 4)
    topo = cm.Topology(4)  # rows are hosts
    hier = {p.name: p for p in cm.algorithm_phases("hierarchical", g, topo, 1.6e7)}
    torus = {p.name: p for p in cm.algorithm_phases("torus", g, topo, 1.6e7)}
    assert hier["column all-reduce (whole buffer)"].sent_bytes == pytest.approx(
        g.x * torus["column all-reduce"].sent_bytes)
    assert hier["row all-reduce"].steps == 2 * (g.x - 1)
    assert hier["row all-reduce"].link == "intra"


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
    with pytest.raises(ValueError, match="time must be > 0"):
        cm.Measurement("m", (), 0.0)


# ==================================================================================================
# Fit
# ==================================================================================================

def synthetic(true: cm.Params, noise: float, seed: int = 0):
    """Measurements a cluster with `true` parameters would give, with multiplicative noise:
    whole algorithms and single phases, 1-4 hosts of 2-4 ranks, 4 KiB to 64 MiB, flat buffers
    and gradient sets, some runs with more ranks than cores."""
    rng = np.random.default_rng(seed)
    out = []
    for rph, hosts in [(2, 2), (4, 1), (4, 2), (2, 4), (4, 4)]:
        size, topo = rph * hosts, cm.Topology(rph)
        for x in sorted({rph, 2, size // 2} - {1, size}) or [size]:
            g = TorusGrid(size, x)
            for nbytes in (4 << 10, 1 << 20, 16 << 20, 64 << 20):
                for gradient_set in (False, True):
                    runs = [(a, dict(reduce_scatter=rs, check=True, gradient_set=gradient_set))
                            for a, rs in [("torus", "alltoall"), ("ring", "ring"),
                                          ("hierarchical", "ring")]]
                    runs.append(("hvd", dict(gradient_set=gradient_set)))
                    for a, kw in runs:
                        phases = tuple(cm.algorithm_phases(a, g, topo, nbytes, **kw))
                        for cpu in (1.0, size / 2):
                            m = cm.Measurement(f"{a} {g} {nbytes}", phases, 1.0, cpu_factor=cpu)
                            t = m.predict(true) * (1 + noise * rng.standard_normal())
                            out.append(cm.Measurement(m.label, phases, t, cpu_factor=cpu))
                for which in cm.TORUS_PHASES:
                    ph = cm.torus_phase(which, g, topo, nbytes)
                    if ph is not None:
                        m = cm.Measurement(which, (ph,), 1.0)
                        out.append(cm.Measurement(which, (ph,), m.predict(true) * (
                            1 + noise * rng.standard_normal())))
    return out


TRUE = params(ai=3e-5, bi=2e-10, ae=4e-4, be=8e-9, gamma=5e-10, per_op=1e-3, copy=1.5e-10)


def test_fit_recovers_known_parameters_exactly_without_noise():
    result = cm.fit(synthetic(TRUE, noise=0.0))
    assert result.undetermined == ()
    np.testing.assert_allclose(result.params.vector(), TRUE.vector(), rtol=1e-6)
    assert result.rms_relative_error < 1e-9


def test_fit_recovers_known_parameters_from_noisy_data():
    result = cm.fit(synthetic(TRUE, noise=0.03, seed=1))
    for name, got, want in zip(cm.PARAM_NAMES, result.params.vector(), TRUE.vector()):
        assert got == pytest.approx(want, rel=0.15), name
    assert result.rms_relative_error == pytest.approx(0.03, abs=0.01)


def test_fit_on_one_host_leaves_inter_host_parameters_undetermined():
    ms = [m for m in synthetic(TRUE, 0.0) if not any(p.inter_steps for p in m.phases)]
    result = cm.fit(ms, free=("alpha_intra", "beta_intra", "alpha_inter", "beta_inter", "per_op",
                              "gamma", "copy"))
    assert set(result.undetermined) == {"alpha_inter", "beta_inter"}
    assert result.params.intra.beta == pytest.approx(TRUE.intra.beta, rel=1e-6)


def test_fit_keeps_fixed_parameters():
    base = TRUE.replace(beta_inter=8e-9)
    free = [n for n in cm.PARAM_NAMES if n != "beta_inter"]
    result = cm.fit(synthetic(TRUE, 0.0), base=base, free=free)
    assert result.params.inter.beta == 8e-9
    np.testing.assert_allclose(result.params.vector(), TRUE.vector(), rtol=1e-6)


# ==================================================================================================
# Paper scale and the planner
# ==================================================================================================

def test_abci_step_model_is_consistent_with_table6_at_four_gpus():
    sm = cm.StepModel(cm.CostModel(cm.abci_params(), cm.abci_topology()))
    assert sm.base_step_seconds == pytest.approx(4 * 32 / 2565)  # 49.9 ms
    assert sm.efficiency("torus", 4) == pytest.approx(100.0)
    g = TorusGrid(1024, 32)
    # The torus beats both baselines at the paper's scale, and the ring is latency-bound.
    assert sm.efficiency("torus", 1024, g) > sm.efficiency("hierarchical", 1024) > 0
    assert sm.comm_seconds("ring", 4096) > 5 * sm.comm_seconds("torus", 4096, TorusGrid(4096, 64))
    hidden = cm.StepModel(sm.model, overlap=2 / 3)
    assert hidden.efficiency("torus", 1024, g) == pytest.approx(100.0)


def test_planner_by_cost_picks_sensible_grids():
    model = cm.CostModel(cm.abci_params(), cm.abci_topology())
    for n in (1024, 2048, 2176, 4096):
        g = cm.plan_grid_by_cost(n, model, cm.RESNET50_FP16_BYTES, local_size=4)
        assert (g.y, g.x) == PAPER_GRIDS[n], n  # the paper's grid (Table 4)
    g = cm.plan_grid_by_cost(3456, model, cm.RESNET50_FP16_BYTES, local_size=4)
    best = model.seconds("torus", g, cm.RESNET50_FP16_BYTES)
    for x in (4, 8, 72, 3456):  # never worse than the paper's or degenerate grids
        assert best <= model.seconds("torus", TorusGrid(3456, x), cm.RESNET50_FP16_BYTES)
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


def load_script():
    from studies import scale_model
    return scale_model


def test_scale_model_script_rejects_missing_or_foreign_csv(tmp_path, capsys):
    script = load_script()
    assert script.main(["--no-paper", "--csv", str(tmp_path / "none.csv")]) == 2
    assert "studies.emulated_cluster" in capsys.readouterr().err
    foreign = tmp_path / "bench.csv"
    foreign.write_text("np,grid,workload,kind,name,median_ms\n4,2x2,flat 1 MiB,variant,hvd,9.8\n")
    assert script.main(["--no-paper", "--csv", str(foreign)]) == 2
    assert "--single-host" in capsys.readouterr().err


def test_scale_model_script_fits_an_emulated_csv(tmp_path, capsys):
    # A CSV in the emulated cluster's format, made from known parameters: the script's fit
    # must predict every point it fitted within 1 %.
    script = load_script()
    true = params(ai=5e-5, bi=1e-9, ae=2e-4, be=2e-8, per_op=1e-3)
    lines = ["np,grid,hosts,ranks_per_host,link_gbit,bytes,workload,kind,name,median_ms"]
    # The link rate is 0.4 Gbit/s (beta_inter 2e-8 s/byte) on most rows, 0.8 on one setting:
    # the script counts those rows' inter-host bytes half.
    for hosts, rph, grid, gbit in [(2, 2, "2x2", 0.4), (2, 4, "2x4", 0.4), (4, 2, "2x4", 0.4),
                                   (4, 4, "4x4", 0.4), (4, 2, "2x4", 0.8)]:
        size, topo = hosts * rph, cm.Topology(rph)
        g = TorusGrid(size, int(grid.split("x")[1]))
        link = true.replace(beta_inter=true.inter.beta * 0.4 / gbit)
        for nbytes in (1 << 20, 16 << 20):
            work = f"flat {nbytes >> 20} MiB"
            for name, algorithm, kw in [("hvd", "hvd", {}),
                                        ("torus", "torus", dict(reduce_scatter="alltoall",
                                                                check=True)),
                                        ("ring", "ring", dict(check=True)),
                                        ("hierarchical", "hierarchical", dict(check=True))]:
                t = cm.CostModel(link, topo).seconds(algorithm, g, nbytes, **kw)
                lines.append(f"{size},{grid},{hosts},{rph},{gbit},{nbytes},{work},variant,{name},"
                             f"{t * 1e3:.6f}")
    path = tmp_path / "emulated.csv"
    path.write_text("\n".join(lines) + "\n")
    results = script.fit_and_report(str(path), single_host=False, flag=0.2, cores=0)
    out = capsys.readouterr().out
    assert "0 of 40 rows off by more than 20 %" in out
    assert results["horovod"].rms_relative_error < 0.01
    assert results["horovod"].params.inter.beta == pytest.approx(2e-8, rel=0.01)
