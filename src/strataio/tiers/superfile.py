"""Superfiles on the storage hierarchy: many small members, few containers, one index each.

A :class:`Superfile` is a catalogued dataset whose chunks are containers
(:mod:`strataio.storage.superfile`): ``put`` appends a member to the open container, which is
sealed -- put durably on the tier its hint names, then recorded in the catalog with its
checksum, through the same :class:`~strataio.tiers.store.TieredChunkStore` and
:class:`~strataio.tiers.commit.Commit` every chunk goes through -- when it reaches
``container_bytes``, at :meth:`Superfile.flush` and at :meth:`Superfile.close`. A member is
therefore durable once its container is sealed, as a buffered write is once flushed; a crash
loses the open container's members, never a sealed one's, and never returns wrong bytes.

The first read of a member brings its whole container into memory (checked against the
catalogued checksum, then its index and the member's own CRC-32C); later reads of any member
of that container are served from memory. Containers live in the session's prefetch cache
(:class:`~strataio.tiers.cache.ChunkCache`, a bounded LRU), so memory stays within its capacity
however many members are read; an evicted container is read again when next needed.

Which container holds a name: containers are numbered in the order they were sealed, and a
later container's entry for a name supersedes an earlier one's. A superfile opened again knows
its containers from the catalog but not yet their indexes: a ``get`` reads the containers
newer than what it already knows, newest first, until it finds the name (each read whole,
which the read needs anyway); :meth:`Superfile.members` reads only each container's index
(the tail of the object, one ranged read per container).

Any number of processes may read a superfile and append to it at once: each sealed
container takes a number of its own from the superfile's catalog record
(:meth:`Superfile._take_seq`), so a member put by two reads as the one whose container took
its number last. In an MPI job each rank opens its own (single-process)
:class:`~strataio.session.Session` to use one.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from strataio.catalog.base import DatasetRecord
from strataio.errors import StrataError
from strataio.layout.extents import Extents
from strataio.storage.base import BytesLike
from strataio.storage.superfile import (
    ContainerBuilder,
    ContainerIndex,
    Member,
    MemberNotFoundError,
    SuperfileError,
    SuperfileIndexError,
    decode_member,
    encode_member,
    member_bytes,
    read_index,
    read_index_tail,
)
from strataio.tiers.mover import MoveHandle
from strataio.tiers.residency import object_key
from strataio.tiers.store import TieredChunkStore
from strataio.tiers.tier import checksum

__all__ = [
    "DEFAULT_CONTAINER_BYTES",
    "SUPERFILE_ATTR",
    "Superfile",
    "container_key",
    "is_superfile",
    "superfile_record",
]

#: Containers close at this many bytes of members. Measured with ``strataio bench superfile
#: --sweep 1MiB,4MiB,16MiB,64MiB`` (BENCHMARKS.md): reading 1000 members of 64 KiB costs, on
#: the shaped remote disk (``remote_disk_2002``: 1.05 s per request, 0.309 MB/s), 7 % more
#: with 4 MiB containers than with one 64 MiB container and 1.5 % more with 16 MiB; on the
#: shaped tape (6.6 s per mount) 45 % and 9 % more. Past 16 MiB the gain is small while a
#: first read waits for the whole container and takes more of the prefetch cache (256 MiB by
#: default: sixteen 16 MiB containers).
DEFAULT_CONTAINER_BYTES = 16 << 20
#: the dataset attribute that marks a catalogued dataset as a superfile
SUPERFILE_ATTR = "strataio.superfile"
#: the record annotation naming the next container number no writer has taken yet
NEXT_ATTR = "strataio.superfile.next"
_PREFIX = "sf/"
#: bytes read from a container's end to find its index in one request (most indexes fit)
_TAIL_BYTES = 64 << 10


def container_key(seq: int) -> str:
    """The chunk key of container number ``seq``."""
    return f"{_PREFIX}{seq:08d}"


def container_seq(key: str) -> int | None:
    """The number of the container whose chunk key ``key`` is (None: no container's)."""
    if key.startswith(_PREFIX) and key[len(_PREFIX) :].isdigit():
        return int(key[len(_PREFIX) :])
    return None


def is_superfile(record: DatasetRecord) -> bool:
    """True if the catalogued dataset ``record`` is a superfile."""
    try:
        attrs = json.loads(record.attrs)
    except ValueError:
        return False
    return isinstance(attrs, dict) and SUPERFILE_ATTR in attrs


def superfile_record(name: str, hint: str, container_bytes: int) -> DatasetRecord:
    """The catalog row of a new superfile (a dataset of containers, no array shape)."""
    attrs = {SUPERFILE_ATTR: {"version": 1, "container_bytes": int(container_bytes)}}
    return DatasetRecord(name, (0,), "|u1", (1,), "[]", hint, json.dumps(attrs, sort_keys=True))


def record_container_bytes(record: DatasetRecord) -> int:
    """The container size a superfile was created with."""
    info = json.loads(record.attrs).get(SUPERFILE_ATTR, {})
    return int(info.get("container_bytes", DEFAULT_CONTAINER_BYTES))


class Superfile:
    """Named small members (bytes or numpy arrays) packed into containers on the hierarchy.

    Made by :meth:`strataio.Session.superfile`. ``mode`` ``"r"`` reads; ``"a"`` also puts.
    ``put(name, value)`` stores a member (a name put again is replaced); ``get(name)`` returns
    it as put (bytes, or an array of its dtype and shape); ``members()`` lists the names;
    ``flush()`` makes every member put so far durable; ``close()`` flushes and releases the
    superfile. Thread-safe; processes appending at once each seal containers of their own
    numbers (a member put in both reads as the one sealed last).
    """

    def __init__(self, store: TieredChunkStore, *, mode: str, container_bytes: int) -> None:
        if mode not in ("r", "a"):
            raise SuperfileError(f"superfile mode must be 'r' or 'a', got {mode!r}")
        if container_bytes <= 0:
            raise SuperfileError(f"container_bytes must be positive, got {container_bytes}")
        self.name = store.name
        self.mode = mode
        self.container_bytes = int(container_bytes)
        self._store = store
        self._cache = store.cache
        self._lock = threading.RLock()
        seqs = sorted(s for k in store.list_chunks() if (s := container_seq(k)) is not None)
        self._unindexed = set(seqs)
        self._sealed = set(seqs)
        self._next = seqs[-1] + 1 if seqs else 0
        self._directory: dict[str, tuple[int, Member]] = {}
        self._open: ContainerBuilder | None = None
        self._closed = False

    # ----------------------------------------------------------------- writes
    def put(self, name: str, value: Any) -> None:
        """Store ``value`` (bytes-like or numpy array) as member ``name``; durable once its
        container is sealed (at ``container_bytes``, :meth:`flush` or :meth:`close`). Where
        the container it fills is stored on no tier (all full, say), raises and ``name`` is
        not put; the members put before it wait in the open container for the next seal."""
        self._check_open()
        if self.mode != "a":
            raise SuperfileError(f"superfile {self.name!r} is open read-only")
        if not isinstance(name, str) or not name:
            raise SuperfileError(f"superfile {self.name!r}: a member name is a non-empty str")
        data, dtype, shape = encode_member(value)
        with self._lock:
            if self._open is None:
                self._open = ContainerBuilder()
            mark = self._open.mark(name)
            self._open.add(name, data, dtype, shape)
            if self._open.nbytes >= self.container_bytes:
                self._seal(undo=functools.partial(self._open.undo, name, mark))

    def flush(self) -> None:
        """Seal the open container: every member put so far is then durable and catalogued."""
        self._check_open()
        with self._lock:
            if self._open is not None and len(self._open):
                self._seal()

    def _seal(self, undo: Callable[[], None] | None = None) -> None:
        """Seal the open container; where it is stored on no tier, ``undo`` (the put that
        filled it) is called before the error is raised, and the container stays open."""
        assert self._open is not None
        blob, index = self._open.seal()
        try:
            seq = self._take_seq()
            key = container_key(seq)
            # durable on its tier and checksummed before the catalog names it (Commit.apply)
            self._store.put_chunks([(key, blob)])
        except BaseException:
            if undo is not None:
                undo()
            raise
        self._store.flush()
        self._next = seq + 1
        self._sealed.add(seq)
        self._add_index(seq, index)
        self._open = None

    def _take_seq(self) -> int:
        """A container number no writer of the catalog has taken: the superfile's record
        counts them (:data:`NEXT_ATTR`), so two processes appending at once never seal one
        container over the other's."""
        catalog = self._store.commit.catalog
        if catalog is None:
            return self._next

        def take(value: Any) -> int:
            known = value if isinstance(value, int) and not isinstance(value, bool) else 0
            return max(known, self._next) + 1

        return int(catalog.annotate_dataset(self.name, NEXT_ATTR, take)) - 1

    # ----------------------------------------------------------------- reads
    def get(self, name: str) -> bytes | np.ndarray:
        """Member ``name`` as it was put; :class:`MemberNotFoundError` if there is none, and
        :class:`SuperfileIndexError` (naming the container and the member) if its container
        is not whole."""
        self._check_open()
        with self._lock:
            if self._open is not None:
                got = self._open.get(name)
                if got is not None:
                    return got
            seq, member = self._locate(name)
            key = container_key(seq)
            blob = self._container(seq)
        return decode_member(member, member_bytes(blob, member, self._where(key)))

    def __getitem__(self, name: str) -> bytes | np.ndarray:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            with self._lock:
                if self._open is not None and name in set(self._open):
                    return True
                self._locate(name)
        except MemberNotFoundError:
            return False
        return True

    def members(self) -> list[str]:
        """Every member name, sorted (reads the index of each container not yet known)."""
        self._check_open()
        with self._lock:
            for seq in sorted(self._unindexed, reverse=True):
                self._index_tail(seq)
            names = set(self._directory)
            if self._open is not None:
                names.update(self._open)
        return sorted(names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.members())

    def __len__(self) -> int:
        return len(self.members())

    def containers(self) -> list[str]:
        """Chunk keys of the sealed containers, oldest first."""
        with self._lock:
            return [container_key(s) for s in sorted(self._sealed)]

    def _locate(self, name: str) -> tuple[int, Member]:
        """The newest sealed container holding ``name`` and its entry there."""
        hit = self._directory.get(name)
        newer = sorted((s for s in self._unindexed if hit is None or s > hit[0]), reverse=True)
        for seq in newer:
            self._container(seq)  # read whole: it indexes the container as well
            got = self._directory.get(name)
            if got is not None and got[0] == seq:
                return got
        if hit is None:
            raise MemberNotFoundError(f"superfile {self.name!r} has no member {name!r}")
        return hit

    def _container(self, seq: int) -> BytesLike:
        """Container ``seq`` whole, from the prefetch cache where what it holds is the
        container's catalogued bytes (a superfile deleted and made again under its name by
        another process reuses the container keys), else from its fastest intact copy."""
        key = container_key(seq)
        blob = self._cache.get_many(self.name, [key], self._store.res.names_bytes)[0]
        if blob is None:
            got = self._store.get_chunks([key])[0]  # checked against the catalogued checksum
            if got is None:
                raise MemberNotFoundError(
                    f"superfile {self.name!r}: container {key!r} has no copy; run 'strataio fsck'"
                )
            blob = bytes(got)
            self._cache.put(self.name, key, blob, checksum(blob))
        if seq in self._unindexed:
            self._add_index(seq, read_index(blob, self._where(key)))
        return blob

    def _index_tail(self, seq: int) -> None:
        """Index container ``seq`` from the end of its fastest readable copy (one or two
        ranged reads); from the whole container where no copy can be read in part."""
        key = container_key(seq)
        where = self._where(key)
        cached = self._cache.get(self.name, key) is not None
        for copy in [] if cached else self._store.res.readable(key):
            tier = self._store.tiers[copy.tier]
            if tier.role == "remotetape":
                break  # an archive pays a mount per request: read it whole (staged) instead
            obj = object_key(self.name, key)
            size, want = copy.nbytes, min(copy.nbytes, _TAIL_BYTES)
            try:
                for _ in range(2):
                    tail = tier.call(tier.backend.read, obj, Extents.single(size - want, want))
                    got = read_index_tail(tail, size, where)
                    if isinstance(got, ContainerIndex):
                        self._add_index(seq, got)
                        return
                    want = min(size, got)
            except SuperfileIndexError:
                raise
            except (OSError, StrataError):
                continue  # that copy is unreadable: try the next, then the whole read
        self._container(seq)  # indexes it from the whole bytes

    def _add_index(self, seq: int, index: ContainerIndex) -> None:
        for m in index.members:
            cur = self._directory.get(m.name)
            if cur is None or cur[0] <= seq:
                self._directory[m.name] = (seq, m)
        self._unindexed.discard(seq)

    def _where(self, key: str) -> str:
        return f"{key!r} of superfile {self.name!r}"

    # ----------------------------------------------------------------- moves
    def prefetch(self) -> MoveHandle:
        """Read every sealed container into the memory level (asynchronously)."""
        self._check_open()
        return self._store.prefetch(self.containers())

    def stage(self, to: str | None = None) -> MoveHandle:
        """Copy every sealed container to tier ``to`` (default: the fastest disk tier)."""
        self.flush()
        return self._store.stage(self.containers(), to)

    def migrate(self, to: str | None = None) -> MoveHandle:
        """Move every sealed container to tier ``to`` (default: the slowest tier); their
        copies on faster tiers are deleted once the move is committed."""
        self.flush()
        target = to if to is not None else self._store.placement.persistent()[-1].name
        return self._store.migrate(self.containers(), target)

    def evict(self, tier: str | None = None) -> MoveHandle:
        """Drop the containers' copies on ``tier`` (default: the fastest), writing back first
        any container whose only copy is there."""
        self.flush()
        name = tier if tier is not None else self._store.placement.persistent()[0].name
        return self._store.evict(self.containers(), name)

    @property
    def store(self) -> TieredChunkStore:
        """The chunk store of the containers (their residency, tiers and placement)."""
        return self._store

    # ----------------------------------------------------------------- lifecycle
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Seal the open container, commit, and release the superfile. Idempotent."""
        if self._closed:
            return
        try:
            if self.mode == "a":
                self.flush()
        finally:
            self._closed = True
            self._store.close()

    def _check_open(self) -> None:
        if self._closed:
            raise SuperfileError(f"superfile {self.name!r} is closed")

    def __enter__(self) -> Superfile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.mode
        return f"Superfile({self.name!r}, {state}, containers={len(self._sealed)})"
