"""Zarr v3 ``sharding_indexed``: many inner chunks stored in one object (a *shard*) with an
index of where each lies.

A shard holds the inner chunks of a ``shard_shape`` box of the array, each encoded by the inner
codec pipeline (:class:`~strataio.arrays.codecs.CodecPipeline`), in any order, and an *index*:
per inner chunk in C order two little-endian uint64, ``(offset, nbytes)`` of its encoded bytes
in the shard, both ``2**64 - 1`` for an inner chunk that is absent (it reads as the fill
value). The index is encoded by its own codecs (``bytes`` little-endian, usually followed by
``crc32c``) and stored at the shard's end (``index_location: end``, the default) or start.

For a Dataset a shard is the chunk: the array's chunk grid is the shard grid, a write encodes
whole shards, and a read decodes only the inner chunks its section touches, reading just
their bytes where the store reads parts of objects (:meth:`ShardCodec.read_box`). An inner
chunk equal to the fill value everywhere is not stored, as zarr-python and TensorStore do.

A corrupt index (bad checksum, entries pointing outside the shard, half-empty entries) or a
corrupt inner chunk raises :class:`~strataio.errors.CodecError` (or its subclass
:class:`~strataio.errors.ChecksumError`) naming the inner chunk; the Dataset adds its own name
and the shard's key. Where the index is checksummed, a shard of the wrong size for its index
(shorter than the index, or an index that passes its checksum yet places inner chunks beyond
the shard's bytes: a truncated shard, or another array's) raises
:class:`~strataio.errors.ChecksumError`, as a chunk of the wrong size does under ``crc32c``
(see :mod:`strataio.arrays.codecs`); without an index checksum, :class:`CodecError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from crc32c import crc32c

from strataio.arrays.codecs import (
    BLOSC_MAX_BYTES,
    MAX_CHUNK_BYTES,
    CodecPipeline,
    CodecSpec,
    normalize_codecs,
)
from strataio.errors import ChecksumError, CodecError

SHARDING = "sharding_indexed"
#: the index entry of an absent inner chunk
EMPTY = np.uint64(2**64 - 1)
_LOCATIONS = ("start", "end")
#: bytes between two stored inner chunks a read of both still spans in one request (reading a
#: small gap costs less than a second request on any storage)
_MERGE_GAP = 64 * 1024

#: reads ``len(out)`` bytes of the shard at ``offset`` into ``out``; the shard's size in bytes,
#: or None when the shard does not exist (a ChunkStore's ``read_span`` bound to one key)
SpanReader = Callable[[int, memoryview], "int | None"]

#: reads of one call that may find a shard replaced between its reads (its index, its inner
#: chunks) before the call gives up with ChunkChangedError, serial and collective alike
SHARD_READ_TRIES = 8


class VersionedShardReads:
    """A :data:`SpanReader` of shard ``key`` that notes the versions of the file its reads
    came from, starting from ``version`` (that of an index read before, if any), through
    ``versioned`` (``(key, offset, buf) -> (size, version)``: a store's
    ``read_span_versioned``; a version None is not noted). :attr:`replaced` tells that they
    were more than one: another process replaced (renamed over) the shard between them, so
    the index's offsets and the bytes read at them may belong to two versions."""

    def __init__(
        self,
        versioned: Callable[[str, int, memoryview], tuple[int | None, Any]],
        key: str,
        version: Any = None,
    ) -> None:
        self.versioned, self.key = versioned, key
        self.seen: set[Any] = set() if version is None else {version}

    def __call__(self, offset: int, buf: memoryview) -> int | None:
        size, version = self.versioned(self.key, offset, buf)
        if version is not None:
            self.seen.add(version)
        return size

    @property
    def replaced(self) -> bool:
        return len(self.seen) > 1

    @property
    def version(self) -> Any:
        """The one version every read came from; None where the store told none."""
        return next(iter(self.seen)) if len(self.seen) == 1 else None


def sharding_spec(
    inner_chunks: Sequence[int],
    codecs: list[CodecSpec],
    *,
    checksum_index: bool = True,
    index_location: str = "end",
) -> CodecSpec:
    """The ``sharding_indexed`` codec entry for inner chunks of shape ``inner_chunks`` encoded
    by ``codecs`` (a normalized pipeline); the index is checksummed unless told otherwise."""
    index_codecs: list[CodecSpec] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if checksum_index:
        index_codecs.append({"name": "crc32c"})
    if index_location not in _LOCATIONS:
        raise CodecError(f"shard index_location {index_location!r} is not 'start' or 'end'")
    return {
        "name": SHARDING,
        "configuration": {
            "chunk_shape": [int(n) for n in inner_chunks],
            "codecs": codecs,
            "index_codecs": index_codecs,
            "index_location": index_location,
        },
    }


