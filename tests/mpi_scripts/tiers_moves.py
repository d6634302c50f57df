"""Run under ``mpiexec -n N``: stage / migrate / evict / prefetch called on every rank, as the
serial example reads, move each chunk once and leave every rank with the same residency.

Rank 0 writes a dataset to the archive; then every rank stages a section, migrates it back,
evicts, and prefetches, checking after each move that every rank sees the same copies as the
catalog and reads the right values. A move that fails (an unknown tier) fails on every rank.
Prints ``ok`` on rank 0 when all checks pass.
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


def main(s) -> None:
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


with strataio.Session(tiers=tiers, catalog=root / "cat.db", comm=comm) as session:
    try:
        main(session)
    except BaseException:
        # a failed check on one rank ends the job rather than leave the others in a collective
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
if rank == 0:
    print("ok", flush=True)
