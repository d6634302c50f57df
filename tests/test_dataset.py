"""Sub-filed datasets: section reads and writes against a numpy oracle, codecs, dtypes, errors."""

from __future__ import annotations

import errno
import itertools
import json
import os
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import strataio
import strataio.arrays.dataset as dataset_module
from racing import race
from strataio.arrays.dataset import Dataset
from strataio.arrays.store import CountingChunkStore
from strataio.errors import (
    ArgumentError,
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
    ds = strataio.create_dataset(tmp_path / "a", (10, 10), "float64", (4, 4), codec=None)
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
    for got, want in zip(ds, a, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.asarray(ds, dtype="f8", copy=True), a)
    with pytest.raises(ValueError, match="copy=False"):  # numpy 2: no copy, or an error
        np.asarray(ds, copy=False)
    np.testing.assert_array_equal(ds[-1, 1:3], a[-1, 1:3])
    ds[2, :, 0] = [7, 8, 9, 10]
    a[2, :, 0] = [7, 8, 9, 10]
    np.testing.assert_array_equal(np.asarray(ds), a)


def test_zero_dimensional_and_empty(tmp_path):
    ds = strataio.create_dataset(tmp_path / "s", (), "float64", ())
    ds[...] = 3.5
    assert strataio.open_dataset(tmp_path / "s")[...] == 3.5
    # as numpy: an Ellipsis selects a 0-d array, integers alone a scalar
    z = np.array(3.5)
    for index in (..., ()):
        got, want = ds[index], z[index]
        assert type(got) is type(want) and got == want, index
    b = np.arange(6.0).reshape(2, 3)
    m = strataio.create_dataset(tmp_path / "m", b.shape, "float64", (1, 2))
    m[...] = b
    for index in ((1, 2), (1, 2, ...), (..., 1, 2)):
        got, want = m[index], b[index]
        assert type(got) is type(want) and got == want, index
    with pytest.raises(TypeError, match="0-d"):  # as numpy, not an empty iteration
        list(ds)
    e = strataio.create_dataset(tmp_path / "e", (0, 5), "int8", (2, 2))
    assert list(e) == []
    assert e[:].shape == (0, 5)
    e[:] = np.zeros((0, 5), dtype="int8")  # nothing to write, no error
    assert e.nchunks_stored() == 0
    # chunks=None (the whole array one chunk) takes 1 along an empty dimension
    w = strataio.create_dataset(tmp_path / "w", (0, 3), "int32")
    assert w.chunks == (1, 3) and w[...].shape == (0, 3)
    assert strataio.open_dataset(tmp_path / "w")[...].shape == (0, 3)


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


def _any_index(shape):
    """A numpy index of up to rank + 1 parts: integers and slice bounds in and out of range,
    slices of any step, ``...`` (sometimes two) and ``None``; bare or in a tuple."""

    def part(n):
        # (mostly what strataio takes, so that most examples read and write)
        bound = st.none() | st.integers(-n, n) | st.integers(-n - 2, n + 2)
        step = st.sampled_from([None] * 6 + [1, -1, 2])
        return st.one_of(
            st.integers(-n, n - 1) if n else st.integers(-1, 0),
            st.builds(slice, bound, bound, step),
            st.builds(slice, bound, bound, step),
            st.integers(-n - 2, n + 1),
            st.just(Ellipsis),
            st.none(),
        )

    at = [shape[min(i, len(shape) - 1)] if shape else 1 for i in range(len(shape) + 2)]
    tuples = st.integers(0, len(shape) + 1).flatmap(lambda k: st.tuples(*map(part, at[:k])))
    return tuples | part(at[0])


def _refused_index(index, shape):
    """Whether strataio refuses ``index`` where numpy takes it (README: basic indices of step
    1, no ``None``, and no slice reaching past the array)."""
    parts = index if isinstance(index, tuple) else (index,)
    if any(x is None or (isinstance(x, slice) and x.step not in (None, 1)) for x in parts):
        return True
    if sum(x is Ellipsis for x in parts) > 1:
        return False  # (numpy refuses it too)
    explicit = [x for x in parts if x is not Ellipsis]
    dims, d = [], 0
    for x in parts:
        if x is Ellipsis:
            d += len(shape) - len(explicit)
        else:
            dims.append((x, shape[d] if d < len(shape) else 0))
            d += 1
    return any(
        b is not None and not -n <= b <= n
        for x, n in dims
        if isinstance(x, slice)
        for b in (x.start, x.stop)
    )


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_index_reads_and_writes_as_numpy_or_is_refused(tmp_path_factory, monkeypatch, data):
    """Against a numpy oracle, plain, sharded and tiered datasets of any rank (zero-length
    dimensions, edge chunks, a non-native dtype): an index either selects what numpy selects
    (scalar or array alike), read again (then from the chunk cache) and written with values
    of the result's shape or one that broadcasts to it, in any memory layout; or it is
    refused with ``SelectionError`` (an ``IndexError``, as numpy's for an integer out of
    range), as are data that do not fit, before any byte is written."""
    from strataio.arrays import chunk_cache as cache_module
    from strataio.storage.posix import PosixBackend
    from strataio.tiers.tier import Tier, TierSet

    monkeypatch.setattr(cache_module, "SETTLE_NS", 0)  # (cache chunks written moments ago)
    nd = data.draw(st.integers(0, 3))
    shape = tuple(data.draw(st.integers(0, 7)) for _ in range(nd))
    chunks = tuple(data.draw(st.integers(1, max(1, n))) for n in shape)
    dtype = data.draw(st.sampled_from(["int16", ">i4", "<f8"]))
    codec = data.draw(st.sampled_from([None, "crc32c", "zstd"]))
    root = tmp_path_factory.mktemp("i")
    session = None
    if data.draw(st.booleans()):
        tiers = TierSet(
            [
                Tier("local", PosixBackend(root / "local"), "localdisk", order=0),
                Tier("tape", PosixBackend(root / "tape"), "remotetape", order=1),
            ]
        )
        session = strataio.Session(tiers=tiers, catalog=root / "cat.db")
        ds = session.create_dataset("a", shape, dtype, chunks, codec=codec, fill_value=7)
        chunk_dir = root
    else:
        shards = None
        if shape and data.draw(st.booleans()):
            shards = tuple(c * data.draw(st.integers(1, 3)) for c in chunks)
        chunk_dir = root / "a"
        ds = strataio.create_dataset(
            chunk_dir, shape, dtype, chunks, codec=codec, fill_value=7, shards=shards
        )
    a = np.full(shape, 7, dtype=dtype)
    try:
        if data.draw(st.booleans()):
            ds[...] = a[...] = np.arange(a.size, dtype="int16").reshape(shape)
        for _ in range(3):
            index = data.draw(_any_index(shape))
            try:
                want = a[index]
            except IndexError:
                with pytest.raises(SelectionError):
                    ds[index]
                continue
            if _refused_index(index, shape):
                with pytest.raises(SelectionError):
                    ds[index]
                continue
            for _ in range(data.draw(st.integers(1, 3))):
                got = ds[index]
                assert type(got) is type(want) and np.shape(got) == np.shape(want), index
                np.testing.assert_array_equal(got, want)
            rs = np.shape(want)
            values = data.draw(
                st.sampled_from(
                    [
                        np.arange(int(np.prod(rs)), dtype="int16").reshape(rs) + 100,
                        np.int16(42),
                        np.arange(rs[-1] if rs else 1, dtype="int16")[-1 if not rs else ...] + 50,
                        np.full((1,) * len(rs), 9, dtype="int16"),
                    ]
                )
            )
            if values.ndim:
                values = data.draw(
                    st.sampled_from(
                        [
                            values,
                            np.asfortranarray(values),
                            values.astype(values.dtype.newbyteorder()),
                            values[(slice(None, None, -1),) * values.ndim].copy()[
                                (slice(None, None, -1),) * values.ndim
                            ],
                        ]
                    )
                )
            if data.draw(st.integers(0, 4)) == 0:  # data that does not fit: nothing is written
                before = {p: p.read_bytes() for p in chunk_dir.rglob("c/**/*") if p.is_file()}
                bad = np.zeros((*rs, 2), dtype="int16") if data.draw(st.booleans()) else 0.5j
                with pytest.raises((ShapeMismatchError, DtypeMismatchError)):
                    ds[index] = bad
                after = {p: p.read_bytes() for p in chunk_dir.rglob("c/**/*") if p.is_file()}
                assert after == before
            ds[index] = values
            a[index] = values
            np.testing.assert_array_equal(ds[...], a)
    finally:
        ds.close()
    if session is not None:
        with session:
            np.testing.assert_array_equal(session.open_dataset("a")[...], a)
    else:
        np.testing.assert_array_equal(strataio.open_dataset(chunk_dir)[...], a)


def test_attrs_persist(tmp_path):
    ds = strataio.create_dataset(tmp_path / "a", (4,), "int8", (2,), attrs={"units": "K"})
    ds.attrs["step"] = 3
    back = strataio.open_dataset(tmp_path / "a")
    assert dict(back.attrs) == {"units": "K", "step": 3}
    with pytest.raises(ReadOnlyError):
        back.attrs["x"] = 1


def test_attrs_set_through_two_handles_both_stay_and_a_replaced_array_is_left_alone(
    tmp_path,
):
    """Setting an attribute applies it to the attributes zarr.json holds now, so two handles
    setting different ones keep both. A handle of an array replaced since (overwrite) may
    not write its old metadata over the new array's: MetadataError, zarr.json unchanged."""
    one = strataio.create_dataset(tmp_path / "a", (4,), "f8", (2,))
    two = strataio.open_dataset(tmp_path / "a", "r+")
    one.attrs["p"] = 1
    two.attrs["q"] = 2
    assert dict(strataio.open_dataset(tmp_path / "a").attrs) == {"p": 1, "q": 2}
    new = strataio.create_dataset(tmp_path / "a", (9,), "i2", (3,), overwrite=True)
    new[...] = 5
    now = (tmp_path / "a" / "zarr.json").read_bytes()
    with pytest.raises(MetadataError, match="changed since this handle opened it"):
        one.attrs["note"] = "stale"
    assert (tmp_path / "a" / "zarr.json").read_bytes() == now
    np.testing.assert_array_equal(strataio.open_dataset(tmp_path / "a")[...], 5)


#: changes the attributes of the dataset at argv[1] (see racing.set_and_delete_attrs)
_SETTER = """
import sys
import strataio
from racing import set_and_delete_attrs
ds = strataio.open_dataset(sys.argv[1], "r+")
set_and_delete_attrs(ds, sys.argv[2:])
ds.close()
"""


def test_attrs_set_and_deleted_by_two_processes_at_once_all_take_effect(tmp_path):
    """Two processes set 30 attributes each, one at a time, at once, each deleting 10 others
    meanwhile: every change applies to what zarr.json holds then, under the array's lock, so
    every set stays and every deleted one goes. Without the lock, of two changes that
    overlapped only the later one stayed: attributes set were lost and deleted ones came
    back. The lock file is gone once the changes are over."""
    path = tmp_path / "a"
    drop = [f"d{i}" for i in range(20)]
    attrs = {"units": "K"} | dict.fromkeys(drop, 0)
    strataio.create_dataset(path, (4,), "f4", (2,), attrs=attrs).close()
    race(_SETTER, [[str(path), "x", "30", *drop[:10]], [str(path), "y", "30", *drop[10:]]])
    want = {"units": "K"} | {f"{k}{i}": i for k in "xy" for i in range(30)}
    assert dict(strataio.open_dataset(path).attrs) == want
    assert sorted(p.name for p in path.iterdir()) == ["zarr.json"]


def test_attrs_are_plain_json_that_strict_readers_take(tmp_path):
    """numpy scalars and arrays are stored as numbers and lists; NaN, infinities and objects
    JSON does not hold are refused with ArgumentError before zarr.json is written (a bare
    NaN in it makes TensorStore refuse the array)."""
    import tensorstore as ts

    ds = strataio.create_dataset(
        tmp_path / "a", (4,), "f4", (2,), attrs={"scale": np.float32(0.5), "axes": np.arange(2)}
    )
    assert dict(ds.attrs) == {"scale": 0.5, "axes": [0, 1]}
    before = (tmp_path / "a" / "zarr.json").read_bytes()
    for bad in (float("nan"), float("inf"), object(), {"deep": [np.float64("nan")]}):
        with pytest.raises(ArgumentError, match="attrs"):
            ds.attrs["bad"] = bad
    with pytest.raises(ArgumentError, match="NaN"):
        strataio.create_dataset(tmp_path / "b", (4,), "f4", (2,), attrs={"x": float("nan")})
    assert (tmp_path / "a" / "zarr.json").read_bytes() == before
    assert not (tmp_path / "b" / "zarr.json").exists()
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "a")}}
    assert ts.open(spec).result().shape == (4,)


