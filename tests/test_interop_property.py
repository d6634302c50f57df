"""strataio, zarr-python and TensorStore read and update each other's Zarr v3 arrays, value
for value and field for field: random shapes (0-d, dimensions of length 0 or 1, extents not a
multiple of the chunk), chunks, shards, dtypes (either byte order), fill values (NaN, 0,
others), codecs, attributes and partial writes, checked against a numpy array holding what
was written."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import tensorstore as ts
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import strataio
from hunt import examples

DTYPES = [
    "bool",
    "int8",
    "uint8",
    "<i2",
    ">i2",
    "<u2",
    "<i4",
    ">u4",
    "<i8",
    ">i8",
    "<u8",
    "<f2",
    ">f2",
    "<f4",
    ">f4",
    "<f8",
    ">f8",
    "<c8",
    ">c8",
    "<c16",
    ">c16",
]

#: strataio's codec argument and the same codecs as zarr-python's compressors
CODECS = {
    None: None,
    "crc32c": [{"name": "crc32c"}],
    "zstd": [{"name": "zstd", "configuration": {"level": 0, "checksum": False}}],
    "zstd+crc32c": [
        {"name": "zstd", "configuration": {"level": 0, "checksum": False}},
        {"name": "crc32c"},
    ],
    "gzip": [{"name": "gzip", "configuration": {"level": 5}}],
    "blosc": [
        {
            "name": "blosc",
            "configuration": {"cname": "zstd", "clevel": 5, "shuffle": "shuffle", "blocksize": 0},
        }
    ],
    "lz4": [
        {
            "name": "blosc",
            "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "blocksize": 0},
        }
    ],
}


def _special(dtype: np.dtype) -> list:
    """Values of ``dtype`` codecs and fill values get wrong first: extremes, -0.0, NaNs."""
    if dtype.kind == "b":
        return [False, True]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return [0, 1, info.min, info.max]
    if dtype.kind == "f":
        native = dtype.newbyteorder("=")
        # (NaNs other than Zarr's "NaN": its sign bit set, a payload)
        odd = [np.array(-np.nan, native)[()], np.array(np.nan, native).view(f"u{native.itemsize}")]
        odd[1] = (odd[1] + 1).view(native)[()]
        return [0.0, -0.0, 1.5, np.nan, np.inf, -np.inf, float(np.finfo(dtype).max), *odd]
    odd = np.array([-np.nan, 1.0], f"f{dtype.itemsize // 2}").view(dtype.newbyteorder("="))[0]
    return [0, complex(np.nan, 1), complex(-0.0, np.inf), 2.5 - 1j, odd]


@st.composite
def arrays(draw):
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.integers(0, 9)) for _ in range(ndim))
    chunks = tuple(draw(st.integers(1, max(n, 1) + 2)) for n in shape)
    shards = None
    if ndim and draw(st.booleans()):
        shards = tuple(c * draw(st.integers(1, 3)) for c in chunks)
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    fills = _special(dtype)
    if dtype.kind == "f" and dtype.itemsize == 2:
        fills = fills[:-2]  # (zarr-python 3.1 reads a float16 "0x" fill value as "NaN")
    fill = draw(st.sampled_from(fills))
    codec = draw(st.sampled_from(sorted(CODECS, key=str)))
    attrs = draw(
        st.dictionaries(
            st.text(max_size=4),
            st.recursive(
                st.none()
                | st.booleans()
                | st.integers(-(2**53), 2**53)
                | st.floats(allow_nan=False, allow_infinity=False)
                | st.text(max_size=4),
                lambda inner: (
                    st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=3)
                ),
                max_leaves=5,
            ),
            max_size=3,
        )
    )
    dims = draw(st.none() | st.lists(st.none() | st.text(max_size=3), min_size=ndim, max_size=ndim))
    return shape, chunks, shards, dtype, fill, codec, attrs, dims


@st.composite
def boxes(draw, shape):
    """A box of ``shape`` (start and stop per dimension), possibly empty."""
    start, stop = [], []
    for n in shape:
        a = draw(st.integers(0, n))
        b = draw(st.integers(a, n))
        start.append(a)
        stop.append(b)
    return tuple(start), tuple(stop)


def _values(draw, dtype: np.dtype, shape: tuple[int, ...], fill) -> np.ndarray:
    """Values of ``dtype``, some of them special (NaNs, infinities, -0.0, extremes); with
    ``fill`` everywhere or at most places (chunks that are the fill value are not stored)."""
    seed = draw(st.integers(0, 2**32 - 1))
    of_fill = draw(st.sampled_from([0.0, 0.0, 0.9, 1.0]))
    rng = np.random.default_rng(seed)
    n = math.prod(shape)
    if dtype.kind == "b":
        flat = rng.integers(0, 2, n).astype(bool)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, n, dtype=dtype.newbyteorder("="), endpoint=True)
    elif dtype.kind == "f":
        flat = (rng.standard_normal(n) * 100).astype(dtype.newbyteorder("="))
    else:
        flat = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(
            dtype.newbyteorder("=")
        )
    special = _special(dtype)
    for i in range(n):
        if rng.random() < of_fill:
            flat[i] = fill
        elif rng.random() < 0.2:
            flat[i] = special[rng.integers(len(special))]
    return flat.reshape(shape).astype(dtype)


def _same(got: np.ndarray, want: np.ndarray, who: str) -> None:
    """Equal bit for bit (-0.0 is not 0.0, NaNs keep their sign and payload)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (who, got.shape, want.shape)
    native = want.dtype.newbyteorder("=")
    assert got.dtype.newbyteorder("=") == native, (who, got.dtype, want.dtype)
    g, w = got.astype(native), want.astype(native)
    if native.kind in "fc":
        np.testing.assert_array_equal(g, w, err_msg=who)  # (first, for a readable message)
        bits = f"u{native.itemsize // 2}" if native.kind == "c" else f"u{native.itemsize}"
        g, w = g.reshape(-1).view(bits), w.reshape(-1).view(bits)
    np.testing.assert_array_equal(g, w, err_msg=who)


