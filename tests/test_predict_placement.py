"""Placement by prediction: AUTO datasets on a synthetic performance database."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner

import strataio
from strataio.catalog.base import PerfRow
from strataio.cli import main
from strataio.errors import StrataError
from strataio.predict.perfdb import PerfTable
from strataio.session import placement_decision
from strataio.storage.posix import PosixBackend
from strataio.tiers.placement import Placement
from strataio.tiers.tier import Tier, TierSet

ROLES = (("local", "localdisk"), ("remote", "remotedisk"), ("tape", "remotetape"))


def make_tiers(root, caps=(None, None, None)):
    return TierSet(
        [
            Tier(name, PosixBackend(root / name), role, capacity=cap, order=i)
            for i, ((name, role), cap) in enumerate(zip(ROLES, caps))
        ]
    )


def perf_rows(put, get, sizes=(1024, 4096, 1 << 20), when=1.0) -> list[PerfRow]:
    """``put`` / ``get``: {tier: (fixed s, s per byte)}; one process."""
    out = []
    for op, table in (("put", put), ("get", get)):
        for tier, (a, b) in table.items():
            out += [PerfRow(tier, op, n, a + b * n, 1, when) for n in sizes]
    return out


# per chunk: local the least fixed cost, tape the most (1 s) but 100x the bandwidth of local
PUT = {"local": (0.001, 1e-7), "remote": (0.01, 1e-8), "tape": (1.0, 1e-9)}
GET = {"local": (0.001, 1e-7), "remote": (0.01, 1e-8), "tape": (1.0, 1e-9)}


def write_config(folder) -> None:
    """A ``strataio.toml`` in ``folder``: an SQLite catalog and the three POSIX tiers of
    :data:`ROLES`."""
    (folder / "strataio.toml").write_text(
        '[catalog]\nurl = "cat.db"\n'
        + "".join(
            f'[[tiers]]\nname = "{n}"\nkind = "posix"\nrole = "{r}"\npath = "{n}"\n'
            for n, r in ROLES
        )
    )


def test_the_least_predicted_time_wins(tmp_path):
    pl = Placement(make_tiers(tmp_path))
    perf = PerfTable(perf_rows(PUT, GET))
    d = pl.choose(perf, 10 * 4096, 4096, 10, expected_reads=2)
    assert d.tier == "local"
    w, r = d.predicted["local"]
    assert w == pytest.approx(10 * (0.001 + 4096e-7))
    assert r == pytest.approx(2 * 10 * (0.001 + 4096e-7))
    assert set(d.predicted) == {"local", "remote", "tape"}
    assert "least predicted write + 2 reads" in d.reason
    # spread over 4 writing processes: 3 chunks on the busiest (at the 1-process times)
    d4 = pl.choose(perf, 10 * 4096, 4096, 10, expected_reads=0, processes=4)
    assert d4.predicted["local"][0] == pytest.approx(4 * 3 * (0.001 + 4096e-7))


def test_large_chunks_go_where_bandwidth_is(tmp_path):
    # tape: 1 s per chunk but 10x the bandwidth of remote: for 1 GiB chunks it wins
    pl = Placement(make_tiers(tmp_path))
    perf = PerfTable(perf_rows(PUT, GET, sizes=(1024, 1 << 20, 1 << 30)))
    assert pl.choose(perf, 4 << 20, 1 << 20, 4).tier == "remote"  # 10x local's bandwidth
    assert pl.choose(perf, 2 << 30, 1 << 30, 2).tier == "tape"


def test_capacity_excludes_a_tier(tmp_path):
    pl = Placement(make_tiers(tmp_path, caps=(10_000, None, None)))
    perf = PerfTable(perf_rows(PUT, GET))
    d = pl.choose(perf, 20_000, 4096, 5)
    assert d.tier == "remote" and "local (no room)" in d.skipped


def test_a_tier_with_a_damaged_calibration_is_skipped_saying_so(tmp_path):
    """A damaged row in one tier's calibration (or in that of a tier no longer configured)
    takes that tier out of the choice, named, and leaves the others' choice as it was."""
    pl = Placement(make_tiers(tmp_path))
    damaged = [PerfRow("local", "put", 4096, -1.0, 1, 1.0), PerfRow("retired", "get", 0, 1.0)]
    d = pl.choose(PerfTable(perf_rows(PUT, GET) + damaged), 10 * 4096, 4096, 10)
    assert d.tier == "remote" and set(d.predicted) == {"remote", "tape"}
    assert any(s.startswith("local (damaged calibration:") for s in d.skipped), d.skipped


