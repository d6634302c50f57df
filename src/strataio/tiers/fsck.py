"""fsck: check every catalogued chunk copy against the bytes on its tier, and repair.

Three steps, each usable alone:

1. :func:`inspect` reads what there is: the catalog's copies, what each tier holds, the bytes
   of each copy (size and checksum), objects and temporary files no row names, and which
   writers are alive (:mod:`strataio.catalog.liveness`). It changes nothing.
2. :func:`plan` decides, from an :class:`Inventory` alone, what each thing is (a
   :class:`Finding` of a :class:`Kind`) and what repair it calls for (an :class:`Action`),
   and gathers the catalog changes and deletions that carry the repairs out.
3. :func:`apply` carries out a :class:`Plan`: one catalog transaction, then the deletions
   (objects only after the catalog stops naming them) and rewrites. One a tier refuses (down,
   full, an I/O error) is reported in its finding, and the rest goes on; an error of one
   object where the tier answers leaves the tier up (:meth:`Tier.call_alone`).

:func:`fsck` runs the three (``apply`` only with ``repair``) and returns an
:class:`FsckReport`.

What interrupted operations leave, and what repair does:

- a migration or stage killed before its commit: destination objects no row names
  (**orphan**, deleted: the catalogued source is intact); killed after its commit: source
  objects no row names (**orphan**, deleted);
- a rewrite in place killed before its commit: a row announced ``in-transit`` with the old
  and the new checksum, its object whole in one version or the other (puts are atomic). Old
  bytes: the row is restored (**state**, adopt). New bytes: dropped if another copy holds
  the old version, else adopted (**state**);
- a write of a new chunk killed before its commit: an object of an uncatalogued chunk
  (**unrecorded**, adopted: it is the only version there is);
- a put killed mid-write: a temporary file (**leftover**, deleted);
- a deletion of a dataset whose objects a tier kept (it was down, or the deleting process
  died): objects under the name of a deleted dataset whose remnants the catalog records
  (:mod:`strataio.tiers.remnants`) (**orphan**, deleted; the remnant of each tier checked is
  cleared once nothing of it is left there). No dataset of that name exists meanwhile
  (:meth:`Catalog.create_dataset` refuses it), so an unrecorded object fsck adopts is never
  one of an earlier dataset of its name. Objects under a name that is neither catalogued nor
  a deleted dataset's are not fsck's to judge: they are left alone, unreported.

A tiered dataset's ``zarr.json`` is checked on every tier checked against the versions its
catalog record names (:mod:`strataio.tiers.meta`): a copy of another version (the tier was
down while attributes were set) is **stale-meta**, rewritten by repair with the first copy of
a version the record names, in tier order (the one reads take). A dataset none of whose
copies on the tiers checked is of such a version is not judged where every tier was checked
(reads then take the first copy: a hand edit, or an older strataio); where a tier was not,
the current one may be there alone, and the copies checked are reported stale-meta with no
repair until it answers.

No clock decides any of this. An announced rewrite whose writer is alive, and an unnamed
object or temporary file of a dataset some live writer has in use, may belong to an
operation still running: they are reported **in-flight** and left alone. So is a temporary
file whose put holds its lock (:func:`strataio.storage.posix.judge_leftover`, the rule for
plain datasets too), and a leftover is deleted holding that lock. Everything of a writer that
is gone is resolved at once.

fsck runs beside live jobs. It reads the catalog's rows once, before the objects, so a
process that rewrites or moves a chunk meanwhile leaves objects those rows do not describe.
A chunk whose copy looks bad is therefore checked again against its rows as they are now,
and only a verdict between two reads of the same rows stands (a chunk whose rows change
every time is **in-flight**); an object no row names is judged only if no row names it
after the tiers were listed. A repair changes or drops a row only if it is still the row
judged, deletes no object that a row names when it comes to delete it, deletes an object
no row names only at the version it was inspected at, and rewrites a stale ``zarr.json``
only over the copy inspected (one an attribute change put there since is **in-flight**).
An object of a deleted dataset is deleted only while its name has remnants, holding a claim
of it (as :func:`~strataio.tiers.remnants.purge` does): a create of the name purges them
first, and what is under a name created again since the inspection is the new dataset's
(**in-flight**, left).

A ``valid`` copy whose bytes differ from its row is bad (**checksum** / **size**); with
another good copy it is dropped, without one the chunk is reported **corrupt** (never
silently adopted). A chunk with no copy left at all is **lost**.

A copy something not of strataio's stands in the way of (a directory where its object
should be, a file where one of its folders should be: EISDIR, ENOTDIR; see
:class:`~strataio.errors.ObjectError`) is **blocked**: reported with the path, never
repaired. Its row stays and nothing there is deleted: its object may be whole again once
what is in the way is moved (a folder renamed aside, a file put back), and a row dropped
would make that object, back, an orphan the next repair deletes. For the chunk's other
copies it counts as a copy on a tier not checked: it may hold the chunk's value.

Nothing on a read-only tier (:attr:`~strataio.tiers.tier.Tier.read_only`, or one whose
storage refuses writes: :attr:`~strataio.tiers.tier.Tier.writes_refused`) is deleted or
written: what a repair would delete or rewrite there (an orphan, a leftover, a stale
``zarr.json``) is reported and left, and a bad copy there that a repair drops loses its row
only.

Superfile containers (:mod:`strataio.tiers.superfile`) are checked inside as well, where
copies are read (``verify``): a container whose footer or index is unreadable is a **bad
index**, one with a member outside its member bytes or failing its CRC-32C a **bad member**
(the finding names the member). Both are reported, never repaired: the bytes are the ones
the catalog recorded, so no other copy is better. An unrecorded container (a seal whose
commit never happened) is adopted only if it is whole; otherwise it is a **bad index** and
deleted, so its members read as missing, never as wrong bytes.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from itertools import repeat
from typing import Any

from strataio.catalog.base import Catalog, ChunkCopy, CopyId, DatasetRecord, OvertakenRewrite
from strataio.errors import ExistsError, NotFoundError, StrataError
from strataio.storage.base import BytesLike
from strataio.storage.posix import LeftoverState, judge_leftover
from strataio.storage.superfile import ContainerProblem, check_container
from strataio.tiers.meta import meta_checksums
from strataio.tiers.residency import META_KEY, object_key
from strataio.tiers.superfile import container_seq, is_superfile
from strataio.tiers.tier import (
    Tier,
    TierSet,
    checksum,
    checksum_like,
    in_the_way,
    is_backend_failure,
)

__all__ = [
    "Action",
    "CopyCheck",
    "Finding",
    "FsckReport",
    "Inventory",
    "Kind",
    "Leftover",
    "MetaCheck",
    "Plan",
    "UnnamedObject",
    "Verdict",
    "apply",
    "fsck",
    "inspect",
    "plan",
]


class Kind(StrEnum):
    """What a finding is. Every kind but ``IN_FLIGHT`` is a problem."""

    MISSING = "missing"  # a catalogued copy's object is gone
    SIZE = "size"  # its object has another size than the row says
    CHECKSUM = "checksum"  # its bytes have another checksum than the row says
    STATE = "state"  # a rewrite announced by a writer that is gone
    ORPHAN = "orphan"  # an object of a catalogued chunk that no row names
    UNRECORDED = "unrecorded"  # an object of a chunk the catalog does not know
    LEFTOVER = "leftover"  # a temporary file of an interrupted put
    CORRUPT = "corrupt"  # the only copies left are bad
    LOST = "lost"  # no tier holds the chunk any more
    DIVERGED = "diverged"  # settled copies of one chunk hold different values
    BAD_INDEX = "bad-index"  # a superfile container's footer or index is unreadable
    BAD_MEMBER = "bad-member"  # a container member out of bounds or failing its checksum
    STALE_META = "stale-meta"  # a zarr.json of a version the catalog record does not name
    BLOCKED = "blocked"  # something not of strataio's is in the way of a copy's object
    IN_FLIGHT = "in-flight"  # a live writer may still be working on it

    @property
    def problem(self) -> bool:
        return self is not Kind.IN_FLIGHT


class Action(StrEnum):
    """What repair does (or did) about a finding."""

    NONE = ""  # nothing can be done: reported
    DROP_COPY = "drop copy"  # forget the row, delete the object
    ADOPT = "adopt object"  # record the object's real size and checksum as a valid copy
    DELETE = "delete"  # delete an object or file no row names
    LEAVE = "left alone"  # in flight: its writer is alive
    REWRITE = "rewrite"  # put the current version of a zarr.json in its place


class Verdict(StrEnum):
    """What the bytes of one catalogued copy are."""

    GOOD = "good"  # as the row says
    MISSING = "missing"
    SIZE = "size"
    CHECKSUM = "checksum"
    NEW = "new"  # an announced rewrite's new bytes
    OLD = "old"  # an announced rewrite's old bytes (the put never happened)
    BLOCKED = "blocked"  # not readable: something is in the way of its object (EISDIR, ENOTDIR)


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing fsck noticed about chunk ``key`` of ``dataset`` on ``tier`` (a temporary
    file: ``key`` is its path)."""

    kind: Kind
    tier: str
    dataset: str
    key: str
    detail: str
    action: Action = Action.NONE

    @property
    def problem(self) -> bool:
        return self.kind.problem


