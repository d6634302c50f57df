"""Collective reads and writes of a sharded Dataset: compressed inner chunks written by the
ranks that hold their data into one file per shard, at offsets an exclusive prefix sum gives
(the chunked, compressed collective I/O of No, Park, Carretero, Choudhary and Chen, §4).

A write plans at the inner chunk level (:func:`~strataio.arrays.collective.plan_pairs` on the
grid of inner chunks): each inner chunk gets one owner among the ranks whose sections touch
it, the pieces travel to the owners in one ``Alltoallv``, and each owner compresses its inner
chunks. A shard's layout comes from the compressed sizes: each rank's inner chunks of the
shard lie in one run, its offset the exclusive prefix sum (``Exscan``) of the runs of the
ranks before it, each run rounded up to the alignment (``strataio_shard_alignment``, 4 KiB:
a run starts on a file system block, as the paper aligns chunks), so each rank writes its run
with one ``pwrite`` through the storage driver (:mod:`strataio.collective.driver`, which the
``strataio_driver*`` hints pick). The shard's *leader* (shard ``k`` of the call: rank
``k mod nprocs``) receives every rank's index entries and writes the index, in one write, at
the end of the shard.

Compression overlaps communication and I/O: the shards' inner chunks are compressed by a
thread pool in shard order while the calling thread runs the offset chain of the shards
already compressed and an I/O thread writes the runs whose offsets are known. With
``groups`` > 1 (pipelined collective I/O, §2.1: the communicator split into consecutive
groups) the prefix sum runs within each group and the groups chain: a group's first rank
receives the shard's end so far from the previous group's last rank, so a rank waits only on
its own group and on one message from the group before.

Each shard is written to a temporary file next to it (``<shard>.<token>.part``,
:mod:`strataio.arrays.shard_parts`) and renamed over it once every rank's runs are written,
after an agreement that nothing failed: a call that fails before (a bad argument on any rank,
a failed compression or write) leaves the old shards as they were; one that fails while the
leaders write the indexes may leave some shards new and others old, each whole. Every rank
holds a shared lock on the call's lock file (``.<token>.lock`` in the array's folder) from
before any temporary file is made until the call ends, so ``strataio fsck PATH --repair``
deletes the files of a call whose ranks were killed and never those of one running now; a
rank holds one descriptor for it, however many shards the call writes. Inner chunks of a
shard the call writes only in part are read from the old shard first (their owners decode
what they update; the leader carries the untouched ones over byte for byte).

A read reads each touched shard's index once (its leader) and broadcasts it with the version
of the file it came from; each inner chunk is read and decoded by one rank, its owner, and the
pieces go where they are wanted (:func:`~strataio.arrays.collective.read_pieces`). A shard
another process replaced (renamed over) between the read of its index and those of its inner
chunks -- their versions differ -- makes every rank start the call again, as a Dataset's own
read does, and after 8 tries raise :class:`~strataio.errors.ChunkChangedError` on every rank;
a write that reads inner chunks of old shards does the same before any shard is replaced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import secrets
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from strataio.agreed import agree, differs
from strataio.arrays.codecs import MAX_CHUNK_BYTES
from strataio.arrays.collective import (
    ChunkPairs,
    OwnedChunks,
    Sections,
    gather_pieces,
    gather_sections,
    plan_pairs,
    read_pieces,
    read_sections,
    write_sections,
)
from strataio.arrays.shard_parts import CallLock, lock_path, part_path
from strataio.arrays.sharding import (
    EMPTY,
    SHARD_READ_TRIES,
    ShardCodec,
    SpanReader,
    VersionedShardReads,
)
from strataio.arrays.store import BackendChunkStore
from strataio.collective.driver import Driver, open_driver
from strataio.collective.hints import (
    DISABLE,
    ENABLE,
    Hints,
    hint_items,
    parse_hints,
    parse_int_hint,
)
from strataio.errors import BackendError, ChunkChangedError, HintError, StrataError
from strataio.layout.chunks import ChunkGrid, chunk_key
from strataio.layout.sections import Section

if TYPE_CHECKING:
    from strataio.arrays.dataset import Dataset
    from strataio.storage.base import Version

_I64 = np.int64
#: default alignment of each rank's run in a shard: a file system block
ALIGNMENT = 4096
#: compression threads per rank (the ranks themselves already share the cores)
_COMPRESS_THREADS = max(1, min(4, (os.cpu_count() or 1) // 2))
#: MPI tags of the chain between groups cycle below the least tag bound MPI guarantees
_TAGS = 32768


@dataclass(frozen=True, slots=True)
class ShardWriteOptions:
    """How a collective shard write lays out and writes its shards: ``alignment`` (bytes,
    >= 1) rounds each rank's run up; ``groups`` splits the communicator into that many
    consecutive groups, each running its own offset chain; ``driver`` are the hints of the
    storage driver each rank writes through."""

    alignment: int = ALIGNMENT
    groups: int = 1
    driver: Hints = Hints()

    @classmethod
    def parse(cls, hints: Mapping[str, Any] | None) -> ShardWriteOptions:
        """Options from hints: ``strataio_shard_alignment``, ``strataio_pipeline_groups`` and
        the ``strataio_driver*`` hints of :func:`~strataio.collective.hints.parse_hints`
        (``hints`` a dict or an ``MPI.Info``, else :class:`HintError`).

        ``strataio_pipeline_groups`` is the hint of ``File``'s pipelined collective I/O; for
        shard writes it splits the communicator into that many groups (one per rank at most),
        the offset chain running inside each group and from one group to the next. Both are
        integers of at least 1 (else :class:`HintError`). Shard files are never
        preallocated (``strataio_preallocate=enable`` raises :class:`HintError`)."""
        rest = hint_items(hints)
        alignment = rest.pop("strataio_shard_alignment", ALIGNMENT)
        alignment = parse_int_hint("strataio_shard_alignment", alignment, 1)
        groups = parse_int_hint(
            "strataio_pipeline_groups", rest.pop("strataio_pipeline_groups", 1), 1
        )
        driver = parse_hints(rest)
        if driver.strataio_preallocate == ENABLE:
            raise HintError(
                "strataio_preallocate=enable: shards are written to temporary files renamed "
                "over the old ones, which are never preallocated (strataio.storage.preallocate)"
            )
        return cls(alignment, groups, driver)


# --------------------------------------------------------------------------- planning
def _inner_grid(ds: Dataset, codec: ShardCodec) -> ChunkGrid:
    return ChunkGrid(ds.shape, codec.inner_shape)


def _shards_of(codec: ShardCodec, inner_coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per inner chunk (array-wide inner grid coordinates): its shard's coordinates and its
    number (C order) inside the shard."""
    per = np.asarray(codec.counts, dtype=_I64)
    shard = inner_coords // per
    local = inner_coords - shard * per
    if len(local) and codec.counts:
        number = np.ravel_multi_index(local.T, codec.counts)
    else:  # none, or a 0-d shard's one inner chunk
        number = np.zeros(len(local), _I64)
    return shard, np.asarray(number, dtype=_I64)


