"""Run under ``mpiexec -n N``: Sessions of a parallel job built from a configuration.

The first makes the directories of the tiers new to the catalog, on every rank. Once the
disk tier's directory is gone, the next finds that tier down on every rank, saying its
directory is missing, makes nothing in its place, and every rank reads the data from the
tape. Prints ``ok`` on rank 0 when all checks pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import strataio

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
root = Path(sys.argv[1])
config = root / "strataio.toml"
if rank == 0:
    config.write_text(
        "[catalog]\nurl = 'cat.db'\n"
        "[[tiers]]\nname = 'disk'\nkind = 'posix'\nrole = 'localdisk'\npath = 'disk'\n"
        "[[tiers]]\nname = 'tape'\nkind = 'posix'\nrole = 'remotetape'\npath = 'tape'\n"
    )
comm.Barrier()
a = np.arange(10 * size * 20, dtype="f8").reshape(10 * size, 20)
with strataio.Session(config, comm=comm) as s:
    assert all(t.up for t in s.tiers), [t.last_error for t in s.tiers]
    assert (root / "disk").is_dir() and (root / "tape").is_dir()
    ds = s.create_dataset("par", a.shape, a.dtype, (10, 20), hint="REMOTETAPE")
    ds[rank * 10 : (rank + 1) * 10, :] = a[rank * 10 : (rank + 1) * 10, :]
    ds.close()
if rank == 0:
    (root / "disk").rename(root / "disk.away")
comm.Barrier()
with strataio.Session(config, comm=comm) as s:
    disk = s.tiers["disk"]
    assert not disk.up and "is missing" in disk.last_error, disk.last_error
    ds = s.open_dataset("par")
    assert np.array_equal(ds[...], a), "data mismatch"
    ds.close()
comm.Barrier()
assert not (root / "disk").exists(), "the directory of a known tier was made again"
if rank == 0:
    print("ok")
