"""Codec configurations are checked where a dataset is created, plain or in a Session: a key
the codec's Zarr v3 spec does not define, or a value outside what it allows, is a CodecError
naming the codec and the field, and nothing is stored or catalogued."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

import strataio
from strataio.arrays.codecs import normalize_codecs
from strataio.errors import CodecError, NotFoundError
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

BAD = [
    ({"name": "zstd", "configuration": {"level": 99}}, r"'zstd': level 99 is out of range"),
    ({"name": "zstd", "configuration": {"level": 23}}, r"'zstd': level 23 is out of range"),
    ({"name": "zstd", "configuration": {"level": 3.5}}, r"'zstd': level must be an integer"),
    ({"name": "zstd", "configuration": {"checksum": 1}}, r"'zstd': checksum must be"),
    ({"name": "zstd", "configuration": {"lvl": 3}}, r"'zstd': unknown configuration key 'lvl'"),
    ({"name": "gzip", "configuration": {"level": 12}}, r"'gzip': level 12 is out of range"),
    ({"name": "gzip", "configuration": {"level": -1}}, r"'gzip': level -1 is out of range"),
    ({"name": "blosc", "configuration": {"cname": "nope"}}, r"'blosc': cname 'nope' is not"),
    ({"name": "blosc", "configuration": {"clevel": -3}}, r"'blosc': clevel -3 is out of range"),
    ({"name": "blosc", "configuration": {"clevel": 10}}, r"'blosc': clevel 10 is out of range"),
    ({"name": "blosc", "configuration": {"shuffle": 1}}, r"'blosc': shuffle 1 is not one of"),
    ({"name": "blosc", "configuration": {"typesize": 0}}, r"'blosc': typesize 0 is out of"),
    ({"name": "blosc", "configuration": {"blocksize": -1}}, r"'blosc': blocksize -1 is out"),
    ({"name": "lz4", "configuration": {"clevel": 12}}, r"'blosc': clevel 12 is out of range"),
    ({"name": "bytes", "configuration": {"endian": "middle"}}, r"'bytes': endian 'middle'"),
    ({"name": "crc32c", "configuration": {"seed": 1}}, r"'crc32c': unknown configuration key"),
    ({"name": "zstd", "configuration": "fast"}, r"'zstd': configuration must be a dict"),
    ({"name": "zstd", "level": 19}, r"'zstd': unknown member 'level' .*put it in 'config"),
    ({"name": "gzip", "lvl": 1, "configuration": {}}, r"'gzip': unknown member 'lvl'"),
]


@pytest.mark.parametrize(("codec", "match"), BAD)
def test_a_bad_configuration_is_refused_at_create_and_nothing_is_written(
    tmp_path, capfd, codec, match
):
    with pytest.raises(CodecError, match=match):
        strataio.create_dataset(tmp_path / "a", (4,), "f4", (2,), codec=codec)
    assert not (tmp_path / "a").exists()
    with pytest.raises(CodecError, match=match):
        strataio.create_dataset(tmp_path / "s", (4,), "f4", (2,), shards=(4,), codec=codec)
    assert not (tmp_path / "s").exists()
    assert capfd.readouterr().err == ""  # (c-blosc prints on some bad values it is given)


@pytest.mark.parametrize(("codec", "match"), BAD[:3] + BAD[7:9])
def test_a_session_refuses_a_bad_configuration_before_cataloguing(tmp_path, codec, match):
    tiers = TierSet([Tier("local", PosixBackend(tmp_path / "local"), "localdisk", order=0)])
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        with pytest.raises(CodecError, match=match) as refused:
            s.create_dataset("x", (4,), "f4", (2,), hint="LOCALDISK", codec=codec)
        assert str(refused.value).startswith("dataset 'x': ")  # (named, as a plain create's)
        with pytest.raises(NotFoundError):
            s.open_dataset("x")
    assert not (tmp_path / "local" / "x").exists()


@pytest.mark.parametrize(
    "codec",
    [
        {"name": "zstd", "configuration": {"level": -131072}},
        {"name": "zstd", "configuration": {"level": np.int64(22), "checksum": True}},
        {"name": "gzip", "configuration": {"level": 0}},
        {"name": "blosc", "configuration": {"cname": "lz4hc", "clevel": 9, "typesize": 2}},
        {"name": "blosc", "configuration": {"shuffle": "bitshuffle", "blocksize": 1024}},
        {"name": "lz4", "configuration": {"clevel": 1}},
    ],
)
def test_configurations_the_spec_allows_are_written_as_plain_json_and_peers_read_them(
    tmp_path, codec
):
    a = np.arange(64, dtype="f4")
    ds = strataio.create_dataset(tmp_path / "a", a.shape, a.dtype, (16,), codec=codec)
    ds[...] = a
    ds.close()
    stored = json.loads((tmp_path / "a" / "zarr.json").read_text())["codecs"][1]
    assert all(type(v) in (int, str, bool) for v in stored["configuration"].values())
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a"), mode="r")[...], a)


def test_a_zarr_json_configured_beyond_its_spec_reads_but_writes_nothing(tmp_path):
    """Made elsewhere (or by an older strataio): its chunks decode, but a write of chunks
    its codec cannot encode as the spec allows is a CodecError, not numcodecs' own error."""
    ds = strataio.create_dataset(tmp_path / "a", (4,), "f4", (2,), codec="zstd")
    ds[...] = 1
    ds.close()
    meta = json.loads((tmp_path / "a" / "zarr.json").read_text())
    meta["codecs"][1]["configuration"]["level"] = 99
    (tmp_path / "a" / "zarr.json").write_text(json.dumps(meta))
    ds = strataio.open_dataset(tmp_path / "a", "r+")
    np.testing.assert_array_equal(ds[...], 1)
    with pytest.raises(CodecError, match=r"'zstd': level 99 is out of range"):
        ds[...] = 2
    np.testing.assert_array_equal(ds[...], 1)


