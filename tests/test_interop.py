"""Interoperability with real peers: zarr-python, TensorStore and xarray read what strataio
writes, and strataio reads what zarr-python writes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorstore as ts
import xarray as xr
import zarr

import strataio
from strataio.errors import ArgumentError, MetadataError


def _tensorstore_read(path):
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
    return ts.open(spec, read=True).result().read().result()


@pytest.mark.parametrize("codec", [None, "zstd", "crc32c", "zstd+crc32c", "blosc", "gzip"])
@pytest.mark.parametrize("dtype", ["float32", ">i8", "uint16", "bool", "complex64"])
def test_peers_read_strataio(tmp_path, codec, dtype):
    rng = np.random.default_rng(7)
    shape = (45, 31)
    a = rng.standard_normal(shape) * 1000
    a = (a > 0) if dtype == "bool" else a.astype(dtype)
    ds = strataio.create_dataset(
        tmp_path / "a", shape, dtype, (16, 10), codec=codec, fill_value=0, attrs={"k": [1, 2]}
    )
    ds[:40] = a[:40]  # leave the last rows unwritten: peers must apply the fill value
    ds.close()
    expected = a.copy()
    expected[40:] = 0
    z = zarr.open_array(str(tmp_path / "a"), mode="r")
    np.testing.assert_array_equal(z[...], expected)
    assert z.attrs["k"] == [1, 2]
    np.testing.assert_array_equal(_tensorstore_read(tmp_path / "a"), expected)


@pytest.mark.parametrize(
    "compressors",
    [
        None,
        [{"name": "zstd", "configuration": {"level": 3, "checksum": True}}],
        [{"name": "gzip", "configuration": {"level": 1}}],
        [
            {
                "name": "blosc",
                "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "bitshuffle"},
            }
        ],
    ],
)
@pytest.mark.parametrize("dtype", ["float64", "int16", ">u4"])
def test_strataio_reads_zarr_python(tmp_path, compressors, dtype):
    rng = np.random.default_rng(8)
    a = (rng.standard_normal((33, 17, 5)) * 100).astype(dtype)
    z = zarr.create_array(
        store=str(tmp_path / "z"),
        shape=a.shape,
        chunks=(10, 4, 5),
        dtype=dtype,
        compressors=compressors,
        fill_value=9,
    )
    z[:, :12] = a[:, :12]
    expected = a.copy()
    expected[:, 12:] = 9
    ds = strataio.open_dataset(tmp_path / "z")
    np.testing.assert_array_equal(ds[...], expected)
    np.testing.assert_array_equal(ds[5:29, 3:15, 2], expected[5:29, 3:15, 2])


def test_strataio_reads_zarr_python_crc32c(tmp_path):
    a = np.arange(200, dtype="float32").reshape(20, 10)
    z = zarr.create_array(
        store=str(tmp_path / "z"),
        shape=a.shape,
        chunks=(7, 3),
        dtype="float32",
        compressors=[{"name": "zstd", "configuration": {"level": 0}}, {"name": "crc32c"}],
    )
    z[...] = a
    np.testing.assert_array_equal(strataio.open_dataset(tmp_path / "z")[...], a)


def test_a_zstd_codec_without_its_checksum_key_reads_and_writes(tmp_path):
    """The zstd spec: ``checksum`` should be omitted where false."""
    a = np.arange(40, dtype="float32")
    z = zarr.create_array(str(tmp_path / "z"), shape=a.shape, chunks=(8,), dtype="float32")
    z[...] = a
    meta = json.loads((tmp_path / "z" / "zarr.json").read_text())
    meta["codecs"] = [meta["codecs"][0], {"name": "zstd", "configuration": {"level": 1}}]
    (tmp_path / "z" / "zarr.json").write_text(json.dumps(meta))
    zarr.open_array(str(tmp_path / "z"), mode="r+")[...] = a
    ds = strataio.open_dataset(tmp_path / "z", mode="r+")
    np.testing.assert_array_equal(ds[...], a)
    ds[:8] = -1
    a[:8] = -1
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "z"), mode="r")[...], a)


@pytest.mark.parametrize("shards", [None, (8,)])
def test_a_blosc_codec_without_typesize_that_does_not_shuffle_reads_and_writes(tmp_path, shards):
    """The blosc spec: typesize is "required unless shuffle is noshuffle". Such a zarr.json
    (as zarr-python reads it) is read and written by strataio, plain and inside shards."""
    a = np.arange(40, dtype="f4")
    blosc = {"cname": "lz4", "clevel": 5, "shuffle": "noshuffle", "blocksize": 0}
    z = zarr.create_array(
        tmp_path / "z", shape=a.shape, chunks=(4,), shards=shards, dtype="f4",
        compressors=[{"name": "blosc", "configuration": blosc}],
    )  # fmt: skip
    z[...] = a
    path = tmp_path / "z" / "zarr.json"
    doc = json.loads(path.read_text())
    codecs = doc["codecs"][0]["configuration"]["codecs"] if shards else doc["codecs"]
    codecs[1]["configuration"].pop("typesize")
    path.write_text(json.dumps(doc))
    ds = strataio.open_dataset(tmp_path / "z", mode="r+")
    np.testing.assert_array_equal(ds[...], a)
    ds[3:13] = -1
    a[3:13] = -1
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "z", mode="r")[...], a)
    np.testing.assert_array_equal(strataio.open_dataset(tmp_path / "z")[...], a)


@pytest.mark.parametrize(
    ("codec", "key"),
    [
        ({"name": "zstd", "configuration": {}}, "level"),
        ({"name": "gzip"}, "level"),
        ({"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5}}, "shuffle"),
        (
            {
                "name": "blosc",
                "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "noshuffle"},
            },
            "blocksize",
        ),
        (
            {
                "name": "blosc",
                "configuration": {
                    "cname": "lz4",
                    "clevel": 5,
                    "shuffle": "shuffle",
                    "blocksize": 0,
                },
            },
            "typesize",
        ),
    ],
)
def test_a_codec_without_a_key_its_spec_requires_names_the_key(tmp_path, codec, key):
    """Not "malformed: KeyError(...)": the codec, and the key its Zarr v3 spec requires."""
    strataio.create_dataset(tmp_path / "a", (4,), "f4", (2,)).close()
    path = tmp_path / "a" / "zarr.json"
    doc = json.loads(path.read_text())
    doc["codecs"][1] = codec
    path.write_text(json.dumps(doc))
    said = f"codecs\\[1\\] \\({codec['name']}\\) configuration has no '{key}', which the Zarr v3"
    with pytest.raises(MetadataError, match=said) as info:
        strataio.open_dataset(tmp_path / "a")
    assert "malformed" not in str(info.value)


def test_strataio_updates_a_zarr_python_array(tmp_path):
    a = np.arange(64, dtype="int32").reshape(8, 8)
    z = zarr.create_array(store=str(tmp_path / "z"), shape=a.shape, chunks=(3, 3), dtype="int32")
    z[...] = a
    ds = strataio.open_dataset(tmp_path / "z", mode="r+")
    ds[2:5, 1:7] = -1
    a[2:5, 1:7] = -1
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "z"), mode="r")[...], a)


def test_xarray_opens_strataio_arrays(tmp_path):
    """``dims=`` writes Zarr v3 ``dimension_names``; folders strataio creates are groups, so
    xarray opens the arrays under them, 1-D arrays named after their dimension as coordinates."""
    rng = np.random.default_rng(9)
    temp = rng.standard_normal((30, 20)).astype("f4")
    run = tmp_path / "run1"
    ds = strataio.create_dataset(run / "temperature", temp.shape, "f4", (8, 8), dims=("y", "x"))
    ds[...] = temp
    ds.attrs["units"] = "K"
    ds.close()
    for name, n in (("y", 30), ("x", 20)):
        with strataio.create_dataset(run / name, (n,), "f8", dims=[name]) as c:
            c[...] = np.arange(n) * 0.5
    ds = strataio.open_dataset(run / "temperature")
    assert ds.dims == ("y", "x")

    xds = xr.open_zarr(run, consolidated=False)
    assert xds["temperature"].dims == ("y", "x")
    assert xds["temperature"].attrs["units"] == "K"
    np.testing.assert_array_equal(xds["temperature"].values, temp)
    np.testing.assert_array_equal(xds["x"].values, np.arange(20) * 0.5)
    assert set(xds.coords) == {"x", "y"}
    picked = xds["temperature"].sel(x=2.5, y=slice(1.0, 3.0)).values
    np.testing.assert_array_equal(picked, temp[2:7, 5])

    z = zarr.open_array(str(run / "temperature"), mode="r")
    assert z.metadata.dimension_names == ("y", "x")
    assert zarr.open_group(str(run), mode="r")["temperature"].shape == (30, 20)


def test_strataio_reads_zarr_python_dimension_names(tmp_path):
    z = zarr.create_array(
        store=str(tmp_path / "z"),
        shape=(4, 3),
        chunks=(2, 3),
        dtype="i2",
        dimension_names=["time", None],
    )
    z[...] = np.arange(12).reshape(4, 3)
    ds = strataio.open_dataset(tmp_path / "z", "r+")
    assert ds.dims == ("time", None)
    ds[0] = 7
    assert zarr.open_array(str(tmp_path / "z"), mode="r").metadata.dimension_names == (
        "time",
        None,
    )


def test_existing_folders_are_left_alone(tmp_path):
    strataio.create_dataset(tmp_path / "a", (3,), "f4", dims=["x"])
    assert not (tmp_path / "zarr.json").exists()


def test_session_datasets_keep_dimension_names(tmp_path):
    """A tiered dataset's copy on a tier is a Zarr v3 array with its dimension names."""
    from strataio.storage.posix import PosixBackend
    from strataio.tiers.tier import Tier, TierSet

    tiers = TierSet([Tier("disk", PosixBackend(tmp_path / "disk"), "localdisk", order=0)])
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("t", (4, 6), "i4", (2, 3), dims=("y", "x"))
        ds[...] = np.arange(24).reshape(4, 6)
        ds.close()
        assert s.open_dataset("t").dims == ("y", "x")
    z = zarr.open_array(str(tmp_path / "disk" / "t"), mode="r")
    assert z.metadata.dimension_names == ("y", "x")
    np.testing.assert_array_equal(z[...], np.arange(24).reshape(4, 6))


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"dtype": "str"}, "data type 'string' is not supported"),
        (
            {"dtype": "i4", "chunk_key_encoding": {"name": "v2", "separator": "."}},
            "chunk key encoding 'v2' is not supported",
        ),
    ],
)
def test_zarr_python_arrays_strataio_cannot_read_say_what_is_unsupported(tmp_path, kwargs, said):
    """A valid zarr.json naming a feature strataio lacks says which, not that the file is
    malformed."""
    zarr.create_array(tmp_path / "a", shape=(4,), **kwargs)
    with pytest.raises(MetadataError, match=said) as info:
        strataio.open_dataset(tmp_path / "a")
    assert "malformed" not in str(info.value)


