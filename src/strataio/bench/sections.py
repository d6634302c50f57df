"""``strataio bench sections``: APRIL's sub-filing experiment (Tables 2 and 3, §6.1), scaled.

APRIL stores a 50000 x 50000 float array on HPSS either as one file ("naive") or as sub-files
of 1000 x 1000 or 2000 x 2000 elements, and times eight section reads and writes (patterns
A-H). This benchmark keeps the geometry and scales it by ``size / 50000``: the default 8000 x
8000 float32 array (256 MB) with 160 x 160 and 320 x 320 chunks, every pattern coordinate
scaled the same way and rounded to an integer.

Geometry: the paper's coordinates are ``(x, y)`` with ``x`` running along a row. Its own text
fixes this: pattern G, ``(0,0)-(1000,4000)``, needs 4000 I/O calls in the naive case, so it
spans 4000 rows; E, ``(0,0)-(50000,80)``, is a single call, so it is 80 whole rows; F,
``(0,0)-(80,50000)``, is the worst naive case, one call per row for every row. Pattern
``(x0,y0)-(x1,y1)`` is therefore numpy's ``a[y0:y1, x0:x1]`` on the row-major array: scaled, E
is 13 full-width rows (one contiguous piece) and F all 8000 rows by 13 columns.

Every contender (see :mod:`strataio.bench.contenders`) stores the same random data. Each
pattern is checked once against the numpy oracle, for reads and writes, outside the timings.
Three cache modes (:data:`CACHES`), each timed call a user's step:

- ``warm`` (the defaults): every cache as the process has it: after an untimed call of the
  same kind, the page cache holds the files and each contender's own cache (strataio's
  decoded-chunk cache at its setting, TensorStore's cache pool in ``tensorstore-cached``)
  what that call left there;
- ``first`` (a process's first read of data written before): the page cache warm (an untimed
  call first), but every contender's own in-process caches emptied before each timed call
  (:meth:`~strataio.bench.contenders.Contender.forget`), as a process opening the array
  anew finds them (a tiered dataset keeps what its catalog records: the checks of copies
  an earlier read made; ``strataio-tiered-written`` shows it with copies no read checked);
- ``cold``: nothing in memory: the own caches emptied and every file of the contender
  evicted from the page cache before each timed call.

With ``reopen`` (``--reopen``) every timed call is a user's open → section → close: each
contender opens the array for the call and closes it after (a file descriptor, a dataset of
strataio or of its Session, an h5py file, a zarr-python array, a TensorStore in a new
context), so the rows count what opening costs each store, its metadata and, for a tiered
dataset, its catalog (``strataio-tiered-written``, whose first reads need a handle kept
open, is left out). A write's close is the store's own: a tiered dataset's commits its
catalog rows and syncs its chunks there.

The reported time is the median of ``repeat`` calls. The chunked contenders' calls are
interleaved, one call of each per round (:func:`measure_round_robin`): this machine's speed
drifts by tens of percent within a minute, and a ratio of two medians taken a few seconds
apart would measure the drift. §6.1's adaptive run adds a chunk shaped
like pattern E (13 x 8000) for pattern E.
The same run measures numpy's memcpy bandwidth (``np.copyto`` of the whole array into an
existing array, best of 3) and reports strataio's warm read of pattern C as a fraction of it,
like for like: ``read_section(..., out=buf)`` into an existing array, in the steady state of
repeated reads of data at rest (after ``sync`` and untimed reads for twice
:data:`~strataio.arrays.chunk_cache.SETTLE_NS`), against a memcpy measured right after those
reads, since this machine's speed drifts within a run. (The table's reads allocate their
result, for every contender; a fresh multi-megabyte result costs a page fault per 4 KiB.)

Caches: h5py's chunk cache and ``tensorstore``'s cache pool are off (their defaults for
TensorStore); strataio runs with its decoded-chunk cache at the process's setting (64 MiB by
default, ``chunk_cache`` / ``--chunk-cache`` to change it, 0 to turn it off), and
``tensorstore-cached`` with a cache pool of the same number of bytes.
"""