def _same_fill(got, want, dtype: np.dtype, who: str) -> None:
    _same(np.asarray(got, dtype=dtype), np.asarray(want, dtype=dtype), f"{who} fill_value")


def _check_metadata(path: Path, shape, chunks, shards, dtype, fill, attrs, dims) -> None:
    z = zarr.open_array(str(path), mode="r")
    ds = strataio.open_dataset(path)
    assert z.shape == ds.shape == shape
    # (zarr-python stores either byte order as its bytes codec says: little unless told)
    assert z.dtype.newbyteorder("=") == np.dtype(dtype).newbyteorder("=")
    assert ds.dtype == np.dtype(dtype).newbyteorder("=")
    outer = shards or chunks
    assert tuple(z.shards or z.chunks) == ds.chunks == outer
    assert z.chunks == (ds.inner_chunks or ds.chunks) == chunks
    _same_fill(z.fill_value, fill, ds.dtype, "zarr-python")
    _same_fill(ds.fill_value, fill, ds.dtype, "strataio")
    assert dict(z.attrs) == dict(ds.attrs) == attrs
    want_dims = None if dims is None else tuple(dims)
    # (zarr-python leaves out a 0-d array's empty dimension_names)
    assert ds.dims == want_dims or (ds.dims is None and want_dims == ())
    assert z.metadata.dimension_names == ds.dims


def _index(box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in zip(*box))


def _tensorstore(path: Path):
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
    return ts.open(spec).result()


def _tensorstore_opens(dims) -> bool:
    """TensorStore refuses a zarr.json naming two dimensions alike (the spec allows it)."""
    named = [d for d in dims or () if d]
    return len(set(named)) == len(named)


