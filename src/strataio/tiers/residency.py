"""Residency: which tiers hold which chunk of one dataset, cached in memory since open.

APRIL touches its metadata database only at open and close. strataio reads a chunk's catalog
rows once, into a :class:`Residency`: in a parallel job all of them at open (rank 0 reads them
and hands them to every rank); in a single process the first time the chunk is looked up
(:meth:`Residency.learn`, one query per section or batch of keys, and all rows at once where
every chunk is asked for). Opening a dataset of a million chunks to read a few of them then
costs what those few cost, not a scan of the million rows (4 µs each). A session keeps the
rows its closed datasets learned and hands them to their next handles while the catalog's
generation of the dataset holds (:mod:`strataio.tiers.row_memo`). Reads, writes and
moves update it in memory and buffer the changes: rows to upsert and delete, objects put but
not yet synced, objects a change made obsolete. The :class:`~strataio.tiers.commit.Commit`
takes that buffer as one :class:`Batch` and applies it: sync, one catalog transaction, then
delete the obsolete objects.

Concurrency. Writes, stages, write-backs and evictions of the same chunk may run on several
threads at once. Three rules keep them from losing a version:

- Every put of an object (``tier``, ``key``) happens inside :meth:`Residency.writing`, which
  admits one put per object at a time, cancels a pending deletion of that object (the put
  replaces it, and its row supersedes the deleted one) and waits while a deletion of it is
  being carried out.
- Each chunk has a version, bumped by every write of new content (:meth:`record_write`). A
  move records the copy it made only if the chunk's version is still the one it copied
  (:meth:`record_move`); otherwise the copy is stale and is dropped.
- A copy with a put of its chunk to its tier in flight (:meth:`busy`) is not an eviction
  victim, and an eviction forgets a copy only if it is still the one it chose and another
  copy is kept (:meth:`drop_if_kept`), or through a write-back (:meth:`record_move`).

Copies on a volatile tier (the memory role) are held here like any other but never reach the
catalog: they die with the process, and the catalog names only copies that outlive it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strataio.arrays.store import META_KEY
from strataio.catalog.base import ChunkCopy, CopyId
from strataio.errors import BackendError
from strataio.tiers.tier import Tier, TierSet

__all__ = ["META_KEY", "READABLE", "Batch", "Residency", "object_key"]

#: copy states a read may use
READABLE = ("valid", "dirty")


@dataclass(slots=True)
class Batch:
    """Changes taken from a residency to be applied together: ``unsynced`` objects per tier
    (to make durable first), catalog ``upserts`` and ``deletes`` (one transaction), then the
    ``obsolete`` ``(tier, key)`` objects the transaction stopped naming (to delete last).
    ``touches`` maps chunk keys read to their access time (POSIX seconds): recorded as access
    times only, never as whole rows, so a reader never writes back rows another process has
    changed since it opened the dataset. ``written`` maps the ``(key, tier)`` of each upsert
    that records new content (a write, not a move) to the version of the object put (None
    where the backend has none): the commit checks that no other process replaced the
    object since (see :meth:`Catalog.commit`).
    ``moved`` maps those of moves' copies to the version put, checked the same way.
    ``dropped``: keys of chunks deleted on purpose; the commit keeps any other chunk from
    losing its last catalogued copy (a drop decided on stale rows). ``expect`` maps each
    delete to the ``(state, checksum)`` of the row as this process last loaded or recorded
    it (None: it knows of no row): a row changed since is another process's, and is kept,
    object and all (see :meth:`Catalog.commit`); and each written copy this process
    announced to its announcement, which the write's row replaces only while it stands. ``rewritten``: keys of chunks with new
    content among the upserts (wherever the written copy went since: a write-back or a
    stage of it before the commit carries the new content too), whose rows supersede every
    other copy of the chunk. ``revalidated``: the ``(key, tier)`` of upserts that only mark a
    copy valid (it reached the chunk's home), recorded only while the catalog's row there
    still holds the same bytes, settled (this process's view of it may be stale)."""

    unsynced: dict[str, set[str]] = field(default_factory=dict)
    upserts: list[ChunkCopy] = field(default_factory=list)
    deletes: list[CopyId] = field(default_factory=list)
    obsolete: list[tuple[str, str]] = field(default_factory=list)
    touches: dict[str, float] = field(default_factory=dict)
    written: dict[tuple[str, str], Any] = field(default_factory=dict)
    moved: dict[tuple[str, str], Any] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)
    expect: dict[CopyId, tuple[str, str] | None] = field(default_factory=dict)
    rewritten: set[str] = field(default_factory=set)
    revalidated: set[tuple[str, str]] = field(default_factory=set)
    #: per chunk of ``rewritten``, the committed values (checksums) its writes replaced as
    #: this process saw them: a write found lost at the commit is reported only where the
    #: chunk holds none but those (not where another process's write overtook it)
    overwritten: dict[str, set[str]] = field(default_factory=dict)
    #: the copies a migration dropped (:meth:`Residency.drop_migrated`), by ``(tier, key)``
    #: of their objects among ``obsolete``: one whose deletion the tier refuses is kept,
    #: catalogued again (:meth:`Residency.keep_refused`)
    migrated_off: dict[tuple[str, str], ChunkCopy] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.unsynced or self.upserts or self.deletes or self.obsolete or self.touches)

    def for_rank_0(self) -> Batch:
        """What rank 0 of a parallel job records for the rank this batch was taken on: its
        rows, not its objects (each rank syncs and deletes its own)."""
        return Batch(
            upserts=self.upserts,
            deletes=self.deletes,
            touches=self.touches,
            written=self.written,
            moved=self.moved,
            dropped=self.dropped,
            rewritten=self.rewritten,
            revalidated=self.revalidated,
            overwritten=self.overwritten,
        )


