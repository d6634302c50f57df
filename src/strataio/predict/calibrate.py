"""Calibration, the paper's PTool: measure each tier's native calls into the performance table.

Per tier, at each concurrency level ``c`` (``c`` processes, launched under ``mpiexec``, making
the same call at once after a barrier, timed from the first process's start to the last one's
end), the terms of equation (1) (:mod:`strataio.predict.perfdb` names the ops):

- ``open``, ``seek``, ``view``, ``close``: a :class:`strataio.File` opened on the tier by the
  ranks together, its file pointer moved, a subarray view set (as the collective method sets
  one), closed;
- ``write`` / ``read`` of ``s`` bytes: one independent File call (the ``naive`` method's),
  timed in bursts of calls back to back at successive offsets (up to 8, 4 MiB per rank);
- ``write_all`` / ``read_all`` of ``s`` bytes: one collective File call moving ``s`` bytes in
  all through one aggregator in one two-phase window (the ``collective`` method's unit), each
  rank's share in 16 runs interleaved with the others' (a vector view), as a block
  distribution spreads a rank's block over the file;
- ``connect`` / ``disconnect``: the tier backend's first request less a second one, and its
  close;
- ``put`` / ``get`` of ``s`` bytes: one chunk of ``s`` bytes written or read whole through a
  collective dataset over the tier's backend (uncompressed).

Sizes are log-spaced (×4) from 1 KiB to 256 MiB unless capped, each measured ``repeat`` times.
Reads are cold where the tier allows it: before each read the file's pages are dropped from the
page cache (``POSIX_FADV_DONTNEED``, see :meth:`PosixBackend.drop_cache`); a file system that
ignores the advice reads warm, which the curves then show. A calibration's rows share one
``when``, so the latest calibration of a tier replaces earlier ones for prediction while the
catalog keeps them all.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from strataio.catalog.base import Catalog, PerfRow
from strataio.predict.perfdb import PerfTable

__all__ = ["DEFAULT_LEVELS", "calibrate", "default_sizes", "plot_perf"]

KIB = 1024
MAX_SIZE = 256 << 20
DEFAULT_LEVELS = (1, 2, 4)


def default_sizes(max_size: int = MAX_SIZE, min_size: int = KIB) -> list[int]:
    """Transfer sizes ``min_size · 4^k`` up to ``max_size`` (1 KiB … 256 MiB by default)."""
    out, s = [], int(min_size)
    while s <= max_size:
        out.append(s)
        s *= 4
    return out


def steps(sizes: Sequence[int], repeat: int) -> int:
    """Timed calls one calibration level makes (its progress total)."""
    return 6 * len(sizes) * repeat + 4 * repeat + 2


def calibrate(
    config: Any,
    catalog: Catalog,
    tiers: Sequence[str] | None = None,
    *,
    sizes: Sequence[int] | None = None,
    repeat: int = 3,
    levels: Sequence[int] = DEFAULT_LEVELS,
    cold: bool = True,
    on_progress: Callable[[str, int, int], None] | None = None,
    wait: float = 0.0,
    on_wait: Callable[[str], None] | None = None,
) -> list[PerfRow]:
    """Calibrate ``tiers`` (names; default every posix tier of ``config`` not ``read_only``,
    :class:`~strataio.errors.StrataError` where there is none: calibration writes, and one
    named raises) and record the rows
    in ``catalog``; returns them. ``on_progress(tier, done, total)`` follows the measurement.

    Each tier is measured holding its lock (:func:`~strataio.predict.native.lock_tiers`:
    another calibration or a measured run of the tier at once would be timed with it); one
    another process holds is waited for up to ``wait`` seconds (``on_wait(message)`` says
    so), then :class:`~strataio.errors.BusyError` names that process."""
    from strataio.errors import StrataError
    from strataio.predict.native import lock_tiers, tier_dir, unmeasurable

    sizes = list(sizes or default_sizes())
    names = (
        list(tiers)
        if tiers
        else [t.name for t in config.tiers if t.kind == "posix" and not t.read_only]
    )
    if not names:  # (said now, rather than "0 measurements stored" as if calibrated)
        why = "; ".join(filter(None, (unmeasurable(t) for t in config.tiers)))
        where = config.source or "the configuration"
        raise StrataError(f"no tier of {where} can be calibrated: {why or 'it has none'}")
    configs = [config.tier(n) for n in names]
    known = {r.name for r in catalog.tiers()}
    for tc in configs:
        tier_dir(tc, known)  # a tier calibration cannot reach: say so before measuring anything
        _check_room(tc, sizes, repeat, levels, catalog)
    per_level = steps(sizes, repeat)
    all_rows: list[PerfRow] = []
    for tc in configs:
        with lock_tiers([tc], f"calibrating tier {tc.name!r}", wait=wait, on_wait=on_wait):
            rows = _calibrate_tier(config, tc, sizes, repeat, levels, cold, per_level, on_progress)
        catalog.record_perf(rows)
        all_rows += rows
    return all_rows


def _tier_bytes(sizes: Sequence[int], repeat: int, ranks: int) -> int:
    """The most bytes a calibration level of ``ranks`` processes has on the tier at once: the
    file of a size's independent calls (``repeat`` bursts and the warm-up per rank), or the
    last collective file beside one chunk per rank (see :func:`_measure`)."""
    top = max(sizes)
    independent = max((repeat * _burst(s) + 1) * ranks * s for s in sizes)
    return max(independent, (repeat + 1) * top + ranks * top)


def _check_room(
    tc: Any, sizes: Sequence[int], repeat: int, levels: Sequence[int], catalog: Catalog
) -> None:
    """Raise :class:`~strataio.errors.StrataError` if the largest level's ranks cannot hold
    their buffers (two of the largest size each) in the node's memory, or what they write
    (:func:`_tier_bytes`) in the tier's free space or in what its configured capacity leaves
    beside the copies the catalog records there."""
    from strataio.errors import StrataError
    from strataio.sizes import format_size

    top, ranks = max(sizes), max(levels)
    memory = 2 * top * ranks
    room = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if memory > room:
        raise StrataError(
            f"tier {tc.name!r}: calibrating up to {format_size(top)} at {ranks} processes "
            f"needs {format_size(memory)} of memory (two buffers of the largest size per "
            f"process), more than this node's {format_size(room)}: lower --max-size"
        )
    disk = _tier_bytes(sizes, repeat, ranks)
    free = shutil.disk_usage(tc.path).free
    if disk > free:
        raise StrataError(
            f"tier {tc.name!r}: calibrating up to {format_size(top)} at {ranks} processes "
            f"writes {format_size(disk)} there, more than its {format_size(free)} free: "
            "lower --max-size or --repeat"
        )
    if tc.capacity_bytes is not None:
        stored = sum(u.nbytes for u in catalog.usage() if u.tier == tc.name)
        room = max(0, tc.capacity_bytes - stored)
        if disk > room:
            raise StrataError(
                f"tier {tc.name!r}: calibrating up to {format_size(top)} at {ranks} processes "
                f"writes {format_size(disk)} there, more than the {format_size(room)} its "
                f"configured capacity of {format_size(tc.capacity_bytes)} leaves beside the "
                f"{format_size(stored)} stored: lower --max-size or --repeat"
            )


def _calibrate_tier(
    config: Any,
    tc: Any,
    sizes: list[int],
    repeat: int,
    levels: Sequence[int],
    cold: bool,
    per_level: int,
    on_progress: Callable[[str, int, int], None] | None,
) -> list[PerfRow]:
    """The rows of one tier's calibration at each of ``levels`` (see :func:`calibrate`)."""
    from strataio.predict.native import measured_settings
    from strataio.predict.ranks import launch

    when = time.time()
    done = 0
    total = per_level * len(levels)
    rows: list[PerfRow] = []
    for c in levels:
        args = [
            json.dumps(
                {
                    "config": config.source or "",
                    "tier": tc.name,
                    "sizes": sizes,
                    "repeat": repeat,
                    "cold": cold,
                }
            )
        ]

        got = launch(
            c,
            "strataio.predict.calibrate",
            args,
            on_progress=_Progress(on_progress, tc.name, done, total),
        )
        rows += [
            PerfRow(tc.name, op, n, sec, c, when, measured_settings(tc))
            for op, n, sec in got["rows"]
        ]
        done += per_level
        _Progress(on_progress, tc.name, 0, total)(done)
    return rows