@dataclass(frozen=True, slots=True)
class CopyCheck:
    """A catalogued copy and what its object holds (``nbytes`` -1 when missing or
    blocked)."""

    copy: ChunkCopy
    verdict: Verdict
    nbytes: int
    digest: str
    #: what is wrong inside a superfile container whose bytes are as catalogued
    problems: tuple[ContainerProblem, ...] = ()
    #: of a blocked copy: what is in the way, and where
    error: str = ""


@dataclass(frozen=True, slots=True)
class UnnamedObject:
    """An object of chunk ``key`` of catalogued ``dataset`` on ``tier`` that no row names.
    ``nbytes`` / ``digest`` are read only where repair would adopt it (else -1 / "")."""

    tier: str
    dataset: str
    key: str
    nbytes: int = -1
    digest: str = ""
    #: what is wrong inside it, where it is a superfile container
    problems: tuple[ContainerProblem, ...] = ()
    #: its version when inspected (:meth:`Backend.object_versions`; None: not known)
    version: Any = None
    #: of a deleted dataset (a remnant, :mod:`strataio.tiers.remnants`), not a catalogued one
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class Leftover:
    """A temporary file at ``path`` on ``tier``, of ``dataset`` (None when not known);
    ``live``: a put running now holds its lock."""

    tier: str
    path: str
    dataset: str | None
    live: bool = False


@dataclass(frozen=True, slots=True)
class MetaCheck:
    """The copies of tiered dataset ``dataset``'s ``zarr.json`` on the tiers checked:
    ``copies`` as ``(tier, checksum)``, fastest tier first; ``accepted``, the checksums of
    the versions its catalog record names; ``current``, the bytes of the first copy of such
    a version (None: none); ``versions``, ``(tier, version)`` of each copy's object, looked
    at before it was read (:meth:`Backend.object_versions`; None: not known)."""

    dataset: str
    accepted: tuple[str, ...]
    copies: tuple[tuple[str, str], ...]
    current: bytes | None
    versions: tuple[tuple[str, Any], ...] = ()


@dataclass(slots=True)
class Inventory:
    """What :func:`inspect` saw; nothing in it is a judgement yet."""

    copies: list[ChunkCopy] = field(default_factory=list)
    checks: list[CopyCheck] = field(default_factory=list)
    #: chunks with a copy on a tier that was not checked (down)
    unchecked: set[tuple[str, str]] = field(default_factory=set)
    #: the read-only tiers, where nothing is deleted or written
    read_only: set[str] = field(default_factory=set)
    unnamed: list[UnnamedObject] = field(default_factory=list)
    leftovers: list[Leftover] = field(default_factory=list)
    live_writers: set[str] = field(default_factory=set)
    dead_writers: list[str] = field(default_factory=list)
    #: datasets some live writer has in use
    in_use: set[str] = field(default_factory=set)
    skipped_tiers: list[str] = field(default_factory=list)
    #: why each of :attr:`skipped_tiers` was not checked (the error its probe or listing
    #: met), by tier name
    skipped_why: dict[str, str] = field(default_factory=dict)
    #: chunks whose rows changed every time their copies were checked again (in flight)
    changing: set[tuple[str, str]] = field(default_factory=set)
    #: the zarr.json copies of the tiered datasets whose record names their versions
    metas: list[MetaCheck] = field(default_factory=list)
    #: ``(dataset, tier)`` of the remnants of deleted datasets (:meth:`Catalog.remnants`)
    remnants: set[tuple[str, str]] = field(default_factory=set)
    #: the tiers whose objects were listed (checked)
    listed: set[str] = field(default_factory=set)
    #: announced rewrites another writer's announcement replaced (:meth:`Catalog.overtaken`),
    #: by chunk: a gone writer's put may have landed after the other's commit
    overtaken: dict[tuple[str, str], list[OvertakenRewrite]] = field(default_factory=dict)
    #: ``(tier, object)`` of copies checked again: the object's version just before the
    #: check whose verdict stands (a repair deletes such an object only at that version;
    #: :data:`ABSENT`: it was not there, and what the check read appeared since)
    versions: dict[tuple[str, str], Any] = field(default_factory=dict)


@dataclass(slots=True)
class Plan:
    """Findings and the repairs they call for: catalog changes, then deletions."""

    findings: list[Finding] = field(default_factory=list)
    upserts: list[ChunkCopy] = field(default_factory=list)
    deletes: list[CopyId] = field(default_factory=list)
    #: (tier, object key) to delete once the catalog no longer names them
    objects: list[tuple[str, str]] = field(default_factory=list)
    #: of those, the version each was inspected at (deleted only at that version)
    versions: dict[tuple[str, str], Any] = field(default_factory=dict)
    files: list[Leftover] = field(default_factory=list)
    #: ``(tier, dataset, bytes, versions named, object version)``: zarr.json copies to
    #: rewrite with those bytes, while the dataset's record names those versions still and
    #: the object is at that version (:meth:`Backend.put_if`)
    metas: list[tuple[str, str, bytes, tuple[str, ...], Any]] = field(default_factory=list)
    #: writers that are gone, whose registration is removed
    forget_writers: list[str] = field(default_factory=list)
    #: records of overtaken rewrites judged here (their writer gone), cleared after the
    #: catalog changes (but those of a chunk whose change was left out: changed since)
    overtaken_done: list[OvertakenRewrite] = field(default_factory=list)
    #: ``(dataset, tier)`` of remnants to clear once no object of theirs is left
    remnants: list[tuple[str, str]] = field(default_factory=list)
    #: of ``objects``, those of a deleted dataset, by its name: deleted only while the name
    #: is still a deleted dataset's (it has remnants), under a claim of it
    of_deleted: dict[tuple[str, str], str] = field(default_factory=dict)
    #: per copy among ``upserts`` and ``deletes``, the ``(state, checksum)`` of the row the
    #: judgement was made on (None: no row): a row changed since is left as it is now
    expect: dict[CopyId, tuple[str, str] | None] = field(default_factory=dict)
    #: of ``deletes``, the copies whose object was missing when inspected: dropped only while
    #: it still is (another process may have put a copy there since, and recorded it in a
    #: row like the one judged)
    missing: set[CopyId] = field(default_factory=set)

    @property
    def changes(self) -> bool:
        return bool(
            self.upserts
            or self.deletes
            or self.objects
            or self.files
            or self.metas
            or self.remnants
        )


