"""``strataio bench flatten``: datatype flattening and realm splitting of a million pieces.

Three file views of about a million pieces each — an ``hvector`` of strided doubles, an
``indexed_block`` of irregular int pairs, and a ``subarray`` column block of a 2-D array — are
flattened from a freshly built datatype (cold: no cache entry), then split over ``realms``
evenly spaced file realms (``Extents.split`` at the realm boundaries, then ``bin_by``), which is
what a two-phase engine does before its exchange. The baseline is the straightforward
flattener: decode the datatype with mpi4py and expand its blocks in a Python loop (timed on a
tenth of the blocks and scaled, since it is linear in them). Times are medians of ``repeat``
runs, in seconds; the CPU time of flatten + split is reported too, since wall time on a
shared machine includes waiting for a core.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from strataio.layout.datatypes import flatten
from strataio.layout.extents import Extents

GOAL_SECONDS = 0.100  # flatten + split of a million pieces


@dataclass(frozen=True, slots=True)
class FlattenResult:
    """One datatype's figures (seconds; ``ratio`` = baseline / strataio flatten)."""

    name: str
    pieces: int
    flatten_s: float
    cached_s: float
    split_s: float
    baseline_s: float
    cpu_s: float
    """CPU time of flatten + split (thread time: unaffected by waiting for a busy core)."""

    @property
    def total_s(self) -> float:
        return self.flatten_s + self.split_s

    @property
    def ratio(self) -> float:
        return self.baseline_s / self.flatten_s if self.flatten_s > 0 else float("inf")

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "name": self.name,
            "pieces": self.pieces,
            "flatten_s": self.flatten_s,
            "cached_s": self.cached_s,
            "split_s": self.split_s,
            "total_s": self.total_s,
            "baseline_s": self.baseline_s,
            "ratio": self.ratio,
            "cpu_s": self.cpu_s,
        }


def _makers(n: int) -> dict[str, tuple[Callable[[int], MPI.Datatype], int]]:
    """name -> (build a datatype of ``k`` blocks, blocks in the full-size type)."""
    rng = np.random.default_rng(7)
    gaps = rng.integers(9, 40, n)  # int pairs (8 bytes) separated by irregular holes
    displs = np.cumsum(gaps) // 4  # in ints
    cols = 1000

    def hvector(k: int) -> MPI.Datatype:
        return MPI.DOUBLE.Create_hvector(k, 1, 24)

    def indexed(k: int) -> MPI.Datatype:
        return MPI.INT.Create_indexed_block(2, displs[:k].tolist())

    def subarray(k: int) -> MPI.Datatype:
        rows = max(k // 1, 1)
        return MPI.FLOAT.Create_subarray([rows, cols], [rows, 1], [0, 17])

    return {"hvector": (hvector, n), "indexed_block": (indexed, n), "subarray": (subarray, n)}


def _baseline(dt: MPI.Datatype) -> Extents:
    """Decode with mpi4py and expand block by block in Python (one level: named children)."""
    child, combiner, p = dt.decode()
    ext = child.Get_extent()[1]
    size = child.Get_size()
    offs: list[int] = []
    if combiner == "HVECTOR":
        for i in range(p["count"]):
            for j in range(p["blocklength"]):
                offs.append(i * p["stride"] + j * ext)
    elif combiner == "INDEXED_BLOCK":
        for d in p["displacements"]:
            for j in range(p["blocklength"]):
                offs.append((d + j) * ext)
    elif combiner == "SUBARRAY":
        rows, cols = p["sizes"]
        for r in range(p["starts"][0], p["starts"][0] + p["subsizes"][0]):
            for c in range(p["starts"][1], p["starts"][1] + p["subsizes"][1]):
                offs.append((r * cols + c) * ext)
    return Extents(np.array(offs, dtype=np.int64), np.full(len(offs), size, dtype=np.int64))


def _split(ext: Extents, lo: int, hi: int, realms: int) -> tuple[Extents, np.ndarray]:
    """Realms split ``[lo, hi)`` evenly (the aggregate access region of a two-phase call)."""
    bounds = np.linspace(lo, hi, realms + 1).astype(np.int64)
    cut = ext.split(bounds[1:-1])
    return cut, cut.bin_by(bounds)


def run_flatten(pieces: int = 1_000_000, realms: int = 16, repeat: int = 5) -> list[FlattenResult]:
    """Measure every datatype of :func:`_makers`; see the module docs."""
    out = []
    for name, (make, n) in _makers(pieces).items():
        flat_t, cached_t, split_t, cpu_t = [], [], [], []
        count = 0
        for _ in range(repeat):
            dt = make(n)
            c0 = time.thread_time()
            t0 = time.perf_counter()
            f = flatten(dt)
            t1 = time.perf_counter()
            flatten(dt)
            t2 = time.perf_counter()
            cut, bins = _split(f.extents, f.true_lb, f.true_lb + f.true_extent, realms)
            t3 = time.perf_counter()
            cpu_t.append(time.thread_time() - c0)
            dt.Free()
            count = len(f.extents)
            assert bins.max() < realms and bins.min() >= 0 and cut.nbytes == f.size
            flat_t.append(t1 - t0)
            cached_t.append(t2 - t1)
            split_t.append(t3 - t2)
        small = max(n // 10, 1)
        dt = make(small)
        t0 = time.perf_counter()
        ref = _baseline(dt)
        base = (time.perf_counter() - t0) * (n / small)
        if not np.array_equal(ref.byte_indices(), flatten(dt).extents.byte_indices()):
            raise AssertionError(f"{name}: baseline and flatten disagree")
        dt.Free()
        out.append(
            FlattenResult(
                name=name,
                pieces=count,
                flatten_s=statistics.median(flat_t),
                cached_s=statistics.median(cached_t),
                split_s=statistics.median(split_t),
                baseline_s=base,
                cpu_s=statistics.median(cpu_t),
            )
        )
    return out
