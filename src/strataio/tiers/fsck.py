"""fsck: check every catalogued chunk copy against the bytes on its tier, and repair.

A copy is good when its object exists with the catalogued size and checksum. Interrupted
operations leave recognisable traces, all of which :func:`fsck` finds and ``repair`` resolves:

- a migration or stage killed before its commit: destination objects no row names
  (**orphan**, removed: the catalogued source is intact);
- one killed after its commit: source objects no row names (**orphan**, removed);
- a write killed before its flush: an object rewritten in place (announced beforehand by an
  ``in-transit`` row) or a new object no row names. If another good copy of the chunk exists,
  the unflushed bytes are dropped (**bad copy**); if not, the object is the only version there
  is and, written by an atomic put, whole (old or new): it is **adopted** (its row gets the real
  size and checksum);
- a put killed mid-write: a temporary file (**leftover**, removed).

An orphan, a leftover, an unrecorded object or an announced rewrite may also belong to an
operation still running in another process (a migration's destination before its commit, a
put being written): removing it would let that operation commit a copy that is gone, then
delete its source. So these are acted on only when older than ``grace`` seconds (an object's
mtime on POSIX, its ``last_modified`` on S3, an ``in-transit`` row's announcement time; an
object whose age a backend cannot tell counts as old); younger ones are reported as
**in-flight** and left alone, and a later fsck deals with them.

A ``valid`` copy whose bytes differ from its row is **corrupt**; with another good copy it is
dropped, without one the chunk is reported (never silently adopted). A chunk with no copy left
at all is **lost**.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from strataio.catalog.base import Catalog, ChunkCopy, CopyId
from strataio.tiers.residency import META_KEY, object_key
from strataio.tiers.tier import Tier, TierSet, checksum, is_backend_failure

#: seconds an unnamed object must have been left untouched before repair removes or adopts it
DEFAULT_GRACE = 15 * 60.0

#: finding kinds that mean something is wrong (the rest are informational)
PROBLEMS = (
    "missing",
    "size",
    "checksum",
    "state",
    "orphan",
    "leftover",
    "unrecorded",
    "lost",
    "corrupt",
)


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing fsck noticed. ``action`` is what ``repair`` does (or did) about it."""

    kind: str
    tier: str
    dataset: str
    key: str
    detail: str
    action: str = ""

    @property
    def problem(self) -> bool:
        return self.kind in PROBLEMS


@dataclass(slots=True)
class FsckReport:
    """What one fsck pass saw: ``copies`` checked, ``chunks`` catalogued, and findings."""

    copies: int = 0
    chunks: int = 0
    findings: list[Finding] = field(default_factory=list)
    skipped_tiers: list[str] = field(default_factory=list)
    repaired: bool = False

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.problem]

    @property
    def clean(self) -> bool:
        return not self.problems

    @property
    def lost(self) -> list[Finding]:
        """Chunks with no intact copy left (missing everywhere, or corrupt everywhere)."""
        return [f for f in self.findings if f.kind in ("lost", "corrupt")]


