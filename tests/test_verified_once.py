"""The verified-once rule across processes: a copy a read checked whole is read in range by a
process opening the dataset later, while its row accepts the bytes checked and its object
is the version checked; a copy replaced or rewritten since is read whole and checked again.

Each Session here stands for a process: its own catalog connection, residency and store.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import strataio
from strataio.catalog import VerifiedCopy
from strataio.errors import ChecksumError
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

SHAPE = (32, 32)
CHUNKS = (8, 8)
ALL = {f"c/{i}/{j}" for i in range(4) for j in range(4)}


def _session(root: Path) -> strataio.Session:
    tiers = TierSet(
        [
            Tier("fast", PosixBackend(root / "fast"), "localdisk", order=0),
            Tier("slow", PosixBackend(root / "slow"), "remotedisk", order=1),
        ]
    )
    return strataio.Session(tiers=tiers, catalog=root / "cat.db")


def _whole_checks(ds) -> list[str]:
    """The chunk keys the dataset's store reads whole to check from here on."""
    store, seen = ds.store, []
    check = store._check_whole
    store._check_whole = lambda key, *a: seen.append(key) or check(key, *a)
    return seen


@pytest.fixture
def data(tmp_path) -> np.ndarray:
    values = np.arange(np.prod(SHAPE), dtype="f4").reshape(SHAPE)
    with _session(tmp_path) as s:
        s.create_dataset("d", SHAPE, "f4", CHUNKS, hint="LOCALDISK", codec=None)[...] = values
    return values


def test_a_process_opening_the_dataset_reads_copies_checked_before_in_range(tmp_path, data):
    with _session(tmp_path) as s, s.open_dataset("d") as ds:
        checks = _whole_checks(ds)
        np.testing.assert_array_equal(ds[2:30, 3:5], data[2:30, 3:5])
        assert set(checks) == {f"c/{i}/0" for i in range(4)}  # the first read checks
    with _session(tmp_path) as s, s.open_dataset("d") as ds:
        checks = _whole_checks(ds)
        np.testing.assert_array_equal(ds[2:30, 3:5], data[2:30, 3:5])
        np.testing.assert_array_equal(ds[...], data)
        # the copies checked by the process before are not checked again; the rest once
        assert sorted(checks) == sorted(ALL - {f"c/{i}/0" for i in range(4)})
    with _session(tmp_path) as s, s.open_dataset("d") as ds:
        checks = _whole_checks(ds)
        np.testing.assert_array_equal(ds[...], data)
        assert checks == []


@pytest.mark.parametrize("how", ["new file", "in place"])
def test_a_copy_changed_on_disk_after_its_check_is_checked_again(tmp_path, data, how):
    """Bytes put in place of a checked copy behind the catalog's back (a new object, or the
    same file written over, same size) are read whole, checked and refused."""
    with _session(tmp_path) as s, s.open_dataset("d") as ds:
        np.testing.assert_array_equal(ds[...], data)
    path = tmp_path / "fast" / "d" / "c" / "1" / "2"
    bad = bytearray(path.read_bytes())
    bad[5] ^= 0xFF
    if how == "new file":
        tmp = path.with_name("tmp")
        tmp.write_bytes(bytes(bad))
        os.replace(tmp, path)
    else:
        with open(path, "r+b") as f:
            f.write(bytes(bad))
    with _session(tmp_path) as s, s.open_dataset("d") as ds:
        checks = _whole_checks(ds)
        np.testing.assert_array_equal(ds[0:8, 0:8], data[0:8, 0:8])  # others in range
        assert checks == []
        with pytest.raises(ChecksumError, match="c/1/2"):
            ds[8:16, 16:24]
        assert "c/1/2" in checks


def test_checks_of_a_chunk_rewritten_since_are_not_taken_over(tmp_path, data):
    with _session(tmp_path) as s, s.open_dataset("d") as ds:
        np.testing.assert_array_equal(ds[...], data)
    new = data.copy()
    new[0:8, 0:8] = -1
    with _session(tmp_path) as s, s.open_dataset("d", "r+") as ds:
        ds[0:8, 0:8] = new[0:8, 0:8]  # another process rewrites c/0/0
    with _session(tmp_path) as s, s.open_dataset("d") as ds:
        checks = _whole_checks(ds)
        np.testing.assert_array_equal(ds[...], new)
        assert checks == ["c/0/0"]


