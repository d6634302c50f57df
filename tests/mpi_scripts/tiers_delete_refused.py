"""Run under ``mpiexec -n 2``: deleting a dataset the job has open is refused on every rank
(rank 0 deletes for all, and its refusal reaches the others), and deleting a name that does
not exist raises NotFoundError on every rank; once closed, the dataset is deleted.

Prints ``ok`` on rank 0 when the checks pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mpi4py import MPI

import strataio
from strataio.catalog.base import Catalog
from strataio.errors import DatasetInUseError, NotFoundError
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
root = Path(sys.argv[1])
tiers = TierSet([Tier("local", PosixBackend(root / "local"), "localdisk", order=0)])
Catalog.MARK_LINGER_S = 0.0  # (a closed dataset's mark goes at once)


def raised(call) -> str:
    try:
        call()
    except (DatasetInUseError, NotFoundError) as exc:
        return type(exc).__name__
    return ""


with strataio.Session(tiers=tiers, catalog=root / "cat.db", comm=comm) as s:
    ds = s.create_dataset("x", (8,), "i4", (4,), hint="LOCALDISK")
    ds[...] = 1
    everyone = comm.allgather(raised(lambda: s.delete_dataset("x")))
    assert everyone == ["DatasetInUseError"] * comm.Get_size(), everyone
    ds.close()
    everyone = comm.allgather(raised(lambda: s.delete_dataset("x")))
    assert everyone == [""] * comm.Get_size(), everyone
    everyone = comm.allgather(raised(lambda: s.delete_dataset("x")))
    assert everyone == ["NotFoundError"] * comm.Get_size(), everyone
if rank == 0:
    print("ok", flush=True)
