"""TieredChunkStore: the ChunkStore protocol over a storage hierarchy.

A Dataset reads and writes through this store exactly as through a single directory; the store
decides where each chunk lives. Residency comes from the catalog once at open (a
:class:`~strataio.tiers.residency.Residency`); reads take the fastest intact copy on a tier that
answers (staging chunks whose fastest copy is on an archive tier to disk first, as APRIL's
``T_READ_SECTION`` does), writes go where the placement hint says with failover, and the
residency changes reach the catalog in one transaction at flush / close.

Every tier holds the dataset's ``zarr.json`` beside its chunks (``NAME/zarr.json``,
``NAME/c/i/j``), so a tier holding all chunks is itself a Zarr v3 array; the catalog record
names the current version of it, so a tier that missed an attribute change is not read as
current (:mod:`strataio.tiers.meta`).

Reads check each copy's bytes against the checksum the catalog recorded for it, whatever the
dataset's codecs (an announced rewrite accepts the old or the new bytes, whole:
:meth:`ChunkCopy.accepts`): a copy that fails is skipped for the next one, and a chunk whose every copy
fails raises :class:`ChecksumError` naming the dataset, the chunk and the tiers. A catalogued
copy whose object is missing is forgotten, its row dropped if it is still the one the read
saw (:meth:`Commit.drop_missing_row`), and the next copy is read, where another copy holds
the same bytes; where none does, the read raises (a copy of another value is never read in
its place) and fsck reports the loss.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from strataio.arrays.store import ChunkStore, StoreCapabilities
from strataio.catalog.base import ChunkCopy, DatasetRecord, VerifiedCopy
from strataio.errors import (
    BackendError,
    ChecksumError,
    ChunkChangedError,
    ChunksNotStoredError,
    ClosedError,
    ExistsError,
    HintError,
    NotFoundError,
    ObjectError,
    StrataError,
    TierDownError,
)
from strataio.layout.pieces import scratch
from strataio.sizes import counted
from strataio.storage.base import BytesLike, Version, validate_key
from strataio.tiers.cache import ChunkCache
from strataio.tiers.commit import Commit, checksum_there
from strataio.tiers.meta import MetaCopies
from strataio.tiers.mover import MoveHandle, Mover
from strataio.tiers.placement import DatasetDisabledError, Placement, normalize_hint
from strataio.tiers.residency import Residency, object_key, same_bytes
from strataio.tiers.tier import Tier, TierSet, accepts_data, checksum, checksum_like

#: bytes of first reads' whole chunks up to which a batch reads them into a buffer the thread
#: keeps (above, a buffer of their own: a thread keeps no large one, an I/O thread included)
_SPARE_KEEP = 4 << 20


class TieredChunkStore(ChunkStore):
    """Chunks of dataset ``residency.name`` spread over ``tiers``.

    ``hint`` is the dataset's placement hint (``chosen``: the tier placement by prediction
    chose for an AUTO dataset, its writes' home); ``disabled`` marks a DISABLE dataset (writes are
    dropped, reads raise :class:`DatasetDisabledError`). ``stage_on_read`` stages chunks whose
    fastest copy is on an archive (``remotetape``) tier before reading them. ``commit``
    makes the residency's changes durable (at flush, close and when a rewrite in place is
    announced).

    Partial reads (:meth:`read_span`) follow a verified-once rule: the first read of a chunk's
    copy reads it whole and checks the catalogued checksum; later reads of that copy read only
    the bytes asked for, as long as the object's version (:meth:`Backend.versions`: a new
    object, or any write to it, makes a new one) is the one that was checked. A copy
    replaced by any process is therefore read whole and checked again; what this does not see
    is the medium decaying under an unchanged object after its check, which the next whole
    read (or ``strataio fsck``) finds.

    The rule holds across processes: the checks a process made reach the catalog at its flush
    and close (:meth:`record_checks`, :meth:`Catalog.record_verified`), and a process opening
    the dataset takes them over, each still bound to the checksum the copy's row records and
    to the object's version when it was checked. So a copy is read whole once after each
    write of it, by whichever process reads it first, not once per process (a parallel job's
    ranks other than 0, which hold no catalog, keep their checks to themselves). The
    process that put a copy counts its own put as the check, for itself only
    (:meth:`_note_check`): it knows the bytes and the object's version from the put, and
    a whole read right after would only compare the page cache with the buffer it wrote.

    The process's decoded-chunk cache (:mod:`strataio.arrays.chunk_cache`) keeps chunks read
    this way under the version of the object they came from (:meth:`chunk_versions`: the
    tier's location and the object's version there), so a copy replaced, moved to another
    tier or being put is read again, as for a plain dataset.

    Chunks held in memory (the session's prefetch cache, copies on a memory tier) show no
    other process's rewrite: no object is read. A read that serves chunks from memory first
    asks the catalog whether the dataset's rows changed since this store learned or last
    confirmed theirs (:meth:`confirm_rows`: one small query per read, the rows of those
    chunks read again only where they did), and takes a prefetch-cache entry only while the
    copy it would read otherwise accepts the entry's bytes. So a read after another
    process's committed rewrite returns the new value, from memory or not.
    """

    # (puts run on the mover's threads; each call announces its rewrites in one transaction)
    capabilities = StoreCapabilities(
        partial_reads=True, versions=True, chunk_cache=True, overlapped_puts=True
    )

    def __init__(
        self,
        residency: Residency,
        tiers: TierSet,
        placement: Placement,
        mover: Mover,
        cache: ChunkCache,
        commit: Commit | None = None,
        *,
        hint: str = "AUTO",
        disabled: bool = False,
        stage_on_read: bool = True,
        chosen: str | None = None,
    ) -> None:
        self.res = residency
        self.name = residency.name
        self.tiers = tiers
        self.placement = placement
        self.mover = mover
        self.cache = cache
        self.hint = normalize_hint(hint)
        #: the tier placement by prediction chose for an AUTO dataset (None: the default)
        self.chosen = chosen
        self.disabled = disabled or self.hint == "DISABLE"
        self.stage_on_read = stage_on_read
        self.commit = commit if commit is not None else placement.commit
        self._closed = False
        #: the moves started through this store, each with whether its close cancels it (a
        #: move to a memory tier, whose copies the close drops) or lets it finish
        self._moves: list[tuple[MoveHandle, bool]] = []
        #: called with this store once it closed (a session keeps what it learned, and the
        #: obsolete objects it could not delete)
        self.on_closed: Callable[[TieredChunkStore], None] | None = None
        #: whether :meth:`close` committed every change (False: it failed, or has not run)
        self.closed_cleanly = False
        #: where set, the catalog's generation of the dataset at the residency's first
        #: lookup (None: not known): every row learned since is at least that current
        self.learned_since: Callable[[], int | None] | None = None
        # chunk key -> the catalog generation its rows were last made current at by a read
        # that serves it from memory (see confirm_rows)
        self._confirmed: dict[str, int] = {}
        self._volatile = frozenset(t.name for t in tiers if t.volatile)
        #: checks of copies this store made itself (reads, moves, puts)
        self.checks_made = 0
        # (chunk key, tier) -> (checksum of the bytes checked, object version when checked)
        self._verified: dict[tuple[str, str], tuple[str, Any]] = {}
        # chunk key -> the copy a range read last found verified, and the residency's stamp
        # of the chunk then: while that stamp holds, the copy checks need not be repeated
        self._checked: dict[str, _Checked] = {}
        # the copies (key, tier) whose check in _verified this process made and has not
        # recorded in the catalog yet (see record_checks)
        self._unrecorded: set[tuple[str, str]] = set()
        self._load_checks()
        residency.on_learned = self._load_checks  # (the checks of chunks learned later)
        placement.register(residency)
        residency.drop_missing_row = functools.partial(self.commit.drop_missing_row, residency)
        residency.moved_checked = self._moved_checked
        #: the dataset's zarr.json copies on the persistent tiers
        self.meta = MetaCopies(
            self.name, placement.persistent, self.commit.reachable_catalog, self.commit.writer
        )

    # ----------------------------------------------------------------- reads
    #: times one read asks the catalog again for a chunk whose every known copy is missing
    REFRESHES = 3
    #: ... and times while each answer differs from the last (another process is rewriting
    #: or moving the chunk right now: each look finds it further on)
    REFRESHES_WHILE_CHANGING = 20
    #: seconds before a chunk found missing or unreadable is read again where the catalog
    #: shows no change (times the lookups so far)
    REREAD_PAUSE = 0.01
    #: announcements of one batch of rewrites that may find the rows they replace changed by
    #: another process before one of them gives up (_announce_rewrites)
    ANNOUNCE_TRIES = 8

    def get_chunks(self, keys: Sequence[str]) -> list[BytesLike | None]:
        return self._get_chunks(keys, None)

    def get_chunks_as(
        self, keys: Sequence[str], versions: Sequence[Version | None]
    ) -> list[tuple[BytesLike | None, bool]]:
        """:meth:`get_chunks`, and per key whether the bytes came from the tier that
        ``versions[i]`` (:meth:`chunk_versions`) names: not where the read failed over to
        another tier's copy, nor for a chunk held in the session's memory cache."""
        served: list[str | None] = [None] * len(keys)
        blobs = self._get_chunks(keys, served)
        return [
            (blob, v is not None and url is not None and v[0] == url)
            for blob, v, url in zip(blobs, versions, served)
        ]

    def _get_chunks(
        self, keys: Sequence[str], served: list[str | None] | None
    ) -> list[BytesLike | None]:
        """:meth:`get_chunks`; with ``served``, the URL of the backend each chunk's bytes
        came from is set at its position (left None for memory-cache hits)."""
        self._check_open()
        if self.disabled:
            raise DatasetDisabledError(
                f"dataset {self.name!r} was created with the DISABLE hint: its data was not "
                "stored, so it cannot be read"
            )
        self.res.learn(keys)  # (the rows of chunks not looked up yet, in one query)
        self._recheck_faster(keys)
        mem = self._in_memory(keys)
        if mem:
            self.confirm_rows(mem)
        out: list[BytesLike | None] = [None] * len(keys)
        need: list[int] = []
        hits = self.cache.get_many(self.name, keys, self.res.names_bytes) if mem else None
        for i, k in enumerate(keys):
            hit = None if hits is None else hits[i]
            if hit is not None:
                out[i] = hit
            elif self.res.copies(k):
                need.append(i)
        if not need:
            return out
        if self.stage_on_read:
            self._stage_from_archive([keys[i] for i in need])
        # Group by the tier of each chunk's fastest readable copy; a failed copy's tier is
        # remembered (not its position: an eviction may change the copy list meanwhile) and
        # the next readable copy on another tier is tried.
        pending: dict[int, set[str]] = {i: set() for i in need}
        corrupt: dict[int, list[str]] = {}
        blocked: dict[int, ObjectError] = {}  # a copy something not of ours is in the way of
        # a copy found missing whose bytes no other copy holds: only a copy of the same
        # bytes may stand for it (another value would be read in its place, unsaid)
        gone: dict[int, ChunkCopy] = {}
        refreshes: Counter[int] = Counter()  # catalog lookups per chunk in this read
        moving: set[int] = set()  # chunks whose last lookup found their rows changed
        probed: set[int] = set()  # chunks whose down tiers this read probed again
        while pending:
            groups: dict[str, list[tuple[int, ChunkCopy]]] = {}
            # another process may have moved chunks since this dataset was opened (and may
            # move them again while they are read): ask the catalog where they are now
            out_of_copies = [
                i
                for i, tried in pending.items()
                if self._may_look_again(i, refreshes, moving)
                and not self._untried(keys[i], tried, gone.get(i))
            ]
            if out_of_copies:
                refreshes.update(out_of_copies)
                moving.difference_update(out_of_copies)
                changed = set(self._refresh([keys[i] for i in out_of_copies]))
                if len(changed) < len(out_of_copies):
                    # Rows the same as the catalog's: another process may have put the copy
                    # back where it was found missing, or this process learned its new
                    # bytes since they were read (rows this look cannot see change). Read
                    # every copy again, a moment later each time.
                    time.sleep(self.REREAD_PAUSE * max(refreshes[i] for i in out_of_copies))
                for j, i in enumerate(out_of_copies):
                    pending[i] = set()
                    corrupt.pop(i, None)  # (each read again says again what it found)
                    blocked.pop(i, None)
                    gone.pop(i, None)
                    if j in changed:
                        moving.add(i)
            for i, tried in list(pending.items()):
                copies = self._untried(keys[i], tried, gone.get(i))
                if not copies:
                    if i not in out_of_copies and self._may_look_again(i, refreshes, moving):
                        continue  # (its copies changed since the look above: look again)
                    if i not in probed and self._recheck_tiers_of(keys[i]):
                        probed.add(i)  # (a tier holding a copy answers again: read it there)
                        pending[i] = set()
                        continue
                    if i in blocked and not corrupt.get(i):
                        raise ObjectError(f"chunk {keys[i]!r} of {self.name!r}: {blocked[i]}")
                    raise self._lost(
                        keys[i], corrupt.get(i, []), refreshes[i], i in moving, gone.get(i)
                    )
                groups.setdefault(copies[0].tier, []).append((i, copies[0]))
            for tier_name, wanted in groups.items():
                self._read_group(
                    self.tiers[tier_name],
                    keys,
                    wanted,
                    out,
                    pending,
                    corrupt,
                    served,
                    gone,
                    blocked,
                )
        self.res.touch([keys[i] for i in need])
        return out

    def read_span(
        self, key: str, offset: int, out: memoryview, *, nowait: bool = False
    ) -> int | None:
        """Read ``len(out)`` bytes of chunk ``key`` from ``offset`` into ``out`` and return the
        chunk's size, None for a chunk never written (the verified-once rule of the class
        doc). With ``nowait``, raise :class:`BlockingIOError` where the bytes would have to
        wait on storage, or where the copy must first be read whole and checked."""
        return self.read_span_versioned(key, offset, out, nowait=nowait)[0]

    def chunk_versions(self, keys: Sequence[str]) -> list[Version | None]:
        """Per key, the version of the object a read would take the chunk from: the tier's
        location and the object's version there (None where the chunk has no readable copy,
        a put of it is in flight, or the tier keeps no versions)."""
        self._check_open()
        checked = self._still_checked_many(keys)
        # the usual case, every chunk's copy checked before on one tier: one call, no
        # grouping
        first = checked[0] if checked else None
        if first is not None and all(c is not None and c.tier is first.tier for c in checked):
            backend = first.tier.backend
            try:
                got = backend.versions([c.obj for c in checked])
            except (OSError, StrataError):
                return [None] * len(keys)  # (the read says what is wrong)
            if got is None:
                return [None] * len(keys)
            url = backend.url
            return [None if v is None else (url, *v) for v in got]
        out: list[Version | None] = [None] * len(keys)
        by_tier: dict[str, tuple[list[int], list[str]]] = {}
        # the copy a read takes: the one checked before while the chunk's stamp holds (as
        # the read's own fast path decides), else the fastest readable one
        rest = []
        for i, c in enumerate(checked):
            if c is not None:
                batch = by_tier.get(c.tier.name)
                if batch is None:
                    batch = by_tier[c.tier.name] = ([], [])
                batch[0].append(i)
                batch[1].append(c.obj)
            else:
                rest.append(i)
        for i, (copy, _) in zip(rest, self.res.fastest_readable_many([keys[i] for i in rest])):
            if copy is not None:
                idx, objs = by_tier.setdefault(copy.tier, ([], []))
                idx.append(i)
                objs.append(object_key(self.name, keys[i]))
        for name, (idx, objs) in by_tier.items():
            backend = self.tiers[name].backend
            try:
                got = backend.versions(objs)
            except (OSError, StrataError):
                continue  # (the read says what is wrong)
            if got is None:
                continue
            for i, v in zip(idx, got):
                out[i] = None if v is None else (backend.url, *v)
        return out

    @property
    def cache_space(self) -> Hashable:
        # (the catalog names the dataset: two catalogs' datasets of one name are two arrays,
        # which would otherwise push each other's chunks out of the cache at every read)
        catalog = self.commit.catalog
        return (
            "tiered",
            catalog.url if catalog is not None else self.commit.catalog_url,
            self.name,
        )

    def read_span_versioned(
        self, key: str, offset: int, out: memoryview, *, nowait: bool = False
    ) -> tuple[int | None, Version | None]:
        """:meth:`read_span`, and the version (as :meth:`chunk_versions`) of the object the
        bytes came from, None where they came from elsewhere (memory, a whole read with
        failover)."""
        if self._closed:
            self._check_open()
        self._recheck_faster((key,))
        mem = self._in_memory((key,))
        if mem:
            self.confirm_rows(mem)
        return self._read_span(key, offset, out, nowait)

    def _read_span(
        self, key: str, offset: int, out: memoryview, nowait: bool
    ) -> tuple[int | None, Version | None]:
        """:meth:`read_span_versioned`, the rows of a chunk served from memory made current
        before (:meth:`confirm_rows`)."""
        (hit,) = self.cache.get_many(self.name, (key,), self.res.names_bytes)
        if hit is not None:
            return _copy_span(hit, offset, out), None
        checked = self._still_checked(key)
        if checked is not None:
            try:
                size, version = checked.tier.backend.readinto_range_versioned(
                    checked.obj, offset, out, nowait=nowait
                )
            except BlockingIOError:
                raise
            except (OSError, StrataError):
                version = None  # moved or gone: the checks below find where it is now
            if version == checked.version:
                self.res.touch((key,))
                return size, (checked.tier.backend.url, *version)
        copy, busy, stamp = self.res.fastest_readable(key)
        if copy is None:
            if self.res.copies(key) or self.disabled:
                return _copy_span(self._whole(key), offset, out), None  # raises with the reason
            return None, None
        tier = self.tiers[copy.tier]
        obj = object_key(self.name, key)
        seen = self._verified.get((key, copy.tier))
        # (an archive copy is staged and read from disk, checked or not, as in a batch)
        if seen is not None and copy.accepts(seen[0]) and not busy and tier.role != "remotetape":
            try:
                # (the version is taken after the read: a copy replaced or written before or
                # during it has a new one)
                size, version = tier.backend.readinto_range_versioned(
                    obj, offset, out, nowait=nowait
                )
                if version == seen[1]:
                    self._checked[key] = _Checked(stamp, tier, obj, version)
                    self.res.touch((key,))
                    return size, (tier.backend.url, *version)
            except BlockingIOError:
                raise
            except (OSError, StrataError):
                pass  # moved or gone: the whole read below finds where it is now
            self._verified.pop((key, copy.tier), None)
        self._checked.pop(key, None)
        if tier.role != "remotetape" and not self.res.busy(key):
            # the first read of this copy: read it whole (nowait like the range reads, so a
            # copy off the page cache is fetched in the background) and check it
            whole = np.empty(copy.nbytes, dtype=np.uint8)  # (no zeros to write first)
            reader = tier.backend.readinto_range_versioned
            try:
                if nowait:  # (not through the tier's slots: it never waits, and a refusal
                    # to wait is no failure of the tier)
                    size, version = reader(obj, 0, memoryview(whole), nowait=True)
                else:
                    size, version = tier.call(reader, obj, 0, memoryview(whole))
            except BlockingIOError:
                raise
            except (OSError, StrataError):
                size = version = None  # moved or gone: the whole read below says where
            if self._check_whole(key, copy, stamp, whole, size, version):
                self.res.touch((key,))
                # (a tier without versions has its copies checked on every read)
                seen_as = None if version is None else (tier.backend.url, *version)
                return _copy_span(whole, offset, out), seen_as
        if nowait:
            raise BlockingIOError(key)
        return _copy_span(self._whole(key), offset, out), None

    def read_spans_versioned(
        self,
        keys: Sequence[str],
        offsets: Sequence[int],
        outs: Sequence[memoryview],
        *,
        nowait: bool = False,
    ) -> list[tuple[int | None, Version | None] | BlockingIOError]:
        """:meth:`read_span_versioned` of each key, the usual cases in one batch read per
        tier (:meth:`Backend.readinto_ranges_versioned`): a copy checked before, read in
        range under the version it was checked in (here, or by another process: its first
        read here takes that version from the check), and a copy's first read, read whole
        and checked. Every other case, and a read whose version or checksum does not hold,
        goes through :meth:`read_span_versioned` on its own."""
        if self._closed:
            self._check_open()
        self.res.learn(keys)  # (before the fast path: the checks come with the rows)
        self._recheck_faster(keys)
        checks = self._still_checked_many(keys)
        mem = self._in_memory(keys, checks)
        if mem and self.confirm_rows(mem):
            checks = self._still_checked_many(keys)  # (rows refreshed: their stamps moved)
        got: list[Any] = [None] * len(keys)
        # per tier: the tier, [position, kind, what the read must match, whole buffer], and
        # the reads' objects, offsets and buffers (appended in line: this loop runs per chunk)
        batches: dict[str, tuple[Tier, list[tuple[int, str, Any, Any]], list, list, list]] = {}
        alone: list[int] = []
        first: list[int] = []
        hits = self.cache.get_many(self.name, keys, self.res.names_bytes) if mem else None
        for j, checked in enumerate(checks):
            hit = None if hits is None else hits[j]
            if hit is not None:
                got[j] = (_copy_span(hit, offsets[j], outs[j]), None)
                continue
            if checked is not None:
                tier = checked.tier
                batch = batches.get(tier.name)
                if batch is None:
                    batch = batches[tier.name] = (tier, [], [], [], [])
                batch[1].append((j, "range", checked, None))
                batch[2].append(checked.obj)
                batch[3].append(offsets[j])
                batch[4].append(outs[j])
            else:
                first.append(j)
        if first:
            self._add_first_reads(keys, offsets, outs, first, batches, alone)
        touched = []
        for tier, items, objs, offs, views in batches.values():
            reader = tier.backend.readinto_ranges_versioned
            # (a nowait batch not through the tier's slots: it never waits, and a refusal to
            # wait is no failure of the tier)
            try:
                reads = (
                    reader(objs, offs, views, nowait=True)
                    if nowait
                    else tier.call(reader, objs, offs, views)
                )
            except (OSError, StrataError):
                # (the tier went down meanwhile, say): each read alone fails over
                alone.extend(item[0] for item in items)
                continue
            url = tier.backend.url
            for (j, kind, want, whole), r in zip(items, reads):
                if isinstance(r, BaseException):
                    if isinstance(r, BlockingIOError):
                        got[j] = r
                        continue
                    if not isinstance(r, OSError | StrataError):
                        raise r
                    alone.append(j)  # moved or gone: the read alone finds where it is now
                    continue
                size, version = r
                key = keys[j]
                if kind == "range":
                    if version == want.version:
                        touched.append(key)
                        got[j] = (size, (url, *version))
                        continue
                elif kind == "seen":
                    seen_version, at, obj = want
                    if version == seen_version:
                        self._checked[key] = _Checked(at, tier, obj, version)
                        touched.append(key)
                        got[j] = (size, (url, *version))
                        continue
                    # (replaced since: read whole, alone)
                    self._verified.pop((key, tier.name), None)
                elif version is not None and self._check_whole(key, *want, whole, size, version):
                    touched.append(key)
                    if whole is not outs[j]:
                        _copy_span(whole, offsets[j], outs[j])
                    got[j] = (size, (url, *version))
                    continue
                alone.append(j)
        if touched:
            self.res.touch(touched)
        for j in alone:
            try:
                got[j] = self._read_span(keys[j], offsets[j], outs[j], nowait)
            except BlockingIOError as exc:
                got[j] = exc
        return got

    def _add_first_reads(
        self,
        keys: Sequence[str],
        offsets: Sequence[int],
        outs: Sequence[memoryview],
        first: list[int],
        batches: dict[str, tuple[Tier, list[tuple[int, str, Any, Any]], list, list, list]],
        alone: list[int],
    ) -> None:
        """Add to ``batches`` the first read of each chunk at positions ``first``: its
        fastest copy read in range where a check of it is known (:attr:`_verified`: the
        read must find the object at the version checked), else read whole, to be checked
        (into the caller's buffer when that is the whole chunk, else into one spare buffer
        for them all); a chunk whose copy a batch cannot read (none, an archive tier, a
        tier down or without versions) to ``alone``."""
        tiers, name, verified = self.tiers, self.name, self._verified
        eligible: dict[str, bool] = {}  # per tier: whether a batch reads its copies
        spare: list[tuple[int, ChunkCopy, int, tuple]] = []  # (j, copy, stamp, batch)
        spare_bytes = 0
        looks = self.res.fastest_readable_many([keys[j] for j in first])
        for j, (copy, at) in zip(first, looks):
            if copy is None:
                alone.append(j)
                continue
            ok = eligible.get(copy.tier)
            if ok is None:
                tier = tiers[copy.tier]
                ok = eligible[copy.tier] = (
                    tier.role != "remotetape" and tier.up and tier.keeps_versions
                )
            if not ok:
                alone.append(j)
                continue
            batch = batches.get(copy.tier)
            if batch is None:
                batch = batches[copy.tier] = (tiers[copy.tier], [], [], [], [])
            out = outs[j]
            seen = verified.get((keys[j], copy.tier))
            if seen is not None and copy.accepts(seen[0]):
                obj = object_key(name, keys[j])
                batch[1].append((j, "seen", (seen[1], at, obj), None))
                batch[2].append(obj)
                batch[3].append(offsets[j])
                batch[4].append(out)
            elif offsets[j] == 0 and len(out) == copy.nbytes:
                batch[1].append((j, "whole", (copy, at), out))
                batch[2].append(object_key(name, keys[j]))
                batch[3].append(0)
                batch[4].append(out)
            else:
                spare.append((j, copy, at, batch))
                spare_bytes += copy.nbytes
        if not spare:
            return
        # one spare buffer for them all: this thread's, its pages mapped already, where that
        # is small enough to keep (a fresh buffer per small chunk cost more in page faults
        # than the chunk's read), else a fresh one
        if spare_bytes <= _SPARE_KEEP:
            view = memoryview(scratch(spare_bytes, "tiered whole reads"))
        else:
            view = memoryview(np.empty(spare_bytes, dtype=np.uint8))
        start = 0
        for j, copy, at, batch in spare:
            whole = view[start : start + copy.nbytes]
            start += copy.nbytes
            batch[1].append((j, "whole", (copy, at), whole))
            batch[2].append(object_key(name, keys[j]))
            batch[3].append(0)
            batch[4].append(whole)

    def _check_whole(
        self, key: str, copy: ChunkCopy, stamp: int, whole: Any, size: int | None, version: Any
    ) -> bool:
        """Whether ``whole`` (the ``size`` bytes of one read of ``copy``, as ``version``) is
        that copy: its catalogued checksum accepts the bytes and the chunk's stamp is still
        ``stamp`` (no put or move replaced the copy meanwhile). A copy with a version is
        then verified (the verified-once rule)."""
        if size != copy.nbytes:
            return False
        digest = accepts_data(copy, whole)
        if digest is None or self.res.stamp(key) != stamp:
            return False
        if version is not None:
            self._note_check(key, copy.tier, digest, version)
        return True

    def _moved_checked(self, copy: ChunkCopy, version: Version) -> None:
        """A move (a stage, migrate, prefetch or write-back) put ``copy`` as the object of
        ``version`` and read it back intact: the copy is verified, so the first read of it
        reads in range (where it is still that version)."""
        self._note_check(copy.key, copy.tier, copy.checksum, version)

    def _note_check(
        self, key: str, tier: str, digest: str, version: Version, *, record: bool = True
    ) -> None:
        """Chunk ``key``'s copy on ``tier`` held bytes of checksum ``digest`` as the object
        of ``version``: kept for later reads, and, with ``record``, for the catalog where the
        tier outlives the process (:meth:`record_checks`).

        Without ``record``, the check is this process's own: its put of the copy, whose
        bytes and object version it knows from the put itself. Its next read of the chunk
        (a write's read-modify-write, say) then reads in range; a whole read right after the
        put would only compare the page cache with the buffer just written. Another process
        still reads the copy whole once, which, from the disk, is what finds bytes that
        decayed since."""
        self._verified[key, tier] = (digest, version)
        self.checks_made += 1
        if not record:
            self._unrecorded.discard((key, tier))
        elif not self.tiers[tier].volatile:
            self._unrecorded.add((key, tier))

    def _in_memory(
        self, keys: Sequence[str], checks: Sequence[_Checked | None] | None = None
    ) -> list[str]:
        """Those of ``keys`` a read may serve from memory: held in the prefetch cache, with
        a copy on a memory tier, or with no copy at all (its fill value). ``checks``:
        :meth:`_still_checked` of each (a chunk whose checked copy holds is read there, never
        on a memory tier: adding a copy moves the chunk's stamp)."""
        out = self.cache.holding(self.name, keys)
        rest = keys if checks is None else [k for k, c in zip(keys, checks) if c is None]
        if rest:
            if self._volatile:
                out += self.res.in_memory(rest)
            # (a chunk with no copy is read as its fill value from what this process knows
            # alone: another process's first write of it shows in no object read)
            out += self.res.without_copies(rest)
        return out

    def confirm_rows(self, keys: Sequence[str]) -> bool:
        """Make the rows of chunks ``keys``, to be served from memory (the prefetch cache, a
        memory tier), the catalog's rows now, where it moved on since they were learned or
        last confirmed: True if rows were read again (:meth:`Residency.refresh_from`, which
        forgets the memory-tier copies of chunks whose content changed; a prefetch-cache
        entry is taken only while the rows accept its bytes).

        A read from storage finds another process's rewrite through the object it reads (a
        new version, bytes that fail the checksum); a copy held in memory shows none. The
        catalog's generation of the dataset (:meth:`Catalog.generation`, one small query)
        moves on with every commit that changes its rows, so rows learned or confirmed at
        the generation it still has are current. Only where this process holds the catalog
        and the dataset is opened serially: a parallel job's ranks agree on the rows at open
        and close."""
        catalog = self.commit.catalog
        if catalog is None or self.commit.comm is not None or not keys:
            return False
        now = catalog.generation(self.name)
        confirmed = self._confirmed
        if now is None:  # (the dataset is gone from the catalog)
            stale = list(keys)
        else:
            since = self.learned_since() if self.learned_since is not None else None
            stale = [k for k in keys if confirmed.get(k, since) != now]
            if not stale:
                return False
        self.res.refresh_from(catalog, stale)
        if now is not None:
            for k in stale:
                confirmed[k] = now
        return True

    def _still_checked(self, key: str) -> _Checked | None:
        """The copy of ``key`` a range read last found verified, while nothing about the
        chunk's copies changed since (its residency stamp) and its tier is up."""
        checked = self._checked.get(key)
        if checked is not None and checked.stamp == self.res.stamp(key) and checked.tier.up:
            return checked
        return None

    def _still_checked_many(self, keys: Sequence[str]) -> list[_Checked | None]:
        """:meth:`_still_checked` of each of ``keys``, in one call (a read's per-chunk loop)."""
        get = self._checked.get
        up: dict[Tier, bool] = {}  # (one health look per tier, not per chunk)
        out: list[_Checked | None] = []
        for key, stamp in zip(keys, self.res.stamps(keys)):
            checked = get(key)
            if checked is None or checked.stamp != stamp:
                out.append(None)
                continue
            ok = up.get(checked.tier)
            if ok is None:
                ok = up[checked.tier] = checked.tier.up
            out.append(checked if ok else None)
        return out

    def verified_chunks(self) -> set[str]:
        """Keys of the chunks a copy of which is known checked (the verified-once rule): read
        whole and checked here, read back by a move, or taken over from the catalog."""
        return {key for key, _ in self._verified}

    def forget_checks(self, *, reload: bool = False, record: bool = False) -> None:
        """Forget every copy checked so far: the next read of each chunk reads its copy whole
        and checks it again, as the first read after its write does. With ``reload``, the
        checks first go to the catalog (as with ``record``) and are then taken from it again
        for the chunks whose rows the residency holds (:meth:`record_checks`)."""
        if reload or record:
            self.record_checks()
        self._verified.clear()
        self._checked.clear()
        self._unrecorded.clear()
        if reload:
            self._load_checks()

    def verified(self) -> dict[tuple[str, str], tuple[str, Any]]:
        """The copies this store found, or took from the catalog, as checked: per
        ``(key, tier)``, the checksum of the bytes checked and the object's version then."""
        return dict(self._verified)

    def forget_learned(self) -> None:
        """Leave this store as a process opening the dataset anew finds it: the checks found
        so far recorded in the catalog, then forgotten here, and the catalog rows learned of
        each chunk with nothing of this process's own in flight forgotten too
        (:meth:`Residency.unlearn`): the next read of a chunk learns its rows and recorded
        checks again."""
        self.forget_checks(reload=False, record=True)
        self.res.unlearn()

    def record_checks(self) -> None:
        """Record in the catalog the copies this process found intact (read whole and
        checked, or read back by a move) since it last did (:meth:`Catalog.record_verified`;
        at flush and close): a process opening the dataset later reads those copies in range
        at once. The records are advice, so a catalog that refuses them (read-only, say)
        costs only that speed."""
        catalog = self.commit.catalog
        if catalog is None or not self._unrecorded:
            return
        marks = []
        while self._unrecorded:  # (pop: reads on other threads may add meanwhile)
            key, tier = self._unrecorded.pop()
            seen = self._verified.get((key, tier))
            if seen is not None:
                marks.append(VerifiedCopy(key, tier, *seen))
        with contextlib.suppress(StrataError):
            catalog.record_verified(self.name, marks)

    def _load_checks(
        self,
        keys: Sequence[str] | None = None,
        checks: Iterable[VerifiedCopy] | Mapping[tuple[str, str], tuple[str, Any]] | None = None,
    ) -> None:
        """Take over the checks the catalog records for the copies of chunks ``keys`` (those
        whose rows the residency holds where None), ``checks`` where the query of their rows
        brought them already (else one query; a mapping as :attr:`_verified` where a
        session's memo kept them): the first read of such a copy, while its row still
        accepts the bytes checked, reads it in range and takes it as checked where it finds
        its object at the version checked (else reads it whole)."""
        catalog = self.commit.catalog
        if catalog is None:
            return
        if checks is None:
            if keys is None:
                keys = self.res.learned_keys()
            if keys is not None and not keys:
                return
            checks = catalog.verified_copies(self.name, keys)
        known, verified = self.tiers.names, self._verified
        if isinstance(checks, Mapping):
            for slot, seen in checks.items():
                if slot[1] in known:
                    verified.setdefault(slot, seen)
            return
        for v in checks:
            if v.tier in known:
                verified.setdefault((v.key, v.tier), (v.checksum, v.version))

    def _whole(self, key: str) -> BytesLike:
        """Chunk ``key`` read whole through :meth:`get_chunks` (every rule of a read: staging,
        failover, catalog refresh, errors naming the copies)."""
        blob = self.get_chunks([key])[0]
        if blob is None:
            raise NotFoundError(f"chunk {key!r} of {self.name!r} has no copy")
        return blob

    def _untried(self, key: str, tried: set[str], gone: ChunkCopy | None) -> list[ChunkCopy]:
        """The readable copies of ``key`` on tiers not ``tried``, fastest first; where a copy
        was found ``gone``, only those of its bytes."""
        copies = [c for c in self.res.readable(key) if c.tier not in tried]
        if gone is not None:
            copies = [c for c in copies if same_bytes(c, gone)]
        return copies

    def _read_group(
        self,
        tier: Tier,
        keys: Sequence[str],
        wanted: list[tuple[int, ChunkCopy]],
        out: list[BytesLike | None],
        pending: dict[int, set[str]],
        corrupt: dict[int, list[str]],
        served: list[str | None] | None,
        gone: dict[int, ChunkCopy],
        blocked: dict[int, ObjectError],
    ) -> None:
        objs = [object_key(self.name, keys[i]) for i, _ in wanted]
        try:
            blobs: list[Any] = tier.call(tier.backend.get_many, objs)
        except TierDownError:
            return  # the down tier is now filtered out of readable()
        except ObjectError:
            # (one object that cannot be used stops the batch: each read alone, the others'
            # bytes are read, and its copy is tried no more)
            blobs = []
            for obj in objs:
                try:
                    blobs.append(tier.call(tier.backend.get, obj))
                except NotFoundError:
                    blobs.append(None)
                except ObjectError as exc:
                    blobs.append(exc)
                except TierDownError:
                    return
        for (i, copy), blob in zip(wanted, blobs):
            if isinstance(blob, ObjectError):
                blocked[i] = blob
            elif blob is None:
                # catalogued but missing: forget the copy and read another of its bytes
                if self.res.drop_missing(copy) or not self.res.is_current(copy):
                    continue
                gone.setdefault(i, copy)  # (no other copy holds its bytes)
            elif accepts_data(copy, blob) is not None:
                out[i] = blob
                del pending[i]
                if served is not None:
                    served[i] = tier.backend.url
                continue
            elif self.res.busy(keys[i]) and self.res.wait_quiet(keys[i]):
                continue  # read while a put replaced it: read again once it is recorded
            elif self.res.is_current(copy):
                corrupt.setdefault(i, []).append(
                    f"{tier.name} holds {checksum_like(copy.checksum, blob)}, "
                    f"recorded {copy.checksum}"
                )
            else:
                continue  # replaced while it was read: read the new copy
            pending[i].add(tier.name)

    def _may_look_again(self, i: int, refreshes: Counter[int], moving: set[int]) -> bool:
        """Whether a read may ask the catalog again for the chunk at position ``i``: fewer
        lookups than :attr:`REFRESHES` so far, or than :attr:`REFRESHES_WHILE_CHANGING`
        where its last lookup found its rows changed."""
        limit = self.REFRESHES_WHILE_CHANGING if i in moving else self.REFRESHES
        return refreshes[i] < limit

    def _recheck_faster(self, keys: Sequence[str]) -> None:
        """Probe again (:meth:`Tier.recheck`) each tier marked down, and due for a probe,
        that holds a copy of one of ``keys`` faster than every readable copy on a tier that
        is up, so reads return to the fastest copy once its tier answers, as writes return
        to their home tier; one that answers ends the range reads of copies checked on
        slower tiers (:meth:`_still_checked`). Nothing to do while no tier is marked down."""
        for t in self.tiers:  # (the usual case, every tier up, at the cost of a look each)
            if t.state != "up":
                break
        else:
            return
        due = [t for t in self.tiers if t.probe_due() and not t.volatile]
        if not due:
            return
        names = {t.name for t in due}
        probe: set[str] = set()
        for key in keys:
            for c in self.res.readable(key, up_only=False):
                if c.tier not in self.tiers or self.tiers[c.tier].up:
                    break  # (the copy read: none slower is of use)
                if c.tier in names:
                    probe.add(c.tier)
            if probe == names:
                break
        back = [t for t in due if t.name in probe and t.recheck()]
        if back:
            self._checked.clear()  # (their copies are read again, in range where checked)

    def _down_tiers_of(self, key: str) -> list[Tier]:
        """The tiers, marked down, that hold a copy of ``key``."""
        held = {c.tier for c in self.res.copies(key)}
        return [t for t in self.tiers if not t.up and t.name in held]

    def _recheck_tiers_of(self, key: str) -> bool:
        """Probe again the down tiers holding copies of ``key`` (each at most every
        :attr:`Tier.RECHECK_S`); True if one of them answers now."""
        return any([t.recheck() for t in self._down_tiers_of(key)])

    def _refresh(self, keys: list[str]) -> list[int]:
        """Reload the copies of chunks ``keys`` from the catalog (one query; where this
        process holds one): positions in ``keys`` of the chunks whose copies changed."""
        catalog = self.commit.catalog
        if catalog is None:
            return []
        # a put of a chunk in flight here (a write-back that found the copy missing too) is
        # waited out first: only a chunk with nothing in flight is refreshed
        quiet = [k for k in keys if self.res.wait_quiet(k)]
        changed = set(self.res.refresh_from(catalog, quiet))
        return [i for i, k in enumerate(keys) if k in changed]

    def _lost(
        self,
        key: str,
        corrupt: list[str],
        looks: int,
        moving: bool,
        gone: ChunkCopy | None = None,
    ) -> StrataError:
        """The error of a read of chunk ``key`` that found no intact copy (``corrupt``: the
        copies read whose bytes failed their checksum), after ``looks`` lookups in the
        catalog, the last of which found the chunk's rows changed where ``moving``; ``gone``:
        a copy found missing whose bytes no other copy holds."""
        if moving and looks > self.REFRESHES:
            return ChunkChangedError(
                f"chunk {key!r} of dataset {self.name!r} changed {looks} times while it was "
                "read: another process is rewriting or moving it, and each copy read was of a "
                "version the catalog no longer listed (nothing is damaged); read it again, or "
                "let the writer flush before this process reads"
            )
        if gone is not None and not corrupt:
            return self.res.missing_copy_error(key, gone)
        if corrupt:
            return ChecksumError(
                f"chunk {key!r} of dataset {self.name!r}: every copy read fails the checksum "
                f"the catalog recorded ({'; '.join(corrupt)}); run 'strataio fsck'"
            )
        where = ", ".join(f"{c.tier}({c.state})" for c in self.res.copies(key)) or "none"
        down = [t.name for t in self.tiers if not t.up]
        held = self._down_tiers_of(key)
        if held and not corrupt:
            said = "; ".join(f"{t.name}: {t.last_error}" for t in held)
            return BackendError(
                f"chunk {key!r} of {self.name!r}: its copies are on tiers that are down "
                f"({said}; catalogued copies: {where}); the catalog still records them "
                f"there: read again once they answer (a read probes a down tier again after {Tier.RECHECK_S:g} s, "
                "less often while it stays down; 'strataio tiers --check' probes them at once)"
            )
        return BackendError(
            f"chunk {key!r} of {self.name!r}: no readable intact copy (catalogued copies: "
            f"{where}; tiers down: {', '.join(down) or 'none'}); run 'strataio fsck'"
        )

    def _learn_rows_on(self, tier: Tier, keys: list[str]) -> None:
        """Before chunks ``keys`` are put on ``tier``: where this process knows a chunk on
        other tiers only, another process may have copied it to ``tier`` since (a stage, say): learn
        its rows from the catalog (one query per few hundred keys), so the put is announced
        as the rewrite of that copy it is, and no move of that copy deletes the new
        bytes."""
        if self.commit.catalog is None:
            return
        elsewhere = self.res.elsewhere_only(keys, tier.name)
        if elsewhere:
            self.res.refresh_from(self.commit.catalog, elsewhere)

    def _stage_from_archive(self, keys: list[str]) -> None:
        archive = [
            k
            for k in keys
            if (c := self.res.readable(k)) and self.tiers[c[0].tier].role == "remotetape"
        ]
        if archive:
            # failures leave the archive copy, which the read then uses directly
            self.mover.stage(self.res, archive).result()

    # ----------------------------------------------------------------- writes
    def put_chunks(self, items: Sequence[tuple[str, BytesLike]]) -> None:
        self._check_open()
        if not items:
            return
        # (the objects a claim's eviction must spare: this write's own)
        protect = [validate_key(object_key(self.name, k)) for k, _ in items]
        if self.disabled:
            return  # DISABLE: accepted and dropped
        try:
            home = self.placement.home(self.hint, self.chosen)
        except HintError as exc:  # (its role left the configuration: nothing is written)
            raise HintError(f"dataset {self.name!r} not written: {exc}") from exc
        keys = [k for k, _ in items]
        self.cache.invalidate(self.name, keys)
        self.res.learn(keys)
        # in a parallel job no write evicts: the ranks write at once, each knowing only the
        # copies it was told of, so one rank's eviction would delete or write back copies
        # another is rewriting or reading; a full tier sends the chunks on to the next tier
        evict = self.commit.comm is None
        todo = [(k, memoryview(v).cast("B")) for k, v in items]
        errors: list[str] = []
        too_small: dict[str, int] = {}  # tier -> the largest chunk it could never hold
        # chunks something not of ours is in the way of on a tier: not tried elsewhere, and
        # the write's other chunks go on (those with no room there too) before it raises
        blocked: dict[str, ObjectError] = {}
        for tier in self.placement.write_order(self.hint, self.chosen):
            if not todo or not tier.up:
                continue
            self._learn_rows_on(tier, sorted(k for k, _ in todo))
            # the bytes claimed per chunk; the map also names this write's counts of room
            fits, rest, room = [], [], {}
            try:
                for k, v in todo:
                    # a rewrite of the copy there needs room only for what it adds (the
                    # residency keeps that copy's room for it while the rewrite is on)
                    need = max(0, len(v) - self.res.count_room(k, tier.name, room))
                    if self.placement.claim(tier, need, protect=protect, evict=evict):
                        fits.append((k, v))
                        room[k] = need
                    else:
                        tier.release(self.res.end_count(k, tier.name, room))
                        rest.append((k, v))
                        if tier.capacity is not None and len(v) > tier.capacity:
                            too_small[tier.name] = max(too_small.get(tier.name, 0), len(v))
            except BaseException:
                for k, _ in todo:
                    tier.release(room.get(k, 0) + self.res.end_count(k, tier.name, room))
                raise
            todo = rest + self._put_on(tier, fits, home, errors, room, blocked)
        if todo or blocked:
            # (the chunks that fitted are stored: room is claimed tier by tier, and a claim may
            # first evict other chunks, so a write cannot know beforehand that all will fit)
            left = sorted(k for k, _ in todo)
            errors += [
                f"tier {name!r} holds {self.tiers[name].capacity} bytes in all, less than "
                f"a chunk of {n} bytes"
                for name, n in too_small.items()
            ]
            if blocked:
                raise self._blocked_write(blocked, left, errors, len(items))
            raise ChunksNotStoredError(
                f"dataset {self.name!r}: {len(todo)} of {counted(len(items), 'chunk')} could "
                f"not be stored on any tier the hint {self.hint} allows "
                f"({'; '.join(errors) or self._why_no_room()}); "
                f"{_the_others_written(len(items) - len(todo))}, and {_few(left)} "
                f"{'keeps its previous value' if len(left) == 1 else 'keep their previous values'}",
                left,
            )

    def _why_no_room(self) -> str:
        """Why a write stored no more chunks on the tiers its hint allows, each named with
        its condition (down, read-only, or up and out of room)."""
        return "; ".join(
            f"tier {t.name!r} " + ("full" if t.condition == "up" else t.condition)
            for t in self.placement.persistent()
        )

    def _blocked_write(
        self, blocked: dict[str, ObjectError], left: list[str], errors: list[str], n: int
    ) -> ObjectError:
        """The error of a write some of whose chunks something is in the way of
        (``blocked``), ``left`` the others not stored, ``errors`` why, of ``n`` chunks."""
        first, *others = sorted(blocked)
        msg = f"chunk {first!r} of dataset {self.name!r} not written: {blocked[first]}"
        if others:
            msg += f"; nor, something in their way too, {_few(others)}"
        if left:
            msg += (
                f"; nor {_few(left)}, stored on no "
                f"tier the hint {self.hint} allows ({'; '.join(errors) or self._why_no_room()})"
            )
        missed = len(blocked) + len(left)
        msg += f"; {_the_others_written(n - missed, n)}, and " + (
            "the one not stored keeps its previous value"
            if missed == 1
            else f"the {missed} not stored keep their previous values"
        )
        err = ObjectError(msg, sorted([*blocked, *left]))
        err.__cause__ = blocked[first]
        return err

    def _put_on(
        self,
        tier: Tier,
        items: list[tuple[str, memoryview]],
        home: Tier | None,
        errors: list[str],
        room: dict[str, int],
        blocked: dict[str, ObjectError],
    ) -> list[tuple[str, memoryview]]:
        """Put ``items`` on ``tier`` (``room[key]`` bytes reserved for each, besides the room
        of a copy there it replaces, counted with ``room`` as the owner:
        :meth:`Residency.count_room`); return the ones that failed because the tier went
        down, and add to ``blocked`` those something is in the way of (by key). However it
        ends, nothing of this reserved room stays held."""
        if not items:
            return []
        state = "valid" if home is None or tier is home else "dirty"
        now = time.time()
        keys = sorted(k for k, _ in items)  # one order for every writer: no deadlock
        begun: list[str] = []
        recorded: set[str] = set()
        futures: list[Any] = []
        outcomes: list[BaseException | None] | None = None
        try:
            sums = [checksum(v) for _, v in items]
            # (again: the claims before may have taken a while, and another process may
            # have copied a chunk here meanwhile)
            self._learn_rows_on(tier, keys)
            # A rewrite in place replaces the catalogued object before the catalog learns of
            # it. Announce it first (state in-transit, new and old checksum, one transaction
            # per batch): the object then holds one of two known versions, which reads and
            # fsck accept, and after a crash fsck can tell an interrupted rewrite from a
            # corrupt copy.
            for k in keys:
                self.res.begin_write(k, tier.name)
                begun.append(k)
            olds = {k: c for k, _ in items if (c := self.res.copy_on(k, tier.name)) is not None}
            over = self.commit.bytes_replaced(tier, self.name, list(olds.values()))
            # a row the catalog may hold for a copy already forgotten here keeps no old
            # checksum: those bytes are no version of the chunk to read back
            intents = {
                k: ChunkCopy(
                    self.name,
                    k,
                    tier.name,
                    len(v),
                    d,
                    "in-transit",
                    now,
                    over.get(k, olds[k].checksum if k in olds else ""),
                    self.commit.writer,  # (the writer an announcement names)
                )
                for (k, v), d in zip(items, sums)
                if self.res.catalogued(k, tier.name)
            }
            # in the residency first (for the copies it holds): a read meanwhile accepts
            # either version, and a commit from another thread records the announcement,
            # never the replaced row (rows of copies being put wait for the put's end). The
            # announced copy has the new size: the room claimed for it is in use from here
            for k in olds:
                # (a dead writer's row: the bytes its object holds, which the write replaces)
                self.res.announce_write(
                    intents[k], over.get(k, olds[k].committed_checksum), reserved=room[k]
                )
                room[k] = 0
            try:
                self._announce_rewrites(tier, intents, olds)
            except BaseException:
                for old in olds.values():
                    self.res.add(old)
                raise

            def one(k: str, v: memoryview, digest: str) -> None:
                okey = object_key(self.name, k)
                try:
                    if k in intents or self.res.holds_object(k, tier.name):
                        version = tier.call(tier.backend.put_versioned, okey, v)
                    else:
                        version = self._put_unannounced(tier, k, v, digest, now)
                except BaseException:
                    old = olds.get(k)
                    if old is not None and self.res.is_current(intents[k]):
                        self.res.add(old)  # the next commit restores the announced row
                    raise
                # recorded unsynced: whatever commit records it syncs it first, and checks
                # that no other process replaced the object meanwhile (by its version)
                copy = ChunkCopy(self.name, k, tier.name, len(v), digest, state, now)
                self.res.record_write(copy, reserved=room[k], version=version, owner=room)
                recorded.add(k)
                if version is not None:
                    self._note_check(k, tier.name, digest, version, record=False)

            work = [(k, v, d) for (k, v), d in zip(items, sums)]

            def run(part: list[tuple[str, memoryview, str]]) -> list[BaseException | None]:
                return [_outcome(one, *args) for args in part]

            # contiguous runs of puts, one per put thread (a hand-off per put costs more than
            # a small chunk's put); a single chunk is put here, with nothing to overlap
            runs = min(len(work), self.mover.put_workers)
            if runs == 1:
                outcomes = run(work)
            else:
                cut = [len(work) * r // runs for r in range(runs + 1)]
                for a, b in zip(cut, cut[1:]):
                    futures.append(self.mover.submit(run, work[a:b]))  # (each, as handed over)
                outcomes = [x for f in futures for x in f.result()]
        except BaseException:
            if outcomes is None:
                # (interrupted, or the announcement failed): the puts handed to other threads
                # end first, then the room of every chunk not recorded goes
                concurrent.futures.wait(futures)
                for k, _ in items:
                    if k not in recorded:
                        tier.release(room[k] + self.res.end_count(k, tier.name, room))
            raise
        finally:
            for k in begun:
                self.res.end_write(k, tier.name)
        failed, error = [], None
        for (k, v), exc in zip(items, outcomes):
            if exc is None:
                continue
            tier.release(room[k] + self.res.end_count(k, tier.name, room))
            if isinstance(exc, TierDownError):
                failed.append((k, v))
                errors.append(str(exc))
            elif isinstance(exc, ObjectError):
                blocked[k] = exc
            elif error is None:
                error = exc
        if error is not None:
            raise error
        return failed

    def _announce_rewrites(
        self,
        tier: Tier,
        intents: dict[str, ChunkCopy],
        olds: dict[str, ChunkCopy],
        seen: Mapping[str, tuple[str, str] | None] | None = None,
    ) -> None:
        """Announce the rewrites ``intents`` (key -> its ``in-transit`` row on ``tier``), each
        only over the catalog row this process knows there (:meth:`Residency.catalog_row`;
        unconditionally where it knows none), or the ``(state, checksum)`` the caller read
        there (``seen``; None: no row). Where another process changed one since
        (announced a rewrite of its own there, or recorded a copy), the row there now is
        learned, the intent names the bytes it replaces then, and it is announced again
        (``intents`` and ``olds``, the rows replaced, updated in place): an announcement over
        another live writer's it did not know named the wrong old bytes, and where that
        writer's put came last the row named neither version the object held (a
        ChecksumError to readers until a commit settled it, for good had that writer died).
        Raises :class:`ExistsError` where rows keep changing :data:`ANNOUNCE_TRIES` times."""
        seen = {
            **{k: row for k in intents if (row := self.res.catalog_row(k, tier.name))},
            **(seen or {}),
        }
        todo = list(intents)
        for _ in range(self.ANNOUNCE_TRIES):
            expect = {(self.name, k, tier.name): seen[k] for k in todo if k in seen}
            todo = self.commit.announce(
                self.res, [intents[k] for k in todo], expect or None, partly=True
            )
            if not todo:
                return
            rows = {c.key: c for c in self.commit.rows_now(self.name, todo) if c.tier == tier.name}
            over = self.commit.bytes_replaced(tier, self.name, list(rows.values()))
            for k in todo:
                now = rows.get(k)
                intents[k] = intents[k]._replace(
                    old_checksum=over.get(k, now.checksum if now is not None else "")
                )
                if now is None:
                    seen[k] = None  # (announced only where none is)
                    olds.pop(k, None)
                    continue
                seen[k] = (now.state, now.checksum)
                if k in olds:  # (as put_chunks announced it in the residency, anew)
                    self.res.announce_write(intents[k], over.get(k, now.committed_checksum))
                olds[k] = now
        one = len(todo) == 1
        raise ExistsError(
            f"dataset {self.name!r}: the {'row' if one else 'rows'} of "
            f"{'chunk' if one else 'chunks'} {_few(todo)} on tier {tier.name!r} changed "
            f"{self.ANNOUNCE_TRIES} times while this process announced its rewrite (other "
            f"processes rewriting {'it' if one else 'them'} at once); nothing was put: write "
            f"{'it' if one else 'them'} again"
        )

    def _put_unannounced(
        self, tier: Tier, key: str, data: memoryview, digest: str, now: float
    ) -> Version | None:
        """Put chunk ``key`` on ``tier``, where this process knows no copy and announced
        nothing: only as a new object (:meth:`Backend.put_new`). Where one is there after all
        (another process's copy recorded since this process last looked, perhaps being
        deleted by its move right now, or another process's put not recorded yet), the put
        is announced as a rewrite first (of the row there, if any), so that no deletion
        decided on that row takes the new bytes, and then replaces it."""
        okey = object_key(self.name, key)
        if self.commit.catalog is None:  # (in a parallel job: rank 0 alone holds the catalog)
            return tier.call(tier.backend.put_versioned, okey, data)
        try:
            return tier.call(tier.backend.put_new, okey, data)
        except ExistsError:
            pass
        rows = [c for c in self.commit.catalog.residency(self.name, [key]) if c.key == key]
        there = [c for c in rows if c.tier == tier.name]
        # announced even where no row names the object yet: a move's row for it recorded
        # after this announcement would replace it, and then that move, taking the object
        # for its own, could delete these bytes; the move's commit leaves its row out
        # instead (Catalog.commit: overtaken). With no row there, the object is a move's
        # copy of the chunk's committed value, or the put of a writer that has not recorded
        # it (or never will: killed): the bytes there are the old version, read to name them
        # As any rewrite's, the announcement is made only over the row read there: one over
        # another live writer's announcement names its new bytes as the ones replaced, and
        # the catalog notes it (that writer's put may land after this one's commit).
        if there:
            old = self.commit.bytes_replaced(tier, self.name, there[:1]).get(key, there[0].checksum)
        else:
            old = checksum_there(tier, self.name, key) or next(
                (c.checksum for c in rows if c.state != "in-transit"), ""
            )
        intent = ChunkCopy(
            self.name, key, tier.name, len(data), digest, "in-transit", now, old,
            self.commit.writer,
        )  # fmt: skip
        row = (there[0].state, there[0].checksum) if there else None
        self._announce_rewrites(tier, {key: intent}, {}, {key: row})
        return tier.call(tier.backend.put_versioned, okey, data)

    def delete_chunks(self, keys: Sequence[str]) -> None:
        self._check_open()
        self.cache.invalidate(self.name, keys)
        self.res.learn(keys)
        for k in keys:
            self.res.drop_chunk(k)

    def list_chunks(self) -> list[str]:
        self._check_open()
        return [] if self.disabled else self.res.chunk_keys()

    # ----------------------------------------------------------------- metadata
    def get_meta(self, record: DatasetRecord | None = None) -> bytes | None:
        """The ``zarr.json`` stored now (read each time: another handle, here or in another
        process, may have set attributes since): the first copy, on a persistent tier that
        answers, of a version the catalog record names, tiers marked down probed again
        where no tier that is up holds one; None where no tier that answers holds one, and
        always for a DISABLE dataset, which stores none. A copy of another version (a tier
        that was down when attributes were set) is not read as the current one, and is
        rewritten where it was read first (:class:`~strataio.tiers.meta.MetaCopies`, which
        says what happens where no tier that answers holds the current version).
        ``record``: the dataset's catalog record as just read (else read here)."""
        if self.disabled:
            return None
        return self.meta.get(record)

    def put_meta(self, data: bytes) -> None:
        """Write ``zarr.json`` durably to every persistent tier that answers and is not
        read-only, the catalog record naming its checksum as the current version
        (:meth:`MetaCopies.put`); a DISABLE dataset's is dropped, as its chunks are."""
        self._check_open()
        if self.disabled:
            return
        self.meta.put(data)

    def update_meta(self, change: Callable[[bytes | None], bytes]) -> None:
        """Put ``change(the zarr.json stored now)`` as :meth:`put_meta` does, one change at a
        time across the processes of the catalog (:meth:`MetaCopies.update`); a DISABLE
        dataset's change is made of None and dropped."""
        self._check_open()
        if self.disabled:
            change(None)
            return
        self.meta.update(change)

    # ----------------------------------------------------------------- moves
    def stage(self, keys: Sequence[str], to: str | None = None) -> MoveHandle:
        self._check_readable()
        self.res.learn(keys)
        to_memory = to is not None and self.tiers[to].volatile
        return self._started(self.mover.stage(self.res, keys, to), cancel=to_memory)

    def prefetch(self, keys: Sequence[str]) -> MoveHandle:
        self._check_readable()
        self.res.learn(keys)
        return self._started(self.mover.prefetch(self.res, keys), cancel=True)

    def migrate(self, keys: Sequence[str], to: str) -> MoveHandle:
        self._check_readable()
        self.flush()  # a migration only moves durable, catalogued chunks
        self.res.learn(keys)
        return self._started(self.mover.migrate(self.res, keys, to))

    def evict(self, keys: Sequence[str], tier: str) -> MoveHandle:
        self._check_readable()
        self.flush()
        self.tiers[tier]  # unknown tier: NotFoundError before anything moves
        self.res.learn(keys)
        return self._started(self.mover.evict(self.res, keys, tier))

    def _started(self, handle: MoveHandle, *, cancel: bool = False) -> MoveHandle:
        """Keep ``handle`` (a move of this store's chunks) for :meth:`close`, which cancels
        it where ``cancel`` (a prefetch: its copies go with the close) and else waits for it."""
        self._moves = [(h, c) for h, c in self._moves if not h.done()] + [(handle, cancel)]
        return handle

    def _end_moves(self) -> None:
        """Let this store's moves end before its close: a prefetch (or a stage to a memory
        tier) is cancelled, its chunks under way waited for; a stage, migration or eviction
        to storage that lasts is waited for whole, as its caller asked for it. The close then
        commits (or, for a memory tier, drops) every copy they made, and none is put after
        it. Their waiters see the outcome, cancelled chunks counted."""
        moves, self._moves = self._moves, []
        for h, cancel in moves:
            if cancel:
                h.cancel()
        for h, _ in moves:
            h.finished()

    def residency_table(self) -> dict[str, list[ChunkCopy]]:
        """Every chunk's copies, fastest tier first (for ``strataio info``)."""
        return {k: self.res.copies(k) for k in self.res.chunk_keys()}

    # ----------------------------------------------------------------- lifecycle
    @property
    def closed(self) -> bool:
        return self._closed

    def flush(self) -> None:
        """Make written chunks durable on their tiers, then commit the residency changes
        (:meth:`Commit.apply`; where this process holds no catalog, only the sync)."""
        if self._closed:
            return
        self.commit.apply(self.res)
        self.record_checks()
        self.report_lost_writes()

    def report_lost_writes(self) -> None:
        """Raise for the writes a commit since the last report did not record as their
        values were lost before it: :class:`ObjectError` where the object a write put was
        replaced by something no write of strataio's stands for (a directory, a file put by
        hand: :meth:`Commit._lost_for_good`), naming the chunks and what stands there; else
        :class:`ChunksNotStoredError` where it was gone (another process, or a hand, deleted
        it). A flush or close that returns has made every write durable; the value of
        another process's write that replaced a put's object is kept, and is no loss."""
        lost, displaced, valueless = self.res.take_lost_writes()
        if displaced:
            raise self._displaced_writes(displaced, lost)
        if not lost:
            return
        keys = sorted(lost)
        tiers = sorted(set(lost.values()))
        # (a rewrite in place that replaced the chunk's only copy: its value went with it)
        gone = [k for k in keys if k in valueless]
        kept = [k for k in keys if k not in valueless]
        said = []
        if kept:
            said.append(
                f"{_few(kept)} "
                + ("keeps its previous value" if len(kept) == 1 else "keep their previous values")
            )
        if gone:
            said.append(
                f"{_few(gone)} {'has' if len(gone) == 1 else 'have'} no value left (the write "
                f"replaced {'its' if len(gone) == 1 else 'their'} only copy in place; "
                "`strataio fsck` names it)"
            )
        one = len(keys) == 1
        raise ChunksNotStoredError(
            f"dataset {self.name!r}: {counted(len(keys), 'chunk')} written since the last "
            f"flush lost {'its' if one else 'their'} new bytes before the catalog recorded "
            f"{'it' if one else 'them'} (the object{'' if one else 's'} put on "
            f"{'tier' if len(tiers) == 1 else 'tiers'} {', '.join(map(repr, tiers))} "
            f"{'is' if one else 'are'} gone: deleted by another process or by hand); "
            f"{'; '.join(said)}; write {'it' if one else 'them'} again",
            keys,
        )

    def _displaced_writes(self, displaced: dict[str, str], lost: dict[str, str]) -> ObjectError:
        """The error of writes whose objects something no write stands for replaced before
        the commit (``displaced``: key -> what stands there), and of those whose objects were
        gone (``lost``: key -> tier)."""
        first, *others = sorted(displaced)
        msg = (
            f"dataset {self.name!r}: chunk {first!r} written since the last flush was not "
            "stored: before the catalog recorded it, the object its write put was replaced "
            f"by something no write stands for: {displaced[first]}"
        )
        if others:
            msg += f"; nor, replaced likewise, {_few(others)}"
        if lost:
            gone = sorted(lost)
            msg += (
                f"; nor {_few(gone)}, whose new "
                "objects are gone (deleted by another process or by hand)"
            )
        n = len(displaced) + len(lost)
        msg += (
            f"; the catalog records {'that write nowhere' if n == 1 else f'none of these {n} writes'}"
            ": move what is in the way, and write again"
        )
        return ObjectError(msg, sorted([*displaced, *lost]))

    def close(self) -> None:
        """Flush and close; moves of this dataset still running end first (prefetches
        cancelled, their chunks under way waited for; stages, migrations and evictions to
        storage waited for), and copies on memory tiers are dropped (they live while the
        dataset is open). In a parallel job this is collective (:meth:`Commit.close`). Then
        :attr:`on_closed` is called with this store, whether the close failed or not
        (:attr:`closed_cleanly` tells)."""
        if self._closed:
            return
        try:
            self._end_moves()
            for tier in self.tiers:
                if tier.volatile:
                    for c in self.res.on_tier(tier.name):
                        self.res.remove(c.key, c.tier, expect=c)
            self.commit.close(self.res)
            self.record_checks()
            self.closed_cleanly = True
            self.report_lost_writes()
        finally:
            if self.on_closed is not None:
                with contextlib.suppress(StrataError):  # (what it keeps is advice)
                    self.on_closed(self)
            self._closed = True
            self.placement.unregister(self.res)
            if self.commit.comm is not None:
                # another rank may have rewritten chunks this rank holds in its chunk cache
                self.cache.invalidate(self.name)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the store of dataset {self.name!r} is closed")

    def _check_readable(self) -> None:
        self._check_open()
        if self.disabled:
            raise DatasetDisabledError(f"dataset {self.name!r} is disabled (DISABLE hint)")

    def __repr__(self) -> str:
        return f"TieredChunkStore({self.name!r}, hint={self.hint}, tiers={self.tiers.names})"


def _outcome(fn: Any, *args: Any) -> BaseException | None:
    """The exception ``fn(*args)`` raises, None when it returns (as ``Future.exception``)."""
    try:
        fn(*args)
    except BaseException as exc:  # handed on as the mover's threads hand theirs
        return exc
    return None


class _Checked(NamedTuple):
    """A chunk's copy found verified by a range read (see ``TieredChunkStore._checked``)."""

    stamp: int
    tier: Tier
    obj: str
    version: Any


def _few(keys: Sequence[str], n: int = 4) -> str:
    """The first ``n`` of ``keys`` for a message, and "..." where there are more."""
    return ", ".join(keys[:n]) + (", ..." if len(keys) > n else "")


def _copy_span(blob: BytesLike, offset: int, out: memoryview) -> int:
    """Copy ``blob[offset:offset + len(out)]`` into ``out`` (zeros past its end); its size."""
    data = memoryview(blob).cast("B")[offset : offset + len(out)]
    out[: len(data)] = data
    if len(data) < len(out):
        out[len(data) :] = bytes(len(out) - len(data))
    return len(blob)


def keys_of(ds: Any, section: Any) -> list[str]:
    """Chunk keys covering ``section`` of dataset ``ds`` (a Section, an index, or None=all)."""
    from strataio.layout.sections import Section

    if section is None:
        sec = Section.full(ds.shape)
    elif isinstance(section, Section):
        sec = section
    else:
        sec = Section.from_index(section, ds.shape)
    coords = ds.grid.cover(sec).coords
    return [ds.chunk_key(c) for c in coords.tolist()]


def _the_others_written(others: int, of: int | None = None) -> str:
    """What a write that stored only some of its chunks says of the ``others`` it stored (of
    ``of`` chunks in all, where given)."""
    if not others:
        return "no chunk was written"
    whole = "" if of is None else f" of {counted(of, 'chunk')}"
    return f"the other {others}{whole} {'was' if others == 1 else 'were'} written"
