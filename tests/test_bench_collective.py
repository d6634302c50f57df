"""``strataio bench collective`` at a tiny scale: every pattern runs under mpiexec, every
contender reads back the same bytes (the benchmark checks that itself), and the JSON rows
carry every figure the table shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from strataio.bench.collective import CONTENDERS, PATTERNS
from strataio.cli import main


@pytest.mark.mpi
def test_every_pattern_at_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "collective.json"
    args = ["bench", "collective", "--all", "--ranks", "2", "--reps", "2", "--scale", "0.01"]
    result = CliRunner().invoke(main, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [(r["pattern"], r["op"]) for r in rows] == [
        (p, op) for p in PATTERNS for op in ("write", "read")
    ]
    for r in rows:
        assert r["ranks"] == 2 and r["bytes"] > 0
        assert all(r[c] > 0 and r["wall"][c] > 0 for c in CONTENDERS)
        assert r["path"] in ("independent", "two-phase")
        best = max(r["ROMIO coll"], r["ROMIO ind"])
        assert r["ratio"] == pytest.approx(r["strataio"] / best)
        p = r["paired"]
        assert 0 < p["q1"] <= p["median"] <= p["q3"]
    assert "paired (IQR)" in result.output


@pytest.mark.mpi
def test_pipeline_groups_at_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "pipeline.json"
    args = ["bench", "collective", "--pattern", "contig", "--pattern", "hpio512", "--ranks", "2"]
    args += ["--reps", "2", "--scale", "0.01", "--pipeline", "1,2"]
    result = CliRunner().invoke(main, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [(r["pattern"], r["op"]) for r in rows] == [
        (p, op) for p in ("contig", "hpio512") for op in ("write", "read")
    ]
    for r in rows:
        assert r["strataio G=1"] > 0 and r["strataio G=2"] > 0 and r["ROMIO coll"] > 0
        assert r["pipeline"]["strataio G=1"]["median"] == pytest.approx(1.0)
        assert r["pipeline"]["strataio G=2"]["median"] > 0
    assert "G=2 / G=1" in result.output
