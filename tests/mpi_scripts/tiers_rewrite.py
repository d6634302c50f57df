"""Run under ``mpiexec -n 2``: in-place rewrites are announced in the catalog on every rank.

Every rank records a rewrite of catalogued chunks (state ``in-transit``, new and old
checksum, the job's writer id) before replacing their objects: rank 0 through the catalog it
holds, the others through a connection of their own opened for that. fsck run at that moment
sees a live writer and leaves the rows alone; a reader accepts either version. After the close
every row is valid again.
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
keys = [f"c/{r}/{j}" for r in range(size) for j in range(2)]
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
            rows = {c.key: c for c in s.catalog.residency("rw")}
            assert {rows[k].state for k in keys} == {"in-transit"}, rows
            assert {rows[k].writer for k in keys} == {s.writer}, rows
            assert all(rows[k].old_checksum for k in keys), rows
            # the job is alive: fsck leaves its announced rewrites to it
            report = fsck(s.catalog, s.tiers, repair=True)
            got = sorted((f.kind, f.key, f.action) for f in report.findings)
            assert got == [("in-flight", k, "left alone") for k in sorted(keys)], got
            # a reader in another session accepts the whole copies (old or new version)
            with strataio.Session(tiers=tiers, catalog=root / "cat.db") as other:
                seen = other.open_dataset("rw")[...]
                assert np.array_equal(np.abs(seen), a), "announced copies not readable"
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
