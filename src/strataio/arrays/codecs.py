"""The chunk codec pipeline, in Zarr v3 terms: one array→bytes codec (``bytes``, with its
endianness) followed by bytes→bytes codecs (``zstd``, ``blosc``, ``gzip``, ``crc32c``; ``lz4``
is written as ``blosc`` with ``cname: lz4``, the form every Zarr v3 reader knows).

Compression runs through numcodecs; ``crc32c`` appends a little-endian CRC-32C of the encoded
bytes, as the Zarr v3 spec defines, and a mismatch on decode raises :class:`ChecksumError`.
A compressed chunk decodes to its chunk's size or raises :class:`CodecError`: the size its
header declares (zstd, blosc) is checked before anything is allocated, a zstd frame that
declares none and a gzip stream are inflated no further than that size. A compressor after
another (``"zstd+zstd"``, ``"crc32c+gzip"``) decodes to no more than the codecs before it can
encode a chunk to (a zstd frame declaring more, or a blosc header, is refused unread).

A stored chunk of the wrong size for this array (a plain chunk whose object is not
:attr:`CodecPipeline.stored_nbytes` long, a chunk that decodes, or declares it decodes, to
another size than the chunk's) raises :class:`ChecksumError` where the pipeline has a
checksum codec (``crc32c``), as a chunk failing its checksum does: such bytes cannot be what
this array wrote, and code that catches :class:`ChecksumError` to find corruption finds them
whichever check saw it first. Without a checksum codec it is a :class:`CodecError` (nothing
tells a damaged chunk from one of another array's), as is any other chunk its codecs cannot
decode (:meth:`CodecPipeline.size_error`).
"""

from __future__ import annotations

import math
import numbers
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from crc32c import crc32c

from strataio.errors import ChecksumError, CodecError

_SYSTEM_ENDIAN = sys.byteorder  # "little" on every platform we target
_BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
_BYTES_CODECS = ("zstd", "blosc", "gzip", "crc32c")
#: what a ``zarr.json`` may name, in the words of an error that names a codec it may not
READABLE = (
    f"strataio reads the codecs bytes, {', '.join(_BYTES_CODECS)}, alone or inside sharding_indexed"
)

#: The most bytes one chunk may hold (``prod(chunk_shape) * itemsize``: the array bytes its
#: codecs encode), and one shard and one shard index. Each is held whole in one buffer while
#: it is encoded, decoded or checksummed (a write of a shard makes the whole shard), and a
#: collective call moves at most this many bytes (one MPI count, a C int) to or from one
#: rank, so a larger chunk could never reach, whole, the rank that writes it. The number is
#: INT_MAX, that count; blosc takes 16 bytes less (:data:`BLOSC_MAX_BYTES`). A chunk of
#: gigabytes is a chunk shape given by mistake (``chunks=None``, the whole array as one
#: chunk, say): a larger one is refused where the array is created or opened, not left to
#: fail on its first read or write with numpy's MemoryError or ValueError.
MAX_CHUNK_BYTES = 2**31 - 1
#: The most bytes blosc (and lz4, stored as blosc) compresses in one buffer: c-blosc refuses
#: more than INT_MAX less its 16-byte header (``BLOSC_MAX_BUFFERSIZE``), and numcodecs
#: then fails with a bare RuntimeError or ValueError.
BLOSC_MAX_BYTES = MAX_CHUNK_BYTES - 16


def _numcodecs() -> Any:
    """numcodecs, imported at its first use: a process whose chunks are stored raw or with
    ``crc32c`` never pays for its import (about a quarter of a second: it loads every
    compressor it has)."""
    import numcodecs
    import numcodecs.blosc

    return numcodecs


def _numcodecs_loaded() -> Any:
    """numcodecs where it is imported, else None (then no codec of it exists to test)."""
    return sys.modules.get("numcodecs")


CodecSpec = dict[str, Any]