class _Progress:
    """Reports a level's progress lines as the tier's ``(tier, done, total)``."""

    def __init__(
        self, fn: Callable[[str, int, int], None] | None, tier: str, base: int, total: int
    ):
        self.fn, self.tier, self.base, self.total = fn, tier, base, total

    def __call__(self, k: int) -> None:
        if self.fn is not None:
            self.fn(self.tier, self.base + k, self.total)


# -- the ranks' side ------------------------------------------------------------------------


class _Timer:
    """Times calls made at once on every rank, as the group's wall time: from the first rank's
    start to the last rank's end (``perf_counter`` is the node's monotonic clock, the same in
    every process), so time a rank waits for a core while others run is counted, as it is in
    a run. A burst of calls made back to back is timed as a whole and divided by its length."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rows: list[tuple[str, int, float]] = []
        self.count = 0

    def time(self, op: str, nbytes: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` started on every rank after a barrier, timed."""
        out: list[Any] = []
        self.burst(op, nbytes, [(lambda: out.append(fn(*args)))])
        return out[0]

    def burst(self, op: str, nbytes: int, calls: Sequence[Callable[[], Any]]) -> None:
        """Each rank makes ``calls`` back to back; one sample of the time per call."""
        from mpi4py import MPI

        self.comm.Barrier()
        t0 = time.perf_counter()
        for call in calls:
            call()
        t1 = time.perf_counter()
        start = self.comm.allreduce(t0, op=MPI.MIN)
        end = self.comm.allreduce(t1, op=MPI.MAX)
        self.record(op, nbytes, (end - start) / len(calls))

    def record(self, op: str, nbytes: int, seconds: float) -> None:
        self.rows.append((op, nbytes, seconds))
        self.count += 1
        if self.count % 4 == 0:
            from strataio.predict.ranks import report

            report(self.comm, {"progress": self.count})


