"""Failures that are neither I/O errors nor strataio's own, on one rank of a two-phase call.

``planning``: rank 1 cannot plan the call (a MemoryError in the realm policy). Every rank must
raise — rank 1 its own error, the others a StrataError naming it — before any byte is written,
and the file must stay usable: a second collective write then lands whole. A ``set_size``
whose argument is not a number on rank 1 is agreed the same way, and rank 0 leaves the size
alone. Rank 0 prints one JSON object.

``exchange``: rank 1 fails to build its side of the second exchange; ``descriptors``: rank 1
fails after the planning's first collective, as the others exchange the pieces' descriptors.
The other ranks are already inside a collective that rank 1 will never join, so the job must
end (MPI_Abort) with a message rather than hang.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from mpi4py import MPI

import strataio
from strataio.collective import exchange, realms, twophase

HINTS = {"romio_cb_write": "enable", "romio_cb_read": "enable", "cb_buffer_size": "4096"}


def outcome(fn) -> str:
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def planning(path: str) -> None:
    comm = MPI.COMM_WORLD
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    block = 3 * 4096
    real = realms.EvenRealms.realms

    def out_of_memory(self, lo, hi, naggs, hints):  # type: ignore[no-untyped-def]
        raise MemoryError("injected: no memory for the realms")

    res: dict[str, object] = {}
    with strataio.File.open(comm, path, "w", hints=HINTS) as f:
        if rank == 1:
            realms.EvenRealms.realms = out_of_memory
        first = np.full(block, rank + 1, np.uint8)
        res["write"] = comm.gather(outcome(lambda: f.write_at_all(rank * block, first)))
        realms.EvenRealms.realms = real
        res["size_after_failure"] = f.get_size()
        f.write_at_all(rank * block, np.full(block, rank + 11, np.uint8))
        comm.Barrier()
        got = np.fromfile(path, np.uint8)
        want = np.repeat(np.arange(11, 11 + nprocs, dtype=np.uint8), block)
        res["second_write_whole"] = bool(np.array_equal(got, want))
        res["set_size"] = comm.gather(outcome(lambda: f.set_size("ten" if rank == 1 else 10)))
        res["size_after_set_size"] = f.get_size()
    if rank == 0:
        print(json.dumps(res))


def broken_exchange(path: str) -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    block = 3 * 4096
    real = exchange.ExchangeSide.__init__
    built = [0]

    def fails_second_time(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        built[0] += 1
        if rank == 1 and built[0] == 3:  # iteration 1, after both sides of iteration 0
            raise MemoryError("injected: no memory for the exchange")
        real(self, *args, **kwargs)

    exchange.ExchangeSide.__init__ = fails_second_time
    with strataio.File.open(comm, path, "w", hints=HINTS) as f:
        f.write_at_all(rank * block, np.full(block, rank + 1, np.uint8))
    print(f"rank {rank} finished", flush=True)


def broken_descriptors(path: str) -> None:
    """Rank 1 fails right after the planning's first collective, while the others go on to the
    descriptor exchange."""
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    block = 3 * 4096
    real = twophase.exclusive_cumsum

    def fails(lengths):  # type: ignore[no-untyped-def]
        if rank == 1:
            raise MemoryError("injected: no memory for the descriptors")
        return real(lengths)

    twophase.exclusive_cumsum = fails
    with strataio.File.open(comm, path, "w", hints=HINTS) as f:
        f.write_at_all(rank * block, np.full(block, rank + 1, np.uint8))
    print(f"rank {rank} finished", flush=True)


if __name__ == "__main__":
    mode, workdir = sys.argv[1], sys.argv[2]
    target = os.path.join(workdir, "f.bin")
    {"planning": planning, "exchange": broken_exchange, "descriptors": broken_descriptors}[mode](
        target
    )
