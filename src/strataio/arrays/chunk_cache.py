"""The decoded-chunk cache: chunks kept in memory between reads, checked against storage.

A warm read through the page cache copies every byte twice (kernel to a buffer, buffer to the
caller) and pays an open, a read and a close per chunk. A read served from this cache copies
once and pays one ``stat``: every entry carries the stored object's version
(:meth:`strataio.storage.base.Backend.versions`; on POSIX inode, size and ctime), and a hit
needs the object's version now to equal the entry's. A chunk that any process replaced
(strataio's atomic replace makes a new inode) or rewrote in place (a new ctime) is read again.

File times are only as fine as the kernel's clock tick, so an object changed twice within one
tick could show one version for two contents. A chunk is therefore kept only when its object's
last change is older than :data:`SETTLE_NS` at the moment its version was taken (git's "racily
clean" rule): any later change then carries a later time. A chunk written moments ago is read
from storage until it settles (:data:`COARSE_SETTLE_NS` where file times are whole seconds).
An entry is always the bytes of one read of one version: a buffer the cache holds is never
written again. A chunk is kept on its second read of one version
(:meth:`DecodedChunkCache.admit`): a section read once costs what it costs without the cache. Disable the cache on a network file system whose server clock drifts from this
host's by more than :data:`SETTLE_NS`, and for files another process changes through a shared
``mmap`` (such writes update the ctime only when the pages are first dirtied).

Only stores that keep versions take part (a POSIX directory today); the capacity is one budget
for the whole process: ``STRATAIO_CHUNK_CACHE`` (bytes or a size like ``256MiB``; 0 disables),
64 MiB by default, changed at run time with :meth:`DecodedChunkCache.resize`.
"""

from __future__ import annotations

import math
import numbers
import os
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from strataio.errors import ConfigError
from strataio.sizes import parse_size
from strataio.storage.base import Version

DEFAULT_CAPACITY = 64 << 20
#: an object changed less than this long (ns) before its version was taken is not cached
SETTLE_NS = 50_000_000
#: the same for a change time in whole seconds (a file system with coarse timestamps)
COARSE_SETTLE_NS = 2_000_000_000
#: bookkeeping bytes charged per entry on top of its data
_ENTRY_BYTES = 256
#: chunks read once that the cache remembers (key and version, no bytes) to admit on a
#: second read
SEEN_ENTRIES = 1 << 16
ENV_VAR = "STRATAIO_CHUNK_CACHE"
V = TypeVar("V")


@dataclass(slots=True)
class CachedChunk:
    """One chunk in memory, chunk-shaped, valid in bytes ``[lo, hi)`` of its C-order layout.

    An uncompressed chunk is its stored array (stored byte order), filled as far as reads
    needed; a compressed one the whole decoded array.
    """

    version: Version
    chunk: np.ndarray
    lo: int
    hi: int


def _capacity(capacity: int | str) -> int:
    """Bytes from ``capacity``: a whole number (``1e9`` too), or a size as
    ``$STRATAIO_CHUNK_CACHE`` takes it (``"256MiB"``); :class:`ConfigError` for anything else,
    a fraction of a byte (``1.5``) included."""
    if isinstance(capacity, str):
        n = parse_size(capacity, where="cache capacity")
        if n is None:
            raise ConfigError(f"cache capacity {capacity!r}: a cache needs a bound (0 disables it)")
        return n
    if isinstance(capacity, bool) or not isinstance(capacity, numbers.Real):
        raise ConfigError(
            f"cache capacity {capacity!r} is not a size (bytes, or a string like '256MiB')"
        )
    if not isinstance(capacity, numbers.Integral) and not (
        math.isfinite(capacity) and capacity == math.floor(capacity)
    ):
        raise ConfigError(f"cache capacity {capacity!r} is not a whole number of bytes")
    n = int(capacity)
    if n < 0:
        raise ConfigError(f"cache capacity {capacity} is negative (0 disables the cache)")
    return n


def settled(version: Version, seen_ns: int) -> bool:
    """True when ``version`` (taken at ``seen_ns``) is old enough to identify one content.

    A change time with no fraction of a second comes from a file system that keeps whole
    seconds (ext3, ext4 with small inodes, FAT, some NFS servers): it must then be older than
    :data:`COARSE_SETTLE_NS`.
    """
    changed = version[-1]
    margin = SETTLE_NS if changed % 1_000_000_000 else COARSE_SETTLE_NS
    return changed < seen_ns - margin


