"""Run under ``mpiexec -n N``: stage / migrate / evict called on every rank, as the serial
example reads, move each chunk once and leave every rank with the same residency.

``python tiers_moves.py ROOT [STEPS] [SEED]``. First a scripted sequence: rank 0 writes a
dataset to the archive; every rank stages a section, migrates, stages, evicts and prefetches,
checking after each move the counts, that each chunk was put once, and that every rank holds
the catalog's residency; an unknown tier fails on every rank; a rank's write made just before a
move is kept. Then a seeded random walk of STEPS writes (one writing rank per epoch between
moves), prefetches and moves of random sections, checking data and residency after each move. Prints
``ok`` on rank 0 when all checks pass.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import numpy as np
from mpi4py import MPI

import strataio
from strataio.errors import StrataError
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
root = Path(sys.argv[1])


class CountingPosix(PosixBackend):
    """Counts the whole-object puts this rank makes (a move copies a chunk with one put)."""

    puts = 0

    def put(self, key, data, *, durable=False):
        if not key.endswith("zarr.json"):
            CountingPosix.puts += 1
        return super().put(key, data, durable=durable)


def puts_everywhere() -> int:
    """Chunk puts made by all ranks since the last call."""
    n, CountingPosix.puts = CountingPosix.puts, 0
    return comm.allreduce(n)


tiers = TierSet(
    [
        Tier("disk", CountingPosix(root / "disk"), "localdisk", order=0),
        Tier("tape", CountingPosix(root / "tape"), "remotetape", order=1),
    ]
)
a = np.arange(40 * 40, dtype="f8").reshape(40, 40)


def same_everywhere(ds, s) -> dict[str, list[str]]:
    """Each chunk's tiers, checked equal on every rank and (rank 0) to the catalog."""
    mine = {k: sorted(c.tier for c in cs) for k, cs in ds.residency().items()}
    every = comm.allgather(mine)
    assert all(m == every[0] for m in every), f"ranks disagree on residency: {every}"
    if rank == 0:
        rows: dict[str, list[str]] = {}
        for c in s.catalog.residency("m"):
            rows.setdefault(c.key, []).append(c.tier)
        assert {k: sorted(v) for k, v in rows.items()} == mine, (rows, mine)
    return mine


def scripted(s) -> None:
    """Each move once, with the counts it must give."""
    if True:
        ds = s.create_dataset("m", a.shape, a.dtype, (10, 10), hint="REMOTETAPE")
        if rank == 0:
            ds[...] = a
        ds.close()
        ds = s.open_dataset("m", "r+")
        puts_everywhere()

        r = ds.stage(np.s_[0:20, :], to="disk").wait()
        assert r.moved == 8 and r.reused == 0, r  # the same result on every rank
        assert puts_everywhere() == 8, "each chunk must be moved once, not once per rank"
        res = same_everywhere(ds, s)
        assert sorted(map(tuple, res.values())).count(("disk", "tape")) == 8, res

        r = ds.migrate(None, to="tape").wait()
        assert r.moved == 0 and r.reused == 16, r  # already on tape: nothing copied ...
        assert puts_everywhere() == 0
        res = same_everywhere(ds, s)
        assert all(v == ["tape"] for v in res.values()), res  # ... and the disk copies are gone
        r = ds.stage(None, to="disk").wait()
        assert r.moved == 16 and puts_everywhere() == 16, r
        r = ds.evict(np.s_[0:20, :], tier="disk").wait()
        assert r.moved + r.reused == 8, r
        res = same_everywhere(ds, s)
        assert sum("disk" in v for v in res.values()) == 8, res
        assert np.array_equal(ds[...], a)
        ds.prefetch(None).wait()  # each rank's own cache: no residency change
        same_everywhere(ds, s)

        failed = 0
        try:
            ds.stage(None, to="nowhere")
        except StrataError as exc:
            failed = int("nowhere" in str(exc))
        assert comm.allreduce(failed) == size, "every rank must see the unknown tier"

        # a rank's writes before a move are not lost by it: written, then migrated by rank 0
        if rank == size - 1:
            ds[30:40, 30:40] = -1.0
        comm.Barrier()
        r = ds.migrate(np.s_[30:40, 30:40], to="tape").wait()
        same_everywhere(ds, s)
        ds.close()
        b = a.copy()
        b[30:40, 30:40] = -1.0
        ds = s.open_dataset("m")
        assert np.array_equal(ds[...], b), "a rank's write was lost by a move"
        same_everywhere(ds, s)
        ds.close()


def random_walk(s, steps: int, seed: int) -> None:
    """Random writes by random ranks between collective moves of random sections, the same
    draws on every rank; after each move every rank holds the catalog's residency and reads
    the last value written everywhere."""
    rng = np.random.default_rng(seed)
    want = np.zeros((40, 40))
    ds = s.create_dataset("w", want.shape, want.dtype, (10, 10), hint="AUTO")
    writer, written = 0, False
    for step in range(1, steps + 1):
        lo = rng.integers(0, 40, 2)
        hi = lo + rng.integers(1, 25, 2)
        box = np.s_[lo[0] : min(hi[0], 40), lo[1] : min(hi[1], 40)]
        op = rng.choice(["write", "write", "prefetch", "stage", "migrate", "evict"])
        if op == "prefetch":
            # every rank's own cache, which must not hide a later write by another rank; read
            # only at an epoch's start (reading what another rank is writing conflicts)
            if not written:
                ds.prefetch(box).wait()
                comm.Barrier()
            continue
        if op == "write":
            # between two collective points one rank writes (two ranks rewriting a chunk
            # unsynchronized conflict, as they do in MPI-IO); each epoch draws its writer
            want[box] = step
            written = True
            if rank == writer:
                ds[box] = want[box]
            continue
        writer, written = int(rng.integers(0, size)), False
        puts_everywhere()  # the writes' puts are not the move's
        if op == "stage":
            r = ds.stage(box, to="disk").wait()
        elif op == "migrate":
            r = ds.migrate(box, to=str(rng.choice(["disk", "tape"]))).wait()
        else:
            # from tape, the slowest tier, a chunk with no other copy cannot go anywhere:
            # refused, kept
            r = ds.evict(box, tier=str(rng.choice(["disk", "tape"]))).result()
            assert all("'tape', the slowest tier, so it" in m for _, m in r.failed), r
        assert puts_everywhere() == r.moved or op == "evict", (step, op, r)
        assert np.array_equal(ds[...], want), f"step {step} ({op}): wrong data"
        mine = {k: sorted(c.tier for c in cs) for k, cs in ds.residency().items()}
        every = comm.allgather(mine)
        assert all(m == every[0] for m in every), f"step {step} ({op}): ranks disagree"
        if rank == 0:
            rows: dict[str, list[str]] = {}
            for c in s.catalog.residency("w"):
                rows.setdefault(c.key, []).append(c.tier)
            assert {k: sorted(v) for k, v in rows.items()} == mine, (step, op, rows, mine)
    ds.close()
    ds = s.open_dataset("w")
    assert np.array_equal(ds[...], want), "wrong data after close and reopen"
    ds.close()


steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
with strataio.Session(tiers=tiers, catalog=root / "cat.db", comm=comm) as session:
    try:
        scripted(session)
        random_walk(session, steps, seed=int(sys.argv[3]) if len(sys.argv) > 3 else 15)
    except BaseException:
        # a failed check on one rank ends the job rather than leave the others in a collective
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
if rank == 0:
    print("ok", flush=True)