def _file_store(ds: Dataset) -> BackendChunkStore | None:
    """The dataset's store when its shards are files the ranks can open, else None."""
    store = ds.store
    if isinstance(store, BackendChunkStore) and store.chunk_path("c") is not None:
        return store
    return None


def _named(ds: Dataset) -> str:
    return f"dataset {ds.name!r}" if ds.name else "the dataset"


class _Replaced(ChunkChangedError):
    """A shard another process replaced between two reads of one collective call (its index
    and its inner chunks, read by different ranks or at different times, came from two
    versions of the file): the call reads its shards again."""


def _shard_reads(ds: Dataset, key: str, version: Version | None = None) -> SpanReader:
    """A reader of shard ``key`` of ``ds``: one noting the versions its reads came from
    (:class:`VersionedShardReads`, starting from ``version``) where the store tells them."""
    versioned = ds._versioned_span_reader
    if versioned is None:
        return functools.partial(ds.store.read_span, key)
    return VersionedShardReads(versioned, key, version)


def _check(ds: Dataset, reads: SpanReader, what: str) -> None:
    """Raise :class:`_Replaced` where ``reads`` (:func:`_shard_reads`) came from two
    versions of their shard (``what``: the call reading it, "read" or "write")."""
    if isinstance(reads, VersionedShardReads) and reads.replaced:
        raise _Replaced(
            f"{_named(ds)}, shard {reads.key!r}: replaced by another writer during the "
            f"collective {what} (its index and its inner chunks read from two versions of "
            "the file)"
        )