def test_normalize_codecs_fills_in_defaults_and_checks_them():
    specs = normalize_codecs("zstd+crc32c", np.dtype("f4"))
    assert specs[1] == {"name": "zstd", "configuration": {"level": 0, "checksum": False}}
    with pytest.raises(CodecError, match="unknown configuration key 'lvl'"):
        normalize_codecs([{"name": "zstd", "configuration": {"lvl": 3}}], np.dtype("f4"))


@pytest.mark.parametrize("collective", [False, True])
def test_a_sharded_zarr_json_configured_beyond_its_spec_refuses_a_write_of_fill(
    tmp_path, collective
):
    """A write to a sharded array whose inner codec is configured beyond its spec is a
    CodecError naming the dataset, before anything is written, even where every inner chunk
    it writes holds the fill value (none is encoded)."""
    from mpi4py import MPI

    ds = strataio.create_dataset(tmp_path / "a", (8,), "f4", (2,), shards=(4,), codec="zstd")
    ds[...] = 1
    ds.close()
    meta = json.loads((tmp_path / "a" / "zarr.json").read_text())
    meta["codecs"][0]["configuration"]["codecs"][1]["configuration"]["level"] = 99
    (tmp_path / "a" / "zarr.json").write_text(json.dumps(meta))
    shard = (tmp_path / "a" / "c" / "0").read_bytes()
    ds = strataio.open_dataset(tmp_path / "a", "r+", comm=MPI.COMM_SELF if collective else None)
    with pytest.raises(CodecError, match=r"dataset .*'zstd': level 99 is out of range"):
        if collective:
            ds.write_all(np.s_[0:2], np.zeros(2, "f4"))
        else:
            ds[0:2] = 0
    assert (tmp_path / "a" / "c" / "0").read_bytes() == shard
    np.testing.assert_array_equal(ds[...], 1)


@pytest.mark.parametrize(
    "codec",
    [
        [{"name": "zstd"}, {"name": "bytes"}],
        [{"name": "bytes"}, {"name": "bytes"}],
        "crc32c+bytes",
        [
            {"name": "bytes"},
            {"name": "zstd"},
            {"name": "bytes", "configuration": {"endian": "big"}},
        ],
    ],
)
@pytest.mark.parametrize("shards", [None, (4,)])
def test_a_bytes_codec_after_the_first_is_refused_as_misplaced(tmp_path, codec, shards):
    """``bytes`` is the one array→bytes codec: named after a bytes→bytes codec (or twice) it
    is refused as out of place, not as a codec strataio does not know, nothing created."""
    with pytest.raises(CodecError, match="'bytes' .* must come once, first") as err:
        strataio.create_dataset(tmp_path / "a", (8,), "f4", (2,), shards=shards, codec=codec)
    assert "unknown codec" not in str(err.value)
    assert not (tmp_path / "a").exists()