def test_a_deadline_picks_the_slowest_tier_meeting_it(tmp_path):
    pl = Placement(make_tiers(tmp_path))
    perf = PerfTable(perf_rows(PUT, GET))
    # write + 1 read of 4 chunks: local 0.008 s, remote 0.08 s, tape 8 s
    assert pl.choose(perf, 4 * 1024, 1024, 4, deadline_s=0.1).tier == "remote"
    assert pl.choose(perf, 4 * 1024, 1024, 4, deadline_s=100).tier == "tape"
    d = pl.choose(perf, 4 * 1024, 1024, 4, deadline_s=0.001)
    assert d.tier == "local" and "no tier meets the deadline" in d.reason


def test_uncalibrated_tiers_are_not_candidates_and_none_falls_back(tmp_path):
    pl = Placement(make_tiers(tmp_path))
    only_tape = PerfTable(perf_rows({"tape": PUT["tape"]}, {"tape": GET["tape"]}))
    d = pl.choose(only_tape, 4096, 1024, 4)
    assert d.tier == "tape" and "local (not calibrated)" in d.skipped
    d = pl.choose(PerfTable([]), 4096, 1024, 4)
    assert d.tier is None and "no tier with room is calibrated" in d.reason
    assert pl.home("AUTO", d.tier).name == "tape"  # the default AUTO: the slowest tier


def test_write_order_fails_over_from_the_chosen_tier(tmp_path):
    pl = Placement(make_tiers(tmp_path))
    assert [t.name for t in pl.write_order("AUTO", "remote")] == ["remote", "tape", "local"]
    assert [t.name for t in pl.write_order("AUTO")] == ["tape", "remote", "local"]
    assert [t.name for t in pl.write_order("AUTO", "local")] == ["local", "remote", "tape"]


def where(ds):
    return {c.tier for v in ds.residency().values() for c in v}


def test_session_places_auto_datasets_by_prediction(tmp_path):
    a = np.random.default_rng(1).random((40, 30)).astype("f4")
    with strataio.Session(tiers=make_tiers(tmp_path), catalog=tmp_path / "cat.db") as s:
        # nothing calibrated: today's AUTO, and the decision says so
        ds = s.create_dataset("before", a.shape, a.dtype, (10, 10))
        ds[...] = a
        ds.close()
        assert where(s.open_dataset("before")) == {"tape"}
        assert placement_decision(s.catalog.get_dataset("before")).tier is None
        s.catalog.record_perf(perf_rows(PUT, GET))
        ds = s.create_dataset("auto", a.shape, a.dtype, (10, 10), expected_reads=3)
        ds[...] = a
        ds.close()
        ds = s.open_dataset("auto", "r+")
        assert where(ds) == {"local"}
        ds[0:10, 0:10] = a[0:10, 0:10] + 1  # later writes keep the chosen home
        ds.close()
        ds = s.open_dataset("auto")
        assert where(ds) == {"local"}
        np.testing.assert_array_equal(ds[10:, :], a[10:, :])
        assert ds.attrs.keys() == set()  # the decision stays in the catalog, not zarr.json
        d = placement_decision(s.catalog.get_dataset("auto"))
        assert d.tier == "local" and d.expected_reads == 3
        # a deadline any tier meets: the archive keeps the disks free
        ds = s.create_dataset("lazy", a.shape, a.dtype, (10, 10), deadline_s=1000)
        ds[...] = a
        ds.close()
        assert where(s.open_dataset("lazy")) == {"tape"}
        # explicit hints are not predicted
        s.create_dataset("pinned", a.shape, a.dtype, hint="REMOTEDISK").close()
        assert placement_decision(s.catalog.get_dataset("pinned")) is None
        with pytest.raises(StrataError, match="expected_reads"):
            s.create_dataset("bad", a.shape, a.dtype, expected_reads=-1)
        with pytest.raises(StrataError, match="deadline_s"):
            s.create_dataset("bad", a.shape, a.dtype, deadline_s=0)


