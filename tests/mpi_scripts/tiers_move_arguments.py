"""Run under ``mpiexec -n 2``: a collective move whose ranks ask for different moves (another
tier, another section, a tier that does not exist on one rank) raises on every rank, moves
nothing, and the next move that every rank asks for alike runs.

Prints ``ok`` on rank 0 when the checks pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

from disk_and_tape import disk_and_tape
from mpi4py import MPI

import strataio
from strataio.errors import ArgumentError, NotFoundError, StrataError

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
root = Path(sys.argv[1])
tiers = disk_and_tape(root)


def tiers_of(ds):
    return sorted({c.tier for cs in ds.residency().values() for c in cs})


def refused(call, kind, says):
    try:
        call()
    except kind as exc:
        assert says in str(exc), str(exc)
        return
    raise AssertionError(f"rank {rank}: {call} did not raise {kind.__name__}")


with strataio.Session(tiers=tiers, catalog=root / "cat.db", comm=comm) as s:
    ds = s.create_dataset("x", (20, 20), "f8", (10, 10), hint="LOCALDISK")
    if rank == 0:
        ds[...] = 1.0
    ds.close()
    ds = s.open_dataset("x", "r+")
    # one rank names a tier that does not exist: NotFoundError on that rank, and on the others
    # the same class naming it
    bad = "nosuchtier" if rank == 1 else "tape"
    refused(lambda: ds.migrate(None, to=bad), NotFoundError, "nosuchtier")
    # the ranks ask for other tiers, or other sections
    refused(lambda: ds.migrate(None, to=["tape", "disk"][rank]), ArgumentError, "collective")
    part = (slice(0, 10), slice(None)) if rank == 0 else (slice(10, 20), slice(None))
    refused(lambda: ds.evict(part, tier="disk"), ArgumentError, "collective")
    # a section that does not fit the dataset on one rank: an error there, no rank waiting
    part = (slice(0, 30), slice(None)) if rank == 1 else (slice(None), slice(None))
    refused(lambda: ds.stage(part, to="disk"), StrataError, "")
    assert tiers_of(ds) == ["disk"], tiers_of(ds)  # (nothing moved)
    got = ds.migrate(None, to="tape").wait()
    assert got.moved == 4 and tiers_of(ds) == ["tape"], (got, tiers_of(ds))
    ds.close()
    assert issubclass(ArgumentError, StrataError)
if rank == 0:
    print("ok")