#: bytes a burst of small calls moves per rank (at most BURST calls): enough calls that the
#: time processes wait for a core is in the measurement, as it is in a run of many calls
BURST_BYTES = 4 << 20
BURST = 8
#: runs each rank's share of a calibrated collective call is cut into
PIECES = 16


def _burst(size: int) -> int:
    return max(1, min(BURST, BURST_BYTES // size))


def _measure(tc: Any, sizes: list[int], repeat: int, cold: bool, comm: Any) -> list:
    """Every op of the module docs, timed on the ``comm`` ranks at once, as runs use them: one
    File shared by the ranks, each rank's calls at its own offsets, files grown by each write
    (a run's dumps are new data); one chunk per rank of a collective dataset."""
    from mpi4py import MPI

    from strataio.arrays.dataset import Dataset
    from strataio.arrays.metadata import ArrayMetadata
    from strataio.arrays.store import BackendChunkStore
    from strataio.collective.file import File
    from strataio.predict.native import (
        WORK_DIR,
        drop_cached,
        file_hints,
        tier_backend,
        work_path,
    )

    rank, nprocs = comm.Get_rank(), comm.Get_size()
    timer = _Timer(comm)
    buf = np.random.default_rng(rank).integers(0, 256, max(sizes), dtype=np.uint8)
    out = np.empty_like(buf)
    path = work_path(tc, "calibrate.bin")
    wh, rh = file_hints(tc, True), file_hints(tc, False)
    # a view as the collective method sets one: this rank's rows of a 2-D array of bytes
    view = MPI.BYTE.Create_subarray([nprocs * 64, 4096], [64, 2048], [rank * 64, 1024]).Commit()

    def fresh(hints: dict[str, str]) -> Any:
        if rank == 0:
            drop_cached(path)
        return File.open(comm, path, "w", hints)

    try:
        for _ in range(repeat):
            f = timer.time("open", 0, File.open, comm, path, "w", wh)
            timer.time("seek", 0, f.seek, 12345)
            timer.time("view", 0, f.set_view, 0, MPI.BYTE, view)
            timer.time("close", 0, f.close)
        # independent calls (naive): rank r's k-th call at slot k * nprocs + r
        for s in sizes:
            f = fresh(wh)
            f.write_at(rank * s, buf[:s])  # warm-up, untimed
            b = _burst(s)
            for k in range(repeat):
                slots = [(1 + k * b + j) * nprocs + rank for j in range(b)]
                timer.burst("write", s, [partial(f.write_at, i * s, buf[:s]) for i in slots])
            f.close()
        f = File.open(comm, path, "r", rh)
        for s in sizes:
            b = _burst(s)
            for k in range(repeat):
                slots = [(1 + k * b + j) * nprocs + rank for j in range(b)]
                if cold and rank == 0:
                    drop_cached(path)
                timer.burst("read", s, [partial(f.read_at, i * s, out[:s]) for i in slots])
        f.close()
        # collective calls (two-phase, one aggregator, one window of s bytes), each rank's
        # share in PIECES runs interleaved with the other ranks' as a block pattern makes them
        for s in sizes:
            part = s // nprocs
            run = max(1, part // PIECES)
            count = part // run
            vec = MPI.BYTE.Create_vector(count, run, run * nprocs).Commit()
            cb = {"cb_nodes": "1", "cb_buffer_size": str(max(s, 1)), "romio_cb_write": "enable"}
            f = fresh({**wh, **cb})
            for k in range(repeat + 1):
                f.set_view(k * s + rank * run, MPI.BYTE, vec)
                if k == 0:
                    f.write_at_all(0, buf[: count * run])  # warm-up, untimed
                else:
                    timer.time("write_all", s, f.write_at_all, 0, buf[: count * run])
            f.close()
            f = File.open(comm, path, "r", {**rh, **cb, "romio_cb_read": "enable"})
            for k in range(1, repeat + 1):
                f.set_view(k * s + rank * run, MPI.BYTE, vec)
                if cold and rank == 0:
                    drop_cached(path)
                timer.time("read_all", s, f.read_at_all, 0, out[: count * run])
            f.close()
            vec.Free()
        # the backend: connection, then a collective dataset of one chunk per rank
        backend = tier_backend(tc)
        probe = f"{WORK_DIR}/calibrate.bin"
        comm.Barrier()
        t0 = time.perf_counter()
        backend.exists(probe)
        t1 = time.perf_counter()
        backend.exists(probe)
        t2 = time.perf_counter()
        timer.record("connect", 0, max(0.0, (t1 - t0) - (t2 - t1)))
        for s in sizes:
            prefix = f"{WORK_DIR}/calibrate-{s}"
            meta = ArrayMetadata.create((nprocs * s,), "u1", (s,), None)
            store = BackendChunkStore(backend, prefix)
            if rank == 0:
                store.put_meta(meta.to_json())
            comm.Barrier()
            ds = Dataset(store, meta, "r+", comm=comm)
            mine = slice(rank * s, (rank + 1) * s)
            ds.write_all(mine, buf[:s])  # warm-up, untimed
            for _ in range(repeat):
                timer.time("put", s, _put, ds, mine, buf[:s])
            for _ in range(repeat):
                ds.clear_cache()
                if cold and rank == 0:
                    drop_cached(os.path.join(tc.path, prefix))
                timer.time("get", s, ds.read_all, mine)
            ds.close()
            comm.Barrier()
            if rank == 0:
                store.clear()
        timer.time("disconnect", 0, backend.close)
    except Exception:
        # (no barrier: the other ranks may be inside a call this rank will not make; the
        # job ends, see strataio.predict.ranks.whole_job)
        with contextlib.suppress(OSError):
            os.remove(path)
        raise
    finally:
        view.Free()
    comm.Barrier()
    if rank == 0:
        with contextlib.suppress(OSError):
            os.remove(path)
    return timer.rows


def _put(ds: Any, sel: slice, data: np.ndarray) -> None:
    ds.write_all(sel, data)
    ds.flush()


def _rank_main(argv: list[str]) -> None:
    from mpi4py import MPI

    from strataio.config import load_config
    from strataio.predict.ranks import report, whole_job

    with whole_job(MPI.COMM_WORLD):
        args = json.loads(argv[0])
        config = load_config(args["config"] or None)
        rows = _measure(
            config.tier(args["tier"]), args["sizes"], args["repeat"], args["cold"], MPI.COMM_WORLD
        )
    report(MPI.COMM_WORLD, {"rows": rows})


# -- the curves ------------------------------------------------------------------------------


_LABELS = {
    "read": "File call",
    "write": "File call",
    "read_all": "collective call",
    "write_all": "collective call",
    "get": "chunk",
    "put": "chunk",
}


def plot_perf(
    perf: PerfTable, out: str | os.PathLike[str], tiers: Sequence[str] | None = None
) -> None:
    """Draw read and write time against size, log-log, per tier (the paper's Figures 6-8):
    one row per tier, reads left, writes right; independent File calls, collective calls and
    chunks, one line per concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(tiers) if tiers else perf.tiers
    fig, axes = plt.subplots(len(names), 2, figsize=(10, 3.6 * len(names)), squeeze=False)
    for row, tier in zip(axes, names):
        pairs = (("read", ("read", "read_all", "get")), ("write", ("write", "write_all", "put")))
        for ax, (title, ops) in zip(row, pairs):
            for op, style in zip(ops, ("-o", ":^", "--s")):
                if not perf.has(tier, op):
                    continue
                curve = perf.curve(tier, op)
                for i, c in enumerate(curve.levels):
                    ok = ~np.isnan(curve.seconds[i])
                    label = f"{_LABELS[op]} ×{int(c)}"
                    ax.loglog(curve.sizes[ok], curve.seconds[i][ok], style, ms=3, label=label)
            ax.set_title(f"{tier}: {title} time")
            ax.set_xlabel("transfer size (bytes)")
            ax.set_ylabel("seconds")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    _rank_main(sys.argv[1:])