def test_strings_that_are_not_unicode_text_are_refused_in_attrs_and_dims(tmp_path):
    """A string with a lone surrogate (``"\\ud800"``), as a value, a key or a dimension name,
    is written by JSON as an escape TensorStore refuses the whole zarr.json for: refused with
    ArgumentError naming where, before zarr.json is written."""
    ds = strataio.create_dataset(tmp_path / "a", (4,), "f4", (2,), attrs={"é": "😀"})
    before = (tmp_path / "a" / "zarr.json").read_bytes()
    for key, value, says in (
        ("x", "a\ud800", r"attrs\['x'\]: 'a\\ud800' is not Unicode text"),
        ("x", {"deep": ["\udfff"]}, r"attrs\['x'\]\['deep'\]\[0\]"),
        ("\ud800", 1, r"attrs key: '\\ud800'"),
    ):
        with pytest.raises(ArgumentError, match=says):
            ds.attrs[key] = value
    with pytest.raises(ArgumentError, match="attrs"):
        strataio.create_dataset(tmp_path / "b", (4,), "f4", (2,), attrs={"k": "\ud800"})
    with pytest.raises(ArgumentError, match=r"dims\[1\]: '\\udc00' is not Unicode text"):
        strataio.create_dataset(tmp_path / "c", (4, 2), "f4", dims=("y", "\udc00"))
    assert (tmp_path / "a" / "zarr.json").read_bytes() == before
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "a")}}
    import tensorstore as ts

    assert ts.open(spec).result().shape == (4,)
    assert dict(strataio.open_dataset(tmp_path / "a").attrs) == {"é": "😀"}


