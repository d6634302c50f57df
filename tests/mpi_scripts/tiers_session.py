"""Run under ``mpiexec -n N``: a Session per rank; only rank 0 opens the catalog.

Each rank writes its own band of rows of one dataset; at close rank 0 commits every rank's
residency in one transaction. Every rank then reopens the dataset and checks the whole array,
and a duplicate create fails on every rank. Prints ``ok`` on rank 0 when all checks pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import strataio
from strataio.errors import ExistsError
from strataio.storage.posix import PosixBackend
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
a = np.arange(rows * 40, dtype="f8").reshape(rows, 40)
with strataio.Session(tiers=tiers, catalog=root / "cat.db", comm=comm) as s:
    assert (s.catalog is None) == (rank != 0), "only rank 0 may open the catalog"
    ds = s.create_dataset("par", a.shape, a.dtype, (10, 20), hint="AUTO")
    ds[rank * 10 : (rank + 1) * 10, :] = a[rank * 10 : (rank + 1) * 10, :]
    ds.close()  # collective: gathers every rank's residency to rank 0
    ds = s.open_dataset("par", "r+")
    assert np.array_equal(ds[...], a), "data mismatch"
    assert len(ds.residency()) == 2 * size
    ds.close()
    failed = 0
    try:
        s.create_dataset("par", (4,), "i4", (2,))
    except ExistsError:
        failed = 1
    assert comm.allreduce(failed) == size, "every rank must see the ExistsError"
if rank == 0:
    from strataio.catalog.base import open_catalog

    cat = open_catalog(root / "cat.db")
    # the reads staged nothing: in a parallel job only collective moves copy chunks
    assert {c.tier for c in cat.residency("par")} == {"tape"}
    assert len(cat.residency("par")) == 2 * size
    cat.close()
    print("ok", flush=True)