@dataclass(slots=True)
class FsckReport:
    """What one fsck pass saw: ``copies`` checked (those on the tiers it checked), ``chunks``
    catalogued, and findings."""

    copies: int = 0
    chunks: int = 0
    findings: list[Finding] = field(default_factory=list)
    #: tiers that were down, and stayed down when probed: not checked
    skipped_tiers: list[str] = field(default_factory=list)
    #: why each of :attr:`skipped_tiers` was not checked, by tier name
    skipped_why: dict[str, str] = field(default_factory=dict)
    repaired: bool = False
    #: registrations of writers found gone (removed by a repair)
    writers_gone: int = 0
    #: ``(dataset, tier)`` of the remnants of deleted datasets left after this pass (a
    #: repair clears those whose objects it found gone; see :mod:`strataio.tiers.remnants`)
    remnants: list[tuple[str, str]] = field(default_factory=list)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.problem]

    @property
    def clean(self) -> bool:
        return not self.problems

    @property
    def in_flight(self) -> list[Finding]:
        return [f for f in self.findings if f.kind is Kind.IN_FLIGHT]

    @property
    def lost(self) -> list[Finding]:
        """Chunks with no intact copy left (missing everywhere, or corrupt everywhere)."""
        return [f for f in self.findings if f.kind in (Kind.LOST, Kind.CORRUPT)]

    @property
    def unrepairable(self) -> list[Finding]:
        """Problems no repair resolves (their action is none): :attr:`lost` chunks, chunks
        whose settled copies hold different values (which is the last written is not
        recorded), blocked copies (what is in their way is not strataio's to move), and what
        is wrong inside superfile containers."""
        return [f for f in self.problems if f.action is Action.NONE]


# ----------------------------------------------------------------------------- inspect
def inspect(
    catalog: Catalog,
    tiers: TierSet,
    *,
    verify: bool = True,
    workers: int = 8,
    progress: Callable[[int, int], None] | None = None,
) -> Inventory:
    """Read what the catalog and the tiers hold; change nothing.

    ``verify`` reads every copy and computes its checksum; without it only existence and
    size are checked (announced rewrites are always read: their bytes decide). A tier marked
    down (by this process, or in the catalog by another) is probed first (:meth:`Tier.check`,
    which records in the catalog what it finds): one that answers again is checked, one that
    still does not is skipped and listed in :attr:`Inventory.skipped_tiers`, with the error
    in :attr:`Inventory.skipped_why`; so is a tier the configuration lacks
    (:meth:`Tier.unconfigured`) where the catalog records copies or remnants there.
    ``progress(done, total)`` is called as copies are checked.
    """
    inv = Inventory()
    # (a dataset in use at the start or at the end counts as in use: see _read_writers)
    inv.in_use.update(catalog.datasets_in_use())
    # (before the rows: a record made since is of a writer alive then, whose bytes a
    # later fsck judges)
    for e in catalog.overtaken():
        inv.overtaken.setdefault((e.dataset, e.key), []).append(e)
    suspect = {(e.dataset, e.key, e.tier) for es in inv.overtaken.values() for e in es}
    inv.copies = catalog.all_residency()
    records = catalog.list_datasets()
    names = {d.name for d in records}
    inv.remnants = set(catalog.remnants())
    # (no dataset of a name with remnants can be created: see Catalog.create_dataset)
    deleted = {d for d, _ in inv.remnants} - names
    superfiles = {d.name for d in records if is_superfile(d)}
    chunk_keys = {d.name: _chunk_key_test(d) for d in records}

    def inside(dataset: str, key: str, data: BytesLike) -> tuple[ContainerProblem, ...]:
        if dataset not in superfiles:
            return ()
        return tuple(check_container(data, f"{key!r} of superfile {dataset!r}"))

    for t in tiers:
        if not t.up:
            t.check()  # (not rate-limited: fsck is the deliberate look at every tier)
    # (a tier the configuration lacks is down for good here: not checked, and only worth
    # saying where the catalog records something there)
    held = {c.tier for c in inv.copies} | {t for _, t in inv.remnants}
    down = [t for t in tiers if not t.up and (t.configured or t.name in held)]
    inv.skipped_tiers = [t.name for t in down]
    # (after the probes: one may find a tier's storage refusing writes while it is read)
    inv.read_only = {t.name for t in tiers if t.unwritable}
    inv.skipped_why = {t.name: _why_down(t.last_error) for t in down}

    listed: dict[str, set[str]] = {}
    for t in tiers:
        if not t.up or t.volatile:
            continue  # memory tiers hold no catalogued copy: what they hold dies with the process
        try:
            listed[t.name] = set(t.backend.list())
        except Exception as exc:
            if not is_backend_failure(exc):
                raise
            t.mark_down(exc)
            inv.skipped_tiers.append(t.name)
            inv.skipped_why[t.name] = _why_down(t.last_error)
    inv.listed = set(listed)
    inv.unchecked = {(c.dataset, c.key) for c in inv.copies if c.tier not in listed}
    checked = [c for c in inv.copies if c.tier in listed]

    def check(c: ChunkCopy, listing: bool = True) -> CopyCheck:
        t = tiers[c.tier]
        ok = object_key(c.dataset, c.key)
        if listing and ok not in listed[c.tier]:
            return CopyCheck(c, Verdict.MISSING, -1, "")
        try:
            if verify or c.state == "in-transit" or (c.dataset, c.key, c.tier) in suspect:
                data = t.backend.get(ok)
                n, digest = len(data), checksum_like(c.checksum, data)
            else:
                n, digest = t.backend.size(ok), c.checksum
        except FileNotFoundError:
            return CopyCheck(c, Verdict.MISSING, -1, "")
        except OSError as exc:
            blocked = in_the_way(exc)
            if blocked is None:
                raise
            where = blocked.filename or ok
            return CopyCheck(c, Verdict.BLOCKED, -1, "", error=f"{blocked.strerror}: {where}")
        if c.state == "in-transit":
            if c.checksum and digest == c.checksum:
                return CopyCheck(c, Verdict.NEW, n, digest)
            if c.old_checksum and checksum_like(c.old_checksum, data) == c.old_checksum:
                return CopyCheck(c, Verdict.OLD, n, c.old_checksum)
            return CopyCheck(c, Verdict.CHECKSUM, n, digest)
        if n != c.nbytes:
            return CopyCheck(c, Verdict.SIZE, n, digest)
        if c.checksum and digest != c.checksum:
            return CopyCheck(c, Verdict.CHECKSUM, n, digest)
        problems = inside(c.dataset, c.key, data) if verify else ()
        return CopyCheck(c, Verdict.GOOD, n, digest, problems)

    with ThreadPoolExecutor(max(1, workers)) as pool:
        if progress is not None:
            progress(0, len(checked))
        for i, r in enumerate(pool.map(check, checked), start=1):
            inv.checks.append(r)
            if progress is not None:
                progress(i, len(checked))
        _check_again(
            catalog, tiers, inv, lambda cs: list(pool.map(check, cs, repeat(False))), set(listed)
        )

    inv.metas = _inspect_metas(records, tiers, listed)
    # Writers last: whoever left a row or an object seen above had registered (and marked
    # its dataset in use) before it did, so it is listed here if it is still alive.
    _read_writers(catalog, inv)
    named = {(c.tier, object_key(c.dataset, c.key)) for c in inv.copies}
    catalogued = {(c.dataset, c.key) for c in inv.copies}
    # (a dataset's chunk keys are all of one depth: a file at the folder of one is in its
    # way, not a chunk)
    folders = {
        (ds, key.rsplit("/", i)[0]) for ds, key in catalogued for i in range(1, key.count("/") + 1)
    }
    unnamed: list[tuple[str, str, str, str]] = []  # (tier, object, dataset, key)
    gone: list[tuple[str, str, str, str]] = []  # the same, of deleted datasets
    for tname, objs in listed.items():
        for ok in sorted(objs):
            if (tname, ok) in named:
                continue
            ds, key = _split(ok, names)
            if ds is None:
                ds, key = _split(ok, deleted)
                if ds is not None:
                    gone.append((tname, ok, ds, key))
                continue  # else not an object of a dataset: not ours to judge
            if key == META_KEY or (ds, key) in folders or not chunk_keys[ds](key):
                # (zarr.json, a file in a chunk's folder's way, or no key of the dataset's
                # chunks at all: a file of someone else's there, never adopted as a chunk)
                continue
            unnamed.append((tname, ok, ds, key))
    # Each object's version first (a repair deletes it only at that version: one put in its
    # place since is another process's), then the rows: they were read before the tiers were
    # listed, and a move or write committed since named objects those rows do not (its
    # writer may have closed the dataset since). Only what no row names now is judged.
    seen = _object_versions(tiers, [(tname, ok) for tname, ok, _, _ in unnamed + gone])
    for tname, ok, ds, key in gone:
        inv.unnamed.append(
            UnnamedObject(tname, ds, key, version=seen.get((tname, ok)), deleted=True)
        )
    now = _rows_now(catalog, [(ds, key) for _, _, ds, key in unnamed])
    for tname, ok, ds, key in unnamed:
        rows = now.get((ds, key), [])
        if any(c.tier == tname for c in rows):
            continue
        n, digest, problems = -1, "", ()
        if ds not in inv.in_use and (ds, key) not in catalogued and not rows:
            try:  # a candidate for adoption: its size and checksum make the row
                data = tiers[tname].backend.get(ok)
            except FileNotFoundError:
                continue
            n, digest = len(data), checksum(data)
            problems = inside(ds, key, data)
        inv.unnamed.append(
            UnnamedObject(tname, ds, key, n, digest, problems, seen.get((tname, ok)))
        )
    for tname in listed:
        t = tiers[tname]
        base = getattr(t.backend, "inner", t.backend)  # a Shaped tier's own files
        leftovers = getattr(base, "leftovers", None)
        if leftovers is not None:
            root = os.fspath(getattr(base, "root", ""))
            for path in leftovers():
                state = judge_leftover(path)
                if state is LeftoverState.GONE:
                    continue
                rel = os.path.relpath(path, root).replace(os.sep, "/") if root else ""
                ds, _ = _split(rel, names)
                inv.leftovers.append(Leftover(tname, path, ds, state is LeftoverState.LIVE))
    return inv


