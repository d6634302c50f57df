"""Commit: the one path from a finished write or move to a durable catalog row.

Writes, stages, migrations, write-backs and evictions change a dataset's
:class:`~strataio.tiers.residency.Residency` in memory. :meth:`Commit.apply` makes those
changes durable, always in this order:

1. sync: every object put since the last commit and not put durably is made durable (fsync;
   a no-op where a put is durable on return, as on S3);
2. one catalog transaction records the new rows and drops the rows the changes replaced;
3. the objects no row names any more (a migrated source, an evicted copy, a stale copy after a
   rewrite) are deleted.

So a crash at any point leaves the catalog naming only durable copies, and a copy is deleted
only after the catalog durably records the copy that replaces it. If the sync or the
transaction fails, nothing is applied, the changes stay buffered for the next commit, and no
object is deleted.

Chunks that were only read change no row: their access times are recorded as such
(:meth:`Catalog.touch`), never by writing back whole rows from this process's snapshot, which
would revert rows another process has committed since. They only order evictions, so a commit
keeps them back for :attr:`Commit.TOUCH_DELAY_S` and a timer records those of every dataset
together (:meth:`Commit.record_touches`, also at session close and before an eviction round
here): closing a dataset that was only read then writes nothing to the catalog.

One commit object serves a session: its residencies, the mover's moves, eviction rounds, and
the tiers' health changes. Where this process holds no catalog (MPI ranks other than 0) a
commit only syncs; the changes are handed to rank 0 when the dataset closes
(:meth:`Commit.close`) or before a collective move (:meth:`Commit.share`), and rank 0 records
everyone's in one transaction, after which each rank deletes what its own changes made
obsolete.

Other processes may have moved or rewritten the same chunks since this one loaded its rows.
The transaction therefore checks against the catalog itself, not this process's view: a
write's row supersedes every other copy of its chunk, known here or not; a write's or a
move's row is left out where another process's put replaced the object since (by the
object's version; that process's commit records its own), and a write or move so left out
takes none of its chunk's other copies with it; a row is deleted only if it still holds the state and checksum this
process last saw in it (another process may have announced a rewrite there since; a
write's commit removes every other copy of its chunk but another writer's announced
rewrite), and its object only while it is still the object seen before the transaction
(another process may have put it anew once the row went); and no chunk loses its last copy
to a deletion decided on stale rows, unless it was deleted on purpose. A move's row is
recorded only while another settled row of its chunk holds its bytes, or an announced
rewrite holds them as its old ones (else another process rewrote the chunk since the move
read it: the copy, of an old value, is deleted), and not over a rewrite another writer has
announced at its place since (that writer's object now). Around the commit: moves start
from the rows the catalog holds then (chunks with changes here not recorded yet excepted),
refuse a copy another live process is rewriting, and never replace an object this process
holds no copy of (another process's put not recorded yet): they only create it
(:meth:`Backend.put_new`, which refuses a name taken, atomically on POSIX and memory tiers);
a write onto a tier where it knows no copy of the chunk learns that chunk's rows first, so
it is announced as the rewrite it is, and else only creates its object, announcing a
rewrite before it replaces one found there after all; an eviction counts as kept elsewhere
only a copy of the same bytes; a read that finds an object missing drops its row at once,
guarded the same way, and only while the transaction finds the object still missing (a
stage back there meanwhile records a row just like the one seen, which stays:
:meth:`Commit.drop_missing_row`). An object's version and its
deletion or replacement are one step on POSIX and S3 tiers (a folder lock; a conditional
request the server checks), so another process's put between the two is never lost. What
remains: those windows on a backend that cannot close them; and unflushed writes of one
chunk by two processes at once, with evictions writing them back meanwhile, can leave an
older value of one standing and an announcement for fsck
(``tests/test_sessions_stateful.py`` interleaves two sessions' writes, flushes, moves and
reopens, on open tiers and on a full one). A write whose object another process deleted
before its commit, its chunk left at the value it replaced, is lost, and said so: the flush
or close raises :class:`~strataio.errors.ChunksNotStoredError` (:meth:`Residency.lose_writes`).

A write whose object was replaced before its commit by something no write of strataio's
stands for (a directory, a file where one of its folders goes, a file put by hand) did not
land either. The commit cannot tell it by the object alone from another process's put, so
it leaves the write out as for one (by the object's version; a file in a folder's place
counts as another object, not as a tier that fails), and then looks at the chunk's rows:
every put of strataio's that replaces an object announces it in the catalog first, so where
another value stands for the chunk (recorded, or the bytes an announced rewrite replaces),
or another writer's announced rewrite, another process wrote it since and its value is
kept, as two unordered writes leave either (:meth:`_lost_for_good`); so too where the
object there holds bytes a row of the chunk names (a writer put an older value back). Where
none does, the write's value is lost (the chunk is back at a value it replaced, or at
none), and the flush or close raises :class:`~strataio.errors.ObjectError` naming the
chunks and what stands where their objects were, as a write something is in the way of
does, rather than return as though the write had been kept. (A parallel job's rank 0, which records every
rank's changes, reports neither loss yet.)

Rewrites in place are announced (:meth:`Commit.announce`) under the session's ``writer`` (see
:mod:`strataio.catalog.liveness`) on every rank: a rank other than 0 opens its own catalog
connection (``catalog_url``) for that, the first time it rewrites a catalogued chunk. So fsck
after a crash resolves at once what a dead job left, and leaves alone what a live one does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from strataio.catalog.base import Catalog, ChunkCopy, CopyId, open_catalog
from strataio.errors import (
    BackendError,
    ExistsError,
    NotFoundError,
    ObjectError,
    StrataError,
    TierDownError,
)
from strataio.storage.base import Version
from strataio.tiers.residency import Batch, Residency, object_key
from strataio.tiers.tier import (
    Tier,
    TierSet,
    checksum,
    in_the_way,
    is_backend_failure,
    refuse_unknown_object,
)

__all__ = ["Commit"]


class Commit:
    """Applies residency changes to ``catalog`` (``None`` where this process holds none) for
    the tiers ``tiers``; ``comm`` is the MPI communicator of a parallel job (``None``: one
    process). ``writer`` is the session's writer id, stamped on every announced rewrite;
    ``catalog_url`` lets a process without ``catalog`` open a connection of its own to
    announce rewrites (empty: it announces nothing). Datasets it closes are marked no longer
    in use by ``writer``."""

    def __init__(
        self,
        tiers: TierSet,
        catalog: Catalog | None,
        comm: Any = None,
        *,
        writer: str = "",
        catalog_url: str = "",
    ) -> None:
        self.tiers = tiers
        self.catalog = catalog
        self.comm = comm
        self.writer = writer
        self.catalog_url = catalog_url
        self._announcer: Catalog | None = None  # opened on first use (no catalog here)
        self._announcer_lock = threading.Lock()
        # announcements committed without waiting for the disk, and how many of them the
        # last sync of the catalog's log covered
        self._announced = self._log_synced = 0
        self._count_lock = threading.Lock()
        # access times kept back (dataset -> chunk key -> POSIX seconds), and the timer that
        # records them (None: none kept)
        self._touches: dict[str, dict[str, float]] = {}
        self._touch_timer: threading.Timer | None = None
        self._touch_lock = threading.Lock()
        # in a parallel job, rank 0's commits that left writes out, per dataset handle, to
        # be judged at the next collective close or share (_lost_in_job)
        self._lost_later: dict[Residency, list[tuple[_Recorded, Batch]]] = {}
        self._lost_lock = threading.Lock()

    #: seconds access times of chunks only read wait before they are recorded: one catalog
    #: transaction for all of them rather than one per dataset closed (0.15–0.2 ms each on
    #: SQLite); another process's eviction round meanwhile sees the older access times
    TOUCH_DELAY_S = 2.0

    @property
    def records(self) -> bool:
        """True if this process writes the catalog (so a commit makes changes durable now)."""
        return self.catalog is not None

    # ----------------------------------------------------------------- residency changes
    def apply(self, res: Residency) -> None:
        """Sync, record and clean up every change buffered in ``res`` (see the module doc).

        Without a catalog only the sync happens; rows and deletions wait for :meth:`close`.
        Raises :class:`BackendError` if a tier fails to sync (nothing is recorded then).
        """
        with res.commit_lock:
            if self.catalog is None:
                self._sync_only(res)
            else:
                self._apply_locked(res)

    def announce(
        self,
        res: Residency,
        intents: Sequence[ChunkCopy],
        expect: Mapping[CopyId, tuple[str, str] | None] | None = None,
        *,
        partly: bool = False,
    ) -> list[str]:
        """Record, before the objects are replaced in place, that the copies ``intents`` are
        being rewritten (state ``in-transit``, the new checksum): after a crash fsck can then
        tell an interrupted rewrite from a corrupt copy. The caller holds the objects' put
        slots (:meth:`Residency.writing`), so no later batch overwrites the announcement
        before the put is recorded. Raises if the catalog cannot take it (nothing was put).

        The announcement is committed without waiting for the disk (``durable=False``): every
        process sees it at once and it survives this process's death, and the next commit
        syncs the catalog's log (:meth:`Catalog.sync_log`) before it syncs the rewritten
        objects, so the flush never makes an object durable ahead of its announcement. What
        an OS crash or power cut before that flush can do is lose the announcement while the
        kernel has written the renamed object back on its own; the copy then fails its old
        checksum, as a rewrite never flushed is lost from any store. A durable announcement
        per call cost one WAL fsync, more than the put itself.

        ``expect``: rows announced only over the catalog row the caller saw at their place
        (see :meth:`Catalog.commit`); where one changed since, :class:`ExistsError` says so,
        or with ``partly`` the others are announced and the keys of those not are returned
        (the caller learns their rows and announces them again)."""
        if not intents:
            return []
        rows = self._stamped(intents)
        with res.commit_lock:  # after any batch taken before, so none overwrites them
            if self.catalog is not None:
                done = self.catalog.commit(rows, [], durable=False, expect=expect)
            elif self.catalog_url:
                done = self._announcing().commit(rows, [], durable=False, expect=expect)
            else:
                return []
            if done.overtaken and partly:
                moved = {(k, t) for _, k, t in done.overtaken}
                res.announced([r for r in rows if (r.key, r.tier) not in moved])
                if len(moved) < len(rows):
                    with self._count_lock:
                        self._announced += 1
                return sorted(k for k, _ in moved)
            if done.overtaken:
                _, key, tier = done.overtaken[0]
                raise ExistsError(
                    f"chunk {key!r} of dataset {res.name!r}: another process changed its "
                    f"copy on tier {tier!r} since this one looked (a rewrite, or a copy of "
                    "its own); not copied there (move it again once that process has flushed)"
                )
            res.announced(rows)
        with self._count_lock:
            self._announced += 1
        return []

    def prepare_copy(
        self, res: Residency, src: ChunkCopy, dst: Tier
    ) -> tuple[bool, Version | None]:
        """Before a move or write-back puts a copy of ``src`` on ``dst`` (the caller holds
        the put slot, :meth:`Residency.writing`): raise :class:`ExistsError` for an object
        there this process holds no copy of (another process's put not recorded yet), and
        announce the put where the catalog may still name a copy there, looking for such an
        object again after the announcement (which may have waited for a commit).

        Returns ``(replace, version)``: whether the put may replace an object there, and
        then the version that object had before the announcement, which the put is to find
        still (``put_checked(over=version)``: another process's rewrite announced since
        stands); None where the tier keeps no versions. Where it may not replace one, it is
        to be put with :meth:`Backend.put_new` (``put_checked(new=True)``), which closes the
        window between this look and the put where the backend can."""
        held = res.holds_object(src.key, dst.name)
        seen: Version | None = None
        if not held:
            refuse_unknown_object(dst, res.name, src.key)
        else:
            got = dst.call(dst.backend.object_versions, [object_key(res.name, src.key)])
            if got is not None:
                if got[0] is None:
                    held = False  # (nothing there now: the put is to find nothing either)
                seen = got[0]
        # (also where it holds the object only as a deletion of its own not carried out
        # yet: another process may have recorded a copy there since, and the announcement,
        # made only over the row this process saw, is refused then)
        if (held and not dst.volatile) or res.catalogued(src.key, dst.name):
            there = res.copy_on(src.key, dst.name)
            old = self.bytes_replaced(dst, res.name, [there]).get(src.key, "") if there else ""
            intent = ChunkCopy(
                res.name, src.key, dst.name, src.nbytes, src.checksum, "in-transit", time.time(),
                old,
            )  # fmt: skip
            # (only over the row this process saw there: a write of another process
            # announced or recorded there since is newer than the bytes moved)
            slot = (res.name, src.key, dst.name)
            self.announce(res, [intent], {slot: res.catalog_row(src.key, dst.name)})
            if not held:
                refuse_unknown_object(dst, res.name, src.key)
        return held, seen

    def bytes_replaced(self, tier: Tier, dataset: str, rows: Sequence[ChunkCopy]) -> dict[str, str]:
        """Per chunk key, the checksum of the bytes the object of each of ``rows`` (copies of
        ``dataset`` on ``tier``) holds, where the row is a rewrite another writer announced
        and that writer is dead: a rewrite or copy announced over it replaces those bytes,
        and its row, naming one old version only, must name them. The dead writer's object
        holds its old bytes or its new ones, whichever its put left, and nothing changes
        them any more, so they are read and checked here. Left out: rows of live writers,
        whose puts may still land (an announcement over one names its new bytes), and
        objects that hold neither version."""
        others = [
            c for c in rows if c.state == "in-transit" and c.writer and c.writer != self.writer
        ]
        if not others or self.catalog is None:
            return {}
        dead = {c.writer for c in others} - self.catalog.alive({c.writer for c in others})
        out: dict[str, str] = {}
        for c in others:
            if c.writer not in dead:
                continue
            digest = checksum_there(tier, dataset, c.key)
            if digest and digest in (c.checksum, c.old_checksum):
                out[c.key] = digest
        return out

    def drop_missing_row(self, res: Residency, copy: ChunkCopy) -> None:
        """Delete the row of ``copy``, whose object was found missing and which ``res`` has
        forgotten, in a transaction of its own: only if it is still the row ``res`` saw and
        not its chunk's last (so a loss stays visible), only while the object is still
        missing when the transaction looks again (another process may have put a copy there
        since, a stage back after a migration, and recorded it in a row just like the one
        seen: dropping that row left its object unnamed), and only where this process holds
        the catalog and no commit of ``res`` is under way (else fsck repairs it)."""
        if self.catalog is None or self.comm is not None:
            return
        if not res.commit_lock.acquire(timeout=1.0):
            return  # (this thread may be the one committing)
        try:
            if res.copy_on(copy.key, copy.tier) is not None:
                return  # recorded again meanwhile
            row = (res.name, copy.key, copy.tier)
            tier, obj = self.tiers[copy.tier], object_key(res.name, copy.key)

            def present(ids: Sequence[CopyId]) -> set[CopyId]:
                # (inside the transaction: another process may have put a copy there since
                # the object was found missing, and recorded it in a row like the one seen)
                try:
                    there = tier.backend.exists(obj)
                except Exception:
                    there = True  # (the tier cannot tell: the row stays, for fsck)
                return set(ids) if there else set()

            with contextlib.suppress(StrataError):
                done = self.catalog.commit(
                    deletes=[row],
                    expect={row: (copy.state, copy.checksum)},
                    dropped=[],
                    present=present,
                )
                if not done.kept:
                    res.row_dropped(copy)
        finally:
            res.commit_lock.release()

    def close(self, res: Residency) -> None:
        """The last commit of a dataset being closed; the dataset is then no longer in use by
        this session's writer. In a parallel job this is collective: rank 0 records every
        rank's changes in one transaction, and every rank raises if it failed."""
        try:
            if self.comm is None:
                self.apply(res)
            else:
                self._close_parallel(res)
        finally:
            with self._lost_lock:  # (a close that failed before judging them: none to say)
                self._lost_later.pop(res, None)
            if self.catalog is not None and self.writer:
                # if the catalog cannot take it, the mark goes with the writer at session close
                with contextlib.suppress(StrataError):
                    self.catalog.unuse_dataset(res.name, self.writer)

    def _close_parallel(self, res: Residency) -> None:
        err: BaseException | None = None
        batch = Batch()
        with res.commit_lock:
            try:
                if self.catalog is not None:
                    # rank 0 commits its own changes as a single process does
                    self._apply_locked(res)
                else:
                    batch = res.take_batch()
                    self._sync(res.name, batch)
            except BaseException as exc:
                err = exc
        gathered = self.comm.gather((batch.for_rank_0(), err is not None), root=0)
        superseded: list[tuple[str, str]] = []
        spared, lost = _Spared(), ({}, {}, set())
        if self.catalog is not None and err is None:
            try:
                if any(failed for _, failed in gathered):
                    raise BackendError(f"dataset {res.name!r}: a rank could not sync its chunks")
                every = Batch()
                for b, _ in gathered:
                    every.upserts.extend(b.upserts)
                    every.deletes.extend(b.deletes)
                    every.touches.update(b.touches)
                    every.written.update(b.written)
                    every.moved.update(b.moved)
                    every.dropped |= b.dropped
                    every.rewritten |= b.rewritten
                    every.revalidated |= b.revalidated
                    for k, was in b.overwritten.items():
                        every.overwritten.setdefault(k, set()).update(was)
                done = self._record(res.name, every)
                superseded = [(t, k) for _, k, t in done.superseded]
                spared = _Spared.of(done, every)
                lost = self._lost_in_job(res, (done, every))
            except BaseException as exc:
                err = exc
        failed, spared, lost = self.comm.bcast(
            (None if err is None else repr(err), spared, lost), root=0
        )
        if err is not None:
            if self.catalog is None:
                res.restore(batch)
            raise err
        if failed is not None:
            res.restore(batch)
            raise BackendError(f"dataset {res.name!r}: closing failed on rank 0: {failed}")
        res.lose_writes(*lost)  # (reported by the store, on every rank alike)
        if self.catalog is None:
            self._delete_unspared(res, batch.obsolete, spared)
        elif superseded:
            self._delete(res, superseded)  # (rank 0's own obsolete objects went above)

    def share(self, res: Residency) -> list[str]:
        """Collective, in a parallel job: every rank makes its writes durable and hands its
        buffered changes of ``res`` to rank 0, which records them with its own; then each
        rank deletes the objects its own changes made obsolete (before anything moves: a
        move may put a new object under the same name). Afterwards rank 0's residency and the
        catalog know every rank's chunks. Returns, on every rank, the keys of chunks another
        rank wrote new content for.

        A failure anywhere raises on every rank: changes not handed over stay buffered where
        they are, handed-over ones rank 0 could not record stay buffered on rank 0.
        """
        comm = self.comm
        assert comm is not None, "share() is for parallel jobs"
        err: BaseException | None = None
        batch = Batch()
        with res.commit_lock:
            try:
                if self.catalog is None:
                    batch = res.take_batch()
                    self._sync(res.name, batch)
                else:
                    # rank 0 makes its own writes durable; they are recorded with the others
                    self._sync_only(res)
            except BaseException as exc:
                err = exc
                if self.catalog is None:
                    res.restore(batch)
                batch = Batch()
        err = _first_error(comm, err)
        if err is not None:
            raise err
        gathered = comm.gather(batch.for_rank_0(), root=0)
        changed: list[str] = []
        spared, lost = _Spared(), ({}, {}, set())
        if self.catalog is not None:
            try:
                for theirs in gathered[1:]:
                    changed.extend(res.adopt(theirs))
                with res.commit_lock:
                    spared = self._apply_locked(res)
                lost = self._lost_in_job(res)  # (each rank's next flush or close says them)
            except BaseException as exc:
                err = exc
        err, changed, spared, lost = comm.bcast((err, sorted(set(changed)), spared, lost), root=0)
        if err is not None:
            # handed over, but not recorded: rank 0 keeps the rows; the objects they made
            # obsolete stay this rank's to delete once they are (at close)
            res.restore(Batch(obsolete=batch.obsolete))
            raise err
        res.lose_writes(*lost)
        try:
            if self.catalog is None:
                self._delete_unspared(res, batch.obsolete, spared)
        except BaseException as exc:
            err = exc
        err = _first_error(comm, err)
        if err is not None:
            raise err
        return changed

    def shutdown(self) -> None:
        """Close the catalog connection this object opened to announce rewrites, if any."""
        with self._announcer_lock:
            if self._announcer is not None:
                with contextlib.suppress(Exception):
                    self._announcer.close()
                self._announcer = None

    # ----------------------------------------------------------------- tiers
    def tier_changed(self, tier: Tier) -> None:
        """Record a tier's health change in the catalog (if it cannot take it, the in-memory
        state still steers this process)."""
        if self.catalog is not None:
            with contextlib.suppress(StrataError):
                self.catalog.set_tier_state(tier.name, tier.state, tier.last_error)

    # ----------------------------------------------------------------- steps
    def _apply_locked(self, res: Residency) -> _Spared:
        """Commit ``res``'s buffered changes (rank 0's, other ranks' adopted among them, in a
        parallel job). Returns what other ranks must not delete of the objects their own
        changes made obsolete (:class:`_Spared`): a chunk whose write was left out keeps the
        copies that write replaced."""
        assert self.catalog is not None
        batch = res.take_batch()
        if batch.empty:
            self._delete_stranded(res)
            return _Spared()
        try:
            # the objects this batch deletes as they are before its rows go: another
            # process may put a new object there once they have gone (see _delete)
            seen = self._versions_of(res.name, batch.obsolete)
            self._sync(res.name, batch)
            done = self._record(res.name, batch)
        except BaseException:
            res.restore(batch)
            raise
        kept_ids = set(done.kept)
        res.recorded(
            batch,
            done.left_out,
            [*(i for i in batch.deletes if i not in kept_ids), *done.superseded],
        )
        # a write or move left out (its object replaced or deleted by another process, or
        # rewritten by another writer) takes nothing with it: the other copies of its chunk,
        # rows and objects, are what is left of the chunk. Not so a move left out as
        # orphaned (its chunk rewritten since it read it): the catalog deleted the rows its
        # batch dropped, so their objects go too (they would be left for fsck else)
        spared = _Spared.of(done, batch)
        kept = spared.kept | {o for o in batch.obsolete if o[1] in spared.void}
        # an orphaned move's object goes only while it is the one the move put: another
        # process's write may have replaced it, and recorded it, since
        put_by_moves = {
            (t, k): batch.moved[k, t]
            for _, k, t in done.orphaned
            if batch.moved.get((k, t)) is not None
        }
        again = False
        try:
            try:
                again = self._delete(
                    res,
                    [o for o in batch.obsolete if o not in kept]
                    + [(t, k) for _, k, t in [*done.superseded, *done.orphaned]],
                    {**seen, **put_by_moves},
                    keep=batch.migrated_off,
                )
            finally:
                res.deleted(kept)  # (kept, not deleted: puts of them may go on)
            self._relearn(res, done)
            self._delete_stranded(res)
        finally:
            # (last: its look at the catalog may fail, and the batch's objects are dealt
            # with first, whatever it finds)
            if done.lost or done.displaced:
                if self.comm is None:
                    self._note_lost(res, done, batch)
                else:
                    # (judged at the job's next collective close or share, once every rank's
                    # puts are recorded: another rank's put of the chunk is no loss)
                    with self._lost_lock:
                        self._lost_later.setdefault(res, []).append((done, batch))
        if again:
            # a migration's copies whose deletion was refused are catalogued again now, not
            # left to fsck as orphans (README: a migration keeps the copies there)
            spared |= self._apply_locked(res)
        return spared

    def _lost_in_job(
        self, res: Residency, *more: tuple[_Recorded, Batch]
    ) -> tuple[dict[str, str], dict[str, str], set[str]]:
        """Rank 0 of a parallel job, at a collective close or share, all ranks' changes
        recorded: the writes of the commits since the last such call (and of ``more``) whose
        values are lost (:meth:`_note_lost`), as :meth:`Residency.take_lost_writes` gives
        them, for every rank to report."""
        with self._lost_lock:
            held = self._lost_later.pop(res, [])
        for done, batch in [*held, *more]:
            if done.lost or done.displaced:
                self._note_lost(res, done, batch)
        return res.take_lost_writes()

    def _note_lost(self, res: Residency, done: _Recorded, batch: Batch) -> None:
        """Note in ``res`` the writes of ``batch`` the commit ``done`` left out whose
        values are lost (:meth:`_lost_for_good`), for the flush or close to report."""
        gone, valueless = self._lost_for_good(
            res.name, {**done.lost, **done.displaced}, batch.overwritten, done.displaced
        )
        res.lose_writes(
            {k: t for k, t in gone.items() if k in done.lost},
            {
                k: self._what_is_there(self.tiers[t], res.name, k)
                for k, t in gone.items()
                if k in done.displaced
            },
            valueless,
        )

    def _relearn(self, res: Residency, done: _Recorded) -> None:
        """After a commit that found rows this residency's view of which was stale (another
        process's put replaced a copy; a row it deleted had changed since, or was its
        chunk's last): learn those chunks' rows from the catalog."""
        keys = {k for _, k, _ in [*done.kept, *done.left_out]}
        if keys and self.catalog is not None:
            res.refresh_from(self.catalog, sorted(keys))

    def _record(self, dataset: str, batch: Batch) -> _Recorded:
        """Record ``batch``'s rows in one transaction; access times of chunks only read are
        recorded as access times (one statement batch, at the latest time among them: LRU
        order is kept between commits). Its written copies supersede every other copy of
        their chunk; its written and moved copies are left out where another process
        replaced their object since it was put (by its version); no chunk but those it
        dropped loses its last copy (see :meth:`Catalog.commit`)."""
        assert self.catalog is not None
        if batch.touches:
            self._keep_touches(dataset, batch.touches)
        if not (batch.upserts or batch.deletes):
            return _Recorded([], [], set(), [])
        replaced: set[CopyId] = set()
        missing: set[CopyId] = set()
        puts = {**batch.moved, **batch.written}

        def stale(ids: Sequence[CopyId]) -> set[CopyId]:
            now = self._versions_now(dataset, ids, puts)
            replaced.update(c for c, v in now.items() if v != puts[c[1], c[2]])
            missing.update(c for c, v in now.items() if v is None)
            return replaced

        done = self.catalog.commit(
            self._stamped(batch.upserts),
            batch.deletes,
            supersede=[(dataset, c.key, c.tier) for c in batch.upserts if c.key in batch.rewritten],
            stale=stale,
            # (in a parallel job each rank deletes the objects its own changes made
            # obsolete, and none learns which rows rank 0's commit kept: no keeping there)
            dropped=[(dataset, k) for k in batch.dropped] if self.comm is None else None,
            expect=batch.expect if self.comm is None else None,
            # (a move's copy of a chunk rewritten elsewhere since holds the old value; its
            # object is the mover's to delete, which only a single process knows here)
            copied=[(dataset, k, t) for k, t in batch.moved if k not in batch.rewritten]
            if self.comm is None
            else (),
            revalidated=[(dataset, k, t) for k, t in batch.revalidated],
            writer=self.writer,
            sizes=functools.partial(self._sizes_now, dataset),
        )
        left_out = replaced | set(done.orphaned) | set(done.overtaken)
        # written copies whose object is gone, or is another (whether that lost the write,
        # _lost_for_good decides from the rows now: a write-back of the same bytes recorded
        # here keeps it, and another process's write recorded or announced there wins)
        lost = {k: t for _, k, t in missing if (k, t) in batch.written}
        displaced = {k: t for _, k, t in replaced - missing if (k, t) in batch.written}
        return _Recorded(done.superseded, done.kept, left_out, done.orphaned, lost, displaced)

    def _lost_for_good(
        self,
        dataset: str,
        lost: dict[str, str],
        overwritten: Mapping[str, set[str]],
        displaced: Collection[str] = (),
    ) -> tuple[dict[str, str], set[str]]:
        """Of the writes ``lost`` (key -> tier: their objects gone, or replaced by another,
        before the commit), those whose chunk now holds no committed value but the ones they
        replaced (``overwritten``), and no rewrite another writer announced at the write's
        place: it went back to an older value, or to none. Where another value stands, or
        another writer's announcement there (whose old bytes may be the very ones this
        write replaced: it did not know of this write), another process wrote the chunk
        since, and its value is the one kept (as two unordered writes of one chunk leave
        either): that process's put is what replaced the object. So too where the object
        that replaced one of ``displaced`` (keys) holds bytes a row of the chunk names: a
        writer put back a value this write replaced. Else nothing of strataio's replaced it
        (a directory, a file put by hand), and the write is lost. Second, those lost writes
        whose chunk has rows on no other tier than the write's: a rewrite in place replaced
        the chunk's only copy, whose value went with it."""
        assert self.catalog is not None
        now: dict[str, set[str]] = {k: set() for k in lost}
        named: dict[str, set[str]] = {k: set() for k in lost}  # every version rows name
        where: dict[str, set[str]] = {k: set() for k in lost}  # the tiers rows name
        others: set[str] = set()  # chunks another writer has announced a rewrite of there
        for c in self.catalog.residency(dataset, sorted(lost)):
            if c.key in now:
                now[c.key].add(c.committed_checksum)
                named[c.key].update((c.checksum, c.old_checksum))
                where[c.key].add(c.tier)
                # (only at the write's own place: another writer's put elsewhere, or a dead
                # writer's announcement there, replaced no object of this write)
                if c.tier == lost[c.key] and c.rewritten_by_other(self.writer):
                    others.add(c.key)
        gone = {
            k: t for k, t in lost.items() if k not in others and now[k] <= overwritten.get(k, set())
        }
        # an object another writer put may hold a value this write replaced (a writer
        # putting the chunk's older value back): its bytes are a version a row names
        for k in [k for k in gone if k in displaced]:
            there = checksum_there(self.tiers[gone[k]], dataset, k)
            if there and there in named[k]:
                del gone[k]
        return gone, {k for k, t in gone.items() if where[k] == {t}}

    @staticmethod
    def _what_is_there(tier: Tier, dataset: str, key: str) -> str:
        """In words, what stands on ``tier`` where a write of chunk ``key`` of ``dataset``
        put its object, now another (see :meth:`_lost_for_good`)."""
        obj = object_key(dataset, key)
        try:
            n = tier.call_alone(tier.backend.size, obj)
        except ObjectError as exc:
            return str(exc)  # (names the path, and what is in the way there)
        except NotFoundError:
            return f"tier {tier.name!r}: nothing any more at object {obj!r}"
        except StrataError as exc:
            return f"tier {tier.name!r}: object {obj!r} cannot be looked at ({exc})"
        return (
            f"tier {tier.name!r}: object {obj!r} is another, of {n} bytes, that no write "
            "recorded or announced in the catalog stands for (put there by hand?)"
        )

    def _versions_now(
        self, dataset: str, ids: Sequence[CopyId], puts: dict[tuple[str, str], Any]
    ) -> dict[CopyId, Version | None]:
        """Of the copies ``ids`` this process put (``puts``: the version each put left), the
        version of their objects now (None: gone); another version than the put's is
        another process's put. A tier that cannot say (no versions, down, failing) gives
        none of its objects: they are taken as they were put."""
        by_tier: dict[str, list[CopyId]] = {}
        for c in ids:
            if puts.get((c[1], c[2])) is not None:
                by_tier.setdefault(c[2], []).append(c)
        out: dict[CopyId, Version | None] = {}
        for name, mine in by_tier.items():
            tier = self.tiers[name]
            if not tier.up:
                continue
            objs = [object_key(dataset, k) for _, k, _ in mine]
            try:
                now = tier.backend.object_versions(objs)
            except Exception:
                now = _versions_alone(tier, objs)
            if now is not None:
                out.update(zip(mine, now))
        return out

    def _sizes_now(self, dataset: str, ids: Sequence[CopyId]) -> dict[CopyId, int]:
        """The size of the objects of copies ``ids`` now (those a tier can say)."""
        out: dict[CopyId, int] = {}
        for i in ids:
            tier = self.tiers[i[2]]
            with contextlib.suppress(Exception):
                out[i] = int(tier.backend.size(object_key(dataset, i[1])))
        return out

    def _keep_touches(self, dataset: str, touches: Mapping[str, float]) -> None:
        """Keep back access times of chunks of ``dataset``: a timer records all of them once
        the oldest has waited :attr:`TOUCH_DELAY_S` (at once where that is 0)."""
        with self._touch_lock:
            kept = self._touches.setdefault(dataset, {})
            for key, when in touches.items():
                kept[key] = max(when, kept.get(key, 0.0))
            now = self.TOUCH_DELAY_S <= 0
            if not now and self._touch_timer is None:
                self._touch_timer = threading.Timer(self.TOUCH_DELAY_S, self.record_touches)
                self._touch_timer.daemon = True
                self._touch_timer.start()
        if now:
            self.record_touches()

    def record_touches(self) -> None:
        """Record every access time kept back (one statement batch per dataset, at the latest
        time among its chunks, as a commit records them). Advisory: where the catalog cannot
        take them, they are dropped."""
        with self._touch_lock:
            kept, self._touches = self._touches, {}
            timer, self._touch_timer = self._touch_timer, None
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()
        if self.catalog is None:
            return
        for dataset, touches in kept.items():
            with contextlib.suppress(StrataError):
                self.catalog.touch(dataset, sorted(touches), max(touches.values()))

    def _stamped(self, rows: Sequence[ChunkCopy]) -> list[ChunkCopy]:
        """``rows`` with this session's writer on every announced rewrite."""
        return [
            c._replace(writer=self.writer)
            if c.state == "in-transit" and not c.writer and self.writer
            else c
            for c in rows
        ]

    def reachable_catalog(self) -> Catalog | None:
        """The catalog this process writes: its own, or where it holds none (a parallel
        job's rank other than 0) the connection it opens of its own on first use
        (``catalog_url``), as for announcements; None where it has neither."""
        if self.catalog is not None:
            return self.catalog
        return self._announcing() if self.catalog_url else None

    def rows_now(self, dataset: str, keys: Sequence[str]) -> list[ChunkCopy]:
        """The catalog's rows of chunks ``keys`` of ``dataset`` now, through this process's
        catalog or, on the other ranks of a job, the connection they announce through."""
        catalog = self.catalog if self.catalog is not None else self._announcing()
        return catalog.residency(dataset, list(keys))

    def _announcing(self) -> Catalog:
        with self._announcer_lock:
            if self._announcer is None:
                self._announcer = open_catalog(self.catalog_url)
            return self._announcer

    def _sync_announcements(self) -> None:
        """Sync the catalog's log if announcements were committed without waiting for the
        disk since it was last synced: an object synced before its announcement could
        outlive a power cut that the announcement does not."""
        with self._count_lock:
            announced = self._announced  # (all committed before the sync below)
        if announced == self._log_synced:
            return
        catalog = self.catalog if self.catalog is not None else self._announcing()
        catalog.sync_log()
        with self._count_lock:
            self._log_synced = max(self._log_synced, announced)

    def _sync_only(self, res: Residency) -> None:
        batch = res.take_batch()
        try:
            self._sync(res.name, batch)
        except BaseException:
            res.restore(batch)
            raise
        # the rows stay buffered for close; the synced objects need no second sync
        batch.unsynced = {}
        res.restore(batch)

    def _sync(self, dataset: str, batch: Batch) -> None:
        """Make the objects put since the last commit durable, after the announcements of
        the rewrites among them (:meth:`_sync_announcements`)."""
        if batch.unsynced:
            self._sync_announcements()
        failed = []
        for tier_name, keys in batch.unsynced.items():
            tier = self.tiers[tier_name]
            # called even on a tier marked down since the puts: where puts are durable on
            # return (S3) this is a no-op and the copies stand
            try:
                tier.backend.sync(sorted(object_key(dataset, k) for k in keys))
            except Exception as exc:
                if in_the_way(exc) is not None:
                    # (an object's failure, not the tier's: the others are synced. In one
                    # process the commit's look at its version finds it replaced, and the
                    # flush reports it; a parallel job's ranks report no such losses, so
                    # its flush fails here)
                    if self.comm is None:
                        continue
                elif tier.refused(exc) is None:
                    tier.mark_down(exc)
                failed.append(f"{tier_name}: {exc}")
        if failed:
            raise BackendError(
                f"dataset {dataset!r}: written chunks may not be durable ({'; '.join(failed)}); "
                "they stay buffered: flush again once the tier answers, or write those chunks "
                "again, which stores them on a tier that answers"
            )

    def _versions_of(
        self, dataset: str, objs: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], Any]:
        """The version of each object ``(tier, key)`` of ``dataset`` where its tier keeps
        versions and answers (one look per tier); :data:`_MISSING` for one not there. A
        down tier is probed again first (:meth:`Tier.recheck`): one that answers again has
        the copies a write made obsolete while it was down deleted now, not left to fsck."""
        by_tier: dict[str, list[str]] = {}
        for tier_name, key in objs:
            by_tier.setdefault(tier_name, []).append(key)
        seen: dict[tuple[str, str], Any] = {}
        for tier_name, keys in by_tier.items():
            tier = self.tiers[tier_name]
            if tier.volatile or not tier.recheck():
                continue
            try:
                got = tier.backend.object_versions([object_key(dataset, k) for k in keys])
            except Exception:  # (no versions to compare: deleted unchecked, as before)
                continue
            if got is not None:
                # (an object missing then is none of this batch's: one there later is another
                # process's put)
                seen.update(
                    ((tier_name, k), _MISSING if v is None else v) for k, v in zip(keys, got)
                )
        return seen

    def _delete(
        self,
        res: Residency,
        objs: list[tuple[str, str]],
        seen: Mapping[tuple[str, str], Any] | None = None,
        *,
        keep: Mapping[tuple[str, str], ChunkCopy] | None = None,
    ) -> bool:
        """Delete objects no row names any more. An object ``seen`` at a version before its
        row went is deleted only while it is still at that version: else another process put
        it anew since (its own row names it, or will); one seen missing then is not deleted
        (one there now is such a put). Those on a tier that is down (probed again first:
        :meth:`Tier.recheck`) or fails stay this process's to delete (:meth:`Residency.strand`):
        each later commit tries them again (:meth:`_delete_stranded`), so a blip of a tier
        leaves no orphan behind a running job; fsck removes what is left when it ends. Those
        on a read-only tier stay where they are (:attr:`Tier.read_only`); those on a tier
        whose storage refuses changes (:attr:`Tier.writes_refused`, now or found so by the
        deletion) are stranded, as on a tier that is down, and not tried while it refuses,
        but for the copies a migration dropped (``keep``: :attr:`Batch.migrated_off`), which
        are recorded again (:meth:`Residency.keep_refused`: a migration keeps the copies on
        a tier that takes no changes, catalogued). True where any was: the caller commits
        again."""
        seen = seen or {}
        keep = keep or {}
        stranded: list[tuple[str, str]] = []
        refused: list[tuple[str, str]] = []
        by_tier: dict[str, tuple[list[str], list[Any], list[str], list[str]]] = {}
        for tier_name, key in objs:
            was = seen.get((tier_name, key))
            if was is _MISSING or self.tiers[tier_name].read_only:
                continue  # (nothing of this commit's there to delete, or nothing deleted there)
            if self.tiers[tier_name].writes_refused:
                refused.append((tier_name, key))
                continue
            checked, versions, unchecked, keys = by_tier.setdefault(tier_name, ([], [], [], []))
            keys.append(key)
            if was is not None:
                checked.append(object_key(res.name, key))
                versions.append(was)
            else:
                unchecked.append(object_key(res.name, key))
        try:
            for tier_name, (checked, versions, unchecked, keys) in by_tier.items():
                tier = self.tiers[tier_name]
                try:
                    _probed(tier)
                    if checked:
                        tier.backend.delete_if_many(checked, versions)
                    for obj in unchecked:
                        tier.backend.delete(obj)
                except Exception as exc:
                    _failed(tier, exc)
                    (refused if tier.writes_refused else stranded).extend(
                        (tier_name, k) for k in keys
                    )
        finally:
            again = False
            for obj in refused:
                if obj in keep and self._still_there(res, obj):
                    again = res.keep_refused(keep[obj], seen.get(obj)) or again
                else:
                    stranded.append(obj)
            res.strand(stranded)
            res.deleted(objs)
        return again

    def _delete_unspared(
        self, res: Residency, objs: list[tuple[str, str]], spared: _Spared
    ) -> None:
        """Delete the objects ``objs`` a rank's handed-over changes made obsolete (``(tier,
        key)``), but those rank 0's commit ``spared``: where the chunk's write was left out
        (its object gone or replaced before the commit), the copies it replaced are what is
        left of the chunk."""
        keep = [o for o in objs if o in spared.kept or o[1] in spared.void]
        try:
            self._delete(res, [o for o in objs if o not in keep])
        finally:
            res.deleted(keep)  # (kept, not deleted: puts of them may go on)

    def _still_there(self, res: Residency, obj: tuple[str, str]) -> bool:
        """Whether the object ``obj`` (``(tier, key)``) of ``res``'s dataset is there (a
        read; False where the tier cannot tell)."""
        tier = self.tiers[obj[0]]
        try:
            return bool(tier.backend.exists(object_key(res.name, obj[1])))
        except Exception:
            return False

    def _delete_stranded(self, res: Residency) -> None:
        """Delete the objects an earlier commit could not (:meth:`Residency.strand`) on the
        tiers that answer now: each only while the catalog names no copy there (another
        process may have recorded one since the row went) and still at the version it had
        before that look; those on a tier that refuses changes now
        (:attr:`Tier.writes_refused`) wait for a later commit. Where this process holds no
        catalog they wait for fsck."""
        if self.catalog is None:
            return
        objs = res.take_stranded()
        if not objs:
            return
        by_tier: dict[str, list[str]] = {}
        left: list[tuple[str, str]] = []
        for tier_name, key in objs:
            tier = self.tiers[tier_name]
            if tier.writes_refused and not tier.read_only:
                left.append((tier_name, key))  # (deleted once it takes changes again)
            elif not tier.read_only:  # (nothing there is deleted)
                by_tier.setdefault(tier_name, []).append(key)
        try:
            for tier_name, keys in by_tier.items():
                tier = self.tiers[tier_name]
                names = [object_key(res.name, k) for k in keys]
                try:
                    _probed(tier)
                    versions = tier.backend.object_versions(names)
                except Exception as exc:
                    _failed(tier, exc)
                    left += [(tier_name, k) for k in keys]
                    continue
                try:
                    rows = self.catalog.residency(res.name, keys)
                except StrataError:  # (the catalog cannot say now: the next commit asks again)
                    left += [(tier_name, k) for k in keys]
                    continue
                named = {c.key for c in rows if c.tier == tier_name}
                try:
                    for key, obj, v in zip(keys, names, versions or [...] * len(keys)):
                        if key in named or v is None:
                            continue  # (another process's copy now, or gone already)
                        if v is ...:  # (a tier that keeps no versions)
                            tier.backend.delete(obj)
                        else:
                            tier.backend.delete_if(obj, v)
                except Exception as exc:
                    _failed(tier, exc)
                    left += [(tier_name, k) for k in keys]
        finally:
            res.strand(left)
            res.deleted(objs)