#: The ``configuration`` keys of each codec strataio reads (as the Zarr v3 codec specs define
#: them; an unknown key may change what the codec does, so it is refused, as TensorStore and
#: zarr-python refuse it).
CODEC_KEYS = {
    "bytes": frozenset({"endian"}),
    "zstd": frozenset({"level", "checksum"}),
    "gzip": frozenset({"level"}),
    "blosc": frozenset({"typesize", "cname", "clevel", "shuffle", "blocksize"}),
    "crc32c": frozenset(),
    "sharding_indexed": frozenset({"chunk_shape", "codecs", "index_codecs", "index_location"}),
}
#: The ``configuration`` keys a codec's Zarr v3 spec requires (blosc's ``typesize`` too,
#: unless ``shuffle`` is ``"noshuffle"``: :func:`missing_keys`)
REQUIRED_KEYS = {
    "zstd": ("level",),
    "gzip": ("level",),
    "blosc": ("cname", "clevel", "shuffle", "blocksize"),
}
#: The compressors the Zarr v3 blosc codec names (one this build of c-blosc lacks is refused
#: apart: a name another reader may know)
_BLOSC_CNAMES = ("blosclz", "lz4", "lz4hc", "snappy", "zlib", "zstd")
#: compression levels the Zarr v3 codec specs allow, (lowest, highest)
_ZSTD_LEVELS = (-131072, 22)
_LEVELS_0_9 = (0, 9)


def _spec(name: str, **config: Any) -> CodecSpec:
    return {"name": name, "configuration": config} if config else {"name": name}


def normalize_codecs(codec: Any, dtype: np.dtype) -> list[CodecSpec]:
    """Zarr v3 codec metadata for a user's ``codec`` argument.

    ``codec`` is None / ``"none"`` (raw little-endian bytes), a name (``"zstd"``), names joined
    by ``+`` (``"zstd+crc32c"``), a list of names or Zarr v3 codec dicts, or a full Zarr v3
    ``codecs`` list starting with ``bytes``. A big-endian ``dtype`` selects ``endian: big``.

    Each codec and its configuration are checked here, before anything is stored: a member
    beside ``name``, ``configuration`` and ``must_understand``, a key its codec's spec does
    not define, or a value of the wrong type or outside what the Zarr v3 spec allows
    (zstd ``level`` -131072 to 22, gzip ``level`` and blosc ``clevel`` 0 to 9, blosc
    ``cname``, ``shuffle``, ``typesize``, ``blocksize``), raises :class:`CodecError` naming
    the codec and the field; so does one that numcodecs refuses on a trial encode.
    """
    endian = "big" if dtype.byteorder == ">" else "little"
    if codec is None:
        items: list[Any] = []
    elif isinstance(codec, str):
        items = [] if codec.strip().lower() in ("", "none", "raw") else codec.split("+")
    elif isinstance(codec, dict):
        items = [codec]
    elif isinstance(codec, Sequence):
        items = list(codec)
    else:
        raise CodecError(
            f"codec must be a name, a '+'-joined list of names, or Zarr v3 codec dicts; "
            f"got {type(codec).__name__}"
        )
    specs: list[CodecSpec] = []
    for item in items:
        if isinstance(item, str):
            name = item.strip().lower()
            cfg: dict[str, Any] = {}
        elif isinstance(item, dict) and "name" in item:
            name = str(item["name"]).lower()
            _check_members(name, item)
            cfg = item.get("configuration") or {}
            if not isinstance(cfg, dict):
                raise CodecError(f"codec {name!r}: configuration must be a dict, got {cfg!r}")
            cfg = dict(cfg)
        else:
            raise CodecError(f"codec entry {item!r} is neither a name nor a Zarr v3 codec dict")
        specs.append(_default_spec(name, cfg, dtype, endian))
    if not specs or specs[0]["name"] != "bytes":
        specs.insert(0, _default_spec("bytes", {}, dtype, endian))
    if any(spec["name"] == "bytes" for spec in specs[1:]):
        names = [spec["name"] for spec in specs]
        raise CodecError(
            f"codecs {names}: 'bytes' (the array→bytes codec) must come once, first, before "
            f"the {', '.join(_BYTES_CODECS)} codecs"
        )
    for spec in specs[1:]:
        _try_encode(spec)
    return specs


