"""The Mover: asynchronous stage / prefetch / migrate of chunks between tiers (APRIL §§4–5).

Each operation returns a :class:`MoveHandle` at once and runs on a thread pool, so the caller
computes while chunks move (APRIL's ``T_STAGE_SECTION`` + ``T_STAGE_WAIT``). Transfers through
a tier hold one of that tier's concurrency slots (a tape has few drives). A stage copies only
chunks that are not already on a tier at least as fast as the target (Figure 4: a second read
overlapping the first stages only the new sub-files).

A migration moves each chunk in the order that keeps it safe across a crash: copy → durable put
(fsync / completed PUT) → read back and verify the checksum → commit the new residency (one
catalog transaction for the whole move) → delete the source copies. Until the commit the
catalog names only the source; after it, the destination, and a leftover source object is an
orphan that fsck removes. The commit is :meth:`strataio.tiers.commit.Commit.apply`, run when the
move's last chunk is done.

A move that finds the chunk rewritten meanwhile records nothing (the new version is where its
write put it); a source copy found missing is forgotten and the next copy of its bytes is
used, as it is for a source copy something not strataio's is in the way of
(:class:`ObjectError`, which leaves its tier up and its row as it is); where none is left,
the chunk's rows are learned again from the catalog (another process moved it since they
were looked up) and its copies there are tried. Something in the way at the destination fails that
chunk's move (:attr:`MoveResult.failed` names it), its tier left up. A prefetch
stages to the fastest memory tier when one is configured (a volatile cache level, see
:mod:`strataio.tiers.tier`), else reads into the in-process chunk cache.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from strataio.catalog.base import ChunkCopy
from strataio.errors import (
    ChecksumError,
    ExistsError,
    NotFoundError,
    ObjectError,
    ReadOnlyError,
    StrataError,
    TierDownError,
    WritesRefusedError,
)
from strataio.tiers.cache import ChunkCache
from strataio.tiers.commit import Commit
from strataio.tiers.placement import Placement
from strataio.tiers.residency import Residency, object_key, same_bytes
from strataio.tiers.tier import (
    Tier,
    TierSet,
    accepts_data,
    checksum_like,
    put_checked,
    read_checked,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a move is: chunks finished (moved, reused or failed) of ``total``, and bytes."""

    done: int
    total: int
    nbytes: int

    @property
    def fraction(self) -> float:
        return 1.0 if self.total == 0 else self.done / self.total


@dataclass(slots=True)
class MoveResult:
    """The outcome of one move. ``moved``: chunks copied; ``reused``: chunks already where
    the move wanted them; ``unwritten``: chunks never written (they read as the fill value:
    nothing to move); ``no_room``: chunks a stage or prefetch left where they were because
    no tier it could put them on had room (each full, nothing on it could be evicted; a
    move never evicts its own chunks; the chunks stay readable where they are, so this is
    not a failure); ``failed``:
    ``(key, message)`` pairs; ``nbytes``: bytes copied; ``seconds``: wall time from start
    to commit. Of the copies a migration takes off faster tiers, or an eviction off its
    tier: ``removed``, their rows and objects gone; ``left``, their rows gone while their
    objects could not be deleted (the tier down or failing: the process deletes them at a
    later commit once it answers, else ``strataio fsck --repair`` does); ``kept`` (a
    migration's), left there, catalogued, as the tier takes no writes (configured
    read-only, or its storage refuses them) or another process changed the copy since the
    move looked (a rewrite, say: its row then stays)."""

    op: str
    total: int = 0
    moved: int = 0
    reused: int = 0
    unwritten: int = 0
    no_room: int = 0
    cancelled: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    failed: list[tuple[str, str]] = field(default_factory=list)
    removed: int = 0
    left: int = 0
    kept: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def done_count(self) -> int:
        """Chunks dealt with so far, whatever their outcome."""
        return (
            self.moved
            + self.reused
            + self.unwritten
            + self.no_room
            + self.cancelled
            + len(self.failed)
        )

    def checked(self) -> MoveResult:
        """This result; raises :class:`StrataError` naming the failure of the first chunk in
        key order if any chunk failed (the same message whichever thread failed first)."""
        if self.failed:
            key, msg = min(self.failed)
            raise StrataError(
                f"{self.op}: {len(self.failed)} of {self.total} chunks failed; {key}: {msg}"
            )
        return self


