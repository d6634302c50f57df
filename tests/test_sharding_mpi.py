"""Collective writes and reads of sharded datasets at 1, 2 and 4 ranks against a numpy oracle,
read back by zarr-python and TensorStore (tests/mpi_scripts/collective_shards.py), and the
single-process forms of the same calls."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from mpi4py import MPI

import strataio
from mpirun import run_mpi
from strataio.collective import driver as driver_module
from strataio.errors import ChecksumError, ChunkChangedError, HintError


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_collective_shards_against_numpy_and_peers(tmp_path, nprocs):
    out = run_mpi(nprocs, "collective_shards.py", tmp_path, nprocs, 3, timeout=240)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_shard_hints_the_communicator_cannot_take_as_given(tmp_path, nprocs):
    out = run_mpi(nprocs, "shard_hints.py", tmp_path, timeout=60)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_collective_shards_long(tmp_path, seed):
    out = run_mpi(4, "collective_shards.py", tmp_path, 100 + seed, 25, timeout=600)
    assert out.strip().splitlines()[-1] == "ok"


def test_write_all_on_comm_self_keeps_untouched_inner_chunks(tmp_path):
    """A collective write over part of an existing shard carries the other inner chunks over
    (the leader copies their stored bytes) and updates the touched ones in place."""
    a = np.arange(12 * 12, dtype="i8").reshape(12, 12)
    ds = strataio.create_dataset(
        tmp_path / "a", a.shape, "i8", (3, 4), shards=(6, 8), codec="zstd", comm=MPI.COMM_SELF
    )
    ds.write_all(..., a)
    ds.write_all(np.s_[1:2, 2:7], -1, hints={"strataio_shard_alignment": 1})
    a[1:2, 2:7] = -1
    np.testing.assert_array_equal(ds.read_all(...), a)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a"), mode="r")[...], a)
    leftovers = [p for p in (tmp_path / "a").rglob("*.part")]
    assert not leftovers


@pytest.mark.parametrize(
    ("dtype", "fill", "written"),
    [("f8", np.nan, np.zeros(4, "i2")), ("c8", complex(7, 1), np.full(4, 7, "i2"))],
)
def test_write_all_of_data_of_another_dtype_keeps_values_the_fill_casts_to(
    tmp_path, dtype, fill, written
):
    """A rank's inner chunk of data of another dtype (cast without loss) is stored unless
    its values as stored are the fill's bytes: the fill cast to the data's dtype (NaN to
    int16 is 0) says nothing."""
    ds = strataio.create_dataset(
        tmp_path / "a", (8,), dtype, (4,), shards=(8,), fill_value=fill, comm=MPI.COMM_SELF
    )
    ds.write_all(np.s_[0:4], written)
    np.testing.assert_array_equal(ds.read_all(...)[0:4], written.astype(dtype))
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a"), mode="r")[0:4], written)


def test_write_all_of_a_zero_dimensional_sharded_dataset(tmp_path):
    ds = strataio.create_dataset(
        tmp_path / "a", (), "i2", (), shards=(), codec="zstd", comm=MPI.COMM_SELF
    )
    ds.write_all(..., np.int16(3))
    assert ds.read_all(...) == 3
    assert zarr.open_array(str(tmp_path / "a"), mode="r")[...] == 3


def test_unknown_shard_hint_values_are_refused(tmp_path):
    ds = strataio.create_dataset(
        tmp_path / "a", (4,), "f4", (2,), shards=(4,), codec="zstd", comm=MPI.COMM_SELF
    )
    with pytest.raises(HintError, match="strataio_pipeline_groups"):
        ds.write_all(..., 1.0, hints={"strataio_pipeline_groups": 0})
    for bad in (4096.5, True, 2**70, "4k"):  # (taken as ints, a fraction was cut)
        with pytest.raises(HintError, match="strataio_shard_alignment"):
            ds.write_all(..., 1.0, hints={"strataio_shard_alignment": bad})
    with pytest.raises(HintError):
        ds.write_all(..., 1.0, hints={"strataio_driver": "tape"})
    assert not (tmp_path / "a" / "c").exists()


@pytest.mark.parametrize("sharded", [True, False])
def test_write_all_hints_other_than_a_dict_or_info_are_refused(tmp_path, sharded):
    ds = strataio.create_dataset(
        tmp_path / "a", (4,), "f4", (2,), shards=(4,) if sharded else None, comm=MPI.COMM_SELF
    )
    for bad in ([("strataio_shard_alignment", 512)], "strataio_shard_alignment=512", 4096):
        with pytest.raises(HintError, match="hints must be a dict or MPI.Info"):
            ds.write_all(..., 1.0, hints=bad)
    info = MPI.Info.Create()
    info.Set("strataio_shard_alignment", "512")
    ds.write_all(..., 2.0, hints=info)
    info.Free()
    ds.write_all(..., 3.0, hints=MPI.INFO_NULL)
    np.testing.assert_array_equal(ds.read_all(...), 3.0)


def test_shard_files_are_never_preallocated(tmp_path, monkeypatch):
    """Shards go to temporary files renamed over the old ones: a preallocated file is renamed
    without ext4 starting its write-back, so a crash before the flush could leave zeros where
    the old shard was durable. Their drivers never allocate, and asking for it is refused."""
    calls = []
    monkeypatch.setattr(driver_module, "allocate", lambda fd, off, n: calls.append(n) or True)
    monkeypatch.setattr(driver_module, "file_system_preallocates", lambda fd: True)
    a = np.random.default_rng(0).random((512, 512))  # 2 MiB that zstd hardly shrinks
    ds = strataio.create_dataset(
        tmp_path / "a", a.shape, "f8", (64, 512), shards=(512, 512), codec="zstd",
        comm=MPI.COMM_SELF,
    )  # fmt: skip
    ds.write_all(..., a)
    ds.write_all(..., a + 1, hints={"strataio_preallocate": "automatic"})
    np.testing.assert_array_equal(ds.read_all(...), a + 1)
    assert calls == []
    for bad in ("enable", True, "sometimes"):
        with pytest.raises(HintError, match="strataio_preallocate"):
            ds.write_all(..., a, hints={"strataio_preallocate": bad})
    np.testing.assert_array_equal(ds.read_all(...), a + 1)


def _racing(ds, other, value, when):
    """Make ``ds``'s reads of its shards call ``other[...] = value`` (another process's
    write, which renames a new shard over the old one) right after its read number
    ``when(n)`` says."""
    calls = []

    def racing(real):
        def read(key, offset, buf, **kw):
            got = real(key, offset, buf, **kw)
            calls.append(offset)
            if when(len(calls)):
                other[...] = value() if callable(value) else value
            return got

        return read

    ds._span_reader = racing(ds._span_reader)
    ds._versioned_span_reader = racing(ds._versioned_span_reader)
    return calls


def _two_versions(tmp_path, codec="blosc"):
    rng = np.random.default_rng(5)
    v1, v2 = rng.random((8, 8)), rng.random((8, 8)) + 10
    v1[:4, :4] = 1.0  # (compressible in v1, not in v2: the inner chunks' offsets move)
    v2[4:, 4:] = 2.0
    ds = strataio.create_dataset(
        tmp_path / "a", (8, 8), "f8", (4, 4), shards=(8, 8), codec=codec, comm=MPI.COMM_SELF
    )
    ds.write_all(..., v1)
    other = strataio.open_dataset(tmp_path / "a", "r+")
    return ds, other, v1, v2


@pytest.mark.parametrize("codec", ["blosc", "zstd+crc32c"])
def test_read_all_of_a_shard_replaced_after_its_index_was_read_reads_one_version(tmp_path, codec):
    """Another process renaming a new shard into place after the leader read its index gives
    the owners of its inner chunks the new file's bytes at the old offsets: every rank
    reads again and gets the new shard's values, never a decode error."""
    ds, other, _, v2 = _two_versions(tmp_path, codec)
    _racing(ds, other, v2, lambda n: n == 2)  # (the shard's size, then its index)
    np.testing.assert_array_equal(ds.read_all(np.s_[0:8, 1:8]), v2[:, 1:])