def _inspect_metas(
    records: Iterable[DatasetRecord], tiers: TierSet, listed: dict[str, set[str]]
) -> list[MetaCheck]:
    """The zarr.json copies, on the tiers ``listed``, of each dataset whose record names
    their versions."""
    out = []
    for d in records:
        accepted = meta_checksums(d)
        if accepted is None or d.state == "disabled":
            continue
        obj = object_key(d.name, META_KEY)
        copies: list[tuple[str, str]] = []
        versions: list[tuple[str, Any]] = []
        current: bytes | None = None
        for t in tiers:
            if obj not in listed.get(t.name, ()):
                continue
            # (the version first: a rewrite over it fails where the object changed since)
            seen = t.backend.object_versions([obj])
            try:
                data = bytes(t.backend.get(obj))
            except FileNotFoundError:
                continue
            digest = checksum(data)
            copies.append((t.name, digest))
            versions.append((t.name, None if seen is None else seen[0]))
            if current is None and digest in accepted:
                current = data
        out.append(MetaCheck(d.name, tuple(accepted), tuple(copies), current, tuple(versions)))
    return out


def _why_down(error: str) -> str:
    return error or "marked down, no error recorded"


def _read_writers(catalog: Catalog, inv: Inventory) -> None:
    inv.in_use.update(catalog.datasets_in_use())
    for w in catalog.writers():
        if w.alive:
            inv.live_writers.add(w.id)
        else:
            inv.dead_writers.append(w.id)


_BAD = (Verdict.MISSING, Verdict.SIZE, Verdict.CHECKSUM)
#: verdicts whose copy a repair may drop: checked again before they stand (NEW and OLD are
#: the bytes of a rewrite whose writer is gone; another writer may take the chunk over)
_DROPPABLE = (*_BAD, Verdict.NEW, Verdict.OLD)


def _rows_now(
    catalog: Catalog, chunks: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], list[ChunkCopy]]:
    """The catalog's rows of ``chunks`` (``(dataset, key)``) as they are now, by chunk (one
    query per dataset)."""
    keys: dict[str, set[str]] = {}
    for ds, key in chunks:
        keys.setdefault(ds, set()).add(key)
    out: dict[tuple[str, str], list[ChunkCopy]] = {}
    for ds, wanted in keys.items():
        for c in catalog.residency(ds, sorted(wanted)):
            out.setdefault((ds, c.key), []).append(c)
    return out


#: the "version" of an object that was not there when its version was asked
ABSENT = object()


def _object_versions(
    tiers: TierSet, objects: list[tuple[str, str]], absent: Any = None
) -> dict[tuple[str, str], Any]:
    """The version of each ``(tier, object)`` now (:meth:`Backend.object_versions`, one
    call per tier), for those whose backend keeps versions: ``absent`` for those that are
    not there (left out where None)."""
    by_tier: dict[str, list[str]] = {}
    for tname, ok in objects:
        by_tier.setdefault(tname, []).append(ok)
    out: dict[tuple[str, str], Any] = {}
    for tname, oks in by_tier.items():
        backend = tiers[tname].backend
        try:
            got = backend.object_versions(oks)
        except OSError as exc:
            if in_the_way(exc) is None:
                raise
            # (something in one object's way fails the batch: each alone, the blocked ones
            # left out, their version not known)
            got, asked = [], oks
            oks = []
            for ok in asked:
                try:
                    one = backend.object_versions([ok])
                except OSError as err:
                    if in_the_way(err) is None:
                        raise
                    continue
                if one is not None:
                    oks.append(ok)
                    got.extend(one)
        for ok, v in zip(oks, got or ()):
            if v is not None or absent is not None:
                out[tname, ok] = absent if v is None else v
    return out


