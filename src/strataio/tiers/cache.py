"""The in-process chunk cache of a storage hierarchy: the memory level that ``prefetch``
fills (APRIL's pre-fetch).

Entries are the stored (encoded) bytes of whole chunks keyed by ``(dataset, key)``; the total
is bounded by ``capacity`` bytes and the least recently used entries leave first. Writes
invalidate the chunks they replace, so a hit is always the newest committed content.
"""

from __future__ import annotations

from collections.abc import Iterable

from strataio.arrays.chunk_cache import BoundedLRU
from strataio.storage.base import BytesLike

DEFAULT_CACHE_BYTES = 256 << 20


class ChunkCache(BoundedLRU[bytes]):
    """A thread-safe LRU of chunk bytes bounded by ``capacity`` bytes (0 disables it)."""

    def __init__(self, capacity: int = DEFAULT_CACHE_BYTES) -> None:
        super().__init__(capacity)

    @staticmethod
    def charge(value: bytes) -> int:
        return len(value)

    def get(self, dataset: str, key: str) -> bytes | None:
        if not self._entries:  # nothing held (the usual case): no lock to take
            self.misses += 1
            return None
        with self._lock:
            v = self._entries.get((dataset, key))
            if v is None:
                self.misses += 1
                return None
            self._entries.move_to_end((dataset, key))
            self.hits += 1
            return v

    def put(self, dataset: str, key: str, data: BytesLike) -> bool:
        """Hold a copy of ``data``; False if it is larger than the whole cache."""
        return self.store(dataset, key, bytes(data))

    def invalidate(self, dataset: str, keys: Iterable[str] | None = None) -> None:
        """Drop ``keys`` of ``dataset`` (all of its chunks when None)."""
        self.discard(dataset, keys)
