"""Moves on a Session under MPI: stage / migrate / evict called on every rank are collective
(each chunk moved once, residency the same on every rank, errors agreed)."""

from __future__ import annotations

import pytest

from mpirun import run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_moves_called_on_every_rank_are_collective(tmp_path, nprocs):
    out = run_mpi(nprocs, "tiers_moves.py", tmp_path, timeout=120)
    assert out.strip().splitlines()[-1] == "ok"
