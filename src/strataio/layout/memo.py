"""Small thread-safe memo tables for layouts computed from long-lived objects (datatypes,
Extents) or from plain numbers (a section's corners).

MPI applications repeat the same views and buffer types call after call (every time step of a
checkpoint), and turning a datatype of many pieces into Extents costs numpy work in
proportion to its pieces. A :class:`LayoutMemo` remembers the last few results keyed by the
*identity* of the objects they came from plus plain numbers; it holds those objects, so their
ids cannot be reused while an entry lives. Results are shared: their arrays are made
read-only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from strataio.layout.extents import Extents

T = TypeVar("T")


def freeze(ext: Extents) -> Extents:
    """``ext`` with its arrays made read-only (it is about to be shared)."""
    for arr in (ext.offsets, ext.lengths, ext.mem):
        arr.flags.writeable = False
    return ext


class LayoutMemo(Generic[T]):
    """An LRU of ``size`` results keyed by ``(ids of sources, numbers)``."""

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._table: OrderedDict[tuple[Hashable, ...], tuple[tuple[object, ...], T]] = OrderedDict()
        self._lock = threading.Lock()

    def get(
        self, sources: tuple[object, ...], numbers: tuple[int, ...], make: Callable[[], T]
    ) -> T:
        """The result for ``sources`` (by identity) and ``numbers``; ``make()`` on a miss."""
        key = (len(sources), *map(id, sources), *numbers)
        # An entry holds its sources, so no other live object can have their ids: a key match
        # is an identity match (the count of sources first: a number equal to an object's id
        # is no source). The hit path takes no lock (a hot path of every I/O call):
        # single dict operations are atomic, and an entry evicted meanwhile is simply made again.
        hit = self._table.get(key)
        if hit is not None:
            try:  # noqa: SIM105 (contextlib.suppress costs more than the lookup)
                self._table.move_to_end(key)
            except KeyError:
                pass
            return hit[1]
        value = make()
        with self._lock:
            self._table[key] = (sources, value)
            while len(self._table) > self._size:
                self._table.popitem(last=False)
        return value