def test_attribute_keys_that_are_no_strings_are_refused_not_renamed(tmp_path):
    """JSON writes a key 3 as "3": an attribute set under 3, or a mapping inside one keyed
    so, read back under another key. Refused with ArgumentError, saying where and what it
    would have become, before zarr.json is written."""
    ds = strataio.create_dataset(tmp_path / "a", (4,), "f4", (2,))
    before = (tmp_path / "a" / "zarr.json").read_bytes()
    for key, value, says in (
        (3, 1, r"attrs: key 3 \(int\) .* read back as '3'"),
        ("x", [{None: 1}], r"attrs\['x'\]\[0\]: key None .* read back as 'null'"),
        ((1, 2), 0, "JSON cannot hold it"),
    ):
        with pytest.raises(ArgumentError, match=says):
            ds.attrs[key] = value
    with pytest.raises(ArgumentError, match="key 1.5"):
        strataio.create_dataset(tmp_path / "b", (4,), "f4", (2,), attrs={1.5: 0})
    assert (tmp_path / "a" / "zarr.json").read_bytes() == before
    assert not (tmp_path / "b").exists()
    ds.attrs["ok"] = {"nested": [{"k": 1}]}
    assert strataio.open_dataset(tmp_path / "a").attrs["ok"] == {"nested": [{"k": 1}]}


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
    assert str(tmp_path / "a") in str(info.value)  # names the dataset
    assert _snapshot(tmp_path / "a") == before


def test_bad_section_calls(ds):
    for bad in (
        lambda: ds.read_section((0, 0), (21, 5)),
        lambda: ds.read_section((0, 0), (2, 2), out=np.empty((2, 2), dtype="float64")),
        lambda: ds.write_section((0,), np.zeros(3, dtype="float32")),
        lambda: ds[0, 0, 0],
    ):
        with pytest.raises(StrataError, match="dataset '.*a'"):
            bad()
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


@pytest.mark.parametrize("start", [(None, 0), 0, None, (0.5, 0), ("1", 0), ([0], 0)])
def test_a_write_section_corner_that_is_no_integers_is_a_selection_error(ds, tmp_path, start):
    before = _snapshot(tmp_path / "a")
    with pytest.raises(SelectionError, match="dataset '.*a'.*start"):
        ds.write_section(start, np.zeros((1, 1), dtype="float32"))
    assert _snapshot(tmp_path / "a") == before


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
    d = strataio.create_dataset(tmp_path / "a", (8, 8), "int16", (4, 4), codec=None)
    d[:] = 1
    victim = _chunk_files(tmp_path / "a")[0]
    os.truncate(victim, 5)
    with pytest.raises(CodecError, match="truncated"):
        d[0:2, 0:2]


@pytest.mark.parametrize("codec", [None, "crc32c"])
def test_a_partial_write_over_a_truncated_chunk_names_it_and_writes_nothing(tmp_path, codec):
    """A partial write reads the chunk it updates (in one batch of span reads for plain
    chunks): a stored chunk of the wrong size is refused as a read of it is, and the write
    leaves every chunk as it was; a chunk never written starts from the fill value."""
    ds = strataio.create_dataset(tmp_path / "a", (8, 8), "int16", (4, 4), codec=codec, fill_value=3)
    ds[0:4, :] = 1
    victim = tmp_path / "a" / "c" / "0" / "1"
    os.truncate(victim, 5)
    with pytest.raises(CodecError, match=r"chunk 'c/0/1'"):
        ds[0:2, 2:6] = 9
    assert victim.stat().st_size == 5
    np.testing.assert_array_equal(ds[0:4, 0:4], np.ones((4, 4)))
    ds[5:6, 5:7] = 8  # (a chunk never written: the rest of it reads as the fill value)
    want = np.full((4, 4), 3)
    want[1, 1:3] = 8
    np.testing.assert_array_equal(ds[4:8, 4:8], want)


def test_create_and_open_errors(tmp_path):
    with pytest.raises(CodecError, match="dataset '.*a': unknown codec"):
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
    with pytest.raises(NotFoundError, match="nope: no such file or directory"):
        strataio.open_dataset(tmp_path / "nope")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotFoundError, match="file: not a directory"):
        strataio.open_dataset(tmp_path / "file")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "zarr.json").write_text("{not json")
    with pytest.raises(MetadataError):
        strataio.open_dataset(tmp_path / "bad")
    with pytest.raises(StrataError, match="mode"):
        strataio.open_dataset(tmp_path / "e", mode="w")


_GIB = 2**30
_LIMIT = "2147483647 bytes"
#: create_dataset arguments whose chunks (shards, shard index) are too large to hold, and
#: what the error says
_TOO_LARGE = {
    # 8 TiB chunks: a read or write failed with numpy's MemoryError
    "8 TiB": (
        {"shape": (2**40,), "dtype": "f8", "chunks": (2**40,)},
        rf"chunks \(1099511627776,\) of float64 hold 8796093022208 bytes, more than the "
        rf"{_LIMIT} a chunk may hold",
    ),
    # an edge chunk is stored whole: the chunk shape counts, not the array's
    "beyond the array": (
        {"shape": (4, 4), "dtype": "f8", "chunks": (2**20, 2**20), "codec": None},
        r"chunks \(1048576, 1048576\) of float64 hold 8796093022208 bytes",
    ),
    # past numpy's largest array ("Maximum allowed dimension exceeded")
    "past numpy": (
        {"shape": (2**62,), "dtype": "u1", "chunks": (2**62,), "codec": None},
        r"chunks \(4611686018427387904,\) of uint8 hold 4611686018427387904 bytes",
    ),
    "chunks=None": (
        {"shape": (2 * _GIB,), "dtype": "u1", "chunks": None, "codec": "zstd"},
        r"chunks \(2147483648,\) of uint8 hold 2147483648 bytes.*"
        r"\(chunks=None makes the whole array one chunk\)",
    ),
    # blosc (lz4 too) compresses at most 2**31 - 1 - 16 bytes in one buffer
    "blosc": (
        {"shape": (2 * _GIB,), "dtype": "u1", "chunks": (2 * _GIB - 8,), "codec": "lz4"},
        r"chunks \(2147483640,\) of uint8 hold 2147483640 bytes, more than the 2147483631 "
        r"bytes blosc compresses in one buffer",
    ),
    "shards": (
        {"shape": (2**33,), "dtype": "u1", "chunks": (2**20,), "shards": (2**32,)},
        rf"shards \(4294967296,\) of uint8 hold 4294967296 bytes, more than the {_LIMIT} a "
        r"shard may hold",
    ),
    "inner chunks under blosc": (
        {
            "shape": (4,),
            "dtype": "u1",
            "chunks": (2 * _GIB - 8,),
            "shards": (2 * _GIB - 8,),
            "codec": "blosc",
        },
        r"inner chunks \(2147483640,\) of uint8 hold 2147483640 bytes, more than the "
        r"2147483631 bytes blosc",
    ),
    # 16 index bytes per inner chunk: 2**30 inner chunks, a 16 GiB index
    "shard index": (
        {"shape": (_GIB,), "dtype": "u1", "chunks": (1,), "shards": (_GIB,)},
        rf"shards \(1073741824,\) of inner chunks \(1,\) have an index of 17179869188 "
        rf"bytes, more than the {_LIMIT} a shard index may hold",
    ),
}


