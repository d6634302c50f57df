"""ChunkStore: where a Dataset's chunks and ``zarr.json`` live.

A Dataset talks only to this protocol, so the same array code runs over one backend
(:class:`BackendChunkStore`, a Zarr v3 directory or prefix) or over a storage hierarchy (the
tiered store of :mod:`strataio.tiers`). Batch calls let a store overlap requests and let a
tiered store consult its residency once per batch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from strataio.errors import NotFoundError
from strataio.storage.base import Backend, BytesLike, Version

META_KEY = "zarr.json"


@runtime_checkable
class ChunkStore(Protocol):
    """Chunk objects by key (``c/0/1``) plus the array's metadata document.

    A store may also offer ``read_span(key, offset, out, *, nowait=False) -> int | None`` (read
    part of one stored chunk; the chunk's size or None when missing; BlockingIOError under
    ``nowait`` when the data is not at hand); the Dataset then reads uncompressed chunks
    partially, cached ones on the caller's thread and the rest in parallel. A store that can
    tell when a chunk changed offers ``cache_space`` (a hashable naming its chunks) and
    ``chunk_versions(keys)`` (as :meth:`Backend.versions`); the Dataset then keeps decoded
    chunks in memory between reads (:mod:`strataio.arrays.chunk_cache`).
    """

    def get_chunks(self, keys: Sequence[str]) -> list[BytesLike | None]:
        """Stored bytes per key, None for chunks never written."""
        ...

    def put_chunks(self, items: Sequence[tuple[str, BytesLike]]) -> None:
        """Store chunks; each replaces its predecessor atomically."""
        ...

    def delete_chunks(self, keys: Sequence[str]) -> None: ...

    def list_chunks(self) -> list[str]: ...

    def get_meta(self) -> bytes | None: ...

    def put_meta(self, data: bytes) -> None: ...

    def flush(self) -> None:
        """Make every chunk put so far durable."""
        ...

    def close(self) -> None: ...


class BackendChunkStore:
    """A Zarr v3 array stored under ``prefix`` of one Backend."""

    def __init__(self, backend: Backend, prefix: str = "") -> None:
        self.backend = backend
        self.prefix = prefix.strip("/")
        self._unsynced: set[str] = set()
        self._lock = threading.Lock()
        self.cache_space = f"{backend.url}|{self.prefix}"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def get_chunks(self, keys: Sequence[str]) -> list[BytesLike | None]:
        return self.backend.get_many([self._key(k) for k in keys])

    def read_span(
        self, key: str, offset: int, out: memoryview, *, nowait: bool = False
    ) -> int | None:
        """Read ``len(out)`` bytes of chunk ``key`` from ``offset`` into ``out``.

        Returns the chunk object's size, or None when the chunk does not exist. With
        ``nowait``, raises BlockingIOError rather than wait on slow storage.
        """
        try:
            return self.backend.readinto_range(self._key(key), offset, out, nowait=nowait)
        except FileNotFoundError:
            return None

    def chunk_versions(self, keys: Sequence[str]) -> list[Version | None] | None:
        """Per chunk, its stored object's version (None when missing); None when the backend
        keeps no versions."""
        return self.backend.versions([self._key(k) for k in keys])

    def put_chunks(self, items: Sequence[tuple[str, BytesLike]]) -> None:
        for key, data in items:
            self.backend.put(self._key(key), data)
        with self._lock:
            self._unsynced.update(self._key(k) for k, _ in items)

    def delete_chunks(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.backend.delete(self._key(key))

    def list_chunks(self) -> list[str]:
        base = self._key("c")
        n = len(self.prefix) + 1 if self.prefix else 0
        keys = [k[n:] for k in self.backend.list(base)]
        if self.backend.exists(base):  # a 0-d array's single chunk is the object "c" itself
            keys.append("c")
        return keys

    def get_meta(self) -> bytes | None:
        try:
            return bytes(self.backend.get(self._key(META_KEY)))
        except NotFoundError:
            return None

    def put_meta(self, data: bytes) -> None:
        self.backend.put(self._key(META_KEY), data, durable=True)

    def flush(self) -> None:
        with self._lock:
            keys, self._unsynced = self._unsynced, set()
        if keys:
            self.backend.sync(sorted(keys))

    def close(self) -> None:
        self.flush()

    def chunk_path(self, key: str) -> str | None:
        """The file path of a chunk when the backend is a file system (for tools)."""
        path = getattr(self.backend, "path", None)
        return path(self._key(key)) if path is not None else None
