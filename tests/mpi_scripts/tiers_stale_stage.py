"""Run under ``mpiexec -n 2``: a chunk one rank has read, then another rank rewrites, reads
back as the new value on every rank after the dataset is closed and reopened.

1. Rank 0 reads a chunk kept on tape, rank 1 rewrites it. Staging on read used to copy the
   chunk to disk on rank 0 alone; rank 1, rewriting the tape copy it knew, left that disk copy
   standing, and every later read returned the old value from it.
2. Rank 1 prefetches a chunk, rank 0 rewrites it. Rank 1's prefetch cache outlived the close
   and served the old bytes after the reopen.

Prints ``ok`` on rank 0 when the checks pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from disk_and_tape import disk_and_tape
from mpi4py import MPI

import strataio

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
root = Path(sys.argv[1])
tiers = disk_and_tape(root)
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
    ds = s.create_dataset("y", (20, 20), "f8", (10, 10), hint="LOCALDISK")
    if rank == 0:
        ds[...] = 1.0
    ds.close()
    ds = s.open_dataset("y", "r+")
    if rank == 1:
        ds.prefetch(None).wait()
    comm.Barrier()
    if rank == 0:
        ds[0:10, 0:10] = 3.0
    ds.close()
    ds = s.open_dataset("y")
    cached = np.unique(ds[0:10, 0:10]).tolist()
    ds.close()
every = comm.gather((got, cached), root=0)
if rank == 0:
    assert [g for g, _ in every] == [[2.0], [2.0]], f"ranks read {every}, rank 1 wrote 2.0"
    assert [c for _, c in every] == [[3.0], [3.0]], f"ranks read {every}, rank 0 wrote 3.0"
    print("ok", flush=True)
