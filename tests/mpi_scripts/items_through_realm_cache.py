"""Index-schedule reads and writes on a file whose aggregators keep realm caches: a read sees
collective writes still cached, and a write is not overwritten by cached pages written back
later. Prints ``ok`` on rank 0."""

import sys

import numpy as np
from mpi4py import MPI

import strataio

comm = MPI.COMM_WORLD
rank, nprocs = comm.Get_rank(), comm.Get_size()
path = f"{sys.argv[1]}/items.bin"
hints = {"romio_cb_pfr": "enable", "romio_cb_write": "enable", "romio_cb_read": "enable",
         "cb_config_list": "*:*", "cb_nodes": nprocs}  # fmt: skip
N = 1024
idx = np.arange(rank, nprocs * N, nprocs)
with strataio.File.open(comm, path, "w", hints) as f:
    f.write_at_all(rank * N * 8, np.full(N, rank + 1, dtype=np.int64))
    assert any(comm.allgather(f.realm_cache is not None)), "no realm cache in use"
    sched = strataio.IndexSchedule(comm, idx, nprocs * N, 8)
    out = np.zeros(idx.size, dtype=np.int64)
    f.read_items(sched, out)
    assert (out == idx // N + 1).all(), "read_items missed bytes still in a realm cache"
    f.write_at_all(rank * N * 8, np.full(N, -1, dtype=np.int64))  # cached again
    f.write_items(sched, np.full(idx.size, 99, dtype=np.int64))
    back = np.zeros(N, dtype=np.int64)
    f.read_at_all(rank * N * 8, back)
    assert (back == 99).all(), "a collective read after write_items saw stale cached pages"
comm.Barrier()
if rank == 0:
    assert (np.fromfile(path, dtype=np.int64) == 99).all(), "cached pages overwrote write_items"
    print("ok")
