"""A LoopCache given bad input on one rank only: every rank raises a StrataError (no rank
waits in a collective the others skip), and nothing is written. Rank 0 prints one JSON
object: case -> the set of outcomes over the ranks."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from mpi4py import MPI

import strataio

comm = MPI.COMM_WORLD
rank, nprocs = comm.Get_rank(), comm.Get_size()
NITEMS = 60
path = os.path.join(sys.argv[1], "cache.bin")
start = np.arange(NITEMS, dtype=np.int64) * 10
if rank == 0:
    start.tofile(path)
comm.Barrier()
sched = strataio.IndexSchedule(comm, np.arange(rank, NITEMS, nprocs), NITEMS, 8)
bad = rank == nprocs - 1


def outcome(fn) -> str:
    try:
        fn()
        return "ok"
    except strataio.StrataError as exc:
        return "raised" if str(exc) else "raised without a message"
    except Exception as exc:  # (not a StrataError: the caller cannot tell what went wrong)
        return f"{type(exc).__name__}: {exc}"


def advance_onto(nxt):
    cache = strataio.LoopCache(f, sched, dtype=np.int64)
    cache.advance(nxt, cache.values + 1)


# every rank takes the even items in the next loop: the cache's file sees duplicates
shared_self = strataio.IndexSchedule(MPI.COMM_SELF, np.arange(0, NITEMS, 2), NITEMS, 8)
cases = {
    "dtype": lambda: strataio.LoopCache(f, sched, dtype="no-such-dtype" if bad else np.int64),
    "schedule": lambda: strataio.LoopCache(f, None if bad else sched, dtype=np.int64),
    "next_schedule_of_another_comm": lambda: advance_onto(shared_self if bad else sched),
    "next_schedule_of_self_everywhere": lambda: advance_onto(shared_self),
}
out = {}
with strataio.File.open(comm, path, "r+") as f:
    for name, fn in cases.items():
        got = comm.allgather(outcome(fn))
        out[name] = sorted(set(got))
comm.Barrier()
out["unchanged"] = bool(np.array_equal(np.fromfile(path, dtype=np.int64), start))
if rank == 0:
    print(json.dumps(out))
