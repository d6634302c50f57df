"""The Mover: asynchronous stage / prefetch / migrate, handles, concurrency limits, batching."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

import strataio
from strataio.catalog.sqlite import SQLiteCatalog
from strataio.errors import StrataError
from strataio.storage.memory import MemoryBackend
from strataio.storage.posix import PosixBackend
from strataio.storage.shaped import CostModel, OpCost, Shaped
from strataio.tiers.tier import Tier, TierSet

#: a slow archive: 20 ms per object access, at most 2 at once
SLOW = CostModel(name="slow", read=OpCost(open=0.02), write=OpCost(open=0.02), drives=None)


class Gauge(PosixBackend):
    """A POSIX backend that records how many ``get`` calls run at once."""

    def __init__(self, root):
        super().__init__(root)
        self.now = 0
        self.peak = 0
        self._g = threading.Lock()

    def get(self, key):
        with self._g:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            time.sleep(0.01)
            return super().get(key)
        finally:
            with self._g:
                self.now -= 1


class CountingCatalog(SQLiteCatalog):
    """A real SQLite catalog that counts its residency transactions."""

    commits = 0

    def commit(self, upserts=(), deletes=(), **kw):
        self.commits += 1
        return super().commit(upserts, deletes, **kw)


def setup(tmp_path, archive, *, concurrency=2, catalog=None):
    tiers = TierSet(
        [
            Tier("disk", PosixBackend(tmp_path / "disk"), "localdisk", order=0),
            Tier("tape", archive, "remotetape", order=1, concurrency=concurrency),
        ]
    )
    s = strataio.Session(tiers=tiers, catalog=catalog or tmp_path / "cat.db")
    return s


def fill(s, a, chunks=(10, 10)):
    ds = s.create_dataset("a", a.shape, a.dtype, chunks, hint="REMOTETAPE")
    ds[...] = a
    ds.close()
    return s.open_dataset("a", "r+")


def test_stage_overlaps_the_caller_and_reports_progress(tmp_path):
    a = np.random.default_rng(0).random((40, 40))
    with setup(tmp_path, Shaped(PosixBackend(tmp_path / "tape"), SLOW, 1.0)) as s:
        ds = fill(s, a)
        t0 = time.perf_counter()
        h = ds.stage()  # 16 chunks, 2 at a time, 20 ms each -> ~160 ms
        assert not h.done()  # stage returned while its transfers were still running
        seen = []
        while not h.done():
            seen.append(h.progress.done)
            time.sleep(0.01)
        r = h.wait(timeout=5)
        assert r.moved == 16 and r.nbytes == 16 * 800 and r.ok
        assert h.progress.done == h.progress.total == 16 and h.progress.fraction == 1.0
        assert seen and seen[0] < 16 and max(seen) > seen[0]  # progress advanced while we ran
        assert time.perf_counter() - t0 > 0.1
        np.testing.assert_array_equal(ds[...], a)
        ds.close()


def test_per_tier_concurrency_limit(tmp_path):
    gauge = Gauge(tmp_path / "tape")
    a = np.arange(60 * 60, dtype="f4").reshape(60, 60)
    with setup(tmp_path, gauge, concurrency=3) as s:
        ds = fill(s, a)
        gauge.peak = 0
        ds.stage().wait()
        assert gauge.peak == 3  # 36 chunks, never more than the tier's 3 slots
        ds.close()


def test_migrate_moves_commits_once_and_deletes_sources(tmp_path):
    cat = CountingCatalog(str(tmp_path / "cat.db"))
    a = np.random.default_rng(2).random((50, 50)).astype("f4")
    with setup(tmp_path, PosixBackend(tmp_path / "tape"), catalog=cat) as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="LOCALDISK")
        ds[...] = a
        ds.flush()
        n0 = cat.commits
        r = ds.migrate(np.s_[0:20, :], to="tape").wait()
        assert r.moved == 10 and cat.commits == n0 + 1  # one transaction for the whole move
        rows = {(c.key, c.tier) for c in cat.residency("a")}
        moved = {f"c/{i}/{j}" for i in range(2) for j in range(5)}
        assert {k for k, t in rows if t == "tape"} == moved
        assert {k for k, t in rows if t == "disk"} == {
            f"c/{i}/{j}" for i in range(2, 5) for j in range(5)
        }
        for k in moved:  # source objects deleted, destination objects present
            assert not (tmp_path / "disk" / "a" / k).exists()
            assert (tmp_path / "tape" / "a" / k).is_file()
        ds.close()
        ds = s.open_dataset("a")
        np.testing.assert_array_equal(ds[...], a)  # the read stages the tape chunks back
        ds.close()


def test_stage_verifies_checksums_and_records_nothing_bad(tmp_path):
    a = np.ones((20, 20), "f8")
    with setup(tmp_path, PosixBackend(tmp_path / "tape")) as s:
        ds = fill(s, a)
        (tmp_path / "tape" / "a" / "c" / "1" / "1").write_bytes(b"\x01" * 800)  # bit rot
        h = ds.stage()
        r = h.result()
        assert r.moved == 3 and [k for k, _ in r.failed] == ["c/1/1"]
        assert "checksum" in r.failed[0][1]
        with pytest.raises(StrataError, match="1 of 4 chunks failed"):
            h.wait()
        assert [c.tier for c in ds.residency()["c/1/1"]] == ["tape"]
        assert not (tmp_path / "disk" / "a" / "c" / "1" / "1").exists()
        ds.close()


def test_cancel_and_timeout(tmp_path):
    a = np.zeros((100, 100), "f4")
    with setup(tmp_path, Shaped(PosixBackend(tmp_path / "tape"), SLOW, 1.0), concurrency=1) as s:
        ds = fill(s, a)
        h = ds.stage()  # 100 chunks x 20 ms, one at a time
        with pytest.raises(TimeoutError):
            h.wait(timeout=0.05)
        assert h.cancel()
        r = h.result()
        assert r.cancelled > 50 and r.moved + r.cancelled + r.reused == 100
        ds.close()
        # what was staged before the cancel is committed, and matches the files
        on_disk = {c.key for c in s.catalog.residency("a") if c.tier == "disk"}
        assert len(on_disk) == r.moved
        files = {
            p.relative_to(tmp_path / "disk" / "a").as_posix()
            for p in (tmp_path / "disk" / "a").rglob("c/*/*")
        }
        assert files == on_disk


def test_prefetch_reads_from_memory_afterwards(tmp_path):
    a = np.random.default_rng(3).random((30, 30))
    archive = Shaped(PosixBackend(tmp_path / "tape"), SLOW, 1.0)
    with setup(tmp_path, archive) as s:
        ds = fill(s, a)
        ds.prefetch(np.s_[0:10, 0:30]).wait()
        archive.reset_stats()
        np.testing.assert_array_equal(ds[0:10, :], a[0:10, :])
        assert archive.stats().requests == 0  # served from the prefetch cache
        ds.close()


def test_a_dataset_closed_while_its_moves_run_ends_them_and_keeps_nothing_unrecorded(tmp_path):
    """A close while a prefetch to the memory tier and a stage to disk run cancels the
    prefetch's chunks not started, waits for those under way, and waits for the stage whole:
    the memory tier is left empty, its room free, the stage done, and every object it put
    on disk catalogued. (The prefetch put its
    later chunks on the memory tier after the close, which no handle knew of any more:
    their bytes, and their room there, were held until the session closed.)"""
    mem = MemoryBackend("mem")
    tiers = TierSet(
        [
            Tier("mem", mem, "memory", order=0, capacity=10**6),
            Tier("disk", PosixBackend(tmp_path / "disk"), "localdisk", order=1),
            Tier(
                "tape",
                Shaped(PosixBackend(tmp_path / "tape"), SLOW, 1.0),
                "remotetape",
                order=2,
                concurrency=1,
            ),
        ]
    )
    a = np.random.default_rng(5).random((40, 40))
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = fill(s, a)
        moves = [ds.prefetch(np.s_[0:20, :]), ds.stage(np.s_[20:40, :], to="disk")]
        time.sleep(0.05)
        ds.close()
        finished_at_close = [h.done() for h in moves]
        for h in moves:
            r = h.result()
            assert r.ok and r.moved + r.cancelled == 8, r
        assert moves[1].result().moved == 8  # (a stage to storage is finished, not cut short)
        assert not list(mem.list()) and tiers["mem"].used == 0
        assert all(finished_at_close)
        rows = {c.key for c in s.catalog.residency("a") if c.tier == "disk"}
        files = {
            p.relative_to(tmp_path / "disk" / "a").as_posix()
            for p in (tmp_path / "disk" / "a").rglob("c/*/*")
        }
        assert files == rows and len(rows) == moves[1].result().moved
        np.testing.assert_array_equal(s.open_dataset("a")[...], a)


def three_tiers(tmp_path):
    return TierSet(
        [
            Tier("local", PosixBackend(tmp_path / "local"), "localdisk", order=0),
            Tier("remote", PosixBackend(tmp_path / "remote"), "remotedisk", order=1),
            Tier("tape", PosixBackend(tmp_path / "tape"), "remotetape", order=2),
        ]
    )


def copies(ds):
    """{chunk key: [tiers holding it]}"""
    return {k: [c.tier for c in v] for k, v in ds.residency().items()}


def test_a_move_reads_another_copy_where_something_is_in_the_way_of_the_first(tmp_path):
    """A copy something not strataio's is in the way of (here a directory where its object
    goes) cannot be read, though its tier answers: a read takes the chunk's next copy, but a
    migrate and a prefetch failed with the ObjectError of the first. They now copy from the
    chunk's other, intact copy, every tier left up."""
    a = np.arange(8, dtype="i4")
    with strataio.Session(tiers=three_tiers(tmp_path), catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("x", (8,), "i4", (4,), hint="REMOTEDISK")
        ds[...] = a
        ds.stage(to="local").wait()
        assert copies(ds) == {"c/0": ["local", "remote"], "c/1": ["local", "remote"]}
        ds.close()
    obj = tmp_path / "local" / "x" / "c" / "0"
    obj.unlink()
    obj.mkdir()
    with strataio.Session(tiers=three_tiers(tmp_path), catalog=tmp_path / "cat.db") as s:
        ds = s.open_dataset("x", "r+")
        r = ds.prefetch().wait()
        assert (r.moved, r.failed) == (2, [])
        np.testing.assert_array_equal(ds[...], a)
        r = ds.migrate(to="tape").wait()
        assert (r.moved, r.failed) == (2, [])
        assert copies(ds) == {"c/0": ["tape"], "c/1": ["tape"]}
        assert all(t.up for t in s.tiers)
        ds.close()
        ds = s.open_dataset("x")
        np.testing.assert_array_equal(ds[...], a)
        ds.close()


def test_something_in_the_way_at_a_move_s_destination_fails_that_chunk_alone(tmp_path):
    """Something in the way of the object a move puts (a directory where it goes, a file
    where its folder goes) fails that chunk's move, named in the result; the other chunks
    move, the chunk stays where it was and reads as before, and no tier is marked down."""
    a = np.arange(12, dtype="i4")
    with strataio.Session(tiers=three_tiers(tmp_path), catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("x", (12,), "i4", (4,), hint="REMOTEDISK")
        ds[...] = a
        (tmp_path / "tape" / "x" / "c" / "0").mkdir(parents=True)
        (tmp_path / "local" / "x").mkdir(parents=True, exist_ok=True)
        (tmp_path / "local" / "x" / "c").write_bytes(b"")
        r = ds.migrate(to="tape").result()
        assert r.moved == 2 and [k for k, _ in r.failed] == ["c/0"]
        assert re.search(
            r"chunk 'c/0' of dataset 'x' not copied: tier 'tape'.*Is a dir", r.failed[0][1]
        )
        r = ds.stage(to="local").result()
        assert r.moved == 0 and sorted(k for k, _ in r.failed) == ["c/0", "c/1", "c/2"]
        assert all("Not a directory" in m for _, m in r.failed)
        assert copies(ds) == {"c/0": ["remote"], "c/1": ["tape"], "c/2": ["tape"]}
        assert all(t.up for t in s.tiers)
        assert {t.name: t.state for t in s.catalog.tiers()} == dict.fromkeys(s.tiers.names, "up")
        np.testing.assert_array_equal(ds[...], a)
        ds.close()


def test_an_eviction_something_is_in_the_way_of_evicts_the_rest(tmp_path):
    """An eviction of a chunk whose only copy something is in the way of (it cannot be read
    to be written back), or whose write-back something is in the way of on the tier it goes
    to, fails for that chunk alone, named, and leaves it where it was; an eviction round that
    makes room for a write passes over such a chunk to the next, where it raised the
    ObjectError into the write. No tier is marked down."""
    a = np.arange(12, dtype="i4")
    tiers = three_tiers(tmp_path)
    tiers["local"].capacity = 60  # (three chunks: 16 bytes and a CRC-32C each)
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("x", (12,), "i4", (4,), hint="LOCALDISK")
        ds[...] = a
        ds.flush()
        obj = tmp_path / "local" / "x" / "c" / "0"
        obj.unlink()
        obj.mkdir()
        (tmp_path / "remote" / "x" / "c" / "1").mkdir(parents=True)
        r = ds.evict(np.s_[0:8], tier="local").result()
        failed = dict(r.failed)  # (the moves run on threads: their order is any)
        assert r.moved == 0 and sorted(failed) == ["c/0", "c/1"]
        assert re.search(r"copy on tier 'local' cannot be read.*Is a dir", failed["c/0"])
        assert re.search(r"not written back to tier 'remote'.*Is a dir", failed["c/1"])
        y = s.create_dataset("y", (4,), "i4", (4,), hint="LOCALDISK")
        y[...] = 7  # (room made by writing c/2 back: c/0 and c/1 are passed over)
        assert copies(y) == {"c/0": ["local"]}
        assert copies(ds) == {"c/0": ["local"], "c/1": ["local"], "c/2": ["remote"]}
        assert all(t.up for t in s.tiers)
        np.testing.assert_array_equal(ds[4:12], a[4:12])
        ds.close()
        y.close()


class MovedMeanwhile(PosixBackend):
    """A POSIX backend whose first ``get`` of object ``key`` first runs ``meanwhile``
    (another process moving the chunk after this one looked its rows up); it counts gets."""

    def __init__(self, root, key="", meanwhile=None):
        super().__init__(root)
        self.key = key
        self.meanwhile = meanwhile
        self.gets = 0

    def get(self, key):
        self.gets += 1
        if key == self.key and self.meanwhile is not None:
            run, self.meanwhile = self.meanwhile, None
            run()
        return super().get(key)


@pytest.mark.parametrize("memory", [False, True], ids=["prefetch-cache", "memory-tier"])
@pytest.mark.parametrize("other", ["migrate", "evict"])
def test_a_prefetch_follows_a_chunk_another_process_moved_after_its_lookup(tmp_path, memory, other):
    """Another process moves a chunk between a prefetch's lookup of its rows and its read:
    it migrates the chunk's only copy to a slower tier, or evicts one of two copies. The
    prefetch without a memory tier failed that chunk with the backend's NotFoundError; it
    now reads the chunk's next copy where one holds its bytes, else learns the chunk's rows
    again from the catalog and reads the copy there, as a read does (a prefetch to a memory
    tier, a stage, already did). The prefetched bytes are the chunk's: reads afterwards are
    served from memory."""
    a = np.arange(8, dtype="i4")
    catalog = tmp_path / "cat.db"
    with strataio.Session(tiers=three_tiers(tmp_path), catalog=catalog) as s:
        ds = s.create_dataset("x", (8,), "i4", (4,), hint="LOCALDISK")
        ds[...] = a
        if other == "evict":
            ds.stage(to="remote").wait()  # (a second copy: only the one on local goes)
        before = copies(ds)
        ds.close()

    def move():
        with strataio.Session(tiers=three_tiers(tmp_path), catalog=catalog) as o:
            y = o.open_dataset("x", "r+")
            if other == "migrate":
                y.migrate(np.s_[0:4], to="remote").wait()
            else:
                y.evict(np.s_[0:4], tier="local").wait()
            y.close()

    local = MovedMeanwhile(tmp_path / "local", "x/c/0", move)
    remote = MovedMeanwhile(tmp_path / "remote")
    tiers = [
        Tier("local", local, "localdisk", order=1),
        Tier("remote", remote, "remotedisk", order=2),
        Tier("tape", PosixBackend(tmp_path / "tape"), "remotetape", order=3),
    ]
    if memory:
        tiers.insert(0, Tier("mem", MemoryBackend(), "memory", order=0))
    with strataio.Session(tiers=TierSet(tiers), catalog=catalog) as s:
        ds = s.open_dataset("x")
        assert copies(ds) == before
        r = ds.prefetch().wait()
        assert local.meanwhile is None  # (the other process moved c/0 during the prefetch)
        assert (r.moved, r.failed) == (2, [])
        if memory:
            assert all(where[0] == "mem" for where in copies(ds).values())
        else:
            assert len(s.cache) == 2
        gets = (local.gets, remote.gets)
        np.testing.assert_array_equal(ds[...], a)
        assert (local.gets, remote.gets) == gets  # (served from memory)
        ds.close()
    with strataio.Session(tiers=three_tiers(tmp_path), catalog=catalog) as s:
        ds = s.open_dataset("x")
        assert copies(ds)["c/0"] == ["remote"]
        np.testing.assert_array_equal(ds[...], a)
        ds.close()


def small_fast_session(tmp_path):
    tiers = TierSet(
        [
            Tier("disk", PosixBackend(tmp_path / "disk"), "localdisk", capacity=4 * 400, order=0),
            Tier("tape", PosixBackend(tmp_path / "tape"), "remotetape", order=1),
        ]
    )
    return strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db")


@pytest.mark.parametrize("op", ["stage", "migrate"])
def test_a_move_larger_than_its_target_keeps_what_it_placed_and_says_what_did_not_fit(tmp_path, op):
    """16 chunks moved to a tier with room for 4: the move never evicts its own chunks for
    its later ones; the 4 it placed stay, the other 12 are reported (a stage's no_room, a
    migration's failures), and what it reports moved is where it says."""
    a = np.arange(40 * 40, dtype="f4").reshape(40, 40)
    with small_fast_session(tmp_path) as s:
        ds = fill(s, a)
        r = getattr(ds, op)(to="disk").result()
        on_disk = {k for k, cs in ds.residency().items() if any(c.tier == "disk" for c in cs)}
        assert r.moved == len(on_disk) == 4, r
        if op == "stage":
            assert (r.no_room, r.failed) == (12, []), r
        else:
            assert r.no_room == 0 and len(r.failed) == 12, r
            assert {k for k, _ in r.failed}.isdisjoint(on_disk)
            assert all("is full" in m for _, m in r.failed)
        assert s.placement.evictions == 0
        assert {c.key for c in s.catalog.residency("a") if c.tier == "disk"} == on_disk
        np.testing.assert_array_equal(ds[...], a)
        ds.close()


def test_cancel_stops_a_stage_queued_on_one_tape_drive_between_chunks(tmp_path):
    """Many mover threads (a wide disk tier) and a tape of one drive: after a cancel, the
    chunks waiting for the drive do not go on one by one; at most the transfer under way
    ends, and what moved is committed and on disk."""
    tiers = TierSet(
        [
            Tier("disk", PosixBackend(tmp_path / "disk"), "localdisk", order=0, concurrency=16),
            Tier(
                "tape",
                Shaped(PosixBackend(tmp_path / "tape"), SLOW, 1.0),
                "remotetape",
                order=1,
                concurrency=1,
            ),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = fill(s, np.zeros((100, 100), "f4"))
        h = ds.stage()  # 100 chunks x 20 ms, one at a time on the drive, 17 threads waiting
        deadline = time.monotonic() + 10
        while h.progress.done < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        before = h.progress.done
        assert h.cancel()
        r = h.result()
        assert r.moved <= before + 3, (before, r)
        assert r.moved + r.cancelled == 100 and not r.failed, r
        ds.close()
        on_disk = {c.key for c in s.catalog.residency("a") if c.tier == "disk"}
        files = {
            p.relative_to(tmp_path / "disk" / "a").as_posix()
            for p in (tmp_path / "disk" / "a").rglob("c/*/*")
        }
        assert len(on_disk) == r.moved and files == on_disk