def is_sharded(specs: list[CodecSpec]) -> bool:
    """True when a Zarr v3 ``codecs`` list is one ``sharding_indexed`` codec."""
    return bool(specs) and specs[0].get("name") == SHARDING


def chunk_codec(
    specs: list[CodecSpec], dtype: np.dtype, chunk_shape: tuple[int, ...], fill_value: Any
) -> CodecPipeline | ShardCodec:
    """The codec of an array's stored chunks: a :class:`ShardCodec` for a sharded array, else
    a :class:`CodecPipeline`."""
    if is_sharded(specs):
        if len(specs) > 1:
            names = [s.get("name") for s in specs]
            raise CodecError(f"codecs {names}: sharding_indexed must be the only codec")
        return ShardCodec(specs[0].get("configuration") or {}, dtype, chunk_shape, fill_value)
    return CodecPipeline(specs, dtype, chunk_shape)


def oversize(codec: CodecPipeline | ShardCodec) -> str | None:
    """What makes a chunk of ``codec`` larger than strataio holds, or None: a chunk, shard or
    shard index over :data:`~strataio.arrays.codecs.MAX_CHUNK_BYTES`, a chunk or inner chunk
    over :data:`~strataio.arrays.codecs.BLOSC_MAX_BYTES` where blosc compresses it."""
    if not isinstance(codec, ShardCodec):
        return _oversize_chunks("chunks", codec)
    shard = f"shards {codec.chunk_shape} of {codec.dtype}"
    if codec.chunk_nbytes > MAX_CHUNK_BYTES:
        return (
            f"{shard} hold {codec.chunk_nbytes} bytes, more than the {MAX_CHUNK_BYTES} bytes "
            "a shard may hold"
        )
    if codec.index_nbytes > MAX_CHUNK_BYTES:
        return (
            f"shards {codec.chunk_shape} of inner chunks {codec.inner_shape} have an index of "
            f"{codec.index_nbytes} bytes, more than the {MAX_CHUNK_BYTES} bytes a shard index "
            "may hold (16 bytes per inner chunk): use larger inner chunks"
        )
    return _oversize_chunks("inner chunks", codec.inner)


def _oversize_chunks(what: str, pipe: CodecPipeline) -> str | None:
    nbytes, limit = pipe.chunk_nbytes, pipe.max_chunk_nbytes
    if nbytes <= limit:
        return None
    holds = "blosc compresses in one buffer" if limit == BLOSC_MAX_BYTES else "a chunk may hold"
    return (
        f"{what} {pipe.chunk_shape} of {pipe.dtype} hold {nbytes} bytes, more than the {limit} "
        f"bytes {holds}"
    )


