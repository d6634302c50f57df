"""Placement: location hints → tiers, capacity with LRU eviction, and failover order.

The hints are those of the multi-storage resource architecture (its §3): ``LOCALDISK``,
``REMOTEDISK``, ``REMOTETAPE`` name a tier role; ``AUTO`` leaves the choice to the system, whose
default is the archive: the slowest tier with room; ``DISABLE`` means the dataset is not stored
this run (writes are accepted and dropped, reads raise). When a tier is down or full, a write
goes to the next tier the hint allows: the other persistent tiers by distance from the hint's
tier, slower ones first on a tie (an archive that is down spills onto disks, as the paper's
last example does). A fast tier that is full evicts least-recently-used chunks that have
another valid copy; a chunk whose only copy is there is first written back to a slower tier.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable

from strataio.catalog.base import ChunkCopy
from strataio.errors import DatasetDisabledError, StrataError, TierDownError
from strataio.tiers.residency import Residency, object_key
from strataio.tiers.tier import Tier, TierSet, transfer

__all__ = ["HINTS", "DatasetDisabledError", "Placement", "normalize_hint"]

HINTS = ("LOCALDISK", "REMOTEDISK", "REMOTETAPE", "AUTO", "DISABLE")
#: the tier role each explicit hint names
HINT_ROLES = {"LOCALDISK": "localdisk", "REMOTEDISK": "remotedisk", "REMOTETAPE": "remotetape"}


def normalize_hint(hint: str | None) -> str:
    """The canonical spelling of a hint (``"auto"`` → ``"AUTO"``; ``DEFAULT`` is ``AUTO``)."""
    h = "AUTO" if hint is None else str(hint).strip().upper()
    if h == "DEFAULT":
        h = "AUTO"
    if h not in HINTS:
        raise StrataError(f"unknown placement hint {hint!r}; use one of {', '.join(HINTS)}")
    return h


class Placement:
    """Chooses tiers for writes and stages, and makes room on full tiers.

    Open datasets register their :class:`Residency` (:meth:`register`) so eviction can see
    every chunk this process holds on a tier.
    """

    def __init__(self, tiers: TierSet) -> None:
        self.tiers = tiers
        self._residencies: weakref.WeakSet[Residency] = weakref.WeakSet()
        self._lock = threading.RLock()
        #: copies evicted so far (by this process)
        self.evictions = 0

    def register(self, residency: Residency) -> None:
        self._residencies.add(residency)

    # ----------------------------------------------------------------- hints
    def check_hint(self, hint: str) -> str:
        """Validate ``hint`` against the configured tiers; return its canonical form."""
        h = normalize_hint(hint)
        role = HINT_ROLES.get(h)
        if role is not None and not self.tiers.by_role(role):
            raise StrataError(
                f"hint {h} names role {role!r}, but no configured tier has that role "
                f"(tiers: {', '.join(f'{t.name}={t.role}' for t in self.tiers)})"
            )
        return h

    def persistent(self) -> list[Tier]:
        """Tiers that outlive the process (all but memory tiers; all if only memory exists)."""
        out = [t for t in self.tiers if t.role != "memory"]
        return out or list(self.tiers)

    def home(self, hint: str) -> Tier | None:
        """The tier a hint names (``None`` for DISABLE); AUTO is the slowest persistent tier."""
        h = normalize_hint(hint)
        if h == "DISABLE":
            return None
        role = HINT_ROLES.get(h)
        if role is None:
            return self.persistent()[-1]
        return self.tiers.by_role(role)[0]

    def write_order(self, hint: str) -> list[Tier]:
        """Tiers a write with ``hint`` may use, in order of preference, skipping down tiers."""
        h = normalize_hint(hint)
        if h == "DISABLE":
            return []
        pers = self.persistent()
        if h == "AUTO":
            order = pers[::-1]  # the archive by default, faster tiers as it fills
        else:
            home = self.home(h)
            hr = pers.index(home)  # type: ignore[arg-type]
            order = sorted(pers, key=lambda t: (abs(pers.index(t) - hr), -pers.index(t)))
        return [t for t in order if t.up]

    def stage_target(self, below: Tier | None = None) -> Tier | None:
        """The fastest up persistent tier faster than ``below`` (any, when None)."""
        limit = self.tiers.rank(below.name) if below is not None else len(self.tiers)
        for t in self.persistent():
            if self.tiers.rank(t.name) < limit and t.up:
                return t
        return None

    # ----------------------------------------------------------------- capacity
    def claim(self, tier: Tier, nbytes: int, *, protect: Iterable[str] = ()) -> bool:
        """Reserve ``nbytes`` on ``tier`` for a put in flight, evicting if needed; the caller
        releases the reservation (:meth:`Tier.release`) once the copy is recorded."""
        if tier.reserve(nbytes):
            return True
        keep = list(protect)
        with self._lock:
            for _ in range(8):  # other threads may take the room just made; evict again
                if tier.reserve(nbytes):
                    return True
                before = self.evictions
                if not self.make_room(tier, nbytes, protect=keep) and self.evictions == before:
                    return False  # nothing left to evict
        return tier.reserve(nbytes)

    def make_room(self, tier: Tier, nbytes: int, *, protect: Iterable[str] = ()) -> bool:
        """Evict from ``tier`` until ``nbytes`` more fit; True if they fit.

        Victims are the least recently used chunks on the tier. A victim with another readable
        copy on an up tier is dropped; one without is written back (copy, durable put,
        verify) to the nearest slower up tier with room. Each affected dataset's residency is
        committed before the victims' objects are deleted. Chunks named in ``protect``
        (``(dataset, key)`` strings ``"name/key"``) are left alone.
        """
        if tier.has_room(nbytes):
            return True
        if tier.capacity is None or nbytes > tier.capacity:
            return False
        if tier is self.persistent()[-1]:
            return False  # the archive is never evicted from: writes go to the next tier
        keep = set(protect)
        with self._lock:
            victims: list[tuple[float, Residency, ChunkCopy]] = []
            for res in list(self._residencies):
                for c in res.on_tier(tier.name):
                    if object_key(res.name, c.key) not in keep:
                        victims.append((c.last_access, res, c))
            victims.sort(key=lambda v: v[0])
            touched: list[Residency] = []
            for _, res, c in victims:
                if tier.has_room(nbytes):
                    break
                if not self._evict(tier, res, c):
                    continue
                if res not in touched:
                    touched.append(res)
            for res in touched:
                res.commit()
            return tier.has_room(nbytes)

    def _evict(self, tier: Tier, res: Residency, copy: ChunkCopy) -> bool:
        others = [c for c in res.readable(copy.key) if c.tier != tier.name]
        if not others and not self.write_back(tier, res, copy):
            return False
        res.remove(copy.key, tier.name)
        self.evictions += 1
        return True

    def write_back(self, tier: Tier, res: Residency, copy: ChunkCopy) -> bool:
        """Copy ``copy`` (on ``tier``) safely to the nearest slower up tier with room and
        record it there; False if no slower tier can take it. The source copy is kept."""
        rank = self.tiers.rank(tier.name)
        for dst in self.persistent():
            if self.tiers.rank(dst.name) <= rank or not dst.up:
                continue
            if not self.claim(dst, copy.nbytes):
                continue
            try:
                n, digest = transfer(tier, dst, object_key(res.name, copy.key), copy.checksum)
                res.add(
                    ChunkCopy(res.name, copy.key, dst.name, n, digest, "valid", copy.last_access)
                )
                return True
            except TierDownError:
                if not tier.up:
                    return False
            finally:
                dst.release(copy.nbytes)
        return False
