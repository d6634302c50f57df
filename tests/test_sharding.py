"""Sharded datasets (Zarr v3 ``sharding_indexed``): round trips, partial reads, interop with
zarr-python and TensorStore in both directions, and clear errors on corrupt shards."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorstore as ts
import zarr

import strataio
from strataio.arrays.dataset import Dataset
from strataio.arrays.store import BackendChunkStore, CountingChunkStore
from strataio.errors import ChecksumError, CodecError, MetadataError, StrataError
from strataio.storage.posix import PosixBackend


def _ts_read(path):
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
    return ts.open(spec, read=True).result().read().result()


def _data(shape, dtype, seed=3):
    rng = np.random.default_rng(seed)
    # smooth values: compressible, unlike white noise
    a = np.cumsum(rng.integers(-3, 4, size=shape), axis=-1) + 100
    return (a > 100) if dtype == "bool" else a.astype(dtype)


@pytest.mark.parametrize("codec", [None, "zstd", "lz4", "blosc", "crc32c", "zstd+crc32c"])
@pytest.mark.parametrize("dtype", ["float32", ">i8", "uint8", "bool"])
def test_round_trip_and_peers_read(tmp_path, codec, dtype):
    shape = (23, 17)
    a = _data(shape, dtype)
    ds = strataio.create_dataset(
        tmp_path / "a", shape, dtype, (4, 3), shards=(8, 9), codec=codec, fill_value=1
    )
    assert ds.chunks == (8, 9) and ds.inner_chunks == (4, 3)
    ds[:19, 2:] = a[:19, 2:]
    ds.close()
    expected = np.ones(shape, dtype=a.dtype)
    expected[:19, 2:] = a[:19, 2:]
    ds = strataio.open_dataset(tmp_path / "a")
    np.testing.assert_array_equal(ds[...], expected)
    np.testing.assert_array_equal(ds[5:14, 1:12], expected[5:14, 1:12])
    np.testing.assert_array_equal(ds[22, 16], expected[22, 16])
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a"), mode="r")[...], expected)
    np.testing.assert_array_equal(_ts_read(tmp_path / "a"), expected)


@pytest.mark.parametrize("codec", [None, "zstd"])
def test_zero_dimensional_shards_round_trip_and_peers_read(tmp_path, codec):
    ds = strataio.create_dataset(tmp_path / "a", (), "f4", (), shards=(), codec=codec, fill_value=7)
    assert ds[...] == 7
    ds[...] = np.float32(3.5)
    ds.close()
    ds = strataio.open_dataset(tmp_path / "a")
    assert ds[...] == 3.5 and ds[()] == 3.5 and ds[...].shape == ()
    assert zarr.open_array(str(tmp_path / "a"), mode="r")[...] == 3.5
    assert _ts_read(tmp_path / "a") == 3.5


def test_fill_inner_chunks_are_not_stored(tmp_path):
    ds = strataio.create_dataset(tmp_path / "a", (8, 8), "i4", (4, 4), shards=(8, 8), codec=None)
    ds[0:4, 0:4] = 5
    shard = os.path.getsize(tmp_path / "a" / "c" / "0" / "0")
    assert shard == 4 * 4 * 4 + 4 * 16 + 4  # one stored inner chunk, the index and its crc
    np.testing.assert_array_equal(ds[4:, :], 0)


@pytest.mark.parametrize(
    ("dtype", "fill", "written"),
    [
        ("f8", 0.0, -0.0),
        ("f8", -0.0, 0.0),
        ("f4", np.nan, -np.nan),
        ("c16", complex(np.nan, 1.0), complex(np.nan, 5.0)),
        ("c16", complex(np.nan, 1.0), complex(2.0, np.nan)),
    ],
)
def test_values_equal_to_the_fill_but_not_its_bytes_are_stored(tmp_path, dtype, fill, written):
    """An inner chunk is left out only where it holds the fill value's very bytes: -0.0 is
    no fill of 0.0, nor nan+5j one of nan+1j, though == (or a NaN test) says so; left out,
    they would read back as the fill."""
    ds = strataio.create_dataset(
        tmp_path / "a", (8,), dtype, (4,), shards=(8,), fill_value=fill, codec=None
    )
    ds[0:4] = written
    back = ds[0:4]
    assert back.tobytes() == np.full(4, written, dtype=dtype).tobytes(), back
    fills = ds[4:8]
    assert fills.tobytes() == np.full(4, fill, dtype=dtype).tobytes(), fills


@pytest.mark.parametrize(
    ("dtype", "fill", "written"),
    [
        ("f8", np.nan, np.zeros(4, "i2")),  # (NaN cast to int16 is 0)
        ("c8", complex(7, 1), np.full(4, 7, "i2")),  # (7+1j cast to int16 is 7)
    ],
)
def test_data_of_another_dtype_is_compared_with_the_fill_as_stored(tmp_path, dtype, fill, written):
    """An inner chunk written from data of another dtype (one that casts to the dataset's
    without loss) is left out only where its values as stored are the fill's bytes, not
    where the fill cast to the data's dtype matches them."""
    ds = strataio.create_dataset(
        tmp_path / "a", (8,), dtype, (4,), shards=(8,), fill_value=fill, codec=None
    )
    data = np.concatenate([written, np.ones(4, written.dtype)])  # (the whole shard)
    ds[...] = data
    np.testing.assert_array_equal(ds[...], data.astype(dtype))
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a"), mode="r")[...], data)


