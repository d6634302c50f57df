"""The in-process chunk cache of a storage hierarchy: the memory level that ``prefetch``
fills (APRIL's pre-fetch).

Entries are the stored (encoded) bytes of whole chunks keyed by ``(dataset, key)``, each with
the catalogued checksum the bytes matched when they were read; the total is bounded by
``capacity`` bytes and the least recently used entries leave first. An entry is a copy of the
chunk like any other, so it is the chunk's value only while the chunk's rows still name
those bytes: a read of a tiered dataset takes an entry only where the copy it would read
otherwise accepts the entry's checksum, after making the rows of the chunks it serves from
memory the catalog's current ones (one small query per read; see
:class:`strataio.tiers.store.TieredChunkStore`). So a hit is the newest committed
content, whichever process committed it; writes here also drop the entries they replace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from strataio.arrays.chunk_cache import BoundedLRU
from strataio.storage.base import BytesLike

DEFAULT_CACHE_BYTES = 256 << 20


class CachedBytes(NamedTuple):
    """A chunk's stored bytes and the catalogued checksum they matched (``""``: not known)."""

    data: bytes
    checksum: str


class ChunkCache(BoundedLRU[CachedBytes]):
    """A thread-safe LRU of chunk bytes bounded by ``capacity`` bytes (0 disables it)."""

    def __init__(self, capacity: int = DEFAULT_CACHE_BYTES) -> None:
        super().__init__(capacity)

    @staticmethod
    def charge(value: CachedBytes) -> int:
        return len(value.data)

    def get(self, dataset: str, key: str) -> bytes | None:
        """The bytes held of chunk ``key`` of ``dataset`` (None: none held), unchecked."""
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
            return v.data

    def get_many(
        self,
        dataset: str,
        keys: Sequence[str],
        accepts: Callable[[Sequence[str], Sequence[str]], list[bool]] | None = None,
    ) -> list[bytes | None]:
        """Per key of ``dataset``, the bytes held of it (None: none held), in one look; with
        ``accepts`` (called with the keys found and their entries' checksums, once, outside
        this cache's lock), only those it accepts: an entry it refuses leaves the cache (a
        miss)."""
        entries = self._entries
        if not entries:  # nothing held (the usual case): no lock to take
            self.misses += len(keys)
            return [None] * len(keys)
        found: list[CachedBytes | None] = []
        with self._lock:
            for k in keys:
                v = entries.get((dataset, k))
                if v is not None:
                    entries.move_to_end((dataset, k))
                found.append(v)
        if accepts is not None:
            held = [(i, v) for i, v in enumerate(found) if v is not None]
            if held:
                ok = accepts([keys[i] for i, _ in held], [v.checksum for _, v in held])
                for (i, v), fine in zip(held, ok):
                    if not fine:
                        self._drop(dataset, keys[i], v)
                        found[i] = None
        hits = sum(v is not None for v in found)
        self.hits += hits
        self.misses += len(keys) - hits
        return [None if v is None else v.data for v in found]

    def holding(self, dataset: str, keys: Sequence[str]) -> list[str]:
        """Those of ``keys`` of ``dataset`` of which an entry is held (fresh or stale)."""
        entries = self._entries
        if not entries:
            return []
        return [k for k in keys if (dataset, k) in entries]

    def put(self, dataset: str, key: str, data: BytesLike, checksum: str = "") -> bool:
        """Hold a copy of ``data``, whose bytes matched catalogued ``checksum``; False if it
        is larger than the whole cache."""
        return self.store(dataset, key, CachedBytes(bytes(data), checksum))

    def invalidate(self, dataset: str, keys: Iterable[str] | None = None) -> None:
        """Drop ``keys`` of ``dataset`` (all of its chunks when None)."""
        self.discard(dataset, keys)

    def _drop(self, dataset: str, key: str, entry: CachedBytes) -> None:
        """Drop the entry of ``key`` if it is still ``entry`` (another thread may have put
        newer bytes meanwhile)."""
        with self._lock:
            if self._entries.get((dataset, key)) is entry:
                del self._entries[(dataset, key)]
                self.nbytes -= self.charge(entry)
