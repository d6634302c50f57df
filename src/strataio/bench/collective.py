"""Collective I/O benchmark: strataio.File against ROMIO (mpi4py ``MPI.File``) in one MPI job.

Run under ``mpiexec -n N python -m strataio.bench.collective --pattern P``; the
``strataio bench collective`` command launches it. Two modes:

``--mode open-close`` (the default, :func:`run_steps`): each repetition is open -> set_view ->
read_all/write_all -> close as a program does it, timed from the first rank's start to the
last rank's end, for strataio and ROMIO's collective and independent calls (see
:func:`run_steps`), ``--size`` MiB in all.

``--mode call`` (:func:`run`): for each pattern every contender writes the
same data through the same file view with the same hints, then reads it back; a rank's time is
one ``*_all`` call (open and close excluded), the call's time is the slowest rank's, and the
figure is aggregate bytes / that time, median over repetitions. Repetitions go round-robin over
the contenders (after one untimed round), each round starting one contender later, so no
contender always runs first or always follows the same one. Every write goes to a newly
created file; reads go into a buffer the contender reuses, zeroed before each call.

A *paired* ratio is also given: strataio's time against the better ROMIO contender's within each
round, median and quartiles over the rounds (drift of the machine between rounds cancels out).

A second figure, *wall*, divides by the time from the first rank's start to the last rank's end
on the node's monotonic clock (IOR's definition). The two differ when ranks leave the barrier
before the call at different times, as they do with more ranks than cores: a call that
synchronizes its ranks (any collective, strataio's agreement included) waits for the late ones
inside its own timed region, a call that does not synchronize is timed from each rank's own late
start. Contenders:

- ``strataio``: ``romio_cb_* = automatic`` (strataio's per-call choice, column "path");
- ``strataio 2ph`` / ``strataio ind``: strataio forced to two-phase / independent;
- ``ROMIO coll`` / ``ROMIO ind``: ROMIO with ``romio_cb_*`` = enable / disable.

Patterns (``R`` = region bytes): ``contig`` one block per rank; ``hpio64`` / ``hpio512`` /
``hpio4096`` HPIO with 4096 regions of ``R`` bytes, 128-byte spacing, interleaved across ranks,
noncontiguous in memory and file; ``tile2d`` mpi-tile-io (one tile of doubles per rank);
``block3d`` BTIO-like 3-D block decomposition (subarrays; memory with ghost cells);
``flash`` FLASH-IO-like (blocks of 8×8×8 doubles × 24 variables, guard cells and variables
interleaved in memory, file variable-major). ``hpio*-ind`` time independent ``write_at`` /
``read_at`` (data sieving) instead of collective calls.

With ``--pipeline 1,2,4`` the strataio contenders are instead ``strataio G=g``: two-phase with
every rank aggregating (``cb_config_list=*:*``) and ``strataio_pipeline_groups=g``; the row's
``pipeline`` figures are each G's paired ratio against the first G given (time at that G /
time at G, per round: > 1 is faster). A G above the rank count runs as one group per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

import strataio
from strataio.collective import node
from strataio.collective.driver import MAX_READ_THREADS, PosixDriver

PATTERNS = [
    "contig", "hpio64", "hpio512", "hpio4096", "tile2d", "block3d", "flash",
    "hpio64-ind", "hpio512-ind", "hpio4096-ind",
]  # fmt: skip
CONTENDERS = ["strataio", "strataio 2ph", "strataio ind", "ROMIO coll", "ROMIO ind"]


@dataclass
class Case:
    """One rank's part of a pattern: view, memory buffer spec, data bytes."""

    disp: int
    etype: MPI.Datatype
    filetype: MPI.Datatype
    buf: np.ndarray
    count: int
    memtype: MPI.Datatype
    nbytes: int
    independent: bool = False


def _commit(t: MPI.Datatype) -> MPI.Datatype:
    t.Commit()
    return t