@pytest.mark.parametrize("case", _TOO_LARGE)
def test_chunks_too_large_to_hold_are_refused_at_create(tmp_path, case):
    """A chunk (a shard, a shard index) is held, encoded and moved whole: one larger than
    MAX_CHUNK_BYTES (blosc: BLOSC_MAX_BYTES) is refused by create_dataset naming its shape,
    its bytes and the limit, and nothing is written, rather than failing on the first read
    or write with numpy's MemoryError or ValueError, or blosc's."""
    kwargs, said = _TOO_LARGE[case]
    with pytest.raises(ArgumentError, match=said) as info:
        strataio.create_dataset(tmp_path / "a", **kwargs)
    assert str(info.value).startswith(f"dataset {str(tmp_path / 'a')!r}: ")
    assert not (tmp_path / "a").exists()


def test_a_dimension_beyond_what_tensorstore_opens_is_refused_at_create(tmp_path):
    """A shape whose zarr.json TensorStore refuses (10**30 numpy cannot index either) is an
    ArgumentError and nothing is written; TensorStore's largest dimension is taken."""
    import tensorstore as ts

    with pytest.raises(ArgumentError, match=r"shape \(4, 10{30}\) is larger than") as info:
        strataio.create_dataset(tmp_path / "a", (4, 10**30), "f4", (2, 2))
    assert str(info.value).startswith(f"dataset {str(tmp_path / 'a')!r}: ")
    assert not (tmp_path / "a").exists()
    with pytest.raises(ArgumentError, match="TensorStore refuses"):
        strataio.create_dataset(tmp_path / "a", (2**62 + 1,), "u1", (4,))
    strataio.create_dataset(tmp_path / "b", (2**62,), "u1", (4,)).close()
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "b")}}
    assert ts.open(spec).result().shape == (2**62,)


def test_chunks_at_the_limit_are_accepted(tmp_path):
    """The limits are inclusive: a chunk of MAX_CHUNK_BYTES, a blosc chunk of blosc's
    largest buffer (creating them writes only zarr.json)."""
    import numcodecs.blosc

    from strataio.arrays.codecs import BLOSC_MAX_BYTES, MAX_CHUNK_BYTES

    assert (MAX_CHUNK_BYTES, BLOSC_MAX_BYTES) == (2**31 - 1, 2**31 - 1 - 16)
    assert BLOSC_MAX_BYTES == numcodecs.blosc.MAX_BUFFERSIZE  # (c-blosc's own limit)
    ds = strataio.create_dataset(tmp_path / "a", (2**40,), "u1", (MAX_CHUNK_BYTES,))
    assert ds.chunks == (MAX_CHUNK_BYTES,)
    ds = strataio.create_dataset(tmp_path / "b", (8,), "u1", (BLOSC_MAX_BYTES,), codec="lz4")
    assert ds.chunks == (BLOSC_MAX_BYTES,)
    assert sorted(os.listdir(tmp_path / "b")) == ["zarr.json"]


def test_a_zarr_json_with_chunks_too_large_is_refused_at_open(tmp_path):
    """A zarr.json (written by another tool, or edited) whose chunks are larger than a chunk
    may hold: MetadataError at open naming the file, the chunk shape, its bytes and the
    limit, rather than a MemoryError on the first read."""
    strataio.create_dataset(tmp_path / "a", (2**40,), "f8", (1024,))
    meta = json.loads((tmp_path / "a" / "zarr.json").read_text())
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [2**40]
    (tmp_path / "a" / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(
        MetadataError,
        match=r"zarr.json: chunks \(1099511627776,\) of float64 "
        r"hold 8796093022208 bytes, more than the 2147483647 bytes",
    ) as info:
        strataio.open_dataset(tmp_path / "a")
    assert "malformed" not in str(info.value)


# ------------------------------------------------------------------ no silent wrong data
def _tree(path):
    """Every file and folder below ``path`` (relative), temporary files included."""
    out = []
    for d, dirs, fs in os.walk(path):
        out += [os.path.relpath(os.path.join(d, n), path) for n in dirs + fs]
    return sorted(out)


def test_overwrite_with_another_rank_removes_the_old_tree(tmp_path):
    old = strataio.create_dataset(tmp_path / "a", (8, 8), "f4", (4, 4))
    old[...] = 1.0
    old.close()
    new = strataio.create_dataset(tmp_path / "a", (8,), "f4", (4,), overwrite=True)
    np.testing.assert_array_equal(new[...], np.zeros(8, dtype="f4"))
    new[...] = np.arange(8, dtype="f4")
    new.close()
    assert _tree(tmp_path / "a") == ["c", "c/0", "c/1", "zarr.json"]
    np.testing.assert_array_equal(strataio.open_dataset(tmp_path / "a")[...], np.arange(8))


def test_ragged_data_is_a_shape_mismatch_naming_the_dataset(tmp_path):
    """Nested lists numpy makes no array of raise ShapeMismatchError (a StrataError), not
    numpy's bare ValueError, and nothing is written."""
    ds = strataio.create_dataset(tmp_path / "a", (2, 2), "f4", (1, 1), fill_value=7)
    with pytest.raises(
        ShapeMismatchError, match=r"dataset '.*a': the data is no rectangular array"
    ):
        ds[...] = [[1, 2], [3]]
    assert ds.nchunks_stored() == 0
    np.testing.assert_array_equal(ds[...], 7)


def test_values_with_leading_axes_of_one_element_fit_as_in_numpy(tmp_path):
    a = np.zeros((4, 4), "f4")
    ds = strataio.create_dataset(tmp_path / "a", a.shape, "f4", (2, 2))
    ds[0:3, 0:3] = a[0:3, 0:3] = np.arange(9, dtype="f4").reshape(1, 1, 3, 3)
    ds[3] = a[3] = np.ones((1, 4), "f4")
    np.testing.assert_array_equal(ds[...], a)
    with pytest.raises(ShapeMismatchError, match=r"\(2, 3, 3\)"):
        ds[0:3, 0:3] = np.ones((2, 3, 3))


def test_overwrite_of_a_group_replaces_it_whole(tmp_path):
    """A Zarr group is no dataset to keep: refused without ``overwrite``, saying it is a
    group; with it, the group goes with every array in it (an array inside an array would be
    no Zarr), as zarr-python's overwrite does."""
    import zarr

    strataio.create_dataset(tmp_path / "run1" / "temperature", (4, 4), "f4", (2, 2)).close()
    with pytest.raises(ExistsError, match="Zarr group already exists"):
        strataio.create_dataset(tmp_path / "run1", (4,), "f4", (2,))
    assert (tmp_path / "run1" / "temperature" / "zarr.json").exists()
    ds = strataio.create_dataset(tmp_path / "run1", (4,), "f4", (2,), overwrite=True)
    ds[...] = 1.0
    ds.close()
    assert _tree(tmp_path / "run1") == ["c", "c/0", "c/1", "zarr.json"]
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "run1", mode="r")[...], 1.0)


@pytest.mark.parametrize("inside", ["inner", "c/x", "c/0", "a/b/c"])
def test_no_dataset_is_created_inside_an_array(tmp_path, inside):
    """Only groups hold arrays: a dataset asked for under an existing array (beside its
    chunks, or in its chunk folder) is refused before anything is written, as zarr-python
    refuses it, and the array is left as it was."""
    import zarr

    ds = strataio.create_dataset(tmp_path / "arr", (4, 4), "f4", (2, 2))
    ds[...] = np.arange(16, dtype="f4").reshape(4, 4)
    ds.close()
    before = _tree(tmp_path / "arr")
    for overwrite in (False, True):
        with pytest.raises(ArgumentError, match="is a Zarr array") as info:
            strataio.create_dataset(tmp_path / "arr" / inside, (4,), "f4", overwrite=overwrite)
        assert isinstance(info.value, ValueError)
    assert _tree(tmp_path / "arr") == before
    zarr.create_array(tmp_path / "v2", shape=(4,), dtype="i4", zarr_format=2)
    with pytest.raises(ArgumentError, match="is a Zarr array"):
        strataio.create_dataset(tmp_path / "v2" / inside, (4,), "f4")
    # arrays in groups and plain folders are made as before
    strataio.create_dataset(tmp_path / "run1" / "a", (4,), "f4").close()
    strataio.create_dataset(tmp_path / "run1" / "b" / "c", (4,), "f4").close()
    np.testing.assert_array_equal(
        strataio.open_dataset(tmp_path / "arr")[...], np.arange(16).reshape(4, 4)
    )


