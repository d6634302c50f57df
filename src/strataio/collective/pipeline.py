"""Pipelined collective I/O (§2.1 of the irregular-applications paper): the aggregators in
groups that take turns at the file.

``strataio_pipeline_groups = G`` splits the ranks into ``G`` groups of consecutive ranks, each
holding about ``A / G`` of the ``A`` aggregators (``G`` is clamped to ``A``: a group without an
aggregator would have nothing to do). Two-phase I/O then runs ``G`` steps per window instead of
one: in step ``(i, g)`` every rank exchanges only the pieces of window ``i`` that belong to
group ``g``'s aggregators, and those aggregators alone access the file. An aggregator's file
access runs in the background I/O thread while the next groups exchange, so with ``G >= 2``
it overlaps ``G - 1`` exchanges and needs one realm buffer, not two; at most ``A / G``
aggregators touch the file at once (the paper's point: less contention at the I/O servers).
The pieces, the windows and the bytes written are those of plain two-phase I/O; only their
order in time changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Groups:
    """The aggregator groups of one call: group ``g`` holds the aggregators whose ranks lie in
    ``[bounds[g], bounds[g + 1])``; ``mine`` is this rank's group as an aggregator (-1: none)."""

    bounds: np.ndarray
    mine: int
    background: bool

    @property
    def count(self) -> int:
        return int(self.bounds.size) - 1

    def ranks(self, g: int) -> tuple[int, int]:
        """The range of ranks of group ``g``."""
        return int(self.bounds[g]), int(self.bounds[g + 1])

    def steps(self, ntimes: int) -> list[tuple[int, int]]:
        """The steps ``(window, group)`` in time order: every group's turn at window 0, then
        at window 1, ..."""
        return [(i, g) for i in range(ntimes) for g in range(self.count)]


def pipeline_groups(hints: Any, aggregators: np.ndarray, rank: int) -> Groups | None:
    """The groups ``strataio_pipeline_groups`` asks for over ``aggregators`` (their ranks), or
    None for plain two-phase I/O (one group). Aggregators' file access runs in the background
    thread unless ``strataio_cb_overlap=disable`` (then the groups still take turns at the
    file, without overlapping the exchanges)."""
    naggs = int(aggregators.size)
    count = min(int(getattr(hints, "strataio_pipeline_groups", 1) or 1), naggs)
    if count <= 1:
        return None
    ranks = np.sort(aggregators)
    first = ranks[(np.arange(count) * naggs) // count]
    bounds = np.append(first, ranks[-1] + 1).astype(np.int64)
    bounds[0] = 0  # (clients below the first aggregator belong to no group: harmless)
    mine = -1
    if rank in set(ranks.tolist()):
        mine = int(np.searchsorted(bounds, rank, side="right")) - 1
    mode = str(getattr(hints, "strataio_cb_overlap", "automatic")).lower()
    return Groups(bounds, mine, mode != "disable")