def _probed(tier: Tier) -> None:
    """Raise :class:`TierDownError` unless ``tier`` is up, probing it again where it is down
    and due for a probe (:meth:`Tier.recheck`)."""
    if not tier.recheck():
        raise TierDownError(f"tier {tier.name!r} is down")


def _failed(tier: Tier, exc: Exception) -> None:
    """Deal with ``exc`` raised while deleting objects on ``tier``: re-raised unless the
    backend failed; a tier that failed is marked down (one found down already stays so), but
    for one object that cannot be used (:meth:`Tier.object_error`), and for storage that
    refuses changes while it is read (:meth:`Tier.refused`: marked so): the tier answers."""
    if not is_backend_failure(exc):
        raise exc
    if isinstance(exc, TierDownError) or tier.object_error(exc) is not None:
        return
    if tier.refused(exc) is None:
        tier.mark_down(exc)


#: the version :meth:`Commit._versions_of` gives an object found missing
_MISSING = object()

#: the version :func:`_versions_alone` gives an object something is in the way of (a file
#: where one of its folders should be): no put leaves it
_IN_THE_WAY = object()


def _versions_alone(tier: Tier, objs: Sequence[str]) -> list[Any] | None:
    """The versions of ``objs`` on ``tier`` looked at one at a time, once a look at all of
    them failed: :data:`_IN_THE_WAY` for an object something is in the way of
    (:meth:`Tier.object_error`); None where the tier keeps no versions or fails otherwise
    (it cannot say)."""
    out: list[Any] = []
    for obj in objs:
        try:
            got = tier.backend.object_versions([obj])
        except Exception as exc:
            if tier.object_error(exc, obj) is None:
                return None
            out.append(_IN_THE_WAY)
            continue
        if got is None:
            return None
        out.extend(got)
    return out


