"""Dataset: an N-D array stored as chunks ("sub-files"), with numpy-style section I/O.

A read walks the section's chunk cover (APRIL's "cover"), fetches the chunks from the store
in parallel threads, decodes them, and copies each chunk's sub-box into the caller's array
with one numpy assignment. Uncompressed chunks are read partially: only the byte span of the
chunk that the section touches. A write encodes whole chunks and replaces them atomically;
chunks the section covers only in part are read, modified and written back.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import operator
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from strataio.agreed import agree, same_on_every_rank
from strataio.arrays.chunk_cache import CachedChunk, chunk_cache, settled
from strataio.arrays.codecs import CodecPipeline
from strataio.arrays.metadata import ArrayMetadata, json_attrs
from strataio.arrays.sharding import (
    SHARD_READ_TRIES,
    ShardCodec,
    VersionedShardReads,
    chunk_codec,
)
from strataio.arrays.store import BackendChunkStore, ChunkStore
from strataio.arrays.values import to_dtype
from strataio.errors import (
    ArgumentError,
    BackendError,
    ChunkChangedError,
    ClosedError,
    CodecError,
    DtypeMismatchError,
    MetadataError,
    ReadOnlyError,
    SelectionError,
    ShapeMismatchError,
    StrataError,
)
from strataio.layout.chunks import ChunkGrid, chunk_key
from strataio.layout.memo import LayoutMemo
from strataio.layout.pieces import scratch
from strataio.layout.sections import Section
from strataio.storage.base import BytesLike

_MODES = ("r", "r+")
#: sections whose chunk plans are remembered (for every dataset of the process together),
#: and the most chunks a remembered plan has
_PLAN_MEMO = 128
_PLAN_MEMO_CHUNKS = 256
#: chunks below which a section is handled on the calling thread
_PARALLEL_MIN_CHUNKS = 4
#: threads of the chunk pool (I/O bound: more than the cores)
_POOL_WORKERS = min(16, 4 * (os.cpu_count() or 1))
_pool: ThreadPoolExecutor | None = None
#: bytes of encoded chunks a write hands at once to a store that overlaps its puts itself
_PUT_BATCH_BYTES = 64 << 20
#: bytes of plain (raw or checksummed) chunks such a write encodes on the calling thread
_INLINE_ENCODE_BYTES = 4 << 20
#: bytes of chunk spans a plain read has the store fetch in the background before it reads
#: the first of them (bounds the page cache a huge cold section claims ahead of its copies)
_FETCH_AHEAD_BYTES = 32 << 20
#: bytes of chunks a plain read asks of the store in one call (one buffer for all of them)
_BATCH_BYTES = 4 << 20


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_POOL_WORKERS, thread_name_prefix="strataio-chunk")
    return _pool


def _run_groups(n: int, work: Callable[[int, int], None]) -> None:
    """Run ``work(lo, hi)`` over ``range(n)`` cut into contiguous groups, one per thread."""
    if n < _PARALLEL_MIN_CHUNKS:
        work(0, n)
        return
    _wait_groups(_start_groups(n, work))


def _start_groups(n: int, work: Callable[[int, int], None]) -> list[Future[None]]:
    """Start ``work(lo, hi)`` over ``range(n)`` cut into contiguous groups on the chunk
    threads; :func:`_wait_groups` waits for them."""
    if not n:
        return []
    pool = _executor()
    groups = min(n, _POOL_WORKERS)
    bounds = np.linspace(0, n, groups + 1).astype(int).tolist()
    return [pool.submit(work, a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _wait_groups(futures: list[Future[None]]) -> None:
    """Wait for every group, then raise the first group's error, if any."""
    errors = [f.exception() for f in futures]
    for exc in errors:
        if exc is not None:
            raise exc


@dataclass(slots=True)
class _Plan:
    """A section's chunk cover: per chunk its key, its cover row (see ChunkCover.rows), its box
    in the caller's array and in the chunk, and the byte span of the chunk the box touches."""

    keys: list[str]
    rows: list[tuple[tuple[int, ...], ...]]
    dst: list[tuple[Any, ...]]
    src: list[tuple[slice, ...]]  # () for the whole chunk
    spans: list[tuple[int, int]]


#: plans of sections, keyed by geometry and corners (see Dataset._plan)
_plans: LayoutMemo[_Plan] = LayoutMemo(_PLAN_MEMO)


class Attributes(MutableMapping[str, Any]):
    """The array's user attributes; setting one rewrites ``zarr.json`` (needs mode ``r+``)."""

    def __init__(self, ds: Dataset) -> None:
        self._ds = ds

    def __getitem__(self, key: str) -> Any:
        return self._ds.meta.attrs[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._ds._check_writable()
        plain = json_attrs({key: value})[key]  # (checked here, whatever the others hold)
        self._ds._update_attrs(lambda attrs: attrs.__setitem__(key, plain))

    def __delitem__(self, key: str) -> None:
        self._ds._check_writable()
        self._ds._update_attrs(lambda attrs: attrs.__delitem__(key))

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self._ds.meta.attrs))

    def __len__(self) -> int:
        return len(self._ds.meta.attrs)

    def __repr__(self) -> str:
        return repr(self._ds.meta.attrs)