class BoundedLRU(Generic[V]):
    """A thread-safe LRU of values keyed by ``(space, key)``, bounded by ``capacity`` bytes
    as :meth:`charge` counts them; 0 disables it. ``space`` groups one owner's entries."""

    def __init__(self, capacity: int) -> None:
        self._entries: OrderedDict[tuple[Hashable, str], V] = OrderedDict()
        self._lock = threading.Lock()
        self.capacity = _capacity(capacity)
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    @staticmethod
    def charge(value: V) -> int:
        """Bytes ``value`` counts against the capacity."""
        raise NotImplementedError

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def store(self, space: Hashable, key: str, value: V) -> bool:
        """Keep ``value`` (replacing the key's previous one) and evict down to capacity;
        False, keeping nothing, when it is larger than the whole cache."""
        if self.charge(value) > self.capacity:
            self.discard(space, [key])
            return False
        with self._lock:
            old = self._entries.pop((space, key), None)
            if old is not None:
                self.nbytes -= self.charge(old)
            self._entries[(space, key)] = value
            self.nbytes += self.charge(value)
            self._evict()
        return True

    def discard(self, space: Hashable, keys: Iterable[str] | None = None) -> None:
        """Drop ``keys`` of ``space`` (all of its entries when None)."""
        with self._lock:
            if keys is None:
                doomed = [k for k in self._entries if k[0] == space]
            else:
                doomed = [(space, k) for k in keys]
            for k in doomed:
                v = self._entries.pop(k, None)
                if v is not None:
                    self.nbytes -= self.charge(v)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    def resize(self, capacity: int | str) -> None:
        """Set the capacity in bytes (a whole number), or as a size string such as
        ``"256MiB"`` (0 disables the cache and empties it); :class:`ConfigError` for anything
        else, ``1.5`` bytes or ``True`` included, the capacity left as it was."""
        with self._lock:
            self.capacity = _capacity(capacity)
            self._evict()

    def _evict(self) -> None:
        while self.nbytes > self.capacity and self._entries:
            _, v = self._entries.popitem(last=False)
            self.nbytes -= self.charge(v)

    def __contains__(self, item: tuple[Hashable, str]) -> bool:
        with self._lock:
            return item in self._entries

    def __len__(self) -> int:
        return len(self._entries)


class DecodedChunkCache(BoundedLRU[CachedChunk]):
    """Decoded chunks, each valid while its stored object keeps the entry's version.

    ``space`` names one array's chunks (its store and codecs), so arrays never share entries.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        super().__init__(capacity)
        self._seen: OrderedDict[tuple[Hashable, str], Version] = OrderedDict()

    @staticmethod
    def charge(value: CachedChunk) -> int:
        return value.chunk.nbytes + _ENTRY_BYTES

    def admit(self, space: Hashable, key: str, version: Version) -> bool:
        """True when chunk ``key`` was read before in ``version``: keep it now. Otherwise
        remember that it was read (its key and version, not its bytes) and return False.

        A chunk is kept on its second read: one read once (the first read after a write, a
        scan) then costs what it costs without the cache, where keeping it would cost a
        buffer of its own and an entry per chunk.
        """
        slot = (space, key)
        with self._lock:
            if self._seen.get(slot) == version:
                del self._seen[slot]
                return True
            self._seen[slot] = version
            self._seen.move_to_end(slot)
            if len(self._seen) > SEEN_ENTRIES:
                self._seen.popitem(last=False)
            return False

    def remembers(self, space: Hashable, key: str, version: Version) -> bool:
        """True if chunk ``key`` was read once before in ``version`` (:meth:`admit` would
        keep it now); nothing changes."""
        return self._seen.get((space, key)) == version

    def discard(self, space: Hashable, keys: Iterable[str] | None = None) -> None:
        super().discard(space, keys)
        with self._lock:
            if keys is None:
                for slot in [s for s in self._seen if s[0] == space]:
                    del self._seen[slot]
            else:
                for k in keys:
                    self._seen.pop((space, k), None)

    def clear(self) -> None:
        super().clear()
        with self._lock:
            self._seen.clear()

    def holds_any(self, space: Hashable, keys: Iterable[str]) -> bool:
        """True if an entry (fresh or stale) of any of ``keys`` is held."""
        entries = self._entries
        return bool(entries) and any((space, k) in entries for k in keys)

    def lookup(
        self, space: Hashable, keys: Iterable[str], versions: Iterable[Version | None]
    ) -> list[CachedChunk | None]:
        """Per key, its entry when the entry's version is ``version``; stale entries leave."""
        out: list[CachedChunk | None] = []
        entries = self._entries
        with self._lock:
            for key, version in zip(keys, versions):
                e = entries.get((space, key))
                if e is not None and version is not None and e.version == version:
                    entries.move_to_end((space, key))
                    out.append(e)
                    self.hits += 1
                    continue
                if e is not None:
                    del entries[(space, key)]
                    self.nbytes -= self.charge(e)
                self.misses += 1
                out.append(None)
        return out


_cache: DecodedChunkCache | None = None
_cache_lock = threading.Lock()


def chunk_cache() -> DecodedChunkCache:
    """The process's decoded-chunk cache (sized from ``STRATAIO_CHUNK_CACHE`` at first use;
    unset or empty: :data:`DEFAULT_CAPACITY`)."""
    global _cache
    if _cache is None:
        with _cache_lock:
            if _cache is None:
                env = os.environ.get(ENV_VAR, "").strip()  # (empty: unset, as shells mean it)
                size = parse_size(env, where=f"${ENV_VAR}") if env else DEFAULT_CAPACITY
                if size is None:
                    raise ConfigError(f"${ENV_VAR}: the chunk cache needs a bound (0 disables it)")
                _cache = DecodedChunkCache(size)
    return _cache
