"""Realm-policy benchmarks: the thesis's sliding window (§3.5.2) and collective patterns, per
persistent-realm policy, each against the non-persistent default in the same job.

Run under ``mpiexec -n N python -m strataio.bench.realms``; ``strataio bench sliding-window``
and ``strataio bench realms`` launch it.

**Sliding window.** An 8×8 grid of tiles over a 2-D byte array (a tile is ``tile_rows`` rows
of 768 bytes; 4096 rows, 3 MiB, in the thesis, scaled here to the machine: ``--scale``). Rank
``r`` starts on tile ``r``; every iteration each rank collectively reads its tile, then writes
it back changed, then moves one tile on (row-major, wrapping), until it has visited every tile
(64 iterations), all on one open file with one view per tile. Policies (thesis labels):
``64K`` and ``4M`` (persistent stripes of 64 KiB and 4 MiB times the tile's scale, so their
ratio to a tile is the thesis's), ``fsize`` (the file, which exists at full size, over the
aggregators), ``aar`` (the first call's access region over the aggregators), ``intelligent``
(:func:`~strataio.collective.realms.sizes.sliding_window_intelligent`) and ``no caching``
(the per-call realms of ROMIO's default path: the baseline). Every rank aggregates
(``cb_config_list=*:*``), as every node did in the thesis.

**Patterns.** ``block3d`` and ``flash`` of :mod:`strataio.bench.collective`, written then read
on one open file, per policy (no ``intelligent``: it is the sliding window's).

Drivers: ``local`` (POSIX on the local disk) and ``pfs``, the shaped driver with a
parallel-file-system preset (:data:`PFS`). Each figure is the slowest rank's time (median
over repetitions taken round-robin over the policies), and the bytes the ranks read from and
wrote to storage (all ranks' ``read``/``write`` system calls, from ``/proc/self/io``), with
``speedup`` = baseline time / policy time.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
from mpi4py import MPI

import strataio
from strataio.bench.collective import make_case
from strataio.collective.realms.sizes import SlidingWindow, sliding_window_intelligent

#: the parallel-file-system preset of the shaped driver: a Lustre-like client (one RPC per
#: system call, ~1 ms round trip; ~200 MB/s of one client's share of the servers; its calls
#: one at a time)
PFS = {
    "strataio_driver": "shaped",
    "strataio_driver_latency": "0.001",
    "strataio_driver_bandwidth": "200000000",
    "strataio_driver_concurrency": "1",
}
DRIVERS = {"local": {}, "pfs": PFS}
SLIDING_POLICIES = ["no caching", "64K", "4M", "fsize", "aar", "intelligent"]
PATTERN_POLICIES = ["no caching", "64K", "4M", "fsize", "aar"]
BASELINE = "no caching"


def policy_hints(policy: str, scale: float = 1.0, intelligent: int = 0) -> dict[str, str]:
    """The hints of a realm policy (thesis label); fixed stripes scaled by ``scale``."""
    if policy == BASELINE:
        return {}
    fr = {
        "64K": str(max(int(65536 * scale), 1)),
        "4M": str(max(int(4 * 2**20 * scale), 1)),
        "fsize": "-1",
        "aar": "aar",
        "intelligent": str(intelligent),
    }[policy]
    return {"romio_cb_pfr": "enable", "romio_cb_fr_types": fr}


def _io_counts() -> tuple[int, int]:
    """Bytes this process has read and written through system calls (0, 0 off Linux)."""
    try:
        with open("/proc/self/io") as fh:
            fields = dict(line.split(": ") for line in fh.read().splitlines())
        return int(fields["rchar"]), int(fields["wchar"])
    except (OSError, KeyError, ValueError):
        return 0, 0


def _tile_type(g: SlidingWindow, tile: int) -> MPI.Datatype:
    ty, tx = divmod(tile % g.ntiles, g.tiles_x)
    full = [g.tiles_y * g.tile_rows, g.tiles_x * g.tile_cols]
    sub = [g.tile_rows, g.tile_cols]
    t = MPI.BYTE.Create_subarray(full, sub, [ty * g.tile_rows, tx * g.tile_cols])
    t.Commit()
    return t


def sliding_window(
    comm: MPI.Comm, path: str, g: SlidingWindow, hints: dict[str, str], steps: int
) -> tuple[float, int]:
    """The sliding window on one open file; the slowest rank's seconds and the persistent
    realms' stripe (0: none). Every tile is read and written back plus one by each rank in
    turn, so the run adds ``nprocs`` to every byte: checked afterwards (a policy that loses an
    update fails the benchmark)."""
    rank = comm.Get_rank()
    before = int(np.fromfile(path, dtype=np.uint8, count=1)[0]) if rank == 0 else 0
    types = [_tile_type(g, t) for t in range(g.ntiles)]
    buf = np.empty(g.tile_rows * g.tile_cols, dtype=np.uint8)
    comm.Barrier()
    t0 = time.perf_counter()
    with strataio.File.open(comm, path, "r+", hints=hints) as f:
        for k in range(steps):
            f.set_view(0, MPI.BYTE, types[(rank + k) % g.ntiles])
            f.read_at_all(0, buf)
            buf += 1
            f.write_at_all(0, buf)
        stripe = f.realms.stripe if f.realms is not None else 0
    elapsed = time.perf_counter() - t0
    for t in types:
        t.Free()
    if rank == 0 and steps == g.ntiles:
        want = (before + comm.Get_size()) % 256
        if not np.all(np.fromfile(path, dtype=np.uint8) == want):
            raise SystemExit(f"sliding window with {hints}: the file lost updates")
    return float(comm.allreduce(elapsed, op=MPI.MAX)), stripe


def _pattern(
    comm: MPI.Comm, path: str, pattern: str, hints: dict[str, str], scale: float
) -> tuple[float, int]:
    """``pattern`` written then read back on one open file; the slowest rank's seconds and the
    persistent realms' stripe (0: none)."""
    case = make_case(pattern, comm.Get_rank(), comm.Get_size(), scale)
    out = np.zeros_like(case.buf)
    comm.Barrier()
    t0 = time.perf_counter()
    with strataio.File.open(comm, path, "w", hints=hints) as f:
        f.set_view(case.disp, case.etype, case.filetype)
        f.write_all([case.buf, case.count, case.memtype])
        f.set_view(case.disp, case.etype, case.filetype)
        f.read_all([out, case.count, case.memtype])
        stripe = f.realms.stripe if f.realms is not None else 0
    elapsed = time.perf_counter() - t0
    return float(comm.allreduce(elapsed, op=MPI.MAX)), stripe


