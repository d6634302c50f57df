"""``strataio bench collective`` at a tiny scale: every pattern runs under mpiexec, every
contender reads back the same bytes (the benchmark checks that itself), and the JSON rows
carry every figure the table shows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from strataio.bench.collective import (
    CONTENDERS,
    FILE_PER_RANK,
    PATTERNS,
    PHASES,
    STEP_CONTENDERS,
)
from strataio.cli import main
from strataio.cli.collective_cmd import _pipeline_table, weak_efficiency


def _bench(tmp_path: Path, args: list[str]) -> tuple[Result, list[dict]]:
    """Run ``strataio bench collective ARGS``; its output and its JSON rows."""
    out = tmp_path / "rows.json"
    result = CliRunner().invoke(main, ["bench", "collective", *args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    return result, json.loads(out.read_text())


@pytest.mark.mpi
def test_every_pattern_at_two_ranks(tmp_path: Path) -> None:
    args = ["--all", "--ranks", "2", "--reps", "2", "--scale", "0.01", "--mode", "call"]
    result, rows = _bench(tmp_path, args)
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
def test_open_to_close_table(tmp_path: Path) -> None:
    args = ["--ranks", "1,2", "--reps", "3", "--size", "1", "--sync"]
    args += ["--pattern", "contig", "--pattern", "hpio512", "--pattern", "tile2d"]
    result, rows = _bench(tmp_path, args)
    assert [(r["ranks"], r["pattern"], r["op"]) for r in rows] == [
        (n, p, op)
        for n in (1, 2)
        for p in ("contig", "hpio512", "tile2d")
        for op in ("write", "read")
    ]
    for r in rows:
        assert r["mode"] == "open-close" and r["bytes"] == pytest.approx(2**20, rel=0.02)
        for c in STEP_CONTENDERS:
            t = r[c]
            assert len(t["times"]) == 3
            assert t["min"] == min(t["times"]) <= t["median"] <= t["max"] == max(t["times"])
            assert set(t["phases"]) == set(PHASES)
            # every phase's slowest rank lies within the whole step
            assert 0 < max(t["phases"].values()) <= t["max"]
            assert len(t.get("dirty MB", [])) == (3 if r["op"] == "write" else 0)
            assert len(t["stalls ms"]) == 3 and all(len(x) == 3 for x in t["stalls ms"])
            assert all(v >= 0 for x in t["stalls ms"] for v in x)
        best = r["best ROMIO"]
        assert r[best]["median"] == min(r["ROMIO coll"]["median"], r["ROMIO ind"]["median"])
        assert r["ratio"] == pytest.approx(r[best]["median"] / r["strataio"]["median"])
        assert 0 < r["paired"]["q1"] <= r["paired"]["median"] <= r["paired"]["q3"]
        assert 1 <= r["read threads"] <= 4
    assert "Per phase" in result.output and "paired (IQR)" in result.output
    # (the rank counts at which strataio read with more than one thread are named)
    threads = {r["ranks"]: r["read threads"] for r in rows}
    assert ("shares each rank's reads" in result.output) == any(t > 1 for t in threads.values())


@pytest.mark.mpi
def test_weak_scaling_moves_the_same_bytes_per_rank(tmp_path: Path) -> None:
    args = ["--ranks", "1,2", "--per-rank", "0.5", "--reps", "2", "--op", "write"]
    result, rows = _bench(tmp_path, [*args, "--pattern", "contig", "--pattern", "tile2d"])
    assert [(r["ranks"], r["pattern"], r["op"]) for r in rows] == [
        (n, p, "write") for n in (1, 2) for p in ("contig", "tile2d")
    ]
    for r in rows:
        assert r["per rank MiB"] == 0.5
        assert r["bytes"] / r["ranks"] == pytest.approx(2**19, rel=0.02)
        fpr = r[FILE_PER_RANK]
        assert len(fpr["times"]) == 2 and fpr["min"] <= fpr["median"] <= fpr["max"]
        assert r["best ROMIO"] in ("ROMIO coll", "ROMIO ind")  # the reference is not a peer
    assert "Weak scaling, 0.5 MiB per rank" in result.output
    assert FILE_PER_RANK in result.output
    # each row's 1-rank cell is its own reference; the 2-rank cell is the efficiency computed
    line = next(x for x in result.output.splitlines() if "tile2d" in x and FILE_PER_RANK in x)
    eff = weak_efficiency(rows, FILE_PER_RANK)[("tile2d", "write")][2]
    assert "(1.00)" in line and f"({eff:.2f})" in line


@pytest.mark.mpi
def test_the_file_per_rank_reference_reads_back_what_it_wrote(tmp_path: Path) -> None:
    from strataio.bench.mpi import run_ranks

    args = ["--pattern", "hpio512", "--reps", "1", "--size", "0.25", "--reference"]
    rows = run_ranks(2, "strataio.bench.collective", [*args, "--dir", str(tmp_path)], 300)
    assert [r["op"] for r in rows] == ["write", "read"]
    assert all(r[FILE_PER_RANK]["median"] > 0 for r in rows)
    assert not list(tmp_path.iterdir())  # every file of the pattern removed


@pytest.mark.mpi
def test_a_difference_on_one_rank_stops_every_rank(tmp_path: Path) -> None:
    from strataio.bench.mpi import mpiexec

    script = tmp_path / "stop.py"
    script.write_text(
        "from mpi4py import MPI\n"
        "from strataio.bench.collective import _same_everywhere\n"
        "comm = MPI.COMM_WORLD\n"
        "_same_everywhere(comm, comm.rank != 1, 'rank 1 read different data')\n"
        "comm.Barrier()\n"
        "print('past the check')\n"
    )
    cmd = [mpiexec(), "-n", "2", sys.executable, str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "past the check" not in proc.stdout
    assert proc.stderr.count("rank 1 read different data") == 2  # both ranks stopped


def test_a_short_own_file_is_reported_not_raised(tmp_path: Path) -> None:
    """The file-per-rank read counts the bytes its file lacks (they go into the step's one
    Allreduce, so every rank stops together) and keeps the bytes it did read."""
    from mpi4py import MPI

    from strataio.bench.collective import FILE_PER_RANK, _step, make_case

    case = make_case("contig", 0, 1, scale=1 / 1024)  # 8 KiB
    path = tmp_path / "own"
    short = bytes(range(10))
    (tmp_path / "own.0").write_bytes(short)
    out = np.zeros_like(case.buf)
    with pytest.raises(SystemExit, match=f"{case.nbytes - 10} bytes short"):
        _step(MPI.COMM_WORLD, FILE_PER_RANK, case, str(path), False, out)
    assert out[:10].tobytes() == short


def test_the_launcher_is_named_by_strataio_mpiexec(monkeypatch: pytest.MonkeyPatch) -> None:
    from strataio.bench.mpi import mpiexec, run_ranks
    from strataio.errors import StrataError

    monkeypatch.setenv("STRATAIO_MPIEXEC", "/nonexistent/launcher")
    assert mpiexec() == "/nonexistent/launcher"
    with pytest.raises(StrataError, match="cannot run the MPI launcher '/nonexistent/launcher'"):
        run_ranks(1, "strataio.bench.collective", ["--pattern", "contig"], 10)
    from strataio.predict.ranks import launch

    with pytest.raises(StrataError, match="cannot run the MPI launcher"):
        launch(1, "strataio.bench.collective", [])
    monkeypatch.delenv("STRATAIO_MPIEXEC")
    assert mpiexec().endswith("mpiexec")


def test_weak_efficiency_is_the_rate_per_rank_against_the_fewest_ranks() -> None:
    def row(n: int, seconds: float) -> dict:
        return {"pattern": "contig", "op": "write", "ranks": n, "bytes": n * 2**20,
                "strataio": {"median": seconds}}  # fmt: skip

    eff = weak_efficiency([row(4, 0.4), row(1, 0.1), row(2, 0.1)], "strataio")
    assert eff == {("contig", "write"): {1: 1.0, 2: 1.0, 4: pytest.approx(0.25)}}


@pytest.mark.mpi
def test_pipeline_groups_at_two_ranks(tmp_path: Path) -> None:
    args = ["--pattern", "contig", "--pattern", "hpio512", "--ranks", "2"]
    result, rows = _bench(tmp_path, [*args, "--reps", "2", "--scale", "0.01", "--pipeline", "1,2"])
    assert [(r["pattern"], r["op"]) for r in rows] == [
        (p, op) for p in ("contig", "hpio512") for op in ("write", "read")
    ]
    for r in rows:
        assert r["strataio G=1"] > 0 and r["strataio G=2"] > 0 and r["ROMIO coll"] > 0
        assert r["pipeline"]["strataio G=1"]["median"] == pytest.approx(1.0)
        assert r["pipeline"]["strataio G=2"]["median"] > 0
    assert "G=2 / G=1" in result.output


@pytest.mark.parametrize(
    "args, wrong",
    [
        (["--size", "0"], "--size"),
        (["--reps", "0"], "--reps"),
        (["--mode", "call", "--scale", "-1"], "--scale"),
        (["--mode", "open-close", "--pattern", "hpio64-ind"], "use --mode call"),
        (["--per-rank", "1", "--size", "8"], "not both"),
        (["--per-rank", "1", "--mode", "call", "--all"], "drop --mode call"),
        (["--per-rank", "0"], "--per-rank"),
        (["--per-rank", "nan"], "expected a finite number above 0"),
        (["--size", "inf"], "expected a finite number above 0"),
        (["--ranks", "2,a"], "expected counts like 1,2,4"),
        (["--ranks", "2,0"], "every count must be at least 1"),
        (["--ranks", ","], "expected counts like 1,2,4"),
        (["--pipeline", "0,1"], "every count must be at least 1"),
        (["--per-rank", "1", "--pipeline", "1,2"], "drop --pipeline"),
        (["--pipeline", "1,2", "--mode", "open-close", "--all"], "drop --mode"),
        (["--mode", "call", "--size", "8", "--all"], "--size only applies to --mode open-close"),
        (["--pipeline", "1", "--op", "read", "--all"], "--op only applies"),
        (["--mode", "call", "--sync", "--size", "8", "--all"], "--size, --sync only apply"),
        (["--scale", "0.5"], "--scale only applies to --mode call"),
    ],
)
def test_bad_arguments_are_refused_before_any_launch(args: list[str], wrong: str) -> None:
    got = CliRunner().invoke(main, ["bench", "collective", "--ranks", "1", *args])
    assert got.exit_code == 2 and wrong in got.output


def test_pipeline_table_names_its_baseline_and_groups_past_the_ranks(capsys) -> None:
    """Ratios are against the first G given (not always G=1), and a G above the rank count,
    which runs as one group per rank, says so."""
    ratio = {"median": 1.0, "q1": 0.9, "q3": 1.1}
    row = {"pattern": "contig", "ranks": 2, "op": "write", "ROMIO coll": 9.0, "ROMIO ind": 8.0}
    row |= {"strataio G=2": 5.0, "strataio G=4": 6.0}
    row["pipeline"] = {"strataio G=2": ratio, "strataio G=4": ratio}
    _pipeline_table([row], [2, 4])
    out = capsys.readouterr().out
    assert "G=4 / G=2" in out and "G=1" not in out
    assert "6 (as G=2)" in out and "5 (as" not in out


def test_small_rates_keep_three_figures(capsys) -> None:
    """A small run's rates read as what they are, not 0 (whole numbers from 100 MB/s up)."""
    ratio = {"median": 1.0, "q1": 0.9, "q3": 1.1}
    row = {"pattern": "contig", "ranks": 2, "op": "write", "ROMIO coll": 0.0213}
    row |= {"ROMIO ind": 123.4, "strataio G=1": 4.567, "strataio G=2": 0.5}
    row["pipeline"] = {"strataio G=1": ratio, "strataio G=2": ratio}
    _pipeline_table([row], [1, 2])
    out = capsys.readouterr().out
    assert "0.0213" in out and "4.57" in out and "0.5" in out and "123" in out
    assert "123.4" not in out
