"""File realms: which aggregator owns which bytes of the file during a collective call.

A :class:`RealmPolicy` maps the aggregate access region (AAR) ``[lo, hi)`` — the first and
one-past-last byte any rank touches in this call — and the number of aggregators to one
contiguous byte range per aggregator. Aggregator ``a`` alone reads or writes its realm, which is
what makes a two-phase write with holes safe without file locks: the read-modify-write of a
realm's covering span cannot race with another aggregator.

:class:`EvenRealms` is ROMIO's default (``ADIOI_Calc_file_domains``): the AAR cut into
``ceil(AAR / n)``-byte pieces, aligned to ``strataio_realm_alignment`` (or ``striping_unit``)
bytes when set. Other policies plug in behind the same interface (``strataio_realms`` hint).
:func:`config_aggregators` chooses the aggregators from ``cb_config_list`` and ``cb_nodes``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from strataio.collective.hints import parse_config_list
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


def config_aggregators(config: str, names: Sequence[str], limit: int) -> np.ndarray:
    """The ranks that aggregate, in realm order, as ROMIO chooses them (``cb_config_list.c``).

    ``config``: a ``cb_config_list`` (:func:`~strataio.collective.hints.parse_config_list`);
    ``names``: each rank's processor name (``MPI.Get_processor_name``); ``limit``: at most this
    many (``cb_nodes``). Entries are taken in order: ``host:n`` takes the first ``n`` ranks of
    ``host`` not yet taken; ``*:n`` goes through the hosts not named before, in order of their
    first rank, taking ``n`` from each; a count ``*`` takes them all. Once an entry has
    looked at a host, later ``*`` entries pass it by. Raises
    :class:`~strataio.errors.HintError` when the list names no rank (as ROMIO refuses the open).
    """
    nprocs = len(names)
    limit = max(0, min(int(limit), nprocs))
    if config.strip() == "*:*":
        return np.arange(limit, dtype=np.int64)
    chosen: list[int] = []
    used = [False] * nprocs  # a rank taken, or passed by with its host
    for host, count in parse_config_list(config):
        if len(chosen) >= limit:
            break
        hosts = [host] if host is not None else _unused_hosts(names, used)
        for h in hosts:
            want = limit if count is None else count
            for r in range(nprocs):
                if names[r] == h and not used[r]:
                    if want > 0 and len(chosen) < limit:
                        chosen.append(r)
                        want -= 1
                    used[r] = True
            if len(chosen) >= limit:
                break
    if not chosen:
        raise HintError(
            f"hint cb_config_list={config!r}: no process matches (processes run on "
            f"{', '.join(sorted(set(names)))})"
        )
    return np.asarray(chosen, dtype=np.int64)


def _unused_hosts(names: Sequence[str], used: list[bool]) -> list[str]:
    """Hosts with a rank not yet taken or passed by, in order of that rank."""
    return list(dict.fromkeys(n for n, u in zip(names, used) if not u))
