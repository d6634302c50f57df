"""Run under ``mpiexec -n N ... ROOT``: a collective write of a Session's dataset in which the
last rank's chunk writes fail raises on every rank, and the chunks the other ranks wrote
keep their new values on every rank: read independently, with ``read_all`` (whose owner of
a chunk may be a rank that did not write it) and after a reopen. Prints ``ok`` on rank 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from collective_checks import check, raises_everywhere
from disk_and_tape import disk_and_tape
from mpi4py import MPI

import strataio
from strataio.errors import StrataError

comm = MPI.COMM_WORLD
rank, nprocs = comm.Get_rank(), comm.Get_size()
last = rank == nprocs - 1
root = Path(sys.argv[1])
with strataio.Session(tiers=disk_and_tape(root), catalog=root / "cat.db", comm=comm) as s:
    ds = s.create_dataset("t", (4 * nprocs,), "i4", (4,), hint="LOCALDISK", codec="crc32c")
    if last:  # (every chunk this rank owns fails to be stored)

        def refused(items):
            raise OSError(28, "No space left on device (simulated)")

        ds.store.put_chunks = refused
    mine = np.s_[4 * rank : 4 * rank + 4]  # (one chunk each, its only writer)
    check(raises_everywhere(lambda: ds.write_all(mine, rank + 1), (OSError, StrataError)), "raised")
    if last:
        del ds.store.put_chunks
    want = np.repeat(np.arange(1, nprocs + 1, dtype="i4"), 4)
    want[-4:] = 0  # (the last rank's chunk was never stored)
    check(np.array_equal(ds[...], want), f"rank {rank} reads {ds[...]} independently")
    other = (rank + 1) % nprocs  # (read by this rank alone, written by the next)
    got = ds.read_all(np.s_[4 * other : 4 * other + 4])
    check(np.array_equal(got, want[4 * other : 4 * other + 4]), f"rank {rank} read_all {got}")
    ds.close()
    ds = s.open_dataset("t")
    check(np.array_equal(ds.read_all(...), want), "reopened")
    ds.close()

if rank == 0:
    print("ok", flush=True)
