"""Run under ``mpiexec -n N ... ROOT``: repeated collective writes of a Session's dataset to a
disk tier too small for it (over a tape) keep every value: each ``read_all`` after a
``write_all`` matches a numpy oracle, on every rank, and so does a new Session's after the
first closes. Prints ``ok`` on rank 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from collective_checks import check
from mpi4py import MPI

import strataio
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

comm = MPI.COMM_WORLD
rank, nprocs = comm.Get_rank(), comm.Get_size()
root = Path(sys.argv[1])


def tiers() -> TierSet:
    return TierSet(
        [
            Tier("disk", PosixBackend(root / "disk"), "localdisk", order=0, capacity=5000),
            Tier("tape", PosixBackend(root / "tape"), "remotetape", order=1),
        ]
    )


def band(r: int, step: int) -> slice:
    # (odd steps rewrite part of each rank's band: its first chunk is read, then rewritten)
    return slice(8 * r + (step % 4 if step % 2 else 0), 8 * r + 8)


shape = (8 * nprocs, 64)  # (two 2 KiB chunks a rank: more than the disk holds)
oracle = np.zeros(shape)
rng = np.random.default_rng(1)
with strataio.Session(tiers=tiers(), catalog=root / "cat.db", comm=comm) as s:
    ds = s.create_dataset("y", shape, "f8", (4, 64), hint="LOCALDISK", codec="crc32c")
    for step in range(8):
        vals = rng.random((nprocs, 8, 64))
        for r in range(nprocs):
            sel = band(r, step)
            oracle[sel] = vals[r][: sel.stop - sel.start]
        mine = band(rank, step)
        ds.write_all(mine, vals[rank][: mine.stop - mine.start])
        check(np.array_equal(ds.read_all(...), oracle), f"step {step}: read_all")
    ds.close()
with strataio.Session(tiers=tiers(), catalog=root / "cat.db", comm=comm) as s:
    ds = s.open_dataset("y")
    check(np.array_equal(ds.read_all(...), oracle), "read_all by a new Session")
    ds.close()
if rank == 0:
    print("ok", flush=True)