def test_partial_read_touches_only_the_inner_chunks_wanted(tmp_path):
    a = _data((64, 64), "float64")
    strataio.create_dataset(
        tmp_path / "a", a.shape, "f8", (8, 8), shards=(64, 64), codec="zstd"
    ).write_section((0, 0), a)
    store = CountingChunkStore(BackendChunkStore(PosixBackend(tmp_path / "a"), name="a"))
    ds = Dataset(store, strataio.open_dataset(tmp_path / "a").meta, "r", name="a")
    np.testing.assert_array_equal(ds[10:12, 40:50], a[10:12, 40:50])
    # the size, the index, and one run of the two inner chunks the box touches
    assert store.reads == 3


@pytest.mark.parametrize("location", ["start", "end"])
@pytest.mark.parametrize(
    "compressors",
    [None, [{"name": "zstd", "configuration": {"level": 3}}], [{"name": "crc32c"}]],
)
def test_strataio_reads_zarr_python_shards(tmp_path, location, compressors):
    a = _data((30, 21, 4), "int16")
    z = zarr.create_array(
        store=str(tmp_path / "z"),
        shape=a.shape,
        chunks=(5, 7, 2),
        shards=(10, 14, 4),
        dtype="int16",
        compressors=compressors,
        fill_value=-1,
    )
    if location == "start":  # zarr-python writes the index at the end unless told
        z = zarr.open_array(str(tmp_path / "z"), mode="r+")
        meta = z.metadata.to_dict()
        meta["codecs"][0]["configuration"]["index_location"] = "start"
        import json

        (tmp_path / "z" / "zarr.json").write_text(json.dumps(meta))
        z = zarr.open_array(str(tmp_path / "z"), mode="r+")
    z[:, :15] = a[:, :15]
    expected = np.full(a.shape, -1, dtype="int16")
    expected[:, :15] = a[:, :15]
    ds = strataio.open_dataset(tmp_path / "z")
    np.testing.assert_array_equal(ds[...], expected)
    np.testing.assert_array_equal(ds[3:27, 6:19, 1], expected[3:27, 6:19, 1])


def test_strataio_updates_a_zarr_python_sharded_array(tmp_path):
    a = _data((12, 12), "float32")
    z = zarr.create_array(
        store=str(tmp_path / "z"), shape=a.shape, chunks=(3, 3), shards=(6, 6), dtype="f4"
    )
    z[...] = a
    ds = strataio.open_dataset(tmp_path / "z", "r+")
    ds[2:9, 4:5] = -7
    a[2:9, 4:5] = -7
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "z"), mode="r")[...], a)


