"""Persistent striped file realms (the thesis's §3.4): aggregator ``a`` owns every byte ``b``
with ``floor(b / stripe) mod A == a``, anchored at byte 0, over the whole file.

With ``romio_cb_pfr=enable`` an open file fixes one :class:`StripedRealms` at its first
two-phase call and keeps it until close, so each aggregator is the only process that ever
touches its realm (what makes caching a realm coherent without locks). The stripe comes from
``romio_cb_fr_types`` (:func:`stripe_size`): the first call's aggregate access region over the
aggregators (``aar``), the impending file size over the aggregators (``-1``), or a size given
in bytes; it is rounded up to ``romio_cb_fr_alignment``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strataio.collective.hints import parse_fr_type
from strataio.collective.realms.policy import RealmPolicy
from strataio.errors import StrataError
from strataio.layout.extents import Extents

_I64 = np.int64
_MAX_OFFSET = 2**63 - 1  # (MPI_Offset's largest)

#: ``romio_cb_fr_types`` values (ROMIO: ``ADIOI_FR_AAR`` 0, ``ADIOI_FR_FSZ`` -1)
AAR = "aar"
FSIZE = "-1"


class StripedRealms(RealmPolicy):
    """Stripes of ``stripe`` bytes dealt round-robin to ``naggr`` aggregators from byte 0."""

    name = "striped"

    def __init__(self, stripe: int, naggr: int) -> None:
        if stripe < 1 or naggr < 1:
            raise StrataError(
                f"striped realms need stripe >= 1 and naggr >= 1, got {stripe}, {naggr}"
            )
        self.stripe = int(stripe)
        self.naggr = int(naggr)

    def __repr__(self) -> str:
        return f"StripedRealms(stripe={self.stripe}, naggr={self.naggr})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StripedRealms):
            return NotImplemented
        return (self.stripe, self.naggr) == (other.stripe, other.naggr)

    def __hash__(self) -> int:
        return hash((self.stripe, self.naggr))

    def owner(self, offsets: np.ndarray) -> np.ndarray:
        """The aggregator index (0 .. naggr-1) owning each byte offset (int64 array)."""
        return (np.asarray(offsets, dtype=_I64) // self.stripe) % self.naggr

    def clip(self, lo: int, hi: int) -> list[Extents]:
        """Each aggregator's stripes within ``[lo, hi)``, clipped to it (sorted pieces)."""
        s, a = self.stripe, self.naggr
        if hi <= lo:
            return [Extents.empty() for _ in range(a)]
        if a == 1:
            return [Extents.single(lo, hi - lo)]
        k0, k1 = lo // s, (hi - 1) // s  # first and last stripe touched
        out = []
        for agg in range(a):  # (a loop per aggregator; the stripes are numpy)
            first = k0 + (agg - k0) % a
            ks = np.arange(first, k1 + 1, a, dtype=_I64)
            starts = np.maximum(ks * s, lo)
            ends = np.minimum(ks * s + s, hi)
            out.append(Extents(starts, ends - starts))
        return out

    def realms(self, lo: int, hi: int, naggr: int, hints: Any) -> list[Extents]:
        if naggr != self.naggr:
            raise StrataError(
                f"persistent realms were fixed for {self.naggr} aggregators, not {naggr}"
            )
        return self.clip(lo, hi)


def stripe_size(fr_type: str, lo: int, hi: int, file_size: int, naggr: int, align: int) -> int:
    """The stripe of persistent realms, in bytes, for ``romio_cb_fr_types`` ``fr_type``
    given the call's AAR ``[lo, hi)``, the file's current size and the aggregators:
    ``aar``: ``ceil((hi - lo) / naggr)`` (ROMIO's ``ADIOI_Calc_file_realms_aar``);
    ``-1``: ``ceil(max(file_size, hi) / naggr)`` (the impending size: a write may grow the
    file); a number: itself. Rounded up to a multiple of ``align`` bytes (the largest below
    2**63 where that is past it: a stripe that wide holds every offset of a file); at least
    1."""
    fr_type = parse_fr_type(fr_type)
    if fr_type == AAR:
        size = -(-max(hi - lo, 0) // naggr)
    elif fr_type == FSIZE:
        size = -(-max(file_size, hi) // naggr)
    else:
        size = int(fr_type)
    size = max(size, 1)
    if align > 1:
        size = min(-(-size // align), _MAX_OFFSET // align) * align
    return size
