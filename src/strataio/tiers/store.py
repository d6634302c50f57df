"""TieredChunkStore: the ChunkStore protocol over a storage hierarchy.

A Dataset reads and writes through this store exactly as through a single directory; the store
decides where each chunk lives. Residency comes from the catalog once at open (a
:class:`~strataio.tiers.residency.Residency`); reads take the fastest intact copy on a tier that
answers (staging chunks whose fastest copy is on an archive tier to disk first, as APRIL's
``T_READ_SECTION`` does), writes go where the placement hint says with failover, and the
residency changes reach the catalog in one transaction at flush / close.

Every tier holds the dataset's ``zarr.json`` beside its chunks (``NAME/zarr.json``,
``NAME/c/i/j``), so a tier holding all chunks is itself a Zarr v3 array.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from strataio.arrays.store import ChunkStore
from strataio.catalog.base import ChunkCopy
from strataio.errors import BackendError, ClosedError, NotFoundError, StrataError, TierDownError
from strataio.storage.base import BytesLike, validate_key
from strataio.tiers.cache import ChunkCache
from strataio.tiers.mover import MoveHandle, Mover
from strataio.tiers.placement import DatasetDisabledError, Placement, normalize_hint
from strataio.tiers.residency import META_KEY, Residency, object_key
from strataio.tiers.tier import Tier, TierSet, checksum


class TieredChunkStore(ChunkStore):  # no optional capabilities yet
    """Chunks of dataset ``residency.name`` spread over ``tiers``.

    ``hint`` is the dataset's placement hint; ``disabled`` marks a DISABLE dataset (writes are
    dropped, reads raise :class:`DatasetDisabledError`). ``stage_on_read`` stages chunks whose
    fastest copy is on an archive (``remotetape``) tier before reading them. ``on_close`` is
    called once after the final flush (the session commits or gathers there);
    ``announce(intents)`` records rewrites in place in the catalog before they happen.
    """

    def __init__(
        self,
        residency: Residency,
        tiers: TierSet,
        placement: Placement,
        mover: Mover,
        cache: ChunkCache,
        *,
        hint: str = "AUTO",
        disabled: bool = False,
        stage_on_read: bool = True,
        meta: bytes | None = None,
        on_close: Callable[[TieredChunkStore], None] | None = None,
        announce: Callable[[list[ChunkCopy]], None] | None = None,
    ) -> None:
        self.res = residency
        self.name = residency.name
        self.tiers = tiers
        self.placement = placement
        self.mover = mover
        self.cache = cache
        self.hint = normalize_hint(hint)
        self.disabled = disabled or self.hint == "DISABLE"
        self.stage_on_read = stage_on_read
        self._meta = meta
        self._on_close = on_close
        self._announce = announce
        self._unsynced: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        self._closed = False
        residency.pre_commit = self.sync
        placement.register(residency)

    # ----------------------------------------------------------------- reads
    def get_chunks(self, keys: Sequence[str]) -> list[BytesLike | None]:
        self._check_open()
        if self.disabled:
            raise DatasetDisabledError(
                f"dataset {self.name!r} was created with the DISABLE hint: its data was not "
                "stored, so it cannot be read"
            )
        out: list[BytesLike | None] = [None] * len(keys)
        need: list[int] = []
        for i, k in enumerate(keys):
            hit = self.cache.get(self.name, k)
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
        while pending:
            groups: dict[str, list[int]] = {}
            for i, tried in list(pending.items()):
                copies = [c for c in self.res.readable(keys[i]) if c.tier not in tried]
                if not copies:
                    raise self._lost(keys[i])
                groups.setdefault(copies[0].tier, []).append(i)
            for tier_name, idx in groups.items():
                self._read_group(self.tiers[tier_name], keys, idx, out, pending)
        self.res.touch([keys[i] for i in need])
        return out

    def _read_group(
        self,
        tier: Tier,
        keys: Sequence[str],
        idx: list[int],
        out: list[BytesLike | None],
        pending: dict[int, set[str]],
    ) -> None:
        try:
            blobs = tier.call(tier.backend.get_many, [object_key(self.name, keys[i]) for i in idx])
        except TierDownError:
            return  # the down tier is now filtered out of readable()
        for i, blob in zip(idx, blobs):
            copy = next((c for c in self.res.copies(keys[i]) if c.tier == tier.name), None)
            if blob is None or copy is None or not copy.accepts(checksum(blob)):
                pending[i].add(tier.name)  # missing or corrupt here: try another tier
                continue
            out[i] = blob
            del pending[i]

    def _lost(self, key: str) -> StrataError:
        where = ", ".join(f"{c.tier}({c.state})" for c in self.res.copies(key)) or "none"
        down = [t.name for t in self.tiers if not t.up]
        return BackendError(
            f"chunk {key!r} of {self.name!r}: no readable intact copy (catalogued copies: "
            f"{where}; tiers down: {', '.join(down) or 'none'}); run 'strataio fsck'"
        )

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
        for k, _ in items:
            validate_key(object_key(self.name, k))
        if self.disabled:
            return  # DISABLE: accepted and dropped
        keys = [k for k, _ in items]
        self.cache.invalidate(self.name, keys)
        home = self.placement.home(self.hint)
        todo = [(k, memoryview(v).cast("B")) for k, v in items]
        errors: list[str] = []
        for tier in self.placement.write_order(self.hint):
            if not todo or not tier.up:
                continue
            fits, rest = [], []
            protect = [object_key(self.name, k) for k in keys]
            for k, v in todo:
                if self.placement.claim(tier, len(v), protect=protect):
                    fits.append((k, v))
                else:
                    rest.append((k, v))
            todo = rest + self._put_on(tier, fits, home, errors)
        if todo:
            raise BackendError(
                f"dataset {self.name!r}: {len(todo)} chunks could not be stored on any tier "
                f"the hint {self.hint} allows ({'; '.join(errors) or 'all tiers full or down'})"
            )

    def _put_on(
        self, tier: Tier, items: list[tuple[str, memoryview]], home: Tier | None, errors: list[str]
    ) -> list[tuple[str, memoryview]]:
        """Put ``items`` on ``tier`` (room already reserved); return the ones that failed
        because the tier went down."""
        if not items:
            return []
        state = "valid" if home is None or tier is home else "dirty"
        now = time.time()
        sums = [checksum(v) for _, v in items]
        # A rewrite in place replaces the catalogued object before the catalog learns of it.
        # Announce it first (state in-transit, new and old checksum, one transaction per
        # batch): the object then holds one of two known versions, which reads and fsck accept.
        olds = {k: c for k, _ in items for c in self.res.copies(k) if c.tier == tier.name}
        if olds and self._announce is not None:
            intents = [
                ChunkCopy(self.name, k, tier.name, len(v), d, "in-transit", now, olds[k].checksum)
                for (k, v), d in zip(items, sums)
                if k in olds
            ]
            # in the residency first: a commit from another thread meanwhile (a stage ending
            # for a read of other chunks) then records the announcement, not the old row
            for c in intents:
                self.res.add(c)
            try:
                self._announce(intents)
            except BaseException:
                for k in olds:
                    self.res.add(olds[k])
                raise

        def one(kv: tuple[str, memoryview]) -> None:
            tier.call(tier.backend.put, object_key(self.name, kv[0]), kv[1])

        futures = [self.mover._pool.submit(one, kv) for kv in items]
        failed, error = [], None
        recorded: set[str] = set()
        try:
            for (k, v), d, f in zip(items, sums, futures):
                exc = f.exception()
                if exc is None:
                    # queued for sync before the residency learns of the copy, so any commit
                    # that records it syncs it first (the residency's pre-commit hook)
                    with self._lock:
                        self._unsynced.setdefault(tier.name, set()).add(object_key(self.name, k))
                    copy = ChunkCopy(self.name, k, tier.name, len(v), d, state, now)
                    self.res.add(copy, reserved=len(v))
                    recorded.add(k)
                    for c in self.res.copies(k):
                        if c.tier != tier.name:
                            self.res.remove(k, c.tier)  # stale now; deleted after the commit
                    continue
                if k in olds:
                    self.res.add(olds[k])  # the next commit restores the announced row
                if isinstance(exc, TierDownError):
                    failed.append((k, v))
                    errors.append(str(exc))
                elif error is None:
                    error = exc
        finally:
            for k, v in items:
                if k not in recorded:
                    tier.release(len(v))
        if error is not None:
            raise error
        return failed

    def delete_chunks(self, keys: Sequence[str]) -> None:
        self._check_open()
        self.cache.invalidate(self.name, keys)
        for k in keys:
            for c in self.res.copies(k):
                self.res.remove(k, c.tier)

    def list_chunks(self) -> list[str]:
        self._check_open()
        return [] if self.disabled else self.res.chunk_keys()

    # ----------------------------------------------------------------- metadata
    def get_meta(self) -> bytes | None:
        if self._meta is not None:
            return self._meta
        for tier in self.placement.persistent():
            if not tier.up:
                continue
            try:
                self._meta = bytes(tier.call(tier.backend.get, object_key(self.name, META_KEY)))
                return self._meta
            except (NotFoundError, TierDownError):
                continue
        return None

    def put_meta(self, data: bytes) -> None:
        """Write ``zarr.json`` durably to every persistent tier that answers."""
        self._check_open()
        self._meta = bytes(data)
        stored = 0
        for tier in self.placement.persistent():
            if not tier.up:
                continue
            try:
                tier.call(tier.backend.put, object_key(self.name, META_KEY), data, durable=True)
                stored += 1
            except TierDownError:
                continue
        if not stored:
            raise BackendError(f"dataset {self.name!r}: no tier answered to store zarr.json")

    # ----------------------------------------------------------------- moves
    def stage(self, keys: Sequence[str], to: str | None = None) -> MoveHandle:
        self._check_readable()
        return self.mover.stage(self.res, keys, to)

    def prefetch(self, keys: Sequence[str]) -> MoveHandle:
        self._check_readable()
        return self.mover.prefetch(self.res, keys)

    def migrate(self, keys: Sequence[str], to: str) -> MoveHandle:
        self._check_readable()
        self.flush()  # a migration only moves durable, catalogued chunks
        return self.mover.migrate(self.res, keys, to)

    def evict(self, keys: Sequence[str], tier: str) -> MoveHandle:
        self._check_readable()
        self.flush()
        self.tiers[tier]  # unknown tier: NotFoundError before anything moves
        there = {c.key for c in self.res.on_tier(tier)}
        return self.mover.evict(self.res, [k for k in keys if k in there], tier)

    def residency_table(self) -> dict[str, list[ChunkCopy]]:
        """Every chunk's copies, fastest tier first (for ``strataio info``)."""
        return {k: self.res.copies(k) for k in self.res.chunk_keys()}

    # ----------------------------------------------------------------- lifecycle
    def flush(self) -> None:
        """Make written chunks durable on their tiers, then commit the residency changes."""
        if self._closed:
            return
        self.sync()  # also run by the commit; here for ranks that hand their changes over
        self.res.commit()

    def sync(self) -> None:
        """Make every chunk put since the last sync durable (fsync; a no-op where puts are
        durable on return). Installed as the residency's pre-commit hook: no commit, whoever
        triggers it (a flush, a stage, an eviction for another dataset), records a copy
        before its object is durable. Raises :class:`BackendError` (and keeps the chunks
        queued) if a tier fails to sync."""
        with self._lock:
            unsynced, self._unsynced = self._unsynced, {}
        failed = []
        for tier_name, objs in unsynced.items():
            tier = self.tiers[tier_name]
            # called even on a tier marked down since the puts: where puts are durable on
            # return (S3) this is a no-op and the copies stand
            try:
                tier.backend.sync(sorted(objs))
            except Exception as exc:
                tier.mark_down(exc)
                failed.append(f"{tier_name}: {exc}")
                with self._lock:  # retried by the next flush
                    self._unsynced.setdefault(tier_name, set()).update(objs)
        if failed:
            # nothing is committed: the catalog never names a copy that may not be durable
            raise BackendError(
                f"dataset {self.name!r}: written chunks may not be durable ({'; '.join(failed)})"
            )

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            if self._on_close is not None:
                self._on_close(self)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the store of dataset {self.name!r} is closed")

    def _check_readable(self) -> None:
        self._check_open()
        if self.disabled:
            raise DatasetDisabledError(f"dataset {self.name!r} is disabled (DISABLE hint)")

    def __repr__(self) -> str:
        return f"TieredChunkStore({self.name!r}, hint={self.hint}, tiers={self.tiers.names})"


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
