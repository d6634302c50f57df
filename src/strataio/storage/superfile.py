"""Superfile containers: many small members packed into one object, with an index.

A superfile (SRB-OL's optimisation for many small files on remote storage, the multi-storage
paper's §5 and Figure 10(c)) writes small objects -- one image per iteration -- into a few
large containers, so reading them back pays the per-request cost of a remote tier once per
container instead of once per member. This module is the container format alone, with no
notion of tiers or catalogs (:mod:`strataio.tiers.superfile` stores containers on the
hierarchy).

Layout of one container (all integers little-endian)::

    member bytes, back to back
    index: UTF-8 JSON {"version": 1, "members": [[name, offset, nbytes, crc32c, dtype, shape]]}
    footer (32 bytes): magic b"STRSUPF1" | index offset u64 | index nbytes u64
                       | index crc32c u32 | member count u32

``dtype`` / ``shape`` are None for a member put as bytes, else the numpy array's ``dtype.str``
and shape (the member's bytes are its C-order data). A name may appear more than once; the
last entry wins (a member put again before its container was sealed). Members never overlap
the index or footer, and every member's CRC-32C is in the index, so a reader and ``fsck`` can
tell a container that is whole from one that is not (:func:`check_container`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import crc32c
import numpy as np

from strataio.errors import NotFoundError, StrataError
from strataio.storage.base import BytesLike

__all__ = [
    "FOOTER_BYTES",
    "MAGIC",
    "ContainerBuilder",
    "ContainerIndex",
    "ContainerProblem",
    "Member",
    "MemberNotFoundError",
    "SuperfileError",
    "SuperfileIndexError",
    "check_container",
    "decode_member",
    "encode_member",
    "parse_footer",
    "read_index",
]

MAGIC = b"STRSUPF1"
_FOOTER = struct.Struct("<8sQQII")
FOOTER_BYTES = _FOOTER.size  # 32
INDEX_VERSION = 1


class SuperfileError(StrataError):
    """A superfile cannot do what was asked (wrong mode, not a superfile, closed)."""


class SuperfileIndexError(SuperfileError):
    """A container's footer or index is unreadable, or a member's bytes do not match the index
    (out of bounds, checksum mismatch). The message names the container and the member."""


class MemberNotFoundError(SuperfileError, NotFoundError):
    """No member of that name was ever put in the superfile (or its container was lost)."""


def _crc(data: BytesLike) -> int:
    return crc32c.crc32c(memoryview(data).cast("B"))


@dataclass(frozen=True, slots=True)
class Member:
    """One index entry: ``nbytes`` bytes at ``offset`` of its container, CRC-32C ``crc``;
    ``dtype`` / ``shape`` describe an array member (None for bytes)."""

    name: str
    offset: int
    nbytes: int
    crc: int
    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    def row(self) -> list[Any]:
        return [self.name, self.offset, self.nbytes, self.crc, self.dtype, self.shape]


def encode_member(value: Any) -> tuple[memoryview, str | None, tuple[int, ...] | None]:
    """The bytes to store for ``value`` (bytes-like or numpy array) and its dtype / shape."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise SuperfileError(f"cannot store an array of dtype {value.dtype} (object)")
        if np.dtype(value.dtype.str) != value.dtype:  # (a structured dtype: its fields)
            raise SuperfileError(
                f"cannot store an array of dtype {value.dtype}: the index keeps a member's "
                f"dtype as its string {value.dtype.str!r}, which would read back without "
                "its fields; put each field as an array of its own, or the array's bytes"
            )
        arr = np.asarray(value, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
        return memoryview(arr.reshape(-1).view(np.uint8)), arr.dtype.str, tuple(arr.shape)
    if isinstance(value, bytes | bytearray | memoryview):
        mv = memoryview(value)
        if not mv.c_contiguous:  # (a strided view: its bytes in C order, as bytes() gives)
            mv = memoryview(mv.tobytes())
        return mv.cast("B"), None, None
    raise SuperfileError(
        f"a superfile member is bytes or a numpy array, not {type(value).__name__}"
    )


def decode_member(member: Member, data: BytesLike) -> bytes | np.ndarray:
    """The value ``member`` was put as: bytes, or a (read-only) array of its dtype and shape."""
    if member.dtype is None:
        return bytes(data)
    arr = np.frombuffer(data, dtype=np.dtype(member.dtype))
    return arr.reshape(member.shape if member.shape is not None else (-1,))


@dataclass(frozen=True, slots=True)
class ContainerIndex:
    """The index of one container: its members (last entry of a name wins) and where the
    index starts (the end of the member bytes)."""

    members: tuple[Member, ...]
    data_end: int

    def latest(self) -> dict[str, Member]:
        """Name -> the member's last entry."""
        return {m.name: m for m in self.members}


def parse_footer(tail: BytesLike, size: int, where: str) -> tuple[int, int, int, int]:
    """``(index offset, index nbytes, index crc, count)`` from the last bytes ``tail`` of a
    container of ``size`` bytes; :class:`SuperfileIndexError` naming ``where`` if malformed."""
    tail = memoryview(tail).cast("B")
    if size < FOOTER_BYTES or len(tail) < FOOTER_BYTES:
        raise SuperfileIndexError(f"container {where}: {size} bytes, too short for a footer")
    magic, off, n, crc, count = _FOOTER.unpack(tail[-FOOTER_BYTES:])
    if magic != MAGIC:
        raise SuperfileIndexError(f"container {where}: no superfile footer (magic {magic!r})")
    if off + n + FOOTER_BYTES != size:
        raise SuperfileIndexError(
            f"container {where}: index at {off}+{n} does not end at the footer ({size} bytes)"
        )
    return off, n, crc, count


def _parse_index(raw: BytesLike, crc: int, count: int, data_end: int, where: str) -> ContainerIndex:
    if _crc(raw) != crc:
        raise SuperfileIndexError(f"container {where}: index fails its checksum")
    try:
        doc = json.loads(bytes(raw))
        if doc.get("version") != INDEX_VERSION:
            raise ValueError(f"index version {doc.get('version')!r}")
        members = tuple(
            Member(
                str(r[0]),
                int(r[1]),
                int(r[2]),
                int(r[3]),
                None if r[4] is None else str(r[4]),
                None if r[5] is None else tuple(int(x) for x in r[5]),
            )
            for r in doc["members"]
        )
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise SuperfileIndexError(f"container {where}: malformed index ({exc})") from None
    if len(members) != count:
        raise SuperfileIndexError(
            f"container {where}: index lists {len(members)} members, footer says {count}"
        )
    for m in members:
        if m.offset < 0 or m.nbytes < 0 or m.offset + m.nbytes > data_end:
            raise SuperfileIndexError(
                f"container {where}: member {m.name!r} at {m.offset}+{m.nbytes} lies outside "
                f"the member bytes [0, {data_end})"
            )
    return ContainerIndex(members, data_end)


def read_index(blob: BytesLike, where: str) -> ContainerIndex:
    """The index of a whole container ``blob``, checked (footer, index checksum, every member
    within the member bytes); :class:`SuperfileIndexError` naming ``where`` if not."""
    mv = memoryview(blob).cast("B")
    off, n, crc, count = parse_footer(mv, len(mv), where)
    return _parse_index(mv[off : off + n], crc, count, off, where)


def read_index_tail(tail: BytesLike, size: int, where: str) -> ContainerIndex | int:
    """The index from the last ``len(tail)`` bytes of a container of ``size`` bytes, or the
    number of tail bytes needed when ``tail`` does not reach back to the index start."""
    mv = memoryview(tail).cast("B")
    off, n, crc, count = parse_footer(mv, size, where)
    need = n + FOOTER_BYTES
    if len(mv) < need:
        return need
    start = len(mv) - need
    return _parse_index(mv[start : start + n], crc, count, off, where)


def member_bytes(blob: BytesLike, member: Member, where: str) -> memoryview:
    """``member``'s bytes in container ``blob``, checked against its CRC-32C."""
    data = memoryview(blob).cast("B")[member.offset : member.offset + member.nbytes]
    if len(data) != member.nbytes or _crc(data) != member.crc:
        raise SuperfileIndexError(
            f"container {where}: member {member.name!r} fails its checksum "
            f"(index says {member.crc:08x}, bytes give {_crc(data):08x})"
        )
    return data


@dataclass(frozen=True, slots=True)
class ContainerProblem:
    """What is wrong with a container: ``kind`` is ``"index"`` (footer or index unreadable),
    ``"bounds"`` (a member outside the member bytes) or ``"checksum"`` (a member's bytes differ
    from its CRC); ``member`` names the member where one is concerned."""

    kind: str
    detail: str
    member: str | None = None


def check_container(blob: BytesLike, where: str) -> list[ContainerProblem]:
    """Every problem of container ``blob`` (empty: it is whole). Unlike :func:`read_index`,
    members are each checked, and a member out of bounds does not hide the others."""
    mv = memoryview(blob).cast("B")
    try:
        off, n, crc, count = parse_footer(mv, len(mv), where)
        if _crc(mv[off : off + n]) != crc:
            return [ContainerProblem("index", f"container {where}: index fails its checksum")]
        doc = json.loads(bytes(mv[off : off + n]))
        rows = doc["members"]
        if len(rows) != count:
            raise SuperfileIndexError(f"container {where}: index and footer disagree on count")
    except (SuperfileIndexError, ValueError, TypeError, KeyError) as exc:
        return [ContainerProblem("index", str(exc))]
    out: list[ContainerProblem] = []
    for r in rows:
        try:
            m = Member(str(r[0]), int(r[1]), int(r[2]), int(r[3]))
        except (ValueError, TypeError, IndexError):
            out.append(ContainerProblem("index", f"container {where}: malformed entry {r!r}"))
            continue
        if m.offset < 0 or m.nbytes < 0 or m.offset + m.nbytes > off:
            out.append(
                ContainerProblem(
                    "bounds",
                    f"member at {m.offset}+{m.nbytes} lies outside the member bytes [0, {off})",
                    m.name,
                )
            )
        elif _crc(mv[m.offset : m.offset + m.nbytes]) != m.crc:
            out.append(ContainerProblem("checksum", f"fails its checksum {m.crc:08x}", m.name))
    return out


class ContainerBuilder:
    """An open container being filled in memory: :meth:`add` members, then :meth:`seal`."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._members: list[Member] = []
        self._latest: dict[str, Member] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of member data so far (the sealed container adds the index and footer)."""
        return len(self._buf)

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[str]:
        return iter(self._latest)

    def add(self, name: str, data: BytesLike, dtype: str | None, shape: Any) -> Member:
        mv = memoryview(data).cast("B")
        m = Member(name, len(self._buf), len(mv), _crc(mv), dtype, shape)
        self._buf += mv
        self._members.append(m)
        self._latest[name] = m
        return m

    def mark(self, name: str) -> tuple[int, int, Member | None]:
        """Where the container stands before ``name`` is added: :meth:`undo` returns there."""
        return len(self._buf), len(self._members), self._latest.get(name)

    def undo(self, name: str, mark: tuple[int, int, Member | None]) -> None:
        """Take back what was added since :meth:`mark` (``name``'s entry last among it)."""
        nbytes, count, before = mark
        del self._buf[nbytes:]
        del self._members[count:]
        if before is None:
            self._latest.pop(name, None)
        else:
            self._latest[name] = before

    def get(self, name: str) -> bytes | np.ndarray | None:
        """The value of ``name`` put into this container (None if none)."""
        m = self._latest.get(name)
        if m is None:
            return None
        return decode_member(m, bytes(self._buf[m.offset : m.offset + m.nbytes]))

    def seal(self) -> tuple[bytes, ContainerIndex]:
        """The container's bytes (members, index, footer) and its index."""
        raw = json.dumps(
            {"version": INDEX_VERSION, "members": [m.row() for m in self._members]},
            separators=(",", ":"),
        ).encode()
        off = len(self._buf)
        footer = _FOOTER.pack(MAGIC, off, len(raw), _crc(raw), len(self._members))
        return bytes(self._buf) + raw + footer, ContainerIndex(tuple(self._members), off)