def _default_spec(name: str, cfg: dict[str, Any], dtype: np.dtype, endian: str) -> CodecSpec:
    if name == "lz4":
        # LZ4 as Zarr v3 readers know it: inside blosc (Zarr v3 has no bare lz4 codec)
        name, cfg = "blosc", {"cname": "lz4", "clevel": 5, **cfg}
    if name in ("bytes", "zstd", "gzip", "blosc", "crc32c"):
        _check_keys(name, cfg)
    if name == "bytes" and dtype.itemsize == 1:
        return _spec("bytes")
    if name == "bytes":
        spec = _spec("bytes", endian=cfg.get("endian", endian))
    elif name == "zstd":
        spec = _spec("zstd", level=cfg.get("level", 0), checksum=cfg.get("checksum", False))
    elif name == "gzip":
        spec = _spec("gzip", level=cfg.get("level", 5))
    elif name == "blosc":
        spec = _spec(
            "blosc",
            typesize=cfg.get("typesize", dtype.itemsize),
            cname=cfg.get("cname", "zstd"),
            clevel=cfg.get("clevel", 5),
            shuffle=cfg.get("shuffle", "shuffle"),
            blocksize=cfg.get("blocksize", 0),
        )
    elif name == "crc32c":
        return _spec("crc32c")
    else:
        spec = None
    if spec is not None:
        problem = configuration_problem(spec)
        if problem:
            raise CodecError(problem)
        config = spec["configuration"]
        for key, value in config.items():
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                config[key] = int(value)  # (a numpy integer, say: zarr.json holds plain ones)
        return spec
    raise CodecError(
        f"unknown codec {name!r}: strataio supports bytes, lz4, {', '.join(_BYTES_CODECS)}"
        + (
            " (sharding_indexed through create_dataset(..., shards=...))"
            if name == "sharding_indexed"
            else ""
        )
    )


def _check_members(name: str, item: dict[str, Any]) -> None:
    """Refuse a codec dict member other than ``name``, ``configuration`` and
    ``must_understand``: a setting put beside ``configuration`` (``{"name": "zstd",
    "level": 19}``) would otherwise be dropped and the codec's default used."""
    unknown = sorted(set(item) - {"name", "configuration", "must_understand"}, key=str)
    if unknown:
        hint = "; put it in 'configuration'" if unknown[0] in CODEC_KEYS.get(name, ()) else ""
        raise CodecError(
            f"codec {name!r}: unknown member {unknown[0]!r} (a Zarr v3 codec has 'name' and "
            f"'configuration'{hint})"
        )


def _check_keys(name: str, cfg: dict[str, Any]) -> None:
    unknown = sorted(set(cfg) - CODEC_KEYS[name], key=str)
    if unknown:
        known = ", ".join(repr(k) for k in sorted(CODEC_KEYS[name])) or "none"
        raise CodecError(
            f"codec {name!r}: unknown configuration key {unknown[0]!r} (the Zarr v3 {name} "
            f"codec takes {known})"
        )


def missing_keys(spec: CodecSpec) -> list[str]:
    """The ``configuration`` keys the Zarr v3 spec of the codec ``spec`` requires that it
    lacks: blosc's ``typesize`` only where it shuffles (the spec: "required unless shuffle
    is noshuffle")."""
    name, cfg = spec.get("name"), spec.get("configuration") or {}
    need = list(REQUIRED_KEYS.get(name, ()))
    if name == "blosc" and cfg.get("shuffle") != "noshuffle":
        need.append("typesize")
    return [key for key in need if key not in cfg]


