"""The in-process chunk cache: the memory level that ``prefetch`` fills (APRIL's pre-fetch).

Entries are the stored (encoded) bytes of whole chunks keyed by ``(dataset, key)``; the total
is bounded by ``capacity`` bytes and the least recently used entries leave first. Writes
invalidate the chunks they replace, so a hit is always the newest committed content.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

from strataio.storage.base import BytesLike

DEFAULT_CACHE_BYTES = 256 << 20


class ChunkCache:
    """A thread-safe LRU of chunk bytes bounded by ``capacity`` bytes (0 disables it)."""

    def __init__(self, capacity: int = DEFAULT_CACHE_BYTES) -> None:
        self.capacity = max(0, int(capacity))
        self._data: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, dataset: str, key: str) -> bytes | None:
        with self._lock:
            v = self._data.get((dataset, key))
            if v is None:
                self.misses += 1
                return None
            self._data.move_to_end((dataset, key))
            self.hits += 1
            return v

    def __contains__(self, item: tuple[str, str]) -> bool:
        with self._lock:
            return item in self._data

    def put(self, dataset: str, key: str, data: BytesLike) -> bool:
        """Hold a copy of ``data``; False if it is larger than the whole cache."""
        blob = bytes(data)
        if len(blob) > self.capacity:
            return False
        with self._lock:
            old = self._data.pop((dataset, key), None)
            if old is not None:
                self.nbytes -= len(old)
            self._data[(dataset, key)] = blob
            self.nbytes += len(blob)
            while self.nbytes > self.capacity:
                _, v = self._data.popitem(last=False)
                self.nbytes -= len(v)
        return True

    def invalidate(self, dataset: str, keys: Iterable[str] | None = None) -> None:
        """Drop ``keys`` of ``dataset`` (all of its chunks when None)."""
        with self._lock:
            if keys is None:
                doomed = [k for k in self._data if k[0] == dataset]
            else:
                doomed = [(dataset, k) for k in keys]
            for k in doomed:
                v = self._data.pop(k, None)
                if v is not None:
                    self.nbytes -= len(v)

    def __len__(self) -> int:
        return len(self._data)