class Residency:
    """The in-memory copy map of dataset ``name`` with a buffer of uncommitted changes.

    Thread-safe. ``commit_lock`` serialises the application of batches, so that changes reach
    the catalog in the order they were made.
    """

    def __init__(
        self,
        name: str,
        copies: Iterable[ChunkCopy],
        tiers: TierSet,
        *,
        load: Callable[[Sequence[str] | None], tuple[Iterable[ChunkCopy], Any]] | None = None,
    ) -> None:
        """``copies``: the dataset's catalog rows, all of them; or, with ``load``, none:
        ``load(keys)`` then returns the rows of chunks ``keys`` (all rows where None) as the
        catalog holds them when a chunk is first looked up (see the module doc), and what
        else the catalog holds on them for :attr:`on_learned` (taken in the same query)."""
        self.name = name
        self.tiers = tiers
        self._volatile = frozenset(t.name for t in tiers if t.volatile)
        self.lock = threading.RLock()
        self.commit_lock = threading.Lock()
        self._cond = threading.Condition(self.lock)
        # (key, tier) -> (state, checksum) of the catalog's row as this process last loaded
        # or recorded it: a delete is applied only to the row it was decided on
        self._known: dict[tuple[str, str], tuple[str, str]] = {}
        self._copies: dict[str, dict[str, ChunkCopy]] = (
            {} if load is None else _CopyMap(load, self._known, self._learned)
        )
        #: called with the keys of chunks whose rows were just learned (see :meth:`learn`)
        #: and what ``load`` gave with them (None: nothing, after a :meth:`refresh_from`)
        self.on_learned: Callable[[list[str], Any], None] | None = None
        for c in copies:
            self._copies.setdefault(c.key, {})[c.tier] = c
            self._known[c.key, c.tier] = (c.state, c.checksum)
        self._upserts: dict[tuple[str, str], ChunkCopy] = {}
        self._deletes: set[tuple[str, str]] = set()
        self._unsynced: dict[str, set[str]] = {}  # tier -> chunk keys put, not yet synced
        self._written: dict[tuple[str, str], Any] = {}  # (key, tier) -> version put (Batch)
        self._moved: dict[tuple[str, str], Any] = {}  # the same, of moves' copies
        self._revalidated: set[tuple[str, str]] = set()  # (key, tier) only marked valid (Batch)
        self._dropped: set[str] = set()  # chunks deleted on purpose (Batch)
        self._rewritten: set[str] = set()  # chunks whose new content is not committed (Batch)
        self._obsolete: set[tuple[str, str]] = set()  # (tier, key) to delete after commit
        self._deleting: set[tuple[str, str]] = set()  # (tier, key) being deleted now
        # (tier, key) objects no row names any more whose deletion their tier refused (down,
        # failing): this process's to delete once the tier answers (see Commit._delete)
        self._stranded: set[tuple[str, str]] = set()
        self._migrated_off: dict[tuple[str, str], ChunkCopy] = {}  # (see drop_migrated)
        self._committing: set[tuple[str, str]] = set()  # (key, tier) rows a batch deletes
        self._writing: set[tuple[str, str]] = set()  # (tier, key) with a put in flight
        # (tier, key) -> [bytes of the copy there a write counts as its room, bytes of that
        # room freed since and kept reserved for it, the write]: see count_room
        self._credits: dict[tuple[str, str], list[Any]] = {}
        self._cancelled: set[tuple[str, str]] = set()  # (tier, key) deletions a put cancelled
        # ... of those, the objects whose row a commit has deleted since (see recorded)
        self._unnamed_own: set[tuple[str, str]] = set()
        self._untouched: set[tuple[str, str]] = set()  # (tier, key) whose put never began
        self._busy: Counter[str] = Counter()  # key -> puts in flight, any tier
        self._versions: Counter[str] = Counter()
        self._touched: dict[str, float] = {}  # key -> latest access time not recorded yet
        self._accessed: dict[str, float] = {}  # key -> latest access time seen here
        self._stamps: dict[str, int] = {}  # key -> changes of its copies or puts in flight
        self._forgotten: set[tuple[str, str]] = set()  # (key, tier) rows forgotten here only
        self._in_commit: set[str] = set()  # keys of the rows a taken batch is recording now
        self._lost: dict[str, str] = {}  # key -> tier: writes a commit found gone (lose_writes)
        self._valueless: set[str] = set()  # of those, chunks left no value (lose_writes)
        #: key -> what stands in its place: writes whose object a commit found replaced by
        #: something no write stands for (lose_writes)
        self._displaced: dict[str, str] = {}
        self._overwritten: dict[str, set[str]] = {}  # key -> values its writes replaced (Batch)
        #: called with a copy :meth:`drop_missing` forgot, to drop its row from the catalog
        self.drop_missing_row: Callable[[ChunkCopy], None] | None = None
        #: called with a copy a move recorded and the version of the object it put, which
        #: the move read back and checked (the copy is then verified, as by a whole read)
        self.moved_checked: Callable[[ChunkCopy, Any], None] | None = None

    # ----------------------------------------------------------------- queries
    def learn(self, keys: Iterable[str]) -> None:
        """Read the catalog rows of those of chunks ``keys`` not looked up yet, in one query
        made outside the lock (a residency loaded whole at open has nothing to learn). Any
        lookup of a chunk learns it anyway; this batches the lookups of a section."""
        copies = self._copies
        if not isinstance(copies, _CopyMap) or copies.whole:
            return
        # (a look without the lock: a chunk learned meanwhile is skipped by take)
        missing = copies.missing(keys)
        if missing:
            rows, extra = copies.load(missing)
            with self.lock:
                learned = copies.take(rows, missing)
            self._learned(learned, extra)

    def learned_keys(self) -> list[str] | None:
        """Keys of the chunks whose rows this residency holds, or None where it holds every
        row of the dataset."""
        copies = self._copies
        if not isinstance(copies, _CopyMap) or copies.whole:
            return None
        with self.lock:
            return copies.learned()

    def _learned(self, keys: list[str], extra: Any = None) -> None:
        if keys and self.on_learned is not None:
            self.on_learned(keys, extra)

    def chunk_keys(self) -> list[str]:
        with self.lock:
            return sorted(k for k, v in self._copies.items() if v)

    def copies(self, key: str) -> list[ChunkCopy]:
        """Copies of ``key``, fastest tier first."""
        with self.lock:
            got = list(self._copies.get(key, {}).values())
        return sorted(got, key=lambda c: self._rank(c.tier))

    def missing_copy_error(self, key: str, gone: ChunkCopy) -> BackendError:
        """The error of a read or move of chunk ``key`` that found its copy ``gone`` missing
        and no other copy of its bytes: what is left, and how the chunk can be mended."""
        others = ", ".join(f"{c.tier}({c.state})" for c in self.copies(key) if c.tier != gone.tier)
        return BackendError(
            f"chunk {key!r} of {self.name!r}: its copy on tier {gone.tier!r} is missing "
            f"and no other copy holds its bytes (checksum {gone.committed_checksum or '?'}; "
            f"copies of another value: {others or 'none'}); the chunk's value is lost "
            "there: run 'strataio fsck' "
            + (
                "(--repair then keeps the other value)"
                if others
                else "(no copy is left to repair it from: write the chunk again, or "
                "delete the dataset)"
            )
        )

    def copy_on(self, key: str, tier: str) -> ChunkCopy | None:
        with self.lock:
            return self._copies.get(key, {}).get(tier)

    def is_current(self, copy: ChunkCopy) -> bool:
        """True if ``copy`` is still the copy recorded on its tier (same size, checksum and
        state; its access time may have moved on)."""
        now = self.copy_on(copy.key, copy.tier)
        return now is not None and _same(now, copy)

    def readable(self, key: str, *, up_only: bool = True) -> list[ChunkCopy]:
        """Copies a read may use, fastest first (skipping tiers marked down): valid and dirty
        ones, and announced rewrites (whose object holds the old or the new bytes, whole;
        :meth:`ChunkCopy.accepts`)."""
        return [c for c in self.copies(key) if self._readable(c, up_only)]

    def fastest_readable(self, key: str) -> tuple[ChunkCopy | None, bool, int]:
        """In one look (a read's fast path): the copy a read of ``key`` uses (the first of
        :meth:`readable`, None when there is none), whether a put of ``key`` is in flight,
        and the chunk's :meth:`stamp`."""
        with self.lock:
            busy = self._busy.get(key, 0) > 0
            return self._first_readable(key), busy, self._stamps.get(key, 0)

    def fastest_readable_many(self, keys: Sequence[str]) -> list[tuple[ChunkCopy | None, int]]:
        """Per key, the copy a read would use (None where there is none or a put of the
        chunk is in flight) and the chunk's :meth:`stamp`, in one look for a whole section:
        a reader whose stamp still holds after its read read a copy nothing replaced."""
        self.learn(keys)
        with self.lock:
            busy, stamps = self._busy, self._stamps
            return [
                (None if busy.get(k, 0) else self._first_readable(k), stamps.get(k, 0))
                for k in keys
            ]

    def _first_readable(self, key: str) -> ChunkCopy | None:
        """The first of :meth:`readable` (the caller holds the lock; a single copy, the
        usual case, needs no sort)."""
        per = self._copies.get(key)
        if not per:
            return None
        if len(per) == 1:
            (c,) = per.values()
            return c if self._readable(c) else None
        return next(iter(self.readable(key)), None)

    def in_memory(self, keys: Iterable[str]) -> list[str]:
        """Those of ``keys`` with a copy on a volatile tier, in one look."""
        volatile = self._volatile
        if not volatile:
            return []
        with self.lock:
            held = dict.get  # (nothing to learn: a copy made here is in the map)
            copies = self._copies
            return [k for k in keys if not volatile.isdisjoint(held(copies, k) or ())]

    def without_copies(self, keys: Iterable[str]) -> list[str]:
        """Those of ``keys`` whose rows, learned already, name no copy (a chunk never
        written, as far as this residency knows), in one look."""
        with self.lock:
            held = dict.get  # (the chunks of a read were learned at its start)
            copies = self._copies
            return [k for k in keys if not held(copies, k, None)]

    def names_bytes(self, keys: Sequence[str], digests: Sequence[str]) -> list[bool]:
        """Per key, True if the copy a read of it would use (its tier up or not) accepts
        bytes of the checksum at the same position of ``digests`` (:meth:`ChunkCopy.accepts`),
        in one look: a copy of those bytes held apart (the prefetch cache) is then the
        chunk's value as this residency knows it."""
        out = []
        with self.lock:
            copies = self._copies
            held = dict.get  # (the chunks a read serves were learned at its start)
            for key, digest in zip(keys, digests):
                per = held(copies, key) or copies.get(key)
                if not per:
                    out.append(False)
                    continue
                if len(per) == 1:
                    (c,) = per.values()
                    if not (c.state in READABLE or c.old_checksum):
                        c = None
                else:
                    c = next(iter(self.readable(key, up_only=False)), None)
                # (the usual case first: the bytes the row names)
                out.append(c is not None and (digest == c.checksum or c.accepts(digest)))
        return out

    def _readable(self, c: ChunkCopy, up_only: bool = True) -> bool:
        return bool(c.state in READABLE or c.old_checksum) and (
            not up_only or self._tier(c.tier).up
        )

    def stamp(self, key: str) -> int:
        """A number that changes whenever a copy of ``key`` is recorded, replaced or forgotten
        and whenever a put of it begins or ends (an access time moving on is no change): a
        reader that checked the chunk's copies may skip the check while it stays the same."""
        return self._stamps.get(key, 0)

    def stamps(self, keys: Iterable[str]) -> list[int]:
        """:meth:`stamp` of each of ``keys``, in one call."""
        get = self._stamps.get
        return [get(k, 0) for k in keys]

    def _changed(self, key: str) -> None:
        self._stamps[key] = self._stamps.get(key, 0) + 1

    def kept_elsewhere(self, key: str, tier: str) -> bool:
        """True if a valid or dirty copy of ``key`` on an up, persistent tier other than
        ``tier`` holds the same bytes as the copy there (its checksum): dropping that copy
        then loses nothing (the commit that forgets it records the other copy too). A rewrite
        in flight there does not count, nor a copy of another value (rows another process
        recorded meanwhile may disagree: only fsck settles which is newer)."""
        mine = self.copy_on(key, tier)
        want = mine.checksum if mine is not None and mine.state != "in-transit" else ""
        return any(
            c.tier != tier
            and c.state in READABLE
            and not self._tier(c.tier).volatile
            and (not want or not c.checksum or c.checksum == want)
            for c in self.readable(key)
        )

    def on_tier(self, tier: str) -> list[ChunkCopy]:
        with self.lock:
            return [v[tier] for v in self._copies.values() if tier in v]

    def all_copies(self) -> list[ChunkCopy]:
        with self.lock:
            return [c for v in self._copies.values() for c in v.values()]

    def version(self, key: str) -> int:
        """How many writes of new content ``key`` has had in this process."""
        with self.lock:
            return self._versions[key]

    def catalogued(self, key: str, tier: str) -> bool:
        """True if the catalog may name a copy of ``key`` on ``tier``: one is recorded, its
        row's deletion is not committed yet, or it was forgotten here only. A put there
        replaces an object the catalog may name, so it is announced first
        (:meth:`Commit.announce`)."""
        with self.lock:
            return self._row_pending(key, tier) or (key, tier) in self._forgotten

    def holds_object(self, key: str, tier: str) -> bool:
        """True if the object of ``key`` on ``tier``, where there is one, is this process's
        to replace: a copy recorded here, or one whose deletion is pending here. Any other
        object there is another process's put not recorded yet (or a leftover)."""
        with self.lock:
            obj = (tier, key)
            return (
                self._row_pending(key, tier)
                or obj in self._obsolete
                or obj in self._deleting
                or obj in self._stranded
                or obj in self._cancelled  # (a deletion the caller's put cancelled)
            )

    def elsewhere_only(self, keys: Sequence[str], tier: str) -> list[str]:
        """Of ``keys``, those with copies here, none of them on ``tier`` (one look)."""
        self.learn(keys)
        with self.lock:
            return [k for k in keys if (per := self._copies.get(k)) and tier not in per]

    def _row_pending(self, key: str, tier: str) -> bool:
        """A copy of ``key`` on ``tier`` is recorded here, or its row's deletion is not
        committed yet (the caller holds the lock)."""
        slot = (key, tier)
        return (
            self.copy_on(key, tier) is not None or slot in self._deletes or slot in self._committing
        )

    def busy(self, key: str, tier: str | None = None) -> bool:
        """True while a put of ``key`` (to ``tier``; to any tier when None) is in flight."""
        with self.lock:
            if tier is not None:
                return (tier, key) in self._writing
            return self._busy[key] > 0

    def writing_on(self, tier: str) -> bool:
        """True while any put to ``tier`` is in flight."""
        with self.lock:
            return any(t == tier for t, _ in self._writing)

    def wait_quiet(self, key: str, timeout: float = 30.0) -> bool:
        """Wait until no put of ``key`` is in flight (``timeout`` seconds at most); True if
        none is."""
        with self._cond:
            return self._cond.wait_for(lambda: self._busy[key] == 0, timeout)

    # ----------------------------------------------------------------- puts
    @contextlib.contextmanager
    def writing(self, key: str, tier: str) -> Iterator[None]:
        """Hold the right to put object ``key`` on ``tier`` (one put per object at a time).

        A pending deletion of that object is cancelled (the put replaces it); a deletion
        being carried out is waited for. While the put is in flight no commit writes a row
        for that copy (its announcement stands). If no copy on ``tier`` is recorded when the
        put ends (it failed, or a move found its copy stale), the object is obsolete and any
        row (an announcement) naming it is dropped: the next commit deletes both; unless
        the put never began (:meth:`abandon_write`).
        """
        self.begin_write(key, tier)
        try:
            yield
        finally:
            self.end_write(key, tier)

    def begin_write(self, key: str, tier: str) -> None:
        """The first half of :meth:`writing`, for puts that another thread carries out."""
        slot = (tier, key)
        with self._cond:
            while slot in self._writing or slot in self._deleting:
                self._cond.wait()
            self._writing.add(slot)
            self._busy[key] += 1
            self._changed(key)
            if slot in self._obsolete:
                self._obsolete.discard(slot)
                self._cancelled.add(slot)
            elif slot in self._stranded:  # (its row is gone already)
                self._stranded.discard(slot)
                self._cancelled.add(slot)
                self._unnamed_own.add(slot)

    def end_write(self, key: str, tier: str) -> None:
        """The second half of :meth:`writing`."""
        slot = (tier, key)
        with self._cond:
            self._writing.discard(slot)
            cancelled, own = slot in self._cancelled, slot in self._unnamed_own
            self._cancelled.discard(slot)
            self._unnamed_own.discard(slot)
            if slot in self._untouched:
                self._untouched.discard(slot)
                if (
                    cancelled
                    and self.copy_on(key, tier) is None
                    and (self._tier(tier).volatile or (key, tier) in self._deletes or own)
                ):
                    # the deletion the put cancelled stands, where its row's is pending or
                    # done: an object whose row another commit kept is not this one's
                    self._obsolete.add(slot)
            elif self.copy_on(key, tier) is None:
                self._obsolete.add(slot)
                if not self._tier(tier).volatile:
                    self._upserts.pop((key, tier), None)
                    self._deletes.add((key, tier))
            self._busy[key] -= 1
            if not self._busy[key]:
                del self._busy[key]
            self._changed(key)
            self._cond.notify_all()

    def abandon_write(self, key: str, tier: str) -> None:
        """The put of ``key`` to ``tier`` whose slot the caller holds (:meth:`writing`) never
        began and announced nothing (its source could not be read): the object there and any
        row naming it are left as they are when the slot is given up. This residency may not
        know that row: another process may have recorded a copy there since it was loaded."""
        with self.lock:
            if (tier, key) in self._writing:
                self._untouched.add((tier, key))

    def count_room(self, key: str, tier: str, owner: object) -> int:
        """For a write (``owner``, any object naming it) of ``key`` about to claim room on
        ``tier``: the bytes of the copy there, which the write replaces and so counts as room
        of its own (0 where there is none, or where another write counts it already: the
        second claims its whole size). Until :meth:`record_write` or :meth:`end_count` ends
        the count, room freed at that place meanwhile (the copy forgotten, or replaced by a
        smaller one) stays reserved for the owner: no other put takes it."""
        with self.lock:
            held = self.copy_on(key, tier)
            if held is None or (tier, key) in self._credits:
                return 0
            self._credits[tier, key] = [held.nbytes, 0, owner]
            return held.nbytes

    def end_count(self, key: str, tier: str, owner: object) -> int:
        """End ``owner``'s count of :meth:`count_room` (a write that puts nothing after all);
        returns the bytes kept reserved for it meanwhile, which the caller releases with its
        own reservation."""
        with self.lock:
            return self._end_count(tier, key, owner)

    def _end_count(self, tier: str, key: str, owner: object) -> int:
        got = self._credits.get((tier, key))
        if got is None or got[2] is not owner:
            return 0
        del self._credits[tier, key]
        return got[1]

    def _keep_counted(self, tier: str, key: str, size: int) -> int:
        """The copy at ``(tier, key)`` becomes ``size`` bytes (0: forgotten): the bytes of a
        write's counted room this frees, now to be kept reserved for it (caller holds the
        lock and moves them into the tier's reservation in the same step)."""
        got = self._credits.get((tier, key))
        if got is None or got[0] <= size:
            return 0
        kept = got[0] - size
        got[0] = size
        got[1] += kept
        return kept

    # ----------------------------------------------------------------- changes
    def add(self, copy: ChunkCopy, *, reserved: int = 0, unsynced: bool = False) -> None:
        """Record (or replace) a copy; the tier's usage follows, absorbing ``reserved`` bytes
        that were reserved for this copy (see :meth:`Tier.account`). ``unsynced``: its object
        was put without being made durable; the commit syncs it before recording it."""
        with self.lock:
            per = self._copies.setdefault(copy.key, {})
            old = per.get(copy.tier)
            per[copy.tier] = copy
            self._dropped.discard(copy.key)
            self._changed(copy.key)
            slot = (copy.key, copy.tier)
            self._forgotten.discard(slot)
            if not self._tier(copy.tier).volatile:
                self._upserts[slot] = copy
                if old is None or old.checksum != copy.checksum:
                    # another object's row now (record_write and record_move mark their own)
                    self._written.pop(slot, None)
                    self._moved.pop(slot, None)
                self._revalidated.discard(slot)  # (mark_valid marks its own)
                self._deletes.discard(slot)
                if unsynced:
                    self._unsynced.setdefault(copy.tier, set()).add(copy.key)
            # the object now holds what this row names: a pending deletion is void
            self._obsolete.discard((copy.tier, copy.key))
            self._tier(copy.tier).account(
                copy.nbytes - (old.nbytes if old else 0),
                release=reserved,
                keep=self._keep_counted(copy.tier, copy.key, copy.nbytes),
            )

    def announce_write(self, intent: ChunkCopy, replaced: str, *, reserved: int = 0) -> None:
        """Record ``intent``, the announcement of a rewrite in place, before the put: a read
        meanwhile accepts either version. ``replaced`` (a checksum) is the value the write
        replaces there (:attr:`Batch.overwritten`): the committed value of the row held at
        its place, whatever the announcement names as its old bytes (the new ones of another
        live writer's announcement it took over, whose put may land after this one's: that
        value is no older one), or the bytes a dead writer's object holds."""
        with self.lock:
            self.add(intent, reserved=reserved)
            if not self._tier(intent.tier).volatile and replaced:
                self._overwritten.setdefault(intent.key, set()).add(replaced)

    def record_write(
        self, copy: ChunkCopy, *, reserved: int = 0, version: Any = None, owner: object = None
    ) -> None:
        """Record new content of a chunk just put (not yet synced) as ``copy``, its object
        now at ``version`` (:meth:`Backend.versions`): the chunk's version moves on and its
        copies on other tiers, stale now, are forgotten (in the catalog too, at the commit,
        those another process made meanwhile included). ``owner``: the write's, whose count
        of room (:meth:`count_room`) this ends."""
        with self.lock:
            self._versions[copy.key] += 1
            # the room a rewrite counted on and that was freed meanwhile is its own now
            kept = self._end_count(copy.tier, copy.key, owner)
            self.add(copy, reserved=reserved + kept, unsynced=True)
            before = list(self._copies.get(copy.key, {}).values())
            if not self._tier(copy.tier).volatile:
                self._written[copy.key, copy.tier] = version
                self._rewritten.add(copy.key)
                # (the value of the row it replaces on its own tier: see announce_write)
                was = self._overwritten.setdefault(copy.key, set())
                was.update(c.committed_checksum for c in before if c.tier != copy.tier)
                was.discard("")
            for c in before:
                if c.tier != copy.tier:
                    self.remove(copy.key, c.tier)

    def drop_chunk(self, key: str) -> None:
        """Delete chunk ``key`` on purpose: every copy is forgotten, its rows and objects go
        at the next commit (which otherwise keeps a chunk's last copy)."""
        with self.lock:
            for c in list(self._copies.get(key, {}).values()):
                self.remove(key, c.tier)
            self._dropped.add(key)

    def record_move(
        self,
        copy: ChunkCopy,
        version: int,
        *,
        reserved: int = 0,
        replaces: ChunkCopy | None = None,
        put: Any = None,
    ) -> bool:
        """Record ``copy``, made by a move that copied version ``version`` of the chunk, if
        that is still its version (and, with ``replaces``, forget that copy in the same step:
        a write-back). False, and nothing recorded, if the chunk changed meanwhile, or the
        copy ``replaces`` holds other bytes now or a put is rewriting it. ``put``: the version
        of the object the move put (the commit checks that it is still there), which the
        move read back and checked (:attr:`moved_checked` is told)."""
        with self.lock:
            if self._versions[copy.key] != version:
                return False
            if replaces is not None and (
                (now := self.copy_on(replaces.key, replaces.tier)) is None
                or (now.nbytes, now.checksum) != (replaces.nbytes, replaces.checksum)
                or (replaces.tier, replaces.key) in self._writing
            ):
                return False  # (that copy's bytes changed, or are being rewritten: it stays)
            self.add(copy, reserved=reserved)
            if not self._tier(copy.tier).volatile:
                # (also where the tier keeps no versions, ``put`` None: the commit checks a
                # move's copy against the chunk's other rows all the same)
                self._moved[copy.key, copy.tier] = put
            if replaces is not None:
                self.remove(replaces.key, replaces.tier)
        if put is not None and self.moved_checked is not None:
            self.moved_checked(copy, put)
        return True

    def remove(
        self,
        key: str,
        tier: str,
        *,
        delete_object: bool = True,
        expect: ChunkCopy | None = None,
    ) -> ChunkCopy | None:
        """Forget the copy of ``key`` on ``tier``; its object is deleted after the next commit
        (``delete_object``). With ``expect``, only if the copy there is still that one
        (same size, checksum and state). Returns the copy forgotten, or None."""
        with self.lock:
            old = self._take(key, tier, expect)
            if old is None:
                return None
            if not self._tier(tier).volatile:
                self._upserts.pop((key, tier), None)
                self._written.pop((key, tier), None)
                self._moved.pop((key, tier), None)
                self._revalidated.discard((key, tier))
                self._deletes.add((key, tier))
                if tier in self._unsynced:
                    self._unsynced[tier].discard(key)
            if delete_object and (tier, key) not in self._writing:
                # (a put in flight there replaces the object; if it records no copy, its
                # end marks the object obsolete)
                self._obsolete.add((tier, key))
        return old

    def _take(self, key: str, tier: str, expect: ChunkCopy | None) -> ChunkCopy | None:
        """Take the copy of ``key`` on ``tier`` out of the map (with ``expect``, only if it
        is still that one) and its bytes out of the tier's use; buffer nothing (the caller
        holds the lock)."""
        per = self._copies.get(key, {})
        old = per.get(tier)
        if old is None or (expect is not None and not _same(old, expect)):
            return None
        del per[tier]
        if not per:
            self._copies.pop(key, None)
        self._changed(key)
        self._tier(tier).account(-old.nbytes, keep=self._keep_counted(tier, key, 0))
        return old

    def _forget(self, copy: ChunkCopy) -> bool:
        """Forget ``copy`` here if it is still the one recorded, buffering nothing: the
        catalog may still name it (:meth:`catalogued` stays true until a refresh, or
        :meth:`row_dropped`)."""
        if self._take(copy.key, copy.tier, copy) is None:
            return False
        if not self._tier(copy.tier).volatile:
            self._forgotten.add((copy.key, copy.tier))
        return True

    def mark_valid(self, copy: ChunkCopy) -> bool:
        """Record that ``copy`` (a ``dirty`` one) is now at the chunk's home tier, if it is
        still the copy recorded there."""
        with self.lock:
            if not self.is_current(copy):
                return False
            self.add(copy._replace(state="valid"))
            if not self._tier(copy.tier).volatile:
                self._revalidated.add((copy.key, copy.tier))
            return True

    def drop_if_kept(self, copy: ChunkCopy) -> bool:
        """Forget ``copy`` (its object deleted after the next commit) if it is still recorded
        and the chunk keeps a copy elsewhere (:meth:`kept_elsewhere`; a memory copy always
        may go). One step under the lock: two evictions of the same chunk from two tiers
        never both succeed."""
        with self.lock:
            if not self._tier(copy.tier).volatile and not self.kept_elsewhere(copy.key, copy.tier):
                return False
            return self.remove(copy.key, copy.tier, expect=copy) is not None

    def drop_migrated(self, copy: ChunkCopy) -> bool:
        """:meth:`drop_if_kept` for a migration: the copy, dropped, is remembered with its
        object among the obsolete ones (:attr:`Batch.migrated_off`), so that the commit keeps
        it, catalogued, where its tier refuses the deletion (:meth:`keep_refused`)."""
        with self.lock:
            if not self.drop_if_kept(copy):
                return False
            if not self._tier(copy.tier).volatile:
                self._migrated_off[copy.tier, copy.key] = copy
            return True

    def keep_refused(self, copy: ChunkCopy, version: Any = None) -> bool:
        """Record again ``copy``, a migration dropped whose object its tier refused to delete
        (it stays there, the same bytes), as a move's copy: the next commit records it only
        while the object is still at ``version`` (the one seen before the row went; None:
        unchecked) and another row of the chunk holds its bytes (see :meth:`Catalog.commit`).
        False, nothing recorded, where the chunk here holds no copy of those bytes any more,
        a put is writing at that place, or another copy was recorded there."""
        with self.lock:
            slot = (copy.tier, copy.key)
            if (
                slot in self._writing
                or self.copy_on(copy.key, copy.tier) is not None
                or not any(same_bytes(c, copy) for c in self._copies.get(copy.key, {}).values())
            ):
                return False
            self._stranded.discard(slot)
            self.add(copy)
            self._moved[copy.key, copy.tier] = version
            return True

    def is_stranded(self, tier: str, key: str) -> bool:
        """True while the object of ``key`` on ``tier``, its row gone, waits for its deletion
        (:meth:`strand`)."""
        with self.lock:
            return (tier, key) in self._stranded

    def drop_missing(self, copy: ChunkCopy) -> bool:
        """Forget ``copy``, whose object was found missing, if it still is (nothing to
        delete) and another copy of the chunk on a persistent tier holds the same bytes; True
        if it was forgotten. A copy no other one stands for is kept, so that its loss stays
        visible (reads raise, fsck reports it) instead of the chunk reading as never written,
        or as an older value.

        Nothing is buffered for it (a chunk with a buffered change is never refreshed from
        the catalog, where another process may have recorded where it is now): the row goes
        through :attr:`drop_missing_row` where one is set, a transaction of its own that
        deletes it only if it is still the row this residency saw; otherwise it stays for
        fsck to repair (:meth:`catalogued` stays true for it meanwhile).

        The object is looked for again under the residency lock: a put records its copy only
        after the object is there, so a copy recorded meanwhile (the same bytes put again)
        is never taken for the missing one.
        """
        tier = self._tier(copy.tier)
        with self.lock:
            if not any(
                c.tier != copy.tier and not self._tier(c.tier).volatile and same_bytes(c, copy)
                for c in self._copies.get(copy.key, {}).values()
            ):
                return False
            try:
                if tier.backend.exists(object_key(self.name, copy.key)):
                    return False
            except Exception:
                return False  # the tier cannot tell: keep the row
            if not self._forget(copy):
                return False
        if self.drop_missing_row is not None:
            self.drop_missing_row(copy)
        return True

    #: seconds within which a chunk's accesses count as one (LRU order among them is
    #: arbitrary): a chunk read again and again costs one dictionary look-up per read
    TOUCH_RESOLUTION = 1.0

    def touch(self, keys: Iterable[str], when: float | None = None) -> None:
        """Note an access (for LRU eviction); reaches the catalog at commit. The copies' rows
        here keep the time they were learned with: :meth:`last_access` gives the latest."""
        now = time.time() if when is None else when
        accessed = self._accessed
        # (a look without the lock first: most reads touch chunks touched a moment ago)
        keys = [k for k in keys if not 0.0 <= now - accessed.get(k, -1e300) < self.TOUCH_RESOLUTION]
        if not keys:
            return
        with self.lock:
            touched = self._touched
            for k in keys:
                seen = accessed.get(k)
                if seen is not None and 0.0 <= now - seen < self.TOUCH_RESOLUTION:
                    continue
                if not self._copies.get(k):
                    continue
                accessed[k] = max(now, seen or now)
                touched[k] = max(now, touched.get(k, now))

    def last_access(self, copy: ChunkCopy) -> float:
        """When chunk ``copy.key`` was last accessed, as far as this process knows (POSIX s):
        its row's time or a later access here."""
        return max(copy.last_access, self._accessed.get(copy.key, 0.0))

    # ----------------------------------------------------------------- batches
    def take_batch(self) -> Batch:
        """Remove and return every buffered change; the obsolete objects are marked as being
        deleted (puts of them wait) until :meth:`deleted` or :meth:`restore`."""
        with self.lock:
            self._in_commit = set()
            if not (self._upserts or self._deletes):
                # (no rows: a dataset only read, or only syncing its puts, takes this path
                # at each commit, and most of a batch is about rows)
                batch = Batch(
                    {t: set(ks) for t, ks in self._unsynced.items() if ks},
                    obsolete=sorted(self._obsolete),
                    touches=dict(self._touched),
                    dropped=set(self._dropped),
                )
                self._unsynced.clear()
                self._touched.clear()
                self._dropped.clear()
                batch.migrated_off = self._take_migrated_off(batch.obsolete)
                self._deleting.update(self._obsolete)
                self._obsolete.clear()
                self._committing = set()
                return batch
            ups = dict(self._upserts)
            # a row for a copy being rewritten waits for the put's end: the announcement
            # of the rewrite stands until then
            held = {slot: c for slot, c in ups.items() if (slot[1], slot[0]) in self._writing}
            for slot in held:
                del ups[slot]
            accessed = self._accessed
            batch = Batch(
                {t: set(ks) for t, ks in self._unsynced.items() if ks},
                [  # (a row carries the latest access known here, not the one it was read at)
                    c
                    if accessed.get(c.key, 0.0) <= c.last_access
                    else c._replace(last_access=accessed[c.key])
                    for c in ups.values()
                ],
                [(self.name, k, t) for k, t in sorted(self._deletes)],
                sorted(self._obsolete),
                dict(self._touched),
                {slot: v for slot, v in self._written.items() if slot in ups},
                {slot: v for slot, v in self._moved.items() if slot in ups},
                set(self._dropped),
                {
                    **{(self.name, k, t): self._known.get((k, t)) for k, t in self._deletes},
                    **self._own_announcements(ups),
                },
                {k for k, _ in ups} & self._rewritten,
                {slot for slot in self._revalidated if slot in ups},
            )
            batch.overwritten = {
                k: self._overwritten.pop(k) for k in batch.rewritten if k in self._overwritten
            }
            batch.migrated_off = self._take_migrated_off(batch.obsolete)
            self._dropped.clear()
            self._rewritten -= batch.rewritten
            for slot in batch.written:
                del self._written[slot]
            for slot in batch.moved:
                del self._moved[slot]
            self._revalidated -= batch.revalidated
            self._upserts.clear()
            self._upserts.update(held)
            self._deletes.clear()
            self._unsynced.clear()
            self._touched.clear()
            self._deleting.update(self._obsolete)
            self._obsolete.clear()
            self._committing = {(k, t) for _, k, t in batch.deletes}
            self._in_commit = {c.key for c in batch.upserts}
        return batch

    def _take_migrated_off(
        self, obsolete: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], ChunkCopy]:
        """The migrations' dropped copies among ``obsolete`` objects, taken out (the caller
        holds the lock); those of objects not obsolete any more are forgotten."""
        taken = {o: self._migrated_off[o] for o in obsolete if o in self._migrated_off}
        self._migrated_off.clear()
        return taken

    def restore(self, batch: Batch) -> None:
        """Put back a batch that could not be applied, under any change made since."""
        with self._cond:
            self._committing.clear()
            self._in_commit.clear()
            for t, ks in batch.unsynced.items():
                self._unsynced.setdefault(t, set()).update(ks)
            for c in batch.upserts:
                slot = (c.key, c.tier)
                if slot not in self._deletes and slot not in self._upserts:
                    self._upserts[slot] = c
                    if slot in batch.written:
                        self._written[slot] = batch.written[slot]
                    if slot in batch.moved:
                        self._moved[slot] = batch.moved[slot]
                    if slot in batch.revalidated:
                        self._revalidated.add(slot)
            for _, k, t in batch.deletes:
                if (k, t) not in self._upserts:
                    self._deletes.add((k, t))
            for slot in batch.obsolete:
                self._deleting.discard(slot)
                if self.copy_on(slot[1], slot[0]) is None:
                    self._obsolete.add(slot)
                    if slot in batch.migrated_off:
                        self._migrated_off[slot] = batch.migrated_off[slot]
            for k, when in batch.touches.items():
                self._touched[k] = max(when, self._touched.get(k, when))
            self._dropped |= {k for k in batch.dropped if not self._copies.get(k)}
            self._rewritten |= batch.rewritten
            for k, was in batch.overwritten.items():
                self._overwritten.setdefault(k, set()).update(was)
            self._cond.notify_all()

    def recorded(self, batch: Batch, left_out: Iterable[CopyId], gone: Iterable[CopyId]) -> None:
        """A commit of ``batch`` went through: its rows, but those ``left_out``, are now the
        catalog's, and its deletes (but those it kept) and the rows ``gone`` (superseded)
        are gone from it."""
        skip = set(left_out)
        gone = list(gone)
        with self.lock:
            for c in batch.upserts:
                if (c.dataset, c.key, c.tier) not in skip:
                    self._known[c.key, c.tier] = (c.state, c.checksum)
            for _, k, t in gone:
                self._known.pop((k, t), None)
            # an object whose row this commit deleted while a put held its cancelled
            # deletion is still this process's to delete, should that put give up
            for _, k, t in set(batch.deletes) & set(gone):
                if (t, k) in self._cancelled:
                    self._unnamed_own.add((t, k))

    def lose_writes(
        self,
        lost: Mapping[str, str],
        displaced: Mapping[str, str] | None = None,
        valueless: Iterable[str] = (),
    ) -> None:
        """Note chunks whose written copy a commit did not record as its value was lost:
        ``lost`` (key -> tier), those whose object was gone; ``displaced`` (key -> what
        stands there, in words), those whose object something no write of strataio's stands
        for replaced (a directory, a file put by hand); ``valueless``, those of either whose
        write replaced the chunk's only copy in place (no value is left of it). For
        :meth:`take_lost_writes` to report."""
        with self.lock:
            self._lost.update(lost)
            self._displaced.update(displaced or {})
            self._valueless.update(valueless)

    def take_lost_writes(self) -> tuple[dict[str, str], dict[str, str], set[str]]:
        """The writes :meth:`lose_writes` noted since the last call: those found gone (key ->
        tier), those found displaced (key -> what stands there), and which of them left
        their chunk no value."""
        with self.lock:
            lost, self._lost = self._lost, {}
            displaced, self._displaced = self._displaced, {}
            valueless, self._valueless = self._valueless, set()
            return lost, displaced, valueless

    def row_dropped(self, copy: ChunkCopy) -> None:
        """The catalog's row of ``copy``, forgotten here, is gone too."""
        with self.lock:
            self._forgotten.discard((copy.key, copy.tier))
            self._known.pop((copy.key, copy.tier), None)

    def catalog_row(self, key: str, tier: str) -> tuple[str, str] | None:
        """The ``(state, checksum)`` of the catalog's row of ``key`` on ``tier`` as this
        residency last saw or wrote it (None: it knows of none)."""
        with self.lock:
            return self._known.get((key, tier))

    def _own_announcements(
        self, ups: dict[tuple[str, str], ChunkCopy]
    ) -> dict[CopyId, tuple[str, str]]:
        """Of the written copies among ``ups``, those whose catalog row this process last
        knew as its own announcement of the bytes it wrote, with that row's ``(state,
        checksum)`` (the caller holds the lock). Each is recorded only over that
        announcement: another writer's announcement made there since stays, for that
        writer's commit, since its put may land after this one (a row settled to these
        bytes would then name bytes the object no longer holds)."""
        out: dict[CopyId, tuple[str, str]] = {}
        for slot, c in ups.items():
            if slot in self._written and self._known.get(slot) == ("in-transit", c.checksum):
                out[self.name, c.key, c.tier] = ("in-transit", c.checksum)
        return out

    def announced(self, rows: Iterable[ChunkCopy]) -> None:
        """Announcements ``rows`` are now the catalog's rows of their copies."""
        with self.lock:
            for c in rows:
                self._known[c.key, c.tier] = (c.state, c.checksum)

    def strand(self, objs: Iterable[tuple[str, str]]) -> None:
        """The obsolete objects ``objs`` (``(tier, key)``), whose rows are gone, could not be
        deleted (their tier is down or failed): they stay this process's to delete, at a
        later commit (:meth:`take_stranded`), and to replace. Call before :meth:`deleted`."""
        with self.lock:
            for tier, key in objs:
                if (tier, key) not in self._writing and self.copy_on(key, tier) is None:
                    self._stranded.add((tier, key))

    def hand_over_stranded(self) -> list[tuple[str, str]]:
        """Remove and return the objects :meth:`strand` kept, for a later handle of the
        dataset in this session to delete (:meth:`strand` there): at close."""
        with self.lock:
            objs = sorted(self._stranded)
            self._stranded.clear()
            return objs

    def take_stranded(self) -> list[tuple[str, str]]:
        """Remove and return the objects :meth:`strand` kept, marked as being deleted (puts
        of them wait) until :meth:`deleted`; those still not deleted go back by
        :meth:`strand`."""
        with self.lock:
            if not self._stranded:
                return []
            objs = sorted(self._stranded)
            self._stranded.clear()
            self._deleting.update(objs)
            return objs

    def deleted(self, objs: Iterable[tuple[str, str]]) -> None:
        """The obsolete objects ``objs`` of a taken batch are dealt with (deleted, or kept
        for later by :meth:`strand`); puts of them may go on."""
        with self._cond:
            self._committing.clear()
            self._in_commit.clear()
            self._deleting.difference_update(objs)
            self._cond.notify_all()

    # ----------------------------------------------------------------- parallel jobs
    def adopt(self, batch: Batch) -> list[str]:
        """Take over the row changes of ``batch``, taken by another rank of a parallel job
        from its residency of this dataset: they are buffered here for the next commit. The
        objects they made obsolete are that rank's to delete, and its objects are synced
        already; the values its writes replaced come too (:attr:`Batch.overwritten`). Returns the keys of chunks whose content changed (a checksum new here)."""
        with self.lock:
            changed: set[str] = set()
            for _, key, tier in batch.deletes:
                if self.remove(key, tier, delete_object=False) is None:
                    # a row this rank never loaded: the catalog may still hold it
                    self._upserts.pop((key, tier), None)
                    self._deletes.add((key, tier))
            for c in batch.upserts:
                if all(x.checksum != c.checksum for x in self._copies.get(c.key, {}).values()):
                    self._versions[c.key] += 1  # a move of the old content records nothing
                    changed.add(c.key)
                self.add(c)
                if (c.key, c.tier) in batch.written:
                    self._written[c.key, c.tier] = batch.written[c.key, c.tier]
                if (c.key, c.tier) in batch.moved:
                    self._moved[c.key, c.tier] = batch.moved[c.key, c.tier]
            for k, when in batch.touches.items():
                self.touch([k], when)
            self._dropped |= {k for k in batch.dropped if not self._copies.get(k)}
            self._rewritten |= batch.rewritten
            # (the values its writes replaced: a write of it the commit leaves out is lost
            # only where the chunk holds none but those)
            for k, was in batch.overwritten.items():
                self._overwritten.setdefault(k, set()).update(was)
            return sorted(changed)

    def reload(self, copies: Iterable[ChunkCopy]) -> list[str]:
        """Make this residency hold exactly ``copies`` on its persistent tiers: what the
        catalog records now, after a collective move that rank 0 committed. Nothing is
        buffered for these copies and no object is deleted (rank 0 did that). Copies on
        memory tiers stay, unless their chunk's content changed. Returns the keys of chunks
        whose content changed (a checksum this residency did not hold)."""
        with self.lock:
            want = {(c.key, c.tier): c for c in copies if not self._tier(c.tier).volatile}
            have = {(c.key, c.tier): c for c in self.all_copies()}
            sums: dict[str, set[str]] = {}
            for c in have.values():
                sums.setdefault(c.key, set()).add(c.checksum)
            changed = {c.key for c in want.values() if c.checksum not in sums.get(c.key, ())}
            for (key, tier), c in have.items():
                if self._tier(tier).volatile:
                    if key in changed:
                        self.remove(key, tier)  # stale now: its object goes too
                    continue
                if (key, tier) not in want:
                    per = self._copies[key]
                    del per[tier]
                    if not per:
                        del self._copies[key]
                    self._tier(tier).account(-c.nbytes, keep=self._keep_counted(tier, key, 0))
            for (key, tier), c in want.items():
                old = have.get((key, tier))
                self._copies.setdefault(key, {})[tier] = c
                self._tier(tier).account(
                    c.nbytes - (old.nbytes if old else 0),
                    keep=self._keep_counted(tier, key, c.nbytes),
                )
            for slot in want.keys() | {s for s in have if not self._tier(s[1]).volatile}:
                self._upserts.pop(slot, None)
                self._deletes.discard(slot)
            for key in changed:
                self._versions[key] += 1
            self._forgotten.clear()
            self._known = {slot: (c.state, c.checksum) for slot, c in want.items()}
            for key in {k for k, _ in want} | {k for k, _ in have}:
                self._changed(key)
            return sorted(changed)

    def refresh_from(self, catalog: Any, keys: Iterable[str]) -> list[str]:
        """:meth:`refresh` each of ``keys`` from the rows ``catalog`` holds now (one query
        per few hundred keys): the keys whose copies changed."""
        keys = list(keys)
        got = catalog.residency(self.name, keys)
        rows: dict[str, list[ChunkCopy]] = {}
        for c in got:
            rows.setdefault(c.key, []).append(c)
        learned: list[str] = []
        with self.lock:  # (the keys with changes buffered, once: not a scan per key)
            if isinstance(self._copies, _CopyMap):  # (rows of chunks not looked up yet)
                learned = self._copies.take(got, self._copies.missing(keys))
            pending = self._pending_keys()
            changed = [k for k in keys if self.refresh(k, rows.get(k, []), pending=pending)]
        self._learned(learned)
        return changed

    def unlearn(self) -> list[str]:
        """Forget the catalog rows learned so far of each chunk that holds nothing of this
        residency's own (no change buffered or being recorded, no put or deletion in flight,
        no copy on a memory tier, no row forgotten here only): the next lookup learns it
        anew, as a process opening the dataset would. Returns the keys forgotten (none where
        every row was loaded at open)."""
        copies = self._copies
        if not isinstance(copies, _CopyMap):
            return []
        with self.lock:
            own = self._own_keys()
            keys = [
                k
                for k in copies.held()
                if k not in own and not any(self._tier(t).volatile for t in dict.get(copies, k, ()))
            ]
            copies.forget(keys, keep=own)
            for k in keys:
                self._changed(k)
        return keys

    def learned_rows(self) -> tuple[dict[str, dict[str, ChunkCopy]], bool] | None:
        """The catalog rows this residency learned, per chunk key learned, by tier (those on
        persistent tiers; none for a chunk without rows), and whether every chunk with rows
        is among them; None where it holds state of its own (:meth:`_own_keys`) or loaded
        every row at open."""
        copies = self._copies
        if not isinstance(copies, _CopyMap):
            return None
        volatile = {t.name for t in self.tiers if t.volatile}
        with self.lock:
            if self._own_keys():
                return None
            rows = {
                k: {t: c for t, c in per.items() if t not in volatile} if volatile else dict(per)
                for k, per in dict.items(copies)
            }
            for k in copies._learned:  # (learned, with no rows)
                rows.setdefault(k, {})
            return rows, copies.whole

    def _own_keys(self) -> set[str]:
        """Keys of chunks whose state here is newer than the catalog's (caller holds the
        lock): changes buffered or being recorded, puts or deletions in flight, rows
        forgotten here only."""
        own = self._pending_keys() | set(+self._busy)
        own.update(k for _, k in self._writing | self._deleting)
        own.update(k for k, _ in self._forgotten)
        return own

    def _pending_keys(self) -> set[str]:
        """Keys of chunks with changes buffered here or being recorded (caller holds the
        lock): the catalog's rows of those are older than this residency's."""
        return {s[0] for s in (*self._upserts, *self._deletes, *self._committing)} | (
            self._in_commit
        )

    def refresh(
        self, key: str, copies: Iterable[ChunkCopy], *, pending: set[str] | None = None
    ) -> bool:
        """Make the persistent copies of chunk ``key`` those the catalog records now
        (``copies``), when another process may have moved it since this residency was
        loaded. Only a chunk with no change buffered or being recorded here and no put in
        flight is refreshed; nothing is buffered and no object is deleted. If its content
        changed, its version moves on and its memory copies are forgotten. True if anything
        changed."""
        with self.lock:
            if self._busy[key] or key in (self._pending_keys() if pending is None else pending):
                return False
            per = self._copies.get(key, {})
            have = {t: c for t, c in per.items() if not self._tier(t).volatile}
            want = {c.tier: c for c in copies if c.key == key and not self._tier(c.tier).volatile}
            if self._forgotten:
                self._forgotten -= {slot for slot in self._forgotten if slot[0] == key}
            for tier in self.tiers:
                self._known.pop((key, tier.name), None)
            self._known.update(
                {(key, c.tier): (c.state, c.checksum) for c in copies if c.key == key}
            )
            if have.keys() == want.keys() and all(_same(have[t], want[t]) for t in want):
                return False
            sums = {c.checksum for c in have.values()}
            for t in have.keys() | want.keys():
                before = have[t].nbytes if t in have else 0
                after = want[t].nbytes if t in want else 0
                if t in want:
                    per[t] = want[t]
                else:
                    del per[t]
                self._tier(t).account(after - before, keep=self._keep_counted(t, key, after))
            if any(c.checksum not in sums for c in want.values()):
                self._versions[key] += 1
                for t in [t for t in per if self._tier(t).volatile]:
                    self.remove(key, t)
            if per:
                self._copies[key] = per
            else:
                self._copies.pop(key, None)
            self._changed(key)
            return True

    # ----------------------------------------------------------------- helpers
    def _tier(self, name: str) -> Tier:
        return self.tiers[name]

    def _rank(self, name: str) -> int:
        return self.tiers.rank(name) if name in self.tiers else 1 << 30