def fsck(
    catalog: Catalog,
    tiers: TierSet,
    *,
    repair: bool = False,
    verify: bool = True,
    workers: int = 8,
    grace: float = DEFAULT_GRACE,
    progress: Callable[[int, int], None] | None = None,
    now: float | None = None,
) -> FsckReport:
    """Check all catalogued copies on every tier that answers; with ``repair``, fix what can
    be fixed (one catalog transaction, then object deletions).

    ``verify`` reads every copy and compares checksums; without it only existence and size
    are checked. Tiers that are down are skipped and listed in the report. Orphans, leftovers,
    unrecorded objects and in-transit rows younger than ``grace`` seconds at ``now`` (default:
    the current time) are reported as ``in-flight`` and left alone (see the module doc).
    ``progress(done, total)`` is called as catalogued copies are checked (from worker threads).
    """
    now = time.time() if now is None else now
    report = FsckReport()
    copies = catalog.all_residency()
    names = {d.name for d in catalog.list_datasets()}
    report.copies = len(copies)
    report.chunks = len({(c.dataset, c.key) for c in copies})
    # memory tiers hold no catalogued copy: what they hold dies with the process
    live = [t for t in tiers if t.up and not t.volatile]
    report.skipped_tiers = [t.name for t in tiers if not t.up]

    # what each tier actually holds
    listed: dict[str, set[str]] = {}
    for t in live:
        try:
            listed[t.name] = set(t.backend.list())
        except Exception as exc:
            if not is_backend_failure(exc):
                raise
            t.mark_down(exc)
            report.skipped_tiers.append(t.name)
    checked = [c for c in copies if c.tier in listed]

    def inspect(c: ChunkCopy) -> tuple[ChunkCopy, str, int, str]:
        """(copy, verdict, actual size, actual checksum): verdict "" when good."""
        t = tiers[c.tier]
        ok = object_key(c.dataset, c.key)
        if ok not in listed[c.tier]:
            return c, "missing", -1, ""
        try:
            if verify:
                data = t.backend.get(ok)
                n, digest = len(data), checksum(data)
            else:
                n, digest = t.backend.size(ok), c.checksum
        except FileNotFoundError:
            return c, "missing", -1, ""
        if n != c.nbytes:
            return c, "size", n, digest
        if c.checksum and digest != c.checksum:
            return c, "checksum", n, digest
        if c.state == "in-transit":
            return c, "state", n, digest
        return c, "", n, digest

    with ThreadPoolExecutor(max(1, workers)) as pool:
        if progress is None:
            results = list(pool.map(inspect, checked))
        else:
            results = []
            progress(0, len(checked))
            for i, r in enumerate(pool.map(inspect, checked), start=1):
                results.append(r)
                progress(i, len(checked))

    by_chunk: dict[tuple[str, str], list[tuple[ChunkCopy, str, int, str]]] = {}
    for r in results:
        by_chunk.setdefault((r[0].dataset, r[0].key), []).append(r)
    catalogued = {(c.dataset, c.key) for c in copies}
    named = {(c.tier, object_key(c.dataset, c.key)) for c in copies}

    upserts: list[ChunkCopy] = []
    deletes: list[CopyId] = []
    doomed: list[tuple[str, str]] = []  # (tier, object key) to delete after the commit
    unchecked = {(c.dataset, c.key) for c in copies if c.tier not in listed}

    for (ds, key), rows in sorted(by_chunk.items()):
        good = [r for r in rows if not r[1]]
        bad = [r for r in rows if r[1]]
        if not bad:
            continue
        announced = [r[0] for r in bad if r[0].state == "in-transit"]
        if grace > 0 and any(now - c.last_access < grace for c in announced):
            # a rewrite announced within the grace period may still be running: its writer
            # commits (or rolls back) the row itself
            c = announced[0]
            report.findings.append(_in_flight(c.tier, ds, key, now - c.last_access))
            continue
        if good or (ds, key) in unchecked:
            for c, verdict, n, _ in bad:
                report.findings.append(
                    Finding(verdict, c.tier, ds, key, _detail(c, verdict, n), "drop copy")
                )
                deletes.append((ds, key, c.tier))
                if verdict != "missing":
                    doomed.append((c.tier, object_key(ds, key)))
            continue
        # an announced rewrite (in-transit) is whole whichever version its atomic put left
        whole = [r for r in bad if r[1] != "missing" and r[0].state == "in-transit"]
        corrupt = [r for r in bad if r[1] in ("checksum", "size") and r[0].state != "in-transit"]
        if whole:
            c, verdict, n, digest = whole[0]
            report.findings.append(
                Finding(verdict, c.tier, ds, key, _detail(c, verdict, n), "adopt object")
            )
            upserts.append(ChunkCopy(ds, key, c.tier, n, digest, "valid", c.last_access))
            for c2, v2, _, _ in bad:
                if c2 is c:
                    continue
                report.findings.append(
                    Finding(v2, c2.tier, ds, key, _detail(c2, v2, -1), "drop copy")
                )
                deletes.append((ds, key, c2.tier))
                if v2 != "missing":
                    doomed.append((c2.tier, object_key(ds, key)))
        elif corrupt:
            c, verdict, n, _ = corrupt[0]
            report.findings.append(
                Finding("corrupt", c.tier, ds, key, _detail(c, verdict, n) + "; no other copy", "")
            )
        else:
            tiers_of = ", ".join(r[0].tier for r in bad)
            report.findings.append(
                Finding("lost", tiers_of, ds, key, "no tier holds this chunk any more", "")
            )

    # objects no row names
    for tname, objs in listed.items():
        t = tiers[tname]
        for ok in sorted(objs):
            if (tname, ok) in named:
                continue
            ds, key = _split(ok, names)
            if ds is None or key == META_KEY:
                continue  # not a chunk of a catalogued dataset: not ours to judge
            age = now - _mtime(t, ok)
            if grace > 0 and age < grace:
                report.findings.append(_in_flight(tname, ds, key, age))
                continue
            if (ds, key) in catalogued:
                report.findings.append(
                    Finding("orphan", tname, ds, key, "object no catalog row names", "delete")
                )
                doomed.append((tname, ok))
            else:
                # a write whose commit never happened; its bytes are the only version there is
                try:
                    data = t.backend.get(ok)
                except FileNotFoundError:
                    continue
                report.findings.append(
                    Finding("unrecorded", tname, ds, key, f"{len(data)} bytes", "adopt object")
                )
                upserts.append(ChunkCopy(ds, key, tname, len(data), checksum(data), "valid"))
                catalogued.add((ds, key))
        base = getattr(t.backend, "inner", t.backend)  # a Shaped tier's own files
        leftovers = getattr(base, "leftovers", None)
        if leftovers is not None:
            for path in leftovers():
                try:
                    age = now - os.stat(path).st_mtime
                except FileNotFoundError:
                    continue  # its put finished (renamed) meanwhile
                if grace > 0 and age < grace:
                    report.findings.append(_in_flight(tname, "", path, age))
                    continue
                report.findings.append(
                    Finding(
                        "leftover",
                        tname,
                        "",
                        path,
                        "temporary file of an interrupted put",
                        "delete",
                    )
                )
                doomed.append((tname, "\0" + path))

    if repair and (upserts or deletes or doomed):
        catalog.commit(upserts, deletes)
        for tname, ok in doomed:
            if ok.startswith("\0"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(ok[1:])
            else:
                tiers[tname].backend.delete(ok)
        report.repaired = True
    return report


def _mtime(tier: Tier, obj: str) -> float:
    """When object ``obj`` on ``tier`` was last modified (epoch seconds); 0 if unknown."""
    base = getattr(tier.backend, "inner", tier.backend)  # a Shaped tier's own objects
    try:
        path = getattr(base, "path", None)
        if callable(path) and getattr(base, "leftovers", None) is not None:  # POSIX
            return os.stat(path(obj)).st_mtime
        head = getattr(base, "head", None)
        if callable(head):  # S3
            when = head(obj).get("last_modified")
            return when.timestamp() if hasattr(when, "timestamp") else 0.0
    except FileNotFoundError:
        return 0.0
    return 0.0


def _in_flight(tier: str, dataset: str, key: str, age: float) -> Finding:
    return Finding(
        "in-flight",
        tier,
        dataset,
        key,
        f"modified {max(age, 0.0):.0f} s ago, within the grace period: an operation may "
        "still be writing it",
        "left alone",
    )


def _detail(c: ChunkCopy, verdict: str, n: int) -> str:
    if verdict == "missing":
        return "object is missing"
    if verdict == "size":
        return f"object holds {n} bytes, catalog says {c.nbytes}"
    if verdict == "state":
        return "copy left in-transit by an interrupted move"
    return f"checksum differs from the catalogued {c.checksum}"


def _split(obj: str, names: Iterable[str]) -> tuple[str | None, str]:
    """``(dataset, chunk key)`` of an object key, matching the longest catalogued name."""
    known = names if isinstance(names, set) else set(names)
    parts = obj.split("/")
    for i in range(len(parts) - 1, 0, -1):
        name = "/".join(parts[:i])
        if name in known:
            return name, "/".join(parts[i:])
    return None, obj
