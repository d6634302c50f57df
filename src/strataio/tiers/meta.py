"""A tiered dataset's ``zarr.json`` on its tiers: which copy is current, and mending the rest.

Every persistent tier holds a copy of the dataset's ``zarr.json`` (``NAME/zarr.json``), and
an attribute change rewrites them all, but only on the tiers that answer then: a tier that
was down keeps the version before, and once it answers again, ordered before the others, it
would be read first. The catalog therefore keeps, in the dataset's record (its annotation
:data:`META_ATTR`), the checksums (:func:`~strataio.tiers.tier.checksum`, a CRC-32C) of the
versions a copy may hold:

- a change (:meth:`MetaCopies.put`) first adds the new version's checksum to the record
  (announced), then puts the new ``zarr.json`` durably on every persistent tier that answers
  and is not read-only (one where something is in its way, :class:`ObjectError`, is skipped
  as a tier that is down), then leaves the record naming the new version alone, and those
  announced after it (settled). A process that dies in between leaves both versions named,
  and either copy is read as current until the next change settles;
- changes run at once take effect in the order they were announced. A change puts its
  version on a tier only over a copy it looked at (:meth:`Backend.put_if`), and only where,
  after that look, the record still names its version and that copy is of none announced
  after it: a change announced later that settled, or put its own version there, stands.
  Otherwise the later change's settlement could drop a version the earlier one then put
  everywhere, and the record would name a version no tier holds;
- a read (:meth:`MetaCopies.get`) takes the first copy the record names: tiers that are up
  first, in tier order, then the tiers marked down, probed again (:meth:`Tier.recheck`).
  Tiers read before it that answered with another version, or with none, are rewritten with
  it, where the record names that one version alone (no change under way) and still does
  once the copies there are looked at again, and only over those copies (a change made
  since, put there, stands); best effort: a put that fails leaves the copy as it was and
  the read goes on;
- where no tier that answers holds a version the record names, the ones it holds are all
  there is if every persistent tier answered (a change by a strataio that kept no checksums,
  or by hand): the first is read, as it always was. If some tier did not answer, it may hold
  the current one: the read raises :class:`MetadataError` naming the dataset and the tiers,
  rather than return attributes that may be stale. Where no tier that answers holds any
  copy, the read returns None, as it always did (an open then reads what the catalog record
  keeps of the array, without attributes; an attribute change is refused);
- a record that names no version (written by a strataio that kept none), or a process that
  reaches no catalog, reads the first copy that answers, as before; the first change by this
  strataio starts naming them;
- an attribute change (:meth:`MetaCopies.update`: read the current ``zarr.json``, change it,
  put it) holds the dataset's *change claim* from before its read until after its
  settlement, so changes from any number of processes apply one after the other and none
  drops another's attributes. The claim is the annotation :data:`CHANGE_ATTR` of the record,
  ``[writer, claim id]``, taken in one catalog transaction where no claim is there, or where
  the claim there is of a writer that is gone (its liveness token released:
  :mod:`strataio.catalog.liveness`, so no clock decides), and removed by its change. Another
  change waits while it stands, for :data:`CHANGE_WAIT` seconds at most. (A rank of a parallel
  job that dies holding a claim leaves it standing as long as its job's writer lives.) A
  process that reaches no catalog, or a copy set that has no writer, changes in two steps.

``strataio fsck`` reports a copy of a version the record does not name, on a tier it
checked while another checked tier holds one it names, and ``--repair`` rewrites it (see
:mod:`strataio.tiers.fsck`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import uuid
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

from strataio.backoff import Backoff
from strataio.catalog.base import Catalog, DatasetRecord
from strataio.catalog.liveness import new_writer_id
from strataio.errors import (
    BackendError,
    ExistsError,
    MetadataError,
    NotFoundError,
    ObjectError,
    StrataError,
    TierDownError,
)
from strataio.tiers.residency import META_KEY, object_key
from strataio.tiers.tier import Tier, checksum

__all__ = ["CHANGE_ATTR", "CHANGE_WAIT", "META_ATTR", "MetaCopies", "meta_checksums"]

#: the annotation of a tiered dataset's catalog record naming the checksums of the
#: ``zarr.json`` versions its copies may hold (a JSON list, the newest last)
META_ATTR = "strataio.meta"


#: the annotation of a tiered dataset's catalog record naming the attribute change under
#: way, ``[writer, claim id]`` (absent while none is: see :meth:`MetaCopies.update`)
CHANGE_ATTR = "strataio.meta.change"

#: seconds an attribute change waits for another process's to end before it raises
CHANGE_WAIT = 600.0

#: the claim ids of the changes this process runs now
_CLAIMS_HERE: set[str] = set()
_CLAIMS_LOCK = threading.Lock()
#: (process id, the prefix of this process's claim ids): see :func:`_this_process`
_PROCESS: tuple[int, str] = (0, "")

#: how many times a change looks again at a tier whose zarr.json changed between its look and
#: its put (another change's put, or a read's rewrite) before it leaves that tier as one that
#: missed it
_PUT_TRIES = 8


class _Put(Enum):
    """What a change's put on one tier came to (:meth:`MetaCopies._put_on`)."""

    STORED = "the tier holds this version"
    NEWER = "the tier holds a version announced after this one"
    SUPERSEDED = "a change announced after this one has settled"
    MISSED = "the tier's copy changed at every look"


