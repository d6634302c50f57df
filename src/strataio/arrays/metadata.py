"""Zarr v3 array metadata (``zarr.json``): parse, validate and serialize.

Only what strataio writes and reads is accepted: a regular chunk grid, the default chunk key
encoding (separator ``/`` or ``.``), and the codecs of :mod:`strataio.arrays.codecs`, alone or
inside one ``sharding_indexed`` codec (:mod:`strataio.arrays.sharding`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from strataio.arrays.codecs import CodecSpec, normalize_codecs
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
    v = np.asarray(value, dtype=dtype).item()
    if dtype.kind == "b":
        return bool(v)
    if dtype.kind in "iu":
        return int(v)
    if dtype.kind == "f":
        return _float_to_json(float(v))
    if dtype.kind == "c":
        return [_float_to_json(v.real), _float_to_json(v.imag)]
    raise MetadataError(f"no fill value encoding for {dtype}")


def _float_to_json(f: float) -> Any:
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "Infinity" if f > 0 else "-Infinity"
    return f


def _fill_from_json(value: Any, dtype: np.dtype) -> Any:
    special = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
    if dtype.kind == "c" and isinstance(value, list):
        re, im = (special.get(x, x) if isinstance(x, str) else x for x in value)
        return np.asarray(complex(re, im), dtype=dtype)[()]
    if isinstance(value, str):
        if value in special:
            value = special[value]
        elif value.startswith("0x"):
            return np.frombuffer(
                int(value, 16).to_bytes(dtype.itemsize, "big"), dtype.newbyteorder(">")
            )[0]
    return np.asarray(value, dtype=dtype)[()]


def json_attrs(attrs: Any) -> dict[str, Any]:
    """User attributes as ``zarr.json`` holds them: plain JSON values (numpy scalars and
    arrays become numbers and lists). Raises :class:`ArgumentError` for anything JSON does
    not hold, NaN and infinities included: written bare, they make ``zarr.json`` a file
    strict JSON readers (TensorStore) refuse."""
    if attrs is None:
        return {}
    if not isinstance(attrs, dict):
        raise ArgumentError("attrs must be a dict of JSON values")

    def plain(value: Any) -> Any:
        if isinstance(value, np.generic | np.ndarray):
            return value.tolist()
        raise TypeError(f"{type(value).__name__} {value!r} is not a JSON value")

    try:
        return json.loads(json.dumps(attrs, allow_nan=False, default=plain))
    except TypeError as exc:
        raise ArgumentError(f"attrs: {exc}") from None
    except ValueError:
        raise ArgumentError(
            "attrs: NaN and infinities are not JSON values (strict readers such as "
            "TensorStore refuse the file); store them as strings, e.g. 'NaN'"
        ) from None


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
        whole = chunks is None
        if chunks is None:
            chunks = shape_t
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
        return cls(shape_t, dt.newbyteorder("="), chunks_t, codecs, fill, plain, "/", names)

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
        return json.dumps(doc, indent=2).encode()

    @classmethod
    def from_json(cls, raw: bytes | str, where: str = "zarr.json") -> ArrayMetadata:
        """The metadata a ``zarr.json`` holds. :class:`MetadataError` names ``where`` and
        says what is wrong: not JSON, not a Zarr v3 array, malformed, or naming what strataio
        does not support (a data type, a codec, a chunk grid or key encoding, chunks larger
        than :data:`~strataio.arrays.codecs.MAX_CHUNK_BYTES`)."""
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MetadataError(f"{where} is not valid JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("zarr_format") != 3:
            raise MetadataError(f"{where} is not Zarr v3 metadata (zarr_format != 3)")
        if doc.get("node_type") != "array":
            raise MetadataError(f"{where} describes a {doc.get('node_type')!r}, not an array")
        try:
            grid = doc["chunk_grid"]
            if grid.get("name") != "regular":
                raise MetadataError(f"{where}: chunk grid {grid.get('name')!r} is not supported")
            enc = doc.get("chunk_key_encoding", {"name": "default"})
            if enc.get("name") != "default":
                raise MetadataError(
                    f"{where}: chunk key encoding {enc.get('name')!r} is not supported"
                )
            sep = (enc.get("configuration") or {}).get("separator", "/")
            name = doc["data_type"]
            if name not in DATA_TYPES.values():
                raise MetadataError(f"{where}: data type {name!r} is not supported")
            dt = np.dtype(name)
            if doc.get("storage_transformers"):
                raise MetadataError(f"{where}: storage transformers are not supported")
            shape = tuple(int(n) for n in doc["shape"])
            names = _dimension_names(
                doc.get("dimension_names"), len(shape), MetadataError, f"{where}: dimension_names"
            )
            meta = cls(
                shape=shape,
                dtype=dt,
                chunks=tuple(int(n) for n in grid["configuration"]["chunk_shape"]),
                codecs=list(doc["codecs"]),
                fill_value=_fill_from_json(doc.get("fill_value", 0), dt),
                attrs=dict(doc.get("attributes") or {}),
                separator=sep,
                dimension_names=names,
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


def _fill(value: Any, dtype: np.dtype) -> Any:
    """The fill value as a scalar of ``dtype``, converted by the rules writes follow."""
    what = f"fill_value {value!r}"
    if value is None:
        value = 0
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"{what} is not a number: {exc}") from None
    if arr.ndim != 0:
        raise ArgumentError(f"{what} must be a scalar, got shape {arr.shape}")
    if dtype.kind == "b" and arr.dtype.kind in "iu" and arr.item() in (0, 1):
        arr = arr.astype(bool)  # the default fill value 0 on a bool array
    return to_dtype(arr, dtype, what).astype(dtype)[()]


def _int_tuple(value: Any, what: str, allow_zero: bool) -> tuple[int, ...]:
    if isinstance(value, int | np.integer):
        value = (value,)
    try:
        out = tuple(int(v) for v in value)
        if any(int(v) != v for v in value):
            raise ValueError
    except (TypeError, ValueError):
        raise ArgumentError(f"{what} must be a sequence of integers, got {value!r}") from None
    lo = 0 if allow_zero else 1
    if any(v < lo for v in out):
        raise ArgumentError(f"{what} {out} must be {'non-negative' if allow_zero else 'positive'}")
    return out
