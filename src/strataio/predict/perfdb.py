"""The performance database as the predictor reads it: unit times interpolated by size.

Rows come from the catalog's performance table (:meth:`Catalog.perf_rows`), written by
:mod:`strataio.predict.calibrate`. Per tier only the latest calibration counts (its rows share
one ``when``); repeats of a measurement are reduced to their median.

Ops (the terms of the paper's equation (1)):

- transfers, a series over sizes: ``write`` / ``read`` (one independent call of
  :class:`strataio.File` moving ``nbytes`` contiguous bytes), ``write_all`` / ``read_all``
  (one collective call moving ``nbytes`` in all through one two-phase window), ``put`` /
  ``get`` (one chunk of a collective dataset over the tier's backend, per process);
- constants, ``nbytes`` 0: ``open`` / ``close`` (a :class:`strataio.File`), ``seek`` (moving its
  file pointer), ``view`` (setting a subarray view), ``connect`` / ``disconnect`` (the tier's connection set-up and close).

``concurrency`` is how many processes made the same call at once during the measurement.

Interpolation (:meth:`PerfTable.time`): between two measured sizes, log-log linear (a power law
between neighbours, the straight segments of the paper's Figures 6-8). Below the smallest
measured size the smallest size's time is used (fixed costs dominate there); above the largest,
time grows in proportion to size from the largest point (the transfer dominates there). Between
measured concurrencies, linear in concurrency; above the highest, in proportion to it (the tier's
bandwidth is shared); below 1, as 1.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

from strataio.catalog.base import PerfRow
from strataio.errors import MetadataError, StrataError

__all__ = ["FIXED_OPS", "SERIES_OPS", "PerfTable", "UncalibratedError"]

SERIES_OPS = ("write", "read", "write_all", "read_all", "put", "get")
FIXED_OPS = ("connect", "open", "seek", "view", "close", "disconnect")


class UncalibratedError(StrataError, LookupError):
    """The performance database has no measurement the prediction needs."""


@dataclass(frozen=True, slots=True)
class Curve:
    """One op's medians: ``sizes`` (bytes, increasing) by ``levels`` (concurrencies) →
    ``seconds[level_index, size_index]`` (NaN where not measured)."""

    sizes: np.ndarray
    levels: np.ndarray
    seconds: np.ndarray

    def at_level(self, i: int, nbytes: float) -> float:
        row = self.seconds[i]
        ok = ~np.isnan(row)
        s, t = self.sizes[ok], row[ok]
        if nbytes <= s[0]:
            return float(t[0])
        if nbytes >= s[-1]:
            return float(t[-1] * nbytes / s[-1])
        lt = np.interp(np.log(nbytes), np.log(s), np.log(np.maximum(t, 1e-12)))
        return float(np.exp(lt))

    def time(self, nbytes: float, concurrency: float) -> float:
        lv = self.levels
        c = max(float(concurrency), 1.0)
        if c >= lv[-1]:
            return self.at_level(len(lv) - 1, nbytes) * c / lv[-1]
        if c <= lv[0]:
            return self.at_level(0, nbytes)
        hi = int(np.searchsorted(lv, c))
        lo = hi - 1
        w = (c - lv[lo]) / (lv[hi] - lv[lo])
        return (1 - w) * self.at_level(lo, nbytes) + w * self.at_level(hi, nbytes)


def _unusable(r: PerfRow) -> str | None:
    """What is wrong with performance row ``r`` (None: nothing)."""
    if not isinstance(r.seconds, Real) or not all(
        isinstance(v, Integral) for v in (r.nbytes, r.concurrency)
    ):
        return "a value that is not a number"
    if not np.isfinite(r.seconds) or r.seconds < 0:
        return f"{r.seconds!r} seconds"
    if r.nbytes < 0 or (r.nbytes == 0 and r.op in SERIES_OPS):
        return f"{r.nbytes!r} bytes"
    if r.concurrency < 1:
        return f"concurrency {r.concurrency!r}"
    return None


class PerfTable:
    """Unit times per tier and op, from performance rows (see the module docs)."""

    def __init__(self, rows: Iterable[PerfRow]) -> None:
        """Only each tier's latest calibration counts (rows of one ``when``). A tier's op
        among whose rows there is one no calibration writes (a time that is not a finite
        number of seconds, 0 or more; a size-series op of no bytes; a concurrency below 1)
        is damaged: using it raises :class:`~strataio.errors.MetadataError` naming the rows
        (:meth:`damage`); calibrating the tier again supersedes them."""
        rows = [r for r in rows if isinstance(r.when, Real)]
        latest: dict[str, float] = {}
        for r in rows:
            latest[r.tier] = max(latest.get(r.tier, r.when), r.when)
        groups: dict[tuple[str, str], dict[tuple[int, int], list[float]]] = defaultdict(
            lambda: defaultdict(list)
        )
        bad: dict[tuple[str, str], list[tuple[PerfRow, str]]] = defaultdict(list)
        for r in rows:
            if r.when != latest[r.tier]:
                continue
            why = _unusable(r)
            if why is None:
                groups[(r.tier, r.op)][(r.concurrency, r.nbytes)].append(r.seconds)
            else:
                bad[(r.tier, r.op)].append((r, why))
        self._damage = {
            key: (
                f"tier {key[0]!r}: its calibration of {key[1]!r} holds {len(found)} row(s) no "
                f"calibration writes, e.g. at {found[0][0].nbytes!r} bytes: {found[0][1]}; "
                f"calibrate it again (strataio calibrate --tier {key[0]})"
            )
            for key, found in bad.items()
        }
        self._curves: dict[tuple[str, str], Curve] = {}
        for key, cells in groups.items():
            if key in self._damage:
                continue
            sizes = np.array(sorted({n for _, n in cells}), dtype=np.float64)
            levels = np.array(sorted({c for c, _ in cells}), dtype=np.float64)
            sec = np.full((len(levels), len(sizes)), np.nan)
            for (c, n), ts in cells.items():
                sec[np.searchsorted(levels, c), np.searchsorted(sizes, n)] = float(np.median(ts))
            keep = ~np.all(np.isnan(sec), axis=1)
            self._curves[key] = Curve(sizes, levels[keep], sec[keep])
        self.measured_at = latest
        #: per tier, the settings its latest calibration measured (``PerfRow.settings``;
        #: tiers whose rows record none are left out)
        self.settings = {
            r.tier: r.settings for r in rows if r.when == latest[r.tier] and r.settings
        }

    @property
    def tiers(self) -> list[str]:
        """Tiers with a calibration, in no particular order."""
        return sorted(self.measured_at)

    def has(self, tier: str, op: str | None = None) -> bool:
        """Whether ``tier`` has a calibration (of ``op``, undamaged)."""
        if op is None:
            return tier in self.measured_at
        return (tier, op) in self._curves

    def changed_since(self, tier: str, settings: str) -> str | None:
        """Why ``tier``'s calibration no longer holds, configured as ``settings`` now
        (:func:`strataio.predict.native.measured_settings`): None where they are the ones
        it measured, or it recorded none."""
        then = self.settings.get(tier)
        if then is None or then == settings:
            return None
        return (
            f"tier {tier!r} was calibrated as {then!r} and is configured as {settings!r} now: "
            f"its times no longer hold; calibrate it again (strataio calibrate --tier {tier})"
        )

    def damage(self, tier: str, op: str | None = None) -> str | None:
        """What is wrong with ``tier``'s calibration (of ``op``; of any op where None):
        rows no calibration writes (None: nothing)."""
        for (t, o), said in self._damage.items():
            if t == tier and (op is None or o == op):
                return said
        return None

    def curve(self, tier: str, op: str) -> Curve:
        try:
            return self._curves[(tier, op)]
        except KeyError:
            if (tier, op) in self._damage:
                raise MetadataError(self._damage[(tier, op)]) from None
            what = "no calibration" if tier not in self.measured_at else f"no {op!r} measurement"
            raise UncalibratedError(
                f"tier {tier!r}: {what} in the performance database; run "
                f"`strataio calibrate --tier {tier}`"
            ) from None

    def time(self, tier: str, op: str, nbytes: float = 0, concurrency: float = 1) -> float:
        """Seconds of one ``op`` of ``nbytes`` on ``tier`` with ``concurrency`` processes at
        once, interpolated as the module docs say."""
        return self.curve(tier, op).time(nbytes, concurrency)

    def measured_range(self, tier: str, op: str) -> tuple[int, int]:
        """Smallest and largest size measured for ``op`` on ``tier`` (bytes)."""
        s = self.curve(tier, op).sizes
        return int(s[0]), int(s[-1])
