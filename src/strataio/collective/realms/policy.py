"""Realm policies: which aggregator owns which bytes of the file during one collective call.

A :class:`RealmPolicy` maps the call's aggregate access region (AAR) ``[lo, hi)`` — the first
and one-past-last byte any rank touches — and the number of aggregators to one realm per
aggregator, as :class:`~strataio.layout.extents.Extents` (any set of byte ranges). Aggregator
``a`` alone reads or writes its realm, which is what makes a two-phase write with holes safe
without file locks: the read-modify-write of a realm's bytes cannot race with another
aggregator.

:class:`EvenRealms` is ROMIO's default (``ADIOI_Calc_file_domains``): the AAR cut into
``ceil(AAR / n)``-byte pieces, recomputed every call. Persistent striped realms
(:class:`~strataio.collective.realms.striped.StripedRealms`) are the other policy; the open file
decides which one a call uses (``romio_cb_pfr``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from strataio.errors import HintError, StrataError
from strataio.layout.extents import Extents

_I64 = np.int64

#: values of the ``strataio_realms`` hint
EVEN = "even"
DYNAMIC = "dynamic"


class RealmPolicy(ABC):
    """Assigns each aggregator its realm for one collective call."""

    name: str = ""

    @abstractmethod
    def realms(self, lo: int, hi: int, naggr: int, hints: Any) -> list[Extents]:
        """Aggregator ``i``'s realm within the AAR ``[lo, hi)`` (bytes), for ``i`` in
        ``range(naggr)``: sorted, disjoint pieces; the realms are disjoint and together cover
        every byte of ``[lo, hi)``. A realm may be empty."""


class EvenRealms(RealmPolicy):
    """ROMIO's default: the AAR split evenly, ``ceil((hi - lo) / naggr)`` bytes per realm.

    With ``align > 1`` (bytes) every realm boundary but the first is rounded down to a multiple
    of ``align`` (file realm alignment, ``romio_cb_fr_alignment``: a file system page or stripe
    is then owned by one aggregator); ``align <= 1`` reproduces ROMIO's default path exactly.
    """

    name = EVEN

    def __init__(self, align: int = 0) -> None:
        if align < 0:
            raise StrataError(f"realm alignment must be >= 0, got {align}")
        self.align = int(align)

    def bounds(self, lo: int, hi: int, naggr: int) -> np.ndarray:
        """The realms as an ``(naggr, 2)`` int64 array of ``[start, stop)`` byte offsets."""
        if naggr < 1:
            raise StrataError(f"need at least one aggregator, got {naggr}")
        span = max(hi - lo, 0)
        size = -(-span // naggr) if span else 0
        starts = lo + np.arange(naggr, dtype=_I64) * size
        if self.align > 1:
            starts[1:] = (starts[1:] // self.align) * self.align
            starts = np.maximum(starts, lo)
        starts = np.minimum(starts, hi)
        stops = np.append(starts[1:], _I64(hi))
        return np.stack([starts, stops], axis=1)

    def realms(self, lo: int, hi: int, naggr: int, hints: Any) -> list[Extents]:
        b = self.bounds(lo, hi, naggr)
        return [
            Extents.single(int(s), int(e - s)) if e > s else Extents.empty() for s, e in b.tolist()
        ]


def realm_alignment(hints: Any) -> int:
    """Bytes realm boundaries align to: ``romio_cb_fr_alignment`` when above 1, else
    ``striping_unit`` when set, else 1 (none)."""
    align = int(getattr(hints, "romio_cb_fr_alignment", 1) or 1)
    if align > 1:
        return align
    return max(int(getattr(hints, "striping_unit", 0) or 0), 1)


def policy_from_hints(hints: Any) -> RealmPolicy:
    """The per-call policy of a file's hints (:class:`EvenRealms`, aligned by
    :func:`realm_alignment`); checks ``strataio_realms`` (``even`` or ``dynamic``, the latter
    only with ``romio_cb_pfr=enable``: it recomputes persistent realms) and raises
    :class:`~strataio.errors.HintError` otherwise."""
    name = str(getattr(hints, "strataio_realms", EVEN) or EVEN)
    if name not in (EVEN, DYNAMIC):
        raise HintError(
            f"hint strataio_realms={name!r}: unknown realm policy; known: {DYNAMIC}, {EVEN}"
        )
    if name == DYNAMIC and not persistent(hints):
        raise HintError(
            "hint strataio_realms=dynamic recomputes persistent file realms when the access "
            "pattern changes: it needs romio_cb_pfr=enable"
        )
    align = realm_alignment(hints)
    return EvenRealms(align if align > 1 else 0)


def persistent(hints: Any) -> bool:
    """Whether the hints ask for persistent file realms (``romio_cb_pfr=enable``)."""
    return str(getattr(hints, "romio_cb_pfr", "disable")).lower() == "enable"
