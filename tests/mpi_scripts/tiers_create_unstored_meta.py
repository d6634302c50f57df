"""Run under ``mpiexec -n 2``: a dataset created while no tier answers (a file in the place of
each tier's directory) is catalogued, but rank 0 cannot store its zarr.json: every rank's
create raises that error, and the dataset is left in use by no one.

Prints ``ok`` on rank 0 when the checks pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mpi4py import MPI

import strataio
from strataio.errors import BackendError
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
root = Path(sys.argv[1])
tiers = TierSet(
    [
        Tier("local", PosixBackend(root / "local"), "localdisk", order=0),
        Tier("remote", PosixBackend(root / "remote"), "remotedisk", order=1),
    ]
)
comm.Barrier()
if rank == 0:
    for name in ("local", "remote"):
        (root / name).rename(root / f"{name}.away")
        (root / name).write_bytes(b"")
comm.Barrier()
with strataio.Session(tiers=tiers, catalog=root / "cat.db", comm=comm) as s:
    raised = ""
    try:
        s.create_dataset("x", (8,), "i4", (4,), hint="LOCALDISK").close()
    except BackendError as exc:
        raised = type(exc).__name__
    everyone = comm.allgather(raised)
    assert everyone == ["BackendError"] * comm.Get_size(), everyone
    if rank == 0:
        assert s.catalog.datasets_in_use() == set(), s.catalog.datasets_in_use()
if rank == 0:
    print("ok", flush=True)