@pytest.mark.parametrize("shards", [None, (4, 6)])
def test_zarr_python_arrays_with_a_transpose_codec_say_it_is_unsupported(tmp_path, shards):
    """An array zarr-python wrote with the transpose codec (alone, or inside the shards'
    inner codecs): MetadataError naming the transpose codec as unsupported and the codecs
    strataio reads, not that the pipeline "must start with the 'bytes' codec"."""
    z = zarr.create_array(
        tmp_path / "a",
        shape=(4, 6),
        chunks=(2, 3),
        shards=shards,
        dtype="i4",
        filters=[zarr.codecs.TransposeCodec(order=(1, 0))],
    )
    z[...] = np.arange(24).reshape(4, 6)
    with pytest.raises(MetadataError) as info:
        strataio.open_dataset(tmp_path / "a")
    said = str(info.value)
    assert "zarr.json: codec 'transpose' is not supported" in said
    assert "strataio reads the codecs bytes, zstd, blosc, gzip, crc32c" in said
    assert "sharding_indexed" in said
    assert "must start" not in said and "malformed" not in said


def test_zarr_python_arrays_with_chunks_too_large_say_so(tmp_path):
    """zarr-python creates an array of 8 TiB chunks: strataio refuses it at open, naming the
    chunk shape, its bytes and the limit, instead of failing on its first read."""
    zarr.create_array(tmp_path / "a", shape=(2**40,), chunks=(2**40,), dtype="f8")
    with pytest.raises(
        MetadataError,
        match=r"chunks \(1099511627776,\) of float64 hold "
        r"8796093022208 bytes, more than the 2147483647 bytes a chunk may hold",
    ):
        strataio.open_dataset(tmp_path / "a")


