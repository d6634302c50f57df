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
from strataio.errors import HintError


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