def meta_checksums(record: DatasetRecord) -> list[str] | None:
    """The checksums of the ``zarr.json`` versions the copies of ``record``'s dataset may
    hold, the newest last; None where the record names none."""
    got = json.loads(record.attrs or "{}").get(META_ATTR)
    return _as_list(got)


def _as_list(value: Any) -> list[str] | None:
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _announced(digest: str, value: Any) -> list[str]:
    """The annotation ``value`` with version ``digest`` added last, the newest (a change about
    to be put): also where an earlier change to the same bytes is still named, whose place
    would put this one before changes announced since (a change back to the attributes of
    before one whose process died unsettled took no effect)."""
    now = _as_list(value) or []
    return [*(v for v in now if v != digest), digest]


def _settled(digest: str, value: Any) -> Any:
    """The annotation ``value`` once version ``digest`` is put: the versions announced before
    it dropped. Where ``digest`` is no longer named, another change settled after it was
    announced: that one stands."""
    now = _as_list(value)
    if now is None or digest not in now:
        return value
    return now[now.index(digest) :]


def _as_claim(notes: dict[str, Any]) -> list[str] | None:
    """The change claim the record annotations ``notes`` hold (None: none, or no claim a
    strataio made)."""
    got = notes.get(CHANGE_ATTR)
    if isinstance(got, list) and len(got) == 2 and all(isinstance(v, str) for v in got):
        return list(got)
    return None


def _running(catalog: Catalog, claim: list[str]) -> bool:
    """Whether the change that made ``claim`` may still run: its writer is alive, and where
    the claim is of this process, the change still holds it (one whose release the catalog
    failed to take does not)."""
    writer, ident = claim
    if ident.startswith(_this_process()):
        with _CLAIMS_LOCK:
            return ident in _CLAIMS_HERE
    return writer in catalog.alive([writer])


def _this_process() -> str:
    """The prefix of the claim ids this process makes: its host and process id, and a random
    part drawn once per process (hosts of one name, in containers, may run equal pids)."""
    global _PROCESS
    if _PROCESS[0] != os.getpid():
        _PROCESS = (os.getpid(), f"{new_writer_id()}:")
    return _PROCESS[1]


def _new_claim_id() -> str:
    """A fresh claim id of this process."""
    return f"{_this_process()}{uuid.uuid4().hex[:12]}"


def _claimed(claim: list[str], seen: list[str] | None, value: Any) -> Any:
    """The annotation ``value`` with ``claim`` taken where it is still the claim looked at,
    ``seen`` (None: none, or one a strataio did not make), else unchanged."""
    return claim if _as_claim({CHANGE_ATTR: value}) == seen else value


def _released(claim: list[str], value: Any) -> Any:
    """The annotation ``value`` with ``claim`` let go (removed where it is still there)."""
    return None if value == claim else value


