"""Run under ``mpiexec -n 2``: an in-place rewrite on rank 0 is announced in the catalog.

Rank 0 holds the catalog, so like a single process it records a rewrite of catalogued chunks
(state ``in-transit``, new checksum) before replacing their objects. fsck run at that moment,
as after a crash of the job, adopts rank 0's rewritten objects instead of calling them
corrupt. (Other ranks cannot reach the catalog between collectives: their rewrites are not
announced.)
Prints ``ok`` on rank 0 when all checks pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import strataio
from strataio.storage.posix import PosixBackend
from strataio.tiers.fsck import fsck
from strataio.tiers.tier import Tier, TierSet

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
root = Path(sys.argv[1])
tiers = TierSet(
    [
        Tier("disk", PosixBackend(root / "disk"), "localdisk", order=0),
        Tier("tape", PosixBackend(root / "tape"), "remotetape", order=1),
    ]
)
rows = 10 * size
a = np.arange(rows * 20, dtype="f8").reshape(rows, 20)
mine = [f"c/{rank}/{j}" for j in range(2)]
with strataio.Session(tiers=tiers, catalog=root / "cat.db", comm=comm) as s:
    ds = s.create_dataset("rw", a.shape, a.dtype, (10, 10), hint="LOCALDISK")
    ds[rank * 10 : (rank + 1) * 10, :] = a[rank * 10 : (rank + 1) * 10, :]
    ds.close()
    ds = s.open_dataset("rw", "r+")
    ds[rank * 10 : (rank + 1) * 10, :] = -a[rank * 10 : (rank + 1) * 10, :]  # in place
    comm.Barrier()
    err = None
    if rank == 0:
        try:
            assert s.catalog is not None
            rows0 = {c.key: c for c in s.catalog.residency("rw") if c.key in mine}
            assert {c.state for c in rows0.values()} == {"in-transit"}, rows0
            # the job dies here: fsck (read-only, grace elapsed) adopts rank 0's rewritten
            # objects instead of calling them corrupt
            report = fsck(s.catalog, s.tiers, grace=0)
            got = sorted((f.kind, f.key, f.action) for f in report.findings if f.key in mine)
            assert got == [("state", k, "adopt object") for k in mine], report.findings
        except AssertionError as exc:
            err = repr(exc)
    err = comm.bcast(err, root=0)  # every rank fails together rather than hang in close
    assert err is None, err
    ds.close()
    ds = s.open_dataset("rw")
    b = a.copy()
    b[: 10 * size] *= -1
    assert np.array_equal(ds[...], b), "data mismatch"
    ds.close()
    if rank == 0:
        assert s.catalog is not None
        assert {c.state for c in s.catalog.residency("rw")} == {"valid"}
        report = fsck(s.catalog, s.tiers)
        assert report.clean, report.problems
if rank == 0:
    print("ok", flush=True)
