"""Remnants: the objects a deleted dataset may have left on a tier, and their removal.

A dataset's objects are not only those its catalog rows name: a writer killed before its
flush leaves objects no row names yet, and a tier that did not answer keeps what it held.
Deleting a dataset therefore records a *remnant* per tier that may hold its objects (each
persistent tier of the deleting process's configuration, and each tier its rows name) in the
same transaction that removes its record (:meth:`Catalog.delete_dataset`), and each remnant
stays until every object under the dataset's name is gone from its tier. While one stays,
no dataset of that name (nor one above or below it) can be created: the new dataset would
take the old one's objects for its own (``fsck`` adopts an object of a chunk no row names
as an interrupted write).

:func:`purge` removes the objects of one deleted dataset from every tier that answers
(:meth:`Session.delete_dataset` right after the deletion); :func:`purge_near` those of every
deleted dataset whose remnants keep a name from being created (:meth:`Session.create_dataset`
before creating it); ``strataio fsck --repair`` does it for every remnant
(:mod:`strataio.tiers.fsck`). ``strataio rm`` says which remnants a deletion leaves
(:class:`Deletion`), and ``strataio ls --remnants`` lists them all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

from strataio.catalog.base import Catalog, TierUsage
from strataio.errors import ObjectError, StrataError
from strataio.tiers.tier import TierSet

__all__ = ["Deletion", "by_dataset", "purge", "purge_near", "remnant_tiers"]


@dataclass(frozen=True, slots=True)
class Deletion:
    """What the deletion of dataset ``name`` removed (:meth:`Session.delete_dataset`).

    ``removed``: per tier, in tier order, the chunk copies its catalog rows named there and
    their bytes (``copies``, ``nbytes``): all gone from the catalog, and from the tier but
    where it is among ``remnants``. ``remnants``: the tiers where objects under its name may
    remain (down, read-only here, not in this configuration, or an object refused its
    deletion), recorded until a purge finds them gone (``strataio fsck --repair``, or a
    later create of the name)."""

    name: str
    removed: tuple[TierUsage, ...] = ()
    remnants: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes of all the copies removed, every tier together."""
        return sum(u.nbytes for u in self.removed)


def by_dataset(remnants: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """``(dataset, tier)`` pairs (:meth:`Catalog.remnants`) as each dataset's tiers, in the
    order given."""
    out: dict[str, list[str]] = {}
    for ds, tier in remnants:
        out.setdefault(ds, []).append(tier)
    return out


def remnant_tiers(tiers: TierSet) -> list[str]:
    """The tiers of ``tiers`` (a process's configuration) where a deleted dataset's objects
    may remain besides those its catalog rows name: every one but the memory tiers, whose
    objects die with their process (and no process that has the dataset in use is left
    when it is deleted).

    A tier that only another configuration has, and that no row names, is not among them:
    tiers stay registered in the catalog after a configuration drops them, and a remnant
    there would keep the name from being created again for good. What a writer of that
    configuration killed before its flush left there is then not known to be a deleted
    dataset's: ``fsck`` run with that configuration could adopt it into a dataset created
    again under the name."""
    return [t.name for t in tiers if not t.volatile and t.configured]


def purge(catalog: Catalog, tiers: TierSet, name: str) -> list[str]:
    """Delete every object under the name of deleted dataset ``name`` on each tier of
    ``tiers`` that holds a remnant of it and answers, and clear those remnants; return the
    tiers whose remnant stays (down, not among ``tiers``, read-only here with objects left,
    or a deletion failed).

    Runs under a claim of the name (:meth:`Catalog.claim_eviction`): a process that creates
    the name anew, or opens it, marks it and waits for the claim to end before it writes,
    so no object of the new dataset is deleted here. Where the claim is refused (a process
    marked the name first) nothing is deleted: the remnants stay, for a later purge."""
    left = [t for d, t in catalog.remnants(name) if d == name]
    if not left or not catalog.claim_eviction(name):
        return left
    try:
        left = [t for d, t in catalog.remnants(name) if d == name]  # (as of the claim)
        cleared = [t for t in left if t in tiers and _empty(tiers, t, name)]
        catalog.clear_remnants(name, cleared)
        return [t for t in left if t not in cleared]
    finally:
        catalog.release_eviction(name)


def purge_near(catalog: Catalog, tiers: TierSet, name: str) -> list[tuple[str, str]]:
    """:func:`purge` each deleted dataset whose remnants keep a dataset ``name`` from being
    created (:meth:`Catalog.create_dataset`): ``name`` itself, and each name above or below
    it (``a`` and ``a/b/c`` of ``a/b``); return ``(dataset, tier)`` of the remnants that
    stay."""
    left: list[tuple[str, str]] = []
    for ds in dict.fromkeys(d for d, _ in catalog.remnants(name, near=True)):
        left += [(ds, t) for t in purge(catalog, tiers, ds)]
    return left


def _empty(tiers: TierSet, tname: str, name: str) -> bool:
    """Delete the objects under ``name`` on tier ``tname``, then the folders they leave
    empty (:meth:`Backend.remove_empty_folders`); True if no object is left there."""
    t = tiers[tname]
    if not t.recheck():  # (a tier marked down is probed again, at most every RECHECK_S)
        return False
    try:
        keys = t.call(lambda: list(t.backend.list(name)))
        if keys and t.unwritable:
            return False  # (this process does not write there; another may purge it)
        left = False
        for key in keys:
            try:
                # (one object refusing, where the tier answers, is that object's: the others
                # go, and the tier stays up)
                t.call_alone(t.backend.delete, key)
            except ObjectError:
                left = True
    except StrataError:
        return False
    if not left and not t.unwritable:
        # (tidying only: whether the remnant is cleared is what the listing found)
        with contextlib.suppress(StrataError):
            t.call(t.backend.remove_empty_folders, name)
    return not left
