"""The studies' calibration of the cost model (studies/cost_calibration.py): the fit on
synthetic measurements, the paper's step model, and studies/scale_model.py's fit of a CSV.
Pure numpy and scipy, fast."""

import numpy as np
import pytest

from studies import cost_calibration as cal
from tftorus.planning import cost_model as cm
from tftorus.torus.grid import TorusGrid


def params(ai=1e-5, bi=1e-9, ae=1e-4, be=1e-8, gamma=0.0, per_op=0.0, copy=0.0):
    return cm.Params(cm.Link(ai, bi), cm.Link(ae, be), gamma=gamma, per_op=per_op, copy=copy)


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
                            m = cal.Measurement(f"{a} {g} {nbytes}", phases, 1.0, cpu_factor=cpu)
                            t = m.predict(true) * (1 + noise * rng.standard_normal())
                            out.append(cal.Measurement(m.label, phases, t, cpu_factor=cpu))
                for which in cm.TORUS_PHASES:
                    ph = cm.torus_phase(which, g, topo, nbytes)
                    if ph is not None:
                        m = cal.Measurement(which, (ph,), 1.0)
                        out.append(cal.Measurement(which, (ph,), m.predict(true) * (
                            1 + noise * rng.standard_normal())))
    return out


TRUE = params(ai=3e-5, bi=2e-10, ae=4e-4, be=8e-9, gamma=5e-10, per_op=1e-3, copy=1.5e-10)


def test_fit_recovers_known_parameters_exactly_without_noise():
    result = cal.fit(synthetic(TRUE, noise=0.0))
    assert result.undetermined == ()
    np.testing.assert_allclose(result.params.vector(), TRUE.vector(), rtol=1e-6)
    assert result.rms_relative_error < 1e-9


def test_fit_recovers_known_parameters_from_noisy_data():
    result = cal.fit(synthetic(TRUE, noise=0.03, seed=1))
    for name, got, want in zip(cm.PARAM_NAMES, result.params.vector(), TRUE.vector()):
        assert got == pytest.approx(want, rel=0.15), name
    assert result.rms_relative_error == pytest.approx(0.03, abs=0.01)


def test_fit_on_one_host_leaves_inter_host_parameters_undetermined():
    ms = [m for m in synthetic(TRUE, 0.0) if not any(p.inter_steps for p in m.phases)]
    result = cal.fit(ms, free=("alpha_intra", "beta_intra", "alpha_inter", "beta_inter", "per_op",
                              "gamma", "copy"))
    assert set(result.undetermined) == {"alpha_inter", "beta_inter"}
    assert result.params.intra.beta == pytest.approx(TRUE.intra.beta, rel=1e-6)


def test_fit_keeps_fixed_parameters():
    base = TRUE.replace(beta_inter=8e-9)
    free = [n for n in cm.PARAM_NAMES if n != "beta_inter"]
    result = cal.fit(synthetic(TRUE, 0.0), base=base, free=free)
    assert result.params.inter.beta == 8e-9
    np.testing.assert_allclose(result.params.vector(), TRUE.vector(), rtol=1e-6)


def test_measurement_rejects_bad_times():
    with pytest.raises(ValueError, match="time must be > 0"):
        cal.Measurement("m", (), 0.0)
    with pytest.raises(ValueError, match="cpu_factor must be >= 1"):
        cal.Measurement("m", (), 1.0, cpu_factor=0.5)
    with pytest.raises(ValueError, match="unknown parameter"):
        cal.fit([cal.Measurement("m", (), 1.0)], free=("alpha",))


# ==================================================================================================
# The paper's step (Table 6)
# ==================================================================================================

def test_abci_step_model_is_consistent_with_table6_at_four_gpus():
    sm = cal.StepModel(cm.CostModel(cm.abci_params(), cm.abci_topology()))
    assert sm.base_step_seconds == pytest.approx(4 * 32 / 2565)  # 49.9 ms
    assert sm.efficiency("torus", 4) == pytest.approx(100.0)
    g = TorusGrid(1024, 32)
    # The torus beats both baselines at the paper's scale, and the ring is latency-bound.
    assert sm.efficiency("torus", 1024, g) > sm.efficiency("hierarchical", 1024) > 0
    assert sm.comm_seconds("ring", 4096) > 5 * sm.comm_seconds("torus", 4096, TorusGrid(4096, 64))
    hidden = cal.StepModel(sm.model, overlap=2 / 3)
    assert hidden.efficiency("torus", 1024, g) == pytest.approx(100.0)


# ==================================================================================================
# studies/scale_model.py
# ==================================================================================================

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