class Dataset:
    """A chunked N-D array over a :class:`ChunkStore`.

    ``ds[index]`` and ``ds[index] = value`` take numpy basic indices (integers, slices of step
    1, Ellipsis); :meth:`read_section` / :meth:`write_section` take corners. Reads of chunks
    never written return ``fill_value``.

    ``comm`` (an mpi4py communicator, every rank holding this dataset open) enables the
    collective calls :meth:`read_all` and :meth:`write_all`; the other calls stay
    independent (per rank), as MPI-IO's independent calls are.
    """

    def __init__(
        self,
        store: ChunkStore,
        meta: ArrayMetadata,
        mode: str = "r",
        *,
        name: str = "",
        comm: Any = None,
    ) -> None:
        if mode not in _MODES:
            raise ArgumentError(f"mode must be one of {_MODES}, got {mode!r}")
        if not isinstance(store, ChunkStore):
            raise ArgumentError(
                f"a Dataset's store must be a ChunkStore, not {type(store).__name__}"
            )
        self.store = store
        self.meta = meta
        self.mode = mode
        self.name = name
        self.comm = comm
        self.grid = ChunkGrid(meta.shape, meta.chunks)
        self.codecs = chunk_codec(meta.codecs, meta.dtype, meta.chunks, meta.fill_value)
        self._closed = False
        caps = store.capabilities
        self._span_reader = store.read_span if caps.partial_reads else None
        self._versioned_span_reader = (
            store.read_span_versioned if caps.partial_reads and caps.versions else None
        )
        self._versions = store.chunk_versions if caps.chunk_cache else None
        self._cache_space: tuple[Any, ...] | None = (
            (store.cache_space, meta.dtype.str, meta.chunks, self.codecs.describe())
            if caps.chunk_cache
            else None
        )
        itemsize = meta.dtype.itemsize
        # (a plan depends on the grid, the key encoding and the item size only: datasets
        # of one geometry share theirs, so a dataset opened anew plans nothing seen before)
        self._geometry = (len(meta.shape), *meta.shape, *meta.chunks, itemsize, meta.separator)
        self._chunk_strides = tuple(
            math.prod(meta.chunks[d + 1 :]) * itemsize for d in range(len(meta.chunks))
        )

    # ----------------------------------------------------------------- properties
    @property
    def shape(self) -> tuple[int, ...]:
        return self.meta.shape

    @property
    def dtype(self) -> np.dtype:
        return self.meta.dtype

    @property
    def chunks(self) -> tuple[int, ...]:
        return self.meta.chunks

    @property
    def inner_chunks(self) -> tuple[int, ...] | None:
        """The inner chunk shape of a sharded dataset (its :attr:`chunks` are the shards),
        None for a dataset without shards."""
        codecs = self.codecs
        return codecs.inner_shape if isinstance(codecs, ShardCodec) else None

    @property
    def ndim(self) -> int:
        return len(self.meta.shape)

    @property
    def size(self) -> int:
        return math.prod(self.meta.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def fill_value(self) -> Any:
        return self.meta.fill_value

    @property
    def dims(self) -> tuple[str | None, ...] | None:
        """The dimension names (Zarr v3 ``dimension_names``), None when the array has none."""
        names = self.meta.dimension_names
        return None if names is None else tuple(names)

    @property
    def nchunks(self) -> int:
        return self.grid.nchunks

    @property
    def attrs(self) -> Attributes:
        return Attributes(self)

    @property
    def readonly(self) -> bool:
        return self.mode == "r"

    def chunk_key(self, coords: Sequence[int]) -> str:
        return self.meta.chunk_key(coords)

    def __repr__(self) -> str:
        where = f" {self.name!r}" if self.name else ""
        return (
            f"<strataio.Dataset{where} shape={self.shape} dtype={self.dtype} "
            f"chunks={self.chunks} codecs={self.codecs.names} mode={self.mode!r}>"
        )

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d dataset")
        return self.shape[0]

    def __iter__(self) -> Iterator[np.ndarray | Any]:
        """``self[0]``, ``self[1]``, ... as numpy iterates; a 0-d dataset raises TypeError."""
        if not self.shape:
            raise TypeError("iteration over a 0-d dataset")
        for i in range(self.shape[0]):
            yield self[i]

    # ----------------------------------------------------------------- numpy-style access
    def __getitem__(self, index: Any) -> np.ndarray | Any:
        section = self._section(Section.from_index, index)
        out = np.empty(section.shape, dtype=self.dtype)
        self._read_into(section, out)
        return _numpy_result(out.reshape(section.result_shape), index)

    def __setitem__(self, index: Any, value: Any) -> None:
        self._check_writable()
        section = self._section(Section.from_index, index)
        data = self._coerce(value, section.result_shape, section.shape)
        self._write_from(section, data)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """The whole dataset, read into a new array; ``copy=False`` (no copy: numpy 2's
        ``np.asarray(ds, copy=False)``) raises :class:`ArgumentError`, a ``ValueError``, as
        numpy asks: a dataset's values are only ever read into a copy."""
        if copy is False:
            raise ArgumentError(
                f"{self._what()}: cannot be seen as an array without a copy (copy=False): "
                "its values are on storage; read them with ds[...] or np.asarray(ds)"
            )
        arr = self[...]
        return arr if dtype is None else arr.astype(dtype)

    def read_section(
        self, start: Sequence[int], stop: Sequence[int], out: np.ndarray | None = None
    ) -> np.ndarray:
        """The box ``[start, stop)`` as an array; into ``out`` (same shape, dtype) if given."""
        section = self._section(Section.from_bounds, start, stop)
        if out is None:
            out = np.empty(section.shape, dtype=self.dtype)
        else:
            what = self._what()
            if not isinstance(out, np.ndarray):
                raise ShapeMismatchError(f"{what}: out must be a numpy array")
            if out.shape != section.shape:
                raise ShapeMismatchError(
                    f"{what}: out has shape {out.shape} but section {section} has shape "
                    f"{section.shape}"
                )
            if out.dtype != self.dtype:
                raise DtypeMismatchError(
                    f"{what}: out has dtype {out.dtype}, the dataset {self.dtype}"
                )
            if not out.flags.writeable:
                raise ShapeMismatchError(f"{what}: out is read-only")
        self._read_into(section, out)
        return out

    def write_section(self, start: Sequence[int], data: Any) -> None:
        """Write ``data`` (an array of the dataset's rank) with its corner at ``start``."""
        self._check_writable()
        arr = np.asanyarray(data)  # (a masked array stays one: _coerce refuses its mask)
        if arr.ndim != self.ndim:
            raise ShapeMismatchError(
                f"{self._what()}: data has {arr.ndim} dimensions, the dataset {self.ndim}; "
                "write_section takes an array of the dataset's rank"
            )
        try:
            corner = tuple(operator.index(a) for a in start)
        except TypeError:
            raise SelectionError(
                f"{self._what()}: start {start!r} is no sequence of integers"
            ) from None
        if len(corner) != arr.ndim:
            raise SelectionError(
                f"{self._what()}: start {corner} has {len(corner)} dimensions, data {arr.ndim}"
            )
        stop = [a + n for a, n in zip(corner, arr.shape)]
        section = self._section(Section.from_bounds, corner, stop)
        # (``data`` as given: a list of ints numpy made float64 is checked as its ints)
        self._write_from(section, self._coerce(data, section.shape, section.shape))

    # ----------------------------------------------------------------- collective access
    def read_all(self, selection: Any) -> np.ndarray | Any | None:
        """Collective read: every rank of :attr:`comm` calls it with its own ``selection`` (a
        basic index as for ``ds[...]``, or None for nothing) and gets that section, as
        ``ds[selection]`` would return it (None for None).

        A chunk wanted by one rank is read by it; a chunk wanted by several is read and
        decoded once, by one of them, which sends the others their pieces in one
        ``Alltoallv`` (:mod:`strataio.arrays.collective`). A bad selection or a failed read
        on any rank raises on every rank. Without a communicator, ``ds[selection]``.
        """
        if self.comm is None:
            return None if selection is None else self[selection]
        from strataio.arrays.collective import read_sections
        from strataio.arrays.collective_shards import read_shards

        section: Section | None = None
        err: BaseException | None = None
        try:
            self._check_open()
            if selection is not None:
                section = self._section(Section.from_index, selection)
        except Exception as exc:  # any failure here must reach the other ranks
            err = exc
        read = read_shards if isinstance(self.codecs, ShardCodec) else read_sections
        out = read(self, self.comm, section, err)
        if section is None:
            return None
        return _numpy_result(out.reshape(section.result_shape), selection)

    def write_all(
        self, selection: Any, data: Any = None, *, hints: Mapping[str, Any] | None = None
    ) -> None:
        """Collective write: every rank of :attr:`comm` calls it with its own ``selection``
        (a basic index as for ``ds[...] = data``, or None for nothing to write) and ``data``
        (None or an empty array with a None selection: data with values raises
        :class:`ArgumentError` rather than being dropped).

        The pieces of a chunk written by several ranks are gathered to one of them, which
        writes the chunk once (reading it first only where the pieces leave part of it
        uncovered): no read-modify-write race, no lost update. Where sections overlap, the
        highest rank's value wins. Errors (a bad selection, data of the wrong shape or
        dtype, a read-only dataset) on any rank raise on every rank before any byte is
        written; a failed chunk write raises on every rank afterwards. Without a
        communicator, ``ds[selection] = data``.

        A sharded dataset is written as the module :mod:`strataio.arrays.collective_shards`
        says: each rank compresses its inner chunks and writes them into the shard files at
        offsets from a prefix sum; ``hints`` (the same on every rank) tune it:
        ``strataio_shard_alignment`` (bytes, default 4096), ``strataio_pipeline_groups``
        (pipelined groups, default 1) and the storage driver's ``strataio_driver*`` hints.
        """
        if self.comm is None:
            if selection is not None:
                self[selection] = data
            else:
                self._no_data_without_selection(data)
            return
        from strataio.arrays.collective import write_sections
        from strataio.arrays.collective_shards import ShardWriteOptions, write_shards

        section: Section | None = None
        arr: np.ndarray | None = None
        err: BaseException | None = None
        options = ShardWriteOptions()
        try:
            self._check_writable()
            self._check_encodable()
            options = ShardWriteOptions.parse(hints)
            if selection is not None:
                section = self._section(Section.from_index, selection)
                if data is None:
                    of = f" of {self.name!r}" if self.name else ""
                    raise ArgumentError(
                        f"write_all{of}: a selection ({selection!r}) with no data; a rank with "
                        "nothing to write passes None for both"
                    )
                arr = self._coerce(data, section.result_shape, section.shape)
            else:
                self._no_data_without_selection(data)
        except Exception as exc:  # any failure here must reach the other ranks
            err = exc
        try:
            if isinstance(self.codecs, ShardCodec):
                write_shards(self, self.comm, section, arr, err, options)
            else:
                write_sections(self, self.comm, section, arr, err)
        except Exception:
            # (raised on every rank) the chunks some owners stored before a failure keep
            # their new values: every rank must know them all the same
            self._share_writes()
            raise
        self._share_writes()

    def _no_data_without_selection(self, data: Any) -> None:
        """Raise :class:`ArgumentError` where :meth:`write_all` got no selection (None) with
        ``data`` that has values: they would be dropped. None or an empty array is nothing."""
        if data is None or np.size(data) == 0:
            return
        of = f" of {self.name!r}" if self.name else ""
        what = f"an array of shape {np.shape(data)}" if np.ndim(data) else "a scalar"
        raise ArgumentError(
            f"write_all{of}: data ({what}) with no selection (None), which writes nothing; "
            "pass the selection to write, or None (or an empty array) as data for nothing"
        )

    def _share_writes(self) -> None:
        """After :meth:`write_all` (collective): make every rank's chunk writes known to every
        rank. Chunks of a plain dataset are files every rank sees; a store that keeps its own
        record of them overrides this."""

    # ----------------------------------------------------------------- chunk access
    def read_chunks(
        self, coords: np.ndarray, lo: np.ndarray, hi: np.ndarray, out: np.ndarray, at: np.ndarray
    ) -> None:
        """Read, for each ``i``, the box ``[lo[i], hi[i])`` (chunk-local element coordinates)
        of chunk ``coords[i]`` into ``out`` at corner ``at[i]`` (all ``(n, ndim)``). Chunks
        never written read as ``fill_value``; checksums are verified as for any read."""
        self._check_open()
        n = len(coords)
        if n == 0:
            return
        sep = self.meta.separator
        itemsize = self.dtype.itemsize
        strides = np.asarray(self._chunk_strides, dtype=np.int64)
        full = np.asarray(self.chunks, dtype=np.int64)
        whole = np.all((lo == 0) & (hi == full), axis=1).tolist()
        span_lo = (lo * strides).sum(axis=1).tolist()
        span_hi = ((hi - 1) * strides).sum(axis=1) + itemsize
        lo_, hi_, at_ = lo.tolist(), hi.tolist(), at.tolist()
        plan = _Plan([], [], [], [], [])
        for i, c in enumerate(coords.tolist()):
            plan.keys.append(chunk_key(c, sep))
            dst = tuple(slice(a, a + b - x) for a, x, b in zip(at_[i], lo_[i], hi_[i]))
            plan.dst.append(dst or (Ellipsis,))
            plan.src.append(() if whole[i] else tuple(map(slice, lo_[i], hi_[i])))
            plan.spans.append((span_lo[i], int(span_hi[i])))
        self._read_plan(plan, out)

    def write_chunks(
        self,
        keys: Sequence[str],
        need_old: Sequence[bool],
        make: Callable[[int, np.ndarray | None], np.ndarray],
    ) -> None:
        """Replace chunks ``keys``: chunk ``i`` is ``make(i, None)`` (a whole chunk-shaped
        array) where ``need_old[i]`` is false, else ``make(i, old)`` with ``old`` the
        chunk's current values (``fill_value`` if never written) in a writable array that
        ``make`` updates and returns. ``make`` is called from several threads, on distinct
        ``i``."""
        self._check_writable()
        self._check_encodable()
        codecs = self.codecs

        def encoded(lo: int, hi: int) -> list[tuple[str, BytesLike]]:
            need = [keys[i] for i in range(lo, hi) if need_old[i]]
            old = dict(zip(need, self._old_chunks(need))) if need else {}
            items = []
            for i in range(lo, hi):
                if keys[i] not in old:
                    chunk = make(i, None)
                else:
                    blob = old[keys[i]]
                    if blob is None:
                        base = np.full(self.chunks, self.fill_value, dtype=self.dtype)
                    else:
                        base = self._decode(keys[i], blob)
                        if not base.flags.writeable:
                            base = base.copy()
                    chunk = make(i, base)
                items.append((keys[i], codecs.encode(chunk)))
            return items

        def forget(lo: int, hi: int) -> None:
            if self._cache_space is not None:
                chunk_cache().discard(self._cache_space, keys[lo:hi])

        if not self.store.capabilities.overlapped_puts:

            def work(lo: int, hi: int) -> None:
                self.store.put_chunks(encoded(lo, hi))
                forget(lo, hi)

            _run_groups(len(keys), work)
            return
        # The store overlaps a call's puts itself and pays a fixed cost per call (a catalog
        # transaction): chunks are encoded on the chunk threads and handed over in batches.
        per_batch = max(1, _PUT_BATCH_BYTES // max(1, self.nbytes // max(1, self.nchunks)))
        for first in range(0, len(keys), per_batch):
            last = min(len(keys), first + per_batch)
            parts: dict[int, list[tuple[str, BytesLike]]] = {}

            def encode(lo: int, hi: int, first: int = first, parts: dict = parts) -> None:
                parts[lo] = encoded(first + lo, first + hi)

            if codecs.is_plain and (last - first) * codecs.stored_nbytes <= _INLINE_ENCODE_BYTES:
                encode(0, last - first)  # a copy per chunk: less than a hand-off to threads
            else:
                _run_groups(last - first, encode)
            self.store.put_chunks([item for lo in sorted(parts) for item in parts[lo]])
            forget(first, last)

    # ----------------------------------------------------------------- lifecycle
    def flush(self) -> None:
        """Make every write so far durable (fsync / completed PUT)."""
        if not self._closed and not self.readonly:
            self.store.flush()

    def close(self) -> None:
        """Make every write durable and release the store. In a parallel job this is
        collective: the store's close, which flushes (:meth:`ChunkStore.close`), says on
        every rank what it could not store (an independent flush first would say rank 0's
        own on rank 0 alone)."""
        if not self._closed:
            try:
                if self.comm is None:
                    self.flush()
            finally:
                self._closed = True
                self.store.close()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def clear_cache(self) -> None:
        """Drop this dataset's chunks from the process's decoded-chunk cache
        (:func:`strataio.arrays.chunk_cache.chunk_cache`)."""
        if self._cache_space is not None:
            chunk_cache().discard(self._cache_space)

    def nchunks_stored(self) -> int:
        """Chunks written to storage so far (the rest read as ``fill_value``)."""
        return len(self.store.list_chunks())

    # ----------------------------------------------------------------- internals
    def _what(self) -> str:
        """How messages name this dataset."""
        return f"dataset {self.name!r}" if self.name else "the dataset"

    def _section(self, make: Callable[..., Section], *args: Any) -> Section:
        """``make(*args, shape)``, its errors naming this dataset."""
        try:
            return make(*args, self.shape)
        except SelectionError as exc:
            raise type(exc)(f"{self._what()}: {exc}") from None

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self!r} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.readonly:
            raise ReadOnlyError(
                f"dataset {self.name or ''} is open read-only (mode 'r')".replace("  ", " ")
            )

    def _check_encodable(self) -> None:
        """Raise :class:`CodecError` where the codecs cannot encode any chunk (a
        ``zarr.json`` made elsewhere configures one beyond its spec): every write, even one of
        chunks or inner chunks left unstored as the fill value, is refused before any byte
        is written."""
        problem = self.codecs.encode_problem
        if problem:
            raise CodecError(f"{self._what()}: cannot write: {problem}")

    def _update_attrs(self, change: Callable[[dict[str, Any]], None]) -> None:
        """Apply ``change`` to the attributes as ``zarr.json`` holds them now (another handle
        may have set some since this one read them) and write it, as one step against the
        attribute changes of other handles, in this process or another, where the store
        makes it one (:meth:`ChunkStore.update_meta`). Raises :class:`MetadataError` where
        the array itself changed since this handle opened it (replaced with ``overwrite``,
        say): its metadata written back would make the new array's chunks unreadable.
        ``change`` sets plain JSON values (:func:`json_attrs`); those already there are kept
        as they are."""
        applied: list[dict[str, Any]] = []

        def apply(raw: bytes | None) -> bytes:
            attrs = dict(self.meta.attrs)
            self._check_stored_meta(raw)
            if raw is not None:
                now = ArrayMetadata.from_json(raw, where=f"zarr.json of {self._what()}")
                if _without_attrs(now) != _without_attrs(self.meta):
                    raise MetadataError(
                        f"{self._what()}: its zarr.json changed since this handle opened it "
                        "(the array was replaced or changed); open it again to set attributes"
                    )
                attrs = dict(now.attrs)
            # (the attributes zarr.json holds are kept as they are: another writer's NaN,
            # which zarr-python writes bare, included)
            change(attrs)
            applied[:] = [attrs]
            return dataclasses.replace(self.meta, attrs=applied[0]).to_json()

        self.store.update_meta(apply)
        self.meta.attrs = applied[0]

    def _check_stored_meta(self, raw: bytes | None) -> None:
        """Raise where ``raw``, the ``zarr.json`` stored now (None: none is), is no base for
        an attribute change; here None is one: this handle's attributes are the base."""

    def _coerce(self, value: Any, given_shape: tuple[int, ...], box: tuple[int, ...]) -> np.ndarray:
        """``value`` as an array of the dataset's dtype and the box's shape, or a clear error."""
        arr = to_dtype(value, self.dtype, self._what())
        extra = arr.ndim - len(given_shape)
        if extra > 0 and all(n == 1 for n in arr.shape[:extra]):
            arr = arr.reshape(arr.shape[extra:])  # (leading axes of one element: as numpy)
        try:
            arr = np.broadcast_to(arr, given_shape)
        except ValueError:
            raise ShapeMismatchError(
                f"{self._what()}: data of shape {arr.shape} does not fit the selection of "
                f"shape {given_shape}"
            ) from None
        return arr.reshape(box) if given_shape != box else arr

    def _plan(self, section: Section) -> _Plan:
        """The cover of ``section``: per chunk its key, boxes and byte span. Plans of up to
        :data:`_PLAN_MEMO_CHUNKS` chunks are memoized for every dataset of one geometry
        (applications read the same sections again and again, often through a dataset
        opened for the read, and for small sections planning costs as much as the copies);
        a plan is never changed once made."""
        nchunks = 1
        for a, b, c in zip(section.start, section.stop, self.chunks):
            nchunks *= (b - 1) // c - a // c + 1
        if nchunks > _PLAN_MEMO_CHUNKS:
            return self._make_plan(section)
        return _plans.get(
            (), (*self._geometry, *section.start, *section.stop), lambda: self._make_plan(section)
        )

    def _make_plan(self, section: Section) -> _Plan:
        sep = self.meta.separator
        strides = self._chunk_strides
        itemsize = self.dtype.itemsize
        chunk_shape = self.chunks
        plan = _Plan([], [], [], [], [])
        for row in self.grid.cover(section).rows():
            coords, ls, le, os_, oe = row
            plan.keys.append(chunk_key(coords, sep))
            plan.rows.append(row)
            # a 0-d array's box must index with Ellipsis to give a view, not a scalar
            plan.dst.append(tuple(map(slice, os_, oe)) or (Ellipsis,))
            whole = all(a == 0 and b == n for a, b, n in zip(ls, le, chunk_shape))
            plan.src.append(() if whole else tuple(map(slice, ls, le)))
            lo = sum(a * k for a, k in zip(ls, strides))
            plan.spans.append((lo, sum((b - 1) * k for b, k in zip(le, strides)) + itemsize))
        return plan

    def _read_into(self, section: Section, out: np.ndarray) -> None:
        self._check_open()
        if section.is_empty:
            return
        self._read_plan(self._plan(section), out)

    def _read_plan(self, plan: _Plan, out: np.ndarray) -> None:
        """Read every chunk box of ``plan`` into its place in ``out``."""
        keys, dst, src = plan.keys, plan.dst, plan.src
        codecs = self.codecs
        fill = self.fill_value
        space = self._cache_space

        def place(i: int, chunk: np.ndarray | None) -> None:
            # numpy swaps the byte order of a non-native stored chunk while copying
            out[dst[i]] = fill if chunk is None else chunk[src[i]]

        # Versions are taken before any read: a chunk replaced after its stat is then cached
        # under its older version, which the next read sees as stale.
        cache = chunk_cache() if space is not None else None
        versions = None
        seen = 0
        fill_cache = False  # cache what is read under the version each read saw
        if cache is not None and cache.enabled:
            seen = time.time_ns()
            if (
                codecs.is_plain
                and self._versioned_span_reader is not None
                and not cache.holds_any(space, keys)
            ):
                fill_cache = True
            else:
                versions = self._versions(keys)
        if versions is not None:
            entries = cache.lookup(space, keys, versions)
        else:  # no cache, or a store that keeps no versions (memory, S3)
            entries = [None] * len(keys)

        def cacheable(i: int) -> bool:
            v = versions[i] if versions is not None else None
            return v is not None and settled(v, seen)

        if codecs.is_plain and self._span_reader is not None:
            self._read_plain(plan, out, entries, versions, seen, fill_cache)
            return

        todo = []
        for i, e in enumerate(entries):
            if e is not None:  # a compressed chunk is cached whole
                place(i, e.chunk)
            else:
                todo.append(i)

        if isinstance(codecs, ShardCodec) and self._span_reader is not None:
            # a shard is read in part: its index, then only the inner chunks the box touches
            def shard_boxes(a: int, b: int) -> None:
                for i in todo[a:b]:
                    box = self._read_shard_box(keys[i], src[i])
                    out[dst[i]] = fill if box is None else box

            _run_groups(len(todo), shard_boxes)
            return

        def work(a: int, b: int) -> None:
            idx = todo[a:b]
            names = [keys[i] for i in idx]
            if versions is None:
                got = [(blob, False) for blob in self.store.get_chunks(names)]
            else:  # (bytes a tiered store's failover read elsewhere are not cached)
                got = self.store.get_chunks_as(names, [versions[i] for i in idx])
            for i, (blob, as_versioned) in zip(idx, got):
                chunk = None if blob is None else self._decode(keys[i], blob)
                place(i, chunk)
                if chunk is not None and as_versioned and cacheable(i):
                    cache.store(space, keys[i], CachedChunk(versions[i], chunk, 0, chunk.nbytes))

        _run_groups(len(todo), work)

    def _read_plain(
        self,
        plan: _Plan,
        out: np.ndarray,
        entries: list[CachedChunk | None],
        versions: list[Any] | None,
        seen: int,
        fill_cache: bool = False,
    ) -> None:
        """Read the plain chunks of ``plan`` (see :attr:`CodecPipeline.is_plain`) into ``out``.

        Chunks in the decoded-chunk cache or the page cache are copied on this thread (a
        thread hand-off costs more than the copy), those the cache lacks asked of the store
        in batches (:meth:`ChunkStore.read_spans_versioned`: one call for many small chunks).
        The store says which of them are on their way (``BlockingIOError`` with errno
        EINPROGRESS: a POSIX file's pages asked for in the background): those are read here
        too, after the requests of all of them have gone out, at most
        :data:`_FETCH_AHEAD_BYTES` ahead; only chunks that would wait with nothing started
        (slow storage, a copy to check whole) go to the I/O threads.

        A raw chunk is read only from a box's first to its last element (a thin section reads
        a fraction of each chunk); a checksummed one is read whole and checked in place.
        Chunks are cached under ``versions`` (taken before any read: a chunk replaced after
        its stat is cached under its older version, which the next read sees as stale), or
        with ``fill_cache`` under the version of the very object each read read from.
        """
        keys, dst, src, spans = plan.keys, plan.dst, plan.src, plan.spans
        codecs = self.codecs
        total = codecs.stored_nbytes
        raw = codecs.is_raw
        fill_value = self.fill_value
        space = self._cache_space
        cache = chunk_cache()
        store = self.store

        def span(i: int) -> tuple[int, int]:
            return spans[i] if raw else (0, total)

        def prepare(i: int) -> tuple[np.ndarray | None, bool]:
            """A buffer of its own for chunk ``i`` (None: a spare one will do), and whether
            the cache keeps the chunk: a chunk to keep is read into a buffer of its own (a
            buffer the cache holds is never written: another thread may be copying from
            it)."""
            if fill_cache:
                return None, False  # (kept or not once the read gives the version)
            v = versions[i] if versions is not None else None
            # (a chunk cached for another span of it is kept again at once)
            kept = (
                v is not None
                and settled(v, seen)
                and (entries[i] is not None or cache.remembers(space, keys[i], v))
            )
            return (np.empty(total, dtype=np.uint8) if kept else None), kept

        def finish(i: int, chunk: np.ndarray | None, kept: bool, v: Any) -> None:
            """Place chunk ``i`` (None: never written), read as version ``v``."""
            if fill_cache:
                kept = (
                    chunk is not None
                    and v is not None
                    and settled(v, seen)
                    and cache.admit(space, keys[i], v)
                )
                if kept:  # (the spare buffer is read into again)
                    chunk = chunk.copy()
            else:
                read_as, v = v, versions[i] if versions is not None else None
                if v is not None and read_as != v:
                    # the bytes came from another copy than the one versioned before the
                    # read (a tiered store's failover), or the chunk changed since: not
                    # cached under that version
                    v, kept = None, False
                if not kept and chunk is not None and v is not None and settled(v, seen):
                    cache.admit(space, keys[i], v)  # (a read done, not one attempted)
            out[dst[i]] = fill_value if chunk is None else chunk[src[i]]
            if kept and chunk is not None:
                # (a checksummed chunk was read and checked whole)
                lo, hi = spans[i] if raw else (0, codecs.chunk_nbytes)
                cache.store(space, keys[i], CachedChunk(v, chunk, lo, hi))

        def read_one(i: int) -> None:
            """Chunk ``i`` read on this thread, waiting for it."""
            buf, kept = prepare(i)
            if buf is None:
                buf = scratch(total, "chunk")
            lo, hi = span(i)
            (got,) = store.read_spans_versioned([keys[i]], [lo], [memoryview(buf)[lo:hi]])
            if isinstance(got, BaseException):
                raise got
            size, v = got
            finish(i, None if size is None else self._plain_chunk(keys[i], buf, size), kept, v)

        blocked: list[int] = []
        coming: deque[int] = deque()  # chunks whose bytes the store is fetching
        ahead = 0
        todo = []
        for i, e in enumerate(entries):
            lo, hi = spans[i]
            if e is not None and e.lo <= lo and hi <= e.hi:
                out[dst[i]] = e.chunk[src[i]]
            else:
                todo.append(i)
        group = max(1, _BATCH_BYTES // total)
        for first in range(0, len(todo), group):
            part = todo[first : first + group]
            # one spare buffer for the batch, and (raw chunks) every chunk array over it
            spares = scratch(total * len(part), "chunks")
            spare_view = memoryview(spares)
            arrays = (
                spares.view(codecs.stored_dtype).reshape((len(part), *self.chunks)) if raw else None
            )
            bufs, offsets, views, keeps = [], [], [], []
            for j, i in enumerate(part):
                buf, kept = prepare(i)
                lo, hi = span(i)
                bufs.append(buf)
                keeps.append(kept)
                offsets.append(lo)
                at = j * total
                views.append(
                    spare_view[at + lo : at + hi] if buf is None else memoryview(buf)[lo:hi]
                )
            got = store.read_spans_versioned([keys[i] for i in part], offsets, views, nowait=True)
            for j, (i, buf, kept, r) in enumerate(zip(part, bufs, keeps, got)):
                if isinstance(r, BlockingIOError):
                    if r.errno != errno.EINPROGRESS:
                        blocked.append(i)
                        continue
                    # (counted whole: a checksummed chunk, or a tiered copy's first read, is
                    # fetched whole however little of it the section wants)
                    coming.append(i)
                    ahead += total
                    while ahead > _FETCH_AHEAD_BYTES:
                        read_one(coming.popleft())
                        ahead -= total
                    continue
                size, v = r
                if size is None:
                    chunk = None
                elif arrays is not None and buf is None and size == total:
                    chunk = arrays[j]
                else:
                    spare = spares[j * total : (j + 1) * total]
                    chunk = self._plain_chunk(keys[i], spare if buf is None else buf, size)
                finish(i, chunk, kept, v)

        def fetch(a: int, b: int) -> None:
            for i in blocked[a:b]:
                read_one(i)

        if not coming:
            _run_groups(len(blocked), fetch)
            return
        waiting = _start_groups(len(blocked), fetch)
        try:
            for i in coming:
                read_one(i)
        except BaseException:
            for f in waiting:  # (their errors must not hide this one)
                f.exception()
            raise
        _wait_groups(waiting)

    def _plain_chunk(self, key: str, buf: np.ndarray, size: int) -> np.ndarray:
        """Plain chunk ``key`` (see :attr:`CodecPipeline.is_plain`) read into ``buf`` (its
        stored object is ``size`` bytes) as a chunk-shaped array of the stored dtype over
        ``buf``; a checksummed one is checked there, with no copy. A stored object of
        another size than a plain chunk's raises :meth:`CodecPipeline.size_error`: a
        :class:`ChecksumError` where the chunk is checksummed (what a read of the whole object
        would find), a :class:`CodecError` where it is raw."""
        codecs = self.codecs
        total = codecs.stored_nbytes
        if size != total:
            assert isinstance(codecs, CodecPipeline)  # (a plain chunk's pipeline)
            raise codecs.size_error(
                f"chunk {key!r} of {self._what()} holds {size} bytes, expected {total}: "
                "the chunk is truncated or not this array's"
            )
        if not codecs.is_raw:
            try:
                codecs.verify(buf)
            except CodecError as exc:
                raise type(exc)(f"{self._what()}, chunk {key!r}: {exc}") from None
        return buf[: codecs.chunk_nbytes].view(codecs.stored_dtype).reshape(self.chunks)

    def _read_shard_box(self, key: str, box: tuple[slice, ...]) -> np.ndarray | None:
        """The box (slices, ``()`` for all) of shard ``key``, None when never written."""
        codecs = self.codecs
        assert isinstance(codecs, ShardCodec)
        lo = [s.start for s in box] if box else [0] * self.ndim
        hi = [s.stop for s in box] if box else list(self.chunks)

        versioned = self._versioned_span_reader
        if versioned is None:

            def read(offset: int, buf: memoryview) -> int | None:
                return self._span_reader(key, offset, buf)

            try:
                return codecs.read_box(read, lo, hi)
            except CodecError as exc:
                raise type(exc)(f"{self._what()}, shard {key!r}: {exc}") from None
        # The index and the inner chunks are separate reads: a shard another process
        # replaced between them gives them from two versions (offsets of one, bytes of the
        # other), so the box is read again until every read came from one version.
        for _ in range(SHARD_READ_TRIES):
            reads = VersionedShardReads(versioned, key)
            try:
                box = codecs.read_box(reads, lo, hi)
            except CodecError as exc:
                if reads.replaced:
                    continue
                raise type(exc)(f"{self._what()}, shard {key!r}: {exc}") from None
            if not reads.replaced:
                return box
        raise ChunkChangedError(
            f"{self._what()}, shard {key!r}: replaced by another writer while it was read, "
            f"{SHARD_READ_TRIES} times; nothing is damaged: read it again"
        )

    def _decode(self, key: str, blob: BytesLike) -> np.ndarray:
        """The chunk array of stored bytes; decode errors name the dataset and the chunk."""
        try:
            return self.codecs.decode(blob)
        except CodecError as exc:
            unit = "shard" if isinstance(self.codecs, ShardCodec) else "chunk"
            raise type(exc)(f"{self._what()}, {unit} {key!r}: {exc}") from None

    def _old_chunks(self, keys: Sequence[str]) -> list[BytesLike | None]:
        """The stored bytes of chunks ``keys`` that a write is to update (None: never
        written), as :meth:`ChunkStore.get_chunks` gives them. Plain chunks are read whole
        in one batch of span reads where the store has them (a tiered store then reads a
        copy checked before in range: the chunks a write updates again and again are those
        it put itself); a chunk whose size is not a plain chunk's is read again through
        ``get_chunks``, which says what is wrong with it."""
        codecs = self.codecs
        if not (codecs.is_plain and self._span_reader is not None):
            return self.store.get_chunks(keys)
        size = codecs.stored_nbytes
        bufs = [np.empty(size, dtype=np.uint8) for _ in keys]
        got = self.store.read_spans_versioned(keys, [0] * len(keys), [memoryview(b) for b in bufs])
        out: list[BytesLike | None] = []
        odd: list[int] = []
        for i, r in enumerate(got):
            if isinstance(r, BaseException) or (r[0] is not None and r[0] != size):
                odd.append(i)
            out.append(None if not isinstance(r, BaseException) and r[0] is None else bufs[i])
        if odd:
            for i, blob in zip(odd, self.store.get_chunks([keys[i] for i in odd])):
                out[i] = blob
        return out

    def _write_from(self, section: Section, data: np.ndarray) -> None:
        self._check_writable()
        if section.is_empty:
            return
        plan = self._plan(section)
        rows = plan.rows
        chunk_shape = self.chunks
        shape = self.shape

        def partial(row: tuple[tuple[int, ...], ...]) -> bool:
            # not (the box is the entire chunk, and the chunk lies entirely inside the array)
            c, ls, le = row[0], row[1], row[2]
            return not all(
                a == 0 and b == k and (x + 1) * k <= n
                for a, b, k, x, n in zip(ls, le, chunk_shape, c, shape)
            )

        def make(i: int, old: np.ndarray | None) -> np.ndarray:
            _, ls, le, os_, oe = rows[i]
            src = data[tuple(map(slice, os_, oe))]
            if old is None:
                return src
            old[tuple(map(slice, ls, le))] = src
            return old

        self.write_chunks(plan.keys, [partial(r) for r in rows], make)


# --------------------------------------------------------------------------- path helpers
#: the codec :func:`create_dataset` uses unless told: raw bytes followed by their CRC-32C, so
#: that a flipped bit on storage is an error rather than a wrong value (see README, Quickstart)
DEFAULT_CODEC = "crc32c"


#: the ``zarr.json`` of a Zarr v3 group without attributes
GROUP_META = b'{"zarr_format": 3, "node_type": "group", "attributes": {}}'


def _posix_store(path: str | os.PathLike[str], create: bool) -> BackendChunkStore:
    from strataio.storage.posix import PosixBackend

    try:
        backend = PosixBackend(path, create=create)
    except StrataError:
        raise
    except OSError as exc:
        raise BackendError(
            f"cannot {'create' if create else 'open'} a dataset at {os.fspath(path)}: "
            f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
        ) from exc
    return BackendChunkStore(backend, name=os.fspath(path))


def create_dataset(
    path: str | os.PathLike[str],
    shape: Sequence[int] | int,
    dtype: Any,
    chunks: Sequence[int] | int | None = None,
    *,
    codec: Any = DEFAULT_CODEC,
    fill_value: Any = 0,
    attrs: dict[str, Any] | None = None,
    dims: Sequence[str | None] | None = None,
    shards: Sequence[int] | int | None = None,
    overwrite: bool = False,
    comm: Any = None,
) -> Dataset:
    """Create a sub-filed array at ``path`` (a Zarr v3 array directory) and open it ``r+``.

    ``codec`` as in :func:`strataio.arrays.codecs.normalize_codecs` (``"crc32c"``, the
    default, checksums each chunk; ``None`` stores raw bytes unchecked; ``"zstd"``,
    ``"zstd+crc32c"``, ``"lz4"``, ...). ``dims`` names the dimensions (one str or None each;
    xarray needs them). ``shards`` (a multiple of ``chunks``) stores the array in Zarr v3
    shards of that shape, one object each, holding ``chunks``-shaped inner chunks encoded by
    ``codec`` and a checksummed index (as zarr-python's ``shards=``); the dataset's
    :attr:`~Dataset.chunks` are then the shards and :attr:`~Dataset.inner_chunks` the inner
    chunks. An existing array at ``path`` is an error unless ``overwrite``, which removes
    it (its metadata and every chunk) first. Every argument is checked before anything is
    written. A chunk, a shard and a shard's index hold at most
    :data:`~strataio.arrays.codecs.MAX_CHUNK_BYTES` (2 GiB less one byte; a chunk blosc
    compresses 16 bytes less): larger ones raise :class:`ArgumentError`.

    Folders this call creates above the array become Zarr v3 groups, as zarr-python makes
    them, so ``xarray.open_zarr(parent, consolidated=False)`` opens the arrays under
    ``parent``; a folder that already existed is left as it is.

    With ``comm`` (an mpi4py communicator) the call is collective: every rank passes the
    same arguments, rank 0 alone writes the metadata (and removes an old array), an error
    on any rank raises on every rank, and every rank returns the dataset open on ``comm``
    (see :meth:`Dataset.read_all`).
    """
    meta: ArrayMetadata | None = None
    err: BaseException | None = None
    try:
        # (validates everything, the codec pipeline included, before anything touches the disk)
        meta = ArrayMetadata.create(shape, dtype, chunks, codec, fill_value, attrs, dims, shards)
    except StrataError as exc:
        err = type(exc)(f"dataset {os.fspath(path)!r}: {exc}")
    agree(comm, err)
    assert meta is not None
    where = {"path": os.fspath(path), **meta.arguments(), "overwrite": overwrite}
    same_on_every_rank(comm, "create_dataset", where)
    store: BackendChunkStore | None = None
    if comm is None or comm.Get_rank() == 0:
        try:
            store = _create_store(path, meta, overwrite)
        except Exception as exc:  # any failure here must reach the other ranks
            err = exc
    agree(comm, err)
    if store is None:
        try:  # (a path this rank cannot reach, say)
            store = _posix_store(path, create=False)
        except Exception as exc:
            err = exc
    agree(comm, err)
    assert store is not None
    ds = Dataset(store, meta, "r+", name=os.fspath(path), comm=comm)
    ds.clear_cache()
    return ds


def _without_attrs(meta: ArrayMetadata) -> bytes:
    """``meta``'s ``zarr.json`` with no attributes: what two handles of one array share."""
    return dataclasses.replace(meta, attrs={}).to_json()


def _node_type(meta: bytes) -> str | None:
    """The ``node_type`` of a ``zarr.json`` (None where it cannot be read)."""
    try:
        return json.loads(meta).get("node_type")
    except (ValueError, AttributeError):
        return None


def _numpy_result(res: np.ndarray, index: Any) -> np.ndarray | Any:
    """``res``, what ``index`` selected, as numpy gives it: a scalar where integers alone
    selected one element, else an array (0-d where an Ellipsis selected one)."""
    if (
        res.ndim
        or index is Ellipsis
        or (isinstance(index, tuple) and any(i is Ellipsis for i in index))
    ):
        return res
    return res[()]


def _create_store(
    path: str | os.PathLike[str], meta: ArrayMetadata, overwrite: bool
) -> BackendChunkStore:
    """Make the array directory at ``path`` (and Zarr groups above it) holding ``meta``."""
    from strataio.errors import ExistsError

    new_parents = []
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):
        new_parents.append(parent)
        parent = os.path.dirname(parent)
    _refuse_array_above(path, parent)
    _refuse_nodes_below(path)
    store = _posix_store(path, create=True)
    for folder in new_parents:
        _posix_store(folder, create=True).put_meta(GROUP_META)
    old = store.get_meta()
    v2 = [n for n in (".zarray", ".zgroup") if os.path.exists(os.path.join(path, n))]
    if v2 and old is None:
        if not overwrite:
            kind = "array" if ".zarray" in v2 else "group"
            raise ExistsError(
                f"a Zarr v2 {kind} ({v2[0]}) already exists at {os.fspath(path)}; pass "
                "overwrite=True to replace it by this dataset"
            )
        shutil.rmtree(path)  # (its files, whatever their names: zarr-python's v2 layout)
        store = _posix_store(path, create=True)
    elif old is not None and _node_type(old) == "group":
        if not overwrite:
            raise ExistsError(
                f"a Zarr group already exists at {os.fspath(path)}; pass overwrite=True to "
                "replace it, and every array and group in it, by this dataset"
            )
        # (as zarr-python does: the whole node goes; an array left inside would be no Zarr)
        os.unlink(os.path.join(path, "zarr.json"))  # (first: an interruption leaves no group)
        shutil.rmtree(path)
        store = _posix_store(path, create=True)
    elif old is not None or store.holds_chunks():
        if not overwrite:
            what = "a dataset" if old is not None else "chunk data (no zarr.json)"
            raise ExistsError(f"{what} already exists at {os.fspath(path)}; pass overwrite=True")
        store.clear()
    store.put_meta(meta.to_json())
    return store


def _refuse_array_above(path: str | os.PathLike[str], folder: str) -> None:
    """Raise :class:`ArgumentError` where ``folder`` or a folder above it is a Zarr array:
    only groups hold arrays (zarr-python refuses the same), and an array made inside
    another one (in its chunk folder ``c``, say) is no Zarr node any reader finds."""
    while True:
        for name in ("zarr.json", ".zarray"):
            try:
                with open(os.path.join(folder, name), "rb") as fh:
                    raw = fh.read()
            except OSError:
                continue
            if name == ".zarray" or _node_type(raw) == "array":
                raise ArgumentError(
                    f"cannot create a dataset at {os.fspath(path)}: {folder} is a Zarr "
                    "array, and only groups (or plain folders) may hold arrays"
                )
        above = os.path.dirname(folder)
        if above == folder:
            return
        folder = above


def _refuse_nodes_below(path: str | os.PathLike[str]) -> None:
    """Raise :class:`ArgumentError` where ``path`` is a plain folder (no Zarr node of its
    own) that holds Zarr arrays or groups below it: an array made there would hide them from
    every reader, and ``overwrite`` removes Zarr nodes, never a plain folder's files."""
    top = os.path.abspath(path)  # ("" is the working directory, as for the store)
    names = ("zarr.json", ".zarray", ".zgroup")
    if not os.path.isdir(top) or any(os.path.lexists(os.path.join(top, n)) for n in names):
        return
    for folder, _, files in os.walk(top):
        found = next((n for n in names if n in files), None) if folder != top else None
        if found is not None:
            where = os.fspath(path) or top
            raise ArgumentError(
                f"cannot create a dataset at {where!r}: that folder holds Zarr nodes "
                f"({os.path.join(folder, found)}), which an array there would hide from every "
                "reader (only groups hold arrays); give the dataset a path of its own"
            )


def open_dataset(path: str | os.PathLike[str], mode: str = "r", *, comm: Any = None) -> Dataset:
    """Open the Zarr v3 array at ``path`` (written by strataio, zarr-python or TensorStore).

    With ``comm`` the call is collective: rank 0 reads the metadata and sends it to the
    others; an error on any rank raises on every rank."""
    from strataio.errors import NotFoundError

    raw: bytes | None = None
    err: BaseException | None = None
    same_on_every_rank(comm, "open_dataset", {"path": os.fspath(path), "mode": mode})
    if mode not in _MODES:
        err = ArgumentError(f"mode must be one of {_MODES}, got {mode!r}")
    elif comm is None or comm.Get_rank() == 0:
        try:
            if not os.path.isdir(path):
                why = "not a directory" if os.path.exists(path) else "no such file or directory"
                raise NotFoundError(f"no dataset at {os.fspath(path)}: {why}")
            raw = _posix_store(path, create=False).get_meta()
            if raw is None:
                raise NotFoundError(f"no dataset at {os.fspath(path)}: zarr.json is missing")
        except Exception as exc:  # any failure here must reach the other ranks
            err = exc
    agree(comm, err)
    if comm is not None and comm.Get_size() > 1:
        raw = comm.bcast(raw, root=0)
    meta: ArrayMetadata | None = None
    store: BackendChunkStore | None = None
    try:
        meta = ArrayMetadata.from_json(raw, where=os.path.join(os.fspath(path), "zarr.json"))
        store = _posix_store(path, create=False)
    except Exception as exc:  # any failure here must reach the other ranks
        err = exc
    agree(comm, err)
    assert meta is not None and store is not None
    return Dataset(store, meta, mode, name=os.fspath(path), comm=comm)
