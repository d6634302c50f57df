"""Chunks held in memory (the prefetch cache, a memory tier) give way to another process's
committed rewrite: a read after it returns the new value, whether the dataset was kept open
or opened again, and the chunks not rewritten are still served from memory.

Two Sessions in one process stand for two processes: each has its own catalog connection,
writer, tiers (a memory tier is each one's own memory) and prefetch cache.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import strataio
from strataio.storage.memory import MemoryBackend
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

SHAPE = (8, 8)
CHUNKS = (4, 4)  # 4 chunks


def _session(root: Path, *, memory: bool) -> strataio.Session:
    tiers = [Tier("local", PosixBackend(root / "local"), "localdisk", order=1)]
    if memory:
        tiers.insert(0, Tier("mem", MemoryBackend(), "memory", order=0))
    return strataio.Session(tiers=TierSet(tiers), catalog=root / "cat.db")


def _rewrite(root: Path, value: float, section=np.s_[...]) -> None:
    """Another process writes ``value`` into ``section`` of dataset "d" and closes it."""
    with _session(root, memory=False) as other:
        ds = other.open_dataset("d", "r+")
        ds[section] = value
        ds.close()


def _where(ds) -> dict[str, set[str]]:
    return {k: {c.tier for c in v} for k, v in ds.residency().items()}


@pytest.fixture(params=["crc32c", None, "zstd"], ids=["checksummed", "raw", "compressed"])
def codec(request):
    return request.param


@pytest.mark.parametrize("memory", [False, True], ids=["prefetch-cache", "memory-tier"])
@pytest.mark.parametrize("reopen", [False, True], ids=["kept-open", "reopened"])
def test_a_prefetched_chunk_rewritten_by_another_process_reads_its_new_value(
    tmp_path, codec, memory, reopen
):
    with _session(tmp_path, memory=memory) as s:
        ds = s.create_dataset("d", SHAPE, "f4", CHUNKS, hint="LOCALDISK", codec=codec)
        ds[...] = 1
        ds.close()
        ds = s.open_dataset("d")
        r = ds.prefetch().wait()
        assert r.moved == 4
        if memory:
            assert all("mem" in tiers for tiers in _where(ds).values())
        else:
            assert len(s.cache) == 4
        np.testing.assert_array_equal(ds[...], 1)
        _rewrite(tmp_path, 2, np.s_[0:4, :])  # two chunks of four
        if reopen:
            ds.close()
            ds = s.open_dataset("d")
        want = np.ones(SHAPE, "f4")
        want[0:4, :] = 2
        np.testing.assert_array_equal(ds[...], want)
        np.testing.assert_array_equal(ds[1, :], want[1, :])  # (a part of each chunk)
        np.testing.assert_array_equal(ds[5, 2:7], want[5, 2:7])
        if memory and not reopen:
            # the memory copies of the rewritten chunks went; the others' stay
            where = _where(ds)
            assert "mem" not in where["c/0/0"] | where["c/0/1"]
            assert "mem" in where["c/1/0"] and "mem" in where["c/1/1"]
        ds.close()


@pytest.mark.parametrize("memory", [False, True], ids=["prefetch-cache", "memory-tier"])
def test_chunks_held_in_memory_are_read_there_while_no_commit_changes_them(tmp_path, memory):
    """The check a read makes of chunks held in memory asks the catalog, not the storage:
    bytes spoiled on disk under an unchanged catalog row (no commit: no process rewrote
    the chunk) are not read, and a commit to another dataset changes nothing here."""
    with _session(tmp_path, memory=memory) as s:
        for name in ("d", "e"):
            ds = s.create_dataset(name, SHAPE, "f4", CHUNKS, hint="LOCALDISK")
            ds[...] = 1
            ds.close()
        ds = s.open_dataset("d")
        ds.prefetch().wait()
        for p in (tmp_path / "local" / "d" / "c").rglob("*"):
            if p.is_file():
                p.write_bytes(b"\0" * p.stat().st_size)
        with _session(tmp_path, memory=False) as other:
            e = other.open_dataset("e", "r+")
            e[...] = 3
            e.close()
        hits = s.cache.hits
        np.testing.assert_array_equal(ds[...], 1)
        if not memory:
            assert s.cache.hits == hits + 4
        ds.close()


@pytest.mark.parametrize("memory", [False, True], ids=["prefetch-cache", "memory-tier"])
def test_a_prefetch_after_another_process_s_rewrite_brings_the_new_value(tmp_path, memory):
    """A chunk prefetched before another process rewrote it is prefetched again (not taken
    as there already), and read with its new value."""
    with _session(tmp_path, memory=memory) as s:
        ds = s.create_dataset("d", SHAPE, "f4", CHUNKS, hint="LOCALDISK")
        ds[...] = 1
        ds.close()
        ds = s.open_dataset("d")
        ds.prefetch().wait()
        _rewrite(tmp_path, 2, np.s_[0:4, 0:4])  # one chunk
        r = ds.prefetch().wait()
        assert (r.moved, r.reused, r.failed) == (1, 3, [])
        want = np.ones(SHAPE, "f4")
        want[0:4, 0:4] = 2
        np.testing.assert_array_equal(ds[...], want)
        ds.close()


def test_a_write_by_another_handle_of_the_same_session_drops_the_memory_copies(tmp_path):
    """A memory tier's copies of one handle give way to a write through another handle of
    the same dataset in the same session, once that handle commits it."""
    with _session(tmp_path, memory=True) as s:
        ds = s.create_dataset("d", SHAPE, "f4", CHUNKS, hint="LOCALDISK")
        ds[...] = 1
        ds.close()
        ds = s.open_dataset("d")
        ds.prefetch().wait()
        w = s.open_dataset("d", "r+")
        w[...] = 2
        w.close()
        np.testing.assert_array_equal(ds[...], 2)
        ds.close()