def test_a_check_naming_another_tier_is_not_taken_over(tmp_path, data):
    """A recorded check holds for the copy on the tier it names only: one naming ``slow``
    says nothing of the copy on ``fast``, whatever its version."""
    with _session(tmp_path) as s:
        (row,) = s.catalog.residency("d", ["c/1/1"])
        (version,) = PosixBackend(tmp_path / "fast").versions(["d/c/1/1"])
        s.catalog.record_verified("d", [VerifiedCopy("c/1/1", "slow", row.checksum, version)])
        with s.open_dataset("d") as ds:
            checks = _whole_checks(ds)
            np.testing.assert_array_equal(ds[8:16, 8:16], data[8:16, 8:16])
            assert checks == ["c/1/1"]


def test_a_parallel_rank_without_the_catalog_keeps_its_checks_to_itself(tmp_path, data):
    """A store whose process holds no catalog (a parallel job's rank other than 0) records
    nothing and takes nothing over: it checks every copy it reads once, as before."""
    with _session(tmp_path) as s, s.open_dataset("d") as ds:
        np.testing.assert_array_equal(ds[...], data)
        assert s.catalog.verified_copies("d") == []  # recorded at close, not before
    with _session(tmp_path) as s:
        assert {v.key for v in s.catalog.verified_copies("d")} == ALL
        with s.open_dataset("d") as ds:
            ds.store.commit.catalog, catalog = None, ds.store.commit.catalog
            try:
                ds.store.forget_checks(reload=True)
                checks = _whole_checks(ds)
                np.testing.assert_array_equal(ds[...], data)
                assert sorted(checks) == sorted(ALL)
            finally:
                ds.store.commit.catalog = catalog


def test_a_copy_a_move_read_back_is_read_in_range_at_once(tmp_path, data):
    """A move reads the copy it put back and checks it: reads of that copy, in this process
    and in one opening the dataset later, need not read it whole."""
    with _session(tmp_path) as s, s.open_dataset("d", "r+") as ds:
        checks = _whole_checks(ds)
        ds.migrate(None, to="slow").result()
        np.testing.assert_array_equal(ds[2:30, 3:5], data[2:30, 3:5])
        ds.stage((slice(0, 8), slice(None)), to="fast").result()
        np.testing.assert_array_equal(ds[...], data)
        assert checks == []
        assert {c.tier for k, cs in ds.residency().items() if k.startswith("c/0/") for c in cs} == {
            "fast",
            "slow",
        }
    with _session(tmp_path) as s, s.open_dataset("d") as ds:
        checks = _whole_checks(ds)
        np.testing.assert_array_equal(ds[...], data)
        assert checks == []


def test_a_copy_this_process_put_is_read_in_range_here_and_whole_once_elsewhere(tmp_path, data):
    """The writer knows the bytes it put and their object's version: its next read of the
    chunk reads in range. The check is its own: another process reads the copy whole once,
    from the disk, where decay since the put would show."""
    new = data.copy()
    new[0:8, 0:8] = -1
    with _session(tmp_path) as s, s.open_dataset("d", "r+") as ds:
        ds[0:8, 0:8] = new[0:8, 0:8]
        checks = _whole_checks(ds)
        np.testing.assert_array_equal(ds[0:8, 2:3], new[0:8, 2:3])
        ds[0:4, 0:4] = -2  # a read-modify-write of the chunk
        new[0:4, 0:4] = -2
        np.testing.assert_array_equal(ds[0:8, 0:8], new[0:8, 0:8])
        assert checks == []
        assert ("c/0/0", "fast") not in ds.store._unrecorded
    with _session(tmp_path) as s, s.open_dataset("d") as ds:
        checks = _whole_checks(ds)
        np.testing.assert_array_equal(ds[0:8, 0:8], new[0:8, 0:8])
        assert checks == ["c/0/0"]
