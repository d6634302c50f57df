"""``strataio bench irregular`` and ``strataio bench loopcache`` run at CI size, check their
contenders' data and report every figure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from strataio.bench.irregular import _loops
from strataio.cli import main as cli


def test_loop_windows_overlap_by_seven_eighths():
    for layout in ("range", "scattered"):
        nitems, loops = _loops(1, 3, 64, 4, layout)
        assert nitems == 3 * (64 + 3 * 8)
        for a, b in zip(loops, loops[1:]):
            assert a.size == b.size == 64 and np.intersect1d(a, b).size == 56
        others = _loops(0, 3, 64, 4, layout)[1]
        assert not np.intersect1d(np.concatenate(loops), np.concatenate(others)).size


def test_irregular_and_loopcache_benchmarks(tmp_path: Path):
    out = tmp_path / "r.json"
    args = ["bench", "irregular", "--ranks", "2", "--items", "2000", "--itemsize", "32",
            "--reps", "1", "--json", str(out)]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(out.read_text())
    assert row["ranks"] == 2 and row["itemsize"] == 32
    assert row["strataio"]["correct"] and row["pread"]["correct"] and row["romio"]["correct"]
    assert row["strataio"]["build"] > 0 and row["speedup"]["read_vs_pread"] > 0
    args = ["bench", "loopcache", "--ranks", "2", "--index-bytes", "4KiB", "--driver", "pfs",
            "--reps", "1", "--json", str(out)]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(out.read_text())
    assert row["same_bytes"] and row["driver"] == "pfs" and row["items_per_rank"] == 1024
    # caching reads and writes the first loop in full plus 1/8 per further loop
    assert row["items_read"]["caching"] == 2 * (1024 + 3 * 128)
    assert row["items_read"]["no_caching"] == 2 * 4 * 1024
