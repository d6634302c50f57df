"""Run under ``mpiexec -n 2 ... DIR open|create``: rank 0 reads (``open``) or stores
(``create``) dataset ``x``'s zarr.json for every rank, and fails: every rank raises that
error rather than wait for rank 0's answer for good (or go on with a dataset rank 0 gave up),
and the dataset is left in use by no one.

- ``open``: ``DIR`` holds dataset ``x`` whose tier ``local`` keeps a zarr.json from before an
  attribute change and whose tier ``remote`` the current one; ``remote`` stops answering (a
  file in its place), so rank 0 finds no current zarr.json (MetadataError).
- ``create``: no tier answers, so rank 0 cannot store the new dataset's zarr.json
  (BackendError).

Prints ``ok`` on rank 0 when the checks pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mpi4py import MPI

import strataio
from strataio.errors import BackendError, MetadataError
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
root, case = Path(sys.argv[1]), sys.argv[2]
tiers = TierSet(
    [
        Tier("local", PosixBackend(root / "local"), "localdisk", order=0),
        Tier("remote", PosixBackend(root / "remote"), "remotedisk", order=1),
    ]
)
comm.Barrier()
if rank == 0:
    for name in ("remote",) if case == "open" else ("local", "remote"):
        (root / name).rename(root / f"{name}.away")
        (root / name).write_bytes(b"")
comm.Barrier()
with strataio.Session(tiers=tiers, catalog=root / "cat.db", comm=comm) as s:
    expected = MetadataError if case == "open" else BackendError
    raised = ""
    try:
        if case == "open":
            s.open_dataset("x").close()
        else:
            s.create_dataset("x", (8,), "i4", (4,), hint="LOCALDISK").close()
    except expected as exc:
        raised = type(exc).__name__
    everyone = comm.allgather(raised)
    assert everyone == [expected.__name__] * comm.Get_size(), everyone
    if rank == 0:
        assert s.catalog.datasets_in_use() == set(), s.catalog.datasets_in_use()
if rank == 0:
    print("ok", flush=True)
