"""Placement: location hints → tiers, capacity with LRU eviction, and failover order.

The hints are those of the multi-storage resource architecture (its §3): ``LOCALDISK``,
``REMOTEDISK``, ``REMOTETAPE`` name a tier role; ``AUTO`` leaves the choice to the system: the tier
with the least predicted write + read time from the performance database
(:meth:`Placement.choose`, the paper's future-work item), and where no tier with room is
calibrated, the archive: the slowest tier with room; ``DISABLE`` means the dataset is not stored
this run (writes are accepted and dropped, reads raise). When a tier is down or full, a write
goes to the next tier the hint allows: the other persistent tiers by distance from the hint's
tier, slower ones first on a tie (an archive that is down spills onto disks, as the paper's
last example does). A fast tier that is full evicts least-recently-used chunks that have
another valid copy; a chunk whose only copy is there is first written back to a slower tier.
A copy is forgotten only through the commit that records the copy replacing it, and its
object is deleted after that commit (:mod:`strataio.tiers.commit`); a chunk with a put in
flight is never a victim, and a catalogued copy found missing is dropped, never reported to
the writer that needed the room.

A memory tier is volatile (:mod:`strataio.tiers.tier`): never a write's home, a stage or
prefetch target whose copies eviction simply drops.

Eviction has hysteresis: once a tier is full it is emptied down to a low-water mark (a
fraction of its capacity free), so the catalog transaction that records an eviction round is
shared by the many writes that round makes room for, instead of one per chunk. Victims are
chosen among the chunks of datasets open in this process and, through the catalog, those of
datasets that are not (their residency is loaded for the round, so the same write-back and
commit-before-delete rules apply).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

from strataio.catalog.base import Catalog, ChunkCopy
from strataio.errors import (
    ChecksumError,
    ConfigError,
    DatasetDisabledError,
    ExistsError,
    HintError,
    NotFoundError,
    ObjectError,
    StrataError,
    TierDownError,
)
from strataio.sizes import counted
from strataio.tiers.commit import Commit
from strataio.tiers.residency import Residency, object_key, same_bytes
from strataio.tiers.tier import (
    Tier,
    TierSet,
    put_checked,
    read_checked,
)

__all__ = ["HINTS", "AutoDecision", "DatasetDisabledError", "Placement", "normalize_hint"]

HINTS = ("LOCALDISK", "REMOTEDISK", "REMOTETAPE", "AUTO", "DISABLE")
#: the tier role each explicit hint names
HINT_ROLES = {"LOCALDISK": "localdisk", "REMOTEDISK": "remotedisk", "REMOTETAPE": "remotetape"}


def normalize_hint(hint: str | None) -> str:
    """The canonical spelling of a hint (``"auto"`` → ``"AUTO"``; ``DEFAULT`` is ``AUTO``)."""
    if hint in HINTS:
        return hint  # type: ignore[return-value]  (already canonical: every write asks)
    h = "AUTO" if hint is None else str(hint).strip().upper()
    if h == "DEFAULT":
        h = "AUTO"
    if h not in HINTS:
        raise HintError(f"unknown placement hint {hint!r}; use one of {', '.join(HINTS)}")
    return h


@dataclasses.dataclass(frozen=True, slots=True)
class AutoDecision:
    """Where placement by prediction put an AUTO dataset, and why.

    ``tier``: the chosen tier's name, ``None`` for the default AUTO (no calibrated tier with
    room); ``reason``: one sentence; ``predicted``: ``{tier: (write_s, read_s)}`` for every
    candidate; ``skipped``: tiers left out and why; ``expected_reads`` / ``deadline_s``: what
    the caller asked for."""

    tier: str | None
    reason: str
    predicted: dict[str, tuple[float, float]]
    skipped: list[str]
    expected_reads: int = 1
    deadline_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "reason": self.reason,
            "predicted": {k: list(v) for k, v in self.predicted.items()},
            "skipped": list(self.skipped),
            "expected_reads": self.expected_reads,
            "deadline_s": self.deadline_s,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> AutoDecision:
        return cls(
            d.get("tier"),
            d.get("reason", ""),
            {k: (float(v[0]), float(v[1])) for k, v in d.get("predicted", {}).items()},
            list(d.get("skipped", [])),
            int(d.get("expected_reads", 1)),
            d.get("deadline_s"),
        )


class Placement:
    """Chooses tiers for writes and stages, and makes room on full tiers.

    Open datasets register their :class:`Residency` (:meth:`register`) so eviction can see
    every chunk this process holds on a tier. With a ``catalog`` (the process that commits
    residency changes), eviction also takes the least recently used chunks of datasets that
    are not open here. ``low_water_fraction`` (0 to 1, default 0.1): when a write finds its
    tier full, eviction frees ``max(nbytes, low_water_fraction * capacity)`` bytes, so one
    eviction round (one catalog transaction per affected dataset) makes room for many chunks.
    """

    #: catalog rows read per eviction round when looking for victims of closed datasets
    CATALOG_BATCH = 512
    #: seconds a move waits for room held by puts in flight (:meth:`claim`)
    CLAIM_WAIT = 30.0

    def __init__(
        self,
        tiers: TierSet,
        commit: Commit | None = None,
        *,
        catalog: Catalog | None = None,
        low_water_fraction: float = 0.1,
    ) -> None:
        if not 0.0 <= low_water_fraction <= 1.0:
            raise StrataError(f"low_water_fraction must lie in [0, 1], got {low_water_fraction!r}")
        if not any(not t.volatile and t.configured for t in tiers):
            raise ConfigError(
                "a storage hierarchy needs a persistent tier (localdisk, remotedisk or "
                f"remotetape); the tiers {', '.join(tiers.names)} are all memory tiers, whose "
                "copies die with the process"
            )
        self.tiers = tiers
        self.commit = commit if commit is not None else Commit(tiers, catalog)
        self.catalog = catalog
        self.low_water_fraction = float(low_water_fraction)
        self._residencies: weakref.WeakSet[Residency] = weakref.WeakSet()
        self._registry_lock = threading.Lock()  # (datasets open and close on any thread)
        self._lock = threading.RLock()
        #: copies evicted so far (by this process)
        self.evictions = 0

    def register(self, residency: Residency) -> None:
        with self._registry_lock:
            self._residencies.add(residency)

    def unregister(self, residency: Residency) -> None:
        """``residency``'s dataset is closed: its copies are no longer this process's to
        evict (its view of them goes stale from now on)."""
        with self._registry_lock:
            self._residencies.discard(residency)

    def _open_residencies(self) -> list[Residency]:
        with self._registry_lock:
            return list(self._residencies)

    # ----------------------------------------------------------------- hints
    def check_hint(self, hint: str) -> str:
        """Validate ``hint`` against the configured tiers; return its canonical form."""
        h = normalize_hint(hint)
        self._role_tiers(h)
        return h

    def _role_tiers(self, hint: str) -> list[Tier]:
        """The configured tiers of the role canonical ``hint`` names, fastest first (none
        for AUTO and DISABLE); :class:`HintError` where it names a role no tier has."""
        role = HINT_ROLES.get(hint)
        if role is None:
            return []
        tiers = self.tiers.by_role(role)
        if not tiers:
            raise HintError(
                f"hint {hint} names role {role!r}, but no configured tier has that role "
                f"(tiers: {', '.join(f'{t.name}={t.role}' for t in self.tiers)})"
            )
        return tiers

    def persistent(self) -> list[Tier]:
        """Configured tiers that outlive the process: all but the volatile (memory) tiers
        (and the stand-ins of tiers the configuration lacks: :meth:`Tier.unconfigured`)."""
        return [t for t in self.tiers if not t.volatile and t.configured]

    def home(self, hint: str, chosen: str | None = None) -> Tier | None:
        """The tier a hint names (``None`` for DISABLE); AUTO is the tier ``chosen`` by
        prediction (:meth:`choose`) when there is one, else the slowest persistent tier.
        A hint naming a role no configured tier has (a dataset created under another
        configuration) raises :class:`HintError`, as :meth:`check_hint` does."""
        h = normalize_hint(hint)
        if h == "DISABLE":
            return None
        named = self._role_tiers(h)
        if not named:
            if chosen is not None and chosen in self.tiers and self.tiers[chosen].configured:
                return self.tiers[chosen]
            return self.persistent()[-1]
        return named[0]

    def write_order(
        self, hint: str, chosen: str | None = None, *, probe: bool = True
    ) -> list[Tier]:
        """Tiers a write with ``hint`` may use, in order of preference, skipping down tiers.
        An AUTO write with a tier ``chosen`` by prediction fails over from it as a write
        with an explicit hint fails over from the hint's tier. A down tier preferred over
        every tier that is up is probed again (:meth:`Tier.recheck`, at most every
        ``Tier.RECHECK_S``; not with ``probe`` False), so a long-running job's writes return
        to it once it answers."""
        h = normalize_hint(hint)
        if h == "DISABLE":
            return []
        pers = self.persistent()
        home = self.home(h, chosen)
        if h == "AUTO" and home is pers[-1]:
            order = pers[::-1]  # the archive by default, faster tiers as it fills
        else:
            hr = pers.index(home)  # type: ignore[arg-type]
            order = sorted(pers, key=lambda t: (abs(pers.index(t) - hr), -pers.index(t)))
        usable: list[Tier] = []
        for t in order:
            if t.up or (probe and not usable and t.recheck()):
                usable.append(t)
        return usable

    def choose(
        self,
        perf: Any,
        nbytes: int,
        chunk_bytes: int,
        nchunks: int,
        *,
        expected_reads: int = 1,
        deadline_s: float | None = None,
        processes: int = 1,
    ) -> AutoDecision:
        """Placement by prediction, for a dataset with hint AUTO (see :class:`AutoDecision`).

        ``perf`` is a :class:`~strataio.predict.perfdb.PerfTable`. A persistent tier that is
        up, calibrated and has room for ``nbytes`` is a candidate; its predicted time is the
        dataset written once and read ``expected_reads`` times whole: ``nchunks`` chunks of
        ``chunk_bytes``, spread over ``processes`` writing at once, each chunk one ``put``
        (``get``) of the performance database. Without ``deadline_s`` the candidate with the
        least predicted time wins; with it, the slowest tier of the hierarchy (the one with the
        most room to spare) whose prediction meets the deadline, keeping faster tiers free, or
        the fastest prediction when none does. No candidate: the default AUTO (``tier`` None).
        """
        need = max(1, -(-nchunks // max(1, processes)))
        predicted: dict[str, tuple[float, float]] = {}
        skipped: list[str] = []
        for t in self.persistent():
            if not t.up or not t.has_room(nbytes):
                skipped.append(f"{t.name} ({'down' if not t.up else 'no room'})")
            elif (damage := perf.damage(t.name, "put") or perf.damage(t.name, "get")) is not None:
                skipped.append(f"{t.name} (damaged calibration: {damage})")
            elif not perf.has(t.name, "put") or not perf.has(t.name, "get"):
                skipped.append(f"{t.name} (not calibrated)")
            else:
                put = perf.time(t.name, "put", chunk_bytes, processes)
                get = perf.time(t.name, "get", chunk_bytes, processes)
                predicted[t.name] = (need * put, expected_reads * need * get)
        if not predicted:
            return AutoDecision(
                None,
                "no tier with room is calibrated (run `strataio calibrate`)",
                {},
                skipped,
                expected_reads,
                deadline_s,
            )
        total = {name: w + r for name, (w, r) in predicted.items()}
        fastest = min(total, key=lambda n: total[n])
        what = f"write + {counted(expected_reads, 'read')}"
        if deadline_s is None:
            tier = fastest
            reason = f"least predicted {what}: {total[tier]:.3g} s"
        else:
            meets = [n for n in total if total[n] <= deadline_s]
            if meets:
                tier = max(meets, key=self.tiers.rank)
                reason = (
                    f"slowest tier whose predicted {what} ({total[tier]:.3g} s) meets the "
                    f"deadline of {deadline_s:.3g} s"
                )
            else:
                tier = fastest
                reason = (
                    f"no tier meets the deadline of {deadline_s:.3g} s; least predicted "
                    f"{what}: {total[tier]:.3g} s"
                )
        return AutoDecision(tier, reason, predicted, skipped, expected_reads, deadline_s)

    def stage_target(self, below: Tier | None = None) -> Tier | None:
        """The fastest up, writable persistent tier faster than ``below`` (any, when
        None)."""
        limit = self.tiers.rank(below.name) if below is not None else len(self.tiers)
        for t in self.persistent():
            if self.tiers.rank(t.name) < limit and t.up and not t.unwritable:
                return t
        return None

    # ----------------------------------------------------------------- capacity
    def claim(
        self,
        tier: Tier,
        nbytes: int,
        *,
        protect: Iterable[str] = (),
        wait: bool = False,
        evict: bool = True,
    ) -> bool:
        """Reserve ``nbytes`` on ``tier`` for a put in flight, evicting if needed (unless
        ``evict`` is false: then only the room there is); the caller releases the reservation
        (:meth:`Tier.release`) once the copy is recorded.

        With ``wait``, a tier whose room is all held by puts in flight (reserved, or copies
        being written there, so nothing can be evicted yet) is waited on, and room that other
        moves take as soon as it is made is made again, up to :attr:`CLAIM_WAIT` seconds. Only a caller that holds no
        reservation of its own may wait (a move of one chunk; not a batch of writes, which
        goes on to the next tier instead).
        """
        if tier.reserve(nbytes):  # room at once (the usual case): nothing else to look at
            return True
        if not evict:
            return False
        deadline = time.monotonic() + self.CLAIM_WAIT
        while True:
            before, busy = self.evictions, self._in_flight(tier)
            if self._claim_once(tier, nbytes, protect):
                return True
            # other moves may have taken the room this one made, or puts in flight (since
            # recorded, perhaps) held it: try again while either may be the case
            if not wait or time.monotonic() > deadline:
                return False
            if self.evictions == before:
                if not busy and not self._in_flight(tier):
                    return False  # nothing on the tier can go, and nothing is changing
                tier.wait_for_change(0.05)

    def _in_flight(self, tier: Tier) -> bool:
        """True while puts to ``tier`` hold room there (reserved, or copies being written)."""
        return bool(tier.reserved) or any(r.writing_on(tier.name) for r in self._open_residencies())

    def _claim_once(self, tier: Tier, nbytes: int, protect: Iterable[str]) -> bool:
        if tier.reserve(nbytes):
            return True
        keep = protect if isinstance(protect, frozenset) else frozenset(protect)
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

        Eviction goes on down to the low-water mark: until ``max(nbytes, low_water_fraction
        * capacity)`` bytes are free. Victims are the least recently used chunks on the tier,
        of open datasets and (with a catalog) of datasets not open here. A victim with
        another readable copy on an up tier, its object seen there at its size
        (:meth:`present`), is dropped; one without is written back (copy,
        durable put, verify) to the nearest slower up tier with room. Each affected dataset's
        residency is committed, once, before the victims' objects are deleted. Chunks named
        in ``protect`` (``(dataset, key)`` strings ``"name/key"``) are left alone.
        """
        if tier.has_room(nbytes):
            return True
        if tier.capacity is None or nbytes > tier.capacity or tier.out_of_space:
            return False  # (evictions make no room on a device that has none left)
        if tier.unwritable:
            return False  # (nor on a tier that is not written: nothing there is deleted)
        if tier is self.persistent()[-1]:
            return False  # the archive is never evicted from: writes go to the next tier
        keep = protect if isinstance(protect, frozenset) else frozenset(protect)
        target = max(int(nbytes), int(self.low_water_fraction * tier.capacity))
        with self._lock:
            # (last access, residency or the name of a dataset not open here, copy)
            victims: list[tuple[float, Residency | str, ChunkCopy]] = []
            open_res = self._open_residencies()
            for res in open_res:
                for c in res.on_tier(tier.name):
                    if object_key(res.name, c.key) not in keep:
                        victims.append((res.last_access(c), res, c))
            if self.catalog is not None:
                self.commit.record_touches()  # (the access times kept back order it too)
                # datasets another live session has open are never evicted from here: that
                # session may have recorded copies this one does not know of
                names = {r.name for r in open_res} | self.catalog.datasets_in_use()
                for c in self.catalog.lru_copies(tier.name, self.CATALOG_BATCH, exclude=names):
                    if object_key(c.dataset, c.key) not in keep:
                        victims.append((c.last_access, c.dataset, c))
            victims.sort(key=lambda v: v[0])
            loaded: dict[str, Residency] = {}
            touched: list[Residency] = []
            # (the claims of datasets not open here go however the round ends, once what it
            # changed is committed)
            try:
                try:
                    self._evict_victims(tier, target, victims, loaded, touched)
                finally:
                    for res in touched:
                        self.commit.apply(res)
            finally:
                for name in loaded:
                    self.catalog.release_eviction(name)  # type: ignore[union-attr]
            return tier.has_room(nbytes)

    def _evict_victims(
        self,
        tier: Tier,
        target: int,
        victims: list[tuple[float, Residency | str, ChunkCopy]],
        loaded: dict[str, Residency],
        touched: list[Residency],
    ) -> None:
        """Evict ``victims`` (least recently used first) from ``tier`` until ``target`` bytes
        are free, adding to ``loaded`` the datasets not open here it claimed and to
        ``touched`` the residencies it changed (for :meth:`make_room` to commit and release)."""
        refused: set[str] = set()
        # slower tiers found with no room for a write-back this round (tier -> least
        # bytes refused): later victims at least as large do not ask them again (each ask
        # is an eviction round there), so a tier whose victims cannot go anywhere is
        # given up on after one look per slower tier, not one per victim
        full: dict[str, int] = {}
        for _, owner, c in victims:
            if tier.has_room(target):
                break
            if isinstance(owner, Residency):
                res = owner
            else:
                if owner in refused:
                    continue
                got = self._load(owner, loaded)
                if got is None:
                    refused.add(owner)  # opened by another process since it was listed
                    continue
                res = got
                if all(x.tier != tier.name for x in res.copies(c.key)):
                    continue  # gone since the candidates were listed
            try:
                if not self.evict_copy(tier, res, c, full=full):
                    continue
            except ObjectError:
                continue  # (something in the way of its copy or its write-back: it stays)
            if res not in touched:
                touched.append(res)

    def _load(self, name: str, loaded: dict[str, Residency]) -> Residency | None:
        """The residency of dataset ``name``, not open here, read from the catalog (one query)
        the first time an eviction round needs it; None if another process has it open.

        The dataset is claimed for eviction (:meth:`Catalog.claim_eviction`) until the round's
        commits and deletes are done: no other process opens it meanwhile (and so none writes
        an object this round deletes), and fsck leaves the write-backs' objects alone. The
        listing that chose the victims may be stale; the claim is what decides."""
        res = loaded.get(name)
        if res is None:
            assert self.catalog is not None
            if not self.catalog.claim_eviction(name):
                return None
            try:
                copies = self.catalog.residency(name)
            except BaseException:
                self.catalog.release_eviction(name)
                raise
            res = loaded[name] = Residency(name, copies, self.tiers)
        return res

    def present(self, res: Residency, copy: ChunkCopy) -> bool:
        """Whether the object of ``copy``, which a migration or an eviction is about to count
        on to keep the chunk, is there at its catalogued size (one HEAD or stat), so that no
        copy is deleted on the word of a row whose object was lost behind strataio's back.
        A missing one is forgotten where another copy holds its bytes (False); one of another
        size raises :class:`StrataError` (fsck repairs it), and nothing is deleted."""
        tier = self.tiers[copy.tier]
        try:
            n = tier.call(tier.backend.size, object_key(res.name, copy.key))
        except FileNotFoundError:
            if res.drop_missing(copy) or not res.is_current(copy):
                return False  # (forgotten, or moved or rewritten meanwhile)
            if not any(c.tier != copy.tier and same_bytes(c, copy) for c in res.readable(copy.key)):
                raise res.missing_copy_error(copy.key, copy) from None
            raise StrataError(
                f"chunk {copy.key!r} of {res.name!r}: its copy on tier {copy.tier!r} was "
                "found missing; no other copy of it is deleted (run 'strataio fsck --repair')"
            ) from None
        if n != copy.nbytes:
            raise StrataError(
                f"chunk {copy.key!r} of {res.name!r}: its copy on tier {copy.tier!r} holds {n} "
                f"bytes, the catalog says {copy.nbytes}; no other copy of it is deleted (run "
                "'strataio fsck --repair', which drops the damaged copy where a good one is left)"
            )
        return True

    def look_elsewhere(self, tier: Tier, res: Residency, key: str) -> None:
        """Look (:meth:`present`) at each readable copy of ``key`` on a persistent tier other
        than ``tier`` before its copy on ``tier`` is dropped as kept elsewhere: one found
        missing is forgotten (the copy on ``tier`` is then written back instead), one of
        another size raises :class:`StrataError`."""
        for other in res.readable(key):
            if other.tier != tier.name and not self.tiers[other.tier].volatile:
                self.present(res, other)

    def evict_copy(
        self,
        tier: Tier,
        res: Residency,
        copy: ChunkCopy,
        *,
        full: dict[str, int] | None = None,
        looked: bool = False,
    ) -> bool:
        """Forget ``copy`` (of ``res``, on ``tier``) so that its object is deleted after the
        next commit, writing it back first if no other copy is kept on a persistent tier.

        The other copies counted on are looked at first (:meth:`look_elsewhere`; not with
        ``looked``, the caller having done so): one lost behind strataio's back is forgotten
        and ``copy`` written back; one found damaged or that cannot be looked at keeps
        ``copy`` (False). False, and nothing changed, also if the chunk has a put in flight,
        changed since ``copy`` was listed, or cannot be written back. A copy whose object is
        found missing is forgotten (True: its room is free). ``full``: see
        :meth:`write_back`, which raises :class:`ObjectError` where something not
        strataio's is in the way.
        """
        if res.busy(copy.key, tier.name) or copy.state == "in-transit":
            # its new version is being written there (by a put here, or by whoever announced
            # it: a copy this residency is not writing): not a victim
            return False
        if not looked and not tier.volatile:
            try:
                self.look_elsewhere(tier, res, copy.key)
            except TierDownError:
                pass  # (that tier is marked down: its copy no longer counts as kept)
            except ObjectError:
                raise
            except StrataError:
                return False  # (another copy found damaged: fsck settles it; this one stays)
        done = res.drop_if_kept(copy)
        if not done and not tier.volatile and res.copy_on(copy.key, tier.name) is not None:
            done = self.write_back(tier, res, copy, full=full)
        if done:
            self.evictions += 1
        return done

    def write_back(
        self, tier: Tier, res: Residency, copy: ChunkCopy, *, full: dict[str, int] | None = None
    ) -> bool:
        """Copy ``copy`` (on ``tier``) safely to the nearest slower up persistent tier with
        room, record it there and forget the source copy (its object is deleted after the
        commit that records the new one). False if no slower tier can take it or the chunk
        changed meanwhile; True also when the source object turns out to be missing (the
        catalogued copy is then forgotten: nothing is left to write back). Raises
        :class:`ObjectError`, nothing recorded and every tier left up, where something not
        strataio's is in the way of the copy (it cannot be read: not evicted) or of the object
        to put on the nearest slower tier with room (no further tier is tried, as for a
        write).

        ``full`` (one eviction round's): slower tiers found without room, each with the least
        bytes it refused; a tier there is not asked again for as many bytes or more, and a
        tier that refuses is added."""
        rank = self.tiers.rank(tier.name)
        for dst in self.persistent():
            if self.tiers.rank(dst.name) <= rank or not dst.up:
                continue
            if full is not None and copy.nbytes >= full.get(dst.name, copy.nbytes + 1):
                continue  # (refused as many bytes this round)
            there = res.copy_on(copy.key, dst.name)
            if there is not None and there.rewritten_by_other(self.commit.writer):
                continue  # (that process is putting its new bytes there: never replaced)
            if not self.claim(dst, copy.nbytes):
                if full is not None:
                    full[dst.name] = min(full.get(dst.name, copy.nbytes), copy.nbytes)
                continue
            recorded = False
            try:
                with res.writing(copy.key, dst.name):
                    version = res.version(copy.key)
                    current = res.copy_on(copy.key, tier.name)
                    if current is None or not res.is_current(copy) or res.busy(copy.key, tier.name):
                        # rewritten, gone or being rewritten since it was chosen: nothing put,
                        # and the object at the destination (maybe another process's) stays
                        res.abandon_write(copy.key, dst.name)
                        return False
                    # the source is read before anything is announced or put: if it cannot
                    # be, the destination (and any row another process recorded for it, which
                    # this residency may not know of) is left alone
                    try:
                        data = read_checked(tier, res.name, copy.key, copy.checksum)
                    except BaseException as exc:
                        res.abandon_write(copy.key, dst.name)
                        if isinstance(exc, NotFoundError):
                            return res.drop_missing(current)
                        if isinstance(exc, ChecksumError):
                            return False  # a corrupt only copy: fsck reports it; never evicted
                        if isinstance(exc, ObjectError):
                            raise ObjectError(
                                f"chunk {copy.key!r} of dataset {res.name!r}: its copy on tier "
                                f"{tier.name!r} cannot be read, so it is not written back nor "
                                f"evicted: {exc}"
                            ) from exc
                        raise
                    try:
                        held, seen = self.commit.prepare_copy(res, copy, dst)
                        n, digest, put = put_checked(
                            dst,
                            res.name,
                            copy.key,
                            data,
                            new=not held,
                            over=seen,
                            like=copy.checksum,
                        )
                    except ExistsError:
                        res.abandon_write(copy.key, dst.name)
                        return False
                    except ChecksumError:
                        return False
                    except ObjectError as exc:
                        raise ObjectError(
                            f"chunk {copy.key!r} of dataset {res.name!r} not written back to "
                            f"tier {dst.name!r}, so not evicted from {tier.name!r}: {exc}"
                        ) from exc
                    back = ChunkCopy(
                        res.name, copy.key, dst.name, n, digest, "valid", res.last_access(copy)
                    )
                    recorded = res.record_move(
                        back,
                        version,
                        reserved=copy.nbytes,
                        replaces=current,
                        put=put,
                    )
                    return recorded
            except TierDownError:
                if not tier.up:
                    return False
            finally:
                if not recorded:
                    dst.release(copy.nbytes)
        return False
