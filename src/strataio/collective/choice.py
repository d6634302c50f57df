"""The per-call choice between two-phase and independent I/O, from the agreed numbers.

``romio_cb_read`` / ``romio_cb_write`` = enable / disable / automatic. ROMIO's own heuristic
only asks "do the ranks' ranges interleave?". On a node-local file system with a page cache
the exchange costs as much as the I/O it saves, so *automatic* also goes independent unless
pieces are tiny (mean piece < ``LARGE_PIECE`` bytes, where sieving drags ``1/density`` times
the data through every rank) or, for writes, the ranks would write thousands of small pieces
one system call each (``PIECEWISE_WRITES``: the kernel serializes them) or would sieve spans
that drag far more bytes than they hold (``SIEVE_DRAG_SCORE``) and every rank has a core of its
own, and whenever one rank does all the I/O; it aggregates when ranges interleave and one of
those holds.
"""

from __future__ import annotations

import numpy as np

from strataio.collective import fileio, sieving
from strataio.collective.access import FIRST, LAST, NBYTES, NPIECES

_I64 = np.int64


# Mean piece size from which automatic mode stays independent. Measured with
# ``strataio bench collective`` on a node-local page-cached file system at 2 and 4 ranks:
# independent sieving beat two-phase for every HPIO size down to 64-byte regions (reads and
# writes), because the exchange costs as much as the copies it saves and all ranks sieve in
# parallel; only pieces smaller than this are worth aggregating.
LARGE_PIECE = 64

# Pieces written one system call each (see _piecewise_writes) from which automatic mode
# aggregates a write whose ranges interleave: concurrent writes to one file are serialized by
# the kernel (ext4 takes the inode lock for every buffered write), so thousands of small writes
# from several ranks cost more than moving their bytes to one aggregator that writes large
# spans. Measured on a 16-core node (strataio bench collective, HPIO 4 KiB regions, 4096 per
# rank), MB/s independent -> two-phase: 8 ranks (29 KiB gaps, wider than sieving crosses)
# 899-1225 -> 1670-2177, 16 ranks (62 KiB) 841-964 -> 1566-1910; at 2 and 4 ranks the gaps
# (4.3 and 12.5 KiB) are sieved, one call per 512 KiB, and independent wins (2 ranks 2591-3474
# against 1461-1627, 4 ranks 2362 against 1590). Not on a crowded node (more ranks than cores):
# there the polling ranks slow the aggregator down (HPIO 4 KiB regions written one call each at
# 4 ranks on 2 cores: independent 756, two-phase 566 MB/s).
PIECEWISE_WRITES = 1024

# Sieved writes whose spans interleave: every rank reads and writes back its whole span, holes
# included, under locks its neighbours wait for, and the kernel serializes the write-backs, so
# the bytes written grow with the *drag* (bytes spanned / bytes written) while two-phase writes
# each byte once and pays per piece in the exchange. Automatic mode aggregates such a write
# when drag * mean_piece ** SIEVE_DRAG_EXPONENT reaches this score. Fitted on a 16-core node
# (strataio bench collective --mode call, 64 MiB in all but 8 for HPIO 64 B; MB/s two-phase /
# independent at 2, 4, 8, 16 ranks, then the drags): HPIO 512 B 0.59, 0.70, 0.96, 1.63 (drag
# 2.5-20); HPIO 64 B 0.28, 0.46, 0.64, 1.16 (6-48); HPIO 4 KiB at 2 and 4 ranks 0.79, 1.11
# (2.1, 4.1); tile2d at 4, 8, 16 ranks 1.23, 1.35, 1.45 (drag 2, 2, 4; pieces 11.6, 8, 5.8
# KiB). Scores: HPIO 512 B at 8 ranks (a tie) 577, the lowest two-phase win 699 (tile2d, 8).
# Only from SIEVE_DRAG_RANKS sieving ranks: with two, independent won every case measured,
# also 2 ranks on 2 cores interleaving 8 KiB pieces (drag 2, score 699 as tile2d at 8 ranks:
# 2951 MB/s against 2457), so the floor, not the score, tells those apart.
SIEVE_DRAG_SCORE = 640
SIEVE_DRAG_EXPONENT = 0.65
SIEVE_DRAG_RANKS = 4