def _same_rows(a: list[ChunkCopy], b: list[ChunkCopy]) -> bool:
    """Whether two reads of one chunk's rows found the same copies (access times aside)."""

    def seen(rows: list[ChunkCopy]) -> list[tuple]:
        return sorted(
            (c.tier, c.nbytes, c.checksum, c.state, c.old_checksum, c.writer) for c in rows
        )

    return seen(a) == seen(b)


def _check_again(
    catalog: Catalog,
    tiers: TierSet,
    inv: Inventory,
    check: Callable[[list[ChunkCopy]], list[CopyCheck]],
    checked_tiers: set[str],
    rounds: int = 3,
) -> None:
    """Check again the chunks a copy of which looked bad (missing, or bytes other than its
    row says) or half rewritten, against their rows as they are now (``check`` checks a
    list of copies, in parallel). The rows were read once, before any object: a process
    that rewrote a chunk in place (announced, put, flushed) or moved it (put, committed,
    deleted the source) meanwhile leaves objects those rows do not describe, and that is no
    fault of the copy. A chunk's new verdicts stand where its rows read just before and just
    after the objects agree (an announcement always comes before the object changes, a
    move's deletion after its commit); a chunk whose rows changed in every one of ``rounds``
    tries is in flight (:attr:`Inventory.changing`). Each object's
    version is taken just before its check (:attr:`Inventory.versions`): an object put in
    its place after that is not the one judged, and a repair leaves it."""
    pending = {(r.copy.dataset, r.copy.key) for r in inv.checks if r.verdict in _DROPPABLE}
    if not pending:
        return
    settled: dict[tuple[str, str], tuple[list[ChunkCopy], list[CopyCheck]]] = {}
    before = _rows_now(catalog, pending)
    for _ in range(rounds):
        copies = [
            (chunk, c)
            for chunk in pending
            for c in before.get(chunk, [])
            if c.tier in checked_tiers
        ]
        seen = _object_versions(
            tiers, [(c.tier, object_key(*chunk)) for chunk, c in copies], absent=ABSENT
        )
        checks: dict[tuple[str, str], list[CopyCheck]] = {chunk: [] for chunk in pending}
        for (chunk, _), r in zip(copies, check([c for _, c in copies])):
            checks[chunk].append(r)
        after = _rows_now(catalog, pending)
        for chunk in sorted(pending):
            if _same_rows(before.get(chunk, []), after.get(chunk, [])):
                settled[chunk] = (after.get(chunk, []), checks[chunk])
                for c in after.get(chunk, []):
                    v = seen.get((c.tier, object_key(*chunk)))
                    if v is not None:
                        inv.versions[c.tier, object_key(*chunk)] = v
        pending -= settled.keys()
        if not pending:
            break
        before = after
    inv.changing |= pending
    again = settled.keys() | pending
    inv.copies = [c for c in inv.copies if (c.dataset, c.key) not in settled] + [
        c for rows, _ in settled.values() for c in rows
    ]
    inv.checks = [r for r in inv.checks if (r.copy.dataset, r.copy.key) not in again] + [
        r for _, checks in settled.values() for r in checks
    ]
    for chunk, (rows, _) in settled.items():
        if any(c.tier not in checked_tiers for c in rows):
            inv.unchecked.add(chunk)
        else:
            inv.unchecked.discard(chunk)


# ----------------------------------------------------------------------------- plan
def plan(inv: Inventory) -> Plan:
    """What each thing in ``inv`` is, and what repairing it takes (no I/O)."""
    out = Plan(forget_writers=list(inv.dead_writers))
    by_chunk: dict[tuple[str, str], list[CopyCheck]] = {}
    for r in inv.checks:
        by_chunk.setdefault((r.copy.dataset, r.copy.key), []).append(r)
    catalogued_chunks = {(c.dataset, c.key) for c in inv.copies}
    for (ds, key), passed in inv.overtaken.items():
        if (ds, key) not in catalogued_chunks:  # (the chunk was deleted: nothing to settle)
            out.overtaken_done += [e for e in passed if e.writer not in inv.live_writers]
    for (ds, key), rows in sorted(by_chunk.items()):
        _plan_chunk(out, inv, ds, key, rows)
        for r in rows:
            out.findings.extend(_container_findings(r.copy.tier, ds, key, r.problems))
    for ds, key in sorted(inv.changing):
        where = ", ".join(sorted({c.tier for c in inv.copies if (c.dataset, c.key) == (ds, key)}))
        detail = "its rows changed each time its copies were checked (a write or move at work)"
        out.findings.append(Finding(Kind.IN_FLIGHT, where, ds, key, detail, Action.LEAVE))

    catalogued = {(c.dataset, c.key) for c in inv.copies}
    for u in inv.unnamed:
        if u.deleted:
            _plan_remnant(out, inv, u)
        elif u.dataset in inv.in_use:
            out.findings.append(
                Finding(
                    Kind.IN_FLIGHT,
                    u.tier,
                    u.dataset,
                    u.key,
                    "object no row names yet, of a dataset a live writer has open",
                    Action.LEAVE,
                )
            )
        elif (u.dataset, u.key) in catalogued or u.nbytes < 0 or u.problems:
            if u.problems and not ((u.dataset, u.key) in catalogued or u.nbytes < 0):
                # a container that is not whole is never adopted: its members read as missing
                kind = Kind.BAD_INDEX
                detail = "unrecorded container that is not whole: " + u.problems[0].detail
            else:
                kind, detail = Kind.ORPHAN, "object no catalog row names"
            if u.tier in inv.read_only:
                out.findings.append(
                    Finding(kind, u.tier, u.dataset, u.key, detail + _LEFT_READ_ONLY)
                )
                continue
            out.findings.append(Finding(kind, u.tier, u.dataset, u.key, detail, Action.DELETE))
            out.objects.append((u.tier, object_key(u.dataset, u.key)))
            if u.version is not None:
                out.versions[u.tier, object_key(u.dataset, u.key)] = u.version
        else:
            # a write whose commit never happened; its bytes are the only version there is
            out.findings.append(
                Finding(
                    Kind.UNRECORDED, u.tier, u.dataset, u.key, f"{u.nbytes} bytes", Action.ADOPT
                )
            )
            out.upserts.append(ChunkCopy(u.dataset, u.key, u.tier, u.nbytes, u.digest, "valid"))
            out.expect[u.dataset, u.key, u.tier] = None
            catalogued.add((u.dataset, u.key))

    for ds, tier in sorted(inv.remnants):
        # (cleared once no object of it is left there: see apply)
        if tier in inv.listed and ds not in inv.in_use:
            out.remnants.append((ds, tier))

    for m in inv.metas:
        _plan_meta(out, inv, m)

    for f in inv.leftovers:
        if f.dataset in inv.in_use or f.live:
            why = (
                "a put into a dataset a live writer has open"
                if f.dataset in inv.in_use
                else "a put running now"
            )
            out.findings.append(
                Finding(
                    Kind.IN_FLIGHT,
                    f.tier,
                    f.dataset or "",
                    f.path,
                    f"temporary file of {why}",
                    Action.LEAVE,
                )
            )
            continue
        detail = "temporary file of an interrupted put"
        if f.tier in inv.read_only:
            out.findings.append(
                Finding(Kind.LEFTOVER, f.tier, f.dataset or "", f.path, detail + _LEFT_READ_ONLY)
            )
            continue
        out.findings.append(
            Finding(Kind.LEFTOVER, f.tier, f.dataset or "", f.path, detail, Action.DELETE)
        )
        out.files.append(f)
    return out