from __future__ import annotations

import functools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from strataio.arrays.chunk_cache import SETTLE_NS, chunk_cache
from strataio.bench.contenders import CONTENDERS, Contender, can_reopen, make_contender
from strataio.errors import StrataError
from strataio.layout.extents import section_extents

PAPER_SIZE = 50000
PAPER_CHUNKS = (1000, 2000)
#: Table 2: start and end coordinates, (x, y) with x along a row
PAPER_PATTERNS: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "A": ((0, 0), (1000, 1000)),
    "B": ((0, 0), (4000, 1000)),
    "C": ((0, 0), (24000, 1000)),
    "D": ((5000, 5000), (6000, 6000)),
    "E": ((0, 0), (50000, 80)),
    "F": ((0, 0), (80, 50000)),
    "G": ((0, 0), (1000, 4000)),
    "H": ((6000, 6000), (8000, 8000)),
}
#: Table 3: gain (%) of sub-filing over the naive file, (small chunk, large chunk)
PAPER_GAINS: dict[tuple[str, str], tuple[float, float]] = {
    ("A", "write"): (96.1, 94.5),
    ("A", "read"): (85.2, 77.1),
    ("B", "write"): (83.8, 84.9),
    ("B", "read"): (43.2, 55.6),
    ("C", "write"): (8.8, 37.9),
    ("C", "read"): (-240.5, -172.4),
    ("D", "write"): (96.7, 95.4),
    ("D", "read"): (84.1, 79.7),
    ("E", "write"): (-3525.1, -2437.6),
    ("E", "read"): (-3229.3, -2623.9),
    ("F", "write"): (96.0, 97.2),
    ("F", "read"): (85.9, 88.5),
    ("G", "write"): (95.9, 96.4),
    ("G", "read"): (88.3, 88.6),
    ("H", "write"): (91.2, 96.5),
    ("H", "read"): (76.6, 89.9),
}
#: §6.1: gain (%) with chunks shaped like pattern E
PAPER_ADAPTIVE_GAINS = {"write": 1.85, "read": -0.61}

OPS = ("read", "write")
#: cache modes, in table order (module doc)
CACHES = ("warm", "first", "cold")
#: what each cache mode means, for tables and summaries
CACHE_MEANING = {
    "warm": "defaults: every cache as the process has it, after an untimed call",
    "first": "a process's first read: each store's own caches emptied before every call, as "
    "a process opening the array anew finds them, page cache warm",
    "cold": "nothing in memory: own caches emptied and files evicted from the page cache",
}
#: the cache states of ``--collective`` (its chunk cache is off: ``first`` is ``warm`` there)
COLLECTIVE_CACHES = ("cold", "warm")


def _scale(v: int, size: int) -> int:
    return int(np.floor(v * size / PAPER_SIZE + 0.5))


def scaled_patterns(size: int) -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
    """Patterns A-H on a ``size`` x ``size`` array as numpy ``(start, stop)`` = ``((y0, x0),
    (y1, x1))``; every box keeps at least one element along each axis."""
    out = {}
    for name, ((x0, y0), (x1, y1)) in PAPER_PATTERNS.items():
        a = (min(_scale(y0, size), size - 1), min(_scale(x0, size), size - 1))
        b = tuple(min(max(_scale(v, size), s + 1), size) for v, s in zip((y1, x1), a))
        out[name] = (a, b)
    return out


def scaled_chunks(size: int) -> tuple[int, ...]:
    """APRIL's small and large chunk sides scaled to ``size``."""
    return tuple(max(1, _scale(c, size)) for c in PAPER_CHUNKS)