@pytest.mark.parametrize("place", ["", "."])
def test_no_dataset_is_created_over_a_plain_folder_holding_arrays(tmp_path, monkeypatch, place):
    """A plain folder (no zarr.json) that holds arrays, such as the working directory where
    a path of "" or "." points, is not made an array, overwrite or not: the arrays in it
    would be hidden from every reader. Nothing is written there."""
    import zarr

    monkeypatch.chdir(tmp_path)
    strataio.create_dataset("a", (4,), "f4", (2,)).close()
    strataio.create_dataset(os.path.join("plain", "deep", "b"), (4,), "f4", (2,)).close()
    os.remove(os.path.join("plain", "zarr.json"))  # (a folder made by hand, not a group)
    before = _tree(tmp_path)
    for overwrite in (False, True):
        for where in (place, "plain"):
            with pytest.raises(ArgumentError, match="holds Zarr nodes .*zarr.json"):
                strataio.create_dataset(where, (4,), "f4", (2,), overwrite=overwrite)
    assert _tree(tmp_path) == before
    assert zarr.open_array("a", mode="r").shape == (4,)
    os.mkdir("empty")  # (a plain folder holding no Zarr node becomes the array, as before)
    strataio.create_dataset("empty", (4,), "f4", (2,)).close()


def test_a_zarr_v2_array_is_not_overwritten_unless_asked(tmp_path):
    """A Zarr v2 array (``.zarray``) at the path is refused without ``overwrite``: a
    ``zarr.json`` beside it would make zarr-python open the new, empty array instead of the
    old data. With ``overwrite`` it goes whole, its v2 files too."""
    import zarr

    old = zarr.create_array(tmp_path / "a", shape=(4,), dtype="i4", zarr_format=2)
    old[...] = 7
    with pytest.raises(ExistsError, match=r"Zarr v2 array \(\.zarray\)"):
        strataio.create_dataset(tmp_path / "a", (4,), "i4", (2,))
    assert not (tmp_path / "a" / "zarr.json").exists()
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a", mode="r")[...], 7)
    ds = strataio.create_dataset(tmp_path / "a", (4,), "i4", (2,), overwrite=True)
    ds[...] = 3
    ds.close()
    assert not (tmp_path / "a" / ".zarray").exists()
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a", mode="r")[...], 3)


def test_overwrite_of_a_zero_dimensional_chunk_and_debris(tmp_path):
    """A 0-d array's chunk is the file ``c``; chunk folders without a zarr.json are refused
    unless overwritten (they are left by an interrupted overwrite, or are not strataio's)."""
    z = strataio.create_dataset(tmp_path / "a", (), "i4")
    z[...] = 5
    z.close()
    d = strataio.create_dataset(tmp_path / "a", (4,), "i4", (2,), overwrite=True)
    d[...] = 3
    assert d[...].tolist() == [3, 3, 3, 3]
    os.remove(tmp_path / "a" / "zarr.json")
    with pytest.raises(ExistsError, match="chunk data"):
        strataio.create_dataset(tmp_path / "a", (4,), "i4", (2,))
    strataio.create_dataset(tmp_path / "a", (4,), "i4", (2,), overwrite=True)
    assert _tree(tmp_path / "a") == ["zarr.json"]


def test_masked_arrays_are_stored_only_where_nothing_is_masked(tmp_path):
    """A masked array with elements masked is refused by every write, naming the count and
    ``filled``, before anything is stored; one with nothing masked is stored as its values."""
    ds = strataio.create_dataset(tmp_path / "a", (4,), "f4", (2,), fill_value=-1.0)
    ds[...] = np.ma.masked_array([1, 2, 3, 4], mask=False, dtype="f4")
    assert ds[...].tolist() == [1, 2, 3, 4]
    before = _snapshot(tmp_path / "a")
    bad = np.ma.masked_array([9, 9, 9, 9], mask=[0, 1, 0, 1], dtype="f4")
    for write in (
        lambda: ds.__setitem__(slice(None), bad),
        lambda: ds.write_section((0,), bad),
        lambda: ds.write_all(slice(None), bad),
    ):
        with pytest.raises(ArgumentError, match=r"2 of its 4 elements masked.*filled"):
            write()
    assert _snapshot(tmp_path / "a") == before
    ds.write_section((0,), bad.filled(ds.fill_value))
    assert ds[...].tolist() == [9, -1, 9, -1]


def test_a_masked_fill_value_is_refused(tmp_path):
    """A fill value follows the rule writes follow: a masked one (``numpy.ma.masked``, or a
    masked scalar) is refused before anything is created, where its mask was dropped and
    the value under it (0.0 for ``masked``) taken for the fill."""
    for fill in (np.ma.masked, np.ma.masked_array(5.0, mask=True)):
        with pytest.raises(ArgumentError, match="masked"):
            strataio.create_dataset(tmp_path / "a", (4,), "f4", (2,), fill_value=fill)
        assert not (tmp_path / "a").exists()
    ds = strataio.create_dataset(
        tmp_path / "a", (4,), "f4", (2,), fill_value=np.ma.masked_array(5.0, mask=False)
    )
    assert ds.fill_value == 5.0 and ds[...].tolist() == [5.0] * 4


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int32", "uint32"])
def test_integer_narrowing_is_checked(tmp_path, dtype):
    """Values of a wider (or differently signed) integer type are stored when every value fits
    the dataset's dtype, and refused naming the dataset, the range and a value otherwise."""
    info = np.iinfo(dtype)
    ds = strataio.create_dataset(tmp_path / "a", (4,), dtype, (2,))
    ds[...] = np.array([info.min, 0, 7, info.max], dtype=np.int64)
    assert ds[...].tolist() == [info.min, 0, 7, info.max]
    ds[1] = 5  # a Python int
    assert ds[1] == 5
    before = _snapshot(tmp_path / "a")
    for bad in (np.int64(info.max) + 1, np.int64(info.min) - 1):
        with pytest.raises(DtypeMismatchError, match=rf"{bad}.*{info.min}\.\.{info.max}") as e:
            ds[1:3] = np.array([1, bad], dtype=np.int64)
        assert str(tmp_path / "a") in str(e.value)
        with pytest.raises(DtypeMismatchError):
            ds.write_section((0,), np.array([bad], dtype=np.int64))
    assert _snapshot(tmp_path / "a") == before
    assert ds[...].tolist() == [info.min, 5, 7, info.max]