class _NoRoomError(StrataError):
    """A move's destination is full and nothing on it can be evicted (nor is any room held
    by puts in flight that could free up)."""


class _NoRoom:
    """The tiers one stage found full, with nothing on them that could be evicted and no
    put in flight there: the move's later chunks at least as large are not offered to such
    a tier again (each offer is an eviction round over the tier's chunks, under the
    placement lock), unless room was freed on it since. A stage that cannot place anything
    thus ends after one round per tier, not one per chunk and tier."""

    def __init__(self, placement: Placement) -> None:
        self._placement = placement
        self._lock = threading.Lock()
        #: tier name -> (the least bytes found not to fit, the tier's usage then)
        self._full: dict[str, tuple[int, int]] = {}
        self._trying: dict[str, threading.Lock] = {}

    def trying(self, tier: Tier) -> threading.Lock:
        """The lock a chunk of this move holds while it makes room on ``tier``: the chunks
        waiting for it then learn the outcome instead of each running its own round."""
        with self._lock:
            return self._trying.setdefault(tier.name, threading.Lock())

    def known(self, tier: Tier, nbytes: int) -> bool:
        """True if ``tier`` was found full for ``nbytes`` or fewer, nothing freed since."""
        with self._lock:
            got = self._full.get(tier.name)
        return got is not None and nbytes >= got[0] and tier.used >= got[1]

    def note(self, tier: Tier, nbytes: int) -> None:
        """``tier`` had no room for ``nbytes``: remember it, unless puts in flight there may
        free (or, recorded, make evictable) room soon."""
        if self._placement._in_flight(tier):
            return
        with self._lock:
            got = self._full.get(tier.name)
            least = nbytes if got is None else min(got[0], nbytes)
            self._full[tier.name] = (least, tier.used)


class _Cancelled(StrataError):
    """A chunk's transfer not begun: its move was cancelled while it waited for its turn."""


class _Move:
    """What the chunks of one move share: ``own``, the object keys of its chunks, which its
    eviction rounds never take (a move of more than its target holds keeps the chunks it
    placed first and reports the rest as not fitting, instead of evicting what it had just
    moved and counting it moved); ``cancel``, set by its handle's :meth:`MoveHandle.cancel`."""

    def __init__(self, res: Residency, keys: Sequence[str]) -> None:
        self.own = frozenset(object_key(res.name, k) for k in keys)
        self.cancel = threading.Event()


