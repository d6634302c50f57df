"""Moves on a Session under MPI: stage / migrate / evict called on every rank are collective
(each chunk moved once, residency the same on every rank, errors agreed)."""

from __future__ import annotations

import pytest

from mpirun import run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_moves_called_on_every_rank_are_collective(tmp_path, nprocs):
    out = run_mpi(nprocs, "tiers_moves.py", tmp_path, 30, 15, timeout=120)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_moves_random_walk_long(tmp_path, seed):
    out = run_mpi(3, "tiers_moves.py", tmp_path, 300, seed, timeout=600)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.mpi
def test_every_rank_reads_what_another_rank_rewrote(tmp_path):
    """No rank keeps a copy (a staged one, a prefetched one) that hides a later rewrite."""
    out = run_mpi(2, "tiers_stale_stage.py", tmp_path)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.mpi
def test_a_move_the_ranks_ask_for_differently_raises_on_every_rank(tmp_path):
    """A move is collective and rank 0 runs it for all: ranks naming other tiers or sections
    (or a tier one rank does not know) make every rank raise, and nothing moves."""
    out = run_mpi(2, "tiers_move_arguments.py", tmp_path, timeout=120)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_chunks_a_failed_write_all_stored_are_read_by_every_rank(tmp_path, nprocs):
    """A collective write whose chunk writes fail on one rank raises on every rank, and the
    chunks the other ranks stored are known to every rank: none reads their old values."""
    out = run_mpi(nprocs, "tiers_failed_write_all.py", tmp_path, timeout=120)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_write_all_to_a_full_tier_keeps_every_value(tmp_path, nprocs):
    """Collective writes that outgrow the fast tier go on to the next one: no rank evicts
    copies another rank is rewriting or reading, so every value written is read back, in
    the job and by a later Session."""
    out = run_mpi(nprocs, "tiers_write_all_full_tier.py", tmp_path, timeout=120)
    assert out.strip().splitlines()[-1] == "ok"