def test_a_shard_codec_without_index_codecs_is_refused_before_any_read_or_write(tmp_path):
    """The spec requires index_codecs; zarr-python takes a missing one for a crc32c-checked
    index (TensorStore refuses the file). Guessing otherwise misread zarr-python's shards as
    corrupt and wrote shards zarr-python found corrupt: a MetadataError names the field."""
    a = np.arange(16, dtype="i4")
    z = zarr.create_array(tmp_path / "z", shape=(16,), chunks=(2,), shards=(8,), dtype="i4")
    z[...] = a
    path = tmp_path / "z" / "zarr.json"
    doc = json.loads(path.read_text())
    del doc["codecs"][0]["configuration"]["index_codecs"]
    path.write_text(json.dumps(doc))
    shards = {p: p.read_bytes() for p in (tmp_path / "z" / "c").iterdir()}
    for mode in ("r", "r+"):
        with pytest.raises(MetadataError, match=r"\(sharding_indexed\) has no index_codecs"):
            strataio.open_dataset(tmp_path / "z", mode)
    assert {p: p.read_bytes() for p in (tmp_path / "z" / "c").iterdir()} == shards
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "z", mode="r")[...], a)


@pytest.mark.parametrize("location", ["start", "end"])
def test_strataio_reads_tensorstore_shards(tmp_path, location):
    a = _data((40, 18), "uint16")
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": str(tmp_path / "t")},
        "metadata": {
            "shape": list(a.shape),
            "data_type": "uint16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [16, 18]}},
            "fill_value": 4,
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": [4, 6],
                        "codecs": [
                            {"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "zstd", "configuration": {"level": 1}},
                        ],
                        "index_codecs": [
                            {"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "crc32c"},
                        ],
                        "index_location": location,
                    },
                }
            ],
        },
        "create": True,
    }
    t = ts.open(spec).result()
    t[:33].write(a[:33]).result()
    expected = np.full(a.shape, 4, dtype="uint16")
    expected[:33] = a[:33]
    ds = strataio.open_dataset(tmp_path / "t")
    assert ds.inner_chunks == (4, 6)
    np.testing.assert_array_equal(ds[...], expected)
    np.testing.assert_array_equal(ds[7:35, 5:13], expected[7:35, 5:13])


def _shard(path):
    return path / "a" / "c" / "0" / "0"


def _sharded(tmp_path, codec="zstd"):
    a = _data((8, 8), "int32")
    ds = strataio.create_dataset(tmp_path / "a", (8, 8), "i4", (4, 4), shards=(8, 8), codec=codec)
    ds[...] = a
    ds.close()
    return a


def _flip(path, offset):
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x40
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("codec", ["zstd", "crc32c"])
def test_a_shard_replaced_between_its_index_and_inner_reads_reads_one_version(tmp_path, codec):
    """Another process renaming a new shard into place after a read took the old index gives
    the inner reads the new file's bytes at the old offsets: the read starts again and
    returns the new shard's values, never a decode error or chunks of both versions."""
    rng = np.random.default_rng(5)
    v1, v2 = rng.random((8, 8)), rng.random((8, 8)) + 10
    v1[:4, :4] = 1.0  # (compressible in v1, not in v2: the inner chunks' offsets move)
    v2[4:, 4:] = 2.0
    ds = strataio.create_dataset(tmp_path / "a", (8, 8), "f8", (4, 4), shards=(8, 8), codec=codec)
    ds[...] = v1
    reader = strataio.open_dataset(tmp_path / "a")
    other = strataio.open_dataset(tmp_path / "a", "r+")
    calls = []

    def racing(real):
        def read(key, offset, buf, **kw):
            got = real(key, offset, buf, **kw)
            calls.append(offset)
            if len(calls) == 2:  # (the shard's size, then its index: now another writer)
                other[...] = v2
            return got

        return read

    reader._span_reader = racing(reader._span_reader)
    reader._versioned_span_reader = racing(reader._versioned_span_reader)
    np.testing.assert_array_equal(reader[0:8, 1:8], v2[:, 1:])


def test_corrupt_index_checksum_is_an_error_naming_dataset_and_shard(tmp_path):
    _sharded(tmp_path)
    _flip(_shard(tmp_path), -10)  # inside the index
    ds = strataio.open_dataset(tmp_path / "a")
    with pytest.raises(ChecksumError, match=r"dataset '.*/a', shard 'c/0/0': shard index checksum"):
        ds[...]


def test_index_pointing_outside_the_shard_names_the_inner_chunk(tmp_path):
    _sharded(tmp_path, codec="zstd")
    path = _shard(tmp_path)
    raw = bytearray(path.read_bytes())
    n = 16 * 4
    index = np.frombuffer(raw[-n - 4 : -4], dtype="<u8").copy().reshape(4, 2)
    index[2, 1] = 10**6  # inner chunk (1, 0) claims a million bytes
    body = index.tobytes()
    from crc32c import crc32c

    raw[-n - 4 :] = body + crc32c(body).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(CodecError, match=r"shard 'c/0/0'.*inner chunk \(1, 0\)"):
        strataio.open_dataset(tmp_path / "a")[...]