def _replaced_everywhere(comm: MPI.Comm, exc: BaseException) -> bool:
    """Collective, after an error raised on every rank: whether every rank's is
    :class:`_Replaced` (a shard replaced mid-call, the call may start again), the same
    answer on every rank."""
    replaced = isinstance(exc, _Replaced)
    return bool(comm.allreduce(replaced, op=MPI.LAND)) if comm.Get_size() > 1 else replaced


def _gave_up(exc: BaseException, what: str) -> ChunkChangedError:
    """The error of a collective call that found a shard replaced mid-call at every try."""
    return ChunkChangedError(
        f"{exc}; {SHARD_READ_TRIES} times: the {what} gave up, nothing is damaged: "
        f"{what} it again (or order the other job's writes before it)"
    )


def _shard_indexes(
    ds: Dataset, comm: MPI.Comm, codec: ShardCodec, keys: list[str], what: str
) -> tuple[list[np.ndarray | None], list[Version | None]]:
    """Collective: the index of each shard ``keys[k]`` (None for a shard never written) and
    the version of the file it was read from (None where the store tells none), read once by
    the shard's leader (rank ``k mod nprocs``) and sent to every rank; a corrupt index, or a
    shard replaced between the reads of its size and its index (:class:`_Replaced`), raises
    on every rank (``what``: the collective call, for the message)."""
    me, nprocs = comm.Get_rank(), comm.Get_size()
    mine: dict[int, tuple[np.ndarray | None, Version | None]] = {}
    err: BaseException | None = None
    for k in range(me, len(keys), nprocs):
        reads = _shard_reads(ds, keys[k])
        try:
            try:
                got = codec.read_index(reads)
            except StrataError:
                _check(ds, reads, what)  # (the old size's index span in the new file, say)
                raise
            _check(ds, reads, what)
        except _Replaced as exc:
            err = exc
            break
        except StrataError as exc:
            err = type(exc)(f"{_named(ds)}, shard {keys[k]!r}: {exc}")
            break
        except Exception as exc:  # any failure here must reach the other ranks
            err = exc
            break
        mine[k] = (
            (None, None)
            if got is None
            else (got[0], reads.version if isinstance(reads, VersionedShardReads) else None)
        )
    agree(comm, err)
    found: list[np.ndarray | None] = [None] * len(keys)
    versions: list[Version | None] = [None] * len(keys)
    for part in comm.allgather(mine) if nprocs > 1 else [mine]:
        for k, (index, version) in part.items():
            found[k], versions[k] = index, version
    return found, versions


# --------------------------------------------------------------------------- reads
def read_shards(
    ds: Dataset, comm: MPI.Comm, section: Section | None, err: BaseException | None
) -> np.ndarray:
    """Collective: this rank's ``section`` of the sharded ``ds`` (see the module docstring);
    a dataset whose store reads no parts of objects is read shard by shard."""
    codec = ds.codecs
    assert isinstance(codec, ShardCodec)
    if not ds.store.capabilities.partial_reads:
        return read_sections(ds, comm, section, err)
    grid = _inner_grid(ds, codec)
    sections = gather_sections(comm, ds.ndim, section, err)
    pairs = plan_pairs(grid, sections)
    shard, number = _shards_of(codec, pairs.coords)
    keys, which = _unique_shards(ds, shard)
    slot = {tuple(c): i for i, c in enumerate(pairs.coords.tolist())}
    # A shard's index (read by its leader) and its inner chunks (by their owners) are
    # separate reads: a shard another process replaced between them gives the owners the
    # new file's bytes at the old index's offsets. Every rank reads again when any rank
    # found one.
    for attempt in range(SHARD_READ_TRIES):
        try:
            return _read_once(ds, comm, grid, sections, pairs, section, keys, which, number, slot)
        except Exception as exc:  # (raised on every rank: agreed)
            if not _replaced_everywhere(comm, exc):
                raise
            if attempt == SHARD_READ_TRIES - 1:
                raise _gave_up(exc, "read") from None
    raise AssertionError("unreachable")


