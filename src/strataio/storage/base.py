"""The Backend contract: a namespace of byte objects addressed by key.

Every tier and every engine reaches storage through this small interface, and asks a backend
its :class:`Capabilities` rather than its type. Keys are ``/``-separated relative names
(``"array/c/0/3"``); :func:`validate_key` refuses anything that could escape the namespace.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from strataio.errors import ExistsError, InvalidKeyError, ShapeMismatchError
from strataio.layout.extents import Extents

BytesLike = bytes | bytearray | memoryview
#: an object's version token (see :meth:`Backend.versions`: integers, the last one its change
#: time; :meth:`Backend.object_versions` of an object store: its ETag and version id)
Version = tuple[int | str, ...]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do, and roughly how it costs.

    ``partial_write``: :meth:`Backend.write` updates bytes in place without rewriting the
    object. ``append``: objects can grow by partial writes past their end.
    ``preferred_io_size``: bytes per request below which requests should be merged.
    ``latency``: seconds of fixed cost per request (0 for local files).
    """

    partial_write: bool = True
    append: bool = True
    preferred_io_size: int = 1 << 20
    latency: float = 0.0


def check_batch(keys: Sequence[str], offsets: Sequence[int], outs: Sequence[Any]) -> None:
    """Refuse a batch read whose lists differ in length (:class:`ShapeMismatchError`, before
    any byte is read)."""
    if not len(keys) == len(offsets) == len(outs):
        raise ShapeMismatchError(
            f"a batch read needs one offset and one buffer per key: {len(keys)} keys, "
            f"{len(offsets)} offsets, {len(outs)} buffers"
        )