def test_corrupt_inner_chunk_names_it(tmp_path):
    _sharded(tmp_path, codec="zstd+crc32c")
    _flip(_shard(tmp_path), 5)  # inside the first stored inner chunk, (0, 0)
    with pytest.raises(CodecError, match=r"shard 'c/0/0'.*inner chunk \(0, 0\)"):
        strataio.open_dataset(tmp_path / "a")[0:2, 0:2]


def test_truncated_shard_is_an_error(tmp_path):
    _sharded(tmp_path)
    _shard(tmp_path).write_bytes(b"xx")
    with pytest.raises(ChecksumError, match="shorter than its index"):
        strataio.open_dataset(tmp_path / "a")[...]


def _ts_shards(tmp_path, index_codecs, location):
    a = np.arange(64, dtype="i4").reshape(8, 8)
    sharding = {
        "chunk_shape": [4, 4],
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"}],
        "index_codecs": index_codecs,
        "index_location": location,
    }
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": str(tmp_path / "a")},
        "metadata": {
            "shape": [8, 8],
            "data_type": "int32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
            "codecs": [{"name": "sharding_indexed", "configuration": sharding}],
        },
        "create": True,
    }
    ts.open(spec).result()[...].write(a).result()
    return a


@pytest.mark.parametrize("location", ["start", "end"])
@pytest.mark.parametrize("checksum", [True, False])
def test_a_shard_of_the_wrong_size_is_a_checksum_error_where_its_index_is_checksummed(
    tmp_path, location, checksum
):
    """A shard cut short (shorter than its index, or, index at the start, cut inside its
    inner chunks: an index whose checksum holds points past the end) is a ChecksumError
    where the index is checksummed, as a checksummed chunk of the wrong size is; a
    CodecError, and no ChecksumError, where it is not."""
    index_codecs = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if checksum:
        index_codecs.append({"name": "crc32c"})
    _ts_shards(tmp_path, index_codecs, location)
    shard = _shard(tmp_path)
    whole = shard.read_bytes()
    index = 16 * 4 + (4 if checksum else 0)
    cuts = [index - 1] + ([len(whole) - 5] if location == "start" else [])
    for cut in cuts:
        shard.write_bytes(whole[:cut])
        with pytest.raises(CodecError, match=r"shard 'c/0/0'") as info:
            strataio.open_dataset(tmp_path / "a")[...]
        assert isinstance(info.value, ChecksumError) == checksum, str(info.value)


def test_bad_shard_arguments_write_nothing(tmp_path):
    with pytest.raises(StrataError, match="multiple of the inner chunks"):
        strataio.create_dataset(tmp_path / "a", (10,), "f4", (3,), shards=(4,))
    with pytest.raises(StrataError, match="dimensions"):
        strataio.create_dataset(tmp_path / "a", (10,), "f4", (2,), shards=(4, 4))
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("seed", range(4))
def test_random_write_read_sequence_against_numpy(tmp_path, seed):
    """Random section writes and reads of a sharded dataset (the stored shards change with
    every step) equal a numpy oracle after every step, and zarr-python agrees at the end."""
    rng = np.random.default_rng(seed)
    nd = int(rng.integers(1, 4))
    shape = tuple(int(x) for x in rng.integers(1, 16, size=nd))
    inner = tuple(int(x) for x in rng.integers(1, 5, size=nd))
    shards = tuple(c * int(rng.integers(1, 4)) for c in inner)
    codec = ["zstd", "lz4", None, "zstd+crc32c"][seed]
    ds = strataio.create_dataset(
        tmp_path / "a", shape, "i4", inner, shards=shards, codec=codec, fill_value=-5
    )
    oracle = np.full(shape, -5, dtype="i4")
    for _ in range(25):
        lo = [int(rng.integers(0, n)) for n in shape]
        hi = [int(rng.integers(a + 1, n + 1)) for a, n in zip(lo, shape)]
        box = tuple(map(slice, lo, hi))
        value = rng.integers(-100, 100, size=oracle[box].shape).astype("i4")
        if rng.random() < 0.2:
            value[...] = -5  # fill-valued inner chunks drop out of the shard
        ds[box] = value
        oracle[box] = value
        lo = [int(rng.integers(0, n)) for n in shape]
        hi = [int(rng.integers(a + 1, n + 1)) for a, n in zip(lo, shape)]
        box = tuple(map(slice, lo, hi))
        np.testing.assert_array_equal(ds[box], oracle[box])
    ds.close()
    np.testing.assert_array_equal(strataio.open_dataset(tmp_path / "a")[...], oracle)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a"), mode="r")[...], oracle)


