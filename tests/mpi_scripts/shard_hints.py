"""Run under ``mpiexec -n N`` (N > 1): hints of collective shard writes that every rank passes
alike but the communicator cannot take as they are. More pipeline groups than ranks write as
one group per rank; an alignment past what a file offset holds, on one rank, raises
HintError on every rank with nothing written (no rank left waiting). Prints ``ok`` on rank 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from collective_checks import check, raises_everywhere
from mpi4py import MPI

import strataio
from strataio.errors import HintError

comm = MPI.COMM_WORLD
rank, nprocs = comm.Get_rank(), comm.Get_size()
root = Path(sys.argv[1])

shape = (4 * nprocs, 6)
ds = strataio.create_dataset(
    root / "a", shape, "f8", (2, 3), shards=(4, 6), codec="zstd", fill_value=0, comm=comm
)
mine = np.s_[4 * rank : 4 * rank + 4]
oracle = np.arange(np.prod(shape), dtype="f8").reshape(shape)
ds.write_all(mine, oracle[mine], hints={"strataio_pipeline_groups": 2**40})
check(np.array_equal(ds.read_all(...), oracle), "more groups than ranks: one per rank")

last = rank == nprocs - 1
huge = {"strataio_shard_alignment": 2**70 if last else 4096}
check(
    raises_everywhere(lambda: ds.write_all(mine, -oracle[mine], hints=huge), HintError), "alignment"
)
check(np.array_equal(ds.read_all(...), oracle), "nothing written by the refused call")
if rank == 0:
    print("ok")