def test_info_says_which_tier_and_why(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path)
    with strataio.Session("strataio.toml") as s:
        s.catalog.record_perf(perf_rows(PUT, GET))
        s.create_dataset("temp", (40, 30), "f4", (10, 10), expected_reads=2).close()
    out = CliRunner().invoke(main, ["info", "temp"])
    assert out.exit_code == 0, out.output
    assert "placement: local, chosen by prediction (expected reads 2)" in out.output
    assert "local: predicted write" in out.output and "<- chosen" in out.output
    assert "tape: predicted write" in out.output


def test_a_tier_configured_otherwise_since_its_calibration_is_not_chosen(tmp_path, monkeypatch):
    """A tier whose latest calibration measured other settings (here another place) counts
    as not calibrated: AUTO takes the best of the others."""
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path)
    with strataio.Session("strataio.toml") as s:
        now = {t.name: t.url for t in s.config.tiers}
        rows = perf_rows(PUT, GET)
        s.catalog.record_perf(
            [dataclasses.replace(r, settings=now[r.tier]) for r in rows if r.tier != "local"]
            + [
                dataclasses.replace(r, settings="posix:/elsewhere")
                for r in rows
                if r.tier == "local"
            ]
        )
        s.create_dataset("temp", (40, 30), "f4", (10, 10), expected_reads=2).close()
        assert placement_decision(s.catalog.get_dataset("temp")).tier == "remote"
        s.catalog.record_perf(
            [
                dataclasses.replace(r, settings=now["local"], when=2.0)
                for r in rows
                if r.tier == "local"
            ]
        )
        s.create_dataset("again", (40, 30), "f4", (10, 10), expected_reads=2).close()
        assert placement_decision(s.catalog.get_dataset("again")).tier == "local"


def test_info_names_where_writes_go_without_a_calibration(tmp_path, monkeypatch):
    """An uncalibrated AUTO dataset (the default AUTO) and one with an explicit hint: info
    names the tiers their writes go to now, in order, not only the rule."""
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path)
    with strataio.Session("strataio.toml") as s:
        s.create_dataset("auto", (40, 30), "f4", (10, 10), hint="AUTO").close()
        s.create_dataset("fast", (40, 30), "f4", (10, 10), hint="LOCALDISK").close()
    out = CliRunner().invoke(main, ["info", "auto"])
    assert out.exit_code == 0, out.output
    assert "placement: the default AUTO (the slowest tier with room)" in out.output
    assert "no tier with room is calibrated" in out.output
    assert "writes go to: tape, then remote, local as it fills or is down" in out.output
    out = CliRunner().invoke(main, ["info", "fast"])
    assert out.exit_code == 0, out.output
    assert "writes go to: local, then remote, tape as it fills or is down" in out.output
    assert "placement:" not in out.output


@pytest.mark.parametrize(
    "kwargs",
    [{"deadline_s": "5"}, {"deadline_s": 0}, {"expected_reads": None}, {"expected_reads": 1.5}],
)
def test_bad_placement_arguments_raise_strata_errors(tmp_path, kwargs):
    with strataio.Session(tiers=make_tiers(tmp_path), catalog=tmp_path / "cat.db") as s:
        with pytest.raises(StrataError, match="deadline_s|expected_reads"):
            s.create_dataset("bad", (4,), "f4", **kwargs)
        assert [d.name for d in s.list_datasets()] == []
