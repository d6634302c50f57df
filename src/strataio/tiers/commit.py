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

One commit object serves a session: its residencies, the mover's moves, eviction rounds, and
the tiers' health changes. Where this process holds no catalog (MPI ranks other than 0) a
commit only syncs; the changes are handed to rank 0 when the dataset closes
(:meth:`Commit.close`), which records everyone's in one transaction, after which each rank
deletes what its own changes made obsolete.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from strataio.catalog.base import Catalog, ChunkCopy
from strataio.errors import BackendError, StrataError
from strataio.tiers.residency import Batch, Residency, object_key
from strataio.tiers.tier import Tier, TierSet, is_backend_failure

__all__ = ["Commit"]


class Commit:
    """Applies residency changes to ``catalog`` (``None`` where this process holds none) for
    the tiers ``tiers``; ``comm`` is the MPI communicator of a parallel job (``None``: one
    process)."""

    def __init__(self, tiers: TierSet, catalog: Catalog | None, comm: Any = None) -> None:
        self.tiers = tiers
        self.catalog = catalog
        self.comm = comm

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

    def announce(self, res: Residency, intents: Sequence[ChunkCopy]) -> None:
        """Record, before the objects are replaced in place, that the copies ``intents`` are
        being rewritten (state ``in-transit``, the new checksum): after a crash fsck can then
        tell an interrupted rewrite from a corrupt copy. The caller holds the objects' put
        slots (:meth:`Residency.writing`), so no later batch overwrites the announcement
        before the put is recorded. A no-op without a catalog."""
        if self.catalog is not None and intents:
            with res.commit_lock:  # after any batch taken before, so none overwrites them
                self.catalog.commit(list(intents), [])

    def close(self, res: Residency) -> None:
        """The last commit of a dataset being closed. In a parallel job this is collective:
        rank 0 records every rank's changes in one transaction, and every rank raises if it
        failed."""
        if self.comm is None:
            self.apply(res)
            return
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
        gathered = self.comm.gather((batch.upserts, batch.deletes, err is not None), root=0)
        if self.catalog is not None and err is None:
            try:
                ups = [c for u, _, _ in gathered for c in u]
                dels = [d for _, ds, _ in gathered for d in ds]
                if any(failed for _, _, failed in gathered):
                    raise BackendError(f"dataset {res.name!r}: a rank could not sync its chunks")
                if ups or dels:
                    self.catalog.commit(ups, dels)
            except BaseException as exc:
                err = exc
        failed = self.comm.bcast(None if err is None else repr(err), root=0)
        if err is not None:
            if self.catalog is None:
                res.restore(batch)
            raise err
        if failed is not None:
            res.restore(batch)
            raise BackendError(f"dataset {res.name!r}: closing failed on rank 0: {failed}")
        if self.catalog is None:
            self._delete(res, batch.obsolete)

    # ----------------------------------------------------------------- tiers
    def tier_changed(self, tier: Tier) -> None:
        """Record a tier's health change in the catalog (if it cannot take it, the in-memory
        state still steers this process)."""
        if self.catalog is not None:
            with contextlib.suppress(StrataError):
                self.catalog.set_tier_state(tier.name, tier.state)

    # ----------------------------------------------------------------- steps
    def _apply_locked(self, res: Residency) -> None:
        assert self.catalog is not None
        batch = res.take_batch()
        if batch.empty:
            return
        try:
            self._sync(res.name, batch)
            if batch.upserts or batch.deletes:
                self.catalog.commit(batch.upserts, batch.deletes)
        except BaseException:
            res.restore(batch)
            raise
        self._delete(res, batch.obsolete)

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
        failed = []
        for tier_name, keys in batch.unsynced.items():
            tier = self.tiers[tier_name]
            # called even on a tier marked down since the puts: where puts are durable on
            # return (S3) this is a no-op and the copies stand
            try:
                tier.backend.sync(sorted(object_key(dataset, k) for k in keys))
            except Exception as exc:
                tier.mark_down(exc)
                failed.append(f"{tier_name}: {exc}")
        if failed:
            raise BackendError(
                f"dataset {dataset!r}: written chunks may not be durable ({'; '.join(failed)})"
            )

    def _delete(self, res: Residency, objs: list[tuple[str, str]]) -> None:
        """Delete objects no row names any more; a tier that fails leaves orphans for fsck."""
        try:
            for tier_name, key in objs:
                tier = self.tiers[tier_name]
                if not tier.up:
                    continue  # fsck removes the orphan once the tier answers again
                try:
                    tier.backend.delete(object_key(res.name, key))
                except Exception as exc:
                    if not is_backend_failure(exc):
                        raise
                    tier.mark_down(exc)
        finally:
            res.deleted(objs)
