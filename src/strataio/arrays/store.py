"""ChunkStore: where a Dataset's chunks and ``zarr.json`` live.

A Dataset talks only to this interface, so the same array code runs over one backend
(:class:`BackendChunkStore`, a Zarr v3 directory or prefix) or over a storage hierarchy (the
tiered store of :mod:`strataio.tiers`). Batch calls let a store overlap requests and let a
tiered store consult its residency once per batch.

Beyond the required methods a store may offer three capabilities, declared in its
:attr:`ChunkStore.capabilities` (the Dataset asks them, never the store's type):

- ``partial_reads``: :meth:`ChunkStore.read_span` reads part of one stored chunk, so an
  uncompressed chunk is read only where a section touches it;
- ``versions``: :meth:`ChunkStore.chunk_versions` tells when a stored chunk changed;
- ``chunk_cache``: :attr:`ChunkStore.cache_space` names the store's chunks in the process's
  decoded-chunk cache (:mod:`strataio.arrays.chunk_cache`); it needs ``versions``, which say
  when an entry went stale;
- ``overlapped_puts``: :meth:`ChunkStore.put_chunks` overlaps the puts of one call itself and
  has a fixed cost per call, so a writer hands it many chunks at once rather than one call
  per thread.

Calling the method of a capability a store lacks raises :class:`CapabilityError`.
"""

from __future__ import annotations

import abc
import os
import shutil
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from strataio.arrays.meta_lock import meta_lock
from strataio.arrays.shard_parts import is_part_file
from strataio.errors import (
    BackendError,
    CapabilityError,
    ExistsError,
    NotFoundError,
    StrataError,
)
from strataio.storage.base import Backend, BytesLike, Version

#: the array's metadata document, beside its chunks
META_KEY = "zarr.json"
#: times :meth:`BackendChunkStore.update_meta` on object storage looks again at a
#: ``zarr.json`` another change put between its look and its put, before it gives up
_META_TRIES = 1000
#: held by :meth:`BackendChunkStore.update_meta` on a backend that keeps no versions
_UNVERSIONED_META = threading.Lock()


@dataclass(frozen=True, slots=True)
class StoreCapabilities:
    """The optional things a :class:`ChunkStore` can do (see the module docstring)."""

    partial_reads: bool = False
    versions: bool = False
    chunk_cache: bool = False
    overlapped_puts: bool = False

    def __post_init__(self) -> None:
        if self.chunk_cache and not self.versions:
            raise ValueError("the decoded-chunk cache needs chunk versions")