def _plan_chunk(out: Plan, inv: Inventory, ds: str, key: str, rows: list[CopyCheck]) -> None:
    """Decide about one chunk's catalogued copies (those on tiers that were checked)."""
    live = [r for r in rows if r.copy.state == "in-transit" and r.copy.writer in inv.live_writers]
    if live:
        # its writer commits (or restores) the row itself
        c = live[0].copy
        detail = f"rewrite announced by writer {c.writer}, which is still running"
        out.findings.append(Finding(Kind.IN_FLIGHT, c.tier, ds, key, detail, Action.LEAVE))
        return
    # (its row stays: see the module doc; for the other copies it is one not checked)
    blocked = [r for r in rows if r.verdict is Verdict.BLOCKED]
    for r in blocked:
        out.findings.append(Finding(Kind.BLOCKED, r.copy.tier, ds, key, _detail(r)))
    unchecked = bool(blocked) or (ds, key) in inv.unchecked
    good = [r for r in rows if r.verdict is Verdict.GOOD]
    old = [r for r in rows if r.verdict is Verdict.OLD]
    new = [r for r in rows if r.verdict is Verdict.NEW]
    bad = [r for r in rows if r.verdict in (Verdict.MISSING, Verdict.SIZE, Verdict.CHECKSUM)]
    # rewrites announced here whose announcement another writer's replaced before their put
    passed = inv.overtaken.get((ds, key), [])
    still = {e.tier: e.writer for e in passed if e.writer in inv.live_writers}
    if in_flight := [r for r in bad if r.copy.tier in still]:
        # (that writer's put may land yet, or its commit come: it settles the row itself)
        r = in_flight[0]
        detail = (
            f"rewrite announced by writer {still[r.copy.tier]}, which is still running, and "
            "replaced by another writer's announcement: its put may land yet"
        )
        out.findings.append(Finding(Kind.IN_FLIGHT, r.copy.tier, ds, key, detail, Action.LEAVE))
        return
    gone_puts = {(e.tier, e.checksum) for e in passed if e.writer not in inv.live_writers}
    if not unchecked:
        out.overtaken_done += [e for e in passed if e.writer not in inv.live_writers]
    if len({r.copy.checksum for r in good}) > 1:
        # every write and move keeps one value per chunk: which of these is the last written
        # is not recorded, so this is reported and left alone (reads take the fastest copy)
        where = ", ".join(f"{r.copy.tier} {r.copy.checksum}" for r in good)
        out.findings.append(
            Finding(
                Kind.DIVERGED,
                ", ".join(r.copy.tier for r in good),
                ds,
                key,
                f"its copies hold different values ({where}); reads take the fastest",
            )
        )
    if not (old or new or bad):
        return

    def adopt(r: CopyCheck, kind: Kind, detail: str) -> None:
        out.findings.append(Finding(kind, r.copy.tier, ds, key, detail, Action.ADOPT))
        c = r.copy
        out.upserts.append(ChunkCopy(ds, key, c.tier, r.nbytes, r.digest, "valid", c.last_access))
        out.expect[ds, key, c.tier] = (c.state, c.checksum)

    def drop(r: CopyCheck, kind: Kind, detail: str) -> None:
        obj = (r.copy.tier, object_key(ds, key))
        version = inv.versions.get(obj)
        there = r.verdict is not Verdict.MISSING and version is not ABSENT
        if there and r.copy.tier in inv.read_only:
            detail += "; only its row goes" + _LEFT_READ_ONLY
        out.findings.append(Finding(kind, r.copy.tier, ds, key, detail, Action.DROP_COPY))
        out.deletes.append((ds, key, r.copy.tier))
        out.expect[ds, key, r.copy.tier] = (r.copy.state, r.copy.checksum)
        if not there:
            out.missing.add((ds, key, r.copy.tier))
        elif r.copy.tier not in inv.read_only:
            out.objects.append(obj)
            if version is not None:
                out.versions[obj] = version

    # A flush's commit drops the rows of every copy its writes made stale, so settled copies
    # hold the last committed value: old bytes that differ from theirs are an earlier write
    # by the same writer that was never flushed (it announced its next rewrite over them).
    settled = {g.copy.checksum for g in good} | {g.digest for g in good}
    for r in old:
        if settled and not {r.digest, r.copy.old_checksum} & settled:
            drop(r, Kind.STATE, "unflushed write by a writer that is gone; another copy holds")
        else:
            adopt(r, Kind.STATE, "rewrite announced by a writer that is gone; the old bytes remain")
    if good or old or unchecked:
        # another copy holds the last committed version: unflushed and bad copies go
        for r in new:
            drop(r, Kind.STATE, "unflushed rewrite by a writer that is gone; another copy holds")
        for r in bad:
            drop(r, Kind(r.verdict.value), _detail(r))
        return
    if new:
        # an atomic put left the new bytes whole, and no other version is left
        adopt(new[0], Kind.STATE, "rewrite by a writer that is gone; its new bytes are whole")
        for r in new[1:] + bad:
            drop(r, Kind(r.verdict.value) if r in bad else Kind.STATE, _detail(r))
        return
    corrupt = [r for r in bad if r.verdict is not Verdict.MISSING]
    landed = [r for r in corrupt if (r.copy.tier, r.digest) in gone_puts]
    if landed:
        # the put of a writer that is gone, whose announcement another writer's replaced,
        # came after that writer's commit: its bytes are whole, and the last value put
        adopt(
            landed[0],
            Kind.STATE,
            "rewrite by a writer that is gone, put after another writer's rewrite of the "
            "chunk was committed; its new bytes are whole",
        )
        for r in bad:
            if r is not landed[0]:
                drop(r, Kind(r.verdict.value), _detail(r))
        return
    if corrupt:
        r = corrupt[0]
        out.findings.append(
            Finding(Kind.CORRUPT, r.copy.tier, ds, key, _detail(r) + "; no other copy")
        )
    else:
        where = ", ".join(r.copy.tier for r in bad)
        out.findings.append(Finding(Kind.LOST, where, ds, key, "no tier holds this chunk any more"))


def _plan_remnant(out: Plan, inv: Inventory, u: UnnamedObject) -> None:
    """Decide about an object of a deleted dataset: an orphan, unless a live process has
    marked the name (it may be creating the dataset anew, its remnants purged); one on a
    read-only tier is reported and left, as any orphan there."""
    if u.dataset in inv.in_use:
        detail = "object of a deleted dataset whose name a live process has in use"
        out.findings.append(Finding(Kind.IN_FLIGHT, u.tier, u.dataset, u.key, detail, Action.LEAVE))
        return
    detail = "object of a deleted dataset"
    if u.tier in inv.read_only:
        out.findings.append(
            Finding(Kind.ORPHAN, u.tier, u.dataset, u.key, detail + _LEFT_READ_ONLY)
        )
        return
    out.findings.append(Finding(Kind.ORPHAN, u.tier, u.dataset, u.key, detail, Action.DELETE))
    obj = (u.tier, object_key(u.dataset, u.key))
    out.objects.append(obj)
    out.of_deleted[obj] = u.dataset
    if u.version is not None:
        out.versions[obj] = u.version