def _int_problem(name: str, cfg: dict[str, Any], key: str, lo: int, hi: int | None) -> str | None:
    value = cfg.get(key)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        return f"codec {name!r}: {key} must be an integer, got {value!r}"
    if value < lo or (hi is not None and value > hi):
        allowed = f"from {lo} to {hi}" if hi is not None else f"of at least {lo}"
        return f"codec {name!r}: {key} {value} is out of range (the Zarr v3 spec: {allowed})"
    return None


def configuration_problem(spec: CodecSpec) -> str | None:
    """What makes a ``bytes``, ``zstd``, ``gzip`` or ``blosc`` codec entry (every key of its
    configuration given) one its Zarr v3 spec does not allow or this build of c-blosc cannot
    follow, naming the codec and the field; None when it is sound, and for other codecs."""
    name, cfg = spec["name"], spec.get("configuration") or {}
    if name == "bytes":
        endian = cfg.get("endian", "little")
        if endian not in ("little", "big"):
            return f"codec 'bytes': endian {endian!r} is not 'little' or 'big'"
        return None
    if name == "zstd":
        checksum = cfg.get("checksum", False)
        if not isinstance(checksum, bool):
            return f"codec 'zstd': checksum must be True or False, got {checksum!r}"
        return _int_problem(name, cfg, "level", *_ZSTD_LEVELS)
    if name == "gzip":
        return _int_problem(name, cfg, "level", *_LEVELS_0_9)
    if name != "blosc":
        return None
    cname, shuffle = cfg.get("cname"), cfg.get("shuffle")
    if cname not in _BLOSC_CNAMES:
        return f"codec 'blosc': cname {cname!r} is not one of {', '.join(_BLOSC_CNAMES)}"
    have = _numcodecs().blosc.list_compressors()
    if cname not in have:
        return (
            f"codec 'blosc': cname {cname!r} is not in this build of c-blosc (it has "
            f"{', '.join(have)})"
        )
    if shuffle not in _BLOSC_SHUFFLE:
        return f"codec 'blosc': shuffle {shuffle!r} is not one of {', '.join(_BLOSC_SHUFFLE)}"
    return (
        _int_problem(name, cfg, "clevel", *_LEVELS_0_9)
        or (
            _int_problem(name, cfg, "typesize", 1, None)
            if "typesize" in cfg or shuffle != "noshuffle"
            else None  # (the spec's "required unless shuffle is noshuffle")
        )
        or _int_problem(name, cfg, "blocksize", 0, None)
    )


def _try_encode(spec: CodecSpec) -> None:
    """Encode a few bytes with the codec of ``spec`` (its configuration checked), so that
    one numcodecs refuses fails here, as :class:`CodecError`, not on the first write."""
    try:
        _numcodec(spec).encode(bytes(64))
    except Exception as exc:  # numcodecs raises assorted types
        raise CodecError(f"codec {spec['name']!r} {spec.get('configuration', {})}: {exc}") from None


class _Crc32c:
    """Zarr v3 ``crc32c``: the encoded bytes followed by their CRC-32C, little-endian."""

    def encode(self, buf: Any) -> bytearray:
        data = memoryview(buf).cast("B")
        out = bytearray(len(data) + 4)  # one copy of the chunk, not two
        out[: len(data)] = data
        out[len(data) :] = crc32c(data).to_bytes(4, "little")
        return out

    def decode(self, buf: Any) -> memoryview:
        data = memoryview(buf).cast("B")
        if len(data) < 4:
            raise ChecksumError(f"stored chunk of {len(data)} bytes is shorter than its crc32c")
        body, stored = data[:-4], int.from_bytes(data[-4:], "little")
        if crc32c(body) != stored:
            raise ChecksumError(
                f"crc32c checksum mismatch (stored {stored:08x}, computed {crc32c(body):08x}): "
                "the chunk is corrupt on storage"
            )
        return body