class ChunkStore(abc.ABC):
    """Chunk objects by key (``c/0/1``) plus the array's metadata document.

    ``name`` names the dataset in messages. Errors are :class:`StrataError`\\ s naming the
    dataset and the chunk.
    """

    capabilities: StoreCapabilities = StoreCapabilities()
    name: str = ""

    @abc.abstractmethod
    def get_chunks(self, keys: Sequence[str]) -> list[BytesLike | None]:
        """Stored bytes per key, None for chunks never written."""

    @abc.abstractmethod
    def put_chunks(self, items: Sequence[tuple[str, BytesLike]]) -> None:
        """Store chunks; each replaces its predecessor atomically."""

    @abc.abstractmethod
    def delete_chunks(self, keys: Sequence[str]) -> None:
        """Remove chunks (they read as the fill value again); missing ones are no error."""

    @abc.abstractmethod
    def list_chunks(self) -> list[str]:
        """Keys of every chunk stored."""

    @abc.abstractmethod
    def get_meta(self) -> bytes | None:
        """The ``zarr.json`` document, None when there is none."""

    @abc.abstractmethod
    def put_meta(self, data: bytes) -> None:
        """Replace ``zarr.json`` durably."""

    def update_meta(self, change: Callable[[bytes | None], bytes]) -> None:
        """Replace ``zarr.json`` durably with ``change(the zarr.json stored now)`` (None
        where there is none); nothing is put where ``change`` raises. A store that can
        makes this one step against every other :meth:`update_meta` of the same array, in
        any process, so that changes running at once all take effect (it may call
        ``change`` again, on the newer document, where another change came first); this
        default is a :meth:`get_meta` and a :meth:`put_meta`, two steps."""
        self.put_meta(change(self.get_meta()))

    @abc.abstractmethod
    def flush(self) -> None:
        """Make every chunk put so far durable."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush, and release what the store holds."""

    # ----------------------------------------------------------------- capabilities
    def read_span(
        self, key: str, offset: int, out: memoryview, *, nowait: bool = False
    ) -> int | None:
        """(``partial_reads``) Read ``len(out)`` bytes of chunk ``key`` from ``offset`` into
        ``out``; the stored chunk's size in bytes, or None when the chunk does not exist. With
        ``nowait``, raise :class:`BlockingIOError` rather than wait on slow storage (errno
        EINPROGRESS when the bytes are on their way: see
        :meth:`strataio.storage.base.Backend.readinto_range`)."""
        self._lacks("partial_reads")

    def read_span_versioned(
        self, key: str, offset: int, out: memoryview, *, nowait: bool = False
    ) -> tuple[int | None, Version | None]:
        """(``partial_reads`` and ``versions``) :meth:`read_span`, and the version of the
        stored chunk the bytes came from (as :meth:`chunk_versions` gives it; this default
        gives None: such bytes are not cached)."""
        return self.read_span(key, offset, out, nowait=nowait), None

    def read_spans_versioned(
        self,
        keys: Sequence[str],
        offsets: Sequence[int],
        outs: Sequence[memoryview],
        *,
        nowait: bool = False,
    ) -> list[tuple[int | None, Version | None] | BlockingIOError]:
        """(``partial_reads``) :meth:`read_span_versioned` of each key into its ``out``, in
        one call: a chunk that would wait gives its :class:`BlockingIOError` in its place
        (the others are read); any other error is raised."""
        got: list[tuple[int | None, Version | None] | BlockingIOError] = []
        for key, offset, out in zip(keys, offsets, outs):
            try:
                got.append(self.read_span_versioned(key, offset, out, nowait=nowait))
            except BlockingIOError as exc:
                got.append(exc)
        return got

    def get_chunks_as(
        self, keys: Sequence[str], versions: Sequence[Version | None]
    ) -> list[tuple[BytesLike | None, bool]]:
        """(``versions``) :meth:`get_chunks`, and per key whether its bytes came from the
        object ``versions[i]`` (:meth:`chunk_versions`, taken before the read) was taken of:
        always in a store of one location; a store of several (a tiered one) says no where a
        read failed over to another copy, whose bytes must not be cached under that version."""
        if not self.capabilities.versions:
            self._lacks("versions")
        return [(blob, True) for blob in self.get_chunks(keys)]

    def chunk_versions(self, keys: Sequence[str]) -> list[Version | None]:
        """(``versions``) Per key a token that changes whenever the stored chunk does (None
        for a chunk never written), as :meth:`strataio.storage.base.Backend.versions`."""
        self._lacks("versions")

    @property
    def cache_space(self) -> Hashable:
        """(``chunk_cache``) A hashable naming this store's chunks in the decoded-chunk cache."""
        self._lacks("chunk_cache")

    def _lacks(self, capability: str) -> NoReturn:
        raise CapabilityError(
            f"{type(self).__name__} of {self.name or 'this dataset'!r} has no {capability} "
            "(see its capabilities)"
        )


