"""Workloads: the I/O model of the multi-storage paper's Figure 1(a) as a TOML file.

A run of ``iterations`` steps on ``ranks`` processes reads or writes each dataset every
``frequency`` steps. Steps are numbered ``0 … iterations`` (the initial state and each step
after it), so a dataset of frequency ``f`` is accessed ``iterations // f + 1`` times: the
``N / freq(j) + 1`` of the paper's equation (2). ::

    [run]
    ranks = 4
    iterations = 12
    tier = "local"            # a configured tier
    method = "collective"     # naive | collective | chunked
    compute_s = 0.0           # optional: seconds of computation per step (not I/O)
    cb_nodes = 2              # optional (collective): aggregators, clamped to ranks
    cb_buffer_size = "4MiB"   # optional (collective): two-phase buffer per aggregator

    [[dataset]]
    name = "temp"
    dtype = "float32"
    dims = [64, 64, 64]
    pattern = "BBB"           # one letter per dimension: B = block-distributed, * = not
    frequency = 6
    mode = "write"            # write | read
    tier = "archive"          # optional: this dataset's tier instead of run.tier

A dataset's partition over the ranks (:class:`Partition`) follows the paper's pattern letters
as HPF's ``BLOCK`` and ``*`` distributions: the ranks form a grid over the ``B`` dimensions
(balanced as ``MPI_Dims_create`` balances it) and each rank holds one block of
``ceil(dim / grid)`` elements per dimension, C order.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from strataio.errors import StrataError
from strataio.sizes import parse_size

__all__ = [
    "METHODS",
    "DatasetSpec",
    "Partition",
    "RunSpec",
    "Workload",
    "WorkloadError",
    "load_workload",
    "parse_workload",
]

METHODS = ("naive", "collective", "chunked")
MODES = ("write", "read")
#: pattern letters: HPF BLOCK, and * for a dimension every rank holds whole
PATTERN_LETTERS = ("B", "*")
#: ROMIO's default two-phase buffer per aggregator
DEFAULT_CB_BUFFER = 16 << 20


class WorkloadError(StrataError, ValueError):
    """A workload file that cannot be run: a missing or unknown key, a bad value, a pattern
    that does not match the dimensions, a dataset no tier can hold."""


@dataclass(frozen=True, slots=True)
class Partition:
    """A ``pattern`` distribution of ``dims`` over ``ranks``: ``grid`` ranks per dimension,
    ``block`` elements per rank per dimension (the last block of a dimension may be short)."""

    dims: tuple[int, ...]
    grid: tuple[int, ...]
    block: tuple[int, ...]

    @classmethod
    def of(cls, dims: tuple[int, ...], pattern: str, ranks: int) -> Partition:
        """The partition the paper's pattern letters give (see the module docs)."""
        from mpi4py import MPI

        fixed = [0 if c == "B" else 1 for c in pattern]
        grid = tuple(MPI.Compute_dims(ranks, fixed)) if "B" in pattern else tuple(fixed)
        block = tuple(-(-d // g) for d, g in zip(dims, grid))
        return cls(tuple(dims), grid, block)

    def box(self, rank: int) -> tuple[slice, ...]:
        """Rank ``rank``'s block as slices (empty slices for a rank beyond the grid)."""
        if rank >= math.prod(self.grid):
            return tuple(slice(0, 0) for _ in self.dims)
        coords = [int(c) for c in np.unravel_index(rank, self.grid)]
        return tuple(
            slice(min(c * b, d), min((c + 1) * b, d))
            for c, b, d in zip(coords, self.block, self.dims)
        )

    def shape(self, rank: int) -> tuple[int, ...]:
        return tuple(s.stop - s.start for s in self.box(rank))

    def _tail(self, shape: tuple[int, ...]) -> int:
        """The first dimension of the contiguous tail of a block of ``shape``: the last
        dimension the block cuts, or 0 when it cuts none."""
        k = len(shape) - 1
        while k > 0 and shape[k] == self.dims[k]:
            k -= 1
        return k

    def runs(self, rank: int) -> tuple[int, int]:
        """``(count, elements)``: the contiguous runs (C order) rank ``rank``'s block is made
        of in the whole array, and the elements of each."""
        shape = self.shape(rank)
        if 0 in shape:
            return 0, 0
        run = math.prod(shape[self._tail(shape) :])
        return math.prod(shape) // run, run

    def run_offsets(self, rank: int) -> np.ndarray:
        """Element offsets in the whole array (C order) of rank ``rank``'s runs, increasing."""
        box, shape = self.box(rank), self.shape(rank)
        if 0 in shape:
            return np.zeros(0, dtype=np.int64)
        k = self._tail(shape)
        lead = np.meshgrid(*[np.arange(b.start, b.stop) for b in box[:k]], indexing="ij")
        count = math.prod(shape[:k])
        idx = [g.ravel() for g in lead] + [np.full(count, b.start) for b in box[k:]]
        return np.ravel_multi_index(idx, self.dims).astype(np.int64)


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    """One ``[[dataset]]`` table. ``tier`` is ``None`` when the run's tier applies."""

    name: str
    dtype: np.dtype
    dims: tuple[int, ...]
    pattern: str
    frequency: int
    mode: str
    tier: str | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.dims) * self.dtype.itemsize

    def accesses(self, iterations: int) -> int:
        """How many times a run of ``iterations`` steps accesses it (``N // freq + 1``)."""
        return iterations // self.frequency + 1


@dataclass(frozen=True, slots=True)
class RunSpec:
    """The ``[run]`` table."""

    ranks: int
    iterations: int
    tier: str
    method: str
    compute_s: float = 0.0
    cb_nodes: int = 1
    cb_buffer_size: int = DEFAULT_CB_BUFFER


@dataclass(frozen=True, slots=True)
class Workload:
    """A parsed workload: the run and its datasets, in file order."""

    run: RunSpec
    datasets: tuple[DatasetSpec, ...]
    source: str = "<workload>"

    def tier_of(self, ds: DatasetSpec) -> str:
        return ds.tier or self.run.tier

    def partition(self, ds: DatasetSpec) -> Partition:
        return Partition.of(ds.dims, ds.pattern, self.run.ranks)

    def with_run(self, **changes: Any) -> Workload:
        """A copy with ``[run]`` fields replaced (e.g. another ``method`` or ``tier``)."""
        return dataclasses.replace(self, run=dataclasses.replace(self.run, **changes))

    def check_capacity(self, capacities: Mapping[str, int | None]) -> None:
        """Raise :class:`WorkloadError` if a dataset names an unknown tier, or the bytes placed
        on a tier exceed its capacity (``None`` = unbounded); the message names the tiers
        where the dataset would fit."""
        used: dict[str, int] = {}
        for ds in self.datasets:
            tier = self.tier_of(ds)
            if tier not in capacities:
                raise WorkloadError(
                    f"{self.source}: dataset {ds.name!r}: no tier {tier!r} is configured "
                    f"(tiers: {', '.join(capacities)})"
                )
            used[tier] = used.get(tier, 0) + ds.nbytes
            cap = capacities[tier]
            if cap is not None and used[tier] > cap:
                fits = [t for t, c in capacities.items() if c is None or c >= ds.nbytes]
                where = (
                    f"it fits on {', '.join(fits)}"
                    if fits
                    else f"it is too large for every tier ({_fmt(max(c or 0 for c in capacities.values()))} at most)"
                )
                raise WorkloadError(
                    f"{self.source}: dataset {ds.name!r} ({_fmt(ds.nbytes)}) does not fit on tier "
                    f"{tier!r} ({_fmt(cap)}, {_fmt(used[tier] - ds.nbytes)} taken by the datasets "
                    f"before it); {where}"
                )


def _fmt(n: int) -> str:
    from strataio.sizes import format_size

    return format_size(n)


# -- parsing ------------------------------------------------------------------------------

_RUN_KEYS = {
    "ranks": (int,),
    "iterations": (int,),
    "tier": (str,),
    "method": (str,),
    "compute_s": (int, float),
    "cb_nodes": (int,),
    "cb_buffer_size": (int, str),
}
_RUN_NEEDED = ("ranks", "iterations", "tier", "method")
_DATASET_KEYS = {
    "name": (str,),
    "dtype": (str,),
    "dims": (list,),
    "pattern": (str,),
    "frequency": (int,),
    "mode": (str,),
    "tier": (str,),
}
_DATASET_NEEDED = ("name", "dtype", "dims", "pattern", "frequency", "mode")


def load_workload(path: str | os.PathLike[str]) -> Workload:
    """Read and validate the workload file at ``path`` (:class:`WorkloadError` naming the file
    and the key for anything wrong)."""
    where = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise WorkloadError(f"workload file {where!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise WorkloadError(f"{where}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{where}: cannot read: {exc}") from None
    return parse_workload(data, source=where)


def parse_workload(data: Mapping[str, Any] | str, *, source: str = "<workload>") -> Workload:
    """Validate a workload given as a parsed TOML mapping or as TOML text."""
    if isinstance(data, str):
        try:
            data = tomllib.loads(data)
        except tomllib.TOMLDecodeError as exc:
            raise WorkloadError(f"{source}: not valid TOML: {exc}") from None
    _unknown(data, {"run", "dataset"}, source, "")
    run_t = data.get("run")
    if not isinstance(run_t, dict):
        raise WorkloadError(f"{source}: a [run] table is needed")
    tables = data.get("dataset", [])
    if not isinstance(tables, list) or not tables:
        raise WorkloadError(f"{source}: at least one [[dataset]] table is needed")
    run = _run(run_t, source)
    seen: set[str] = set()
    datasets = []
    for i, t in enumerate(tables):
        if not isinstance(t, dict):
            raise WorkloadError(f"{source}: dataset[{i}]: expected a table ([[dataset]])")
        ds = _dataset(t, source, i)
        if ds.name in seen:
            raise WorkloadError(f"{source}: dataset name {ds.name!r} is used twice")
        seen.add(ds.name)
        datasets.append(ds)
    return Workload(run, tuple(datasets), source)


def _unknown(table: Mapping[str, Any], known: set[str] | dict, source: str, where: str) -> None:
    extra = sorted(set(table) - set(known))
    if extra:
        raise WorkloadError(
            f"{source}: {where}{extra[0]}: unknown key (known: {', '.join(sorted(known))})"
        )


def _typed(table: Mapping[str, Any], types: dict, needed: tuple, source: str, where: str) -> dict:
    _unknown(table, types, source, where)
    for k in needed:
        if k not in table:
            raise WorkloadError(f"{source}: {where}{k} is missing")
    for k, v in table.items():
        ok = types[k]
        if isinstance(v, bool) or not isinstance(v, ok):
            names = " or ".join(t.__name__ for t in ok)
            raise WorkloadError(f"{source}: {where}{k}: expected {names}, got {v!r}")
    return dict(table)


def _run(t: Mapping[str, Any], source: str) -> RunSpec:
    v = _typed(t, _RUN_KEYS, _RUN_NEEDED, source, "run.")

    def fail(k: str, msg: str) -> WorkloadError:
        return WorkloadError(f"{source}: run.{k}: {msg}")

    if v["ranks"] < 1:
        raise fail("ranks", f"must be at least 1, got {v['ranks']}")
    if v["iterations"] < 0:
        raise fail("iterations", f"must be >= 0, got {v['iterations']}")
    if v["method"] not in METHODS:
        raise fail("method", f"{v['method']!r} is not one of {', '.join(METHODS)}")
    compute = float(v.get("compute_s", 0.0))
    if compute < 0 or not math.isfinite(compute):
        raise fail("compute_s", f"must be a finite number >= 0, got {compute}")
    cb_nodes = v.get("cb_nodes", 1)
    if cb_nodes < 1:
        raise fail("cb_nodes", f"must be at least 1, got {cb_nodes}")
    cb = parse_size(
        v.get("cb_buffer_size", DEFAULT_CB_BUFFER), where=f"{source}: run.cb_buffer_size"
    )
    if not cb or cb < 1:
        raise fail("cb_buffer_size", "must be a positive size")
    return RunSpec(
        v["ranks"], v["iterations"], v["tier"], v["method"], compute, min(cb_nodes, v["ranks"]), cb
    )


def _dataset(t: Mapping[str, Any], source: str, i: int) -> DatasetSpec:
    where = f"dataset[{i}]."
    v = _typed(t, _DATASET_KEYS, _DATASET_NEEDED, source, where)
    if not v["name"].strip():
        raise WorkloadError(f"{source}: {where}name: must not be empty, got {v['name']!r}")
    where = f"dataset[{i}] ({v['name']})."

    def fail(k: str, msg: str) -> WorkloadError:
        return WorkloadError(f"{source}: {where}{k}: {msg}")

    try:
        dtype = np.dtype(v["dtype"])
    except TypeError:
        raise fail("dtype", f"{v['dtype']!r} is not a numpy dtype") from None
    if dtype.kind not in "biuf" or dtype.itemsize == 0:
        raise fail("dtype", f"{v['dtype']!r}: expected a fixed-size numeric dtype")
    dims = v["dims"]
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise fail("dims", f"expected a list of positive integers, got {dims!r}")
    pattern = v["pattern"].upper()
    bad = [c for c in pattern if c not in PATTERN_LETTERS]
    if bad:
        raise fail(
            "pattern",
            f"{v['pattern']!r}: letter {bad[0]!r} is not one of {', '.join(PATTERN_LETTERS)} "
            "(B = block-distributed, * = whole on every rank)",
        )
    if len(pattern) != len(dims):
        raise fail(
            "pattern",
            f"{v['pattern']!r} has {len(pattern)} letters but dims {dims} has {len(dims)} "
            "dimensions: one letter per dimension",
        )
    if v["frequency"] < 1:
        raise fail("frequency", f"must be at least 1, got {v['frequency']}")
    if v["mode"] not in MODES:
        raise fail("mode", f"{v['mode']!r} is not one of {', '.join(MODES)}")
    return DatasetSpec(
        v["name"], dtype, tuple(dims), pattern, v["frequency"], v["mode"], v.get("tier")
    )