@dataclass
class SectionsConfig:
    """What to run. ``chunks`` of None means APRIL's chunk sides scaled to ``size``."""

    size: int = 8000
    chunks: tuple[int, ...] | None = None
    patterns: str = "ABCDEFGH"
    repeat: int = 3
    ops: tuple[str, ...] = OPS
    caches: tuple[str, ...] = CACHES
    contenders: tuple[str, ...] = CONTENDERS
    adaptive: bool = True
    workdir: Path | None = None
    seed: int = 0
    #: bytes of strataio's decoded-chunk cache during the run; None keeps the process's setting
    chunk_cache: int | None = None
    #: every timed call opens the array and closes it after (see the module doc)
    reopen: bool = False

    def validate(self) -> None:
        if self.size < 2:
            raise StrataError(f"array side {self.size} is too small (at least 2)")
        if self.repeat < 1:
            raise StrataError("repeat must be at least 1")
        bad = set(self.patterns) - set(PAPER_PATTERNS)
        if bad or not self.patterns:
            raise StrataError(f"unknown patterns {sorted(bad)}: choose from ABCDEFGH")
        for what, got, known in (
            ("operation", self.ops, OPS),
            ("cache state", self.caches, CACHES),
            ("contender", self.contenders, CONTENDERS),
        ):
            unknown = [x for x in got if x not in known]
            if unknown or not got:
                raise StrataError(f"unknown {what} {unknown}: choose from {', '.join(known)}")
        if "naive" not in self.contenders:
            raise StrataError("the naive contender is the baseline and cannot be left out")
        if any(c < 1 for c in self.chunk_sides):
            raise StrataError(f"chunk sides must be positive, got {self.chunk_sides}")
        if larger := [c for c in self.chunk_sides if c > self.size]:
            # (h5py refuses such a chunk, after the data is made; one chunk of the whole
            # array, a side of --size, is the largest there is)
            raise StrataError(
                f"chunk side {larger[0]} is larger than the array side {self.size}: give chunk "
                f"sides up to {self.size}"
            )
        if self.chunk_cache is not None and self.chunk_cache < 0:
            raise StrataError(f"chunk cache size {self.chunk_cache} is negative")

    @property
    def chunk_sides(self) -> tuple[int, ...]:
        return tuple(self.chunks) if self.chunks else scaled_chunks(self.size)


@dataclass
class Pass:
    """One chunk shape and the patterns run with it."""

    label: str
    chunks: tuple[int, int]
    patterns: list[str]
    paper_column: int | None = None  # 0/1: which Table 3 column it reproduces
    results: list[dict[str, Any]] = field(default_factory=list)
    c_read_into: list[float] = field(default_factory=list)  # strataio warm C into a buffer
    c_memcpy: float = 0.0  # memcpy bytes/s measured next to c_read_into


def plan_passes(cfg: SectionsConfig) -> list[Pass]:
    pats = list(cfg.patterns)
    default = cfg.chunks is None
    passes = [
        Pass(f"{c}x{c}", (c, c), pats, i if default and i < 2 else None)
        for i, c in enumerate(cfg.chunk_sides)
    ]
    if cfg.adaptive and "E" in pats:
        (y0, _), (y1, _) = scaled_patterns(cfg.size)["E"]
        passes.append(Pass(f"adaptive {y1 - y0}x{cfg.size}", (y1 - y0, cfg.size), ["E"]))
    return passes


def memcpy_bandwidth(data: np.ndarray, repeat: int = 3) -> float:
    """Bytes per second numpy copies ``data`` into another array (best of ``repeat``)."""
    dst = np.empty_like(data)
    np.copyto(dst, data)  # fault the pages in
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(dst, data)
        best = min(best, time.perf_counter() - t0)
    return data.nbytes / best


def _check(c: Contender, start: Sequence[int], stop: Sequence[int], want: np.ndarray) -> None:
    got = np.asarray(c.read(start, stop))
    if got.shape != want.shape or not np.array_equal(got, want):
        raise StrataError(f"{c.name} returned wrong data for section {tuple(start)}-{tuple(stop)}")


def verify(c: Contender, start: Sequence[int], stop: Sequence[int], data: np.ndarray) -> None:
    """Check ``c`` against the numpy oracle: read, write other values and read them back,
    then restore the original values."""
    box = tuple(slice(a, b) for a, b in zip(start, stop))
    want = np.ascontiguousarray(data[box])
    _check(c, start, stop, want)
    c.write(start, -want - 1)
    _check(c, start, stop, -want - 1)
    c.write(start, want)
    _check(c, start, stop, want)