def test_a_bool_dataset_takes_0_and_1_in_fill_values_and_writes_alike(tmp_path):
    """0 and 1 are False and True (as zarr-python takes them; zarr.json holds true or
    false); any other integer is refused, as fill value and as written value alike."""
    ds = strataio.create_dataset(tmp_path / "a", (4,), "bool", (2,), fill_value=1)
    assert ds.fill_value is np.True_ and ds[...].tolist() == [True] * 4
    assert json.loads((tmp_path / "a" / "zarr.json").read_text())["fill_value"] is True
    ds[1:3] = 0
    ds[3] = np.uint8(1)
    ds[0:2] = np.array([0, 1], dtype=np.int64)
    assert ds[...].tolist() == [False, True, False, True]
    before = _snapshot(tmp_path / "a")
    for bad in (2, -1, np.array([0, 1, 2, 1])):
        with pytest.raises(DtypeMismatchError, match="is not 0 or 1"):
            ds[...] = bad
    with pytest.raises(DtypeMismatchError):
        ds[0] = 1.0
    assert _snapshot(tmp_path / "a") == before
    for bad in (2, -1):
        with pytest.raises(DtypeMismatchError, match=rf"fill_value {bad}.*is not 0 or 1"):
            strataio.create_dataset(tmp_path / "b", (4,), "bool", (2,), fill_value=bad)
    assert not (tmp_path / "b").exists()


def test_the_reported_narrowing_case(tmp_path):
    ds = strataio.create_dataset(tmp_path / "a", (4,), "i1")
    with pytest.raises(DtypeMismatchError, match="1000"):
        ds[0] = np.int64(1000)
    with pytest.raises(DtypeMismatchError):
        ds[0] = 1000
    assert ds[0] == 0
    with pytest.raises(DtypeMismatchError):  # uint64 beyond int64: no silent wrap either
        strataio.create_dataset(tmp_path / "b", (1,), "i8")[0] = np.uint64(2**63)


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_python_ints_beyond_64_bits_are_named_out_of_range(tmp_path, dtype):
    """numpy holds Python ints beyond 64 bits as objects: the refusal still names the value
    and the range, and ints that fit are stored whatever the others' width."""
    info = np.iinfo(dtype)
    ds = strataio.create_dataset(tmp_path / "a", (2,), dtype)
    for bad in (2**64, info.min - 1, -(2**70)):
        with pytest.raises(DtypeMismatchError, match=rf"value {bad} .*out of range.*{info.max}"):
            ds[0:2] = [1, bad]
    assert ds[...].tolist() == [0, 0]
    ds[0:2] = np.array([info.min, info.max], dtype=object)
    assert ds[...].tolist() == [info.min, info.max]
    with pytest.raises(DtypeMismatchError, match="object data"):
        ds[0:2] = [1.5, 2**70]  # not all ints: refused as any other object data


def test_lists_of_python_ints_that_numpy_would_make_floats_are_stored_exactly(tmp_path):
    """numpy makes a list of Python ints float64 where one is beyond int64 but not uint64
    (``[2**64 - 1, 1]``): a dataset stores such ints that fit exactly, refuses those that do
    not naming the value, and still refuses a list that holds a float."""
    u = strataio.create_dataset(tmp_path / "u", (2, 2), "uint64")
    u[...] = [[2**64 - 1, 1], [2**63, 0]]
    assert u[...].tolist() == [[2**64 - 1, 1], [2**63, 0]]
    u[0] = (2**63 + 1, np.uint64(7))
    assert u[0].tolist() == [2**63 + 1, 7]
    u.write_section((1, 0), [[2**64 - 2, 5]])
    assert u[1].tolist() == [2**64 - 2, 5]
    i = strataio.create_dataset(tmp_path / "i", (2,), "int64")
    with pytest.raises(DtypeMismatchError, match=f"value {2**63} .*out of range"):
        i[...] = [2**63, -1]
    with pytest.raises(DtypeMismatchError, match="float64"):
        u[0] = [2**64 - 1, 1.0]
    assert i[...].tolist() == [0, 0] and u[0].tolist() == [2**63 + 1, 7]


def test_float_overflow_is_refused(tmp_path):
    ds = strataio.create_dataset(tmp_path / "a", (3,), "f4")
    ds[...] = np.array([1.5, np.inf, np.nan])  # float64 → float32 rounds as numpy does
    assert ds[0] == 1.5 and np.isinf(ds[1]) and np.isnan(ds[2])
    with pytest.raises(DtypeMismatchError, match="1e\\+40"):
        ds[...] = np.array([1.0, 1e40, np.inf])
    c = strataio.create_dataset(tmp_path / "c", (2,), "c8")
    with pytest.raises(DtypeMismatchError):
        c[...] = np.array([1 + 1e300j, 0j])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": "u1", "fill_value": 300}, "fill_value 300.*uint8"),
        ({"dtype": "i1", "fill_value": -129}, "fill_value -129"),
        ({"dtype": "i4", "fill_value": 1.5}, "fill_value 1.5"),
        ({"dtype": "i4", "fill_value": "x"}, "fill_value 'x'"),
        ({"dtype": "bogus"}, "'bogus' is not a numpy dtype"),
        ({"dtype": object}, "dtype object is not supported"),
        ({"dtype": "f4", "fill_value": 1e40}, "fill_value 1e\\+40"),
    ],
)
def test_bad_creation_arguments_raise_strata_errors(tmp_path, kwargs, match):
    kwargs = {"shape": (4,), **kwargs}
    with pytest.raises(StrataError, match=match):
        strataio.create_dataset(tmp_path / "a", **kwargs)
    assert not (tmp_path / "a").exists()


def test_unusable_locations_raise_strata_errors(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(StrataError, match="file"):
        strataio.create_dataset(tmp_path / "file" / "a", (4,), "f4")
    with pytest.raises(StrataError, match="file"):
        strataio.open_dataset(tmp_path / "file")
    if os.path.isdir("/sys/kernel"):  # sysfs refuses new folders, to root as well
        with pytest.raises(StrataError, match="/sys/strataio-test"):
            strataio.create_dataset("/sys/strataio-test/a", (4,), "f4")
    if os.geteuid() != 0:  # root writes anywhere else
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        try:
            with pytest.raises(StrataError, match="ro"):
                strataio.create_dataset(ro / "a", (4,), "f4")
        finally:
            ro.chmod(0o755)


def test_a_chunk_that_is_a_folder_is_a_clear_error(tmp_path):
    """Storage that is not what the metadata says: errors name the dataset and the chunk."""
    ds = strataio.create_dataset(tmp_path / "a", (4,), "f4", (2,), codec=None)
    os.makedirs(tmp_path / "a" / "c" / "1" / "x")
    for op in (lambda: ds[...], lambda: ds.__setitem__(slice(None), 1.0)):
        with pytest.raises(StrataError, match=r"chunk 'c/1'.*a") as e:
            op()
        assert str(tmp_path / "a") in str(e.value)
    assert not [p for p in _tree(tmp_path / "a") if p.endswith("strataio-tmp")]


def _flip(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))