@functools.lru_cache(maxsize=1 << 16)
def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe relative object name, else raise :class:`InvalidKeyError`.

    Results are cached: chunk keys repeat across reads, and validation sits on the hot path.
    """
    if not isinstance(key, str):
        raise InvalidKeyError(f"storage key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidKeyError("storage key is empty")
    if "\x00" in key:
        raise InvalidKeyError(f"storage key {key!r} contains a NUL byte")
    if key.startswith("/") or "\\" in key or (len(key) > 1 and key[1] == ":"):
        raise InvalidKeyError(f"storage key {key!r} is absolute; keys are relative names")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise InvalidKeyError(
                f"storage key {key!r} has an empty, '.' or '..' component; "
                "keys cannot leave the backend's root"
            )
    return key


class Backend(abc.ABC):
    """A namespace of byte objects. Subclasses implement the abstract methods.

    ``read`` returns the bytes of ``extents`` concatenated in the order given; ``write`` puts
    ``data`` (packed in the same order) at those positions, creating the object if needed.
    ``get``/``put`` move whole objects; ``put`` replaces atomically: a reader or a crash sees
    the whole old object or the whole new one, never a mixture.
    """

    capabilities: Capabilities = Capabilities()

    #: a short human label, e.g. ``posix:/scratch/run1``
    url: str = ""
    #: whether :meth:`object_versions` are hashes of the bytes (an object store's ETags):
    #: two puts of the same bytes then have one version
    content_versions: bool = False

    @abc.abstractmethod
    def read(self, key: str, extents: Extents) -> BytesLike: ...

    @abc.abstractmethod
    def write(self, key: str, extents: Extents, data: BytesLike) -> None: ...

    @abc.abstractmethod
    def get(self, key: str) -> BytesLike: ...

    @abc.abstractmethod
    def put(self, key: str, data: BytesLike, *, durable: bool = False) -> None:
        """Replace the whole object atomically; with ``durable`` it is on stable storage
        (fsync / completed PUT) when this returns."""

    def put_versioned(self, key: str, data: BytesLike, *, durable: bool = False) -> Version | None:
        """:meth:`put`, and the version (:meth:`versions`) of the object it put: None where
        the backend keeps none. A backend that can tell its own object's version, whatever
        another process puts at ``key`` right after, overrides this."""
        self.put(key, data, durable=durable)
        try:
            got = self.versions([key])
        except Exception:  # (the put stands: a commit takes the object as the one put)
            return None
        return None if got is None else got[0]

    def put_new(self, key: str, data: BytesLike, *, durable: bool = False) -> Version | None:
        """:meth:`put_versioned` of an object that must not exist yet: raise
        :class:`~strataio.errors.ExistsError`, putting nothing, where one does. Atomic where
        the backend can make it so (POSIX: a hard link, which fails on a name taken; memory:
        under its lock); here, the check and the put are two steps."""
        if self.exists(key):
            raise ExistsError(f"object {key!r} exists already")
        return self.put_versioned(key, data, durable=durable)

    def object_versions(self, keys: Sequence[str]) -> list[Version | None] | None:
        """The versions that :meth:`put_if`, :meth:`delete_if` and the versions puts return
        compare (None: the backend keeps none): :meth:`versions`, but for a backend whose
        reads take no versions while its store keeps them (a cost model over a directory),
        its store's. Processes sharing objects check each other's puts and deletes by
        these."""
        return self.versions(keys)

    def put_if(
        self, key: str, data: BytesLike, version: Version | None, *, durable: bool = False
    ) -> Version | None:
        """:meth:`put_versioned` only while the object is still at ``version``
        (:meth:`object_versions`; None: while there is none): else raise
        :class:`~strataio.errors.ExistsError`, putting nothing. A backend that keeps no
        versions puts. Atomic where the backend can make it so (POSIX: the check and the
        rename under the folder's lock); here, the check and the put are two steps."""
        now = self.object_versions([key])
        if now is not None and now != [version]:
            raise ExistsError(f"object {key!r} changed since it was looked at")
        return self.put_versioned(key, data, durable=durable)

    def delete_if(self, key: str, version: Version) -> bool:
        """Delete the object if it is still at ``version`` (:meth:`object_versions`); True if
        it was deleted. The look and the delete are two steps (a rename aside to make them one
        would change the version of an object put back)."""
        if self.object_versions([key]) != [version]:
            return False
        self.delete(key)
        return True

    def delete_if_many(self, keys: Sequence[str], versions: Sequence[Version]) -> list[bool]:
        """:meth:`delete_if` of each key at its version, in one call (a backend with a
        latency per request runs them at once)."""
        return [self.delete_if(k, v) for k, v in zip(keys, versions, strict=True)]

    @abc.abstractmethod
    def size(self, key: str) -> int: ...

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; a missing object is not an error."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys under ``prefix`` (a key prefix ending at a ``/`` boundary, or ``""``)."""

    def remove_empty_folders(self, prefix: str) -> int:
        """Remove the folders found empty under ``prefix`` (a key prefix at a ``/``
        boundary, such as a dataset's name: never ``""``), deepest first, ``prefix``'s own
        folder included; never a folder above it, nor the root. Returns how many went.

        Only what is empty goes, each folder in one step that fails on one holding anything
        (POSIX ``rmdir``): an object put meanwhile keeps its folder, and a put that finds
        its folder gone makes it again. A folder that cannot be removed (not empty, gone
        already, refused) is left, never an error: it holds no object. A backend without
        folders (an object store, memory) has none to remove."""
        validate_key(prefix.rstrip("/"))
        return 0

    def key_problem(self, key: str) -> str:
        """Why ``key`` can name no object here, in words naming the limit it is over (a path
        or key too long for the storage), or "" where it can: this default knows no
        limit."""
        return ""

    def sync(self, keys: Iterable[str] | None = None) -> None:  # noqa: B027 - optional hook
        """Make earlier writes to ``keys`` (all, when None) durable."""

    def versions(self, keys: Sequence[str]) -> list[Version | None] | None:
        """Per key, a token that changes whenever the object does (None for a missing object),
        or None when this backend keeps no versions. A token's last element is the time of the
        object's last change, in ns since the epoch on the host's clock.

        Tokens let a reader keep objects in memory between reads and know when they went stale
        (:mod:`strataio.arrays.chunk_cache`).
        """
        return None

    def readinto_range(
        self, key: str, offset: int, out: memoryview, *, nowait: bool = False
    ) -> int:
        """Read ``len(out)`` bytes from ``offset`` of ``key`` into ``out``; return the object's
        size. Bytes past the end read as zeros.

        With ``nowait``, raise :class:`BlockingIOError` instead of waiting on slow storage
        (a POSIX file not in the page cache, any request with latency), so a caller can serve
        cached data on its own thread and hand the rest to I/O threads. A backend that has
        started fetching the bytes in the background raises it with ``errno`` EINPROGRESS: a
        blocking read of the same range then waits only for what has not arrived yet, and the
        caller may as well make it on its own thread, after starting the others.
        """
        if nowait and self.capabilities.latency > 0:
            raise BlockingIOError(key)
        data = memoryview(self.read(key, Extents.single(offset, len(out)))).cast("B")
        out[: len(data)] = data
        return self.size(key)

    def readinto_range_versioned(
        self, key: str, offset: int, out: memoryview, *, nowait: bool = False
    ) -> tuple[int, Version | None]:
        """:meth:`readinto_range`, and the version (:meth:`versions`) of the object the bytes
        came from: None unless the object had one version before and after the read (this
        default cannot tell which object a read reached; POSIX asks the descriptor read)."""
        before = self.versions([key])
        size = self.readinto_range(key, offset, out, nowait=nowait)
        after = self.versions([key])
        if before is None or after is None or before[0] != after[0]:
            return size, None
        return size, after[0]

    def readinto_ranges_versioned(
        self,
        keys: Sequence[str],
        offsets: Sequence[int],
        outs: Sequence[memoryview],
        *,
        nowait: bool = False,
    ) -> list[tuple[int, Version | None] | Exception]:
        """:meth:`readinto_range_versioned` of each key into its ``out``, in one call: per
        key its result or the exception it raised (a missing object, a read that would wait,
        a failure), so that one key's outcome stops none of the others. Backends that pay a
        fixed cost per call (POSIX: several Python calls per file) read the batch in one
        loop."""
        check_batch(keys, offsets, outs)
        got: list[tuple[int, Version | None] | Exception] = []
        for key, offset, out in zip(keys, offsets, outs):
            try:
                got.append(self.readinto_range_versioned(key, offset, out, nowait=nowait))
            except Exception as exc:
                got.append(exc)
        return got

    def get_many(self, keys: Iterable[str]) -> list[BytesLike | None]:
        """Whole objects for ``keys``, None where missing. Backends may overlap the requests."""
        out: list[BytesLike | None] = []
        for k in keys:
            try:
                out.append(self.get(k))
            except FileNotFoundError:
                out.append(None)
        return out

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and descriptors; the backend is unusable afterwards."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