@settings(  # (80 take about 8 s; STRATAIO_HUNT=25 hunts 2000: tests/hunt.py)
    max_examples=examples(80),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(array=arrays(), data=st.data(), strataio_first=st.booleans())
def test_strataio_and_zarr_python_read_and_update_each_others_arrays(array, data, strataio_first):
    """strataio or zarr-python creates the array, then strataio (by index and by
    write_section), zarr-python and TensorStore write boxes of it in turn, and after each
    turn each reads the whole array and a box of it: every value is the one last written
    there, bit for bit, or the fill value; the metadata (shape, dtype, chunks, shards, fill
    value, attributes, dimension names) reads the same."""
    shape, chunks, shards, dtype, fill, codec, attrs, dims = array
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a"
        if strataio_first:
            strataio.create_dataset(
                path,
                shape,
                dtype,
                chunks,
                codec=codec,
                fill_value=fill,
                attrs=attrs,
                dims=dims,
                shards=shards,
            ).close()
        else:
            layout = {"chunks": chunks, "compressors": CODECS[codec]}
            if shards and data.draw(st.booleans()):  # (the index first, and not checksummed)
                inner = [zarr.codecs.BytesCodec(), *(CODECS[codec] or [])]
                sharding = zarr.codecs.ShardingCodec(
                    chunk_shape=chunks,
                    codecs=inner,
                    index_codecs=[zarr.codecs.BytesCodec()],
                    index_location="start",
                )
                layout = {"chunks": shards, "serializer": sharding, "compressors": None}
            elif shards:
                layout["shards"] = shards
            sep = data.draw(st.sampled_from(["/", "."]))
            zarr.create_array(
                str(path),
                shape=shape,
                dtype=dtype,
                fill_value=fill,
                attributes=attrs,
                dimension_names=dims,
                chunk_key_encoding={"name": "default", "separator": sep},
                **layout,
            )
            # (zarr-python writes every NaN fill value as "NaN": the fill is what it kept)
            fill = zarr.open_array(str(path), mode="r").fill_value
        expected = np.full(shape, fill, dtype=dtype)
        _check_metadata(path, shape, chunks, shards, dtype, fill, attrs, dims)
        peers = ["strataio", "zarr-python"] + ["tensorstore"] * _tensorstore_opens(dims)
        who = ""
        for turn in range(4):
            if turn == 0:
                who = "strataio" if strataio_first else "zarr-python"
            else:  # (another writer than the last)
                who = data.draw(st.sampled_from([p for p in peers if p != who]))
            for _ in range(data.draw(st.integers(1, 2))):
                box = data.draw(boxes(shape))
                part = _values(data.draw, dtype, tuple(b - a for a, b in zip(*box)), fill)
                if who == "strataio":
                    with strataio.open_dataset(path, "r+") as ds:
                        if data.draw(st.booleans()):
                            ds.write_section(box[0], part)
                        else:
                            ds[_index(box)] = part
                elif who == "tensorstore":
                    t = _tensorstore(path)
                    t[_index(box)] = part.astype(t.dtype.numpy_dtype)
                else:
                    # (zarr-python leaves out a chunk that equals the fill value where NaN
                    # equals any NaN: a -nan written under a fill of NaN would read as NaN)
                    with zarr.config.set({"array.write_empty_chunks": True}):
                        zarr.open_array(str(path), mode="r+")[_index(box)] = part
                expected[_index(box)] = part
            box = data.draw(boxes(shape))
            ds = strataio.open_dataset(path)
            _same(ds[...], expected, f"strataio after {who}")
            _same(ds.read_section(*box), expected[_index(box)], "strataio section")
            z = zarr.open_array(str(path), mode="r")
            _same(z[...], expected, f"zarr-python after {who}")
            _same(z[_index(box)], expected[_index(box)], "zarr-python section")
            if "tensorstore" in peers:
                t = _tensorstore(path)
                _same(t.read().result(), expected, f"tensorstore after {who}")
                _same(t[_index(box)].read().result(), expected[_index(box)], "ts section")
        # attributes each sets are read by both, and the rest of zarr.json stays as it was
        ds = strataio.open_dataset(path, "r+")
        ds.attrs["by_strataio"] = [1, "x"]
        zarr.open_array(str(path), mode="r+").attrs["by_zarr"] = {"k": None}
        # (zarr-python writes every NaN fill value back as "NaN")
        fill = zarr.open_array(str(path), mode="r").fill_value
        both = {**attrs, "by_strataio": [1, "x"], "by_zarr": {"k": None}}
        _check_metadata(path, shape, chunks, shards, dtype, fill, both, dims)