def _read_once(
    ds: Dataset,
    comm: MPI.Comm,
    grid: ChunkGrid,
    sections: Sections,
    pairs: ChunkPairs,
    section: Section | None,
    keys: list[str],
    which: np.ndarray,
    number: np.ndarray,
    slot: dict[tuple[int, ...], int],
) -> np.ndarray:
    """One try of :func:`read_shards`: raises :class:`_Replaced` on every rank where a shard
    was replaced between the read of its index and those of its inner chunks."""
    codec = ds.codecs
    assert isinstance(codec, ShardCodec)
    indexes, versions = _shard_indexes(ds, comm, codec, keys, "read")

    def read_chunks(
        coords: np.ndarray, lo: np.ndarray, hi: np.ndarray, out: np.ndarray, at: np.ndarray
    ) -> None:
        ids = np.asarray([slot[tuple(c)] for c in coords.tolist()], dtype=_I64)
        for k in np.unique(which[ids]).tolist():
            sel = np.flatnonzero(which[ids] == k)
            index = indexes[k]
            if index is None:
                chunks: list[np.ndarray | None] = [None] * len(sel)
            else:
                reads = _shard_reads(ds, keys[k], versions[k])
                try:
                    chunks = codec.read_inner(reads, index, number[ids[sel]])
                except StrataError as exc:
                    _check(ds, reads, "read")
                    raise type(exc)(f"{_named(ds)}, shard {keys[k]!r}: {exc}") from None
                _check(ds, reads, "read")
            for j, chunk in zip(sel.tolist(), chunks):
                dst = tuple(map(slice, at[j], at[j] + hi[j] - lo[j]))
                out[dst] = codec.fill if chunk is None else chunk[tuple(map(slice, lo[j], hi[j]))]

    return read_pieces(comm, grid, ds.dtype, sections, pairs, section, read_chunks)


