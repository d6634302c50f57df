"""One rank's part of a transfer, and what is planned for it once per layout.

An :class:`Access` is the file pieces of a rank's transfer (offsets and lengths, ``mem`` the
byte position of each piece in the rank's buffer) and that buffer; an :class:`AccessPlan` is
what does not depend on the bytes: the pieces, the five numbers the ranks agree on before a
collective call (:data:`ROW`, columns :data:`ERR` ... :data:`NPIECES`), and the independent
read and write plans built for the layout. :class:`~strataio.collective.file.File` memoizes
plans across calls, so a call that repeats a view, a buffer type and an offset skips planning.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from strataio.layout.extents import Extents

if TYPE_CHECKING:
    from strataio.collective.fileio import ReadPlan
    from strataio.collective.sieving import SievePlan

# Columns of the agreement row.
ERR, FIRST, LAST, NBYTES, NPIECES = range(5)

#: an agreement row as the ranks exchange it: five native int64 (error code, first and last
#: byte touched, bytes, pieces)
ROW = struct.Struct("5q")


class AccessPlan:
    """What one rank's access looks like apart from its bytes: the file pieces (``mem`` =
    positions in the rank's buffer), the agreement numbers, and the independent read and write
    plans built for it (keyed by the sieving parameters that shaped them)."""

    __slots__ = ("file", "reads", "row", "summary", "writes")

    def __init__(self, file: Extents) -> None:
        self.file = file
        n = len(file)
        self.summary = (file.first, file.last, file.nbytes, n) if n else (0, 0, 0, 0)
        self.row = ROW.pack(0, *self.summary)  # agreement row of a valid call
        self.reads: dict[tuple[int, int], ReadPlan | None] = {}
        self.writes: dict[tuple[int, int | None], SievePlan] = {}


@dataclass(slots=True)
class Access:
    """One rank's part of a transfer: file pieces ``file`` and the caller's buffer ``stream``
    (flat ``uint8``; source for writes, destination for reads); ``file.mem`` are byte offsets
    into ``stream``, so data moves between file and caller memory without a packed copy.
    ``plan`` carries what was planned for this layout in earlier calls."""

    file: Extents
    stream: np.ndarray
    plan: AccessPlan | None = None