def _plan_meta(out: Plan, inv: Inventory, m: MetaCheck) -> None:
    """Decide about one dataset's zarr.json copies."""
    if m.current is None:
        # (see the module doc) but where tiers were not checked, the version the catalog
        # records may be there alone: the copies checked are then reported, with no repair
        if inv.skipped_tiers:
            down = ", ".join(inv.skipped_tiers)
            for tier, digest in m.copies:
                if digest not in m.accepted:
                    detail = (
                        f"zarr.json of another version ({digest}) than the catalog records "
                        f"({', '.join(m.accepted)}), which no tier checked holds (not checked: "
                        f"{down}); rewritten once a tier holding it answers"
                    )
                    out.findings.append(Finding(Kind.STALE_META, tier, m.dataset, META_KEY, detail))
        return
    for tier, digest in m.copies:
        if digest in m.accepted:
            continue
        if m.dataset in inv.in_use:
            detail = (
                f"zarr.json of another version ({digest}) than the catalog records, of a "
                "dataset a live process has open (it may be setting attributes)"
            )
            out.findings.append(
                Finding(Kind.IN_FLIGHT, tier, m.dataset, META_KEY, detail, Action.LEAVE)
            )
            continue
        detail = (
            f"zarr.json of another version ({digest}) than the catalog records "
            f"({', '.join(m.accepted)}): attributes were set while this tier did not answer"
        )
        if tier in inv.read_only:
            detail = (
                f"zarr.json of another version ({digest}) than the catalog records "
                f"({', '.join(m.accepted)}): none is put on a read-only tier" + _LEFT_READ_ONLY
            )
            out.findings.append(Finding(Kind.STALE_META, tier, m.dataset, META_KEY, detail))
            continue
        out.findings.append(
            Finding(Kind.STALE_META, tier, m.dataset, META_KEY, detail, Action.REWRITE)
        )
        out.metas.append((tier, m.dataset, m.current, m.accepted, dict(m.versions).get(tier)))


#: the end of a finding's detail where a repair leaves what is on a read-only tier
_LEFT_READ_ONLY = "; left: a read-only tier, where nothing is deleted or written"


def _container_findings(
    tier: str, ds: str, key: str, problems: Iterable[ContainerProblem]
) -> list[Finding]:
    """Findings for what is wrong inside superfile container ``key`` of ``ds`` on ``tier``."""
    out = []
    for p in problems:
        if p.kind == "index":
            out.append(Finding(Kind.BAD_INDEX, tier, ds, key, p.detail))
        else:
            what = "out of bounds" if p.kind == "bounds" else "checksum mismatch"
            detail = f"member {p.member!r}: {what}: {p.detail}"
            out.append(Finding(Kind.BAD_MEMBER, tier, ds, key, detail))
    return out


def _detail(r: CopyCheck) -> str:
    c = r.copy
    if r.verdict is Verdict.MISSING:
        return "object is missing"
    if r.verdict is Verdict.BLOCKED:
        return (
            f"something not of strataio's is in the way of its object ({r.error}): a directory "
            "where the object should be, or a file where one of its folders should be; move "
            "it away (the copy is kept in the catalog, and nothing there is deleted)"
        )
    if r.verdict is Verdict.SIZE:
        return f"object holds {r.nbytes} bytes, catalog says {c.nbytes}"
    if r.verdict is Verdict.NEW:
        return "unflushed rewrite by a writer that is gone"
    if c.state == "in-transit":
        return f"bytes match neither the old ({c.old_checksum}) nor the new ({c.checksum}) version"
    return f"checksum differs from the catalogued {c.checksum}"


# ----------------------------------------------------------------------------- apply
def apply(p: Plan, catalog: Catalog, tiers: TierSet) -> bool:
    """Carry out ``p``: the catalog changes in one transaction, then the deletions (objects
    the catalog no longer names, temporary files) and the zarr.json rewrites, then forget
    writers that are gone. A deletion or rewrite a tier refuses (down, full, an I/O error)
    is reported in its finding, whose action becomes none, and the rest goes on: the error
    of one object (permission denied, an I/O error on it) marks the tier down only where
    the tier does not answer a probe (:meth:`Tier.call_alone`). The
    objects and remnants of a deleted dataset are deleted and cleared only while its name
    is still a deleted dataset's, holding a claim of it (:func:`_purge_deleted`). Returns
    True if anything was changed."""
    left: set[tuple[str, str]] = set()  # (chunks whose repair was left out: changed since)
    if p.upserts or p.deletes:
        # (each row only as the inspection saw it: another process may have rewritten or
        # moved the chunk since, and its row then stands)
        done = catalog.commit(
            p.upserts,
            p.deletes,
            expect=p.expect,
            present=functools.partial(_present, p.missing, tiers) if p.missing else None,
        )
        left = {i[:2] for i in [*done.kept, *done.overtaken]}
    # A session that opened a dataset since the inspection may be writing the very objects
    # planned for deletion: its datasets are skipped (a later fsck judges them). Nor is an
    # object deleted that a row names now: a row this repair left (changed since), or one a
    # commit of another process recorded since the inspection.
    busy = catalog.datasets_in_use() if p.objects or p.files or p.metas or p.remnants else set()
    named = [o for o in p.objects if o not in p.of_deleted]
    names = {d.name for d in catalog.list_datasets()} if named else set()
    deleted = {d for d, _ in catalog.remnants()} - names if named else set()
    chunks = {ok: _split(ok, names | deleted) for _, ok in named}
    rows = _rows_now(catalog, [(ds, key) for ds, key in chunks.values() if ds is not None])
    for tname, ok in named:
        ds, key = chunks[ok]
        if ds in busy or any(c.tier == tname for c in rows.get((ds, key), [])):
            continue
        _delete_object(p, tiers[tname], ok, ds or "", key)
    for tname, ds, data, accepted, version in p.metas:
        if ds in busy:
            continue
        try:
            now = meta_checksums(catalog.get_dataset(ds))
        except NotFoundError:
            continue
        if now is None or tuple(now) != accepted:
            continue  # (a change since put its own version)
        tier = tiers[tname]
        if tier.unwritable:
            continue  # (planned only elsewhere: see _plan_meta)
        try:
            # (only over the copy inspected: a change may have announced, put and settled
            # its own version there since the record was read above)
            tier.call_alone(
                tier.backend.put_if, object_key(ds, META_KEY), data, version, durable=True
            )
        except ExistsError:
            _changed_since(p, tname, ds, META_KEY)
        except (StrataError, OSError) as exc:
            _not_done(p, tname, ds, META_KEY, f"not rewritten: {exc}")
    for f in p.files:
        if f.dataset in busy:
            continue
        try:
            if judge_leftover(f.path, remove=True) is LeftoverState.UNKNOWN:
                # no lock to judge by here; that no live writer has the dataset open is the
                # rule
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f.path)
        except OSError as exc:
            _not_done(p, f.tier, f.dataset or "", f.path, f"not deleted: {exc}")
    for ds in sorted({*p.of_deleted.values(), *(d for d, _ in p.remnants)}):
        objs = [obj for obj, d in p.of_deleted.items() if d == ds]
        where = [t for d, t in p.remnants if d == ds]
        if ds in busy:
            for tname, ok in objs:
                _changed_since(p, tname, ds, ok[len(ds) + 1 :], _NAME_IN_USE)
            continue
        _purge_deleted(p, catalog, tiers, ds, objs, where)
    # (a note of a chunk left as it was stays: a later fsck judges its bytes again)
    notes = [e for e in p.overtaken_done if (e.dataset, e.key) not in left]
    if notes:
        catalog.clear_overtaken(notes)
    if p.forget_writers:
        catalog.forget_writers(p.forget_writers)
    return p.changes


