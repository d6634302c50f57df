"""The realm-policy benchmarks run, check their own results and report every policy."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from strataio.bench.realms import PATTERN_POLICIES, SLIDING_POLICIES, policy_hints
from strataio.cli import main as cli


def test_policy_hints():
    assert policy_hints("no caching") == {}
    assert policy_hints("64K", 1 / 16) == {"romio_cb_pfr": "enable", "romio_cb_fr_types": "4096"}
    assert policy_hints("intelligent", 1, 999)["romio_cb_fr_types"] == "999"
    assert policy_hints("fsize")["romio_cb_fr_types"] == "-1"


def test_sliding_window_and_patterns_per_policy(tmp_path: Path):
    out = tmp_path / "r.json"
    args = ["bench", "sliding-window", "--ranks", "2", "--reps", "1", "--scale", "0.002",
            "--driver", "local", "--json", str(out)]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(out.read_text())
    assert list(row["policies"]) == SLIDING_POLICIES and row["ranks"] == 2
    # every policy moved at least the tiles' bytes (each rank reads and writes all 64 tiles)
    for r in row["policies"].values():
        assert r["written_bytes"] >= 2 * row["file_bytes"] and r["seconds"] > 0
    args = ["bench", "realms", "--pattern", "block3d", "--ranks", "2", "--reps", "1",
            "--scale", "0.01", "--driver", "pfs", "--json", str(out)]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(out.read_text())
    assert list(row["policies"]) == PATTERN_POLICIES and row["driver"] == "pfs"