class BackendChunkStore(ChunkStore):
    """A Zarr v3 array stored under ``prefix`` of one Backend; ``name`` names the dataset in
    messages (default: the backend's location)."""

    def __init__(self, backend: Backend, prefix: str = "", *, name: str = "") -> None:
        self.backend = backend
        self.prefix = prefix.strip("/")
        self.name = name or f"{backend.url}/{self.prefix}".rstrip("/")
        self._unsynced: set[str] = set()
        self._lock = threading.Lock()
        versions = backend.versions([]) is not None
        self.capabilities = StoreCapabilities(
            partial_reads=True, versions=versions, chunk_cache=versions
        )
        self._space = f"{backend.url}|{self.prefix}"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def chunk_size(self, key: str) -> int | None:
        """Bytes stored for chunk ``key`` (None: none stored)."""
        try:
            return self.backend.size(self._key(key))
        except FileNotFoundError:  # (NotFoundError too)
            return None

    def _failed(self, what: str, key: str, exc: OSError) -> BackendError:
        err = BackendError(f"dataset {self.name!r}: cannot {what} chunk {key!r}: {exc}")
        err.__cause__ = exc
        return err

    def get_chunks(self, keys: Sequence[str]) -> list[BytesLike | None]:
        try:
            return self.backend.get_many([self._key(k) for k in keys])
        except StrataError:
            raise
        except OSError as exc:
            bad = keys[0]
            for k in keys:  # which chunk: the error path may ask again, one at a time
                try:
                    self.backend.get_many([self._key(k)])
                except OSError:
                    bad = k
                    break
            raise self._failed("read", bad, exc) from exc

    def read_span(
        self, key: str, offset: int, out: memoryview, *, nowait: bool = False
    ) -> int | None:
        try:
            return self.backend.readinto_range(self._key(key), offset, out, nowait=nowait)
        except Exception as exc:
            return self._never_written(key, exc)

    def _never_written(self, key: str, exc: Exception) -> None:
        """None when ``exc``, from a read of chunk ``key``, says its object is missing (a
        chunk never written); otherwise raise it, a system error as the store's
        :class:`BackendError` naming the chunk."""
        if isinstance(exc, FileNotFoundError):  # (NotFoundError is one)
            return None
        if isinstance(exc, OSError) and not isinstance(exc, BlockingIOError | StrataError):
            raise self._failed("read", key, exc) from exc
        raise exc

    def read_span_versioned(
        self, key: str, offset: int, out: memoryview, *, nowait: bool = False
    ) -> tuple[int | None, Version | None]:
        if not self.capabilities.versions:
            return self.read_span(key, offset, out, nowait=nowait), None
        got = self.read_spans_versioned([key], [offset], [out], nowait=nowait)[0]
        if isinstance(got, BlockingIOError):
            raise got
        return got

    def read_spans_versioned(
        self,
        keys: Sequence[str],
        offsets: Sequence[int],
        outs: Sequence[memoryview],
        *,
        nowait: bool = False,
    ) -> list[tuple[int | None, Version | None] | BlockingIOError]:
        if not self.capabilities.versions:  # (one read_span per chunk, no version asked)
            return super().read_spans_versioned(keys, offsets, outs, nowait=nowait)
        got = self.backend.readinto_ranges_versioned(
            [self._key(k) for k in keys], offsets, outs, nowait=nowait
        )
        for i, r in enumerate(got):
            if isinstance(r, Exception) and not isinstance(r, BlockingIOError):
                self._never_written(keys[i], r)  # (raises unless never written)
                got[i] = (None, None)
        return got  # type: ignore[return-value]

    def chunk_versions(self, keys: Sequence[str]) -> list[Version | None]:
        got = self.backend.versions([self._key(k) for k in keys])
        if got is None:
            self._lacks("versions")
        return got

    @property
    def cache_space(self) -> Hashable:
        if not self.capabilities.chunk_cache:
            self._lacks("chunk_cache")
        return self._space

    def put_chunks(self, items: Sequence[tuple[str, BytesLike]]) -> None:
        for key, data in items:
            try:
                self.backend.put(self._key(key), data)
            except StrataError:
                raise
            except OSError as exc:
                raise self._failed("write", key, exc) from exc
            with self._lock:
                self._unsynced.add(self._key(key))

    def note_written(self, keys: Sequence[str]) -> None:
        """Record chunks written in place by other means than :meth:`put_chunks` (the files
        a collective shard write renames into place), so that :meth:`flush` makes them
        durable too."""
        with self._lock:
            self._unsynced.update(self._key(k) for k in keys)

    def delete_chunks(self, keys: Sequence[str]) -> None:
        for key in keys:
            try:
                self.backend.delete(self._key(key))
            except StrataError:
                raise
            except OSError as exc:
                raise self._failed("delete", key, exc) from exc

    def list_chunks(self) -> list[str]:
        base = self._key("c")
        n = len(self.prefix) + 1 if self.prefix else 0
        # (not the temporary files of collective shard writes, which lie among the shards)
        keys = [k[n:] for k in self.backend.list(base) if not is_part_file(k)]
        if self.backend.exists(base):  # a 0-d array's single chunk is the object "c" itself
            keys.append("c")
        return keys

    def get_meta(self) -> bytes | None:
        try:
            return bytes(self.backend.get(self._key(META_KEY)))
        except NotFoundError:
            return None
        except StrataError:
            raise
        except OSError as exc:
            raise BackendError(f"dataset {self.name!r}: cannot read {META_KEY}: {exc}") from exc

    def put_meta(self, data: bytes) -> None:
        try:
            self.backend.put(self._key(META_KEY), data, durable=True)
        except StrataError:
            raise
        except OSError as exc:
            raise BackendError(f"dataset {self.name!r}: cannot write {META_KEY}: {exc}") from exc

    def update_meta(self, change: Callable[[bytes | None], bytes]) -> None:
        """:meth:`ChunkStore.update_meta`, one step across processes: on a file system under
        the array's meta lock (:mod:`strataio.arrays.meta_lock`; two steps where the file
        system keeps no locks); on object storage a put only over the version read
        (:meth:`Backend.put_if`, atomic at an S3 server), ``change`` applied again to the
        newer document where another put came between. On a backend that keeps no versions
        (memory) it is one step within this process only."""
        path = self.chunk_path(META_KEY)
        if path is not None:
            try:
                with meta_lock(os.path.dirname(path)):
                    self.put_meta(change(self.get_meta()))
            except StrataError:
                raise
            except OSError as exc:
                raise BackendError(
                    f"dataset {self.name!r}: cannot lock {META_KEY} to change it: {exc}"
                ) from exc
            return
        key = self._key(META_KEY)
        for _ in range(_META_TRIES):
            try:
                seen = self.backend.object_versions([key])
            except StrataError:
                raise
            except OSError as exc:
                raise BackendError(f"dataset {self.name!r}: cannot read {META_KEY}: {exc}") from exc
            if seen is None:
                with _UNVERSIONED_META:
                    self.put_meta(change(self.get_meta()))
                return
            data = change(self.get_meta())  # (read after the look: a put between fails)
            try:
                self.backend.put_if(key, data, seen[0], durable=True)
                return
            except ExistsError:
                continue  # (another change came between the look and the put: again)
            except StrataError:
                raise
            except OSError as exc:
                raise BackendError(
                    f"dataset {self.name!r}: cannot write {META_KEY}: {exc}"
                ) from exc
        raise BackendError(
            f"dataset {self.name!r}: {META_KEY} changed between each of {_META_TRIES} looks "
            "and the put that followed; try again"
        )

    def holds_chunks(self) -> bool:
        """True when anything is stored where chunks go (even folders of another array)."""
        root = self._chunk_root()
        if root is not None:
            return os.path.lexists(root)
        return bool(self.list_chunks())

    def clear(self) -> None:
        """Remove the array: ``zarr.json`` first (so that an interruption leaves no array
        that reads partly as fill values), then every chunk, folders included."""
        try:
            self.backend.delete(self._key(META_KEY))
            root = self._chunk_root()
            if root is not None:  # the removal is durable before any chunk goes
                fd = os.open(os.path.dirname(root), os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            if root is None:
                for key in self.list_chunks():
                    self.backend.delete(self._key(key))
            elif os.path.isdir(root) and not os.path.islink(root):
                shutil.rmtree(root)
            elif os.path.lexists(root):
                os.unlink(root)
        except StrataError:
            raise
        except OSError as exc:
            raise BackendError(
                f"dataset {self.name!r}: cannot remove the old array: {exc}"
            ) from exc

    def flush(self) -> None:
        with self._lock:
            keys, self._unsynced = self._unsynced, set()
        if keys:
            try:
                self.backend.sync(sorted(keys))
            except StrataError:
                raise
            except OSError as exc:
                raise BackendError(
                    f"dataset {self.name!r}: written chunks may not be durable: {exc}"
                ) from exc

    def close(self) -> None:
        self.flush()

    def chunk_path(self, key: str) -> str | None:
        """The file path of a chunk when the backend is a file system (for tools)."""
        path = getattr(self.backend, "path", None)
        return path(self._key(key)) if path is not None else None

    def _chunk_root(self) -> str | None:
        """The file system path of the chunk tree (``c``), None on object storage."""
        return self.chunk_path("c")


class CountingChunkStore(ChunkStore):
    """Another store, counting the chunk reads that reach it: ``reads`` is the number of
    chunks asked for by :meth:`get_chunks` plus the :meth:`read_span` calls (for benchmarks
    and tests that show how often storage was touched)."""

    def __init__(self, inner: ChunkStore) -> None:
        self.inner = inner
        self.name = inner.name
        self.capabilities = inner.capabilities
        self.reads = 0
        self._lock = threading.Lock()

    def _count(self, n: int) -> None:
        with self._lock:
            self.reads += n

    def get_chunks(self, keys: Sequence[str]) -> list[BytesLike | None]:
        self._count(len(keys))
        return self.inner.get_chunks(keys)

    def read_span(
        self, key: str, offset: int, out: memoryview, *, nowait: bool = False
    ) -> int | None:
        got = self.inner.read_span(key, offset, out, nowait=nowait)
        self._count(1)  # after: a read that would block is retried, and counted then
        return got

    def read_span_versioned(
        self, key: str, offset: int, out: memoryview, *, nowait: bool = False
    ) -> tuple[int | None, Version | None]:
        got = self.inner.read_span_versioned(key, offset, out, nowait=nowait)
        self._count(1)
        return got

    def get_chunks_as(
        self, keys: Sequence[str], versions: Sequence[Version | None]
    ) -> list[tuple[BytesLike | None, bool]]:
        self._count(len(keys))
        return self.inner.get_chunks_as(keys, versions)

    def chunk_versions(self, keys: Sequence[str]) -> list[Version | None]:
        return self.inner.chunk_versions(keys)

    @property
    def cache_space(self) -> Hashable:
        return self.inner.cache_space

    def put_chunks(self, items: Sequence[tuple[str, BytesLike]]) -> None:
        self.inner.put_chunks(items)

    def delete_chunks(self, keys: Sequence[str]) -> None:
        self.inner.delete_chunks(keys)

    def list_chunks(self) -> list[str]:
        return self.inner.list_chunks()

    def get_meta(self) -> bytes | None:
        return self.inner.get_meta()

    def put_meta(self, data: bytes) -> None:
        self.inner.put_meta(data)

    def update_meta(self, change: Callable[[bytes | None], bytes]) -> None:
        self.inner.update_meta(change)

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()