def _delete_object(p: Plan, tier: Tier, ok: str, ds: str, key: str) -> None:
    """Delete object ``ok`` (chunk ``key`` of ``ds``) from ``tier``, only at the version it
    was inspected at where that is known (one put in its place since stays); a failure is
    reported in its finding (:func:`_not_done`)."""
    version = p.versions.get((tier.name, ok))
    try:
        if version is not None:
            tier.call_alone(tier.backend.delete_if, ok, version)
        else:
            tier.call_alone(tier.backend.delete, ok)
    except FileNotFoundError:
        pass
    except (StrataError, OSError) as exc:
        _not_done(p, tier.name, ds, key, f"not deleted: {exc}")


def _purge_deleted(
    p: Plan,
    catalog: Catalog,
    tiers: TierSet,
    ds: str,
    objs: list[tuple[str, str]],
    where: list[str],
) -> None:
    """Delete the objects ``objs`` (``(tier, object)``) of deleted dataset ``ds``, then
    clear its remnants on the tiers ``where`` that hold nothing under its name any more,
    as :func:`strataio.tiers.remnants.purge` does: holding a claim of the name
    (:meth:`Catalog.claim_eviction`), and only while it has remnants, read again once the
    claim is held. Without remnants the name may have been created again since the
    inspection (a create purges them first), and what is under it is then the new
    dataset's: its ``zarr.json``, or a killed writer's chunks a later fsck adopts. While a
    remnant stays, no dataset of the name, or of one above or below it, is created. What is
    left is reported in its finding. The folders the objects leave empty on a tier cleared
    go too (:meth:`Backend.remove_empty_folders`)."""

    def leave(why: str) -> None:
        for tname, ok in objs:
            _changed_since(p, tname, ds, ok[len(ds) + 1 :], why)

    if not catalog.claim_eviction(ds):
        leave(_NAME_IN_USE)
        return
    try:
        left = {t for d, t in catalog.remnants(ds) if d == ds}
        if not left:
            leave("its name has no remnant left now (it may have been created again)")
            return
        for tname, ok in objs:
            _delete_object(p, tiers[tname], ok, ds, ok[len(ds) + 1 :])
        cleared = []
        for tname in where:
            if tname not in left:
                continue
            tier = tiers[tname]
            try:
                if next(iter(tier.backend.list(ds)), None) is None:
                    cleared.append(tname)
                    if not tier.unwritable:
                        tier.backend.remove_empty_folders(ds)
            except Exception as exc:
                if not is_backend_failure(exc):
                    raise
        catalog.clear_remnants(ds, cleared)
    finally:
        catalog.release_eviction(ds)


#: why objects of a deleted dataset are left where a live process has its name in use
_NAME_IN_USE = "a live process has its name in use now (it may be creating it anew)"


def _not_done(p: Plan, tier: str, dataset: str, key: str, why: str) -> None:
    """Report, in the findings of ``p``, that the repair of ``key`` of ``dataset`` on
    ``tier`` failed (``why``): its finding's action becomes none, and the rest of the repair
    goes on."""
    for i, f in enumerate(p.findings):
        if (f.tier, f.dataset, f.key) == (tier, dataset, key) and f.action in _CARRIED_OUT:
            p.findings[i] = replace(f, detail=f"{f.detail}; {why}", action=Action.NONE)


def _changed_since(
    p: Plan,
    tier: str,
    dataset: str,
    key: str,
    why: str = "changed since it was inspected (a change at work)",
) -> None:
    """Report, in the findings of ``p``, that ``key`` of ``dataset`` on ``tier`` changed
    since it was inspected (a running process's change; ``why`` says how), so its repair was
    left."""
    for i, f in enumerate(p.findings):
        if (f.tier, f.dataset, f.key) == (tier, dataset, key) and f.action in _CARRIED_OUT:
            detail = f"{f.detail}; {why}: left"
            p.findings[i] = replace(f, kind=Kind.IN_FLIGHT, detail=detail, action=Action.LEAVE)


#: the actions :func:`apply` carries out on a tier (a failure there is :func:`_not_done`)
_CARRIED_OUT = (Action.DELETE, Action.DROP_COPY, Action.REWRITE)


def fsck(
    catalog: Catalog,
    tiers: TierSet,
    *,
    repair: bool = False,
    verify: bool = True,
    workers: int = 8,
    progress: Callable[[int, int], None] | None = None,
) -> FsckReport:
    """Check all catalogued copies on every tier that answers, tiers marked down probed
    first (:func:`inspect`, then :func:`plan`); with ``repair``, fix what can be fixed
    (:func:`apply`). The report names the tiers not checked and why
    (:attr:`FsckReport.skipped_tiers`, :attr:`FsckReport.skipped_why`)."""
    inv = inspect(catalog, tiers, verify=verify, workers=workers, progress=progress)
    p = plan(inv)
    skipped = set(inv.skipped_tiers)
    report = FsckReport(
        # (the copies on a tier not checked are catalogued, not checked: not counted)
        copies=sum(c.tier not in skipped for c in inv.copies),
        chunks=len({(c.dataset, c.key) for c in inv.copies}),
        findings=p.findings,
        skipped_tiers=inv.skipped_tiers,
        skipped_why=inv.skipped_why,
        writers_gone=len(inv.dead_writers),
    )
    if repair:
        report.repaired = apply(p, catalog, tiers)
    report.remnants = catalog.remnants() if repair else sorted(inv.remnants)
    return report


def _present(missing: set[CopyId], tiers: TierSet, ids: Sequence[CopyId]) -> set[CopyId]:
    """Of the copies ``ids`` a repair drops, those among ``missing`` (their object was
    missing when inspected) whose object is there now, or whose tier cannot tell: called
    inside the repair's transaction (see :meth:`Catalog.commit`)."""
    out: set[CopyId] = set()
    for ds, key, tier in ids:
        if (ds, key, tier) not in missing:
            continue
        try:
            if tiers[tier].backend.exists(object_key(ds, key)):
                out.add((ds, key, tier))
        except Exception:
            out.add((ds, key, tier))
    return out


def _chunk_key_test(record: DatasetRecord) -> Callable[[str], bool]:
    """Whether a key is one of dataset ``record``'s chunk keys: a superfile's container keys,
    else the default encoding of a chunk inside the dataset's chunk grid (``c/i/j``, one
    index per dimension, each below the grid's extent there)."""
    if is_superfile(record):
        return lambda key: container_seq(key) is not None
    extents = [-(-n // c) if c else 0 for n, c in zip(record.shape, record.chunks)]

    def test(key: str) -> bool:
        parts = key.split("/")
        if parts[0] != "c" or len(parts) != len(extents) + 1:
            return False
        return all(p.isdigit() and int(p) < n for p, n in zip(parts[1:], extents))

    return test


def _split(obj: str, names: Iterable[str]) -> tuple[str | None, str]:
    """``(dataset, chunk key)`` of an object key, matching the longest catalogued name."""
    known = names if isinstance(names, set) else set(names)
    parts = obj.split("/")
    for i in range(len(parts) - 1, 0, -1):
        name = "/".join(parts[:i])
        if name in known:
            return name, "/".join(parts[i:])
    return None, obj