@pytest.mark.parametrize("codec", ["default", "crc32c", "zstd+crc32c", "blosc+crc32c"])
@pytest.mark.parametrize("at", [0, 37, -1])
def test_a_flipped_byte_is_found_and_named(tmp_path, codec, at):
    """The default codec checksums every chunk; a checksum error names dataset and chunk,
    whichever way the chunk is read (whole, a part, from a fresh handle)."""
    kw = {} if codec == "default" else {"codec": codec}
    ds = strataio.create_dataset(tmp_path / "a", (64, 64), "f4", (16, 16), **kw)
    assert "crc32c" in ds.codecs.names
    ds[...] = np.arange(64 * 64, dtype="f4").reshape(64, 64)
    ds.close()
    victim = tmp_path / "a" / "c" / "1" / "2"
    _flip(victim, at % os.path.getsize(victim))
    back = strataio.open_dataset(tmp_path / "a")
    np.testing.assert_array_equal(back[0:16, 0:32], np.arange(64 * 64).reshape(64, 64)[:16, :32])
    for index in (..., (slice(16, 17), slice(40, 41)), (20, 33)):
        with pytest.raises(ChecksumError) as info:
            back[index]
        assert "'c/1/2'" in str(info.value) and str(tmp_path / "a") in str(info.value)
    rw = strataio.open_dataset(tmp_path / "a", "r+")
    with pytest.raises(ChecksumError, match="c/1/2"):  # read-modify-write reads it too
        rw[20, 33] = 1.0


def test_a_truncated_checksummed_chunk_names_the_chunk(tmp_path):
    ds = strataio.create_dataset(tmp_path / "a", (8, 8), "int16", (4, 4))
    ds[:] = 1
    for size in (2, 20, 33):
        os.truncate(tmp_path / "a" / "c" / "0" / "1", size)
        with pytest.raises(ChecksumError, match=r"chunk 'c/0/1'") as info:
            ds[0:2, 4:6]
        assert str(tmp_path / "a") in str(info.value)
    np.testing.assert_array_equal(ds[4:8, 4:8], np.ones((4, 4)))


def _other_arrays_chunk(tmp_path, codec):
    """A well-formed chunk, checksum included, of another array (4×2 chunks of int16, where
    the victim's are 4×4): a chunk of the wrong size whose checksum holds."""
    other = strataio.create_dataset(tmp_path / "o", (4, 2), "int16", (4, 2), codec=codec)
    other[...] = 5
    return (tmp_path / "o" / "c" / "0" / "0").read_bytes()


@pytest.mark.parametrize("codec", ["crc32c", "zstd+crc32c", "blosc+crc32c", "gzip+crc32c"])
@pytest.mark.parametrize("garbage", ["shorter", "longer", "one byte", "other array's"])
def test_a_checksummed_chunk_of_the_wrong_size_is_a_checksum_error(tmp_path, codec, garbage):
    """A chunk replaced by bytes of another length (garbage, or another array's chunk whose
    checksum holds) raises ChecksumError, as a same-length bit flip does, however it is read
    (a part, the whole, from a fresh handle, a partial write's read): code that catches
    ChecksumError to find corruption finds it. A CodecError still, for code catching that."""
    ds = strataio.create_dataset(tmp_path / "a", (8, 8), "int16", (4, 4), codec=codec)
    ds[:] = 1
    victim = tmp_path / "a" / "c" / "0" / "1"
    size = victim.stat().st_size
    rng = np.random.default_rng(len(garbage))
    victim.write_bytes(
        {
            "shorter": rng.bytes(size - 3),
            "longer": rng.bytes(size + 11),
            "one byte": b"x",
            "other array's": _other_arrays_chunk(tmp_path, codec),
        }[garbage]
    )
    reads = (
        lambda: ds[0:2, 4:6],
        lambda: ds[...],
        lambda: strataio.open_dataset(tmp_path / "a")[1, 5],
        lambda: strataio.open_dataset(tmp_path / "a", "r+").__setitem__((2, 7), 3),
    )
    for read in reads:
        with pytest.raises(ChecksumError, match=r"chunk 'c/0/1'") as info:
            read()
        assert isinstance(info.value, CodecError)
        assert str(tmp_path / "a") in str(info.value)
    np.testing.assert_array_equal(ds[4:8, :], np.ones((4, 8)))


@pytest.mark.parametrize("codec", [None, "zstd"])
def test_an_unchecksummed_chunk_of_the_wrong_size_is_a_codec_error_only(tmp_path, codec):
    """Without a checksum codec nothing tells a damaged chunk from another array's: a chunk of
    the wrong size is a CodecError, not a ChecksumError."""
    ds = strataio.create_dataset(tmp_path / "a", (8, 8), "int16", (4, 4), codec=codec)
    ds[:] = 1
    (tmp_path / "a" / "c" / "0" / "1").write_bytes(_other_arrays_chunk(tmp_path, codec))
    with pytest.raises(CodecError, match=r"chunk 'c/0/1'") as info:
        ds[0:2, 4:6]
    assert not isinstance(info.value, ChecksumError)


@pytest.mark.parametrize(
    ("dims", "match"),
    [
        (("y",), "name 1 dimensions, the array has 2"),
        (("y", "x", "z"), "name 3 dimensions"),
        ("yx", "sequence of names"),
        (("y", 3), "3 is not a name"),
        (7, "sequence of names"),
    ],
)
def test_bad_dims_are_refused(tmp_path, dims, match):
    # a bad argument, as a bad shape or dtype is: ArgumentError, a ValueError
    with pytest.raises(ArgumentError, match=match) as info:
        strataio.create_dataset(tmp_path / "a", (4, 4), "f4", dims=dims)
    assert isinstance(info.value, ValueError)
    assert not (tmp_path / "a").exists()


def test_dims_round_trip(tmp_path):
    ds = strataio.create_dataset(tmp_path / "a", (4, 4), "f4", dims=["y", None])
    assert ds.dims == ("y", None)
    assert json.loads((tmp_path / "a" / "zarr.json").read_text())["dimension_names"] == ["y", None]
    assert strataio.open_dataset(tmp_path / "a").dims == ("y", None)
    assert strataio.create_dataset(tmp_path / "b", (4,), "f4").dims is None
    assert "dimension_names" not in json.loads((tmp_path / "b" / "zarr.json").read_text())
    doc = json.loads((tmp_path / "a" / "zarr.json").read_text())
    doc["dimension_names"] = ["y"]
    (tmp_path / "a" / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(MetadataError, match="dimension_names"):
        strataio.open_dataset(tmp_path / "a")


# ------------------------------------------------------------------ a dataset's life
class DatasetLife(RuleBasedStateMachine):
    """Create and overwrite (any rank, dtype, codec), write (values that fit or not), reopen.
    After every step the dataset reads back the model, and its folder holds exactly
    ``zarr.json`` and chunk files of the current grid: no debris of an older array, no
    temporary files."""

    root = None

    def __init__(self) -> None:
        super().__init__()
        self.path = os.path.join(self.root, f"ds{next(_life)}")
        self.ds = None
        self.model = None

    @rule(
        shape=st.lists(st.integers(0, 9), min_size=0, max_size=3),
        data=st.data(),
        dtype=st.sampled_from(["int8", "uint16", "float32", "int64"]),
        codec=st.sampled_from([None, "crc32c", "zstd"]),
    )
    def create(self, shape, data, dtype, codec):
        chunks = [data.draw(st.integers(1, max(n, 1))) for n in shape]
        fill = data.draw(st.integers(-3, 3)) if dtype != "uint16" else 2
        self.ds = strataio.create_dataset(
            self.path, shape, dtype, chunks, codec=codec, fill_value=fill, overwrite=True
        )
        self.model = np.full(shape, fill, dtype=dtype)

    @precondition(lambda self: self.ds is not None and self.model.size > 0)
    @rule(data=st.data())
    def write(self, data):
        box = tuple(
            slice(a, data.draw(st.integers(a + 1, n)))
            for n in self.model.shape
            for a in [data.draw(st.integers(0, n - 1))]
        )
        sub = self.model[box].shape
        values = np.asarray(
            data.draw(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=1))[0]
            + np.arange(int(np.prod(sub)), dtype=np.int64).reshape(sub)
            if data.draw(st.booleans())
            else data.draw(st.integers(-100, 100)) + np.zeros(sub, dtype=np.int64)
        )
        dt = self.model.dtype
        fits = dt.kind == "f" or (
            np.iinfo(dt).min <= values.min() and values.max() <= np.iinfo(dt).max
        )
        if fits:
            self.ds[box] = values
            self.model[box] = values
        else:
            with pytest.raises(DtypeMismatchError):
                self.ds[box] = values

    @precondition(lambda self: self.ds is not None)
    @rule()
    def reopen(self):
        self.ds.close()
        self.ds = strataio.open_dataset(self.path, "r+")

    @invariant()
    def reads_back_and_holds_only_its_chunks(self):
        if self.ds is None:
            return
        np.testing.assert_array_equal(self.ds[...], self.model)
        grid = self.ds.grid
        keys = {self.ds.chunk_key(c) for c in np.ndindex(*grid.grid_shape)}
        files = [p for p in _tree(self.path) if os.path.isfile(os.path.join(self.path, p))]
        assert set(files) - {"zarr.json"} <= keys, files

    def teardown(self):
        if self.ds is not None:
            self.ds.close()


