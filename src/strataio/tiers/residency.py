"""Residency: which tiers hold which chunk of one dataset, cached in memory since open.

APRIL touches its metadata database only at open and close; so does strataio. The catalog's
rows for a dataset are loaded once (:meth:`Catalog.residency`, one query) into a
:class:`Residency`; reads, writes and moves update it in memory and buffer the changes, which
:meth:`Residency.commit` applies in one catalog transaction (at flush, close and the end of each
move). Objects made obsolete by a change (a source copy after a migration, a stale copy after a
rewrite, an evicted copy) are deleted only *after* the commit that forgets them, so a crash at
any point leaves the catalog naming only copies that exist (or that fsck can prove stale).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable

from strataio.catalog.base import ChunkCopy, CopyId
from strataio.tiers.tier import Tier, TierSet, is_backend_failure

#: copy states a read may use
READABLE = ("valid", "dirty")

Committer = Callable[[list[ChunkCopy], list[CopyId]], None]
PreCommit = Callable[[], None]


class Residency:
    """The in-memory copy map of dataset ``name`` with a buffer of uncommitted changes.

    ``committer(upserts, deletes)`` applies changes to the catalog in one transaction; it is
    ``None`` where this process does not talk to the catalog (MPI ranks other than 0), and the
    changes are then handed over with :meth:`take_changes`. ``pre_commit`` runs before the
    buffered changes are taken for any commit, under the residency lock: the store installs
    its sync there, so that whoever triggers a commit (a flush, the end of a move, an eviction
    for another dataset) never makes the catalog name a copy that is not yet durable; if it
    raises, nothing is committed. Thread-safe.
    """

    def __init__(
        self,
        name: str,
        copies: Iterable[ChunkCopy],
        tiers: TierSet,
        committer: Committer | None = None,
        pre_commit: PreCommit | None = None,
    ) -> None:
        self.name = name
        self.tiers = tiers
        self.committer = committer
        self.pre_commit = pre_commit
        self.lock = threading.RLock()
        self._copies: dict[str, dict[str, ChunkCopy]] = {}
        for c in copies:
            self._copies.setdefault(c.key, {})[c.tier] = c
        self._upserts: dict[tuple[str, str], ChunkCopy] = {}
        self._deletes: set[tuple[str, str]] = set()
        self._obsolete: list[tuple[str, str]] = []  # (tier, key) objects to delete after commit
        self._touched: set[str] = set()

    # ----------------------------------------------------------------- queries
    def chunk_keys(self) -> list[str]:
        with self.lock:
            return sorted(k for k, v in self._copies.items() if v)

    def copies(self, key: str) -> list[ChunkCopy]:
        """Copies of ``key``, fastest tier first."""
        with self.lock:
            got = list(self._copies.get(key, {}).values())
        return sorted(got, key=lambda c: self._rank(c.tier))

    def readable(self, key: str, *, up_only: bool = True) -> list[ChunkCopy]:
        """Copies a read may use, fastest first (skipping tiers marked down): valid and dirty
        ones, and announced rewrites (whose object holds the old or the new bytes, whole)."""
        return [
            c
            for c in self.copies(key)
            if (c.state in READABLE or c.old_checksum) and (not up_only or self._tier(c.tier).up)
        ]

    def on_tier(self, tier: str) -> list[ChunkCopy]:
        with self.lock:
            return [v[tier] for v in self._copies.values() if tier in v]

    def all_copies(self) -> list[ChunkCopy]:
        with self.lock:
            return [c for v in self._copies.values() for c in v.values()]

    def nbytes_by_tier(self) -> dict[str, int]:
        out = dict.fromkeys(self.tiers.names, 0)
        for c in self.all_copies():
            out[c.tier] = out.get(c.tier, 0) + c.nbytes
        return out

    # ----------------------------------------------------------------- changes
    def add(self, copy: ChunkCopy, *, reserved: int = 0) -> None:
        """Record (or replace) a copy; the tier's usage follows, absorbing ``reserved`` bytes
        that were reserved for this copy (see :meth:`Tier.account`)."""
        with self.lock:
            per = self._copies.setdefault(copy.key, {})
            old = per.get(copy.tier)
            per[copy.tier] = copy
            self._upserts[(copy.key, copy.tier)] = copy
            self._deletes.discard((copy.key, copy.tier))
        self._tier(copy.tier).account(copy.nbytes - (old.nbytes if old else 0), release=reserved)

    def remove(self, key: str, tier: str, *, delete_object: bool = True) -> ChunkCopy | None:
        """Forget the copy of ``key`` on ``tier``; its object is deleted after the next commit."""
        with self.lock:
            old = self._copies.get(key, {}).pop(tier, None)
            if old is None:
                return None
            self._upserts.pop((key, tier), None)
            self._deletes.add((key, tier))
            if delete_object:
                self._obsolete.append((tier, key))
        self._tier(tier).account(-old.nbytes)
        return old

    def touch(self, keys: Iterable[str], when: float | None = None) -> None:
        """Note an access (for LRU eviction); reaches the catalog at commit."""
        now = time.time() if when is None else when
        with self.lock:
            for k in keys:
                per = self._copies.get(k)
                if not per:
                    continue
                for t, c in list(per.items()):
                    per[t] = dataclasses.replace(c, last_access=now)
                self._touched.add(k)

    def take_changes(self) -> tuple[list[ChunkCopy], list[CopyId], list[str]]:
        """Remove and return the buffered ``(upserts, deletes, touched keys)``."""
        with self.lock:
            ups = list(self._upserts.values())
            dels = [(self.name, k, t) for k, t in sorted(self._deletes)]
            touched = sorted(self._touched)
            self._upserts.clear()
            self._deletes.clear()
            self._touched.clear()
        return ups, dels, touched

    def take_obsolete(self) -> list[tuple[str, str]]:
        with self.lock:
            out, self._obsolete = self._obsolete, []
        return out

    @property
    def pending(self) -> bool:
        with self.lock:
            return bool(self._upserts or self._deletes or self._obsolete or self._touched)

    def commit(self) -> None:
        """Apply the buffered changes in one catalog transaction, then delete obsolete objects.

        Without a committer (non-root MPI ranks) nothing is applied and nothing deleted: the
        owner of the catalog commits at close and the objects are deleted then.
        """
        if self.committer is None:
            return
        with self.lock:
            if self.pre_commit is not None:
                # copies are recorded only after their objects are durable (see the class doc)
                self.pre_commit()
            ups, dels, touched = self.take_changes()
            if touched:
                # the latest access time rides along with the copy rows
                for k in touched:
                    for c in self._copies.get(k, {}).values():
                        ups.append(c)
            ups = list({(c.key, c.tier): c for c in ups}.values())
            try:
                if ups or dels:
                    self.committer(ups, dels)
            except BaseException:
                # keep the changes buffered so a later commit retries them
                for c in ups:
                    self._upserts.setdefault((c.key, c.tier), c)
                self._deletes.update((k, t) for _, k, t in dels)
                raise
        self.delete_obsolete()

    def delete_obsolete(self) -> None:
        """Delete objects that the catalog no longer names (after a successful commit)."""
        for tier_name, key in self.take_obsolete():
            tier = self._tier(tier_name)
            if not tier.up:
                continue  # fsck removes the orphan once the tier answers again
            try:
                tier.backend.delete(object_key(self.name, key))
            except Exception as exc:
                if is_backend_failure(exc):
                    tier.mark_down(exc)
                else:
                    raise

    # ----------------------------------------------------------------- helpers
    def _tier(self, name: str) -> Tier:
        return self.tiers[name]

    def _rank(self, name: str) -> int:
        return self.tiers.rank(name) if name in self.tiers else 1 << 30


def object_key(dataset: str, key: str) -> str:
    """The backend key of chunk ``key`` of ``dataset`` on any tier (``name/c/0/1``)."""
    return f"{dataset}/{key}"


META_KEY = "zarr.json"