@pytest.mark.parametrize(
    "codecs",
    [
        [{"name": "bytes"}, {"name": "zstd"}, {"name": "crc32c"}],
        [{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "gzip"}],
        [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [2, 3],
                    "codecs": [{"name": "bytes"}, {"name": "blosc"}],
                },
            }
        ],
    ],
)
def test_strataio_reads_tensorstore(tmp_path, codecs):
    """Every field TensorStore writes is one strataio knows (it writes, among others, a chunk
    key encoding with no configuration and shard configurations with no index_location)."""
    a = np.arange(8 * 9, dtype="i4").reshape(8, 9)
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": str(tmp_path / "t")},
        "metadata": {
            "shape": [8, 9],
            "data_type": "int32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 6]}},
            "codecs": codecs,
            "dimension_names": ["y", "x"],
            "attributes": {"k": 1},
        },
    }
    t = ts.open(spec, create=True).result()
    t[...] = a
    ds = strataio.open_dataset(tmp_path / "t")
    np.testing.assert_array_equal(ds[...], a)
    assert ds.dims == ("y", "x") and ds.attrs["k"] == 1


@pytest.mark.parametrize(
    ("field", "opens"),
    [
        ({"must_understand": False, "note": "ignore me"}, True),
        ({"must_understand": True}, False),
        ({"note": "no must_understand"}, False),
        (3, False),
    ],
)
def test_an_unknown_field_is_refused_or_kept_as_peers_do(tmp_path, field, opens):
    """The spec's rule on unknown zarr.json fields, as zarr-python and TensorStore apply it:
    refused unless an object with "must_understand": false."""
    ds = strataio.create_dataset(tmp_path / "a", (4,), "i4", (2,), codec="zstd+crc32c")
    ds[:] = [1, 2, 3, 4]
    path = tmp_path / "a" / "zarr.json"
    doc = json.loads(path.read_text())
    doc["x_extension"] = field
    path.write_text(json.dumps(doc))
    readers = {
        "strataio": lambda: strataio.open_dataset(tmp_path / "a")[...],
        "zarr-python": lambda: zarr.open_array(str(tmp_path / "a"), mode="r")[...],
        "tensorstore": lambda: _tensorstore_read(tmp_path / "a"),
    }
    for who, read in readers.items():
        if opens:
            np.testing.assert_array_equal(read(), [1, 2, 3, 4], err_msg=who)
        else:
            with pytest.raises(Exception, match="x_extension"):
                read()
    if not opens:
        with pytest.raises(MetadataError, match=r"zarr.json: unknown field 'x_extension'") as info:
            strataio.open_dataset(tmp_path / "a")
        assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("dtype", "fill", "bits"),
    [
        ("complex64", ["0x7fc00001", "0x3f800000"], ["7fc00001", "3f800000"]),
        (
            "complex128",
            ["-Infinity", "0xfff8000000000000"],
            ["fff0000000000000", "fff8000000000000"],
        ),
        ("float32", "0xffc00000", ["ffc00000"]),
    ],
)
def test_hex_fill_values_read_as_their_bits(tmp_path, dtype, fill, bits):
    """The Zarr v3 spec writes a float fill value, and each part of a complex one, as a
    number, "NaN", "Infinity", "-Infinity" or "0x" and its bits in hex: strataio reads each
    part's bits as zarr-python does."""
    zarr.create_array(tmp_path / "a", shape=(3,), chunks=(2,), dtype=dtype, fill_value=0)
    path = tmp_path / "a" / "zarr.json"
    doc = json.loads(path.read_text())
    doc["fill_value"] = fill
    path.write_text(json.dumps(doc))
    part = np.dtype(f">u{np.dtype(dtype).itemsize // len(bits)}")
    want = np.array([int(b, 16) for b in bits], part)
    ds = strataio.open_dataset(tmp_path / "a")
    for got in (ds.fill_value, ds[...][0], zarr.open_array(tmp_path / "a", mode="r").fill_value):
        np.testing.assert_array_equal(
            np.atleast_1d(got).astype(ds.dtype).view(part.newbyteorder("=")), want
        )