def test_read_all_of_a_shard_replaced_at_every_try_raises_chunk_changed(tmp_path):
    ds, other, v1, v2 = _two_versions(tmp_path)
    values = iter([v2, v1] * 20)
    # (each try reads the size, the index, then the inner chunks: replaced after the index)
    calls = _racing(ds, other, lambda: next(values), lambda n: n <= 8 * 3 and n % 3 == 2)
    with pytest.raises(ChunkChangedError, match=r"shard 'c/0/0': replaced by another writer"):
        ds.read_all(...)
    assert len(calls) == 8 * 3
    np.testing.assert_array_equal(ds.read_all(...), v1)  # (the eighth writer's)


def test_write_all_over_part_of_a_shard_replaced_after_its_index_was_read(tmp_path):
    """A write that keeps inner chunks of the old shard reads them at its index's offsets:
    a shard replaced meanwhile makes it start again from the new shard, whose other values
    it keeps."""
    ds, other, _, v2 = _two_versions(tmp_path)
    _racing(ds, other, v2, lambda n: n == 2)
    ds.write_all(np.s_[1:3, 1:3], -1.0)
    want = v2.copy()
    want[1:3, 1:3] = -1
    np.testing.assert_array_equal(ds.read_all(...), want)
    assert not list((tmp_path / "a").rglob("*.part"))


def test_write_all_over_part_of_a_corrupt_inner_chunk_names_the_shard(tmp_path):
    """A collective write that reads an old inner chunk to update part of it, and finds it
    corrupt, raises ChecksumError naming the dataset and the shard, the shard left as it
    was."""
    a = np.arange(16 * 16, dtype="f8").reshape(16, 16)
    ds = strataio.create_dataset(
        tmp_path / "a",
        a.shape,
        "f8",
        (4, 4),
        shards=(8, 8),
        codec="zstd+crc32c",
        comm=MPI.COMM_SELF,
    )
    ds.write_all(..., a)
    shard = tmp_path / "a" / "c" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[20] ^= 0x01  # (inside inner chunk (0, 0), the first one stored)
    shard.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match=r"shard 'c/0/0': inner chunk \(0, 0\)") as err:
        ds.write_all(np.s_[0:1, 0:1], -1.0)
    assert "dataset" in str(err.value)
    assert shard.read_bytes() == bytes(raw)
    assert not list((tmp_path / "a").rglob("*.part"))


def test_an_alignment_that_makes_a_shard_too_large_is_refused(tmp_path):
    """Runs aligned so far apart that a shard would hold more than a shard may (2 GiB less
    one byte) raise HintError naming the hint and the shard; the old shard stays, and no
    temporary file is left."""
    ds = strataio.create_dataset(
        tmp_path / "a", (16,), "f8", (4,), shards=(16,), codec="zstd", comm=MPI.COMM_SELF
    )
    ds.write_all(..., np.arange(16.0))
    shard = (tmp_path / "a" / "c" / "0").read_bytes()
    with pytest.raises(HintError, match=r"shard 'c/0' would be .*strataio_shard_alignment"):
        ds.write_all(np.s_[0:4], -1.0, hints={"strataio_shard_alignment": 2**31})
    assert (tmp_path / "a" / "c" / "0").read_bytes() == shard
    assert not list((tmp_path / "a").rglob("*.part"))
    np.testing.assert_array_equal(ds.read_all(...), np.arange(16.0))
