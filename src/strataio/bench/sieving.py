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
