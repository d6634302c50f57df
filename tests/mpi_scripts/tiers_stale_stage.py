"""Run under ``mpiexec -n 2``: a chunk rank 0 has read (and, with staging on read, would have
copied to disk) and rank 1 then rewrites reads back as rank 1's value on every rank.

Staging on read copied the chunk to disk on rank 0 alone; rank 1, rewriting the tape copy it
knew, left that disk copy standing, and every later read returned the old value from it.
Prints ``ok`` on rank 0 when the check passes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import strataio
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
root = Path(sys.argv[1])
tiers = TierSet(
    [
        Tier("disk", PosixBackend(root / "disk"), "localdisk", order=0),
        Tier("tape", PosixBackend(root / "tape"), "remotetape", order=1),
    ]
)
with strataio.Session(tiers=tiers, catalog=root / "cat.db", comm=comm) as s:
    ds = s.create_dataset("x", (20, 20), "f8", (10, 10), hint="REMOTETAPE")
    if rank == 0:
        ds[...] = 1.0
    ds.close()
    ds = s.open_dataset("x", "r+")
    if rank == 0:
        assert (ds[...] == 1.0).all()
    comm.Barrier()
    if rank == 1:
        ds[0:10, 0:10] = 2.0
    ds.close()
    ds = s.open_dataset("x")
    got = np.unique(ds[0:10, 0:10]).tolist()
    ds.close()
every = comm.gather(got, root=0)
if rank == 0:
    assert every == [[2.0], [2.0]], f"ranks read {every}, rank 1 wrote 2.0"
    print("ok", flush=True)