@pytest.mark.parametrize(
    ("dtype", "bits"),
    [
        ("float32", ["ffc00000"]),
        ("float64", ["7ff8000000000001"]),
        ("complex64", ["7fc00000", "ffc00000"]),
        ("float16", ["fe00"]),
    ],
)
def test_a_nan_fill_value_other_than_zarrs_keeps_its_bits(tmp_path, dtype, bits):
    """Zarr v3's "NaN" is one NaN (sign bit clear, only the mantissa's top bit set): a fill
    value of another NaN (-nan, one with a payload) is written as "0x" and its bits, so
    strataio, zarr-python and TensorStore read the bits it was given."""
    part = np.dtype(f"<u{np.dtype(dtype).itemsize // len(bits)}")
    fill = np.array([int(b, 16) for b in bits], part).view(dtype)[0]
    strataio.create_dataset(tmp_path / "a", (3,), dtype, (2,), fill_value=fill).close()
    doc = json.loads((tmp_path / "a" / "zarr.json").read_text())
    hexes = ["NaN" if b == "7fc00000" else f"0x{b}" for b in bits]
    assert doc["fill_value"] == (hexes[0] if len(hexes) == 1 else hexes)
    ds = strataio.open_dataset(tmp_path / "a")
    reads = [ds.fill_value, ds[...]]
    if dtype != "float16":  # (zarr-python 3.1 and TensorStore drop a float16 NaN's payload)
        reads += [zarr.open_array(tmp_path / "a", mode="r")[...], _tensorstore_read(tmp_path / "a")]
    for got in reads:
        got = np.atleast_1d(np.asarray(got, dtype))
        assert (
            got.view(part).reshape(-1, len(bits)).tolist()
            == [[int(b, 16) for b in bits]] * got.size
        )


