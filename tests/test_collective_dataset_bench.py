"""``strataio bench sections --collective``: sub-columns of a region, each shared chunk read
once by the collective reads, launched under mpiexec at a small size."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from strataio.bench.sections import CollectiveSectionsConfig, sub_columns
from strataio.cli import main
from strataio.errors import StrataError


def test_sub_columns_tile_the_region():
    cols = sub_columns((10, 3), (50, 13), 4)
    assert [c[0][0] for c in cols] == [10] * 4 and [c[1][0] for c in cols] == [50] * 4
    assert [c[0][1] for c in cols] == [3, 6, 8, 10]
    assert [c[1][1] for c in cols] == [6, 8, 10, 13]


def test_a_region_narrower_than_the_ranks_is_refused():
    with pytest.raises(StrataError, match="too narrow"):
        CollectiveSectionsConfig(size=100, patterns="F", ranks=4).validate()


@pytest.mark.mpi
def test_collective_reads_each_shared_chunk_once(tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        main,
        ["bench", "sections", "--collective", "--ranks", "2", "--size", "400", "--chunks", "8",
         "--repeat", "1", "--cache", "warm", "--dir", str(tmp_path), "--json", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())
    got = {(r["pattern"], r["mode"]): r["chunks_read"] for r in rows}
    # at size 400, chunks of 8: D is [40, 48) x [40, 48) (one chunk), G [0, 32) x [0, 8)
    # (four chunks, one column), H [48, 64) x [48, 64) (two by two chunks, one column each)
    assert got == {
        ("D", "independent"): 2, ("D", "collective"): 1,
        ("G", "independent"): 8, ("G", "collective"): 4,
        ("H", "independent"): 4, ("H", "collective"): 4,
    }  # fmt: skip
    assert "Sub-columns of one region, 2 ranks" in res.output
