"""Independent I/O: a rank's own reads and writes of its pieces, the one route every
independent transfer takes (an independent call, a collective call whose ranks chose not to
aggregate, each block of a packed transfer).

Reads of disjoint pieces go through a :class:`~strataio.collective.fileio.ReadPlan` (large
pieces straight into the caller's buffer, small ones sieved through a staging buffer),
overlapping ones through :func:`~strataio.collective.sieving.read_sieved` or
:func:`~strataio.collective.sieving.read_direct`; writes through a
:class:`~strataio.collective.sieving.SievePlan` (data sieving under byte-range locks), or
directly when sieving is disabled or the file cannot be read back. The hints
(``romio_ds_read`` / ``romio_ds_write``, ``ind_rd_buffer_size`` / ``ind_wr_buffer_size``)
decide, worked out once per hint set; the plans are remembered per layout in the
:class:`~strataio.collective.access.AccessPlan`.
"""

from __future__ import annotations

from typing import Any

from strataio.collective import fileio, sieving
from strataio.collective.access import Access
from strataio.collective.driver import Driver
from strataio.collective.hints import DISABLE, ENABLE, Hints, parse_hints
from strataio.errors import ShapeMismatchError
from strataio.layout.extents import Extents


class IndependentIO:
    """A rank's own reads and writes under one file's hints, with what the hints imply worked
    out once, when the file's hints are set, rather than on every call. ``hints``: a
    :class:`~strataio.collective.hints.Hints`, a mapping of hint strings, or None (defaults)."""

    __slots__ = ("read_key", "read_mode", "write_key", "write_mode")

    def __init__(self, hints: Hints | dict[str, Any] | None = None) -> None:
        h = hints if isinstance(hints, Hints) else parse_hints(hints)
        size = h.ind_rd_buffer_size
        ds = h.romio_ds_read
        self.read_mode = ds
        hole = 0 if ds == DISABLE else size if ds == ENABLE else fileio.SYSCALL_BYTES
        self.read_key = (size, hole)
        """(span, longest hole read through) of independent reads."""
        self.write_mode = h.romio_ds_write
        self.write_key = (h.ind_wr_buffer_size, sieving.hole_limit(h.romio_ds_write, write=True))
        """(span, longest hole written through or None for any) of sieving writes."""

    def write(self, driver: Driver, access: Access) -> None:
        """Write this rank's pieces by itself. Sieving (by the hints) under byte-range locks,
        planned once per layout; with ``romio_ds_write=disable`` directly without locks; on a
        file that cannot be read back (write-only) directly, under locks, since other writers
        may sieve."""
        if self.write_mode == DISABLE or not driver.read_write:
            lock = self.write_mode != DISABLE  # (a write-only file: others may sieve)
            sieving.write_direct(driver, access.file, access.stream, lock=lock)
            return
        key = self.write_key
        plans = access.plan.writes if access.plan is not None else {}
        plan = plans.get(key)
        if plan is None:
            plan = sieving.SievePlan(_sorted(access), key[0], key[1], True)
            plans[key] = plan
        plan.run(driver, access.stream)

    def read(self, driver: Driver, access: Access) -> None:
        """Read this rank's pieces by itself. Disjoint pieces are read by a
        :class:`~strataio.collective.fileio.ReadPlan` (remembered in ``access.plan``): large
        pieces straight into the caller's buffer, small ones sieved through a staging buffer.
        Overlapping pieces go through :mod:`strataio.collective.sieving`. Bytes past
        end-of-file read as zeros."""
        key = self.read_key
        plans = access.plan.reads if access.plan is not None else {}
        plan = plans.get(key, False)
        if plan is False:
            ext = _sorted(access)
            plan = fileio.ReadPlan(ext, *key) if ext.is_sorted() else None
            plans[key] = plan
        if plan is not None:
            plan.run(driver, access.stream)
        elif self.read_mode == DISABLE:  # pieces overlap
            sieving.read_direct(driver, access.file, access.stream)
        else:
            hole = sieving.hole_limit(self.read_mode, write=False)
            sieving.read_sieved(driver, access.file, access.stream, key[0], max_hole=hole)


def _sorted(access: Access) -> Extents:
    """The access's file pieces, checked against its buffer, without empty pieces, sorted."""
    ext = access.file.compact()
    n = len(ext)
    if n and (
        int(ext.offsets.min()) < 0
        or int(ext.mem.min()) < 0
        or bool((ext.lengths > access.stream.size - ext.mem).any())
    ):
        raise ShapeMismatchError(
            f"pieces reach outside the file or past the end of a {access.stream.size}-byte buffer"
        )
    return ext.sort()