class _Drops:
    """The copies a move took off tiers (their rows dropped, their objects deleted at its
    commit) and the number it kept on tiers taking no writes; counted into its
    :class:`MoveResult` once committed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.dropped: list[tuple[str, str]] = []  # (tier, key)
        self.kept = 0

    def drop(self, copy: ChunkCopy) -> None:
        with self._lock:
            self.dropped.append((copy.tier, copy.key))

    def keep(self) -> None:
        with self._lock:
            self.kept += 1

    def count(self, res: Residency, result: MoveResult) -> None:
        """Fill ``result``'s removed, left and kept after the commit: a dropped copy recorded
        again (its deletion refused) is kept; one whose object waits for deletion, left."""
        result.kept = self.kept
        for tier, key in self.dropped:
            if res.copy_on(key, tier) is not None:
                result.kept += 1
            elif res.is_stranded(tier, key):
                result.left += 1
            else:
                result.removed += 1


class MoveHandle:
    """A running move. ``wait`` / ``result`` block; ``done``, ``progress`` do not."""

    def __init__(
        self,
        op: str,
        total: int,
        commit: Commit | None = None,
        res: Residency | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.op = op
        self._result = MoveResult(op, total)
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._cancel = cancel if cancel is not None else threading.Event()
        self._futures: list[Future[None]] = []
        self._remaining = total
        self._t0 = time.perf_counter()
        self._error: BaseException | None = None
        #: what the move changed is committed when its last chunk is done
        self._commit = commit
        self._res = res
        self._drops: _Drops | None = None

    # ----------------------------------------------------------------- caller side
    def done(self) -> bool:
        return self._finished.is_set()

    @property
    def progress(self) -> Progress:
        r = self._result
        with self._lock:
            return Progress(r.done_count, r.total, r.nbytes)

    def wait(self, timeout: float | None = None) -> MoveResult:
        """Block until the move has finished (``timeout`` seconds at most; ``TimeoutError``
        past it) and return its result; raise :class:`StrataError` if any chunk failed."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"{self.op} not finished after {timeout} s ({self.progress})")
        if self._error is not None:
            raise StrataError(f"{self.op} could not commit its changes: {self._error}") from (
                self._error
            )
        return self._result.checked()

    def result(self) -> MoveResult:
        """The result once finished, failures included (never raises for chunk failures)."""
        self._finished.wait()
        if self._error is not None:
            raise StrataError(f"{self.op} could not commit its changes: {self._error}") from (
                self._error
            )
        return self._result

    def finished(self) -> None:
        """Block until the move has finished, whatever its outcome (raises nothing)."""
        self._finished.wait()

    def cancel(self) -> bool:
        """Stop chunks not yet started, those waiting for a turn on a tier included (a tape's
        drive: a transfer under way ends first, later ones are not begun); what already moved
        is committed. True if anything was left to cancel."""
        if self.done():
            return False
        self._cancel.set()
        for f in self._futures:
            f.cancel()
        return True

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    # ----------------------------------------------------------------- worker side
    def _count(self, outcome: str, nbytes: int = 0, key: str = "", msg: str = "") -> None:
        with self._lock:
            r = self._result
            if outcome == "moved":
                r.moved += 1
                r.nbytes += nbytes
            elif outcome == "reused":
                r.reused += 1
            elif outcome == "unwritten":
                r.unwritten += 1
            elif outcome == "no_room":
                r.no_room += 1
            elif outcome == "cancelled":
                r.cancelled += 1
            else:
                r.failed.append((key, msg))
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._finish()

    def _finish(self) -> None:
        try:
            if self._commit is not None and self._res is not None:
                self._commit.apply(self._res)
            if self._drops is not None and self._res is not None:
                self._drops.count(self._res, self._result)
        except BaseException as exc:  # reported to the waiter
            self._error = exc
        self._result.seconds = time.perf_counter() - self._t0
        self._finished.set()

    def __repr__(self) -> str:
        p = self.progress
        state = "done" if self.done() else "running"
        return f"MoveHandle({self.op}, {state}, {p.done}/{p.total} chunks, {p.nbytes} bytes)"