class ShardCodec:
    """Encodes a shard (an array of ``shard_shape``) to its stored bytes and back, per the
    ``configuration`` of a ``sharding_indexed`` codec; offers the interface of
    :class:`CodecPipeline` that a Dataset uses, plus :meth:`read_box` (partial reads) and the
    index and inner-chunk operations collective shard writes build on."""

    is_raw = False
    is_plain = False

    def __init__(
        self, config: dict[str, Any], dtype: np.dtype, shard_shape: tuple[int, ...], fill: Any
    ) -> None:
        try:
            inner = tuple(int(n) for n in config["chunk_shape"])
            inner_specs = list(config.get("codecs") or [{"name": "bytes"}])
            index_specs = list(config.get("index_codecs") or [{"name": "bytes"}])
            location = config.get("index_location", "end")
        except (KeyError, TypeError, ValueError) as exc:
            raise CodecError(f"sharding_indexed configuration is malformed: {exc!r}") from None
        if len(inner) != len(shard_shape) or any(n < 1 for n in inner):
            raise CodecError(
                f"shard inner chunk shape {inner} does not fit shards of shape {shard_shape}"
            )
        if any(s % c for s, c in zip(shard_shape, inner)):
            raise CodecError(
                f"shard shape {shard_shape} is not a multiple of the inner chunk shape {inner}"
            )
        if location not in _LOCATIONS:
            raise CodecError(f"shard index_location {location!r} is not 'start' or 'end'")
        if is_sharded(inner_specs):
            raise CodecError("nested sharding (a sharding_indexed inner codec) is not supported")
        names = [s.get("name") for s in index_specs]
        endian = (index_specs[0].get("configuration") or {}).get("endian", "little")
        if names not in (["bytes"], ["bytes", "crc32c"]) or endian != "little":
            raise CodecError(
                f"shard index codecs {names} are not supported: strataio reads a little-endian "
                "'bytes' index, optionally followed by 'crc32c'"
            )
        self.dtype = np.dtype(dtype).newbyteorder("=")
        self.chunk_shape = tuple(shard_shape)
        self.inner_shape = inner
        self.inner = CodecPipeline(inner_specs, self.dtype, inner)
        self.fill = np.asarray(fill, dtype=self.dtype)[()]
        self.location = location
        self.index_checksum = len(names) == 2
        self.counts = tuple(s // c for s, c in zip(shard_shape, inner))
        self.nchunks = int(math.prod(self.counts))
        self.index_nbytes = 16 * self.nchunks + (4 if self.index_checksum else 0)
        # (a shard of the wrong size for its index: see the module's docstring)
        self._size_error: type[CodecError] = ChecksumError if self.index_checksum else CodecError
        self.config = {
            "chunk_shape": list(inner),
            "codecs": inner_specs,
            "index_codecs": index_specs,
            "index_location": location,
        }

    # ----------------------------------------------------------------- CodecPipeline's face
    @property
    def names(self) -> list[str]:
        return [SHARDING]

    @property
    def encode_problem(self) -> str | None:
        """What keeps the inner codecs from encoding any inner chunk, or None (see
        :attr:`CodecPipeline.encode_problem`)."""
        return self.inner.encode_problem

    @property
    def stored_dtype(self) -> np.dtype:
        return self.inner.stored_dtype

    @property
    def chunk_nbytes(self) -> int:
        return int(math.prod(self.chunk_shape)) * self.dtype.itemsize

    def describe(self) -> str:
        inner = "×".join(map(str, self.inner_shape))
        return f"{SHARDING}(inner {inner}: {self.inner.describe()}, index {self.location})"

    def encode(self, shard: np.ndarray) -> bytes:
        """Stored bytes of one whole shard (``shard`` has :attr:`chunk_shape`)."""
        blocks = self.split(shard)
        present = np.flatnonzero(~self.empty_blocks(blocks))
        pieces = [self.inner.encode(blocks[i]) for i in present.tolist()]
        sizes = np.fromiter((len(memoryview(p).cast("B")) for p in pieces), np.int64, len(pieces))
        index = np.full((self.nchunks, 2), EMPTY, dtype=np.uint64)
        base = self.index_nbytes if self.location == "start" else 0
        index[present, 0] = base + np.cumsum(sizes) - sizes
        index[present, 1] = sizes
        raw_index = self.encode_index(index)
        parts = [*pieces, raw_index] if self.location == "end" else [raw_index, *pieces]
        return b"".join(parts)

    def decode(self, data: Any) -> np.ndarray:
        """The shard array (native byte order, :attr:`chunk_shape`) of its stored bytes."""
        blob = memoryview(data).cast("B")
        index = self.index_of(blob, len(blob))
        blocks = np.empty((self.nchunks, *self.inner_shape), dtype=self.dtype)
        for i, (off, n) in enumerate(index.tolist()):
            if off == int(EMPTY):
                blocks[i] = self.fill
            else:
                blocks[i] = self.decode_inner(i, blob[off : off + n])
        return self.join(blocks)

    # ----------------------------------------------------------------- inner chunks
    def split(self, shard: np.ndarray) -> np.ndarray:
        """The inner chunks of a shard array as ``(nchunks, *inner_shape)``, C order."""
        nd = len(self.counts)
        cut = [x for pair in zip(self.counts, self.inner_shape) for x in pair]
        order = [*range(0, 2 * nd, 2), *range(1, 2 * nd, 2)]
        return np.ascontiguousarray(
            np.asarray(shard).reshape(cut).transpose(order).reshape(-1, *self.inner_shape)
        )

    def join(self, blocks: np.ndarray) -> np.ndarray:
        """The shard array of its inner chunks ``(nchunks, *inner_shape)`` (inverse of
        :meth:`split`)."""
        nd = len(self.counts)
        order = [x for d in range(nd) for x in (d, nd + d)]
        return (
            blocks.reshape(*self.counts, *self.inner_shape)
            .transpose(order)
            .reshape(self.chunk_shape)
        )

    def empty_blocks(self, blocks: np.ndarray) -> np.ndarray:
        """Per inner chunk, whether it holds the fill value's bytes everywhere (it is not
        stored). Bitwise: ``-0.0`` is not a fill of ``0.0``, nor ``nan+5j`` one of
        ``nan+1j``, though ``==`` (or a NaN test) takes them for it, and reading an inner
        chunk that is not stored gives the fill's very bytes. Blocks of another dtype (a
        caller's data, cast without loss) are compared as they will be stored."""
        flat = np.ascontiguousarray(blocks, dtype=self.dtype).reshape(len(blocks), -1)
        fill = np.full(1, self.fill, dtype=flat.dtype).view(np.uint8)
        raw = flat.view(np.uint8).reshape(len(blocks), -1, fill.size)
        return (raw == fill).all(axis=(1, 2))

    def decode_inner(self, i: int, data: Any) -> np.ndarray:
        """Inner chunk number ``i`` (C order in the shard) of its stored bytes."""
        try:
            return self.inner.decode(data)
        except CodecError as exc:
            raise type(exc)(f"inner chunk {self.inner_coords(i)}: {exc}") from None

    def inner_coords(self, i: int) -> tuple[int, ...]:
        """The coordinates of inner chunk ``i`` in its shard's grid of inner chunks."""
        return tuple(int(c) for c in np.unravel_index(i, self.counts))

    # ----------------------------------------------------------------- the index
    def encode_index(self, index: np.ndarray) -> bytes:
        """Stored bytes of an index ``(nchunks, 2)`` of uint64 (offset, nbytes)."""
        raw = np.ascontiguousarray(index, dtype="<u8").tobytes()
        if self.index_checksum:
            raw += crc32c(raw).to_bytes(4, "little")
        return raw

    def index_span(self, size: int) -> tuple[int, int]:
        """Where the index lies in a shard of ``size`` bytes, as ``(offset, nbytes)``."""
        if size < self.index_nbytes:
            raise self._size_error(
                f"shard of {size} bytes is shorter than its index ({self.index_nbytes} bytes)"
            )
        at = size - self.index_nbytes if self.location == "end" else 0
        return at, self.index_nbytes

    def decode_index(self, raw: Any, size: int) -> np.ndarray:
        """The index ``(nchunks, 2)`` (uint64 offset, nbytes) of its stored bytes, checked
        against a shard of ``size`` bytes: every present inner chunk lies in the data part."""
        raw = memoryview(raw).cast("B")
        body = raw[: 16 * self.nchunks]
        if self.index_checksum:
            stored = int.from_bytes(raw[-4:], "little")
            if crc32c(body) != stored:
                raise ChecksumError(
                    f"shard index checksum mismatch (stored {stored:08x}, computed "
                    f"{crc32c(body):08x}): the shard index is corrupt"
                )
        index = np.frombuffer(body, dtype="<u8").reshape(self.nchunks, 2).astype(np.uint64)
        off, n = index[:, 0], index[:, 1]
        absent = off == EMPTY
        lo, hi = (
            (0, size - self.index_nbytes) if self.location == "end" else (self.index_nbytes, size)
        )
        half = np.flatnonzero(absent != (n == EMPTY))
        if len(half):
            i = int(half[0])
            raise CodecError(
                f"corrupt shard index: inner chunk {self.inner_coords(i)} has entry "
                f"({int(off[i])}, {int(n[i])}), half of an absent chunk's"
            )
        with np.errstate(over="ignore"):
            bad = np.flatnonzero(~absent & ((off < lo) | (off + n > hi) | (off + n < off)))
        if len(bad):
            i = int(bad[0])
            # (an index that passed its checksum: the shard is not the size it was written at)
            raise self._size_error(
                f"corrupt shard index: inner chunk {self.inner_coords(i)} claims bytes "
                f"[{int(off[i])}, +{int(n[i])}) outside the data [{lo}, {hi}) of the shard"
            )
        return index

    def index_of(self, blob: memoryview, size: int) -> np.ndarray:
        """The checked index of a whole shard's bytes."""
        at, n = self.index_span(size)
        return self.decode_index(blob[at : at + n], size)

    def read_index(self, read: SpanReader) -> tuple[np.ndarray, int] | None:
        """The checked index of a stored shard and the shard's size, reading only the index;
        None when the shard does not exist."""
        size = read(0, memoryview(bytearray(0)))
        if size is None:
            return None
        at, n = self.index_span(size)
        raw = bytearray(n)
        read(at, memoryview(raw))
        return self.decode_index(raw, size), size

    # ----------------------------------------------------------------- partial reads
    def box_chunks(self, lo: Sequence[int], hi: Sequence[int]) -> np.ndarray:
        """The inner chunk numbers (C order in the shard) that box ``[lo, hi)`` of the shard
        touches, ascending."""
        inner = np.asarray(self.inner_shape, dtype=np.int64)
        first = np.asarray(lo, dtype=np.int64) // inner
        last = (np.asarray(hi, dtype=np.int64) - 1) // inner
        if not self.counts:  # a 0-d shard: its one inner chunk
            return np.zeros(1, dtype=np.int64)
        ranges = [np.arange(a, b + 1) for a, b in zip(first.tolist(), last.tolist())]
        grid = np.meshgrid(*ranges, indexing="ij")
        return np.ravel_multi_index([g.ravel() for g in grid], self.counts).astype(np.int64)

    def chunk_origins(self, which: np.ndarray) -> np.ndarray:
        """The shard-local element coordinates ``(len(which), ndim)`` where inner chunks
        ``which`` begin."""
        if not self.counts:
            return np.zeros((len(which), 0), dtype=np.int64)
        coords = np.stack(np.unravel_index(which, self.counts), axis=1)
        return coords * np.asarray(self.inner_shape, dtype=np.int64)

    def read_inner(
        self, read: SpanReader, index: np.ndarray, which: np.ndarray
    ) -> list[np.ndarray | None]:
        """Inner chunks ``which`` of a stored shard (None for absent ones), reading their bytes
        with as few requests as gaps allow (runs of chunks less than 64 KiB apart in one)."""
        out: list[np.ndarray | None] = [None] * len(which)
        off = index[which, 0]
        present = np.flatnonzero(off != EMPTY)
        if not len(present):
            return out
        order = present[np.argsort(off[present], kind="stable")]
        start = index[which[order], 0].astype(np.int64)
        end = start + index[which[order], 1].astype(np.int64)
        reach = np.maximum.accumulate(end)
        new_run = np.ones(len(order), dtype=bool)
        new_run[1:] = start[1:] > reach[:-1] + _MERGE_GAP
        run_id = np.cumsum(new_run) - 1
        run_lo = start[new_run]
        run_hi = np.maximum.reduceat(end, np.flatnonzero(new_run))
        bufs = []
        for a, b in zip(run_lo.tolist(), run_hi.tolist()):
            buf = bytearray(b - a)
            read(a, memoryview(buf))
            bufs.append(memoryview(buf))
        for k, j in enumerate(order.tolist()):
            r = int(run_id[k])
            a = int(start[k] - run_lo[r])
            out[j] = self.decode_inner(int(which[j]), bufs[r][a : a + int(end[k] - start[k])])
        return out

    def read_box(self, read: SpanReader, lo: Sequence[int], hi: Sequence[int]) -> np.ndarray | None:
        """Box ``[lo, hi)`` of a stored shard (shard-local element coordinates), reading only
        its index and the inner chunks the box touches; None when the shard does not exist."""
        got = self.read_index(read)
        if got is None:
            return None
        index, _ = got
        which = self.box_chunks(lo, hi)
        chunks = self.read_inner(read, index, which)
        lo_a, hi_a = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        out = np.empty(tuple((hi_a - lo_a).tolist()), dtype=self.dtype)
        inner = np.asarray(self.inner_shape, dtype=np.int64)
        coords = self.chunk_origins(which)
        a = np.maximum(coords, lo_a)
        b = np.minimum(coords + inner, hi_a)
        for k, chunk in enumerate(chunks):
            dst = tuple(map(slice, (a[k] - lo_a).tolist(), (b[k] - lo_a).tolist())) or (...,)
            if chunk is None:
                out[dst] = self.fill
            else:
                src = tuple(map(slice, (a[k] - coords[k]).tolist(), (b[k] - coords[k]).tolist()))
                out[dst] = chunk[src or (...,)]
        return out


def shard_codecs(
    inner_chunks: Sequence[int], codec: Any, dtype: np.dtype, shards: Sequence[int]
) -> list[CodecSpec]:
    """The array ``codecs`` of a sharded array: shards of shape ``shards`` holding inner
    chunks of shape ``inner_chunks``, each encoded by ``codec`` (as for
    :func:`~strataio.arrays.codecs.normalize_codecs`), and a checksummed index at the end."""
    spec = sharding_spec(inner_chunks, normalize_codecs(codec, dtype))
    ShardCodec(spec["configuration"], dtype, tuple(shards), 0)  # validates
    return [spec]
