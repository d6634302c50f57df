"""Run under ``mpiexec -n 2`` on the directory of dataset ``x`` whose tier ``local`` holds a
zarr.json from before an attribute change and whose tier ``remote`` the current one. Once
``remote`` stops answering (a file in its place), rank 0 finds no current zarr.json
(MetadataError), and every rank's open raises it instead of waiting for rank 0's answer for
good, leaving the dataset in use by no one.

Prints ``ok`` on rank 0 when the checks pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mpi4py import MPI

import strataio
from strataio.errors import MetadataError
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
    (root / "remote").rename(root / "remote.away")
    (root / "remote").write_bytes(b"")
comm.Barrier()
with strataio.Session(tiers=tiers, catalog=root / "cat.db", comm=comm) as s:
    raised = ""
    try:
        s.open_dataset("x").close()
    except MetadataError as exc:
        raised = type(exc).__name__
    everyone = comm.allgather(raised)
    assert everyone == ["MetadataError"] * comm.Get_size(), everyone
    if rank == 0:  # the open that failed left the dataset in use by no one
        assert s.catalog.datasets_in_use() == set(), s.catalog.datasets_in_use()
if rank == 0:
    print("ok", flush=True)
