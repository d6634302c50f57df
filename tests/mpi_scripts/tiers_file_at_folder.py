"""Run under ``mpiexec -n 2``: rank 1's new chunk ``c/1/0`` has a file put where its folder
goes before the close. Ranks of a parallel job report no write the commit leaves out, so
the close must fail on every rank, rather than return with that write recorded nowhere.
Prints ``ok`` on rank 0 when all checks pass.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

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
raised = ""
with strataio.Session(tiers=tiers, catalog=root / "cat.db", comm=comm) as s:
    ds = s.create_dataset("rw", (20, 10), "f8", (10, 10), hint="LOCALDISK")
    ds[rank * 10 : (rank + 1) * 10, :] = rank + 1.0
    comm.Barrier()
    if rank == 1:
        folder = root / "disk" / "rw" / "c" / "1"
        shutil.rmtree(folder)
        folder.write_bytes(b"")
    comm.Barrier()
    try:
        ds.close()
    except strataio.StrataError as exc:
        raised = str(exc)
    said = comm.gather(raised, root=0)
if rank == 0:
    assert all(said), f"a rank's close returned: {said}"
    assert any("Not a directory" in m for m in said), said
    with strataio.Session(tiers=tiers, catalog=root / "cat.db") as s:
        assert all(t.up for t in s.tiers)
    print("ok")
