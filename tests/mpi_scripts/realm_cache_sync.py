"""A realm cache across ``sync``: bytes another process writes into the file between two
syncs (MPI's sync-barrier-sync) are what the next collective read returns, and a collective
write next to them afterwards leaves them in the file. Run under mpiexec with 2 or more ranks;
rank 0 prints ``{"stale": [...], "lost": n}``: per rank the bytes of its read that were not
the other process's, and the bytes of the other process that the file lost at close; then,
after the other process cuts a file between two syncs, the size every rank sees and the
bytes each rank's read of its own block counts (``"size"``, ``"counts"``)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from mpi4py import MPI

import strataio


def main(workdir: str) -> None:
    comm = MPI.COMM_WORLD
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    path = os.path.join(workdir, "synced.bin")
    block = 4096
    hints = {
        "romio_cb_write": "enable",
        "romio_cb_read": "enable",
        "cb_config_list": "*:*",
        "romio_cb_pfr": "enable",
        "romio_cb_fr_types": str(block),
        "strataio_realm_cache": str(1 << 20),
    }
    theirs = slice(100, 150)  # (of every rank's block: what the other process writes)
    with strataio.File.open(comm, path, "w", hints=hints) as f:
        f.write_at_all(rank * block, np.full(block, rank + 1, np.uint8))
        f.sync()
        if rank == 0:  # another process (here: a plain file handle) writes, and syncs
            with open(path, "r+b") as other:
                for r in range(nprocs):
                    other.seek(r * block + theirs.start)
                    other.write(bytes([200]) * (theirs.stop - theirs.start))
                other.flush()
                os.fsync(other.fileno())
        comm.Barrier()
        f.sync()
        got = np.zeros(block, np.uint8)
        f.read_at_all(rank * block, got)
        stale = int(np.count_nonzero(got[theirs] != 200))
        # a write around the other process's bytes, in the same pages
        f.write_at_all(rank * block, np.full(theirs.start, 50, np.uint8))
        f.write_at_all(rank * block + theirs.stop, np.full(50, 60, np.uint8))
    lost = 0
    if rank == 0:
        data = np.fromfile(path, np.uint8).reshape(nprocs, block)
        lost = int(np.count_nonzero(data[:, theirs] != 200))
    path = os.path.join(workdir, "cut.bin")
    with strataio.File.open(comm, path, "w", hints=hints) as f:
        f.write_at_all(rank * block, np.full(block, rank + 1, np.uint8))
        f.sync()
        if rank == 0:
            os.truncate(path, block // 2)  # another process cuts the file
        comm.Barrier()
        f.sync()
        size = f.get_size()
        count = f.read_at_all(rank * block, np.zeros(block, np.uint8))
    stales, sizes, counts = comm.gather(stale), comm.gather(size), comm.gather(count)
    if rank == 0:
        print(json.dumps({"stale": stales, "lost": lost, "size": sizes, "counts": counts}))


if __name__ == "__main__":
    main(sys.argv[1])
