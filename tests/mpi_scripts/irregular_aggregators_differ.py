"""Index schedules whose ranks pass different aggregators of the same count, sum and sum of
squares ({0, 4, 5} and {1, 2, 6}: seven ranks): every rank raises, none builds a schedule
whose data domains the others do not share. Rank 0 prints the outcomes over the ranks."""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

import strataio

comm = MPI.COMM_WORLD
aggs = [0, 4, 5] if comm.Get_rank() % 2 else [1, 2, 6]
try:
    strataio.IndexSchedule(comm, np.arange(comm.Get_rank(), 70, 7), 70, 8, aggregators=aggs)
    got = "built"
except strataio.StrataError as exc:
    got = "raised" if "aggregators" in str(exc) else f"raised: {exc}"
out = sorted(set(comm.allgather(got)))
if comm.Get_rank() == 0:
    print(json.dumps(out))