class MetaCopies:
    """The ``zarr.json`` copies of dataset ``name`` on the tiers ``tiers()`` gives (the
    persistent ones, fastest first), with the catalog ``catalog()`` gives (None: none
    reachable) naming the current versions (see the module doc)."""

    def __init__(
        self,
        name: str,
        tiers: Callable[[], Sequence[Tier]],
        catalog: Callable[[], Catalog | None],
        writer: str = "",
    ) -> None:
        self.name = name
        self.tiers = tiers
        self.catalog = catalog
        #: the session's writer id, whose liveness keeps this process's change claims
        self.writer = writer
        self.obj = object_key(name, META_KEY)

    def get(self, record: DatasetRecord | None = None) -> bytes | None:
        """The current ``zarr.json`` (see the module doc for which copy that is, and when it
        is None or a :class:`MetadataError`); ``record``: the dataset's catalog record as
        just read (else it is read here)."""
        accepted = meta_checksums(record) if record is not None else self._accepted()
        tiers = list(self.tiers())
        behind: list[Tier] = []  # answered with another version, or none
        silent: list[Tier] = []  # did not answer
        first: bytes | None = None
        for tier in [t for t in tiers if t.up] + [t for t in tiers if not t.up]:
            if not tier.recheck():  # (a down tier probed again, at most every RECHECK_S)
                silent.append(tier)
                continue
            try:
                data = bytes(tier.call(tier.backend.get, self.obj))
            except (NotFoundError, ObjectError):  # (none there, or no file at its path)
                behind.append(tier)
                continue
            except TierDownError:
                silent.append(tier)
                continue
            if accepted is None:
                return data
            if checksum(data) in accepted:
                self._mend(behind, data, accepted)
                return data
            behind.append(tier)
            if first is None:
                first = data
        if first is None or not silent:
            return first
        held = ", ".join(t.name for t in behind)
        said = "; ".join(f"{t.name}: {t.last_error or 'down'}" for t in silent)
        raise MetadataError(
            f"dataset {self.name!r}: no tier that answers holds the zarr.json its catalog "
            f"records (checksum {accepted[-1]}): tier(s) {held} hold another version, set "
            f"before a change their tier missed, and the tier(s) that may hold it do not "
            f"answer ({said}); open it once they do ('strataio tiers --check'), or, if they "
            "are gone for good, take them out of the configuration: the version the others "
            "hold is then read"
        )

    def put(self, data: bytes) -> None:
        """Write ``data`` as the dataset's ``zarr.json``, durably, to every persistent tier
        that answers and is not read-only, its checksum announced in the catalog record
        first and settled after, a change announced after it standing where it meets one
        (see the module doc). Raises :class:`BackendError` where no tier took it (the record
        then names the new version besides the others, which reads take as before)."""
        digest = checksum(data)
        catalog = self.catalog()
        if catalog is not None:
            catalog.annotate_dataset(self.name, META_ATTR, functools.partial(_announced, digest))
        stored = 0
        why: list[str] = []  # (each tier not written, and why)
        for tier in self.tiers():
            if not tier.up or tier.unwritable:
                why.append(f"{tier.name}: {tier.condition}, {tier.last_error or 'no error'}")
                continue
            try:
                got = self._put_on(tier, data, digest, catalog)
            except (TierDownError, ObjectError) as exc:  # (skipped, as a tier that is down)
                why.append(f"{tier.name}: {exc}")
                continue
            if got is _Put.SUPERSEDED:
                return  # (that change's settlement dropped this version: nothing to settle)
            if got is _Put.MISSED:
                why.append(f"{tier.name}: {got.value}")
            else:
                stored += 1
        if not stored:
            raise BackendError(
                f"dataset {self.name!r}: no tier took its zarr.json ({'; '.join(why) or 'none'})"
            )
        if catalog is not None:
            # (a record not settled names both versions, which reads take alike)
            with contextlib.suppress(StrataError):
                catalog.annotate_dataset(self.name, META_ATTR, functools.partial(_settled, digest))

    def update(self, change: Callable[[bytes | None], bytes]) -> None:
        """:meth:`put` ``change(the zarr.json read now)`` (:meth:`get`), holding the
        dataset's change claim from before the read until after the put (see the module
        doc), so that changes run at once in several processes all take effect. Raises
        :class:`BackendError` where another change holds the claim for over
        :data:`CHANGE_WAIT` seconds; whatever :meth:`get`, ``change`` or :meth:`put` raise
        (the claim is let go)."""
        catalog = self.catalog()
        if catalog is None or not self.writer:
            self.put(change(self.get()))
            return
        claim = [self.writer, _new_claim_id()]
        # (noted as running from before it is taken until it is let go: the id is new, so
        # no look meanwhile finds it but this change's own)
        with _CLAIMS_LOCK:
            _CLAIMS_HERE.add(claim[1])
        try:
            self._claim(catalog, claim)
            self.put(change(self.get()))
        finally:
            with _CLAIMS_LOCK:
                _CLAIMS_HERE.discard(claim[1])
            # (left standing where the catalog fails now: a change of another process goes
            # ahead once this process ends; one of this process, at once)
            with contextlib.suppress(StrataError):
                catalog.annotate_dataset(
                    self.name, CHANGE_ATTR, functools.partial(_released, claim)
                )

    def _claim(self, catalog: Catalog, claim: list[str]) -> None:
        """Take the dataset's change claim as ``claim``, waiting while a running change
        holds it."""
        wait = Backoff(CHANGE_WAIT, 0.002, 0.05)
        while True:
            held = _as_claim(json.loads(catalog.get_dataset(self.name).attrs or "{}"))
            if held is None or not _running(catalog, held):
                taken = functools.partial(_claimed, claim, held)
                if catalog.annotate_dataset(self.name, CHANGE_ATTR, taken) == claim:
                    return
                continue  # (another change claimed it since the look: look again)
            if wait.expired:
                raise BackendError(
                    f"dataset {self.name!r}: an attribute change by writer {held[0]} has run "
                    f"for over {CHANGE_WAIT:.0f} s; try again later, or end that process if "
                    "it is stuck"
                )
            wait.pause()

    def _put_on(self, tier: Tier, data: bytes, digest: str, catalog: Catalog | None) -> _Put:
        """Put ``data``, version ``digest``, on ``tier`` over the copy there, unless the
        record (in ``catalog``; None: none reachable, and the put is made) no longer names
        ``digest``, or that copy is of a version announced after it."""
        for _ in range(_PUT_TRIES):
            seen = tier.call(tier.backend.object_versions, [self.obj])
            over = None if seen is None else seen[0]
            # (read after the look: a change whose copy it saw had announced its version)
            named = self._accepted(catalog) if catalog is not None else None
            if named is not None:
                if digest not in named:
                    return _Put.SUPERSEDED
                later = named[named.index(digest) + 1 :]
                if later and (seen is None or over is not None):
                    held: str | None
                    try:
                        held = checksum(tier.call(tier.backend.get, self.obj))
                    except NotFoundError:
                        held = None
                    if held in later:
                        return _Put.NEWER
            try:
                tier.call(tier.backend.put_if, self.obj, data, over, durable=True)
                return _Put.STORED
            except ExistsError:
                continue  # (another copy was put there since the look: look again)
        return _Put.MISSED

    def _accepted(self, catalog: Catalog | None = None) -> list[str] | None:
        if catalog is None:
            catalog = self.catalog()
        if catalog is None:
            return None
        try:
            return meta_checksums(catalog.get_dataset(self.name))
        except NotFoundError:
            return None

    def _mend(self, tiers: list[Tier], data: bytes, accepted: list[str]) -> None:
        """Put ``data``, the current version, on ``tiers`` (they answered with another or
        none) where the record names it alone, and still does now, over the copy looked at
        before that (:meth:`Backend.put_if`): a change under way puts its own version there,
        and one that put and settled its own since the read must not lose it."""
        tiers = [t for t in tiers if t.up and not t.unwritable]
        if not tiers or len(accepted) != 1:
            return
        seen: dict[str, Any] = {}
        for tier in tiers:
            with contextlib.suppress(StrataError, OSError):
                got = tier.call(tier.backend.object_versions, [self.obj])
                seen[tier.name] = None if got is None else got[0]
        try:
            # (read after the looks: a change whose copy they saw had announced its version)
            if self._accepted() != accepted:
                return
        except StrataError:
            return
        for tier in tiers:
            if tier.name not in seen:
                continue
            # (an ExistsError: a copy put there since the look, left)
            with contextlib.suppress(StrataError, OSError):
                tier.call(tier.backend.put_if, self.obj, data, seen[tier.name], durable=True)
