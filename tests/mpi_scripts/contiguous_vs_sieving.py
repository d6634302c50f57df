"""A contiguous collective write racing another rank's sieving write_at, under mpiexec -n 2.

Rank 0 writes one contiguous block with ``write_at_all``; rank 1 joins that call with no data
and at once writes two small pieces on both sides of the block with ``write_at`` under
``romio_ds_write=enable``, so its read-modify-write span covers rank 0's block. The bytes are
disjoint, so both writes must survive: the contiguous write takes a lock as well. Rank 0
prints ``lost N`` (N bytes of its block overwritten by stale data over all rounds).
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import strataio

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
block, rounds = 4 << 20, 20
path = sys.argv[1] + "/race.bin"
hints = {"romio_ds_write": "enable", "ind_wr_buffer_size": 32 << 20}
with strataio.File.open(comm, path, "w", hints) as fh:
    if rank == 0:
        ft = MPI.BYTE.Create_contiguous(block).Commit()
        disp = 4096
    else:
        ft = MPI.BYTE.Create_hindexed([1024, 1024], [0, 4096 + block + 1024]).Commit()
        disp = 0
    fh.set_view(disp, MPI.BYTE, ft)
    fh.set_size(block + 16384)
    lost = 0
    for it in range(rounds):
        val = it % 250 + 1
        if rank == 0:
            fh.write_at_all(0, np.full(block, val, np.uint8))
        else:
            fh.write_at_all(0, np.zeros(0, np.uint8))
            fh.write_at(0, np.full(2048, 0xEE, np.uint8))
        comm.Barrier()
        if rank == 0:
            back = np.zeros(block, np.uint8)
            fh.read_at(0, back)
            lost += int((back != val).sum())
        comm.Barrier()
    ft.Free()
if rank == 0:
    print(f"lost {lost}")