_ZSTD_MAGIC = 0xFD2FB528


def _zstd_content_size(data: Any) -> int | None:
    """The decompressed size a Zstandard frame's header declares (RFC 8878 §3.1.1.1), or
    None where it declares none (or is no frame: the decoder then says what is wrong)."""
    head = bytes(memoryview(data).cast("B")[:18])
    if len(head) < 5 or int.from_bytes(head[:4], "little") != _ZSTD_MAGIC:
        return None
    fhd = head[4]
    single, fcs_flag = (fhd >> 5) & 1, fhd >> 6
    size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if not size:
        return None
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    if len(head) < at + size:
        return None
    value = int.from_bytes(head[at : at + size], "little")
    return value + 256 if size == 2 else value


def _encoded_bound(codec: Any, nbytes: int) -> int:
    """The most bytes ``codec`` may encode ``nbytes`` bytes to (generously: zstd, gzip and
    blosc each add far less to bytes they cannot compress), which is the most its decoder
    may give back from a sound input, whatever the settings it was written with."""
    return nbytes + 4 if isinstance(codec, _Crc32c) else nbytes + nbytes // 16 + 1024


def _decode_to(
    codec: Any,
    data: Any,
    nbytes: int,
    size_error: type[CodecError] = CodecError,
    *,
    exact: bool = True,
) -> Any:
    """``codec.decode(data)`` for the codec whose output is the chunk's ``nbytes`` array
    bytes (with ``exact`` false: at most ``nbytes`` bytes, the output of a codec after the
    first), refusing (``size_error``, :class:`CodecError` or :class:`ChecksumError`) before
    it allocates or inflates anything else: a corrupt or hostile chunk whose header declares
    gigabytes, or whose stream inflates without end, costs no more memory or time than the
    chunk itself."""
    expected = f"{nbytes}" if exact else f"at most {nbytes}"

    def wrong(declared: int | None) -> bool:
        return declared != nbytes if exact else declared is None or declared > nbytes

    nc = _numcodecs_loaded()
    if nc is not None and isinstance(codec, nc.Blosc):
        head = bytes(memoryview(data).cast("B")[:16])
        # (a Blosc header: version, format, flags, type size, then the decoded size)
        declared = int.from_bytes(head[4:8], "little") if len(head) == 16 else None
        if wrong(declared):
            raise size_error(f"blosc header declares {declared} bytes, expected {expected}")
        return codec.decode(data)
    if nc is not None and isinstance(codec, nc.Zstd):
        declared = _zstd_content_size(data)
        if declared is None:  # (no size in the header: decoded into a buffer of the size)
            if exact:
                return codec.decode(data, out=np.empty(nbytes, dtype=np.uint8))
            return codec.decode(data)
        if wrong(declared):
            raise size_error(f"zstd frame declares {declared} bytes, expected {expected}")
        return codec.decode(data)
    if nc is not None and isinstance(codec, nc.GZip):
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = inflate.decompress(memoryview(data).cast("B"), nbytes + 1)
        if (len(out) != nbytes if exact else len(out) > nbytes) or not inflate.eof:
            raise size_error(f"gzip stream does not inflate to {expected} bytes")
        return out
    return codec.decode(data)


def _numcodec(spec: CodecSpec) -> Any:
    name = spec["name"]
    cfg = spec.get("configuration", {})
    numcodecs = _numcodecs()
    if name == "zstd":
        return numcodecs.Zstd(level=cfg["level"], checksum=cfg.get("checksum", False))
    if name == "gzip":
        return numcodecs.GZip(level=cfg["level"])
    if name == "blosc":
        return numcodecs.Blosc(
            cname=cfg["cname"],
            clevel=cfg["clevel"],
            shuffle=_BLOSC_SHUFFLE[cfg["shuffle"]],
            blocksize=cfg["blocksize"],
            typesize=cfg.get("typesize", 1),  # (only noshuffle may leave it out: unused)
        )
    if name == "crc32c":
        return _Crc32c()
    raise CodecError(f"unknown codec {name!r}")


