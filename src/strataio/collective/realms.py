"""File realms: which aggregator owns which bytes of the file during a collective call.

A :class:`RealmPolicy` maps the aggregate access region (AAR) ``[lo, hi)`` — the first and
one-past-last byte any rank touches in this call — and the number of aggregators to one
contiguous byte range per aggregator. Aggregator ``a`` alone reads or writes its realm, which is
what makes a two-phase write with holes safe without file locks: the read-modify-write of a
realm's covering span cannot race with another aggregator.

:class:`EvenRealms` is ROMIO's default (``ADIOI_Calc_file_domains``): the AAR cut into
``ceil(AAR / n)``-byte pieces. Persistent and aligned realms plug in behind the same interface
(``strataio_realms`` hint).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from strataio.errors import HintError, StrataError


class RealmPolicy(ABC):
    """Assigns one contiguous file range per aggregator for one collective call."""

    name: str = ""

    @abstractmethod
    def realms(self, lo: int, hi: int, naggr: int, hints: Any) -> np.ndarray:
        """Realm bounds as an ``(naggr, 2)`` int64 array of ``[start, stop)`` byte offsets.

        Realms must be disjoint, in increasing order, and together cover every byte in
        ``[lo, hi)`` that is accessed; a realm may be empty (``start == stop``).
        """


class EvenRealms(RealmPolicy):
    """ROMIO's default: the AAR split evenly, ``ceil((hi - lo) / naggr)`` bytes per realm.

    With ``align > 0`` (bytes) every realm boundary but the first is rounded down to a multiple
    of ``align`` (file realm alignment: a file system page or stripe is then owned by one
    aggregator); ``align = 0`` reproduces ROMIO exactly.
    """

    name = "even"

    def __init__(self, align: int = 0) -> None:
        if align < 0:
            raise StrataError(f"realm alignment must be >= 0, got {align}")
        self.align = int(align)

    def realms(self, lo: int, hi: int, naggr: int, hints: Any) -> np.ndarray:
        if naggr < 1:
            raise StrataError(f"need at least one aggregator, got {naggr}")
        span = max(hi - lo, 0)
        size = -(-span // naggr) if span else 0
        starts = lo + np.arange(naggr, dtype=np.int64) * size
        if self.align > 1:
            starts[1:] = (starts[1:] // self.align) * self.align
            starts = np.maximum(starts, lo)
        starts = np.minimum(starts, hi)
        stops = np.append(starts[1:], np.int64(hi))
        return np.stack([starts, stops], axis=1)


_POLICIES: dict[str, type[RealmPolicy]] = {"even": EvenRealms, "aar": EvenRealms}


def register_policy(name: str, policy: type[RealmPolicy]) -> None:
    """Make ``policy`` selectable with the ``strataio_realms`` hint value ``name``."""
    _POLICIES[name] = policy


def policy_from_hints(hints: Any) -> RealmPolicy:
    """The policy named by the ``strataio_realms`` hint (default ``even``), aligned to
    ``strataio_realm_alignment`` or else ``striping_unit`` bytes when either is set."""
    name = str(getattr(hints, "strataio_realms", "even") or "even")
    try:
        cls = _POLICIES[name]
    except KeyError:
        raise HintError(
            f"hint strataio_realms={name!r}: unknown realm policy; known: "
            f"{', '.join(sorted(_POLICIES))}"
        ) from None
    align = int(getattr(hints, "strataio_realm_alignment", 0) or 0)
    align = align or int(getattr(hints, "striping_unit", 0) or 0)
    return cls(align) if cls is EvenRealms else cls()


def select_aggregators(nprocs: int, cb_nodes: int) -> np.ndarray:
    """Ranks that act as aggregators: ``min(cb_nodes, nprocs)`` of them, spread evenly.

    ROMIO picks one aggregator per node (``cb_config_list "*:1"``) up to ``cb_nodes``; with
    ranks placed on nodes in blocks, taking every ``nprocs / cb_nodes``-th rank (rank
    ``floor(a * nprocs / n)`` for aggregator ``a``) lands on distinct nodes in the same way, and
    on one node it is ROMIO's choice for ``cb_nodes = 1`` (rank 0).
    """
    n = max(1, min(int(cb_nodes), int(nprocs)))
    return (np.arange(n, dtype=np.int64) * nprocs) // n
