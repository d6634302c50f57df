"""In-process backend: objects are bytearrays in a dict (tests, and the memory tier)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np

from strataio.errors import ExistsError, NotFoundError
from strataio.layout.extents import Extents
from strataio.layout.pieces import copy_pieces
from strataio.storage.base import Backend, BytesLike, Capabilities, validate_key


class MemoryBackend(Backend):
    """Objects held in memory; ``put`` swaps the whole object under a lock (atomic)."""

    def __init__(self, name: str = "memory") -> None:
        self._objects: dict[str, bytearray] = {}
        self._lock = threading.Lock()
        self.url = f"memory:{name}"
        self.capabilities = Capabilities(
            partial_write=True, append=True, preferred_io_size=1 << 16, latency=0.0
        )

    def _obj(self, key: str) -> bytearray:
        try:
            return self._objects[validate_key(key)]
        except KeyError:
            raise NotFoundError(f"no object {key!r} in {self.url}") from None

    def read(self, key: str, extents: Extents) -> bytearray:
        src = np.frombuffer(self._obj(key), dtype=np.uint8)
        out = bytearray(int((extents.mem + extents.lengths).max(initial=0)))
        inside = extents.compact().clip(0, src.size)  # bytes past the end read as zeros
        copy_pieces(
            np.frombuffer(out, dtype=np.uint8), inside.mem, src, inside.offsets, inside.lengths
        )
        return out

    def write(self, key: str, extents: Extents, data: BytesLike) -> None:
        validate_key(key)
        ext = extents.compact()
        with self._lock:
            obj = self._objects.setdefault(key, bytearray())
            need = ext.last
            if need > len(obj):
                obj.extend(b"\x00" * (need - len(obj)))
            src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
            copy_pieces(np.frombuffer(obj, dtype=np.uint8), ext.offsets, src, ext.mem, ext.lengths)

    def get(self, key: str) -> bytes:
        return bytes(self._obj(key))

    def put(self, key: str, data: BytesLike, *, durable: bool = False) -> None:
        obj = bytearray(memoryview(data).cast("B"))
        with self._lock:
            self._objects[validate_key(key)] = obj

    def put_new(self, key: str, data: BytesLike, *, durable: bool = False) -> None:
        obj = bytearray(memoryview(data).cast("B"))
        with self._lock:
            if validate_key(key) in self._objects:
                raise ExistsError(f"object {key!r} exists already")
            self._objects[key] = obj

    def size(self, key: str) -> int:
        return len(self._obj(key))

    def exists(self, key: str) -> bool:
        return validate_key(key) in self._objects

    def delete(self, key: str) -> None:
        with self._lock:
            self._objects.pop(validate_key(key), None)

    def list(self, prefix: str = "") -> Iterator[str]:
        p = prefix.rstrip("/") + "/" if prefix else ""
        yield from sorted(k for k in list(self._objects) if k.startswith(p))
