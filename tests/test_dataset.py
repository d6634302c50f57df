"""Sub-filed datasets: section reads and writes against a numpy oracle, codecs, dtypes, errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import strataio
from strataio.errors import (
    ChecksumError,
    ClosedError,
    CodecError,
    DtypeMismatchError,
    ExistsError,
    MetadataError,
    NotFoundError,
    ReadOnlyError,
    SelectionError,
    ShapeMismatchError,
    StrataError,
)

ALL_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]
CODECS = [None, "zstd", "blosc", "gzip", "crc32c", "zstd+crc32c"]


def _random(shape, dtype, rng):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(shape) > 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def _chunk_files(path):
    root = os.path.join(path, "c")
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_round_trips(tmp_path, dtype):
    rng = np.random.default_rng(1)
    a = _random((37, 23), dtype, rng)
    ds = strataio.create_dataset(tmp_path / "a", a.shape, dtype, (8, 10))
    ds[...] = a
    back = strataio.open_dataset(tmp_path / "a")
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back[...], a)
    np.testing.assert_array_equal(back[3:30, 5:6], a[3:30, 5:6])


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", [">f8", "<i4", "uint8"])
def test_codecs_and_endianness(tmp_path, codec, dtype):
    rng = np.random.default_rng(2)
    a = _random((50, 41), dtype, rng)
    ds = strataio.create_dataset(tmp_path / "a", a.shape, dtype, (16, 16), codec=codec)
    ds[:] = a
    ds.close()
    back = strataio.open_dataset(tmp_path / "a")
    np.testing.assert_array_equal(back[:], a)
    meta = json.loads((tmp_path / "a" / "zarr.json").read_text())
    names = [c["name"] for c in meta["codecs"]]
    assert names[0] == "bytes"
    if codec:
        assert names[1:] == codec.split("+")
    if np.dtype(dtype).itemsize > 1:
        expected = "big" if np.dtype(dtype).byteorder == ">" else "little"
        assert meta["codecs"][0]["configuration"]["endian"] == expected


def test_missing_chunks_read_fill_value_and_partial_writes_keep_neighbours(tmp_path):
    ds = strataio.create_dataset(tmp_path / "a", (30, 30), "int32", (7, 7), fill_value=-5)
    oracle = np.full((30, 30), -5, dtype="int32")
    np.testing.assert_array_equal(ds[:], oracle)
    assert ds.nchunks_stored() == 0
    ds[3:9, 4:20] = 11
    oracle[3:9, 4:20] = 11
    ds[25:, 25:] = np.arange(25).reshape(5, 5)
    oracle[25:, 25:] = np.arange(25).reshape(5, 5)
    np.testing.assert_array_equal(ds[:], oracle)
    # only the chunks the writes touched exist on disk
    assert ds.nchunks_stored() == 2 * 3 + 2 * 2


def test_edge_chunks_are_stored_full_size(tmp_path):
    ds = strataio.create_dataset(tmp_path / "a", (10, 10), "float64", (4, 4))
    ds[:] = 1.0
    sizes = {os.path.getsize(f) for f in _chunk_files(tmp_path / "a")}
    assert sizes == {4 * 4 * 8}


def test_read_section_write_section(tmp_path):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((40, 30, 20)).astype("float32")
    ds = strataio.create_dataset(tmp_path / "a", a.shape, "float32", (9, 8, 7))
    ds.write_section((0, 0, 0), a)
    block = rng.standard_normal((5, 6, 7)).astype("float32")
    ds.write_section((30, 20, 10), block)
    a[30:35, 20:26, 10:17] = block
    out = np.empty((12, 30, 3), dtype="float32")
    res = ds.read_section((1, 0, 17), (13, 30, 20), out=out)
    assert res is out
    np.testing.assert_array_equal(out, a[1:13, :, 17:20])
    np.testing.assert_array_equal(ds.read_section((0, 0, 0), (40, 30, 20)), a)


def test_integer_indices_drop_axes_and_scalars(tmp_path):
    a = np.arange(60, dtype="int64").reshape(3, 4, 5)
    ds = strataio.create_dataset(tmp_path / "a", a.shape, "int64", (2, 2, 2))
    ds[...] = a
    assert ds[1, 2, 3] == a[1, 2, 3]
    np.testing.assert_array_equal(ds[1], a[1])
    np.testing.assert_array_equal(ds[..., -1], a[..., -1])
    np.testing.assert_array_equal(ds[-1, 1:3], a[-1, 1:3])
    ds[2, :, 0] = [7, 8, 9, 10]
    a[2, :, 0] = [7, 8, 9, 10]
    np.testing.assert_array_equal(np.asarray(ds), a)


def test_zero_dimensional_and_empty(tmp_path):
    ds = strataio.create_dataset(tmp_path / "s", (), "float64", ())
    ds[...] = 3.5
    assert strataio.open_dataset(tmp_path / "s")[...] == 3.5
    e = strataio.create_dataset(tmp_path / "e", (0, 5), "int8", (2, 2))
    assert e[:].shape == (0, 5)
    e[:] = np.zeros((0, 5), dtype="int8")  # nothing to write, no error
    assert e.nchunks_stored() == 0


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_sections_match_numpy(tmp_path_factory, data):
    nd = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.integers(1, 12)) for _ in range(nd))
    chunks = tuple(data.draw(st.integers(1, 6)) for _ in range(nd))
    codec = data.draw(st.sampled_from([None, "zstd+crc32c"]))
    path = tmp_path_factory.mktemp("h") / "a"
    ds = strataio.create_dataset(path, shape, "int32", chunks, codec=codec, fill_value=-1)
    oracle = np.full(shape, -1, dtype="int32")
    for step in range(4):
        lo = [data.draw(st.integers(0, n)) for n in shape]
        hi = [data.draw(st.integers(a, n)) for a, n in zip(lo, shape)]
        box = tuple(slice(a, b) for a, b in zip(lo, hi))
        values = np.arange(np.prod([b - a for a, b in zip(lo, hi)]), dtype="int32") + 100 * step
        values = values.reshape([b - a for a, b in zip(lo, hi)])
        ds[box] = values
        oracle[box] = values
        lo2 = [data.draw(st.integers(0, n)) for n in shape]
        hi2 = [data.draw(st.integers(a, n)) for a, n in zip(lo2, shape)]
        np.testing.assert_array_equal(
            ds.read_section(lo2, hi2), oracle[tuple(map(slice, lo2, hi2))]
        )
    np.testing.assert_array_equal(ds[...], oracle)


def test_attrs_persist(tmp_path):
    ds = strataio.create_dataset(tmp_path / "a", (4,), "int8", (2,), attrs={"units": "K"})
    ds.attrs["step"] = 3
    back = strataio.open_dataset(tmp_path / "a")
    assert dict(back.attrs) == {"units": "K", "step": 3}
    with pytest.raises(ReadOnlyError):
        back.attrs["x"] = 1


# ------------------------------------------------------------------------------ errors
@pytest.fixture
def ds(tmp_path):
    d = strataio.create_dataset(tmp_path / "a", (20, 20), "float32", (6, 6), codec="crc32c")
    d[:] = 1.0
    return d


def _snapshot(path):
    return {f: open(f, "rb").read() for f in _chunk_files(path)}


@pytest.mark.parametrize(
    ("index", "value", "error"),
    [
        ((slice(0, 5), slice(0, 5)), np.zeros((4, 5)), ShapeMismatchError),
        ((slice(0, 5),), np.zeros((5, 21)), ShapeMismatchError),
        ((slice(0, 25), slice(None)), 0.0, SelectionError),
        ((slice(0, 10, 2), slice(None)), 0.0, SelectionError),
        ((20, 0), 0.0, SelectionError),
        ((0, 0, 0), 0.0, SelectionError),
        ((Ellipsis, Ellipsis), 0.0, SelectionError),
        ((slice(0, 2), slice(0, 2)), np.array([["a", "b"], ["c", "d"]]), DtypeMismatchError),
        ((slice(0, 2), slice(0, 2)), np.ones((2, 2), dtype=np.complex64), DtypeMismatchError),
        (([0, 1], slice(None)), 0.0, SelectionError),
    ],
)
def test_bad_writes_raise_and_write_nothing(ds, tmp_path, index, value, error):
    before = _snapshot(tmp_path / "a")
    with pytest.raises(error) as info:
        ds[index] = value
    assert isinstance(info.value, StrataError)
    assert str(info.value)
    assert _snapshot(tmp_path / "a") == before


def test_bad_section_calls(ds):
    with pytest.raises(SelectionError, match="out of bounds"):
        ds.read_section((0, 0), (21, 5))
    with pytest.raises(SelectionError):
        ds.read_section((5, 0), (4, 5))
    with pytest.raises(ShapeMismatchError):
        ds.read_section((0, 0), (2, 2), out=np.empty((3, 2), dtype="float32"))
    with pytest.raises(DtypeMismatchError):
        ds.read_section((0, 0), (2, 2), out=np.empty((2, 2), dtype="float64"))
    with pytest.raises(ShapeMismatchError):
        ds.write_section((0,), np.zeros(3, dtype="float32"))
    with pytest.raises(SelectionError):
        ds.write_section((18, 18), np.zeros((3, 3), dtype="float32"))


def test_read_only_and_closed(tmp_path, ds):
    ds.close()
    with pytest.raises(ClosedError):
        ds[0, 0]
    ro = strataio.open_dataset(tmp_path / "a")
    with pytest.raises(ReadOnlyError):
        ro[0, 0] = 1.0
    with pytest.raises(ReadOnlyError):
        ro.write_section((0, 0), np.zeros((1, 1), dtype="float32"))


def test_corrupt_chunk_is_detected(tmp_path, ds):
    ds.close()
    victim = _chunk_files(tmp_path / "a")[0]
    with open(victim, "r+b") as f:
        raw = bytearray(f.read())
        raw[10] ^= 0xFF
        f.seek(0)
        f.write(raw)
    back = strataio.open_dataset(tmp_path / "a")
    with pytest.raises(ChecksumError):
        back[0:3, 0:3]


def test_truncated_raw_chunk_is_detected(tmp_path):
    d = strataio.create_dataset(tmp_path / "a", (8, 8), "int16", (4, 4))
    d[:] = 1
    victim = _chunk_files(tmp_path / "a")[0]
    os.truncate(victim, 5)
    with pytest.raises(CodecError, match="truncated"):
        d[0:2, 0:2]


def test_create_and_open_errors(tmp_path):
    with pytest.raises(CodecError, match="unknown codec"):
        strataio.create_dataset(tmp_path / "a", (4,), "f4", (2,), codec="lzma9")
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())
    with pytest.raises(StrataError, match="dtype"):
        strataio.create_dataset(tmp_path / "b", (4,), "U3", (2,))
    with pytest.raises(StrataError, match="chunks"):
        strataio.create_dataset(tmp_path / "c", (4, 4), "f4", (2,))
    with pytest.raises(StrataError, match="positive"):
        strataio.create_dataset(tmp_path / "d", (4,), "f4", (0,))
    strataio.create_dataset(tmp_path / "e", (4,), "f4", (2,))
    with pytest.raises(ExistsError):
        strataio.create_dataset(tmp_path / "e", (4,), "f4", (2,))
    strataio.create_dataset(tmp_path / "e", (6,), "f4", (2,), overwrite=True)
    assert strataio.open_dataset(tmp_path / "e").shape == (6,)
    with pytest.raises(NotFoundError):
        strataio.open_dataset(tmp_path / "nope")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "zarr.json").write_text("{not json")
    with pytest.raises(MetadataError):
        strataio.open_dataset(tmp_path / "bad")
    with pytest.raises(StrataError, match="mode"):
        strataio.open_dataset(tmp_path / "e", mode="w")
