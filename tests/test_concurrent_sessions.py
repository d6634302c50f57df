"""Sessions of several processes working on one catalog never lose a chunk.

Each session loads a dataset's residency once, at open; another process may move its chunks
afterwards (an eviction round writes a copy back to the archive and deletes the fast copy).
A session acting on such a stale residency may fail to find a copy it believes in, but must
never drop a row, or delete an object, that the other process recorded.

Two sessions of one process stand for the two processes here: each has its own catalog
connection, writer, tiers and residencies, and the interleaving is made exact.
"""

from __future__ import annotations

import numpy as np
import pytest

import strataio
from strataio.errors import BackendError, StrataError
from strataio.tiers.fsck import fsck

CONFIG = """
[catalog]
url = "cat.db"

[[tiers]]
name = "fast"
kind = "posix"
role = "localdisk"
path = "fast"

[[tiers]]
name = "archive"
kind = "posix"
role = "remotetape"
path = "archive"
"""

A = np.arange(20 * 20, dtype="f4").reshape(20, 20)  # 4 chunks of 10x10


def session(root) -> strataio.Session:
    return strataio.Session(config=root / "strataio.toml")


def test_a_write_back_from_a_stale_residency_keeps_the_copy_another_session_recorded(
    tmp_path,
):
    (tmp_path / "strataio.toml").write_text(CONFIG)
    with session(tmp_path) as s:
        ds = s.create_dataset("a", A.shape, "f4", (10, 10), hint="LOCALDISK")
        ds[...] = A
        ds.close()
    reader, evictor = session(tmp_path), session(tmp_path)
    stale = reader.open_dataset("a")  # its residency: every chunk on "fast" only
    moved = evictor.open_dataset("a")
    moved.evict(tier="fast").wait()  # written back to the archive, fast copies deleted
    moved.close()
    evictor.close()
    assert {c.tier for c in reader.catalog.residency("a")} == {"archive"}
    # the stale session evicts too: each fast copy it names is missing, so nothing can be
    # written back, and the archive copies the other session recorded must stay
    with pytest.raises(StrataError, match=r"c/0/0"):
        stale.evict(tier="fast").wait()
    stale.close()
    reader.close()
    with session(tmp_path) as s:
        assert len(s.catalog.residency("a")) == 4
        np.testing.assert_array_equal(s.open_dataset("a")[...], A)
        assert fsck(s.catalog, s.tiers).clean


def test_a_read_from_a_stale_residency_finds_the_copy_another_session_moved(tmp_path):
    (tmp_path / "strataio.toml").write_text(CONFIG)
    with session(tmp_path) as s:
        ds = s.create_dataset("a", A.shape, "f4", (10, 10), hint="LOCALDISK")
        ds[...] = A
        ds.close()
    with session(tmp_path) as reader:
        stale = reader.open_dataset("a")  # its residency: every chunk on "fast" only
        with session(tmp_path) as evictor:
            moved = evictor.open_dataset("a")
            moved.evict(tier="fast").wait()  # written back to the archive, fast copies gone
            moved.close()
        # the fast copies it names are missing: it asks the catalog where they are now
        np.testing.assert_array_equal(stale[...], A)
        stale.close()
    with session(tmp_path) as s:
        assert {c.tier for c in s.catalog.residency("a")} <= {"fast", "archive"}
        assert len({c.key for c in s.catalog.residency("a")}) == 4
        np.testing.assert_array_equal(s.open_dataset("a")[...], A)
        assert fsck(s.catalog, s.tiers).clean


def test_a_chunk_lost_for_good_still_reads_as_lost(tmp_path):
    (tmp_path / "strataio.toml").write_text(CONFIG)
    with session(tmp_path) as s:
        ds = s.create_dataset("a", A.shape, "f4", (10, 10), hint="LOCALDISK")
        ds[...] = A
        ds.close()
    (tmp_path / "fast" / "a" / "c" / "1" / "0").unlink()
    with session(tmp_path) as s:
        ds = s.open_dataset("a")
        with pytest.raises(BackendError, match=r"'c/1/0' of 'a'"):
            ds[...]
        ds.close()
