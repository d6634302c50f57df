"""strataio.File against ROMIO: random views, memory types and hints under mpiexec.

Each launch runs many seeded cases (tests/mpi_scripts/romio_diff.py): writes through both must
leave byte-identical files and reads must fill identical buffers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mpirun import run_mpi


def _run(nprocs: int, seed: int, cases: int, tmp_path: Path, timeout: float) -> str:
    args = ["--seed", seed, "--cases", cases, "--dir", tmp_path]
    return run_mpi(nprocs, "romio_diff.py", *args, timeout=timeout)


@pytest.mark.mpi
@pytest.mark.parametrize(("nprocs", "cases"), [(1, 40), (2, 30), (4, 8)])
def test_matches_romio(nprocs: int, cases: int, tmp_path: Path) -> None:
    out = _run(nprocs, seed=1000 + nprocs, cases=cases, tmp_path=tmp_path, timeout=60)
    assert f"ok {cases}" in out


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_matches_romio_long(nprocs: int, seed: int, tmp_path: Path) -> None:
    cases = 15 if nprocs >= 3 else 60
    out = _run(nprocs, seed=seed * 7919 + nprocs, cases=cases, tmp_path=tmp_path, timeout=120)
    assert f"ok {cases}" in out


@pytest.mark.mpi
@pytest.mark.parametrize(("nprocs", "cases"), [(2, 25), (3, 15)])
def test_steps_match_romio(nprocs: int, cases: int, tmp_path: Path) -> None:
    """Random sequences of views (some with hints of their own), seeks, collective and
    independent reads and writes at offsets and at the file pointer: files synced after every
    write byte-identical to ROMIO's, read buffers, counts and file pointers ROMIO's."""
    args = ["--seed", 77 + nprocs, "--cases", cases, "--dir", tmp_path]
    out = run_mpi(nprocs, "romio_steps.py", *args, timeout=60)
    assert f"ok {cases} cases" in out