def measure(
    c: Contender,
    op: str,
    cache: str,
    start: Sequence[int],
    stop: Sequence[int],
    payload: np.ndarray,
    repeat: int,
    *,
    reopen: bool = False,
) -> list[float]:
    """Seconds of ``repeat`` calls of ``op`` on the box in cache mode ``cache``: ``warm``
    after an untimed call; ``first`` after an untimed call, with ``c``'s own caches emptied
    before each call; ``cold`` with those emptied and every file of ``c`` evicted. With
    ``reopen``, each call opens the array and closes it after."""
    return measure_round_robin([c], op, cache, start, stop, payload, repeat, reopen=reopen)[c.name]


def measure_round_robin(
    contenders: Sequence[Contender],
    op: str,
    cache: str,
    start: Sequence[int],
    stop: Sequence[int],
    payload: np.ndarray,
    repeat: int,
    *,
    reopen: bool = False,
) -> dict[str, list[float]]:
    """:func:`measure` for several contenders at once, their calls interleaved: each round
    times one call of every contender, starting one further along the list each round, so
    that a drift of the machine's speed during the measurement falls on all of them alike.

    Each timed call follows an untimed call of the same contender (then its caches are
    emptied or its files evicted, as the mode says): what one store leaves running when
    its call returns (a peer's threads finishing up) delays the calls right after it by
    tens of microseconds on a small machine, and in a fixed rotation it would always fall
    on the same next contender. A user's loop of calls meets only its own store's."""
    calls: dict[str, Callable[[], Any]] = {}
    for c in contenders:
        if op == "read":
            call = functools.partial(c.read, start, stop)
        else:
            call = functools.partial(c.write, start, payload)
        calls[c.name] = (
            functools.partial(c.reopened, call, "r" if op == "read" else "r+") if reopen else call
        )
    times: dict[str, list[float]] = {c.name: [] for c in contenders}
    n = len(contenders)
    if reopen:
        for c in contenders:
            c.release_handle()
    try:
        if cache != "cold":
            for c in contenders:
                calls[c.name]()
        for r in range(repeat):
            for c in (contenders[(r + j) % n] for j in range(n)):
                if n > 1:
                    calls[c.name]()  # (untimed: settles what the contender before left running)
                if cache == "first":
                    c.forget()
                elif cache == "cold":
                    c.drop_cache()
                t0 = time.perf_counter()
                calls[c.name]()
                times[c.name].append(time.perf_counter() - t0)
    finally:
        if reopen:  # (the handle each contender holds between measurements, as after setup)
            for c in contenders:
                c.open_handle("r+")
    return times


def count_steps(cfg: SectionsConfig, passes: list[Pass]) -> int:
    """Progress steps :func:`run_sections` reports: setups, checks and measurements."""
    chunked = [c for c in cfg.contenders if c != "naive" and (can_reopen(c) or not cfg.reopen)]
    n = 1 + len(cfg.ops) * len(cfg.caches) * len(set(p for ps in passes for p in ps.patterns))
    for ps in passes:
        n += len(chunked) * (1 + len(ps.patterns) * (1 + len(cfg.ops) * len(cfg.caches)))
        n += len(ps.patterns)  # the naive check
    return n


