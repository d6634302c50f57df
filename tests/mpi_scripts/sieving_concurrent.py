"""Concurrent sieving writers, under mpiexec: strataio, ROMIO, and both on one file.

Every rank owns every ``(nprocs + 1)``-th block of ``L`` bytes, starting at block ``rank``
(the last slot of each period is nobody's: a hole that must keep its original bytes). Each
rank writes its blocks ``rounds`` times with fresh data, without barriers, by data sieving
with a small buffer, so every read-modify-write span holds other ranks' blocks. Three files
start with the same random bytes:

- ``A``: every rank uses ``strataio.collective.sieving.write_sieved``;
- ``B``: every rank uses ROMIO (``MPI.File.Write_at`` through a strided file view, hints
  ``romio_ds_write=enable``), the reference;
- ``C``: even ranks use strataio, odd ranks ROMIO — correct only if both lock the same way
  (POSIX record locks).

Rank 0 prints ``ok`` when A, B and C all equal the expected bytes; exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

from strataio.collective.driver import PosixDriver
from strataio.collective.sieving import write_sieved
from strataio.layout.datatypes import flatten_count


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--block", type=int, default=24)
    ap.add_argument("--blocks", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--buffer", type=int, default=4096)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    L, nb, period = args.block, args.blocks, size + 1
    total = nb * period * L
    paths = {k: os.path.join(args.dir, k) for k in "ABC"}
    initial = np.random.default_rng(99).integers(0, 256, total + 100, dtype=np.uint8)
    if rank == 0:
        for p in paths.values():
            with open(p, "wb") as f:
                f.write(initial.tobytes())
    comm.Barrier()

    block = MPI.BYTE.Create_contiguous(L).Create_resized(0, period * L)
    block.Commit()
    pieces = flatten_count(block, nb, disp=rank * L)
    info = MPI.Info.Create()
    info.Set("romio_ds_write", "enable")
    info.Set("ind_wr_buffer_size", str(args.buffer))

    def data(r: int) -> np.ndarray:
        return np.random.default_rng(1000 * rank + r).integers(0, 256, nb * L, dtype=np.uint8)

    def with_strataio(path: str) -> None:
        driver = PosixDriver.open(path, os.O_RDWR)
        try:
            for r in range(args.rounds):
                write_sieved(driver, pieces, data(r), args.buffer)
        finally:
            driver.close()

    def with_romio(path: str) -> None:
        fh = MPI.File.Open(MPI.COMM_SELF, path, MPI.MODE_RDWR, info)
        fh.Set_view(rank * L, MPI.BYTE, block, "native", info)
        for r in range(args.rounds):
            fh.Write_at(0, data(r))
        fh.Close()

    with_strataio(paths["A"])
    with_romio(paths["B"])
    (with_strataio if rank % 2 == 0 else with_romio)(paths["C"])
    comm.Barrier()
    block.Free()
    info.Free()

    bad = []
    if rank == 0:
        want = initial.copy()
        for q in range(size):
            final = np.random.default_rng(1000 * q + args.rounds - 1).integers(
                0, 256, nb * L, dtype=np.uint8
            )
            idx = (np.arange(nb)[:, None] * period * L + q * L + np.arange(L)).reshape(-1)
            want[idx] = final
        for k, p in paths.items():
            got = np.fromfile(p, dtype=np.uint8)
            if got.size != want.size or not np.array_equal(got, want):
                diff = np.flatnonzero(got[: want.size] != want[: got.size])
                bad.append(f"file {k}: {diff.size} bytes differ (first at {diff[:5].tolist()})")
        print("\n".join(bad) if bad else "ok", flush=True)
    return 1 if comm.bcast(bool(bad), root=0) else 0


if __name__ == "__main__":
    sys.exit(main())
