"""``strataio demo``: the Astro3D pipeline under Figure 9's scenarios (a CI-sized run under
mpiexec), its prediction workload, and the data its consumers read, against numpy."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from click.testing import CliRunner

from strataio.catalog.base import PerfRow
from strataio.cli import main
from strataio.config import load_config
from strataio.demo.astro3d import ALL, DemoParams, field, placement
from strataio.demo.pipeline import demo_config_text, predict_scenario, scenario_workload
from strataio.predict.perfdb import PerfTable

TINY = DemoParams(size=8, iterations=2, freq=1, ranks=2)


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "strataio.toml"
    path.write_text(demo_config_text(0.0))
    return load_config(path)


def test_demo_config_is_the_default_with_shaped_tiers_scaled(config) -> None:
    tiers = {t.name: (t.role, t.shaped, t.time_scale) for t in config.tiers}
    assert tiers == {
        "local": ("localdisk", None, 1.0),
        "remote": ("remotedisk", "remote_disk_2002", 0.0),
        "archive": ("remotetape", "remote_tape_2002", 0.0),
    }


def test_scenarios_follow_figure_9() -> None:
    tape = [n for n in ALL if placement(1, n) == "REMOTETAPE"]
    assert tape == list(ALL) and len(ALL) == 19
    assert placement(2, "temp") == "REMOTEDISK" and placement(2, "press") == "REMOTETAPE"
    assert {n for n in ALL if placement(3, n) != "DISABLE"} == {"temp", "press"}
    assert placement(4, "vr_temp") == "LOCALDISK" and placement(4, "restart_ux") == "REMOTETAPE"
    kept = {n: placement(5, n) for n in ALL if placement(5, n) != "DISABLE"}
    assert kept == {"vr_temp": "LOCALDISK", "vr_press": "REMOTEDISK"}


def test_workload_leaves_disabled_datasets_out(config) -> None:
    wl = scenario_workload(config, TINY, 3)
    got = {(d.name, d.mode, d.tier, d.dtype.name) for d in wl.datasets}
    assert got == {
        ("producer:temp", "write", "remote", "float32"),
        ("producer:press", "write", "remote", "float32"),
        ("analysis:temp", "read", "remote", "float32"),
    }
    wl = scenario_workload(config, TINY, 5)
    got = {(d.name, d.tier, d.dtype.name) for d in wl.datasets}
    assert got == {
        ("producer:vr_temp", "local", "uint8"),
        ("producer:vr_press", "remote", "uint8"),
        ("volren:vr_temp", "local", "uint8"),
    }
    assert wl.run.method == "chunked" and wl.run.iterations == 2 and wl.run.ranks == 2
    assert all(d.dims == (8, 8, 8) and d.pattern == "BBB" and d.frequency == 1 for d in wl.datasets)


def _flat_perf(put: float, get: float, extra: list[PerfRow] = ()) -> PerfTable:
    rows = list(extra)
    for tier in ("local", "remote", "archive"):
        for n in (1024, 1 << 20):
            rows += [PerfRow(tier, "put", n, put, 2, 1.0), PerfRow(tier, "get", n, get, 2, 1.0)]
    return PerfTable(rows)


def test_prediction_by_hand(config) -> None:
    perf = _flat_perf(0.1, 0.05)
    # 3 dumps (steps 0, 1, 2): 2 datasets x 3 puts; temp read 3 times
    assert predict_scenario(config, TINY, 3, perf) == pytest.approx(
        {"producer": 0.6, "analysis": 0.15, "volren": 0.0, "viewer": 0.0}
    )
    # scenario 1: 19 datasets x 3 puts; analysis 3 gets; Volren 3 gets + one container put;
    # the viewer one container get
    assert predict_scenario(config, TINY, 1, perf) == pytest.approx(
        {"producer": 5.7, "analysis": 0.15, "volren": 0.25, "viewer": 0.05}
    )


def test_prediction_adds_the_tiered_layer_per_access(config) -> None:
    extra = [
        PerfRow("archive", "tiered_put", 0, 0.02, 2, 1.0),
        PerfRow("archive", "tiered_rewrite", 0, 0.03, 2, 1.0),
        PerfRow("archive", "tiered_get", 0, 0.01, 2, 1.0),
    ]
    perf = _flat_perf(0.1, 0.05, extra)
    got = predict_scenario(config, TINY, 1, perf)
    # 13 series datasets x 3 dumps pay 0.02 more, 6 checkpoints x 3 rewrites 0.03 more
    assert got["producer"] == pytest.approx(5.7 + 39 * 0.02 + 18 * 0.03)
    assert got["analysis"] == pytest.approx(0.15 + 3 * 0.01)
    # the superfile's container is not a dataset access: no tiered cost
    assert got["volren"] == pytest.approx(0.25 + 3 * 0.01) and got["viewer"] == 0.05
    assert sum(predict_scenario(config, TINY, 1, perf, tiered=False).values()) == pytest.approx(
        6.15
    )


def test_help_documents_the_parameters() -> None:
    res = CliRunner().invoke(main, ["demo", "--help"])
    assert res.exit_code == 0, res.output
    for word in ("--size", "--iterations", "--freq", "--ranks", "--scenario", "--time-scale"):
        assert word in res.output
    assert "all datasets to remote tapes" in res.output and "sections" in res.output


@pytest.mark.parametrize(
    "option, value",
    [("--size", "0"), ("--freq", "0"), ("--ranks", "0"), ("-n", "0"), ("--iterations", "-1")],
)
def test_a_bad_count_is_a_usage_error_naming_its_option(tmp_path, option, value) -> None:
    res = CliRunner().invoke(main, ["demo", "--dir", str(tmp_path / "d"), option, value])
    assert res.exit_code == 2, res.output
    named = "--ranks" if option == "-n" else option
    assert "Invalid value for" in res.output and named in res.output
    others = {"--size", "--freq", "--ranks", "--iterations"} - {named}
    assert not any(o in res.output for o in others), res.output
    assert not (tmp_path / "d").exists()


def _oracle(params: DemoParams) -> tuple[list, list[str]]:
    """MSE pairs and image digests computed by numpy on whole arrays."""
    whole = (slice(0, params.size),) * 3
    temps = [field("temp", k, whole).astype(np.float64) for k in range(params.dumps)]
    mse = [[np.mean((b - a) ** 2), np.max((b - a) ** 2)] for a, b in zip(temps, temps[1:])]
    images = []
    for k in range(params.dumps):
        img = np.max(field("vr_temp", k, whole), axis=2).astype(np.uint8)
        images.append(hashlib.sha256(img.tobytes()).hexdigest()[:16])
    return mse, images


def test_demo_runs_the_pipeline(tmp_path) -> None:
    runner = CliRunner()
    args = ["demo", "--dir", str(tmp_path / "d"), "--size", "8", "--iterations", "2"]
    args += ["--freq", "1", "--ranks", "2", "--time-scale", "0", "--json", str(tmp_path / "r.json")]
    res = runner.invoke(main, [*args, "--scenario", "2", "--scenario", "5"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "predicted (s)" in out and "measured (s)" in out and "|error|" in out
    assert "remote_tape_2002" in out and "time-scaled" in out and "calibrated now" in out
    assert "MISMATCH" not in out
    png = tmp_path / "d" / "astro3d.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads((tmp_path / "r.json").read_text())
    s2, s5 = result["scenarios"]
    assert (s2["scenario"], s5["scenario"]) == (2, 5)
    for s in (s2, s5):
        assert s["predicted_s"] > 0 and s["measured_s"] > 0
        assert f"{s['predicted_s']:.3f}" in out and f"{s['measured_s']:.3f}" in out
    mse, images = _oracle(TINY)
    # scenario 2: temp on the remote disk feeds the MSE analysis; vr_temp on tape feeds Volren
    np.testing.assert_allclose(s2["mse"], mse, rtol=1e-6)
    assert s2["images"] == images
    # scenario 5: temp is DISABLEd (no analysis), vr_temp on the local disk
    assert s5["mse"] == [] and s5["images"] == images
    assert s5["measured"]["analysis"] == 0 and s5["predicted"]["analysis"] == 0

    # the calibration is kept with the configuration
    res = runner.invoke(main, [*args, "--scenario", "3"])
    assert res.exit_code == 0, res.output
    assert "calibration reused" in res.output


def test_access_costs_read_again_under_the_lock_are_not_measured_twice(
    tmp_path, config, monkeypatch
) -> None:
    """The table a demo read before taking the tiers' lock lacks the tiered layer's costs,
    which another demo recorded meanwhile over a newer calibration: none is measured again,
    and the table returned is the catalog's, whose costs carry its calibration's time."""
    import strataio.predict.ranks
    from strataio.catalog import open_catalog
    from strataio.demo.pipeline import TIERED_OPS, ensure_access_costs
    from strataio.tiers.tier import register_configured_tiers

    def launch(*args, **kwargs):
        raise AssertionError("access costs measured again")

    monkeypatch.setattr(strataio.predict.ranks, "launch", launch)
    stale = _flat_perf(0.1, 0.05)
    tiers = ("local", "remote", "archive")
    newer = [PerfRow(t, op, n, 0.1, 2, 2.0) for t in tiers for op in ("put", "get")
             for n in (1024, 1 << 20)]  # fmt: skip
    newer += [PerfRow(t, op, 0, 0.01, 2, 2.0) for t in tiers for op in TIERED_OPS.values()]
    with open_catalog(config.catalog.url) as catalog:
        register_configured_tiers(catalog, config)  # (as the demo's calibration step did)
        catalog.record_perf(newer)
    perf, measured = ensure_access_costs(config, tmp_path / "strataio.toml", TINY, stale)
    assert not measured
    assert all(perf.has(t, op) for t in ("local", "remote") for op in TIERED_OPS.values())
    assert perf.measured_at["local"] == 2.0


_FAILING_RANK = """
import sys
from mpi4py import MPI
from strataio.demo import astro3d

def _failing(config_path, params):
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 1:
        raise OSError(28, "No space left on device (rank 1 alone)")
    comm.Barrier()  # (where rank 0 would wait for rank 1 forever)
    return {}

astro3d.measure_access_costs = _failing
astro3d._rank_main(sys.argv[1:])
"""


def test_a_demo_rank_failing_alone_ends_the_job_saying_why(tmp_path, monkeypatch) -> None:
    """One rank of the demo failing while the other goes on to a collective call ends the
    job at once, saying what failed on which rank, rather than leaving the other waiting."""
    import time

    from strataio.demo.astro3d import launch_args
    from strataio.errors import StrataError
    from strataio.predict.ranks import launch

    (tmp_path / "failing_rank.py").write_text(_FAILING_RANK)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}")
    started = time.monotonic()
    with pytest.raises(StrataError) as err:
        launch(
            2, "failing_rank", launch_args("none.toml", DemoParams(), "access-costs"), timeout=60
        )
    assert time.monotonic() - started < 30, "the other rank waited for the failed one"
    assert "rank 1" in str(err.value) and "rank 1 alone" in str(err.value), err.value
