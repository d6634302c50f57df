"""Irregular I/O through indirection arrays (No et al., §5): index schedules against one
``pread`` per item and against ROMIO, and software caching across loops (Figure 4).

Run under ``mpiexec -n N python -m strataio.bench.irregular``; ``strataio bench irregular``
and ``strataio bench loopcache`` launch it.

**irregular.** A global array of ``N = ranks * items`` records of ``itemsize`` bytes in one
file (page-cached); each rank holds a random share of the indices (a random permutation dealt
round-robin, in random order: an unstructured mesh's partition), reads them into, and writes
them from, an array in its own order. Contenders, each the slowest rank's time (median of
``reps``): ``strataio`` (``File.read_items`` / ``write_items`` on a schedule built once; the
build timed apart, and the first call with it), ``pread`` (one ``pread`` / ``pwrite`` per
item, from Python) and ``romio`` (per step what a code without schedules does: an indexed
file view of the sorted unique indices, ``MPI.Datatype.Create_indexed_block``, then
``Read_all`` / ``Write_all`` and the permutation to the rank's order; every rank aggregates in
both strataio and ROMIO, ``cb_nodes`` = ranks, ``cb_config_list=*:*``). ``romio core`` is
ROMIO's ``Read_at_all`` / ``Write_at_all`` at the view's start alone (view built beforehand).

**loopcache.** Figure 4: ``loops`` irregular loops; each rank's indirection array of
``bytes`` (4-byte indices, 4 KB to 1 MB) of 8-byte items moves by 1/8 between loops (7/8
overlap). ``no caching``: every loop reads and writes all its items (``read1`` / ``write1``);
``caching``: a :class:`~strataio.LoopCache` reads the first loop, writes only released items
and reads only new ones at each advance (building the incremental schedules), and writes all
at the end. The loops' own schedules are built beforehand for both. Total time, items read and
written, and the file bytes compared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import strataio
from strataio.bench.realms import DRIVERS

ROMIO_HINTS = {"romio_cb_read": "enable", "romio_cb_write": "enable", "cb_config_list": "*:*"}


def _timed(comm: MPI.Comm, fn: Callable[[], Any]) -> float:
    """The slowest rank's seconds for one collective step."""
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    return float(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))


def _median(comm: MPI.Comm, reps: int, fn: Callable[[], Any]) -> float:
    return statistics.median(_timed(comm, fn) for _ in range(reps))


def _romio_view(fh: MPI.File, unique: np.ndarray, itemsize: int) -> list[MPI.Datatype]:
    etype = MPI.BYTE.Create_contiguous(itemsize).Commit()
    ftype = etype.Create_indexed_block(1, unique.astype(np.int32)).Commit()
    fh.Set_view(0, etype, ftype, "native", MPI.INFO_NULL)
    return [ftype, etype]