@dataclass(slots=True)
class CodecPipeline:
    """Encodes chunk arrays to stored bytes and back, per a Zarr v3 ``codecs`` list."""

    specs: list[CodecSpec]
    dtype: np.dtype
    chunk_shape: tuple[int, ...]
    _stored_dtype: np.dtype = field(init=False)
    _bytes_codecs: list[Any] = field(init=False)
    _chunk_size: int = field(init=False)
    # (sizes asked once per chunk read: kept, not computed on each call)
    _is_raw: bool = field(init=False)
    _chunk_nbytes: int = field(init=False)
    _stored_nbytes: int = field(init=False)
    _size_error: type[CodecError] = field(init=False)
    _decoded_limits: list[int] = field(init=False)
    _encode_problem: str | None = field(init=False)

    def __post_init__(self) -> None:
        names = [s.get("name") for s in self.specs]
        # (an unknown codec first: an array-to-array codec such as transpose comes before
        # 'bytes', and "must start with 'bytes'" would blame the order, not the codec)
        unknown = [n for n in names if n not in ("bytes", *_BYTES_CODECS)]
        if unknown:
            raise CodecError(f"codec {unknown[0]!r} is not supported: {READABLE}")
        if not names or names[0] != "bytes" or "bytes" in names[1:]:
            raise CodecError(
                f"codec pipeline {names} must be one 'bytes' codec followed by "
                f"{', '.join(_BYTES_CODECS)} codecs"
            )
        endian = self.specs[0].get("configuration", {}).get("endian", "little")
        if endian not in ("little", "big"):
            raise CodecError(f"bytes codec endian {endian!r} is not 'little' or 'big'")
        self.dtype = np.dtype(self.dtype).newbyteorder("=")
        order = "<" if endian == "little" else ">"
        self._stored_dtype = (
            self.dtype.newbyteorder(order) if self.dtype.itemsize > 1 else self.dtype
        )
        self._bytes_codecs = [_numcodec(s) for s in self.specs[1:]]
        # (per bytes codec: the most bytes its decoder may give back, the array bytes for the
        # first, a bound of what the codecs before it encode them to for the others)
        self._decoded_limits = [int(math.prod(self.chunk_shape)) * self.dtype.itemsize]
        for codec in self._bytes_codecs[:-1]:
            self._decoded_limits.append(_encoded_bound(codec, self._decoded_limits[-1]))
        # (a zarr.json made elsewhere may configure a codec beyond its spec: such chunks
        # still decode, but none is encoded)
        problems = (configuration_problem(s) for s in self.specs[1:])
        self._encode_problem = next((p for p in problems if p), None)
        self._chunk_size = int(math.prod(self.chunk_shape))
        self._is_raw = not self._bytes_codecs
        self._chunk_nbytes = self._chunk_size * self.dtype.itemsize
        self._stored_nbytes = self._chunk_nbytes + (0 if self._is_raw else 4)
        self._size_error = ChecksumError if self.checksummed else CodecError

    @property
    def names(self) -> list[str]:
        return [s["name"] for s in self.specs]

    @property
    def max_chunk_nbytes(self) -> int:
        """The most bytes a chunk of this pipeline may hold: :data:`MAX_CHUNK_BYTES`, or
        :data:`BLOSC_MAX_BYTES` where blosc compresses it."""
        nc = _numcodecs_loaded()
        blosc = nc is not None and any(isinstance(c, nc.Blosc) for c in self._bytes_codecs)
        return BLOSC_MAX_BYTES if blosc else MAX_CHUNK_BYTES

    @property
    def checksummed(self) -> bool:
        """True when the pipeline has a checksum codec (``crc32c``)."""
        return "crc32c" in self.names[1:]

    def size_error(self, message: str) -> CodecError:
        """The error for a stored chunk of the wrong size for this array (its object's size,
        the size it decodes or declares it decodes to): a :class:`ChecksumError` where the
        pipeline has a checksum codec, as for a chunk failing its checksum, else a
        :class:`CodecError`."""
        return self._size_error(message)

    @property
    def is_raw(self) -> bool:
        """True when a stored chunk is the plain array bytes (partial reads are possible)."""
        return self._is_raw

    @property
    def is_plain(self) -> bool:
        """True when a stored chunk is the plain array bytes, raw or followed by their
        ``crc32c``: it can be read into a buffer of :attr:`stored_nbytes` and used in place."""
        return self.is_raw or self.names[1:] == ["crc32c"]

    @property
    def stored_nbytes(self) -> int:
        """Bytes of one stored plain chunk (:attr:`is_plain`)."""
        return self._stored_nbytes

    def verify(self, stored: Any) -> None:
        """Check a plain chunk's checksum (:class:`ChecksumError` when it differs)."""
        for codec in self._bytes_codecs:
            codec.decode(stored)

    @property
    def encode_problem(self) -> str | None:
        """What keeps this pipeline from encoding any chunk (a codec configured beyond what
        its Zarr v3 spec allows, by a ``zarr.json`` made elsewhere), or None."""
        return self._encode_problem

    @property
    def stored_dtype(self) -> np.dtype:
        return self._stored_dtype

    @property
    def chunk_nbytes(self) -> int:
        return self._chunk_nbytes

    def describe(self) -> str:
        parts = []
        for s in self.specs:
            cfg = s.get("configuration") or {}
            args = ",".join(f"{k}={v}" for k, v in cfg.items())
            parts.append(f"{s['name']}({args})" if args else s["name"])
        return " → ".join(parts)

    def encode(self, chunk: np.ndarray) -> bytes | bytearray | memoryview:
        """Stored bytes of one full chunk (``chunk`` has :attr:`chunk_shape`); a codec
        configured beyond what its Zarr v3 spec allows raises :class:`CodecError`."""
        if self._encode_problem:
            raise CodecError(f"cannot encode a chunk: {self._encode_problem}")
        arr = np.ascontiguousarray(chunk, dtype=self._stored_dtype)
        data: Any = memoryview(arr).cast("B")
        for codec in self._bytes_codecs:
            data = codec.encode(data)
        return data

    def decode(self, data: Any) -> np.ndarray:
        """The chunk array (native byte order, :attr:`chunk_shape`) of stored bytes."""
        codecs = self._bytes_codecs
        for i in range(len(codecs) - 1, -1, -1):
            codec = codecs[i]
            try:
                # (the first codec's output is the array's bytes: its size is known)
                # (the first codec's output is the array's bytes, whose size is known; each
                # other's is bounded by what the codecs before it make of them)
                data = _decode_to(
                    codec, data, self._decoded_limits[i], self._size_error, exact=not i
                )
            except (ChecksumError, CodecError):
                raise
            except Exception as exc:  # numcodecs raises assorted types on corrupt input
                raise CodecError(f"cannot decode chunk with {type(codec).__name__}: {exc}") from exc
        try:
            raw = np.frombuffer(data, dtype=self._stored_dtype)
        except ValueError:  # (bytes not a whole number of elements: a truncated chunk)
            raise self.size_error(
                f"decoded chunk has {memoryview(data).nbytes} bytes, not a whole number of "
                f"{self._stored_dtype.itemsize}-byte elements (chunk shape {self.chunk_shape})"
            ) from None
        if raw.size != self._chunk_size:
            raise self.size_error(
                f"decoded chunk has {raw.size} elements, expected {self._chunk_size} "
                f"(chunk shape {self.chunk_shape})"
            )
        arr = raw.reshape(self.chunk_shape)
        if self._stored_dtype.byteorder not in ("=", "|") and not self._stored_dtype.isnative:
            arr = arr.astype(self.dtype)
        return arr
