"""``strataio bench sieving``: independent strided I/O, direct vs data sieving vs ROMIO.

A file of ``file_mib`` MiB (page-cached; every method sees the same cache state) is accessed
through a strided pattern: ``piece`` bytes every ``stride`` bytes. Each method moves the same
pieces between the file and a packed buffer:

- ``direct``: :func:`~strataio.collective.sieving.read_direct` / ``write_direct``, one
  ``preadv`` / ``pwritev`` per piece (the baseline: list I/O without sieving);
- ``sieved``: ``read_sieved`` / ``write_sieved`` with ROMIO's default buffers (4 MiB / 512 KiB),
  every hole sieved (``romio_ds_*=enable``);
- ``automatic``: the independent route of ``strataio.File`` (``IndependentIO``) with default hints (cost model);
- ``file``: ``strataio.File.read_at`` / ``write_at`` through the equivalent strided file view,
  ``romio_ds_*=enable``: the same sieving, planned once per layout and reused by later calls;
- ``romio``: ``MPI.File.Read_at`` / ``Write_at`` through that view, ``romio_ds_*=enable``
  (ROMIO's own data sieving), for reference.

The module functions (``direct``, ``sieved``, ``automatic``) plan every call afresh, as a
caller that hands them new pieces each time needs; ``file`` and ``romio`` are the like-for-like
pair.

Patterns: a dense one (holes shorter than a system call's worth of bytes, where sieving wins)
and a sparse one (holes of 64 KiB, where it loses and ``automatic`` must not sieve). Times are
medians of ``repeat`` runs, in seconds; ``speedup`` is direct time / method time.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

import strataio
from strataio.collective import sieving
from strataio.collective.access import Access
from strataio.collective.driver import PosixDriver
from strataio.collective.hints import parse_hints
from strataio.collective.independent import IndependentIO
from strataio.layout.extents import Extents

METHODS = ("direct", "sieved", "automatic", "file", "romio")
PATTERNS = {"dense": (64, 256), "sparse": (64, 65536)}  # name -> (piece, stride) bytes
_ENABLE = {"romio_ds_read": "enable", "romio_ds_write": "enable"}


@dataclass(frozen=True, slots=True)
class SievingResult:
    """One (pattern, operation, method) cell; ``seconds`` is a median."""

    pattern: str
    op: str
    method: str
    pieces: int
    nbytes: int
    seconds: float
    speedup: float

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "pattern": self.pattern,
            "op": self.op,
            "method": self.method,
            "pieces": self.pieces,
            "nbytes": self.nbytes,
            "seconds": self.seconds,
            "speedup": self.speedup,
        }


def _median(fn: Callable[[], None], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_sieving(file_mib: int = 32, repeat: int = 3) -> list[SievingResult]:
    """Measure every method on every pattern; see the module docs."""
    size = file_mib << 20
    out: list[SievingResult] = []
    with tempfile.TemporaryDirectory(prefix="strataio-sieve-") as tmp:
        path = os.path.join(tmp, "data.bin")
        np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tofile(path)
        drv = PosixDriver.open(path, os.O_RDWR)  # (the driver File's engines get)
        automatic, enable = IndependentIO(), IndependentIO(parse_hints(_ENABLE))
        try:
            for name, (piece, stride) in PATTERNS.items():
                n = size // stride
                ext = Extents(np.arange(n, dtype=np.int64) * stride, np.full(n, piece))
                buf = np.empty(ext.nbytes, dtype=np.uint8)
                data = np.random.default_rng(1).integers(0, 256, ext.nbytes, dtype=np.uint8)
                view = MPI.BYTE.Create_contiguous(piece).Create_resized(0, stride)
                view.Commit()
                info = MPI.Info.Create()
                info.Set("romio_ds_read", "enable")
                info.Set("romio_ds_write", "enable")
                fh = MPI.File.Open(MPI.COMM_SELF, path, MPI.MODE_RDWR, info)
                fh.Set_view(0, MPI.BYTE, view, "native", info)
                sf = strataio.File.open(None, path, "r+", hints=_ENABLE)
                sf.set_view(0, MPI.BYTE, view)
                calls: dict[tuple[str, str], Callable[[], None]] = {
                    ("read", "direct"): lambda e=ext, b=buf: sieving.read_direct(drv, e, b),
                    ("read", "sieved"): lambda e=ext, b=buf: sieving.read_sieved(drv, e, b),
                    ("read", "automatic"): lambda e=ext, b=buf: automatic.read(drv, Access(e, b)),
                    ("read", "file"): lambda b=buf, f=sf: f.read_at(0, b),
                    ("read", "romio"): lambda b=buf, f=fh: f.Read_at(0, b),
                    ("write", "direct"): lambda e=ext, d=data: sieving.write_direct(drv, e, d),
                    ("write", "sieved"): lambda e=ext, d=data: enable.write(drv, Access(e, d)),
                    ("write", "automatic"): lambda e=ext, d=data: automatic.write(
                        drv, Access(e, d)
                    ),
                    ("write", "file"): lambda d=data, f=sf: f.write_at(0, d),
                    ("write", "romio"): lambda d=data, f=fh: f.Write_at(0, d),
                }
                try:
                    for op in ("read", "write"):
                        base = 0.0
                        for method in METHODS:
                            fn = calls[(op, method)]
                            fn()  # warm: same page-cache state for all
                            t = _median(fn, repeat)
                            if method == "direct":
                                base = t
                            if op == "read" and method != "direct":
                                want = Extents(ext.offsets, ext.lengths)
                                check = np.empty_like(buf)
                                sieving.read_direct(drv, want, check)
                                if not np.array_equal(check, buf):
                                    raise AssertionError(f"{name}/{method}: wrong bytes read")
                            out.append(
                                SievingResult(
                                    name, op, method, n, ext.nbytes, t, base / t if t else 0.0
                                )
                            )
                finally:
                    sf.close()
                    fh.Close()
                    info.Free()
                    view.Free()
        finally:
            drv.close()
    return out


# ---------------------------------------------------------------------------- the sweep
#: densities (data / extent) of the sweep's datatypes
SWEEP_DENSITIES = (0.25, 0.5, 0.75)


def sweep_extents() -> list[int]:
    """Datatype extents of the sweep: 1 KiB to 1 MiB in steps of a factor of sqrt(2)."""
    return sorted({int(round(1024 * 2 ** (k / 2) / 8)) * 8 for k in range(21)})


@dataclass(frozen=True, slots=True)
class SweepCell:
    """One (op, density, extent) point: a window accessed sieved and one call per piece."""

    op: str
    density: float
    extent: int
    pieces: int
    sieved: float  # seconds, median
    per_piece: float

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "op": self.op,
            "density": self.density,
            "extent": self.extent,
            "pieces": self.pieces,
            "sieved": self.sieved,
            "per_piece": self.per_piece,
        }


@dataclass(frozen=True, slots=True)
class Crossover:
    """The extent from which one call per piece beats sieving, at one density, the hole
    ``(1 - density) * extent`` there, and the bytes sieving moves beyond the pieces per call it
    saves (reads: the hole; writes: extent + hole) (inf: sieving won at every extent)."""

    op: str
    density: float
    extent: float
    hole: float
    extra: float


@dataclass(frozen=True, slots=True)
class SweepResult:
    cells: list[SweepCell]
    crossovers: list[Crossover]
    threshold: dict[str, int]  # op -> picked bytes per call (4 KiB pages)
    current: dict[str, int]  # op -> the threshold strataio uses now


def _crossover(op: str, density: float, cells: list[SweepCell]) -> Crossover:
    """First extent where per-piece time <= sieved time, interpolated geometrically between
    the two sweep points around it."""
    prev = None
    for c in cells:
        r = c.per_piece / c.sieved
        if r <= 1.0:
            if prev is None:
                e = float(c.extent)
            else:
                rp = prev.per_piece / prev.sieved
                t = np.log(rp) / (np.log(rp) - np.log(r)) if rp != r else 1.0
                e = float(np.exp(np.log(prev.extent) + t * (np.log(c.extent / prev.extent))))
            hole = (1 - density) * e
            return Crossover(op, density, e, hole, hole + (e if op == "write" else 0.0))
        prev = c
    inf = float("inf")
    return Crossover(op, density, inf, inf, inf)


def _pages(x: float) -> int:
    """``x`` bytes rounded to a whole number of 4 KiB pages (0 when not finite)."""
    return int(round(x / 4096)) * 4096 if np.isfinite(x) else 0


def run_sweep(
    window_mib: int = 16,
    repeat: int = 3,
    rounds: int = 5,
    densities: tuple[float, ...] = SWEEP_DENSITIES,
    extents: list[int] | None = None,
) -> SweepResult:
    """Conditional data sieving inside two-phase I/O, measured: an aggregator's window of
    ``window_mib`` MiB (``cb_buffer_size``'s default is 16) holding one piece of
    ``density * extent`` bytes every ``extent`` bytes, read (written) through
    :mod:`strataio.collective.fileio` the two ways a window can be: one covering span
    (sieving: for writes, the read-modify-write of the span) or one call per piece. The file
    is page-cached. For each density the crossover extent is where one call per piece stops
    losing. The whole sweep runs ``rounds`` times (a shared machine drifts over seconds);
    the threshold picked is the median over every round and density of the bytes sieving
    moves beyond the pieces per call saved at the crossover (reads: the hole; writes:
    extent + hole), rounded to 4 KiB — what
    :func:`strataio.collective.fileio.window_spans` sieves up to. Cells and crossovers are
    reported as medians over the rounds."""
    from strataio.collective import fileio

    size = window_mib << 20
    extents = extents or sweep_extents()
    keys = [(op, d, e) for op in ("read", "write") for d in densities for e in extents]
    times: dict[tuple[str, float, int], list[tuple[float, float]]] = {k: [] for k in keys}
    with tempfile.TemporaryDirectory(prefix="strataio-sweep-") as tmp:
        path = os.path.join(tmp, "window.bin")
        np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tofile(path)
        drv = PosixDriver.open(path, os.O_RDWR)
        buf = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
        try:
            for _ in range(max(rounds, 1)):
                for op, d, e in keys:
                    write = op == "write"
                    n = size // e
                    run_off = np.arange(n, dtype=np.int64) * e
                    run_len = np.full(n, max(int(round(d * e)), 1), dtype=np.int64)
                    sp_off, sp_len = fileio.window_spans(run_off, run_len, size, write, 0)
                    sieve, piece = (
                        _window_io(drv, buf, list(zip(o.tolist(), ln.tolist())), write, holes)
                        for o, ln, holes in ((sp_off, sp_len, True), (run_off, run_len, False))
                    )
                    times[(op, d, e)].append((_median(sieve, repeat), _median(piece, repeat)))
        finally:
            drv.close()
    per_round = [
        [
            SweepCell(op, d, e, size // e, times[(op, d, e)][r][0], times[(op, d, e)][r][1])
            for op, d, e in keys
        ]
        for r in range(max(rounds, 1))
    ]
    found = [
        _crossover(op, d, [c for c in cells if c.op == op and c.density == d])
        for cells in per_round
        for op in ("read", "write")
        for d in densities
    ]
    cells = [
        SweepCell(
            op, d, e, size // e,
            statistics.median(t[0] for t in times[(op, d, e)]),
            statistics.median(t[1] for t in times[(op, d, e)]),
        )
        for op, d, e in keys
    ]  # fmt: skip
    crossovers = []
    for op in ("read", "write"):
        for d in densities:
            mine = [c for c in found if c.op == op and c.density == d]
            crossovers.append(
                Crossover(
                    op,
                    d,
                    *(
                        float(np.median([getattr(c, f) for c in mine]))
                        for f in ("extent", "hole", "extra")
                    ),
                )  # fmt: skip
            )
    threshold = {
        op: _pages(float(np.median([c.extra for c in found if c.op == op])))
        for op in ("read", "write")
    }
    current = {"read": fileio.SIEVE_READ_BYTES, "write": fileio.SIEVE_WRITE_BYTES}
    return SweepResult(cells, crossovers, threshold, current)


def _window_io(
    drv: PosixDriver, buf: np.ndarray, spans: list[tuple[int, int]], write: bool, holes: bool
) -> Callable[[], None]:
    """One window's file access as two-phase does it: spans read, or (writes) spans with
    holes read first and then every span written."""
    from strataio.collective import fileio

    def run() -> None:
        if write:
            if holes:
                for off, n in spans:
                    fileio.pread_upto(drv, buf[off : off + n], off)
            for off, n in spans:
                fileio.pwrite_from(drv, buf[off : off + n], off)
        else:
            for off, n in spans:
                fileio.pread_into(drv, buf[off : off + n], off)

    run()  # warm
    return run
