"""Persistent realm sizes of the thesis's experiments, by arithmetic (no ranks launched).

Each function gives the stripe (bytes) one of :func:`~strataio.collective.realms.stripe_size`'s
rules picks for an experiment of the thesis (``004_88d1824d73aab53e``) on ``nprocs``
aggregators (one per process there), from the experiment's geometry alone:

- Table 3.1, the sliding window (§3.5.2): 8×8 tiles of 4096×768 bytes (3 MiB), 192 MiB; the
  AAR column (:func:`sliding_window_aar`) and the *intelligent* column
  (:func:`sliding_window_intelligent`), and the file-size column (:func:`sliding_window_fsize`).
- Table 3.2, BTIO class B (§3.5.3): 102³ cells of 5 doubles per step, 40 steps
  (:func:`btio_aar`, :func:`btio_fsize_read`).
- Table 7.1, the persistent-file-realm benchmark (§7.6.1): 2048 data points of 1024 64-byte
  elements, 16 time steps (:func:`pfr_benchmark_fsize`).

The thesis prints KB and MB for KiB and MiB (a 4096×768-byte tile is "3MB").
"""

from __future__ import annotations

from strataio.collective.realms.striped import AAR, FSIZE
from strataio.collective.realms.striped import stripe_size as _stripe

KiB, MiB = 1024, 1024 * 1024


# ---------------------------------------------------------------------------- sliding window
class SlidingWindow:
    """The sliding-window file: ``tiles_y × tiles_x`` tiles of ``tile_rows × tile_cols`` bytes,
    a 2-D byte array in row-major order (a tile is not contiguous: each of its rows is
    ``tile_cols`` bytes, ``tiles_x * tile_cols`` apart). Rank ``r`` starts on tile ``r`` and
    moves one tile on (row-major, wrapping) per iteration."""

    def __init__(
        self, tiles_x: int = 8, tiles_y: int = 8, tile_rows: int = 4096, tile_cols: int = 768
    ) -> None:
        self.tiles_x, self.tiles_y = tiles_x, tiles_y
        self.tile_rows, self.tile_cols = tile_rows, tile_cols

    @property
    def ntiles(self) -> int:
        return self.tiles_x * self.tiles_y

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of tiles (``tile_rows`` rows of the whole array)."""
        return self.tiles_x * self.tile_rows * self.tile_cols

    @property
    def file_bytes(self) -> int:
        return self.tiles_y * self.row_bytes

    def tile_span(self, tile: int) -> tuple[int, int]:
        """First and one-past-last file byte of ``tile`` (mod the number of tiles)."""
        ty, tx = divmod(tile % self.ntiles, self.tiles_x)
        line = self.tiles_x * self.tile_cols
        first = ty * self.row_bytes + tx * self.tile_cols
        return first, first + (self.tile_rows - 1) * line + self.tile_cols

    def call_aar(self, nprocs: int, step: int = 0) -> tuple[int, int]:
        """The AAR ``[lo, hi)`` of iteration ``step``'s collective call: ranks on tiles
        ``step .. step + nprocs - 1`` (all tiles once ``nprocs`` covers them)."""
        if nprocs >= self.ntiles:
            return 0, self.file_bytes
        spans = [self.tile_span(step + r) for r in range(nprocs)]
        return min(s[0] for s in spans), max(s[1] for s in spans)

    def rows_spanned(self, nprocs: int) -> int:
        """Rows of tiles most collective calls span: ``nprocs`` consecutive tiles starting in
        column ``c`` span ``(c + nprocs - 1) // x + 1`` rows; of the ``x`` starting columns,
        ``(nprocs - 1) - (q - 1) x`` give ``q + 1`` rows and the rest ``q = ceil(nprocs / x)``
        — the majority decides (capped at the file's rows: a call cannot span more).

        The thesis prints this as its Equation 3.1, ``ceil(x/N) + 1 if ((x-1) mod N) > x/N
        else ceil(x/N)``, but its own Table 3.1 follows the rule above, not the printed
        formula: for ``x = 8`` the printed one gives 1 or 2 rows for every ``N >= 8`` (2 rows
        at 16 nodes: 3072 KB), while the table's intelligent sizes (4608 KB at 16 nodes: 3 rows
        of 24 MiB over 16; 3510 KB at 56: 8 rows) need the majority count. The code follows
        the table (:func:`equation_3_1` keeps the printed formula for comparison)."""
        x = self.tiles_x
        q = -(-nprocs // x)
        wider = (nprocs - 1) - (q - 1) * x  # starting columns whose window spans q + 1 rows
        rows = q + 1 if wider > x - wider else q
        return min(rows, self.tiles_y)


def equation_3_1(x: int, n: int) -> int:
    """The thesis's Equation 3.1 as printed (rows a call spans; see
    :meth:`SlidingWindow.rows_spanned` for why the code does not use it)."""
    q = -(-x // n)
    return q + 1 if ((x - 1) % n) > x / n else q


def sliding_window_aar(nprocs: int, geometry: SlidingWindow | None = None) -> int:
    """Table 3.1, AAR column: the first call's AAR over the aggregators."""
    g = geometry or SlidingWindow()
    lo, hi = g.call_aar(nprocs)
    return _stripe(AAR, lo, hi, 0, nprocs, 1)


def sliding_window_fsize(nprocs: int, geometry: SlidingWindow | None = None) -> int:
    """Table 3.1, fsize column: the (existing, full-size) file over the aggregators."""
    g = geometry or SlidingWindow()
    lo, hi = g.call_aar(nprocs)
    return _stripe(FSIZE, lo, hi, g.file_bytes, nprocs, 1)


def sliding_window_intelligent(nprocs: int, geometry: SlidingWindow | None = None) -> int:
    """Table 3.1, intelligent column: the rows of tiles most calls span
    (:meth:`SlidingWindow.rows_spanned`) over the aggregators, the size a user who knows the
    pattern would set."""
    g = geometry or SlidingWindow()
    return -(-g.rows_spanned(nprocs) * g.row_bytes // nprocs)


# ---------------------------------------------------------------------------- BTIO
def btio_step_bytes(n: int = 102, variables: int = 5, itemsize: int = 8) -> int:
    """Bytes BTIO writes per step: ``n³`` cells of ``variables`` doubles (class B: 102)."""
    return n**3 * variables * itemsize


def btio_aar(nprocs: int, n: int = 102) -> int:
    """Table 3.2, first row (AAR, and fsize for writes: the first write creates the file):
    one step over the aggregators."""
    return _stripe(AAR, 0, btio_step_bytes(n), 0, nprocs, 1)


def btio_fsize_read(nprocs: int, n: int = 102, steps: int = 40) -> int:
    """Table 3.2, second row (fsize for reads: the file of ``steps`` steps exists)."""
    return _stripe(FSIZE, 0, btio_step_bytes(n), steps * btio_step_bytes(n), nprocs, 1)


# ---------------------------------------------------------------------------- §7.6.1
def pfr_benchmark_fsize(
    nprocs: int, element: int = 64, elements: int = 1024, points: int = 2048, steps: int = 16
) -> int:
    """Table 7.1: the persistent-file-realm benchmark's file (every time step of a data point
    kept together, so each step's write spans the whole file) over the aggregators."""
    return _stripe(FSIZE, 0, 1, element * elements * points * steps, nprocs, 1)
