"""An aggregator's read fails while its background I/O thread still has work: the call must
raise on every rank and leave nothing running, so the next collective call (a write through
the same realm buffers) writes every byte. Rank 0 prints how the read ended on each rank and
how many bytes are wrong after the write. An optional second argument pipelines the calls
in that many groups."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import strataio
from strataio.collective import fileio


def main(workdir: str, groups: int = 1) -> None:
    comm = MPI.COMM_WORLD
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    path = os.path.join(workdir, "f.bin")
    window = 4096
    hints = {
        "romio_cb_write": "enable",
        "romio_cb_read": "enable",
        "cb_buffer_size": str(window),
        "cb_nodes": "1" if groups == 1 else str(nprocs),
        "strataio_cb_overlap": "enable",
        "strataio_pipeline_groups": str(groups),  # (> 1: every rank aggregates)
    }
    block = 8 * window
    if rank == 0:
        np.full(block * nprocs, 7, np.uint8).tofile(path)
    comm.Barrier()
    real = fileio.pread_into
    failing = [True]

    def slow_and_failing(driver: object, buf: np.ndarray, offset: int, **kw: object) -> None:
        if failing[0] and offset < window:  # the first window fails
            raise OSError(5, "injected EIO")
        time.sleep(0.02)  # the later windows are still being read when the call ends
        real(driver, buf, offset, **kw)

    fileio.pread_into = slow_and_failing
    with strataio.File.open(comm, path, "r+", hints=hints) as f:
        try:
            f.read_at_all(rank * block, np.empty(block, np.uint8))
            ended = "returned"
        except strataio.StrataError as exc:
            ended = type(exc).__name__
        failing[0] = False
        f.write_at_all(rank * block, np.full(block, rank + 1, np.uint8))
    fileio.pread_into = real
    ends = comm.gather(ended)
    comm.Barrier()
    if rank == 0:
        time.sleep(0.3)  # a stray read still queued would land in the buffers by now
        got = np.fromfile(path, np.uint8)
        want = np.repeat(np.arange(1, nprocs + 1, dtype=np.uint8), block)
        print(json.dumps({"read": ends, "wrong": int(np.count_nonzero(got != want))}))


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