class Mover:
    """Moves chunks of open datasets between tiers on a shared thread pool; each move's
    changes are committed through ``commit`` (default: the placement's) when it ends."""

    def __init__(
        self,
        tiers: TierSet,
        placement: Placement,
        cache: ChunkCache,
        commit: Commit | None = None,
        *,
        max_workers: int | None = None,
    ) -> None:
        self.tiers = tiers
        self.placement = placement
        self.cache = cache
        self.commit = commit if commit is not None else placement.commit
        workers = max_workers or max(4, min(32, sum(t.concurrency for t in tiers)))
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="strataio-mover")
        # puts of written chunks run apart from moves: a move waiting for a chunk being
        # written (Residency.writing) never holds up that write's puts
        self._puts = ThreadPoolExecutor(workers, thread_name_prefix="strataio-put")
        self._put_workers = workers
        # moves' transfers per tier (a tape's drives): see _turn
        self._turn_of: dict[str, threading.BoundedSemaphore] = {}
        self._turns_lock = threading.Lock()

    # ----------------------------------------------------------------- API
    def stage(self, res: Residency, keys: Sequence[str], to: str | None = None) -> MoveHandle:
        """Copy ``keys`` up to tier ``to`` (default: the fastest persistent tier with room);
        chunks already on a tier at least that fast are reused, not copied."""
        target = self.tiers[to] if to is not None else None
        full = _NoRoom(self.placement)
        move = _Move(res, keys)
        return self._start(
            "stage", res, keys, lambda k: self._stage_one(res, k, target, full, move), move=move
        )

    def migrate(self, res: Residency, keys: Sequence[str], to: str) -> MoveHandle:
        """Move ``keys`` to tier ``to``; copies on faster tiers are deleted after the commit,
        but for those on a read-only tier (configured so, or whose storage refuses changes
        now: :attr:`Tier.unwritable`), which stay, catalogued (nothing there is deleted). A
        target that takes no writes is refused before anything moves (:class:`ReadOnlyError`,
        or :class:`WritesRefusedError` where its storage refuses them now)."""
        target = self.tiers[to]
        if target.volatile:
            raise StrataError(
                f"tier {to!r} is a memory tier: it cannot be the only copy of a chunk, so it "
                "cannot be a migration's target (stage or prefetch to it instead)"
            )
        if target.read_only:
            raise ReadOnlyError(
                f"tier {to!r} is read-only: nothing is migrated to it (it takes no writes)"
            )
        if target.writes_refused:
            raise WritesRefusedError(
                f"tier {to!r} refuses writes for now, so nothing is migrated to it: "
                f"{target.last_error}"
            )
        drops = _Drops()
        move = _Move(res, keys)
        return self._start(
            "migrate",
            res,
            keys,
            lambda k: self._migrate_one(res, k, target, drops, move),
            drops=drops,
            move=move,
        )

    def prefetch(self, res: Residency, keys: Sequence[str]) -> MoveHandle:
        """Bring ``keys`` to the memory level: the fastest up memory tier when one is
        configured (a stage to it), else the in-process chunk cache."""
        mem = next((t for t in self.tiers if t.volatile and t.up), None)
        if mem is not None:
            full = _NoRoom(self.placement)
            move = _Move(res, keys)
            return self._start(
                "prefetch", res, keys, lambda k: self._stage_one(res, k, mem, full, move), move=move
            )
        move = _Move(res, keys)
        return self._start(
            "prefetch", res, keys, lambda k: self._prefetch_one(res, k, move), move=move
        )

    def evict(self, res: Residency, keys: Sequence[str], tier: str) -> MoveHandle:
        """Drop the copies of ``keys`` on ``tier``; a chunk whose only copy is there is
        written back to a slower tier first. A read-only tier, where nothing is deleted, is
        refused (:class:`ReadOnlyError`), as is one whose storage refuses changes now
        (:class:`WritesRefusedError`: :attr:`Tier.writes_refused`)."""
        t = self.tiers[tier]
        if t.read_only:
            raise ReadOnlyError(
                f"tier {tier!r} is read-only: nothing is evicted from it (nothing there is deleted)"
            )
        if t.writes_refused:
            raise WritesRefusedError(
                f"tier {tier!r} refuses writes for now, so nothing is evicted from it (nothing "
                f"there can be deleted): {t.last_error}"
            )
        drops = _Drops()
        return self._start(
            "evict",
            res,
            keys,
            lambda k: self._evict_one(res, k, t, drops),
            absent=lambda k: res.copy_on(k, t.name) is None,
            drops=drops,
        )

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on the pool of puts (the tiered store's parallel puts)."""
        return self._puts.submit(fn, *args)

    @property
    def put_workers(self) -> int:
        """Threads of the pool of puts."""
        return self._put_workers

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._puts.shutdown(wait=True, cancel_futures=True)

    # ----------------------------------------------------------------- machinery
    def _start(
        self,
        op: str,
        res: Residency,
        keys: Sequence[str],
        one: Callable[[str], tuple[str, int]],
        *,
        absent: Callable[[str], bool] | None = None,
        drops: _Drops | None = None,
        move: _Move | None = None,
    ) -> MoveHandle:
        """Run ``one`` on each of ``keys`` on the pool; the chunks ``absent`` names (once the
        rows are current) count as ``reused`` at once, with no job of their own. ``drops``:
        the copies ``one`` takes off tiers, counted into the result once committed;
        ``move``: what its chunks share (its cancel event the handle's)."""
        keys = list(dict.fromkeys(keys))
        if keys and self.commit.catalog is not None:
            # another process may have moved or rewritten these chunks since the dataset was
            # opened: a move acts on the rows the catalog holds now (but for chunks with
            # changes here not recorded yet, whose rows here are newer)
            res.refresh_from(self.commit.catalog, keys)
        h = MoveHandle(op, len(keys), self.commit, res, move.cancel if move else None)
        h._drops = drops
        if absent is not None:
            there = [k for k in keys if not absent(k)]
            for _ in range(len(keys) - len(there)):
                h._count("reused")
            if keys and not there:
                return h  # (the last count finished it)
            keys = there

        def job(key: str) -> None:
            if h.cancelled:
                h._count("cancelled")
                return
            try:
                outcome, n = one(key)
            except _Cancelled:
                h._count("cancelled")
                return
            except Exception as exc:
                h._count("failed", key=key, msg=str(exc))
                return
            h._count(outcome, n)

        def on_done(f: Future[None]) -> None:
            if f.cancelled():
                h._count("cancelled")

        if not keys:
            h._finish()
            return h
        for k in keys:
            f = self._pool.submit(job, k)
            f.add_done_callback(on_done)
            h._futures.append(f)
        return h

    def _rank(self, tier: str) -> int:
        return self.tiers.rank(tier)

    @contextlib.contextmanager
    def _turn(self, tier: str, move: _Move) -> Iterator[None]:
        """Hold a turn on ``tier`` for one transfer of a chunk of ``move`` (a tier gives as
        many turns at once as it has slots: :attr:`Tier.concurrency`), waited for while the
        move is not cancelled: a move cancelled before the turn came raises
        :class:`_Cancelled`, so a cancel stops a move queued on a tape's drive between
        chunks. Nothing else is held while a turn is waited for (one turn at a time)."""
        with self._turns_lock:
            turn = self._turn_of.get(tier)
            if turn is None:
                n = max(1, int(self.tiers[tier].concurrency))
                turn = self._turn_of[tier] = threading.BoundedSemaphore(n)
        while not turn.acquire(timeout=0.05):
            if move.cancel.is_set():
                raise _Cancelled(f"cancelled while waiting for a turn on tier {tier!r}")
        try:
            if move.cancel.is_set():
                raise _Cancelled(f"cancelled before its turn on tier {tier!r}")
            yield
        finally:
            turn.release()

    def _copy(self, res: Residency, key: str, dst: Tier, move: _Move) -> tuple[str, int]:
        """Copy ``key`` from its fastest readable copy to ``dst`` (trying further copies
        when a source tier fails, or its copy went away, is missing or cannot be used:
        :class:`ObjectError`); record the new copy in the residency unless the chunk was
        rewritten meanwhile (then the move has nothing to do: the new version is where its
        write put it). Something in the way at ``dst`` raises :class:`ObjectError`."""
        # (a destination marked down is probed again, at most every Tier.RECHECK_S: a move
        # asked for after an outage finds the tier answering; one still down fails below)
        dst.recheck()
        start = res.version(key)
        last: Exception | None = None
        tried: set[str] = set()
        # an error a look at the catalog may explain (another process moved or rewrote the
        # chunk since this residency was loaded), and whether that look was taken
        explain: Exception | None = None
        refreshed = False
        while True:
            if explain is not None or (
                last is not None
                and not refreshed
                and not [c for c in self._readable(res, key) if c.tier not in tried]
            ):
                err = explain or last
                explain = None
                if refreshed or not self._refresh(res, key):
                    raise err  # type: ignore[misc]
                refreshed, last = True, None
                tried.clear()
                start = res.version(key)
            if res.version(key) != start:
                return "reused", 0  # rewritten since the move began
            sources = [c for c in self._readable(res, key) if c.tier not in tried]
            if not sources:
                break
            src = sources[0]
            if src.tier == dst.name:
                return "reused", 0
            if src.state == "in-transit" and res.busy(key):
                return "reused", 0  # being rewritten here: the new version is where it goes
            if src.rewritten_by_other(self.commit.writer):
                # (a copy would take either version, and a migrate would delete what that
                # process is writing; it may have recorded its write since this row was read)
                explain = StrataError(
                    f"chunk {key!r} of {res.name!r} is being rewritten on {src.tier!r} by "
                    "another process; not moved (move it again once that process has flushed)"
                )
                continue
            # (the move's chunks, this one among them; one set for all: no copy per chunk)
            if not self.placement.claim(dst, src.nbytes, protect=move.own, wait=True):
                raise _NoRoomError(
                    f"chunk {key!r} of {res.name!r}: tier {dst.name!r} is full and nothing "
                    "on it can be evicted (the chunks of this move there stay)"
                )
            recorded = False
            data: bytes | None = None  # (once the source is read, an ObjectError is dst's)
            try:
                with res.writing(key, dst.name):
                    version = res.version(key)
                    if res.copy_on(key, dst.name) is not None:
                        return "reused", 0  # another move put it there meanwhile
                    if not res.is_current(src):
                        # (nothing put: the object there, maybe another process's, stays)
                        res.abandon_write(key, dst.name)
                        continue  # moved, evicted or rewritten meanwhile: look again
                    try:
                        # an announced rewrite left by another writer holds either version
                        expect = "" if src.state == "in-transit" else src.checksum
                        try:
                            with self._turn(src.tier, move):
                                data = read_checked(self.tiers[src.tier], res.name, key, expect)
                            like = accepts_data(src, data)
                            if like is None:
                                raise ChecksumError(
                                    f"chunk {key!r} of dataset {res.name!r} on tier "
                                    f"{src.tier!r} has checksum "
                                    f"{checksum_like(src.checksum, data)}, catalog says "
                                    f"{src.checksum}"
                                )
                        except BaseException:
                            # nothing announced or put: the destination, and any row another
                            # process recorded for it since this residency was loaded, stay
                            res.abandon_write(key, dst.name)
                            raise
                        try:
                            with self._turn(dst.name, move):
                                held, seen = self.commit.prepare_copy(res, src, dst)
                                n, digest, put = put_checked(
                                    dst, res.name, key, data, new=not held, over=seen, like=like
                                )
                        except ExistsError as exc:
                            res.abandon_write(key, dst.name)
                            explain = exc  # the catalog may know whose it is
                            continue
                        except _Cancelled:
                            res.abandon_write(key, dst.name)  # (nothing announced or put)
                            raise
                    except NotFoundError:
                        if res.drop_missing(src) or not res.is_current(src):
                            continue  # catalogued but gone (forgotten now), or moved away
                        explain = res.missing_copy_error(key, src)
                        continue
                    copy = ChunkCopy(res.name, key, dst.name, n, digest, "valid", time.time())
                    recorded = res.record_move(
                        copy,
                        version,
                        reserved=src.nbytes,
                        put=put,
                    )
                    return ("moved", n) if recorded else ("reused", 0)
            except (TierDownError, ChecksumError, ObjectError) as exc:
                if isinstance(exc, ObjectError) and data is not None:
                    raise ObjectError(
                        f"chunk {key!r} of dataset {res.name!r} not copied: {exc}"
                    ) from exc
                if isinstance(exc, ChecksumError):
                    if res.busy(key):
                        return "reused", 0  # read while being rewritten: the move is moot
                    if not res.is_current(src):
                        continue  # replaced while it was read: look again
                last = exc
                tried.add(src.tier)
                if isinstance(exc, TierDownError) and not dst.up:
                    raise
            finally:
                if not recorded:
                    dst.release(src.nbytes)
        if last is not None:
            raise last
        if res.readable(key, up_only=False):
            raise _all_down(res, key)
        return "unwritten", 0  # never written (or lost): nothing to move

    def _readable(self, res: Residency, key: str) -> list[ChunkCopy]:
        """:meth:`Residency.readable` of ``key``, the tiers marked down that hold its copies
        probed again first where none is readable (:meth:`Tier.recheck`): a move after an
        outage finds the tier that answers again."""
        copies = res.readable(key)
        if not copies:
            held = res.readable(key, up_only=False)
            if held and any([self.tiers[c.tier].recheck() for c in held]):
                copies = res.readable(key)
        return copies

    def _stage_one(
        self,
        res: Residency,
        key: str,
        target: Tier | None,
        full: _NoRoom,
        move: _Move,
    ) -> tuple[str, int]:
        """Stage ``key`` to ``target``, or (None) to the fastest persistent tier with room
        faster than its fastest copy. ``"no_room"`` where no such tier had room: each was full
        with nothing on it that could be evicted (remembered in ``full`` for the move's other
        chunks), the chunks of the ``move`` never being evicted for it."""
        copies = self._readable(res, key)
        if not copies and not res.copies(key):
            return "unwritten", 0
        if not copies and res.readable(key, up_only=False):
            raise _all_down(res, key)
        if target is None or not target.volatile:
            # a memory copy dies with the process: staging to a disk ignores it
            copies = [c for c in copies if not self.tiers[c.tier].volatile]
        if not copies:
            return "reused", 0
        best = self._rank(copies[0].tier)
        nbytes = copies[0].nbytes
        if target is not None:
            if best <= self._rank(target.name):
                return "reused", 0  # Figure 4: already on a tier at least this fast
            if target.up or target.recheck():  # (a target down: _copy says so)
                with full.trying(target):
                    if full.known(target, nbytes):
                        return "no_room", 0
                    if not self.placement.make_room(
                        target, nbytes, protect=move.own
                    ) and not self.placement._in_flight(target):
                        full.note(target, nbytes)
                        return "no_room", 0
            try:
                # (room held by puts in flight is waited for there)
                return self._copy(res, key, target, move)
            except _NoRoomError:
                full.note(target, nbytes)
                return "no_room", 0
        faster = [t for t in self.placement.persistent() if self._rank(t.name) < best]
        for t in faster:
            if not t.up:
                continue
            with full.trying(t):
                if full.known(t, nbytes):
                    continue
                room = self.placement.make_room(t, nbytes, protect=move.own)
                if not room:
                    full.note(t, nbytes)
            if not room:
                continue
            try:
                return self._copy(res, key, t, move)
            except TierDownError:
                if t.up:
                    raise
            except _NoRoomError:
                full.note(t, nbytes)  # (the room made was taken meanwhile)
        if any(t.up for t in faster):
            return "no_room", 0
        if faster:
            down = ", ".join(t.name for t in faster)
            raise TierDownError(
                f"chunk {key!r} of {res.name!r}: not staged, every tier faster than "
                f"{copies[0].tier!r} is down ({down})"
            )
        return "reused", 0  # already on the fastest persistent tier

    def _migrate_one(
        self,
        res: Residency,
        key: str,
        target: Tier,
        drops: _Drops,
        move: _Move,
        *,
        refreshed: bool = False,
    ) -> tuple[str, int]:
        """Migrate ``key`` to ``target`` (see :meth:`migrate`); room there is never made by
        evicting the ``move``'s chunks: a chunk that does not fit fails."""
        copies = res.copies(key)
        if not copies:
            return "unwritten", 0
        have = next((c for c in copies if c.tier == target.name), None)
        if (
            have is not None
            and have.state in ("valid", "dirty")
            and not self.placement.present(res, have)
        ):
            have = None  # (its object was gone: forgotten, and put again below)
        if have is not None and have.state in ("valid", "dirty"):
            outcome, n = "reused", 0
            if have.state == "dirty":
                res.mark_valid(have)
        else:
            outcome, n = self._copy(res, key, target, move)
        if not any(c.tier == target.name for c in res.readable(key, up_only=False)):
            return outcome, n
        rank = self._rank(target.name)
        faster = [c for c in res.copies(key) if self._rank(c.tier) < rank]
        busy = [c.tier for c in faster if c.rewritten_by_other(self.commit.writer)]
        if busy:
            # (that writer's commit settles the copy; it may have recorded it since)
            if not refreshed and self._refresh(res, key):
                return self._migrate_one(res, key, target, drops, move, refreshed=True)
            raise StrataError(
                f"chunk {key!r} of {res.name!r} is being rewritten on {', '.join(busy)} by "
                f"another process; copied to {target.name!r}, the copy there stays (migrate "
                "again once that process has flushed)"
            )
        for c in faster:
            if self.tiers[c.tier].unwritable:  # (nothing there is deleted: it stays)
                drops.keep()
            elif res.drop_migrated(c):  # object deleted after the commit (kept if refused)
                drops.drop(c)
        return outcome, n

    def _prefetch_one(self, res: Residency, key: str, move: _Move) -> tuple[str, int]:
        """Read ``key`` into the chunk cache from its fastest readable copy that answers with
        intact bytes, as a read does: a copy whose tier is down, that something is in the
        way of (:class:`ObjectError`) or whose bytes fail their checksum is passed over for
        the next; a copy found missing (another process moved or evicted the chunk since
        its rows were looked up) is forgotten where another copy holds its bytes, and that
        copy is read; where none is left, the chunk's rows are learned again from the
        catalog (once) and its copies there are read. Raises :class:`StrataError` where no
        copy gives its bytes."""
        # (an entry of bytes the chunk's rows no longer name, another process having
        # rewritten it, leaves the cache here and is read again)
        if self.cache.get_many(res.name, (key,), res.names_bytes)[0] is not None:
            return "reused", 0
        tried: set[str] = set()
        # a copy found missing whose bytes no other copy holds: only a copy of the same
        # bytes may stand for it (another value would be read in its place, unsaid)
        gone: ChunkCopy | None = None
        refreshed = False
        while True:
            sources = [
                c
                for c in self._readable(res, key)
                if c.tier not in tried and (gone is None or same_bytes(c, gone))
            ]
            if not sources:
                if refreshed or not (tried or gone) or not self._refresh(res, key):
                    break
                refreshed, gone = True, None
                tried.clear()
                continue
            c = sources[0]
            tier = self.tiers[c.tier]
            try:
                with self._turn(c.tier, move):
                    data = tier.call(tier.backend.get, object_key(res.name, key))
            except NotFoundError:
                if res.drop_missing(c) or not res.is_current(c):
                    continue  # forgotten (another copy holds its bytes), or moved here
                gone = gone or c
                tried.add(c.tier)
                continue
            except (TierDownError, ObjectError):
                tried.add(c.tier)
                continue
            digest = accepts_data(c, data)
            if digest is None:
                tried.add(c.tier)
                continue
            self.cache.put(res.name, key, data, digest)
            res.touch([key])
            return "moved", len(data)
        if gone is not None:
            raise res.missing_copy_error(key, gone)
        if res.copies(key):
            raise StrataError(f"chunk {key!r}: no tier holding it answered with intact bytes")
        return "reused", 0

    def _evict_one(
        self, res: Residency, key: str, tier: Tier, drops: _Drops, *, refreshed: bool = False
    ) -> tuple[str, int]:
        copy = res.copy_on(key, tier.name)
        if copy is None:
            return "reused", 0
        if copy.rewritten_by_other(self.commit.writer):
            if not refreshed and self._refresh(res, key):  # (it may have recorded it since)
                return self._evict_one(res, key, tier, drops, refreshed=True)
            raise StrataError(
                f"chunk {key!r} of {res.name!r} is being rewritten on {tier.name!r} by another "
                "process; not evicted (evict it again once that process has flushed)"
            )
        if not tier.volatile:
            # (one gone is forgotten: written back below; one damaged fails the chunk)
            self.placement.look_elsewhere(tier, res, key)
        kept = tier.volatile or res.kept_elsewhere(key, tier.name)
        if not self.placement.evict_copy(tier, res, copy, looked=True):
            if res.copy_on(key, tier.name) is None:
                return "reused", 0  # gone meanwhile
            if res.busy(key, tier.name):
                raise StrataError(
                    f"chunk {key!r} of {res.name!r}: a write of it is in flight; not evicted"
                )
            if not refreshed and self._refresh(res, key):
                # another process moved or rewrote it since this residency was loaded
                return self._evict_one(res, key, tier, drops, refreshed=True)
            if not tier.up:  # (its copy cannot be read to be written back)
                raise StrataError(
                    f"chunk {key!r} of {res.name!r}: its only copy is on {tier.name!r}, which "
                    f"is marked down ({tier.last_error}), so it cannot be read to be written "
                    "back to a slower tier; evict it again once the tier answers (this "
                    f"process probes a down tier again after {Tier.RECHECK_S:g} s, less often "
                    "while it stays down)"
                )
            rank = self._rank(tier.name)
            if not any(self._rank(t.name) > rank for t in self.placement.persistent()):
                raise StrataError(
                    f"chunk {key!r} of {res.name!r}: its only copy is on {tier.name!r}, the "
                    "slowest tier, so it cannot be evicted (there is no slower tier to write "
                    "it back to)"
                )
            raise StrataError(
                f"chunk {key!r} of {res.name!r}: its only copy is on {tier.name!r} and no "
                "slower tier can take it (each is full, down, or holds an object of it that "
                "another process may be writing)"
            )
        drops.drop(copy)
        return "moved", 0 if kept else copy.nbytes

    def _refresh(self, res: Residency, key: str) -> bool:
        """Reload the copies of chunk ``key`` from the catalog (where this process holds it),
        as another process may have moved or rewritten the chunk since ``res`` was loaded:
        True if they changed."""
        catalog = self.commit.catalog
        if catalog is None:
            return False
        return bool(res.refresh_from(catalog, [key]))


def _all_down(res: Residency, key: str) -> StrataError:
    """The error of a move of chunk ``key`` whose copies are all on tiers that are down."""
    down = ", ".join(c.tier for c in res.copies(key))
    return StrataError(
        f"chunk {key!r} of {res.name!r}: no readable copy (its tiers {down} are down)"
    )