def make_case(pattern: str, rank: int, nprocs: int, scale: float = 1.0) -> Case:
    """The access of ``rank`` for ``pattern`` (sizes scaled by ``scale``)."""
    rng = np.random.default_rng(rank)
    independent = pattern.endswith("-ind")
    name = pattern.removesuffix("-ind")
    if name == "contig":
        n = int(8 * 2**20 * scale)
        buf = rng.integers(0, 256, n, dtype=np.uint8)
        return Case(rank * n, MPI.BYTE, MPI.BYTE, buf, n, MPI.BYTE, n)
    if name.startswith("hpio"):
        size, space, regions = int(name[4:]), 128, max(int(4096 * scale), 1)
        ft = _commit(MPI.BYTE.Create_hvector(regions, size, nprocs * (size + space)))
        mt = _commit(MPI.BYTE.Create_hvector(regions, size, size + space))
        buf = rng.integers(0, 256, regions * (size + space), dtype=np.uint8)
        return Case(rank * (size + space), MPI.BYTE, ft, buf, 1, mt, regions * size, independent)
    if name == "tile2d":
        py, px = MPI.Compute_dims(nprocs, 2)
        tile = max(int(512 * scale**0.5), 1)
        ry, rx = divmod(rank, px)
        ft = _commit(
            MPI.DOUBLE.Create_subarray([py * tile, px * tile], [tile, tile], [ry * tile, rx * tile])
        )
        buf = rng.random(tile * tile)
        return Case(0, MPI.DOUBLE, ft, buf.view(np.uint8), tile * tile * 8, MPI.BYTE, buf.nbytes)
    if name == "block3d":
        dims = MPI.Compute_dims(nprocs, 3)
        edge = max(int(round(128 * scale ** (1 / 3))), 2)
        local = [edge // d for d in dims]
        coords = np.unravel_index(rank, dims)
        starts = [int(c) * n for c, n in zip(coords, local)]
        ft = _commit(
            MPI.DOUBLE.Create_subarray([n * d for n, d in zip(local, dims)], local, starts)
        )
        g = 2  # ghost cells on each side, as a solver's local array has
        mt = _commit(MPI.DOUBLE.Create_subarray([n + 2 * g for n in local], local, [g, g, g]))
        buf = rng.random(int(np.prod([n + 2 * g for n in local])))
        return Case(0, MPI.DOUBLE, ft, buf.view(np.uint8), 1, mt, int(np.prod(local)) * 8)
    if name == "flash":
        blocks, nvar, nb, g = max(int(20 * scale), 1), 24, 8, 4
        side = nb + 2 * g
        shape = [blocks, side, side, side, nvar]  # C order of FLASH's Fortran unk(var,x,y,z,b)
        per_var = [
            _commit(MPI.DOUBLE.Create_subarray(shape, [blocks, nb, nb, nb, 1], [0, g, g, g, v]))
            for v in range(nvar)
        ]
        mt = _commit(MPI.Datatype.Create_struct([1] * nvar, [0] * nvar, per_var))
        run = blocks * nb**3
        displs = [(v * nprocs + rank) * run * 8 for v in range(nvar)]
        ft = _commit(MPI.DOUBLE.Create_hindexed([run] * nvar, displs))
        buf = rng.random(int(np.prod(shape)))
        return Case(0, MPI.DOUBLE, ft, buf.view(np.uint8), 1, mt, nvar * run * 8)
    raise SystemExit(f"unknown pattern {pattern!r}; known: {', '.join(PATTERNS)}")


def pipeline_contenders(groups: list[int]) -> list[str]:
    """The contenders of a pipelined run: strataio at each group count, then ROMIO's."""
    return [f"strataio G={g}" for g in groups] + ["ROMIO coll", "ROMIO ind"]


def _hints(contender: str) -> dict[str, str]:
    if contender.startswith("strataio G="):
        groups = contender.removeprefix("strataio G=")
        return {
            "romio_cb_read": "enable",
            "romio_cb_write": "enable",
            "cb_config_list": "*:*",
            "strataio_pipeline_groups": groups,
        }
    mode = {"strataio": "automatic", "strataio 2ph": "enable", "strataio ind": "disable"}
    mode |= {"ROMIO coll": "enable", "ROMIO ind": "disable"}
    return {"romio_cb_read": mode[contender], "romio_cb_write": mode[contender]}


def _one(
    comm: MPI.Comm, contender: str, case: Case, path: str, write: bool, out: np.ndarray
) -> tuple[float, float, str]:
    """Time one write or read call of ``contender``; returns (slowest rank seconds, first start
    to last end seconds, path)."""
    hints = _hints(contender)
    spec = [case.buf if write else out, case.count, case.memtype]
    chosen = ""
    if contender.startswith("strataio"):
        f = strataio.File.open(comm, path, "w" if write else "r", hints=hints)
        f.set_view(case.disp, case.etype, case.filetype)
        call = (f.write_at if write else f.read_at) if case.independent else None
        comm.Barrier()
        t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
        if call is not None:
            call(0, spec)
        elif write:
            f.write_all(spec)
        else:
            f.read_all(spec)
        t1 = time.clock_gettime(time.CLOCK_MONOTONIC)
        chosen = f.last_path
        f.close()
    else:
        info = MPI.Info.Create()
        for k, v in hints.items():
            info.Set(k, v)
        amode = MPI.MODE_RDWR | MPI.MODE_CREATE if write else MPI.MODE_RDONLY
        if write and comm.Get_rank() == 0 and os.path.exists(path):
            os.truncate(path, 0)  # the same as strataio's mode "w" when the file exists
        comm.Barrier()
        fh = MPI.File.Open(comm, path, amode, info)
        fh.Set_view(case.disp, case.etype, case.filetype, "native", info)
        comm.Barrier()
        t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
        if case.independent:
            (fh.Write_at if write else fh.Read_at)(0, spec)
        else:
            (fh.Write_all if write else fh.Read_all)(spec)
        t1 = time.clock_gettime(time.CLOCK_MONOTONIC)
        fh.Close()
        info.Free()
    slowest = comm.allreduce(t1 - t0, op=MPI.MAX)
    wall = comm.allreduce(t1, op=MPI.MAX) - comm.allreduce(t0, op=MPI.MIN)
    return slowest, wall, chosen


# ---------------------------------------------------------------- open to close (the default)
#: contenders of the open-to-close mode: strataio as a user runs it (default hints), ROMIO's
#: collective call (``Read_all`` / ``Write_all``, collective buffering on) and ROMIO's
#: independent call (``Read`` / ``Write``) on the same view
STEP_CONTENDERS = ["strataio", "ROMIO coll", "ROMIO ind"]
#: the reference of a weak-scaling run (``--reference``): each rank writes or reads as many
#: bytes as its share of the pattern (the start of its buffer), in one call, to a file of its
#: own -- what the node moves without a shared file
FILE_PER_RANK = "file per rank"
PHASES = ["open", "set_view", "transfer", "close"]


def _meminfo_mb() -> tuple[float, float]:
    """The node's (Dirty, Writeback) page-cache MB (``/proc/meminfo``; zeros elsewhere)."""
    found = {"Dirty:": 0.0, "Writeback:": 0.0}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key = line.split(None, 1)[0]
                if key in found:
                    found[key] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return found["Dirty:"], found["Writeback:"]


def _stalls_ms() -> list[float]:
    """The node's pressure-stall totals, ms (``/proc/pressure``: time some task waited for a
    CPU, some waited for I/O, all waited for I/O); zeros where the kernel has none."""
    out = []
    for name, kind in (("cpu", "some"), ("io", "some"), ("io", "full")):
        try:
            with open(f"/proc/pressure/{name}") as f:
                line = next(x for x in f if x.startswith(kind))
            out.append(int(line.rsplit("total=", 1)[1]) / 1000)
        except (OSError, StopIteration, ValueError, IndexError):
            out.append(0.0)
    return out


def _step(
    comm: MPI.Comm, contender: str, case: Case, path: str, write: bool, out: np.ndarray
) -> np.ndarray:
    """One open -> set_view -> read_all/write_all (or read/write) -> close of ``contender``,
    timed on the node's monotonic clock after a barrier. Returns (first rank's start to last
    rank's end, then each phase's slowest rank), in seconds, on every rank."""
    spec = [case.buf if write else out, case.count, case.memtype]
    clock = time.monotonic
    missing = 0
    if contender == "strataio":
        comm.Barrier()
        t0 = clock()
        f = strataio.File.open(comm, path, "w" if write else "r")
        t1 = clock()
        f.set_view(case.disp, case.etype, case.filetype)
        t2 = clock()
        (f.write_all if write else f.read_all)(spec)
        t3 = clock()
        f.close()
    elif contender == FILE_PER_RANK:
        data = spec[0].view(np.uint8)[: case.nbytes]
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC if write else os.O_RDONLY
        comm.Barrier()
        t0 = clock()
        raw = PosixDriver.open(f"{path}.{comm.Get_rank()}", flags, 0o644)  # (one thread, as is)
        t1 = t2 = clock()
        if write:
            raw.pwrite(data, 0)
        else:
            missing = len(data) - raw.pread(data, 0)
        t3 = clock()
        raw.close()
    else:
        coll = contender == "ROMIO coll"
        info = MPI.Info.Create()
        if coll:
            info.Set("romio_cb_write" if write else "romio_cb_read", "enable")
        amode = MPI.MODE_RDWR | MPI.MODE_CREATE if write else MPI.MODE_RDONLY
        comm.Barrier()
        t0 = clock()
        fh = MPI.File.Open(comm, path, amode, info)
        t1 = clock()
        fh.Set_view(case.disp, case.etype, case.filetype, "native", info)
        t2 = clock()
        if write:
            (fh.Write_all if coll else fh.Write)(spec)
        else:
            (fh.Read_all if coll else fh.Read)(spec)
        t3 = clock()
        fh.Close()
        info.Free()
    t4 = clock()
    # (the bytes a rank's own file lacked go with the times, so every rank stops together)
    mine = np.array([-t0, t4, t1 - t0, t2 - t1, t3 - t2, t4 - t3, missing])
    worst = np.empty_like(mine)
    comm.Allreduce(mine, worst, op=MPI.MAX)
    if worst[6]:
        raise SystemExit(f"{contender}: a rank's file was {int(worst[6])} bytes short")
    return np.concatenate(([worst[0] + worst[1]], worst[2:6]))


def _same_everywhere(comm: MPI.Comm, same: bool, message: str) -> None:
    """Stop every rank with ``message`` when any rank found a difference (collective: a rank
    stopping alone would leave the others waiting in their next collective)."""
    if not comm.allreduce(same, op=MPI.LAND):
        raise SystemExit(message)


def _spread(seconds: list[float], nbytes: int) -> dict[str, float]:
    """min / median / max seconds of the repetitions and the median's MB/s."""
    med = statistics.median(seconds)
    return {
        "min": min(seconds), "median": med, "max": max(seconds),
        "MB/s": nbytes / med / 1e6 if med > 0 else float("nan"),
    }  # fmt: skip


def run_steps(
    pattern: str,
    reps: int,
    workdir: str,
    total: int,
    ops: tuple[str, ...] = ("write", "read"),
    sync: bool = False,
    reference: bool = False,
) -> list[dict[str, Any]]:
    """Time ``pattern`` open to close: ``reps`` repetitions per contender and op, round-robin
    after an untimed round, each round starting one contender later. ``total``: the bytes all
    ranks move together (each pattern scaled to it). Every write goes to a new file (the old
    one removed, untimed); with ``sync`` the node's dirty pages are written back (``os.sync``,
    untimed) before each write, so none starts behind another's writeback. All contenders read
    one file, written once (page cache warm), into one buffer. A row: each contender's min / median / max
    seconds and median MB/s, the per-phase medians of the slowest rank, ratio = better ROMIO
    median / strataio median (> 1: strataio faster) and the same ratio per round (paired);
    writes also give the node's Dirty and Writeback MB before each repetition. Every
    repetition also records the node's pressure stalls while it ran (``stalls ms``: CPU some,
    I/O some, I/O full; see :func:`_stalls_ms`), which tell a slow repetition's cause. With
    ``reference`` the rows also time :data:`FILE_PER_RANK` (not part of the ratio), the
    ceiling a weak-scaling run compares against."""
    comm = MPI.COMM_WORLD
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    base = comm.allreduce(make_case(pattern, rank, nprocs, 1.0).nbytes)
    case = make_case(pattern, rank, nprocs, total / base)
    nbytes = comm.allreduce(case.nbytes)
    contenders = STEP_CONTENDERS + ([FILE_PER_RANK] if reference else [])
    rows = []
    read_path = os.path.join(workdir, f"{pattern}.read")
    # what strataio's large reads are shared among on the busiest rank (cores to spare)
    spare = node.layout(comm).spare_per_rank(rank)
    read_threads = comm.allreduce(min(MAX_READ_THREADS, 1 + spare), op=MPI.MAX)
    for op in ops:
        write = op == "write"
        if not write and not _exists_on_rank0(comm, read_path):
            _step(comm, "ROMIO coll", case, read_path, True, case.buf)
        if not write and reference:
            _step(comm, FILE_PER_RANK, case, read_path, True, case.buf)
        # One read buffer for every contender (zeroed before each step): buffers of their own
        # would differ in where their pages lie (huge pages or not), which showed as a few
        # per cent between contenders making the same system call.
        out = np.zeros_like(case.buf)
        steps: dict[str, list[np.ndarray]] = {c: [] for c in contenders}
        dirty: dict[str, list[list[float]]] = {c: [] for c in contenders}
        stalls: dict[str, list[list[float]]] = {c: [] for c in contenders}
        expected: np.ndarray | None = None
        for rep in range(reps + 1):
            turn = rep % len(contenders)
            for contender in contenders[turn:] + contenders[:turn]:
                path = read_path
                if write:
                    path = os.path.join(workdir, f"{pattern}.{contender.replace(' ', '_')}")
                    own = f"{path}.{rank}" if contender == FILE_PER_RANK else path
                    if (rank == 0 or own != path) and os.path.exists(own):
                        os.unlink(own)
                    if rank == 0:
                        if sync:
                            os.sync()
                        before = _meminfo_mb()
                    comm.Barrier()
                out.fill(0)
                stalled = _stalls_ms() if rank == 0 else []
                got = _step(comm, contender, case, path, write, out)
                if rep:
                    steps[contender].append(got)
                    if rank == 0:
                        after = _stalls_ms()
                        stalls[contender].append([b - a for a, b in zip(stalled, after)])
                    if write and rank == 0:
                        dirty[contender].append(list(before))
                if not write and rep == reps:  # every contender must read the same bytes
                    if contender == FILE_PER_RANK:
                        same = np.array_equal(out[: case.nbytes], case.buf[: case.nbytes])
                    elif expected is None:
                        expected, same = out.copy(), True
                    else:
                        same = np.array_equal(out, expected)
                    _same_everywhere(comm, same, f"{pattern}: {contender} read different data")
        row: dict[str, Any] = {
            "pattern": pattern, "ranks": nprocs, "op": op, "bytes": nbytes, "reps": reps,
            "mode": "open-close", "sync": sync, "read threads": read_threads,
        }  # fmt: skip
        for c in contenders:
            t = np.array(steps[c])
            row[c] = _spread(t[:, 0].tolist(), nbytes)
            row[c]["phases"] = dict(zip(PHASES, np.median(t[:, 1:], axis=0).tolist()))
            row[c]["times"] = t[:, 0].tolist()
            row[c]["stalls ms"] = stalls[c]  # (rank 0 only: what the node waited for)
            if write:
                row[c]["dirty MB"] = dirty[c]
        best = min(("ROMIO coll", "ROMIO ind"), key=lambda c: row[c]["median"])
        row["best ROMIO"] = best
        row["ratio"] = row[best]["median"] / row["strataio"]["median"]
        row["paired"] = _quartiles([b[0] / s[0] for s, b in zip(steps["strataio"], steps[best])])
        rows.append(row)
    _remove_pattern_files(comm, workdir, pattern)
    return rows


def _quartiles(ratios: list[float]) -> dict[str, float]:
    """Median and quartiles of per-round ratios (NaN when there are none)."""
    q1, med, q3 = np.percentile(ratios, [25, 50, 75]) if ratios else (np.nan,) * 3
    return {"median": float(med), "q1": float(q1), "q3": float(q3)}


def _exists_on_rank0(comm: MPI.Comm, path: str) -> bool:
    """Whether ``path`` exists, as rank 0 sees it (collective): a collective step that ranks
    decided on their own could be skipped by some, on a file system whose view of the file
    differs between nodes."""
    return bool(comm.bcast(os.path.exists(path) if comm.Get_rank() == 0 else None))


def _remove_pattern_files(comm: MPI.Comm, workdir: str, pattern: str) -> None:
    """Rank 0 removes the pattern's files once every rank is done with them (collective)."""
    comm.Barrier()
    if comm.Get_rank() == 0:
        for name in os.listdir(workdir):
            if name.startswith(pattern + "."):
                os.unlink(os.path.join(workdir, name))


# ---------------------------------------------------------------- one call (--mode call)
def run(
    pattern: str, reps: int, workdir: str, scale: float, contenders: list[str] | None = None
) -> list[dict[str, Any]]:
    contenders = contenders or CONTENDERS
    comm = MPI.COMM_WORLD
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    case = make_case(pattern, rank, nprocs, scale)
    total = comm.allreduce(case.nbytes)
    rows = []
    reference: np.ndarray | None = None
    for op in ("write", "read"):
        row: dict[str, Any] = {"pattern": pattern, "ranks": nprocs, "op": op, "bytes": total}
        times: dict[str, list[float]] = {c: [] for c in contenders}
        walls: dict[str, list[float]] = {c: [] for c in contenders}
        # Round-robin: every repetition runs each contender once, so drift in the machine's
        # speed and the cost of coming first spread evenly; round 0 is an untimed warm-up.
        # Each contender reads into its own buffer, allocated once and zeroed before each call
        # (as an application reuses its arrays): a fresh allocation per call would time the
        # page faults of whatever memory malloc hands out, which differs from call to call.
        outs = {c: np.zeros_like(case.buf) for c in contenders}
        for rep in range(reps + 1):
            turn = rep % len(contenders)  # each round starts with the next contender
            for contender in contenders[turn:] + contenders[:turn]:
                path = os.path.join(workdir, f"{pattern}.{contender.replace(' ', '_')}")
                out = outs[contender]
                out.fill(0)
                if op == "read" and not _exists_on_rank0(comm, path):
                    _one(comm, contender, case, path, True, out)
                if op == "write":
                    # A new file each time: truncating one whose blocks are still being
                    # written back makes ext4 wait for that writeback (noise, not I/O code).
                    if rank == 0 and os.path.exists(path):
                        os.unlink(path)
                    comm.Barrier()
                t, wall, chosen = _one(comm, contender, case, path, op == "write", out)
                if rep:
                    times[contender].append(t)
                    walls[contender].append(wall)
                if contender == "strataio":
                    row["path"] = chosen
                if op == "read" and rep == reps:  # every contender must read the same bytes
                    if reference is None:
                        reference, same = out.copy(), True
                    else:
                        same = np.array_equal(out, reference)
                    _same_everywhere(comm, same, f"{pattern}: {contender} read different data")
        for contender in contenders:
            row[contender] = total / statistics.median(times[contender]) / 1e6
            row.setdefault("wall", {})[contender] = (
                total / statistics.median(walls[contender]) / 1e6
            )
        if "strataio" not in contenders:
            rows.append(_pipeline_figures(row, times, contenders))
            continue
        best_romio = max(row["ROMIO coll"], row["ROMIO ind"])
        row["ratio"] = row["strataio"] / best_romio if best_romio else float("nan")
        # The same ratio within each round (both calls made back to back), whose spread shows
        # how much of a row's ratio is the machine drifting between rounds.
        best = "ROMIO coll" if row["ROMIO coll"] >= row["ROMIO ind"] else "ROMIO ind"
        row["paired"] = _quartiles([b / t for t, b in zip(times["strataio"], times[best]) if t > 0])
        wall = row["wall"]
        best_wall = max(wall["ROMIO coll"], wall["ROMIO ind"])
        row["ratio wall"] = wall["strataio"] / best_wall if best_wall else float("nan")
        rows.append(row)
    _remove_pattern_files(comm, workdir, pattern)
    return rows


def _pipeline_figures(
    row: dict[str, Any], times: dict[str, list[float]], contenders: list[str]
) -> dict[str, Any]:
    """Each strataio G's paired ratio against the first given (G = 1 in 1,2,4): median and
    quartiles."""
    pipelined = [c for c in contenders if c.startswith("strataio G=")]
    base = times[pipelined[0]]
    row["pipeline"] = {}
    for c in pipelined:
        row["pipeline"][c] = _quartiles([b / t for b, t in zip(base, times[c]) if t > 0])
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pattern", action="append", required=True, choices=PATTERNS)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--pipeline", default="", help="comma-separated group counts")
    ap.add_argument("--mode", choices=["open-close", "call"], default="open-close")
    ap.add_argument("--size", type=float, default=64.0, help="MiB all ranks move (open-close)")
    ap.add_argument("--op", choices=["write", "read"], action="append")
    ap.add_argument("--sync", action="store_true", help="os.sync() before each timed write")
    ap.add_argument(
        "--reference", action="store_true", help=f"also time {FILE_PER_RANK!r} (open-close)"
    )
    args = ap.parse_args(argv)
    groups = [int(g) for g in args.pipeline.split(",") if g.strip()]
    contenders = pipeline_contenders(groups) if groups else None
    comm = MPI.COMM_WORLD
    workdir = args.dir
    if workdir is None:
        workdir = comm.bcast(tempfile.mkdtemp(prefix="strataio-bench-") if comm.rank == 0 else None)
    rows = []
    for pattern in args.pattern:
        if args.mode == "call":
            rows += run(pattern, args.reps, workdir, args.scale, contenders)
        else:
            ops = tuple(args.op or ("write", "read"))
            total = int(args.size * 2**20)
            rows += run_steps(pattern, args.reps, workdir, total, ops, args.sync, args.reference)
    if comm.Get_rank() == 0:
        print(json.dumps(rows))
        if args.dir is None:
            os.rmdir(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
