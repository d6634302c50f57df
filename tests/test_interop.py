"""Interoperability with real peers: zarr-python and TensorStore read what strataio writes,
and strataio reads what zarr-python writes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorstore as ts
import zarr

import strataio


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


def test_strataio_updates_a_zarr_python_array(tmp_path):
    a = np.arange(64, dtype="int32").reshape(8, 8)
    z = zarr.create_array(store=str(tmp_path / "z"), shape=a.shape, chunks=(3, 3), dtype="int32")
    z[...] = a
    ds = strataio.open_dataset(tmp_path / "z", mode="r+")
    ds[2:5, 1:7] = -1
    a[2:5, 1:7] = -1
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "z"), mode="r")[...], a)