def test_strataio_updates_tensorstore_shards_indexed_at_the_start(tmp_path):
    """A shard whose index is at its start and unchecksummed is rewritten in that layout."""
    from mpi4py import MPI

    a = np.arange(240, dtype="i4").reshape(20, 12)
    inner = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"}]
    sharding = {
        "chunk_shape": [5, 4],
        "codecs": inner,
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "index_location": "start",
    }
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": str(tmp_path / "t")},
        "metadata": {
            "shape": [20, 12],
            "data_type": "int32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [10, 12]}},
            "codecs": [{"name": "sharding_indexed", "configuration": sharding}],
        },
        "create": True,
    }
    ts.open(spec).result()[...].write(a).result()
    ds = strataio.open_dataset(tmp_path / "t", "r+")
    ds[3:15, 2:5] = -1
    a[3:15, 2:5] = -1
    # a collective write of such shards takes the whole-shard path
    ds = strataio.open_dataset(tmp_path / "t", "r+", comm=MPI.COMM_SELF)
    ds.write_all(np.s_[0, :], 9)
    a[0, :] = 9
    np.testing.assert_array_equal(ds.read_all(...), a)
    np.testing.assert_array_equal(_ts_read(tmp_path / "t"), a)


def test_any_corruption_of_a_shard_is_a_codec_error_or_a_read(tmp_path):
    """Bytes of a stored shard overwritten at random (index entries rewritten with a good
    checksum included): every read raises CodecError or returns an array of the section's
    shape (an inner chunk without a checksum can decode to other values), never another
    exception and never a read outside the shard."""
    from crc32c import crc32c
    from hypothesis import given, settings
    from hypothesis import strategies as st

    a = _sharded(tmp_path, codec="zstd")
    path = _shard(tmp_path)
    good = path.read_bytes()

    @settings(max_examples=150, deadline=None, database=None)
    @given(
        st.lists(st.tuples(st.integers(0, len(good) - 1), st.integers(0, 255)), max_size=4),
        st.lists(st.tuples(st.integers(0, 7), st.integers(0, 2**64 - 1)), max_size=3),
    )
    def corrupt(flips, entries):
        raw = bytearray(good)
        for at, value in flips:
            raw[at] = value
        if entries:  # rewrite index entries and make the checksum match them
            body = np.frombuffer(bytes(raw[-68:-4]), dtype="<u8").copy()
            for i, value in entries:
                body[i] = value
            raw[-68:] = body.tobytes() + crc32c(body.tobytes()).to_bytes(4, "little")
        path.write_bytes(bytes(raw))
        ds = strataio.open_dataset(tmp_path / "a")
        for box in (np.s_[...], np.s_[1:6, 2:7]):
            try:
                got = ds[box]
            except CodecError:
                continue
            assert got.shape == a[box].shape

    corrupt()


def test_shards_on_a_memory_backend():
    """Partial shard reads through a backend's generic ranged reads (no files)."""
    from strataio.arrays.metadata import ArrayMetadata
    from strataio.storage.memory import MemoryBackend

    meta = ArrayMetadata.create((20, 12), "f4", (5, 4), "lz4", shards=(10, 8))
    store = BackendChunkStore(MemoryBackend(), name="mem")
    store.put_meta(meta.to_json())
    ds = Dataset(store, meta, "r+", name="mem")
    a = np.arange(240, dtype="f4").reshape(20, 12)
    ds[...] = a
    ds[3:4, :] = 0
    a[3:4] = 0
    np.testing.assert_array_equal(ds[...], a)
    np.testing.assert_array_equal(ds[2:9, 3:11], a[2:9, 3:11])