class _CopyMap(dict):
    """A residency's copy map (chunk key -> tier -> copy) that reads a chunk's catalog rows
    the first time the chunk is looked up, and every row the first time it is iterated
    over; the rows learned also go to ``known`` (the residency's view of the catalog). Its
    residency holds the lock around every use: a lookup of a chunk not learned yet queries
    the catalog there (:meth:`Residency.learn` batches them outside it)."""

    __slots__ = ("_learned", "after", "known", "load", "whole")

    def __init__(
        self,
        load: Callable[[Sequence[str] | None], tuple[Iterable[ChunkCopy], Any]],
        known: dict[tuple[str, str], tuple[str, str]],
        after: Callable[[list[str], Any], None],
    ) -> None:
        super().__init__()
        self.load = load
        self.known = known
        self.after = after  # called with the keys a lookup learned and load's extra
        self.whole = False  # every row learned
        self._learned: set[str] = set()

    def missing(self, keys: Iterable[str]) -> list[str]:
        """Of ``keys``, those not learned yet (each once)."""
        if self.whole:
            return []
        learned = self._learned
        out = [k for k in keys if k not in learned]
        return list(dict.fromkeys(out)) if out else out

    def learned(self) -> list[str]:
        return sorted(self._learned)

    def take(self, rows: Collection[ChunkCopy], keys: Sequence[str] | None) -> list[str]:
        """Hold ``rows``, the catalog's rows of chunks ``keys`` (all chunks where None), for
        the chunks among them not learned meanwhile (whose rows here may have changed
        since); return the keys learned now."""
        learned = self._learned
        new = {c.key for c in rows if c.key not in learned} if keys is None else set(keys) - learned
        if not new:
            self.whole = self.whole or keys is None
            return []
        for c in rows:
            if c.key in new:
                dict.setdefault(self, c.key, {})[c.tier] = c
                self.known[c.key, c.tier] = (c.state, c.checksum)
        learned |= new
        if keys is None:
            self.whole = True
        return sorted(new)

    def held(self) -> list[str]:
        """Keys of the chunks learned, or holding rows (a whole map knows no others)."""
        return sorted(self._learned.union(dict.keys(self)))

    def forget(self, keys: Iterable[str], *, keep: Iterable[str] = ()) -> None:
        """Drop what was learned of chunks ``keys`` (their next lookup asks the catalog),
        and, where all rows were learned, of every other chunk without rows here but those
        of ``keep`` (whose state here, rows or none, is newer than the catalog's)."""
        if self.whole:
            self._learned.update(dict.keys(self))  # (held, and perhaps changed here since)
            self._learned.update(keep)
            self.whole = False
        for k in keys:
            for tier in dict.pop(self, k, None) or ():
                self.known.pop((k, tier), None)
            self._learned.discard(k)

    def _learn(self, key: str) -> None:
        if not self.whole and key not in self._learned:
            rows, extra = self.load([key])
            self.after(self.take(rows, [key]), extra)

    def _learn_all(self) -> None:
        if not self.whole:
            rows, extra = self.load(None)
            self.after(self.take(rows, None), extra)

    def get(self, key: str, default: Any = None) -> Any:
        self._learn(key)
        return dict.get(self, key, default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._learn(key)
        return dict.setdefault(self, key, default)

    def pop(self, key: str, *default: Any) -> Any:
        self._learn(key)
        return dict.pop(self, key, *default)

    def __getitem__(self, key: str) -> Any:
        self._learn(key)
        return dict.__getitem__(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        self._learn(key)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: str) -> None:
        self._learn(key)
        dict.__delitem__(self, key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self._learn(key)
        return dict.__contains__(self, key)

    def __iter__(self) -> Iterator[str]:
        self._learn_all()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self._learn_all()
        return dict.__len__(self)

    def keys(self) -> Any:
        self._learn_all()
        return dict.keys(self)

    def values(self) -> Any:
        self._learn_all()
        return dict.values(self)

    def items(self) -> Any:
        self._learn_all()
        return dict.items(self)


def _same(a: ChunkCopy, b: ChunkCopy) -> bool:
    return (a.nbytes, a.checksum, a.state) == (b.nbytes, b.checksum, b.state)


def same_bytes(a: ChunkCopy, b: ChunkCopy) -> bool:
    """Whether copies ``a`` and ``b`` stand for the same committed bytes (either unknown:
    taken as yes)."""
    x, y = a.committed_checksum, b.committed_checksum
    return not x or not y or x == y


def object_key(dataset: str, key: str) -> str:
    """The backend key of chunk ``key`` of ``dataset`` on any tier (``name/c/0/1``)."""
    return f"{dataset}/{key}"
