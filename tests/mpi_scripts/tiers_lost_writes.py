"""Run under ``mpiexec -n 2 ... ROOT [HOW]``: each rank rewrites its half of a dataset
migrated to tape (its chunks ``c/<rank>/0`` and ``c/<rank>/1`` land on disk), then the new
object of each rank's first chunk is deleted by hand, and the commit cannot record those
writes. What comes next (HOW) must raise ChunksNotStoredError on every rank naming both chunks
(the other rank's too), rather than return with the writes lost in silence or let one rank
raise alone: the close (``close``, the default); a collective write of nothing and a flush
(``write_all``); a collective move of the other chunks (``migrate``). The lost writes' chunks
keep their previous values (no rank deleted the copies those writes would have replaced),
the others their new ones. Prints ``ok`` on rank 0 when all checks pass.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from disk_and_tape import disk_and_tape
from mpi4py import MPI

import strataio
from strataio.errors import ChunksNotStoredError

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
root = Path(sys.argv[1])
how = sys.argv[2] if len(sys.argv) > 2 else "close"
raised = ""
with strataio.Session(tiers=disk_and_tape(root), catalog=root / "cat.db", comm=comm) as s:
    ds = s.create_dataset("rw", (20, 20), "f8", (10, 10), hint="LOCALDISK")
    ds[rank * 10 : (rank + 1) * 10, :] = 1.0
    ds.close()
    ds = s.open_dataset("rw", "r+")
    ds.migrate(np.s_[...], to="tape").wait()  # (collective: the old values stay there)
    ds[rank * 10 : (rank + 1) * 10, :] = 2.0  # (chunks c/<rank>/0 and c/<rank>/1, on disk)
    comm.Barrier()
    if rank == 0:  # (one rank deletes them: rank 0's own new object, and rank 1's)
        for key in ("c/0/0", "c/1/0"):
            os.remove(root / "disk" / "rw" / key)
    comm.Barrier()
    try:
        if how == "close":
            ds.close()
        elif how == "migrate":  # (collective: every rank's changes recorded, then the move)
            ds.migrate(np.s_[:, 10:20], to="tape").wait()
        else:
            ds.write_all(None)  # (collective: every rank's changes recorded by rank 0)
            ds.flush()
    except ChunksNotStoredError as exc:
        raised = str(exc)
    said = comm.gather(raised, root=0)
    ds.close()  # (says nothing more: every rank said it)
    ds = s.open_dataset("rw")
    got = ds.read_all(np.s_[...])
    ds.close()
# (checked once every collective call is done: a rank failing sooner would leave the other
# waiting)
want = np.full((20, 20), 2.0)
want[0:10, 0:10] = want[10:20, 0:10] = 1.0  # (the lost writes' chunks keep their old value)
assert np.array_equal(got, want), got
if rank == 0:
    assert all(said), f"a rank went on: {said}"
    assert all("c/0/0, c/1/0 keep their previous values" in m for m in said), said
    print("ok")