def _unique_shards(ds: Dataset, shard: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The keys of the distinct shards in ``shard`` (coordinates per row), ascending, and
    per row its shard's position among them."""
    if not len(shard):
        return [], np.zeros(0, dtype=_I64)
    uniq, which = np.unique(shard, axis=0, return_inverse=True)
    sep = ds.meta.separator
    return [chunk_key(c, sep) for c in uniq.tolist()], np.asarray(which, dtype=_I64).ravel()


# --------------------------------------------------------------------------- writes
@dataclass(slots=True)
class _Run:
    """One rank's part of one shard: its inner chunks' numbers and encoded bytes, packed."""

    numbers: np.ndarray
    sizes: np.ndarray
    data: bytes


def write_shards(
    ds: Dataset,
    comm: MPI.Comm,
    section: Section | None,
    data: np.ndarray | None,
    err: BaseException | None,
    options: ShardWriteOptions,
) -> None:
    """Collective: write ``data`` to this rank's ``section`` of the sharded ``ds`` (see the
    module docstring); ``err`` is this rank's failure so far, raised on every rank before
    anything is written. A store whose shards are not files is written shard by shard."""
    codec = ds.codecs
    assert isinstance(codec, ShardCodec)
    store = _file_store(ds)
    if store is None or codec.location != "end":
        write_sections(ds, comm, section, data, err)
        return
    grid = _inner_grid(ds, codec)
    sections = gather_sections(comm, ds.ndim, section, err)
    _same_options(comm, options)
    # held from before any temporary file is made until every one is renamed or removed:
    # what tells fsck that the call is running
    token, lock = _hold_call_lock(ds, comm, store)
    try:
        _write_shards(ds, comm, store, codec, grid, sections, data, options, token)
    finally:
        lock.release(remove=True)  # (this rank has removed every temporary file left)


def _hold_call_lock(ds: Dataset, comm: MPI.Comm, store: BackendChunkStore) -> tuple[str, CallLock]:
    """Collective: the call's token and this rank's hold on the call's lock file
    (:mod:`strataio.arrays.shard_parts`): rank 0 makes the lock file before the token
    reaches the others, which then open it. Raises on every rank where any rank cannot hold
    it (:class:`BackendError`), nothing held then."""
    me, nprocs = comm.Get_rank(), comm.Get_size()
    chunks = store.chunk_path("c")
    assert chunks is not None
    folder = os.path.dirname(chunks)
    token = secrets.token_hex(4) if me == 0 else ""
    lock: CallLock | None = None
    err: BaseException | None = None
    if me == 0:
        try:
            lock = CallLock.create(lock_path(folder, token))
        except OSError as exc:
            err = BackendError(f"{_named(ds)}: cannot make the lock file of the write: {exc}")
    if nprocs > 1:
        token, made = comm.bcast((token, lock is not None), root=0)
        if me != 0 and made:
            try:
                lock = CallLock.join(lock_path(folder, token))
            except OSError as exc:
                err = BackendError(f"{_named(ds)}: cannot hold the lock file of the write: {exc}")
    try:
        agree(comm, err)
    except Exception:
        if lock is not None:
            lock.release(remove=True)
        raise
    assert lock is not None
    return token, lock


def _write_shards(
    ds: Dataset,
    comm: MPI.Comm,
    store: BackendChunkStore,
    codec: ShardCodec,
    grid: ChunkGrid,
    sections: Sections,
    data: np.ndarray | None,
    options: ShardWriteOptions,
    token: str,
) -> None:
    """:func:`write_shards` once the sections are known and the call's lock is held, its
    temporary files named by ``token``."""
    pairs = plan_pairs(grid, sections)
    owned = gather_pieces(comm, grid, ds.dtype, ds.fill_value, sections, pairs, data)
    shard, number = _shards_of(codec, pairs.coords)
    keys, which = _unique_shards(ds, shard)
    whole = _whole_shards(codec, grid, pairs, owned, which, len(keys))
    partial = [k for k in range(len(keys)) if not whole[k]]
    paths = [store.chunk_path(k) for k in keys]
    temps = [part_path(p, token) for p in paths]
    # The inner chunks a write leaves as they were are read from the old shards at their
    # indexes' offsets: a shard another process replaced meanwhile gives the new file's bytes
    # at the old offsets. Every rank starts again (its temporary files removed) when any
    # rank found one; no shard is replaced before.
    for attempt in range(SHARD_READ_TRIES):
        try:
            entries = _write_runs_once(
                ds, comm, codec, owned, which, number, keys, partial, temps, options
            )
            break
        except Exception as exc:  # (raised on every rank, its temporary files removed)
            if not _replaced_everywhere(comm, exc):
                raise
            if attempt == SHARD_READ_TRIES - 1:
                raise _gave_up(exc, "write") from None
    failed: BaseException | None = None
    try:
        _write_indexes(comm, store, codec, entries, keys, temps, paths, options)
    except Exception as exc:
        failed = exc
    try:
        agree(comm, failed)
    finally:
        _remove(temps)
        ds.clear_cache()  # (after a failure too: some shards may have been replaced)


def _write_runs_once(
    ds: Dataset,
    comm: MPI.Comm,
    codec: ShardCodec,
    owned: OwnedChunks,
    which: np.ndarray,
    number: np.ndarray,
    keys: list[str],
    partial: list[int],
    temps: list[str],
    options: ShardWriteOptions,
) -> list[np.ndarray]:
    """One try of the runs of :func:`_write_shards`: the old indexes of the shards
    ``partial`` (some inner chunk of which the call leaves, partly, as it was) read, this
    rank's runs compressed and written to the temporary files ``temps``; its index entries
    (:func:`_write_runs`). A failure on any rank raises on every rank, each having removed
    the temporary files (:class:`_Replaced` where an old shard was replaced mid-call)."""
    me, nprocs = comm.Get_rank(), comm.Get_size()
    old: list[np.ndarray | None] = [None] * len(keys)
    versions: list[Version | None] = [None] * len(keys)
    if partial:
        got, seen = _shard_indexes(ds, comm, codec, [keys[k] for k in partial], "write")
        for k, index, version in zip(partial, got, seen):
            old[k], versions[k] = index, version
    groups = min(options.groups, nprocs)  # (a group per rank at most)
    group = comm.Split(me * groups // nprocs, me) if groups > 1 else comm
    failed: BaseException | None = None
    entries: list[np.ndarray] = []
    try:
        runs = _compress_runs(ds, codec, owned, which, number, keys, old, versions, me, nprocs)
        entries = _write_runs(comm, group, codec, runs, temps, options, keys)
    except Exception as exc:  # every rank must learn of it before any shard is replaced
        failed = exc
    finally:
        if group is not comm:
            group.Free()
    try:
        agree(comm, failed)
    except Exception:
        _remove(temps)
        raise
    return entries


def _same_options(comm: MPI.Comm, options: ShardWriteOptions) -> None:
    """Raise :class:`HintError` on every rank unless every rank passed the same alignment and
    groups: ranks splitting the communicator differently would wait for each other forever."""
    if differs(comm, [options.alignment, options.groups]):
        raise HintError(
            "strataio_shard_alignment and strataio_pipeline_groups differ between ranks "
            f"(this rank: {options.alignment}, {options.groups}); pass the same on every rank"
        )


def _whole_shards(
    codec: ShardCodec,
    grid: ChunkGrid,
    pairs: ChunkPairs,
    owned: OwnedChunks,
    which: np.ndarray,
    nshards: int,
) -> np.ndarray:
    """Per shard of the call: whether the call writes all of it (every inner chunk inside the
    array is covered by the pieces), so its old contents do not matter."""
    if not nshards:
        return np.zeros(0, dtype=bool)
    covered = np.bincount(which, weights=owned.covered, minlength=nshards)
    # inner chunks of each shard inside the array: the shard's box clipped to the grid
    per = np.asarray(codec.counts, dtype=_I64)
    gshape = np.asarray(grid.grid_shape, dtype=_I64)
    first = np.zeros((nshards, grid.ndim), dtype=_I64)
    first[which] = (pairs.coords // per) * per
    inside = np.prod(np.minimum(first + per, gshape) - first, axis=1)
    return covered == inside


def _compress_runs(
    ds: Dataset,
    codec: ShardCodec,
    owned: OwnedChunks,
    which: np.ndarray,
    number: np.ndarray,
    keys: list[str],
    old: list[np.ndarray | None],
    versions: list[Version | None],
    me: int,
    nprocs: int,
) -> list[Future[_Run]]:
    """Per shard of the call, a future of this rank's run: its owned inner chunks assembled
    and encoded (inner chunks equal to the fill value left out), and for shards it leads the
    untouched stored inner chunks of the old shard, carried over as they are. A future
    raises :class:`_Replaced` where the old shard's reads came from another version of the
    file than its index (``versions``)."""
    by_shard: list[list[int]] = [[] for _ in keys]
    for c in owned.owned:
        by_shard[int(which[c])].append(c)
    pool = ThreadPoolExecutor(_COMPRESS_THREADS, thread_name_prefix="strataio-compress")

    def run(k: int) -> _Run:
        chunks = by_shard[k]
        index = old[k]
        read = _shard_reads(ds, keys[k], versions[k])
        need = [c for c in chunks if not owned.covered[c]]
        base: dict[int, np.ndarray | None] = {}
        if need and index is not None:
            try:
                olds = codec.read_inner(read, index, number[need])
            except StrataError as exc:
                _check(ds, read, "write")  # (the new file's bytes at the old offsets, say)
                raise type(exc)(f"{_named(ds)}, shard {keys[k]!r}: {exc}") from None
            for c, got in zip(need, olds):
                base[c] = None if got is None else np.array(got)
        kept: list[int] = []
        parts: list[Any] = []
        for c in chunks:
            start = None
            if not owned.covered[c]:
                start = base.get(c)
                if start is None:
                    start = np.full(codec.inner_shape, codec.fill, dtype=ds.dtype)
            chunk = owned.make(c, start)  # a view of the caller's data where it can be
            if not codec.empty_blocks(chunk[None])[0]:
                kept.append(c)
                parts.append(codec.inner.encode(chunk))
        nums = number[kept] if kept else np.zeros(0, dtype=_I64)
        if index is not None and k % nprocs == me:
            carried = _carried(index, number, which, k)
            if len(carried):
                raws = _raw_inner(read, index, carried)
                nums = np.concatenate([nums, carried])
                parts += raws
        _check(ds, read, "write")  # (before any byte of it is written)
        sizes = np.fromiter((memoryview(p).nbytes for p in parts), dtype=_I64, count=len(parts))
        return _Run(np.asarray(nums, dtype=_I64), sizes, b"".join(parts))

    try:
        return [pool.submit(run, k) for k in range(len(keys))]
    finally:
        pool.shutdown(wait=False)


def _carried(index: np.ndarray, number: np.ndarray, which: np.ndarray, k: int) -> np.ndarray:
    """Inner chunk numbers stored in an old shard ``k`` that no piece of the call touches."""
    touched = np.zeros(len(index), dtype=bool)
    touched[number[which == k]] = True
    return np.flatnonzero(~touched & (index[:, 0] != EMPTY)).astype(_I64)


def _raw_inner(read: Any, index: np.ndarray, numbers: np.ndarray) -> list[bytes]:
    """The stored (encoded) bytes of inner chunks ``numbers`` of an old shard."""
    out = []
    for off, n in index[numbers].tolist():
        buf = bytearray(n)
        read(off, memoryview(buf))
        out.append(bytes(buf))
    return out


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _write_runs(
    comm: MPI.Comm,
    group: MPI.Comm,
    codec: ShardCodec,
    runs: list[Future[_Run]],
    temps: list[str],
    options: ShardWriteOptions,
    keys: list[str],
) -> list[np.ndarray]:
    """The offset chain and the writes: per shard in order, this rank's run placed after the
    runs of the ranks before it (exclusive prefix sum within the group, the groups chained)
    and written by an I/O thread while later shards are still being compressed. Returns per
    shard this rank's index entries ``(k, number, offset, nbytes)``, and from the communicator's
    last rank ``(k, -1, end, 0)`` rows giving each shard's data end. A shard whose aligned
    runs and index come to more than a shard may hold raises :class:`HintError` on the last
    rank, which then writes no more."""
    g_rank, g_size = group.Get_rank(), group.Get_size()
    me, nprocs = comm.Get_rank(), comm.Get_size()
    first_of_group = me - g_rank
    io = ThreadPoolExecutor(1, thread_name_prefix="strataio-shard-io")
    writes: list[Future[None]] = []
    rows: list[np.ndarray] = []
    local = np.zeros(1, dtype=_I64)
    before = np.zeros(1, dtype=_I64)
    failed: BaseException | None = None
    nothing = _Run(np.zeros(0, dtype=_I64), np.zeros(0, dtype=_I64), b"")
    try:
        for k in range(len(keys)):
            # a rank whose compression failed stays in the chain (with nothing to write):
            # the others must not wait on it forever
            try:
                run = runs[k].result() if failed is None else nothing
            except Exception as exc:
                failed, run = exc, nothing
            local[0] = _align(len(run.data), options.alignment) if len(run.data) else 0
            if g_size > 1:
                group.Exscan(local, before, op=MPI.SUM)
                if g_rank == 0:
                    before[0] = 0
            else:
                before[0] = 0
            # the chain between groups: the previous group's end is this group's base
            base = 0
            if first_of_group > 0 and g_rank == 0:
                base = comm.recv(source=first_of_group - 1, tag=k % _TAGS)
            if g_size > 1:
                base = group.bcast(base, root=0)
            at = base + int(before[0])
            end = at + int(local[0])
            last_of_group = g_rank == g_size - 1
            if last_of_group and me < nprocs - 1:
                comm.send(end, dest=me + 1, tag=k % _TAGS)
            if me == nprocs - 1 and failed is None:
                failed = _too_large(end + codec.index_nbytes, keys[k], options)
                if failed is not None:
                    run = nothing
            if len(run.data):
                writes.append(io.submit(_write_temp, temps[k], run.data, at, options.driver))
                offsets = at + np.cumsum(run.sizes) - run.sizes
                rows.append(
                    np.stack([np.full(len(run.numbers), k), run.numbers, offsets, run.sizes], 1)
                )
            if me == nprocs - 1:
                rows.append(np.asarray([[k, -1, end, 0]], dtype=_I64))
        for w in writes:
            w.result()
    finally:
        io.shutdown(wait=True)
    if failed is not None:
        raise failed
    return rows


def _too_large(size: int, key: str, options: ShardWriteOptions) -> HintError | None:
    """The error for shard ``key`` of the call laid out at ``size`` bytes (its runs,
    each rounded up to the alignment, and its index) where that is more than a shard may
    hold (:data:`~strataio.arrays.codecs.MAX_CHUNK_BYTES`), else None."""
    if size <= MAX_CHUNK_BYTES:
        return None
    return HintError(
        f"shard {key!r} would be {size} bytes with each rank's run aligned to "
        f"{options.alignment} bytes (strataio_shard_alignment), more than the {MAX_CHUNK_BYTES} "
        "bytes a shard may hold: use a smaller alignment"
    )


def _write_temp(path: str, data: bytes, offset: int, hints: Hints, *, create: bool = True) -> None:
    """Write ``data`` at ``offset`` of the temporary shard file ``path`` (made where missing,
    with ``create``; else :class:`FileNotFoundError`) through the driver ``hints`` name,
    never preallocated: the file is renamed over the old shard (see
    :mod:`strataio.storage.preallocate`)."""
    if create:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    hints = dataclasses.replace(hints, strataio_preallocate=DISABLE)
    flags = os.O_WRONLY | (os.O_CREAT if create else 0)
    driver: Driver = open_driver(path, flags, 0o644, hints)
    try:
        driver.pwrite(np.frombuffer(data, dtype=np.uint8), offset)
    finally:
        driver.close()


def _write_indexes(
    comm: MPI.Comm,
    store: BackendChunkStore,
    codec: ShardCodec,
    rows: list[np.ndarray],
    keys: list[str],
    temps: list[str],
    paths: list[str],
    options: ShardWriteOptions,
) -> None:
    """Every rank's index entries sent to the shards' leaders (one ``alltoall``); each leader
    writes its shards' indexes in one write each and renames each shard over the old one. As
    for any Dataset write, the shards are durable after :meth:`Dataset.flush` (the leaders'
    stores record them). A temporary file some rank wrote a run to and gone before its index
    is written is an error, never a shard of the index alone; that of a shard no rank wrote
    a run to (every inner chunk the fill value) is made by its index."""
    written: list[str] = []
    me, nprocs = comm.Get_rank(), comm.Get_size()
    table = np.concatenate(rows) if rows else np.zeros((0, 4), dtype=_I64)
    leader = table[:, 0] % nprocs
    parts = [table[leader == r] for r in range(nprocs)]
    got = comm.alltoall(parts) if nprocs > 1 else parts
    mine = np.concatenate(got) if got else np.zeros((0, 4), dtype=_I64)
    for k in range(me, len(temps), nprocs):
        rows_k = mine[mine[:, 0] == k]
        end = int(rows_k[rows_k[:, 1] == -1, 2][0])
        chunks = rows_k[rows_k[:, 1] >= 0]
        index = np.full((codec.nchunks, 2), EMPTY, dtype=np.uint64)
        index[chunks[:, 1], 0] = chunks[:, 2].astype(np.uint64)
        index[chunks[:, 1], 1] = chunks[:, 3].astype(np.uint64)
        try:
            blob = codec.encode_index(index)
            _write_temp(temps[k], blob, end, options.driver, create=end == 0)
        except FileNotFoundError:
            raise BackendError(
                f"dataset {store.name!r}, shard {keys[k]!r}: its temporary file {temps[k]} "
                "was deleted before its index was written"
            ) from None
        os.replace(temps[k], paths[k])
        written.append(keys[k])
    store.note_written(written)


def _remove(paths: list[str]) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