def use_two_phase(
    stats: np.ndarray | list[list[int]], mode: str, write: bool = False, crowded: bool = False
) -> bool:
    """Whether a collective call aggregates, from the agreed ``stats`` (an ``(nprocs, 5)``
    array or its rows as lists), the hint ``mode``, the direction and whether some node has more
    ranks than cores (:attr:`strataio.collective.node.NodeLayout.crowded`).

    ``"enable"`` and ``"disable"`` force the answer (the values :class:`Hints` holds, lower
    case); ``"automatic"`` follows the module docstring. Every rank computes the same answer
    from the same numbers.
    """
    if mode == "disable":
        return False
    active, nbytes, pieces = _totals(stats)
    if active == 0:
        return False
    if mode == "enable":
        return True
    if active < 2:
        return False
    tiny = nbytes < LARGE_PIECE * max(pieces, 1)
    if not tiny and not (write and not crowded and _independent_writes_serialize(stats, pieces)):
        return False
    return not ranges_disjoint(np.asarray(stats, dtype=_I64))


def _independent_writes_serialize(stats: np.ndarray | list[list[int]], pieces: int) -> bool:
    """Whether independent writes would queue in the kernel: thousands of pieces written one
    call each (``PIECEWISE_WRITES``), or sieved spans that drag far more than they hold
    (``SIEVE_DRAG_SCORE``)."""
    if pieces >= PIECEWISE_WRITES and _piecewise_writes(stats) >= PIECEWISE_WRITES:
        return True
    drag, piece = _sieving_drag(stats)
    return drag * piece**SIEVE_DRAG_EXPONENT >= SIEVE_DRAG_SCORE


def _sieving_drag(stats: np.ndarray | list[list[int]]) -> tuple[float, float]:
    """(bytes spanned / bytes written, mean piece bytes) over the ranks whose writes automatic
    sieving would read, patch and write back (holes between their pieces no wider, on average,
    than it crosses); (0, 0) unless at least ``SIEVE_DRAG_RANKS`` ranks sieve."""
    hole = sieving.hole_limit("automatic", write=True)
    ranks = span = nbytes = pieces = 0
    for _, first, last, n, k in _as_rows(stats):
        if k > 1 and 0 < last - first - n <= hole * (k - 1):
            ranks, span, nbytes, pieces = ranks + 1, span + last - first, nbytes + n, pieces + k
    if ranks < SIEVE_DRAG_RANKS:
        return 0.0, 0.0
    return span / nbytes, nbytes / pieces


def _piecewise_writes(stats: np.ndarray | list[list[int]]) -> int:
    """How many pieces the ranks would write one system call each on the independent path:
    those of ranks whose pieces lie further apart (on average) than automatic sieving crosses
    and are shorter than ``SYSCALL_BYTES`` (the agreed numbers alone decide, so every rank
    gets the same count whatever its own sieving hints)."""
    hole = sieving.hole_limit("automatic", write=True)
    total = 0
    for _, first, last, nbytes, npieces in _as_rows(stats):
        small = nbytes < fileio.SYSCALL_BYTES * npieces
        if npieces > 1 and small and last - first - nbytes > hole * (npieces - 1):
            total += npieces
    return total


def _as_rows(stats: np.ndarray | list[list[int]]) -> list[list[int]]:
    return stats.tolist() if type(stats) is np.ndarray else stats  # type: ignore[return-value]


def _totals(stats: np.ndarray | list[list[int]]) -> tuple[int, int, int]:
    """(ranks with bytes to move, bytes, pieces) of the agreed ``stats``."""
    active = nbytes = pieces = 0
    for row in _as_rows(stats):
        if row[NBYTES]:
            active += 1
            nbytes += row[NBYTES]
            pieces += row[NPIECES]
    return active, nbytes, pieces


def ranges_disjoint(stats: np.ndarray) -> bool:
    """True when no two active ranks' ``[first, last)`` ranges overlap."""
    active = stats[stats[:, NBYTES] > 0]
    if active.shape[0] < 2:
        return True
    order = np.argsort(active[:, FIRST], kind="stable")
    first, last = active[order, FIRST], active[order, LAST]
    return bool(np.all(first[1:] >= np.maximum.accumulate(last)[:-1]))
