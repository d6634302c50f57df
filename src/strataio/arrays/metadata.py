"""Zarr v3 array metadata (``zarr.json``): parse, validate and serialize.

Only what strataio writes and reads is accepted: a regular chunk grid, the default chunk key
encoding (separator ``/`` or ``.``), and the codecs of :mod:`strataio.arrays.codecs`, alone or
inside one ``sharding_indexed`` codec (:mod:`strataio.arrays.sharding`).

A ``zarr.json`` is checked as the Zarr v3 spec asks: every field of the types it defines
(``shape`` a list of non-negative integers, not a string, a float or a bool), and no field
strataio does not know (:data:`ARRAY_FIELDS`) unless it is an object with
``"must_understand": false`` (such a field is kept, unread, and written back). The members of
an extension object (``chunk_grid``, ``chunk_key_encoding``, each codec) and the keys of its
``configuration`` are checked the same way; ``"must_understand": false`` is refused on a chunk
grid or chunk key encoding (the spec does not allow it there) and does not make an unknown
codec readable (the spec lets a reader ignore such a codec, it does not oblige it to: one
ignored on read would be missing from the chunks strataio writes). Every refusal is a
:class:`MetadataError` naming the file and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from strataio.arrays.codecs import CODEC_KEYS, CodecSpec, missing_keys, normalize_codecs
from strataio.arrays.sharding import chunk_codec, oversize, shard_codecs
from strataio.arrays.values import to_dtype
from strataio.errors import ArgumentError, CodecError, MetadataError, StrataError
from strataio.layout.chunks import chunk_key

#: Zarr v3 data type names of the numpy dtypes strataio stores.
DATA_TYPES = {
    "bool": "bool",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
    "complex64": "complex64",
    "complex128": "complex128",
}


#: The fields of a Zarr v3 array's ``zarr.json`` strataio reads: those the spec defines, which
#: are every field strataio, zarr-python and TensorStore write. Any other field must be an
#: object with ``"must_understand": false`` (the spec: an implementation must fail to open an
#: array with a metadata field it does not know, unless the field says it may be ignored).
ARRAY_FIELDS = frozenset(
    {
        "zarr_format",
        "node_type",
        "shape",
        "data_type",
        "chunk_grid",
        "chunk_key_encoding",
        "fill_value",
        "codecs",
        "attributes",
        "storage_transformers",
        "dimension_names",
    }
)
#: The members of a Zarr v3 extension object (a chunk grid, a chunk key encoding, a codec).
_EXTENSION_MEMBERS = frozenset({"name", "configuration", "must_understand"})


def zarr_data_type(dtype: Any) -> str:
    """The Zarr v3 name of a numpy dtype; raises for dtypes Zarr v3 core does not define."""
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise ArgumentError(f"not a numpy dtype: {dtype!r}") from exc
    name = dt.newbyteorder("=").name if dt.itemsize > 1 else dt.name
    if name not in DATA_TYPES:
        raise ArgumentError(
            f"dtype {dt} is not supported: use bool, (u)int8–64, float16–64 or complex64/128"
        )
    return DATA_TYPES[name]


def _fill_to_json(value: Any, dtype: np.dtype) -> Any:
    scalar = np.asarray(value, dtype=dtype)[()]
    if dtype.kind == "b":
        return bool(scalar)
    if dtype.kind in "iu":
        return int(scalar)
    if dtype.kind == "f":
        return _float_to_json(scalar)
    if dtype.kind == "c":
        return [_float_to_json(scalar.real), _float_to_json(scalar.imag)]
    raise MetadataError(f"no fill value encoding for {dtype}")


def _float_to_json(f: np.floating) -> Any:
    """A float fill value as the Zarr v3 spec writes it: a NaN other than its ``"NaN"`` (sign
    bit clear, only the mantissa's top bit set: numpy's ``nan``) as ``"0x"`` and its bits."""
    if np.isnan(f):
        big = f.dtype.newbyteorder(">")
        bits = np.asarray(f, big).tobytes()
        return "NaN" if bits == np.asarray(np.nan, big).tobytes() else "0x" + bits.hex()
    if np.isinf(f):
        return "Infinity" if f > 0 else "-Infinity"
    return float(f)


def _fill_from_json(value: Any, dtype: np.dtype) -> Any:
    """The fill value ``zarr.json`` holds as a scalar of ``dtype``; a complex one is a list of
    two parts, each written as a float one is (a number, ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"`` or ``"0x"`` and its bits in hex). ``null`` is no value of any data type
    strataio reads, nor a part of one (numpy would make it a float NaN)."""
    if dtype.kind == "c" and isinstance(value, list):
        part = np.dtype(f"f{dtype.itemsize // 2}")
        if len(value) != 2:
            raise ValueError(f"a complex fill value has 2 parts, not {len(value)}")
        re, im = (_scalar_from_json(x, part) for x in value)
        out = np.empty((), dtype)
        out.real, out.imag = re, im  # (each part as its bits say, no round trip through Python)
        return out[()]
    return _scalar_from_json(value, dtype)


def _scalar_from_json(value: Any, dtype: np.dtype) -> Any:
    """One fill value of ``zarr.json`` (a complex one's part, see :func:`_fill_from_json`)
    as a ``dtype`` scalar, a ``"0x"`` one holding exactly the bits it gives; ValueError for
    any other string (the spec's are those, ``"0x"`` for floats only), for a number with a
    fraction (or NaN, an infinity) where ``dtype`` holds integers, for a
    ``bool`` one other than true, false, 0 or 1, and for a finite number beyond a float
    type's range (which would be read as an infinity)."""
    if value is None:
        raise ValueError("null is no value of a numeric data type")
    special = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
    if isinstance(value, str):
        if value in special:
            value = special[value]
        elif value.startswith("0x") and dtype.kind == "f":
            return np.frombuffer(
                int(value, 16).to_bytes(dtype.itemsize, "big"), dtype.newbyteorder(">")
            )[0].astype(dtype)
        else:  # (numpy would read "7", "1.5" or "inf" as numbers)
            raise ValueError(
                "a string other than 'NaN', 'Infinity', '-Infinity' or, for a float, '0x' "
                "and its bits"
            )
    if dtype.kind in "iu" and isinstance(value, float) and not value.is_integer():
        raise ValueError("not an integer")  # (numpy would make 1.5 a 1)
    if dtype.kind == "b" and value not in (True, False):  # (0 and 1, as bool takes them)
        raise ValueError("not true or false")  # (numpy would make 2 or 0.5 True)
    if dtype.kind == "f" and isinstance(value, (int, float)) and math.isfinite(value):
        with np.errstate(over="ignore"):
            got = np.asarray(value, dtype=dtype)[()]
        if not np.isfinite(got):
            raise ValueError(f"beyond the range of {dtype}")  # (numpy would make it inf)
        return got
    return np.asarray(value, dtype=dtype)[()]


def json_attrs(attrs: Any) -> dict[str, Any]:
    """User attributes as ``zarr.json`` holds them: plain JSON values (numpy scalars and
    arrays become numbers and lists). Raises :class:`ArgumentError` for anything JSON does
    not hold, NaN and infinities and strings with a lone surrogate included: written, they
    make ``zarr.json`` a file strict JSON readers (TensorStore) refuse."""
    if attrs is None:
        return {}
    if not isinstance(attrs, dict):
        raise ArgumentError("attrs must be a dict of JSON values")
    _check_keys(attrs, "attrs")

    def plain(value: Any) -> Any:
        if isinstance(value, np.generic | np.ndarray):
            return value.tolist()
        raise TypeError(f"{type(value).__name__} {value!r} is not a JSON value")

    try:
        out = json.loads(json.dumps(attrs, allow_nan=False, default=plain))
    except TypeError as exc:
        raise ArgumentError(f"attrs: {exc}") from None
    except ValueError:
        raise ArgumentError(
            "attrs: NaN and infinities are not JSON values (strict readers such as "
            "TensorStore refuse the file); store them as strings, e.g. 'NaN'"
        ) from None
    _check_text(out, "attrs")
    return out


def _check_text(value: Any, where: str) -> None:
    """Raise :class:`ArgumentError` for a string in ``value`` (a key or a value, at any
    depth) that is not Unicode text: one holding a lone surrogate (``"\\ud800"``), which
    UTF-8 cannot encode and strict JSON readers (TensorStore) refuse the whole file for."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ArgumentError(
                f"{where}: {value!r} is not Unicode text (a lone surrogate at index "
                f"{exc.start}): strict JSON readers such as TensorStore refuse the zarr.json"
            ) from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k, f"{where} key")
            _check_text(v, f"{where}[{k!r}]")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_text(v, f"{where}[{i}]")


def _check_keys(value: Any, where: str) -> None:
    """Raise :class:`ArgumentError` for a key of a mapping in ``value`` that is not a string:
    JSON would write ``3`` as ``"3"``, and the attribute would read back under another key."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                try:
                    became = f"it would read back as {next(iter(json.loads(json.dumps({k: 0}))))!r}"
                except TypeError:
                    became = "JSON cannot hold it"
                raise ArgumentError(
                    f"{where}: key {k!r} ({type(k).__name__}) is not a string: JSON keys are "
                    f"strings, and {became}"
                )
            _check_keys(v, f"{where}[{k!r}]")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_keys(v, f"{where}[{i}]")


@dataclass(slots=True)
class ArrayMetadata:
    """What ``zarr.json`` says about an array, in numpy terms."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...]
    codecs: list[CodecSpec]
    fill_value: Any = 0
    attrs: dict[str, Any] = field(default_factory=dict)
    separator: str = "/"
    dimension_names: list[str | None] | None = None
    #: fields of ``zarr.json`` strataio does not know, each an object marked
    #: ``"must_understand": false``: kept as read and written back with the rest
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(
        cls,
        shape: Any,
        dtype: Any,
        chunks: Any,
        codec: Any = None,
        fill_value: Any = 0,
        attrs: dict[str, Any] | None = None,
        dims: Any = None,
        shards: Any = None,
    ) -> ArrayMetadata:
        """Validated metadata for a new array (errors raised here write nothing).

        ``dims`` names the dimensions (Zarr v3 ``dimension_names``, which xarray reads): one
        string or None per dimension, or None for no names. ``shards`` (a shape, a multiple
        of ``chunks``) stores the array in shards of that shape, each holding ``chunks``-shaped
        inner chunks encoded by ``codec`` (Zarr v3 ``sharding_indexed``): the array's chunk
        grid is then the shard grid.

        A chunk (a shard, an inner chunk) larger than strataio holds raises
        :class:`ArgumentError` naming its shape, its bytes and the limit
        (:data:`~strataio.arrays.codecs.MAX_CHUNK_BYTES`, less under blosc); an unknown codec
        :class:`CodecError`."""
        shape_t = _int_tuple(shape, "shape", allow_zero=True)
        if any(n > MAX_DIMENSION for n in shape_t):
            raise ArgumentError(
                f"shape {shape_t} is larger than {MAX_DIMENSION} (2**62) along a dimension: "
                "TensorStore refuses such a zarr.json (and numpy indexes at most 2**63 - 1)"
            )
        whole = chunks is None
        if chunks is None:  # (one chunk: the whole array, at least 1 along an empty dimension)
            chunks = tuple(max(n, 1) for n in shape_t)
        chunks_t = _int_tuple(chunks, "chunks", allow_zero=False)
        if len(chunks_t) != len(shape_t):
            raise ArgumentError(
                f"chunks {chunks_t} have {len(chunks_t)} dimensions but shape {shape_t} "
                f"has {len(shape_t)}"
            )
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise ArgumentError(
                f"dtype {dtype!r} is not a numpy dtype (e.g. 'float32', 'int8', np.uint16)"
            ) from None
        zarr_data_type(dt)
        if shards is not None:
            shards_t = _int_tuple(shards, "shards", allow_zero=False)
            if len(shards_t) != len(shape_t):
                raise ArgumentError(
                    f"shards {shards_t} have {len(shards_t)} dimensions but shape {shape_t} "
                    f"has {len(shape_t)}"
                )
            if any(s % c for s, c in zip(shards_t, chunks_t)):
                raise ArgumentError(
                    f"shards {shards_t} must be a multiple of the inner chunks {chunks_t}"
                )
            codecs = shard_codecs(chunks_t, codec, dt, shards_t)
            chunks_t = shards_t
        else:
            codecs = normalize_codecs(codec, dt)
        fill = _fill(fill_value, dt.newbyteorder("="))
        problem = oversize(chunk_codec(codecs, dt, chunks_t, fill))
        if problem:
            raise ArgumentError(
                problem + (" (chunks=None makes the whole array one chunk)" if whole else "")
            )
        plain = json_attrs(attrs)
        names = _dimension_names(dims, len(shape_t), ArgumentError, "dims")
        _check_text(names, "dims")
        return cls(shape_t, dt.newbyteorder("="), chunks_t, codecs, fill, plain, "/", names)

    def arguments(self) -> dict[str, Any]:
        """The arguments of :meth:`create` this metadata holds, by the names ``create`` takes
        them, as ``zarr.json`` writes them (``"<f4"`` and ``np.float32`` alike are
        ``"float32"``): what the ranks of a collective create compare. A sharded array's
        shards are its ``chunks`` and its inner chunks part of its ``codec``."""
        doc = json.loads(self.to_json())
        return {
            "shape": doc.pop("shape"),
            "dtype": doc.pop("data_type"),
            "chunks": doc.pop("chunk_grid")["configuration"]["chunk_shape"],
            "codec": doc.pop("codecs"),
            "fill_value": doc.pop("fill_value"),
            "attrs": doc.pop("attributes"),
            "dims": doc.pop("dimension_names", None),
            **doc,  # (the fields no argument sets: the same wherever create made them)
        }

    # ----------------------------------------------------------------- zarr.json
    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "zarr_format": 3,
            "node_type": "array",
            "shape": list(self.shape),
            "data_type": zarr_data_type(self.dtype),
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(self.chunks)}},
            "chunk_key_encoding": {
                "name": "default",
                "configuration": {"separator": self.separator},
            },
            "fill_value": _fill_to_json(self.fill_value, self.dtype),
            "codecs": self.codecs,
            "attributes": self.attrs,
            "storage_transformers": [],
        }
        if self.dimension_names is not None:
            doc["dimension_names"] = self.dimension_names
        doc.update(self.extra)
        return json.dumps(doc, indent=2).encode()

    @classmethod
    def from_json(cls, raw: bytes | str, where: str = "zarr.json") -> ArrayMetadata:
        """The metadata a ``zarr.json`` holds. :class:`MetadataError` names ``where`` and
        says what is wrong: not JSON, not a Zarr v3 array, a field missing, of the wrong type
        or out of range (``shape`` ``[-1]`` or ``"8"``, say), a field strataio does not know
        that is not marked ``"must_understand": false``, or naming what strataio does not
        support (a data type, a codec, a chunk grid or key encoding, chunks larger than
        :data:`~strataio.arrays.codecs.MAX_CHUNK_BYTES`)."""
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MetadataError(f"{where} is not valid JSON: {exc}") from None
        if (
            not isinstance(doc, dict)
            or not _is_int(doc.get("zarr_format"))
            or doc["zarr_format"] != 3
        ):
            raise MetadataError(f"{where} is not Zarr v3 metadata (zarr_format != 3)")
        if doc.get("node_type") != "array":
            raise MetadataError(f"{where} describes a {doc.get('node_type')!r}, not an array")
        extra = _extra_fields(doc, where)
        for name in ("shape", "data_type", "chunk_grid", "fill_value", "codecs"):
            if name not in doc:
                raise MetadataError(f"{where}: the required field {name!r} is missing")
        try:
            shape = _json_ints(doc["shape"], "shape", where, lo=0)
            grid, grid_cfg = _extension(doc["chunk_grid"], "chunk_grid", where)
            if grid != "regular":
                raise MetadataError(f"{where}: chunk grid {grid!r} is not supported")
            _no_unknown_keys(grid_cfg, {"chunk_shape"}, "chunk_grid configuration", where)
            if "chunk_shape" not in grid_cfg:
                raise MetadataError(f"{where}: chunk_grid configuration has no 'chunk_shape'")
            chunks = _json_ints(grid_cfg["chunk_shape"], "chunk_grid chunk_shape", where, lo=1)
            if len(chunks) != len(shape):
                raise MetadataError(
                    f"{where}: chunk_grid chunk_shape {list(chunks)} has {len(chunks)} "
                    f"dimensions but shape {list(shape)} has {len(shape)}"
                )
            enc, enc_cfg = _extension(
                doc.get("chunk_key_encoding", "default"), "chunk_key_encoding", where
            )
            if enc != "default":
                raise MetadataError(f"{where}: chunk key encoding {enc!r} is not supported")
            _no_unknown_keys(enc_cfg, {"separator"}, "chunk_key_encoding configuration", where)
            sep = enc_cfg.get("separator", "/")
            if sep not in ("/", "."):
                raise MetadataError(
                    f"{where}: chunk_key_encoding separator {sep!r} is not '/' or '.'"
                )
            name = doc["data_type"]
            if not isinstance(name, str) or name not in DATA_TYPES.values():
                raise MetadataError(f"{where}: data type {name!r} is not supported")
            dt = np.dtype(name)
            transformers = doc.get("storage_transformers", [])
            if not isinstance(transformers, list):
                raise MetadataError(
                    f"{where}: storage_transformers must be a list, got {transformers!r}"
                )
            if transformers:
                raise MetadataError(f"{where}: storage transformers are not supported")
            attrs = doc.get("attributes")
            if attrs is not None and not isinstance(attrs, dict):
                raise MetadataError(f"{where}: attributes must be an object, got {attrs!r}")
            names = _dimension_names(
                doc.get("dimension_names"), len(shape), MetadataError, f"{where}: dimension_names"
            )
            codecs = _codecs(doc["codecs"], "codecs", where)
            fill = doc["fill_value"]
            try:
                fill_value = _fill_from_json(fill, dt)
            except (TypeError, ValueError, OverflowError) as exc:
                raise MetadataError(
                    f"{where}: fill_value {fill!r} is not a {name} value: {exc}"
                ) from None
            meta = cls(
                shape=shape,
                dtype=dt,
                chunks=chunks,
                codecs=codecs,
                fill_value=fill_value,
                attrs=dict(attrs or {}),
                separator=sep,
                dimension_names=names,
                extra=extra,
            )
            # (the codecs made here, at open, where a collective open agrees on its errors)
            codec = chunk_codec(meta.codecs, dt, meta.chunks, meta.fill_value)
        except MetadataError:
            raise  # (what is valid but unsupported says so, not "malformed")
        except CodecError as exc:  # (a codec strataio lacks, a misconfigured one)
            raise MetadataError(f"{where}: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MetadataError(f"{where} is malformed: {exc!r}") from None
        problem = oversize(codec)
        if problem:
            raise MetadataError(f"{where}: {problem}")
        return meta

    def chunk_key(self, coords: Any) -> str:
        """The Zarr v3 default-encoded key of a chunk (``c/1/2``; ``c`` for 0-d arrays)."""
        return chunk_key(coords, self.separator)


def _dimension_names(
    value: Any, ndim: int, error: type[StrataError], what: str
) -> list[str | None] | None:
    """``value`` as Zarr v3 ``dimension_names`` for an array of ``ndim`` dimensions."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise error(f"{what} must be a sequence of names (str or None), got {value!r}")
    names = list(value)
    if len(names) != ndim:
        raise error(f"{what} {tuple(names)} name {len(names)} dimensions, the array has {ndim}")
    bad = [n for n in names if n is not None and not isinstance(n, str)]
    if bad:
        raise error(f"{what}: {bad[0]!r} is not a name (a str, or None for an unnamed dimension)")
    return names


#: The largest length of a dimension create_dataset takes: the largest TensorStore opens
#: (numpy indexes up to 2**63 - 1; a larger shape makes a zarr.json TensorStore refuses).
MAX_DIMENSION = 2**62


def _is_int(value: Any) -> bool:
    """True for a JSON integer (a bool is not one, though Python makes it an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _json_ints(value: Any, what: str, where: str, lo: int) -> tuple[int, ...]:
    """A ``zarr.json`` list of integers of at least ``lo`` as a tuple; :class:`MetadataError`
    naming ``where`` and ``what`` for anything else (a string, floats, bools, negatives)."""
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise MetadataError(f"{where}: {what} must be a list of integers, got {value!r}")
    if any(v < lo for v in value):
        kind = "non-negative" if lo == 0 else "positive"
        raise MetadataError(f"{where}: {what} {value} must be {kind} integers")
    return tuple(value)


def _extra_fields(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """The fields of ``doc`` that are not :data:`ARRAY_FIELDS`: each must be an object with
    ``"must_understand": false``, or :class:`MetadataError` names it."""
    extra: dict[str, Any] = {}
    for key, value in doc.items():
        if key in ARRAY_FIELDS:
            continue
        if not (isinstance(value, dict) and value.get("must_understand") is False):
            raise MetadataError(
                f"{where}: unknown field {key!r}: a Zarr v3 reader must refuse a metadata field "
                'it does not know unless the field is an object with "must_understand": false'
            )
        extra[key] = value
    return extra


def _no_unknown_keys(config: dict[str, Any], known: Any, what: str, where: str) -> None:
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise MetadataError(
            f"{where}: {what} has unknown key {unknown[0]!r} (strataio knows "
            f"{', '.join(repr(k) for k in sorted(known)) or 'none'})"
        )


def _name_and_configuration(
    value: dict[str, Any], what: str, where: str, *, named: bool = False
) -> tuple[str, dict[str, Any]]:
    """The ``name`` (a string) and ``configuration`` (an object, ``{}`` where absent) of the
    extension object ``value``, which may hold only those and ``must_understand``; with
    ``named``, errors about its configuration give its name after ``what`` (a codec's)."""
    _no_unknown_keys(value, _EXTENSION_MEMBERS, what, where)
    name, config = value.get("name"), value.get("configuration", {})
    if not isinstance(name, str):
        raise MetadataError(f"{where}: {what} name must be a string, got {name!r}")
    if not isinstance(config, dict):
        label = f"{what} ({name})" if named else what
        raise MetadataError(f"{where}: {label} configuration must be an object, got {config!r}")
    return name, config


def _extension(value: Any, what: str, where: str) -> tuple[str, dict[str, Any]]:
    """The name and configuration of a Zarr v3 extension object that must be understood (a
    chunk grid, a chunk key encoding): a short-hand name or an object of ``name``, optional
    ``configuration`` (an object) and optional ``must_understand`` (which the spec does not
    allow to be false here)."""
    if isinstance(value, str):
        return value, {}
    if not isinstance(value, dict):
        raise MetadataError(f"{where}: {what} must be an object or a name, got {value!r}")
    name, config = _name_and_configuration(value, what, where)
    if value.get("must_understand", True) is not True:
        raise MetadataError(
            f"{where}: {what} {name!r} sets must_understand to "
            f"{json.dumps(value['must_understand'])}: the Zarr v3 spec does not allow a chunk "
            "grid or chunk key encoding that may be ignored"
        )
    return name, config


def _codecs(value: Any, what: str, where: str) -> list[CodecSpec]:
    """A ``zarr.json`` codec list (``codecs``, or a ``sharding_indexed`` codec's ``codecs``
    or ``index_codecs``) checked as the spec defines codec entries, short-hand names made
    ``{"name": ...}`` objects. A codec strataio knows may have only the configuration keys
    its spec defines, and must have those it requires (a ``sharding_indexed`` one its
    ``chunk_shape`` and ``index_codecs``); one it does not know is left for the pipeline to refuse, whatever its
    ``must_understand`` says (see the module's docstring)."""
    if not isinstance(value, list) or not value:
        raise MetadataError(f"{where}: {what} must be a non-empty list of codecs, got {value!r}")
    out: list[CodecSpec] = []
    for i, entry in enumerate(value):
        here = f"{what}[{i}]"
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, dict):
            raise MetadataError(f"{where}: {here} must be a codec object or name, got {entry!r}")
        name, config = _name_and_configuration(entry, here, where, named=True)
        if not isinstance(entry.get("must_understand", True), bool):
            raise MetadataError(
                f"{where}: {here} ({name}) must_understand must be true or false, got "
                f"{entry['must_understand']!r}"
            )
        if name in CODEC_KEYS:
            _no_unknown_keys(config, CODEC_KEYS[name], f"{here} ({name}) configuration", where)
            missing = missing_keys({"name": name, "configuration": config})
            if missing:
                raise MetadataError(
                    f"{where}: {here} ({name}) configuration has no {missing[0]!r}, which the "
                    f"Zarr v3 {name} codec requires"
                )
        if name == "sharding_indexed":
            config = dict(config)
            if "chunk_shape" not in config:
                raise MetadataError(f"{where}: {here} (sharding_indexed) has no chunk_shape")
            _json_ints(config["chunk_shape"], f"{here} (sharding_indexed) chunk_shape", where, 1)
            if "index_codecs" not in config:
                # (no default to take: zarr-python takes a crc32c-checked index, and the
                # shards each reads and writes by its guess are corrupt to the other)
                raise MetadataError(
                    f"{where}: {here} (sharding_indexed) has no index_codecs, which the Zarr v3 "
                    "spec requires: whether the shard index ends with a crc32c is unknown"
                )
            for inner in ("codecs", "index_codecs"):
                if inner in config:
                    config[inner] = _codecs(config[inner], f"{here}.{inner}", where)
            entry = {**entry, "configuration": config}
        out.append(entry)
    return out


def _fill(value: Any, dtype: np.dtype) -> Any:
    """The fill value as a scalar of ``dtype``, converted by the rules writes follow."""
    what = f"fill_value {value!r}"
    if value is None:
        value = 0
    try:
        arr = np.asanyarray(value)  # (a masked one stays one: to_dtype refuses its mask)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"{what} is not a number: {exc}") from None
    if arr.ndim != 0:
        raise ArgumentError(f"{what} must be a scalar, got shape {arr.shape}")
    return to_dtype(arr, dtype, what).astype(dtype)[()]


def _int_tuple(value: Any, what: str, allow_zero: bool) -> tuple[int, ...]:
    """``value`` (an integer or a sequence of them, numpy integers included) as a tuple of
    ints; :class:`ArgumentError` naming ``what`` and the value for anything else: a float
    (even ``4.0``), a bool, a string, or one below 1 (below 0 with ``allow_zero``)."""
    try:
        items = [value] if isinstance(value, int | np.integer) else list(value)
    except TypeError:
        raise ArgumentError(f"{what} must be a sequence of integers, got {value!r}") from None
    for v in items:
        if not isinstance(v, int | np.integer) or isinstance(v, bool):
            raise ArgumentError(
                f"{what} must be a sequence of integers, got {value!r} "
                f"({v!r} is a {type(v).__name__}, not an integer)"
            )
    out = tuple(int(v) for v in items)
    lo = 0 if allow_zero else 1
    if any(v < lo for v in out):
        raise ArgumentError(f"{what} {out} must be {'non-negative' if allow_zero else 'positive'}")
    return out