def _sliding_policy(
    comm: MPI.Comm, path: str, g: SlidingWindow, hinted: Any, policy: str
) -> tuple[float, int]:
    return sliding_window(comm, path, g, hinted(policy), g.ntiles)


def _pattern_policy(
    comm: MPI.Comm, path: str, pattern: str, base: dict[str, str], scale: float, policy: str
) -> tuple[float, int]:
    return _pattern(comm, path, pattern, {**base, **policy_hints(policy)}, scale)


def _measure(comm: MPI.Comm, reps: int, policies: list[str], run_one: Any) -> dict[str, Any]:
    """Round-robin repetitions (after an untimed round) of ``run_one(policy)`` (seconds,
    stripe): per policy the median seconds, the bytes all ranks read / wrote in one run, and
    the persistent realms' stripe."""
    times: dict[str, list[float]] = {p: [] for p in policies}
    moved: dict[str, tuple[int, int]] = {}
    stripes: dict[str, int] = {}
    for rep in range(reps + 1):
        for p in policies:
            r0, w0 = _io_counts()
            t, stripes[p] = run_one(p)
            r1, w1 = _io_counts()
            if rep:
                times[p].append(t)
            moved[p] = (comm.allreduce(r1 - r0), comm.allreduce(w1 - w0))
    base = statistics.median(times[BASELINE])
    return {
        p: {
            "seconds": statistics.median(times[p]),
            "read_bytes": moved[p][0],
            "written_bytes": moved[p][1],
            "speedup": base / statistics.median(times[p]),
            "stripe": stripes[p],
        }
        for p in policies
    }


def run(
    kind: str, drivers: list[str], reps: int, scale: float, workdir: str, extra: dict[str, str]
) -> list[dict[str, Any]]:
    comm = MPI.COMM_WORLD
    nprocs = comm.Get_size()
    rows = []
    common = {"cb_config_list": "*:*", "romio_cb_read": "enable", "romio_cb_write": "enable"}
    for driver in drivers:
        base = {**common, **DRIVERS[driver], **extra}
        path = os.path.join(workdir, f"realms-{kind}.bin")
        if kind == "sliding-window":
            g = SlidingWindow(tile_rows=max(int(4096 * scale), 1))
            smart = sliding_window_intelligent(nprocs, g)
            if comm.Get_rank() == 0:  # the file exists at full size (fsize sees it)
                np.zeros(g.file_bytes, dtype=np.uint8).tofile(path)
            comm.Barrier()

            def hinted(p: str, base: dict[str, str] = base, smart: int = smart) -> dict[str, str]:
                return {**base, **policy_hints(p, scale, smart)}

            one = functools.partial(_sliding_policy, comm, path, g, hinted)
            result = _measure(comm, reps, SLIDING_POLICIES, one)
            rows.append({"bench": kind, "driver": driver, "ranks": nprocs,
                         "tile_bytes": g.tile_rows * g.tile_cols, "file_bytes": g.file_bytes,
                         "policies": result})  # fmt: skip
        else:
            one = functools.partial(_pattern_policy, comm, path, kind, base, scale)
            result = _measure(comm, reps, PATTERN_POLICIES, one)
            rows.append({"bench": kind, "driver": driver, "ranks": nprocs, "policies": result})
        comm.Barrier()
        if comm.Get_rank() == 0 and os.path.exists(path):
            os.unlink(path)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", action="append", required=True,
                    choices=["sliding-window", "block3d", "flash"])  # fmt: skip
    ap.add_argument("--driver", action="append", choices=sorted(DRIVERS))
    ap.add_argument("--reps", type=int, default=3)
    # 1/4: 768 KiB tiles, a 48 MiB file; at 1/16 (192 KiB tiles) the local disk's per-call
    # costs outweigh the bytes any policy saves (BENCHMARKS.md)
    ap.add_argument("--scale", type=float, default=1 / 4)
    ap.add_argument("--hint", action="append", default=[], help="KEY=VALUE for every policy")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    extra = dict(h.split("=", 1) for h in args.hint)
    comm = MPI.COMM_WORLD
    workdir = args.dir
    if workdir is None:
        workdir = comm.bcast(tempfile.mkdtemp(prefix="strataio-bench-") if comm.rank == 0 else None)
    rows = []
    for kind in args.bench:
        rows += run(kind, args.driver or ["local", "pfs"], args.reps, args.scale, workdir, extra)
    if comm.Get_rank() == 0:
        print(json.dumps(rows))
        if args.dir is None:
            os.rmdir(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