def irregular(comm: MPI.Comm, path: str, items: int, itemsize: int, reps: int) -> dict[str, Any]:
    """One size of the ``irregular`` benchmark (see the module's notes)."""
    nprocs, rank = comm.Get_size(), comm.Get_rank()
    nitems = nprocs * items
    if rank == 0:
        np.random.default_rng(0).integers(0, 256, nitems * itemsize, dtype=np.uint8).tofile(path)
    comm.Barrier()
    perm = np.random.default_rng(1).permutation(nitems)
    idx = perm[rank::nprocs].copy()
    np.random.default_rng(2 + rank).shuffle(idx)
    ref = np.fromfile(path, dtype=np.uint8).reshape(nitems, itemsize)[idx]
    out = np.empty((idx.size, itemsize), np.uint8)
    vals = ref.copy()
    row: dict[str, Any] = {"ranks": nprocs, "items_per_rank": items, "itemsize": itemsize,
                           "bytes_per_rank": items * itemsize}  # fmt: skip

    # strataio: a schedule built once and reused
    f = strataio.File.open(comm, path, "r+", {"cb_nodes": str(nprocs), **ROMIO_HINTS})
    scheds: list[strataio.IndexSchedule] = []
    build = _median(comm, reps, lambda: scheds.append(
        strataio.IndexSchedule(comm, idx, nitems, itemsize)))  # fmt: skip
    sched = scheds[-1]
    read = _median(comm, reps, lambda: f.read_items(sched, out))
    ok = bool(comm.allreduce(np.array_equal(out, ref), op=MPI.LAND))
    write = _median(comm, reps, lambda: f.write_items(sched, vals))
    f.close()
    row["strataio"] = {"build": build, "read": read, "write": write, "correct": ok,
                       "reuse_speedup_read": (build + read) / read,
                       "reuse_speedup_write": (build + write) / write}  # fmt: skip

    # one pread / pwrite per item
    fd = os.open(path, os.O_RDWR)
    offs = (idx * itemsize).tolist()
    mv = memoryview(out.reshape(-1))
    wv = memoryview(vals.reshape(-1))
    pieces = [(mv[i * itemsize : (i + 1) * itemsize], o) for i, o in enumerate(offs)]
    wpieces = [(wv[i * itemsize : (i + 1) * itemsize], o) for i, o in enumerate(offs)]

    def pread_all() -> None:
        for m, o in pieces:
            os.preadv(fd, [m], o)

    def pwrite_all() -> None:
        for m, o in wpieces:
            os.pwrite(fd, m, o)

    out[:] = 0
    pr = _median(comm, max(1, reps // 2), pread_all)
    ok = bool(comm.allreduce(np.array_equal(out, ref), op=MPI.LAND))
    pw = _median(comm, max(1, reps // 2), pwrite_all)
    os.close(fd)
    row["pread"] = {"read": pr, "write": pw, "correct": ok}

    # ROMIO: an indexed view per step, Read_all / Write_all, the permutation
    info = MPI.Info.Create()
    for k, v in {"cb_nodes": str(nprocs), **ROMIO_HINTS}.items():
        info.Set(k, v)
    fh = MPI.File.Open(comm, path, MPI.MODE_RDWR, info)
    sorted_buf = np.empty_like(out)

    def romio_read() -> None:
        unique, inverse = np.unique(idx, return_inverse=True)
        types = _romio_view(fh, unique, itemsize)
        buf = np.empty((unique.size, itemsize), np.uint8)
        fh.Read_all(buf)
        np.take(buf, inverse, axis=0, out=out)
        for t in types:
            t.Free()

    def romio_write() -> None:
        order = np.argsort(idx)
        types = _romio_view(fh, idx[order], itemsize)
        fh.Write_all(np.ascontiguousarray(vals[order]))
        for t in types:
            t.Free()

    out[:] = 0
    rr = _median(comm, reps, romio_read)
    ok = bool(comm.allreduce(np.array_equal(out, ref), op=MPI.LAND))
    rw = _median(comm, reps, romio_write)
    types = _romio_view(fh, np.sort(idx), itemsize)
    core_r = _median(comm, reps, lambda: fh.Read_at_all(0, sorted_buf))
    ok = ok and np.array_equal(sorted_buf, ref[np.argsort(idx)])
    ok = bool(comm.allreduce(ok, op=MPI.LAND))
    core_w = _median(comm, reps, lambda: fh.Write_at_all(0, sorted_buf))
    for t in types:
        t.Free()
    fh.Close()
    info.Free()
    row["romio"] = {"read": rr, "write": rw, "correct": ok, "core_read": core_r,
                    "core_write": core_w}  # fmt: skip
    s = row["strataio"]
    row["speedup"] = {"read_vs_pread": pr / s["read"], "write_vs_pread": pw / s["write"],
                      "read_vs_romio": rr / s["read"], "write_vs_romio": rw / s["write"],
                      "read_vs_romio_core": core_r / s["read"],
                      "write_vs_romio_core": core_w / s["write"]}  # fmt: skip
    return row


#: how a rank's loop indices lie in the global array: ``range`` (a contiguous range sliding
#: by 1/8 per loop, visited in random order: the paper's Figure 1, where the released and the
#: new data are ranges) or ``scattered`` (the same over a random permutation of the items:
#: released and new items spread over the whole file)
LAYOUTS = ("range", "scattered")


def _loops(
    rank: int, nprocs: int, per: int, loops: int, layout: str
) -> tuple[int, list[np.ndarray]]:
    """Each rank's indices per loop: a window of ``per`` items sliding by ``per / 8`` per loop
    (7/8 overlap), in random order; windows of ranks never meet."""
    span = per + (loops - 1) * (per // 8)
    nitems = nprocs * span
    items = np.arange(nitems)
    if layout == "scattered":
        items = np.random.default_rng(3).permutation(nitems)
    rng = np.random.default_rng(4 + rank)
    out = []
    for k in range(loops):
        ix = items[rank * span + k * (per // 8) :][:per].copy()
        rng.shuffle(ix)
        out.append(ix)
    return nitems, out


def loopcache(
    comm: MPI.Comm,
    workdir: str,
    index_bytes: int,
    loops: int,
    reps: int,
    driver: str,
    layout: str = "range",
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One size of the ``loopcache`` benchmark on ``driver`` (``local`` or ``pfs``, the
    shaped driver's parallel-file-system preset of :mod:`strataio.bench.realms`)."""
    hints = {**DRIVERS[driver], **(extra or {})}
    nprocs, rank = comm.Get_size(), comm.Get_rank()
    itemsize, per = 8, max(index_bytes // 4, 8)
    nitems, idx = _loops(rank, nprocs, per, loops, layout)
    paths = [os.path.join(workdir, f"loop-{k}.bin") for k in ("plain", "cached")]
    start = np.random.default_rng(5).integers(0, 1 << 40, nitems, dtype=np.int64)
    if rank == 0:
        for p in paths:
            start.tofile(p)
    comm.Barrier()
    scheds = [strataio.IndexSchedule(comm, ix, nitems, itemsize) for ix in idx]

    def body(k: int, v: np.ndarray) -> np.ndarray:
        return v + idx[k] + k

    def plain() -> None:
        with strataio.File.open(comm, paths[0], "r+", hints) as f:
            for k, s in enumerate(scheds):
                v = np.empty(idx[k].size, np.int64)
                f.read_items(s, v)
                f.write_items(s, body(k, v))

    stats: list[Any] = []

    def cached() -> None:
        with strataio.File.open(comm, paths[1], "r+", hints) as f:
            cache = strataio.LoopCache(f, scheds[0], dtype=np.int64)
            v = body(0, cache.values)
            for k in range(1, loops):
                v = body(k, cache.advance(scheds[k], v))
            cache.flush(v)
            stats.append(cache.totals())

    t_plain, t_cached = [], []
    for _ in range(reps):  # (one repetition changes the files: both change alike)
        t_plain.append(_timed(comm, plain))
        t_cached.append(_timed(comm, cached))
    comm.Barrier()
    same = np.array_equal(np.fromfile(paths[0], np.uint8), np.fromfile(paths[1], np.uint8))
    tot = stats[-1]
    held = comm.allreduce(sum(s.unique.size for s in scheds))
    comm.Barrier()
    if rank == 0:
        for p in paths:
            os.unlink(p)
    tp, tc = statistics.median(t_plain), statistics.median(t_cached)
    return {"ranks": nprocs, "driver": driver, "hints": extra or {}, "layout": layout,
            "index_bytes": index_bytes, "items_per_rank": per, "loops": loops,
            "data_bytes": nprocs * per * itemsize, "no_caching": tp, "caching": tc,
            "speedup": tp / tc, "same_bytes": bool(same),
            "items_read": {"no_caching": held, "caching": tot.items_read},
            "items_written": {"no_caching": held, "caching": tot.items_written},
            "schedule_seconds": tot.schedule_seconds, "peak_bytes": tot.peak_bytes}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, choices=["irregular", "loopcache"])
    ap.add_argument("--items", type=int, default=262144, help="irregular: items per rank")
    ap.add_argument("--itemsize", type=int, action="append", help="irregular: bytes per item")
    ap.add_argument("--index-bytes", type=int, action="append", help="loopcache: per rank")
    ap.add_argument("--loops", type=int, default=4)
    ap.add_argument("--driver", action="append", choices=sorted(DRIVERS), help="loopcache")
    ap.add_argument("--layout", action="append", choices=LAYOUTS, help="loopcache")
    ap.add_argument("--hint", action="append", default=[], help="loopcache: KEY=VALUE")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    extra = dict(h.split("=", 1) for h in args.hint)
    comm = MPI.COMM_WORLD
    workdir = comm.bcast(tempfile.mkdtemp(prefix="strataio-bench-") if comm.rank == 0 else None)
    rows = []
    if args.bench == "irregular":
        path = os.path.join(workdir, "items.bin")
        for size in args.itemsize or [16, 32]:
            rows.append(irregular(comm, path, args.items, size, args.reps))
            comm.Barrier()
        if comm.rank == 0:
            os.unlink(path)
    else:
        for driver in args.driver or ["local", "pfs"]:
            for layout in args.layout or ["range"]:
                for nb in args.index_bytes or [4096, 16384, 65536, 262144, 1048576]:
                    rows.append(
                        loopcache(comm, workdir, nb, args.loops, args.reps, driver, layout, extra)
                    )
    comm.Barrier()
    if comm.rank == 0:
        print(json.dumps(rows))
        os.rmdir(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
