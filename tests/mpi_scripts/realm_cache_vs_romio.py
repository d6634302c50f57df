"""The aggregator realm cache against ROMIO's default path, run under mpiexec.

Every persistent realm policy with every cache size (0: off; a few KiB: pages evicted all the
time; 1 MiB: everything stays) runs the random sequences of views, collective and independent
reads and writes of ``realms_vs_romio`` (reads compared with ROMIO's at the positions written
before them, files byte-identical at the end) and the thesis's Figure 3.1 scenario. Then a
deterministic sequence checks that the cache is really used: collective writes stay in the
aggregators' caches (nothing on storage until ``sync``), a collective read after them reads
nothing from storage, and independent reads and writes of another aggregator's realm see the
cached bytes (written back for them through the cache window) and are seen after.

Prints ``ok <cases> cases, <checks> checks`` on rank 0 when everything matched.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI
from realms_vs_romio import report, run_policies

import strataio

POLICIES: list[dict[str, str]] = [
    {"romio_cb_pfr": "enable", "romio_cb_fr_types": "aar"},
    {"romio_cb_pfr": "enable", "romio_cb_fr_types": "64"},
    {"romio_cb_pfr": "enable", "romio_cb_fr_types": "7"},
    {"romio_cb_pfr": "enable", "romio_cb_fr_types": "aar", "strataio_realms": "dynamic"},
]
CACHES = ["0", "2048", "1048576"]


def engaged(comm: MPI.Comm, workdir: str) -> tuple[list[str], int]:
    """The cache holds collective writes until sync and serves reads; independent calls on
    another aggregator's realm see cached bytes and are seen by later collective reads."""
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    path = os.path.join(workdir, "engaged.bin")
    block = 8192
    hints = {"romio_cb_pfr": "enable", "romio_cb_fr_types": "4096", "cb_config_list": "*:*",
             "cb_nodes": str(nprocs), "romio_cb_write": "enable", "romio_cb_read": "enable",
             "strataio_realm_cache": "65536"}  # fmt: skip
    errors: list[str] = []
    f = strataio.File.open(comm, path, "w", hints=hints)
    mine = np.full(block, rank + 1, np.uint8)
    f.write_at_all(rank * block, mine)
    cache = f.realm_cache
    if cache is None or cache.bytes_written or f.driver.size():
        errors.append(f"rank {rank}: a collective write reached storage before sync")
    if f.get_size() != nprocs * block:
        errors.append(f"rank {rank}: size {f.get_size()} while the cache holds the writes")
    back = np.zeros(block, np.uint8)
    f.read_at_all(rank * block, back)
    if cache is not None and cache.bytes_read:
        errors.append(f"rank {rank}: a read of cached bytes read {cache.bytes_read} from storage")
    if not np.array_equal(back, mine):
        errors.append(f"rank {rank}: collective read after write differs")
    comm.Barrier()
    other = (rank + 1) % nprocs
    theirs = np.zeros(block, np.uint8)
    f.read_at(other * block, theirs)  # another aggregator's cached, dirty bytes
    if not (theirs == other + 1).all():
        errors.append(f"rank {rank}: independent read missed the cached bytes of rank {other}")
    comm.Barrier()
    f.write_at(other * block + 100, np.full(50, 200 + rank, np.uint8))
    comm.Barrier()
    f.read_at_all(rank * block, back)
    want = mine.copy()
    want[100:150] = 200 + (rank - 1) % nprocs
    if not np.array_equal(back, want):
        errors.append(f"rank {rank}: a collective read misses an independent write")
    f.sync()
    if f.driver.size() != nprocs * block:
        errors.append(f"rank {rank}: sync left the file at {f.driver.size()} bytes")
    f.set_size(block // 2)  # cached pages past it must go, dirty or not
    f.write_at_all(0, np.zeros(0, np.uint8))
    f.close()
    comm.Barrier()
    if rank == 0:
        got = np.fromfile(path, dtype=np.uint8)
        ref = np.full(block // 2, 1, np.uint8)
        ref[100:150] = 200 + nprocs - 1
        if not np.array_equal(got, ref):
            errors.append("the file after set_size and close differs")
        os.unlink(path)
    return errors, 7


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int, default=2)
    ap.add_argument("--dir", required=True)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    errors, checks = engaged(comm, args.dir)
    hinted = [{**policy, "strataio_realm_cache": size} for policy in POLICIES for size in CACHES]
    more, cases, n = run_policies(comm, hinted, args.cases, args.seed + 7, args.dir)
    return report(comm, errors + more, cases, checks + n)


if __name__ == "__main__":
    sys.exit(main())