_life = itertools.count()


def test_dataset_life(tmp_path):
    DatasetLife.root = str(tmp_path)
    run_state_machine_as_test(
        DatasetLife,
        settings=settings(
            max_examples=40,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )


class _WouldWait(CountingChunkStore):
    """A store whose nowait reads of every chunk would wait: ``started`` chunks as bytes on
    their way (errno EINPROGRESS), the others with nothing started; records the thread of
    each blocking read."""

    def __init__(self, inner, started):
        super().__init__(inner)
        self.started = started
        self.threads: dict[str, int] = {}

    def _would_wait(self, key, nowait):
        if nowait:
            if key in self.started:
                raise BlockingIOError(errno.EINPROGRESS, key)
            raise BlockingIOError(key)
        self.threads[key] = threading.get_ident()

    def read_span(self, key, offset, out, *, nowait=False):
        self._would_wait(key, nowait)
        return super().read_span(key, offset, out)

    def read_span_versioned(self, key, offset, out, *, nowait=False):
        self._would_wait(key, nowait)
        return super().read_span_versioned(key, offset, out)


@pytest.mark.parametrize("ahead", [1, 1 << 20])
def test_chunks_on_their_way_are_read_here_and_the_rest_on_io_threads(tmp_path, monkeypatch, ahead):
    """Chunks the store is already fetching are read on the calling thread (within the
    fetch-ahead bound), the others on the chunk threads; the section is right either way."""
    monkeypatch.setattr(dataset_module, "_FETCH_AHEAD_BYTES", ahead)
    a = np.arange(40 * 40, dtype="f4").reshape(40, 40)
    with strataio.create_dataset(tmp_path / "a.zarr", a.shape, a.dtype, (10, 10)) as ds:
        ds[...] = a
    ds = strataio.open_dataset(tmp_path / "a.zarr")
    started = {f"c/{i}/{j}" for i in range(4) for j in range(4) if (i + j) % 2}
    store = _WouldWait(ds.store, started)
    view = Dataset(store, ds.meta)
    view.clear_cache()
    np.testing.assert_array_equal(view[3:37, 5:35], a[3:37, 5:35])
    here = threading.get_ident()
    assert store.threads.keys() == {f"c/{i}/{j}" for i in range(4) for j in range(4)}
    assert {k for k, t in store.threads.items() if t == here} == started
    ds.close()


def test_a_read_retried_after_it_would_have_waited_counts_once_for_the_cache(tmp_path, monkeypatch):
    """The chunk cache keeps a chunk on its second read: a read tried without waiting and
    then made is one read."""
    import strataio.arrays.chunk_cache as cc

    monkeypatch.setattr(cc, "SETTLE_NS", -(1 << 62))
    a = np.arange(40 * 40, dtype="f4").reshape(40, 40)
    with strataio.create_dataset(tmp_path / "a.zarr", a.shape, a.dtype, (10, 10)) as ds:
        ds[...] = a
    ds = strataio.open_dataset(tmp_path / "a.zarr")
    every = {f"c/{i}/{j}" for i in range(4) for j in range(4)}
    view = Dataset(_WouldWait(ds.store, every), ds.meta)
    cache = cc.chunk_cache()
    cache.clear()
    for _ in range(2):
        np.testing.assert_array_equal(view[0:10, 0:10], a[0:10, 0:10])
    assert len(cache) == 1  # c/0/0, read twice
    np.testing.assert_array_equal(view[...], a)  # the others once (each tried, then read)
    assert len(cache) == 1
    np.testing.assert_array_equal(view[...], a)
    assert len(cache) == 16
    ds.close()


def test_bad_arguments_raise_value_errors_of_their_own(tmp_path):
    """Bad arguments raise :class:`ArgumentError`, a ``ValueError`` a caller can catch apart
    from storage failures; nothing is created."""
    from strataio.errors import ArgumentError

    for kwargs in (
        {"shape": (4,), "dtype": "f4", "chunks": (0,)},
        {"shape": (-1,), "dtype": "f4", "chunks": (2,)},
        {"shape": (4,), "dtype": "<U3", "chunks": (2,)},
        {"shape": (4, 4), "dtype": "f4", "chunks": (2,)},
    ):
        with pytest.raises(ArgumentError) as exc:
            strataio.create_dataset(tmp_path / "a", **kwargs)
        assert isinstance(exc.value, ValueError)
        assert not (tmp_path / "a" / "zarr.json").exists()
    strataio.create_dataset(tmp_path / "b", (4,), "f4", (2,)).close()
    with pytest.raises(ArgumentError, match="mode must be one of"):
        strataio.open_dataset(tmp_path / "b", mode="w")


def test_datasets_of_other_geometries_never_share_a_section_s_plan(tmp_path):
    """Plans of sections are remembered for every dataset of one geometry: datasets whose
    shape, chunks or item size differ read the same corners each through its own plan
    (checked against numpy), and a dataset opened anew reads through the plan made before."""
    section = np.s_[3:17, 5:29]
    kinds = [
        ((40, 40), (10, 10), "f4"),
        ((40, 40), (8, 12), "f4"),
        ((40, 40), (10, 10), "f8"),
        ((40, 60), (10, 10), "f4"),
    ]
    for i, (shape, chunks, dtype) in enumerate(kinds):
        want = np.arange(np.prod(shape), dtype=dtype).reshape(shape) * (i + 1)
        with strataio.create_dataset(tmp_path / f"d{i}", shape, dtype, chunks) as ds:
            ds[...] = want
        for _ in range(2):
            with strataio.open_dataset(tmp_path / f"d{i}") as ds:
                np.testing.assert_array_equal(ds[section], want[section])
    made = []
    make = Dataset._make_plan
    try:
        Dataset._make_plan = lambda self, s: made.append(s) or make(self, s)
        with strataio.open_dataset(tmp_path / "d0") as ds:
            np.testing.assert_array_equal(ds[section], np.asarray(ds[...])[section])
    finally:
        Dataset._make_plan = make
    assert made == []  # (both made before: the section's by reads, the whole's by the write)
