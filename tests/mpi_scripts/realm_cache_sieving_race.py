"""A realm cache written back while another rank's sieving write is between its read and its
write of a span holding the cached bytes: the write-back must wait for the span's lock, or the
span written back undoes it (the cache then clean, the collective write lost).

Rank 0 aggregates alone and holds bytes [256, 384) dirty from a collective write; rank 1
sieves an independent write of bytes [0, 10) and [1000, 1010) (one span over the cached ones)
and dawdles after reading the span, once rank 0 hears of it; rank 0 then reads [256, 384)
independently, which writes its cached page back. Prints ``ok`` on rank 0 when the file holds every write."""

import functools
import sys
import time

import numpy as np
from mpi4py import MPI

import strataio

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
path = f"{sys.argv[1]}/race.bin"
hints = {"romio_cb_pfr": "enable", "romio_cb_fr_types": "4096", "cb_nodes": 1,
         "romio_cb_write": "enable", "romio_cb_read": "enable", "romio_ds_write": "enable",
         "strataio_realm_cache": 2048}  # fmt: skip
with strataio.File.open(comm, path, "w", hints) as f:
    f.write_at_all(256, np.full(128 if rank == 0 else 0, 7, dtype=np.uint8))
    assert comm.allgather(f.realm_cache is not None)[0], "rank 0 keeps no realm cache"
    pieces = MPI.BYTE.Create_indexed([10, 10], [0, 1000]).Commit()
    f.set_view(0, MPI.BYTE, pieces if rank == 1 else MPI.BYTE)
    if rank == 1:
        driver, told = f.driver, []

        def dawdle(read, *args):
            got = read(*args)
            if not told:  # (the span read, not yet written back: rank 0 writes back now)
                told.append(True)
                comm.send("read", dest=0)
                time.sleep(1.0)
            return got

        driver.pread = functools.partial(dawdle, driver.pread)
        driver.readv = functools.partial(dawdle, driver.readv)
    comm.Barrier()
    if rank == 1:
        f.write_at(0, np.full(20, 9, dtype=np.uint8))
    else:
        comm.recv(source=1)  # (in MPI meanwhile: rank 1 locks this rank's cache first)
        back = np.zeros(128, dtype=np.uint8)
        f.read_at(256, back)
        assert (back == 7).all(), "an independent read missed the cached bytes"
    comm.Barrier()
    pieces.Free()
comm.Barrier()
if rank == 0:
    got = np.fromfile(path, dtype=np.uint8)
    want = np.zeros(1010, dtype=np.uint8)
    want[256:384] = 7
    want[0:10] = want[1000:1010] = 9
    assert np.array_equal(got, want), f"bytes lost: {np.flatnonzero(got != want)[:8]}"
    print("ok")