@dataclasses.dataclass(frozen=True)
class _Recorded:
    """What a commit of a batch found (see :meth:`Commit._record`): copies superseded and
    copies kept (as :class:`CommitOutcome`), the copies left out because another
    process's put replaced their object or is replacing it (a rewrite announced there
    since a move put it), or (``orphaned``, their objects this process's to delete)
    because another process rewrote their chunk since a move copied it."""

    superseded: list[CopyId]
    kept: list[CopyId]
    left_out: set[CopyId]
    orphaned: list[CopyId]
    #: written chunks whose new copy (key -> its tier) was gone before the commit (their
    #: writes may be lost: see Commit._lost_for_good)
    lost: dict[str, str] = dataclasses.field(default_factory=dict)
    #: written chunks whose new copy (key -> its tier) was replaced by another object before
    #: the commit (by another process's write, or by something no write stands for: see
    #: Commit._lost_for_good)
    displaced: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Spared:
    """What a commit keeps of the objects its batch made obsolete: ``void``, chunks whose
    write or move the commit left out (each keeps the copies it would have replaced), and
    ``kept``, copies (``(tier, key)``) whose rows the commit kept."""

    void: set[str] = dataclasses.field(default_factory=set)
    kept: set[tuple[str, str]] = dataclasses.field(default_factory=set)

    @classmethod
    def of(cls, done: _Recorded, batch: Batch) -> _Spared:
        orphaned = set(done.orphaned)
        return cls(
            {
                k
                for _, k, t in done.left_out - orphaned
                if (k, t) in batch.written or (k, t) in batch.moved
            },
            {(t, k) for _, k, t in done.kept},
        )

    def __ior__(self, other: _Spared) -> _Spared:
        self.void |= other.void
        self.kept |= other.kept
        return self


def _first_error(comm: Any, err: BaseException | None) -> BaseException | None:
    """The lowest rank's error, on every rank (collective)."""
    errs = comm.gather(err, root=0)
    first = next((e for e in errs if e is not None), None) if errs is not None else None
    return comm.bcast(first, root=0)


def checksum_there(tier: Tier, dataset: str, key: str) -> str | None:
    """The checksum of chunk ``key`` of ``dataset``'s object on ``tier`` as it is now, read
    whole (None where it is gone or cannot be read)."""
    try:
        return checksum(tier.call(tier.backend.get, object_key(dataset, key)))
    except (OSError, StrataError):
        return None