def test_attributes_zarr_python_wrote_with_nan_do_not_block_strataio_changing_others(tmp_path):
    """zarr-python writes NaN and infinities in attributes as bare JSON words: strataio
    sets and deletes other attributes of such an array and keeps those as they were; a NaN
    it is given is still refused, before zarr.json changes."""
    zarr.create_array(
        tmp_path / "a",
        shape=(4,),
        dtype="f4",
        attributes={"missing": float("nan"), "range": [float("-inf"), 1.0], "gone": 1},
    )
    ds = strataio.open_dataset(tmp_path / "a", mode="r+")
    ds.attrs["units"] = "K"
    del ds.attrs["gone"]
    before = (tmp_path / "a" / "zarr.json").read_bytes()
    with pytest.raises(ArgumentError, match="NaN"):
        ds.attrs["bad"] = float("nan")
    assert (tmp_path / "a" / "zarr.json").read_bytes() == before
    for attrs in (
        dict(zarr.open_array(tmp_path / "a", mode="r").attrs),
        dict(strataio.open_dataset(tmp_path / "a").attrs),
        dict(ds.attrs),
    ):
        assert set(attrs) == {"missing", "range", "units"}
        assert np.isnan(attrs["missing"]) and attrs["range"] == [float("-inf"), 1.0]
        assert attrs["units"] == "K"