def run_sections(cfg: SectionsConfig, step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the benchmark; ``step(description)`` is called after each unit of work."""
    cfg.validate()
    advance = step or (lambda _d: None)
    passes = plan_passes(cfg)
    patterns = scaled_patterns(cfg.size)
    rng = np.random.default_rng(cfg.seed)
    data = rng.random((cfg.size, cfg.size), dtype=np.float32)
    memcpy = memcpy_bandwidth(data)

    parent = Path(cfg.workdir) if cfg.workdir else Path.cwd()
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".strataio-bench-", dir=parent))
    naive_times: dict[tuple[str, str, str], list[float]] = {}
    pattern_info: dict[str, dict[str, Any]] = {}
    naive = make_contender("naive", work / "naive", (cfg.size, cfg.size))
    cache = chunk_cache()
    saved_capacity = cache.capacity
    if cfg.chunk_cache is not None:
        cache.resize(cfg.chunk_cache)
    chunk_cache_bytes = cache.capacity
    try:
        naive.setup(data)
        advance("setup naive")
        for ps in passes:
            _run_pass(
                cfg, ps, data, patterns, naive, naive_times, pattern_info, work,
                chunk_cache_bytes, advance,
            )  # fmt: skip
    finally:
        cache.resize(saved_capacity)
        naive.close()
        shutil.rmtree(work, ignore_errors=True)

    c_reads = []
    for ps in passes:
        if ps.c_read_into:
            bw = pattern_info["C"]["nbytes"] / statistics.median(ps.c_read_into)
            # against the memcpy measured next to these reads: the machine's speed drifts
            c_reads.append(
                {
                    "pass": ps.label,
                    "chunks": list(ps.chunks),
                    "bytes_per_s": bw,
                    "fraction_of_memcpy": bw / ps.c_memcpy,
                    "memcpy_bytes_per_s": ps.c_memcpy,
                    "samples": ps.c_read_into,
                }
            )
    cfg_json = asdict(cfg)
    cfg_json["workdir"] = str(cfg.workdir) if cfg.workdir else None
    cfg_json["chunks"] = list(cfg.chunk_sides)
    return {
        "benchmark": "sections",
        "config": cfg_json,
        "array": {"shape": [cfg.size, cfg.size], "dtype": "float32", "nbytes": data.nbytes},
        "geometry": "paper (x0,y0)-(x1,y1) is numpy a[y0:y1, x0:x1], x along a row",
        "memcpy_bytes_per_s": memcpy,
        "chunk_cache_bytes": chunk_cache_bytes,
        "caches": {c: CACHE_MEANING[c] for c in cfg.caches},
        "patterns": pattern_info,
        "passes": [
            {
                "label": ps.label,
                "chunks": list(ps.chunks),
                "paper_column": ps.paper_column,
                "results": ps.results,
            }
            for ps in passes
        ],
        "pattern_c_warm_read": c_reads,
    }


def _run_pass(
    cfg: SectionsConfig,
    ps: Pass,
    data: np.ndarray,
    patterns: dict[str, tuple[tuple[int, int], tuple[int, int]]],
    naive: Contender,
    naive_times: dict[tuple[str, str, str], list[float]],
    pattern_info: dict[str, dict[str, Any]],
    work: Path,
    cache_bytes: int,
    advance: Callable[[str], None],
) -> None:
    chunked: list[Contender] = []
    try:
        for name in cfg.contenders:
            if name == "naive":
                continue
            if cfg.reopen and not can_reopen(name):
                continue
            root = work / f"{name}-{ps.chunks[0]}x{ps.chunks[1]}"
            c = make_contender(name, root, ps.chunks, cache_bytes)
            chunked.append(c)
            c.setup(data)
            advance(f"{ps.label}: setup {name}")
        for pat in ps.patterns:
            start, stop = patterns[pat]
            box = tuple(slice(a, b) for a, b in zip(start, stop))
            payload = np.ascontiguousarray(data[box])
            if pat not in pattern_info:
                (x0, y0), (x1, y1) = PAPER_PATTERNS[pat]
                pattern_info[pat] = {
                    "paper_xy": [[x0, y0], [x1, y1]],
                    "start": list(start),
                    "stop": list(stop),
                    "nbytes": int(payload.nbytes),
                    "naive_calls": len(section_extents(data.shape, 4, start, stop)),
                }
            touched = int(
                np.prod([(b - 1) // k - a // k + 1 for a, b, k in zip(start, stop, ps.chunks)])
            )
            for c in [naive, *chunked]:
                verify(c, start, stop, data)
                advance(f"{ps.label} {pat}: checked {c.name}")
            # The check rewrote the pattern's chunks: let them come to rest before the timed
            # calls (a chunk's version is trusted by the decoded-chunk cache only once it is
            # SETTLE_NS old), else which contender's warm rows find them cacheable depends on
            # the order the checks ran in.
            time.sleep(2 * SETTLE_NS / 1e9)
            for op in cfg.ops:
                for cache in cfg.caches:
                    key = (pat, op, cache)
                    if key not in naive_times:
                        naive_times[key] = measure(
                            naive, op, cache, start, stop, payload, cfg.repeat, reopen=cfg.reopen
                        )
                        advance(f"{ps.label} {pat} {op} {cache}: naive")
                    base = statistics.median(naive_times[key])
                    ps.results.append(_row(pat, op, cache, "naive", naive_times[key], base, None))
                    got = measure_round_robin(
                        chunked, op, cache, start, stop, payload, cfg.repeat, reopen=cfg.reopen
                    )
                    for c in chunked:
                        ps.results.append(_row(pat, op, cache, c.name, got[c.name], base, touched))
                        advance(f"{ps.label} {pat} {op} {cache}: {c.name}")
            if pat == "C":
                ps.c_read_into = _read_into_times(chunked, start, stop, max(cfg.repeat, 20))
                ps.c_memcpy = memcpy_bandwidth(data)
    finally:
        for c in chunked:
            c.close()


def _read_into_times(
    chunked: list[Contender], start: Sequence[int], stop: Sequence[int], repeat: int
) -> list[float]:
    """Warm reads of strataio's section into one existing array (as memcpy writes into one)."""
    ds = next((getattr(c, "ds", None) for c in chunked if c.name == "strataio"), None)
    if ds is None:
        return []
    buf = np.empty([b - a for a, b in zip(start, stop)], dtype=ds.dtype)
    # Warm steady state of data at rest: the benchmark's own writes flushed (their writeback
    # would compete for the cores and memory), then untimed reads until the chunks written
    # moments ago have settled (they are not cached before), then the timed ones.
    os.sync()
    settle = time.perf_counter() + 2 * SETTLE_NS / 1e9
    while time.perf_counter() < settle:
        ds.read_section(start, stop, out=buf)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        ds.read_section(start, stop, out=buf)
        times.append(time.perf_counter() - t0)
    return times


def _row(
    pat: str, op: str, cache: str, name: str, times: list[float], base: float, touched: int | None
) -> dict[str, Any]:
    t = statistics.median(times)
    return {
        "pattern": pat,
        "op": op,
        "cache": cache,
        "contender": name,
        "seconds": t,
        "samples": times,
        "gain_pct": (base - t) / base * 100.0 if base > 0 else 0.0,
        "chunks_touched": touched,
    }


# --------------------------------------------------------------------------- before / after
def _row_key(label: str, r: dict[str, Any]) -> tuple[str, str, str, str, str]:
    return (label, r["pattern"], r["op"], r["cache"], r["contender"])


def check_baseline(baseline: Any) -> None:
    """Raise :class:`StrataError` unless ``baseline`` is the JSON of a sections run."""
    if not (
        isinstance(baseline, dict)
        and baseline.get("benchmark") == "sections"
        and isinstance(baseline.get("passes"), list)
    ):
        raise StrataError("not the --json output of a `strataio bench sections` run")


def compare_with_baseline(result: dict[str, Any], baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """Every row of ``result`` next to the row of an earlier run's ``baseline`` with the same
    pass, pattern, operation, cache mode and contender: ``before`` and ``after`` (median
    seconds, None where that run has no such row) and ``ratio`` = after / before (None unless
    both ran). Rows only the earlier run has come last, per pass, with ``after`` None."""
    check_baseline(baseline)
    before = {
        _row_key(ps["label"], r): r["seconds"] for ps in baseline["passes"] for r in ps["results"]
    }
    rows: list[dict[str, Any]] = []
    seen = set()
    labels = [ps["label"] for ps in result["passes"]]
    labels += [ps["label"] for ps in baseline["passes"] if ps["label"] not in labels]
    after_passes = {ps["label"]: ps["results"] for ps in result["passes"]}
    for label in labels:
        for r in after_passes.get(label, []):
            key = _row_key(label, r)
            seen.add(key)
            old = before.get(key)
            rows.append(_compared(key, old, r["seconds"]))
        rows.extend(
            _compared(k, t, None) for k, t in before.items() if k[0] == label and k not in seen
        )
    return rows


def _compared(
    key: tuple[str, str, str, str, str], before: float | None, after: float | None
) -> dict[str, Any]:
    label, pat, op, cache, name = key
    ratio = after / before if after is not None and before else None
    return {
        "pass": label, "pattern": pat, "op": op, "cache": cache, "contender": name,
        "before": before, "after": after, "ratio": ratio,
    }  # fmt: skip


# --------------------------------------------------------------------------- collective
#: APRIL's patterns whose regions the collective run splits into sub-columns by default: D
#: (one small chunk's worth), G (tall and thin) and H (square), where sub-columns share chunks
COLLECTIVE_PATTERNS = "DGH"
COLLECTIVE_MODES = ("independent", "collective")


@dataclass
class CollectiveSectionsConfig:
    """``bench sections --collective``: ``ranks`` ranks read ``ranks`` sub-columns (equal
    column ranges, side by side) of each pattern's region, once each rank on its own
    (``ds[...]``) and once together (``ds.read_all``). ``chunks`` of None means APRIL's chunk
    sides scaled to ``size``; the checksummed default codec, so every chunk is read whole."""

    size: int = 8000
    chunks: tuple[int, ...] | None = None
    patterns: str = COLLECTIVE_PATTERNS
    repeat: int = 5
    ranks: int = 4
    caches: tuple[str, ...] = COLLECTIVE_CACHES
    workdir: Path | None = None
    seed: int = 0

    def validate(self) -> None:
        SectionsConfig(
            size=self.size, chunks=self.chunks, patterns=self.patterns, repeat=self.repeat,
            caches=self.caches, contenders=("naive",),
        ).validate()  # fmt: skip
        unknown = [c for c in self.caches if c not in COLLECTIVE_CACHES]
        if unknown:
            raise StrataError(
                f"unknown cache state {unknown} for the collective run: choose from "
                f"{', '.join(COLLECTIVE_CACHES)}"
            )
        if self.ranks < 1:
            raise StrataError(f"ranks must be at least 1, got {self.ranks}")
        for pat in self.patterns:
            (_, x0), (_, x1) = scaled_patterns(self.size)[pat]
            if x1 - x0 < self.ranks:
                raise StrataError(
                    f"pattern {pat} is {x1 - x0} columns wide: too narrow for {self.ranks} "
                    "sub-columns"
                )

    @property
    def chunk_sides(self) -> tuple[int, ...]:
        return tuple(self.chunks) if self.chunks else scaled_chunks(self.size)

    def args(self) -> list[str]:
        """The worker's command line (see :func:`collective_main`)."""
        return [
            "--collective-worker", str(self.size), ",".join(map(str, self.chunk_sides)),
            self.patterns, str(self.repeat), ",".join(self.caches),
            str(self.workdir or Path.cwd()), str(self.seed),
        ]  # fmt: skip


def sub_columns(
    start: Sequence[int], stop: Sequence[int], nprocs: int
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The region ``[start, stop)`` cut into ``nprocs`` sub-columns of (nearly) equal width."""
    (y0, x0), (y1, x1) = start, stop
    cuts = np.linspace(x0, x1, nprocs + 1).round().astype(int).tolist()
    return [((y0, a), (y1, b)) for a, b in zip(cuts[:-1], cuts[1:])]


def run_collective_rank(cfg: CollectiveSectionsConfig, comm: Any) -> list[dict[str, Any]] | None:
    """One rank's part of the collective run (every rank calls it); rank 0 returns the rows:
    per chunk shape, pattern, cache state and mode, the chunks read from storage by all ranks
    together and the median over ``repeat`` calls of the slowest rank's time."""
    from mpi4py import MPI

    import strataio
    from strataio.arrays.dataset import Dataset
    from strataio.arrays.store import CountingChunkStore
    from strataio.bench.contenders import CacheDropper

    rank, nprocs = comm.Get_rank(), comm.Get_size()
    size = cfg.size
    rng = np.random.default_rng(cfg.seed)
    data = rng.random((size, size), dtype=np.float32)  # the same on every rank
    parent = Path(cfg.workdir) if cfg.workdir else Path.cwd()
    work = Path(
        comm.bcast(tempfile.mkdtemp(prefix=".strataio-bench-", dir=parent) if rank == 0 else None)
    )
    # every call reads storage: the decoded-chunk cache would serve repeated reads
    cache = chunk_cache()
    saved = cache.capacity
    cache.resize(0)
    dropper = CacheDropper()
    rows: list[dict[str, Any]] = []
    try:
        for side in cfg.chunk_sides:
            path = work / f"{side}x{side}"
            ds = strataio.create_dataset(path, data.shape, data.dtype, (side, side), comm=comm)
            band = sub_columns((0, 0), (size, size), nprocs)[rank]  # write in column bands
            ds.write_all(np.s_[:, band[0][1] : band[1][1]], data[:, band[0][1] : band[1][1]])
            ds.flush()
            files = [str(p) for p in (path / "c").rglob("*") if p.is_file()] if rank == 0 else []
            counted = Dataset(CountingChunkStore(ds.store), ds.meta, "r", name=str(path), comm=comm)
            for pat in cfg.patterns:
                start, stop = scaled_patterns(size)[pat]
                (y0, x0), (y1, x1) = sub_columns(start, stop, nprocs)[rank]
                sel = np.s_[y0:y1, x0:x1]
                want = data[sel]
                for mode in COLLECTIVE_MODES:
                    ok = np.array_equal(_read_section(counted, mode, sel), want)
                    if not comm.allreduce(ok, op=MPI.LAND):
                        raise StrataError(f"{mode} read of pattern {pat} returned wrong data")
                for cache_state in cfg.caches:
                    for mode in COLLECTIVE_MODES:
                        times, reads = [], []
                        for _ in range(cfg.repeat):
                            if cache_state == "cold" and rank == 0:
                                dropper.drop(files)
                            counted.store.reads = 0
                            comm.Barrier()
                            t0 = time.perf_counter()
                            _read_section(counted, mode, sel)
                            t = time.perf_counter() - t0
                            times.append(comm.allreduce(t, op=MPI.MAX))
                            reads.append(comm.allreduce(counted.store.reads))
                        rows.append(
                            {
                                "chunks": [side, side], "pattern": pat, "cache": cache_state,
                                "mode": mode, "ranks": nprocs,
                                "region": [list(start), list(stop)],
                                "chunks_read": int(np.median(reads)),
                                "seconds": statistics.median(times), "samples": times,
                            }
                        )  # fmt: skip
            ds.close()
    finally:
        cache.resize(saved)
        comm.Barrier()
        if rank == 0:
            shutil.rmtree(work, ignore_errors=True)
    return rows if rank == 0 else None


def _read_section(ds: Any, mode: str, sel: Any) -> np.ndarray:
    """Rank's ``sel`` of ``ds``: on its own (``independent``) or with the others."""
    return ds[sel] if mode == "independent" else ds.read_all(sel)


def collective_main(argv: list[str]) -> int:
    """``python -m strataio.bench.sections --collective-worker SIZE CHUNKS PATTERNS REPEAT
    CACHES WORKDIR SEED`` on every rank; rank 0 prints the rows as one JSON line."""
    import json

    from mpi4py import MPI

    size, chunks, patterns, repeat, caches, workdir, seed = argv
    cfg = CollectiveSectionsConfig(
        size=int(size), chunks=tuple(int(c) for c in chunks.split(",")), patterns=patterns,
        repeat=int(repeat), ranks=MPI.COMM_WORLD.Get_size(), caches=tuple(caches.split(",")),
        workdir=Path(workdir), seed=int(seed),
    )  # fmt: skip
    cfg.validate()
    rows = run_collective_rank(cfg, MPI.COMM_WORLD)
    if rows is not None:
        print(json.dumps(rows), flush=True)
    return 0


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["--collective-worker"]:
        raise SystemExit("usage: python -m strataio.bench.sections --collective-worker ...")
    raise SystemExit(collective_main(sys.argv[2:]))
