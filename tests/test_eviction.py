"""Eviction and staging under capacity pressure never lose a chunk.

A small fast tier above an archive, datasets several times its size written by random partial
writes with full reads in between: every chunk reads back its last value, in the same session
and after a reopen; the catalog, the tiers' usage and the objects present agree; fsck is clean.
Missing copies are dropped and skipped, never reported to a writer that needed room.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from click.testing import CliRunner

import strataio
from strataio.catalog.base import ChunkCopy
from strataio.cli import main
from strataio.errors import BackendError, ChecksumError, ConfigError
from strataio.storage.memory import MemoryBackend
from strataio.storage.posix import PosixBackend
from strataio.tiers.commit import Commit
from strataio.tiers.fsck import fsck
from strataio.tiers.residency import Residency
from strataio.tiers.tier import DEFAULT_MEMORY_BYTES, Tier, TierSet, checksum

CONFIG = """
[catalog]
url = "cat.db"

[[tiers]]
name = "fast"
kind = "posix"
role = "localdisk"
path = "fast"
capacity = "{capacity}"

[[tiers]]
name = "archive"
kind = "posix"
role = "remotetape"
path = "archive"
shaped = "remote_tape_2002"
time_scale = 0.0
"""


def settled_fsck(catalog, tiers):
    """fsck where every change is committed: nothing may be left in flight either."""
    report = fsck(catalog, tiers)
    assert not report.in_flight, report.in_flight
    return report


def tier_state(s: strataio.Session) -> dict[str, object]:
    """What the catalog, the tiers' accounting and the objects on disk say, per tier."""
    rows = s.catalog.all_residency()
    out: dict[str, object] = {}
    for t in s.tiers:
        mine = {f"{c.dataset}/{c.key}": c.nbytes for c in rows if c.tier == t.name}
        present = {k: t.backend.size(k) for k in t.backend.list() if not k.endswith("zarr.json")}
        out[t.name] = (t.used, t.reserved, sum(mine.values()), mine, present)
    return out


def check_agreement(s: strataio.Session) -> None:
    """Usage equals the catalogued bytes, every catalogued copy is present with its size, no
    object is left that no row names, nothing is reserved."""
    s.usage()
    for name, (used, reserved, total, mine, present) in tier_state(s).items():
        assert reserved == 0, name
        assert used == total, (name, used, total)
        assert mine == present, (name, sorted(set(mine) ^ set(present))[:5])
        cap = s.tiers[name].capacity
        assert cap is None or used <= cap, (name, used, cap)


def run_scenario(root, seed: int, *, datasets: int, writes: int, shape, chunks, capacity):
    """Finding 1 of the issue: random partial writes with a full read every 10, close,
    reopen, read; several datasets in a row in one catalog. Returns the failures seen."""
    (root / "strataio.toml").write_text(CONFIG.format(capacity=capacity))
    rng = np.random.default_rng(seed)
    failures: list[str] = []
    n0, n1 = shape
    for d in range(datasets):
        name = f"st{d}"
        oracle = np.zeros(shape, "f4")
        with strataio.Session(root / "strataio.toml") as s:
            ds = s.create_dataset(name, shape, "f4", chunks, hint="LOCALDISK")
            for i in range(writes):
                r0, c0 = (int(x) for x in rng.integers(0, [n0, n1]))
                r1 = int(rng.integers(r0 + 1, min(n0, r0 + n0 // 3) + 1))
                c1 = int(rng.integers(c0 + 1, min(n1, c0 + n1 // 3) + 1))
                v = rng.random((r1 - r0, c1 - c0), dtype="f4")
                ds[r0:r1, c0:c1] = v
                oracle[r0:r1, c0:c1] = v
                if i % 10 == 9 and not np.array_equal(ds[...], oracle):
                    failures.append(f"{name}: read after write {i} differs")
            ds.close()
        with strataio.Session(root / "strataio.toml") as s:
            ds = s.open_dataset(name)
            if not np.array_equal(ds[...], oracle):
                failures.append(f"{name}: read after reopen differs")
            ds.close()
            report = settled_fsck(s.catalog, s.tiers)
            failures += [
                f"{name}: fsck {f.kind} {f.tier} {f.dataset} {f.key}" for f in report.problems
            ]
            check_agreement(s)
    return failures


@pytest.mark.parametrize("seed", [0, 1])
def test_random_partial_writes_through_a_small_fast_tier_lose_nothing(tmp_path, seed):
    failures = run_scenario(
        tmp_path, seed, datasets=2, writes=40, shape=(256, 256), chunks=(32, 32), capacity="64KiB"
    )
    assert failures == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_finding_one_as_reported(tmp_path, seed):
    """The reported configuration: 1024x1024 float32 in 128x128 chunks through 1 MiB, 300
    writes, five datasets in a row."""
    failures = run_scenario(
        tmp_path,
        seed,
        datasets=5,
        writes=300,
        shape=(1024, 1024),
        chunks=(128, 128),
        capacity="1MiB",
    )
    assert failures == []


def test_a_dataset_four_times_the_tier_keeps_rows_and_objects_in_step(tmp_path):
    (tmp_path / "strataio.toml").write_text(CONFIG.format(capacity="64KiB"))
    a = np.random.default_rng(3).random((256, 256), dtype="f4")  # 256 KiB
    with strataio.Session(tmp_path / "strataio.toml") as s:
        ds = s.create_dataset("big", a.shape, a.dtype, (32, 32), hint="LOCALDISK")
        for i in range(0, 256, 32):
            ds[i : i + 32, :] = a[i : i + 32, :]
        np.testing.assert_array_equal(ds[...], a)
        ds.close()
        check_agreement(s)
    with strataio.Session(tmp_path / "strataio.toml") as s:
        np.testing.assert_array_equal(s.open_dataset("big")[...], a)
        check_agreement(s)
        assert settled_fsck(s.catalog, s.tiers).clean


def two_tier_session(root, cap=4 * 400):
    tiers = TierSet(
        [
            Tier("fast", PosixBackend(root / "fast"), "localdisk", capacity=cap, order=0),
            Tier("archive", PosixBackend(root / "archive"), "remotetape", order=1),
        ]
    )
    return strataio.Session(tiers=tiers, catalog=root / "cat.db")


A = np.arange(40 * 40, dtype="f4").reshape(40, 40)  # 16 chunks of 10x10: 400 bytes each


def test_a_lost_only_copy_never_fails_writes_of_other_datasets(tmp_path):
    with two_tier_session(tmp_path) as s:
        ds = s.create_dataset("a", (20, 20), "f4", (10, 10), hint="LOCALDISK")
        ds[...] = A[:20, :20]  # four chunks fill the fast tier
        ds.close()
    os.unlink(tmp_path / "fast" / "a" / "c" / "1" / "1")  # lost behind the catalog's back
    with two_tier_session(tmp_path) as s:
        b = s.create_dataset("b", A.shape, "f4", (10, 10), hint="LOCALDISK")
        b[...] = A  # needs the room the lost chunk's row claims: no NotFoundError
        np.testing.assert_array_equal(b[...], A)
        b.close()
        a = s.open_dataset("a")
        with pytest.raises(BackendError, match=r"'c/1/1' of 'a'"):
            a[...]
        np.testing.assert_array_equal(a[0:10, 0:10], A[:10, :10])  # the rest reads
        a.close()
        lost = [(f.kind, f.dataset, f.key) for f in settled_fsck(s.catalog, s.tiers).problems]
        assert lost == [("lost", "a", "c/1/1")]


def test_a_full_hierarchy_still_takes_rewrites_of_the_chunks_it_holds(tmp_path):
    """Every tier full: a rewrite of a stored chunk replaces its copy in place (it needs no
    more room); a new chunk is refused, naming it."""
    tiers = TierSet(
        [
            Tier("fast", PosixBackend(tmp_path / "fast"), "localdisk", capacity=800, order=0),
            Tier(
                "archive", PosixBackend(tmp_path / "archive"), "remotetape", capacity=400, order=1
            ),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("a", (20, 20), "f4", (10, 10), hint="LOCALDISK")
        with pytest.raises(BackendError, match=r"1 of 4 chunks could not be stored"):
            ds[...] = A[:20, :20]
        stored = sorted(ds.residency())
        assert len(stored) == 3
        for key in stored:
            i, j = (int(x) for x in key.split("/")[1:])
            ds[i * 10 : i * 10 + 10, j * 10 : j * 10 + 10] = -1.0
        ds.flush()
        for key in stored:
            i, j = (int(x) for x in key.split("/")[1:])
            np.testing.assert_array_equal(ds[i * 10 : i * 10 + 10, j * 10 : j * 10 + 10], -1.0)
        assert [t.used for t in s.tiers] == [800, 400]
        ds.close()
        check_agreement(s)


def test_the_room_a_rewrite_counts_on_stays_its_own_if_its_copy_goes_meanwhile(tmp_path):
    """A rewrite claims only what it adds to the copy it replaces. If that copy is forgotten
    before the rewrite is recorded (evicted by another thread, or found moved by another
    process), its room stays reserved for the rewrite: no other put takes it, and the tier
    never holds more than its capacity. A second write of the chunk meanwhile counts nothing
    and claims its whole size."""
    t = Tier("t", MemoryBackend("t"), "localdisk", capacity=128)
    tiers = TierSet([t, Tier("slow", MemoryBackend("slow"), "remotedisk", order=1)])
    rows = [
        ChunkCopy("d", "c/0", "t", 64, checksum(b"a" * 64)),
        ChunkCopy("d", "c/1", "t", 64, checksum(b"b" * 64)),
    ]
    res = Residency("d", rows, tiers)  # as loaded from the catalog
    tiers.account_usage(rows)
    w, other = object(), object()
    assert res.count_room("c/0", "t", w) == 64 and t.reserve(0)  # same size: 0 more
    assert res.count_room("c/0", "t", other) == 0  # counted already: the second claims all
    res.remove("c/0", "t")  # evicted meanwhile
    assert (t.used, t.reserved) == (64, 64)
    assert not t.reserve(64)  # the room freed is the rewrite's
    assert res.end_count("c/0", "t", other) == 0  # not the other write's to end
    res.record_write(ChunkCopy("d", "c/0", "t", 64, checksum(b"c" * 64)), owner=w)
    assert (t.used, t.reserved) == (128, 0)
    # another process moved it away (a refresh from the catalog), then a smaller copy is
    # recorded; last, the rewrite puts nothing after all
    assert res.count_room("c/1", "t", w) == 64
    res.refresh("c/1", [ChunkCopy("d", "c/1", "slow", 64, checksum(b"b" * 64))])
    assert (t.used, t.reserved) == (64, 64)
    res.add(ChunkCopy("d", "c/1", "t", 16, checksum(b"d" * 16)))
    assert (t.used, t.reserved) == (80, 64)
    t.release(res.end_count("c/1", "t", w))
    assert (t.used, t.reserved) == (80, 0)


class GatedBackend(MemoryBackend):
    """A memory backend whose puts from a thread named ``gated`` wait until :attr:`go` is set
    (:attr:`held` says one is waiting)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.held, self.go = threading.Event(), threading.Event()

    def put(self, key, data, *, durable=False):
        if threading.current_thread().name == "gated":
            self.held.set()
            self.go.wait(10)
        super().put(key, data, durable=durable)


def test_a_same_size_rewrite_fits_beside_a_growing_rewrite_in_flight(tmp_path):
    """Every tier full: while one thread's rewrite that grows its chunk is being put (its
    growth claimed and announced), another thread's same-size rewrite of another stored chunk
    still fits, and the tier ends exactly full."""
    fastb = GatedBackend("fast")
    tiers = TierSet(
        [
            Tier("fast", fastb, "localdisk", capacity=110, order=0),
            Tier("archive", MemoryBackend("archive"), "remotetape", capacity=100, order=1),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        s.create_dataset("e", (2, 50), "u1", (1, 50), hint="REMOTETAPE", codec=[])[...] = 7
        ds = s.create_dataset("d", (2, 50), "u1", (1, 50), hint="LOCALDISK", codec=[])
        ds[...] = 1
        fast = s.tiers["fast"]
        assert (fast.used, s.tiers["archive"].used) == (100, 100)
        grow = threading.Thread(
            target=lambda: ds.store.put_chunks([("c/0/0", b"\x02" * 60)]), name="gated"
        )
        grow.start()
        assert fastb.held.wait(10)
        ds[1, :] = 3  # a same-size rewrite of the other chunk
        fastb.go.set()
        grow.join()
        assert (fast.used, fast.reserved) == (110, 0)
        assert [c.tier for c in ds.residency()["c/1/0"]] == ["fast"]
        np.testing.assert_array_equal(ds[1, :], 3)


def test_two_rewrites_of_one_chunk_at_once_never_overfill_a_tier(tmp_path):
    """Two threads rewrite one stored chunk on a full tier while a third write needs room:
    the first counts the copy's room as its own, the second claims its whole size, and the
    room the first frees by shrinking the chunk is not given to the third."""
    tiers = TierSet(
        [
            Tier("fast", MemoryBackend("fast"), "localdisk", capacity=100, order=0),
            Tier("archive", MemoryBackend("archive"), "remotetape", order=1),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("d", (2, 100), "u1", (1, 100), hint="LOCALDISK", codec=[])
        store, fast = ds.store, s.tiers["fast"]
        store.put_chunks([("c/0/0", b"a" * 100)])
        held, go = threading.Event(), threading.Event()
        claim = store.placement.claim

        def slow_claim(tier, nbytes, **kw):  # the second writer pauses right after its claim
            got = claim(tier, nbytes, **kw)
            if threading.current_thread().name == "second":
                held.set()
                go.wait(10)
            return got

        store.placement.claim = slow_claim
        second = threading.Thread(
            target=lambda: store.put_chunks([("c/0/0", b"B" * 100)]), name="second"
        )
        second.start()
        assert held.wait(10)
        store.put_chunks([("c/0/0", b"c" * 10)])  # the first: smaller, recorded meanwhile
        store.put_chunks([("c/1/0", b"d" * 90)])  # a third write that would like that room
        go.set()
        second.join()
        store.placement.claim = claim
        assert fast.used <= fast.capacity and fast.reserved == 0
        assert fast.used == sum(c.nbytes for c in store.res.on_tier("fast"))
        assert bytes(ds[0, :]) == b"B" * 100


def test_a_write_back_never_takes_a_copy_being_rewritten(tmp_path):
    """A write-back records its copy and forgets the source only while the source is still
    the copy it read and no put is rewriting it."""
    tiers = TierSet(
        [
            Tier("fast", MemoryBackend("fast"), "localdisk", order=0),
            Tier("slow", MemoryBackend("slow"), "remotedisk", order=1),
        ]
    )
    res = Residency("d", [], tiers)
    src = ChunkCopy("d", "c/0", "fast", 4, checksum(b"old!"))
    res.add(src)
    back = ChunkCopy("d", "c/0", "slow", 4, checksum(b"old!"))
    version = res.version("c/0")
    with res.writing("c/0", "fast"):  # a rewrite in flight there
        assert not res.record_move(back, version, replaces=src)
        res.abandon_write("c/0", "fast")
    assert [c.tier for c in res.copies("c/0")] == ["fast"]
    res.add(src._replace(checksum=checksum(b"new!")))  # replaced since it was read
    assert not res.record_move(back, version, replaces=src)
    assert [c.tier for c in res.copies("c/0")] == ["fast"]


def test_a_missing_copy_is_dropped_and_the_next_copy_read(tmp_path):
    with two_tier_session(tmp_path, cap=None) as s:
        ds = s.create_dataset("a", (20, 20), "f4", (10, 10), hint="REMOTETAPE")
        ds[...] = A[:20, :20]
        ds.stage(to="fast").wait()
        ds.close()
    os.unlink(tmp_path / "fast" / "a" / "c" / "0" / "1")
    with two_tier_session(tmp_path, cap=None) as s:
        ds = s.open_dataset("a")
        np.testing.assert_array_equal(ds[...], A[:20, :20])
        assert {c.tier for c in ds.residency()["c/0/1"]} == {"archive"}
        # its row goes at once, in a transaction that deletes it only if it is still the
        # row the read saw: no later refresh or eviction takes it for a copy
        assert {c.tier for c in s.catalog.residency("a") if c.key == "c/0/1"} == {"archive"}
        ds.evict(tier="archive").result()  # the only copy: refused, not lost
        ds.close()
        assert {c.tier for c in s.catalog.residency("a") if c.key == "c/0/1"} == {"archive"}
        assert settled_fsck(s.catalog, s.tiers).clean
        check_agreement(s)


def test_evicting_an_only_copy_from_the_slowest_tier_says_it_is_the_slowest(tmp_path):
    with two_tier_session(tmp_path, cap=None) as s:
        ds = s.create_dataset("a", (20, 20), "f4", (10, 10), hint="REMOTETAPE")
        ds[...] = A[:20, :20]
        r = ds.evict(tier="archive").result()
        assert len(r.failed) == 4
        for _, message in r.failed:
            assert "its only copy is on 'archive', the slowest tier, so it" in message
            assert "full, down" not in message
        np.testing.assert_array_equal(ds[...], A[:20, :20])
        ds.close()


def test_evicting_an_only_copy_a_full_slower_tier_cannot_take_says_so(tmp_path):
    tiers = TierSet(
        [
            Tier("fast", PosixBackend(tmp_path / "fast"), "localdisk", order=0),
            Tier(
                "archive", PosixBackend(tmp_path / "archive"), "remotetape", capacity=400, order=1
            ),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("a", (10, 20), "f4", (10, 10), hint="LOCALDISK")
        ds[...] = A[:10, :20]
        r = ds.evict(tier="fast").result()
        assert r.moved == 1 and len(r.failed) == 1, r
        assert "no slower tier can take it (each is full" in r.failed[0][1]
        np.testing.assert_array_equal(ds[...], A[:10, :20])
        ds.close()


def test_a_copy_of_another_value_elsewhere_does_not_count_as_a_copy_kept(tmp_path):
    """Evicting a chunk's fast copy while the only other row known for it holds another value
    (rows of two processes' changes can disagree until fsck): the fast copy is written back
    over it, never dropped as if kept elsewhere."""
    with two_tier_session(tmp_path, cap=None) as s:
        ds = s.create_dataset("a", (10, 10), "f4", (10, 10), hint="REMOTETAPE")
        ds[...] = 1.0
        ds.stage(to="fast").wait()
        ds.close()
    with two_tier_session(tmp_path, cap=None) as s:
        ds = s.open_dataset("a", "r+")
        older = ds.store.res.copy_on("c/0/0", "archive")
        ds.store.res.refresh(
            "c/0/0",
            [
                ds.store.res.copy_on("c/0/0", "fast"),
                older._replace(checksum="0bad0bad"),
            ],
        )
        assert not ds.store.res.kept_elsewhere("c/0/0", "fast")
        ds.evict(tier="fast").wait()
        assert {c.tier for c in s.catalog.residency("a")} == {"archive"}
        ds.close()
        np.testing.assert_array_equal(s.open_dataset("a")[...], 1.0)
        assert settled_fsck(s.catalog, s.tiers).clean


def test_a_flipped_byte_is_found_without_a_checksum_codec_and_names_the_chunk(tmp_path):
    with two_tier_session(tmp_path, cap=None) as s:
        ds = s.create_dataset("raw", (20, 20), "f4", (10, 10), hint="LOCALDISK", codec=[])
        ds[...] = A[:20, :20]
        ds.close()
    path = tmp_path / "fast" / "raw" / "c" / "1" / "0"
    data = bytearray(path.read_bytes())
    data[7] ^= 0x10
    path.write_bytes(bytes(data))
    with two_tier_session(tmp_path, cap=None) as s:
        ds = s.open_dataset("raw")
        with pytest.raises(ChecksumError, match=r"chunk 'c/1/0' of dataset 'raw'.*fast"):
            ds[...]
        ds.close()


def test_a_removed_copy_rewritten_before_the_commit_is_not_deleted(tmp_path):
    """The object of a copy forgotten and then written again before the commit holds the new
    version: the commit must not delete it."""
    tiers = TierSet([Tier("t", PosixBackend(tmp_path / "t"), "localdisk")])
    from strataio.catalog.base import DatasetRecord, open_catalog

    cat = open_catalog(tmp_path / "cat.db")
    cat.register_tiers(tiers.records())
    cat.create_dataset(DatasetRecord("d", (4,), "<f4", (4,)))
    commit = Commit(tiers, cat)
    res = Residency("d", [], tiers)
    t = tiers["t"]

    def put(data: bytes) -> None:
        with res.writing("c/0", "t"):
            t.backend.put("d/c/0", data)
            res.record_write(ChunkCopy("d", "c/0", "t", len(data), checksum(data)))

    put(b"old!")
    commit.apply(res)
    res.remove("c/0", "t")  # e.g. evicted: its object is to go after the next commit
    put(b"new!")  # written again before that commit
    commit.apply(res)
    assert bytes(t.backend.get("d/c/0")) == b"new!"
    assert [(c.tier, c.checksum) for c in cat.residency("d")] == [("t", checksum(b"new!"))]
    cat.close()


def test_memory_tier_holds_staged_copies_and_is_never_a_home(tmp_path):
    tiers = TierSet(
        [
            Tier("mem", MemoryBackend("mem"), "memory", capacity=2 * 400, order=0),
            Tier("disk", PosixBackend(tmp_path / "disk"), "localdisk", order=1),
            Tier("tape", PosixBackend(tmp_path / "tape"), "remotetape", order=2),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("a", A.shape, A.dtype, (10, 10), hint="LOCALDISK")
        ds[...] = A
        assert {c.tier for cs in ds.residency().values() for c in cs} == {"disk"}
        ds.prefetch(np.s_[0:10, 0:20]).wait()  # two chunks into memory
        mem = tiers["mem"].backend
        assert sorted(mem.list()) == ["a/c/0/0", "a/c/0/1"]
        assert tiers["mem"].used == 800
        ds.stage(np.s_[10:20, 0:10], to="mem").wait()  # a third: the LRU one is dropped
        assert len(list(mem.list())) == 2 and tiers["mem"].used == 800
        np.testing.assert_array_equal(ds[...], A)
        with pytest.raises(strataio.StrataError, match="memory tier"):
            ds.migrate(to="mem")
        ds.flush()
        # never catalogued: the catalog names only copies that outlive the process
        assert {c.tier for c in s.catalog.residency("a")} == {"disk"}
        assert settled_fsck(s.catalog, s.tiers).clean
        ds[0:10, 0:10] = 7.0  # a write drops the memory copy it makes stale
        assert "mem" not in [c.tier for c in ds.residency()["c/0/0"]]
        assert ds[0, 0] == 7.0
        ds.close()
        assert list(mem.list()) == [] and tiers["mem"].used == 0
    only_memory = TierSet([Tier("mem", MemoryBackend(), "memory", capacity=1000)])
    with pytest.raises(ConfigError, match="persistent tier"):
        strataio.Session(tiers=only_memory, catalog=tmp_path / "cat2.db")
    # the commands take it for the configuration problem it is: exit 2
    (tmp_path / "mem.toml").write_text('[[tiers]]\nname = "m"\nkind = "memory"\nrole = "memory"\n')
    for cmd in (["tiers"], ["fsck"]):  # (ls and du read the catalog alone)
        out = CliRunner().invoke(main, [*cmd, "--config", str(tmp_path / "mem.toml")])
        assert out.exit_code == 2 and "persistent tier" in out.stderr, (cmd, out.output)


def test_a_configured_memory_tier_is_the_prefetch_target(tmp_path):
    (tmp_path / "strataio.toml").write_text(
        '[catalog]\nurl = "cat.db"\n'
        '[[tiers]]\nname = "ram"\nkind = "memory"\nrole = "memory"\n'
        '[[tiers]]\nname = "disk"\nkind = "posix"\nrole = "localdisk"\npath = "disk"\n'
    )
    with strataio.Session(tmp_path / "strataio.toml") as s:
        assert s.tiers["ram"].capacity == DEFAULT_MEMORY_BYTES  # bounded by default
        ds = s.create_dataset("a", A.shape, A.dtype, (10, 10))  # AUTO: the disk, never ram
        ds[...] = A
        ds.prefetch().wait()
        assert {c.tier for c in ds.residency()["c/3/3"]} == {"ram", "disk"}
        assert len(list(s.tiers["ram"].backend.list())) == 16
        np.testing.assert_array_equal(ds[...], A)
        ds.evict(tier="ram").wait()  # dropped: the disk copy stays
        assert list(s.tiers["ram"].backend.list()) == []
        assert {c.tier for cs in ds.residency().values() for c in cs} == {"disk"}
        ds.close()


class RewritingBackend(PosixBackend):
    """A POSIX backend that runs ``during_put`` (once) when an object is put: the moment at
    which another thread's write of the same chunk lands in a real run."""

    during_put = None

    def put(self, key, data, *, durable=False):
        super().put(key, data, durable=durable)
        hook, self.during_put = self.during_put, None
        if hook is not None:
            hook()


def eviction_rig(root):
    """A residency with chunk ``c/0`` (version 1) only on a one-chunk fast tier."""
    from strataio.catalog.base import DatasetRecord, open_catalog
    from strataio.tiers.placement import Placement

    tiers = TierSet(
        [
            Tier("fast", PosixBackend(root / "fast"), "localdisk", capacity=4, order=0),
            Tier("archive", RewritingBackend(root / "archive"), "remotetape", order=1),
        ]
    )
    cat = open_catalog(root / "cat.db")
    cat.register_tiers(tiers.records())
    cat.create_dataset(DatasetRecord("d", (4,), "<f4", (4,)))
    commit = Commit(tiers, cat)
    placement = Placement(tiers, commit, catalog=cat)
    res = Residency("d", [], tiers)
    placement.register(res)

    def write(data: bytes) -> ChunkCopy:
        with res.writing("c/0", "fast"):
            tiers["fast"].backend.put("d/c/0", data)
            copy = ChunkCopy("d", "c/0", "fast", len(data), checksum(data))
            res.record_write(copy)
        return copy

    write(b"one!")
    commit.apply(res)
    return tiers, cat, commit, placement, res, write


def test_a_chunk_with_a_put_in_flight_is_not_evicted(tmp_path):
    tiers, cat, commit, placement, res, write = eviction_rig(tmp_path)
    v1 = res.copy_on("c/0", "fast")
    with res.writing("c/0", "fast"):  # its new version is being put
        assert not placement.evict_copy(tiers["fast"], res, v1)
        assert not placement.make_room(tiers["fast"], 4)
    assert res.copy_on("c/0", "fast") == v1
    cat.close()


def test_a_write_back_overtaken_by_a_write_records_nothing_and_loses_nothing(tmp_path):
    tiers, cat, commit, placement, res, write = eviction_rig(tmp_path)
    v1 = res.copy_on("c/0", "fast")
    # the new version lands while the old one is being copied to the archive
    tiers["archive"].backend.during_put = lambda: write(b"two!")
    assert not placement.evict_copy(tiers["fast"], res, v1)
    commit.apply(res)
    assert [(c.tier, c.checksum) for c in cat.residency("d")] == [("fast", checksum(b"two!"))]
    assert bytes(tiers["fast"].backend.get("d/c/0")) == b"two!"
    assert not tiers["archive"].backend.exists("d/c/0")  # the stale copy is gone
    assert (tiers["fast"].used, tiers["archive"].used, tiers["archive"].reserved) == (4, 0, 0)
    cat.close()


class HookedBackend(PosixBackend):
    """A POSIX backend that runs ``before`` / ``after`` (once each) around the put of an
    object: what another thread sees while a rewrite in place is in flight."""

    before = None
    after = None

    def put(self, key, data, *, durable=False):
        hook, self.before = self.before, None
        if hook is not None:
            hook()
        super().put(key, data, durable=durable)
        hook, self.after = self.after, None
        if hook is not None:
            hook()


def test_a_rewrite_in_flight_is_announced_and_read_moved_as_either_version(tmp_path):
    fast = HookedBackend(tmp_path / "fast")
    tiers = TierSet(
        [
            Tier("fast", fast, "localdisk", order=0),
            Tier("archive", PosixBackend(tmp_path / "archive"), "remotetape", order=1),
        ]
    )
    # (no staging on read: a read that staged from inside the put would wait for itself)
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db", stage_on_read=False) as s:
        ds = s.create_dataset("a", (10,), "f4", (10,), hint="LOCALDISK")
        ds[...] = 1.0
        ds.flush()
        (old,) = s.catalog.residency("a")
        seen: dict[str, object] = {}

        def before():
            seen["row"] = s.catalog.residency("a")
            seen["read before"] = ds[...].tolist()
            seen["migrate"] = ds.store.migrate(["c/0"], "archive").result()

        def after():
            seen["read after"] = ds[...].tolist()

        fast.before, fast.after = before, after
        ds[...] = 2.0
        (row,) = seen["row"]
        assert (row.tier, row.state, row.old_checksum, row.writer) == (
            "fast",
            "in-transit",
            old.checksum,
            s.writer,
        )
        assert row.checksum != old.checksum
        assert seen["read before"] == [1.0] * 10  # the old bytes, still whole
        assert seen["read after"] == [2.0] * 10  # the new bytes, not yet recorded
        moved = seen["migrate"]
        assert moved.failed == [] and moved.moved == 0  # rewritten meanwhile: nothing to do
        ds.flush()
        assert [(c.tier, c.state, c.checksum) for c in s.catalog.residency("a")] == [
            ("fast", "valid", row.checksum)
        ]
        np.testing.assert_array_equal(ds[...], 2.0)
        ds.close()
        assert settled_fsck(s.catalog, s.tiers).clean
        check_agreement(s)


def test_a_moves_claim_waits_for_room_held_by_puts_in_flight(tmp_path):
    """A memory tier full of other threads' reservations: a write's claim fails at once (it
    fails over), a move's claim waits until those copies are recorded and evicts one."""
    import threading
    import time

    from strataio.tiers.placement import Placement

    tiers = TierSet(
        [
            Tier("mem", MemoryBackend("mem"), "memory", capacity=4, order=0),
            Tier("disk", PosixBackend(tmp_path / "disk"), "localdisk", order=1),
        ]
    )
    placement = Placement(tiers)
    res = Residency("d", [], tiers)
    placement.register(res)
    res.add(ChunkCopy("d", "c/0", "disk", 4, checksum(b"abcd")))
    mem = tiers["mem"]
    assert placement.claim(mem, 4)  # another put in flight holds the whole tier
    assert not placement.claim(mem, 4)

    def record() -> None:
        time.sleep(0.05)
        mem.backend.put("d/c/0", b"abcd")
        res.add(ChunkCopy("d", "c/0", "mem", 4, checksum(b"abcd")), reserved=4)

    th = threading.Thread(target=record)
    th.start()
    try:
        assert placement.claim(mem, 4, protect=["d/c/1"], wait=True)
    finally:
        th.join()
    assert res.copy_on("c/0", "mem") is None  # the recorded copy made the room
    assert (mem.used, mem.reserved) == (0, 4)


def test_a_closed_dataset_is_no_longer_an_eviction_candidate_of_its_session(tmp_path):
    """A closed dataset's residency goes stale (another handle, or process, rewrites and
    moves its chunks): evicting from it would act on rows it no longer follows, so its
    session's eviction rounds leave it out, even while the closed object lives on."""
    with two_tier_session(tmp_path) as s:
        ds = s.create_dataset("a", (20, 20), "f4", (10, 10), hint="LOCALDISK")
        ds[...] = A[:20, :20]
        res = ds.store.res
        assert res in set(s.placement._residencies)
        ds.close()
        assert res not in set(s.placement._residencies)
        again = s.open_dataset("a", "r+")
        again[0:10, 0:10] = 7.0
        b = s.create_dataset("b", (20, 20), "f4", (10, 10), hint="LOCALDISK")
        b[...] = A[20:, 20:]  # needs the room of "a"'s chunks: evicted through `again`
        again.close()
        b.close()
        want = A[:20, :20].copy()
        want[0:10, 0:10] = 7.0
        np.testing.assert_array_equal(s.open_dataset("a")[...], want)
        assert settled_fsck(s.catalog, s.tiers).clean


def test_an_eviction_round_takes_the_chunks_read_least_recently_first(tmp_path):
    """A read here orders the chunks of an open dataset for eviction (LRU), though the
    copies' rows in memory keep the time they were put: the chunk just read stays."""
    with two_tier_session(tmp_path) as s:
        a = s.create_dataset("a", (20, 20), "f4", (10, 10), hint="LOCALDISK")
        a[...] = A[:20, :20]  # four chunks, put together, fill the fast tier
        a.flush()
        strataio.chunk_cache().clear()
        np.testing.assert_array_equal(a[0:10, 0:10], A[:10, :10])  # c/0/0 read last
        res = a.store.res
        assert (
            res.last_access(res.copy_on("c/0/0", "fast")) > res.copy_on("c/0/0", "fast").last_access
        )
        b = s.create_dataset("b", (10, 10), "f4", (10, 10), hint="LOCALDISK")
        b[...] = A[20:30, 20:30]  # room for one chunk: one of a's three others goes
        on_fast = {k for k in ("c/0/0", "c/0/1", "c/1/0", "c/1/1") if res.copy_on(k, "fast")}
        assert len(on_fast) == 3 and "c/0/0" in on_fast
        np.testing.assert_array_equal(a[...], A[:20, :20])
        a.close()
        b.close()


def test_an_eviction_round_that_fails_releases_its_claims(tmp_path, monkeypatch):
    """An eviction round claims the datasets not open here whose chunks it evicts; a failure
    in the round (here, of a victim's eviction) still releases them: another process opens
    such a dataset at once, where before it waited on a claim no one would release."""
    from strataio.errors import BackendError

    with two_tier_session(tmp_path) as s:
        ds = s.create_dataset("a", (20, 20), "f4", (10, 10), hint="LOCALDISK")
        ds[...] = A[:20, :20]  # four chunks fill the fast tier
        ds.close()

        def failing(*args, **kwargs):
            raise BackendError("the write-back's destination failed")

        monkeypatch.setattr(s.placement, "evict_copy", failing)
        b = s.create_dataset("b", (10, 10), "f4", (10, 10), hint="LOCALDISK")
        with pytest.raises(BackendError, match="destination failed"):
            b[...] = 1.0  # (needs room: a round over "a", not open here)
        with two_tier_session(tmp_path) as other:
            assert other.catalog.claim_eviction("a"), "the failed round kept its claim on 'a'"
            other.catalog.release_eviction("a")


def test_evicting_an_only_copy_from_a_tier_marked_down_says_so(tmp_path):
    """The copy cannot be read to be written back: the failure names the tier as down and
    why, not the slower tiers as full."""
    with two_tier_session(tmp_path, cap=None) as s:
        ds = s.create_dataset("a", (10, 20), "f4", (10, 10), hint="LOCALDISK")
        ds[...] = A[:10, :20]
        ds.flush()
        s.tiers["fast"].mark_down("its directory is gone")
        r = ds.evict(tier="fast").result()
        assert r.moved == 0 and len(r.failed) == 2, r
        for _, message in r.failed:
            assert "'fast', which is marked down (its directory is gone)" in message
            assert "full, down" not in message
        s.tiers["fast"].mark_up()
        np.testing.assert_array_equal(ds[...], A[:10, :20])
        ds.close()


def _staged_with_archive_lost(root, *, truncate=False):
    """Dataset 'a', its four chunks on the archive and staged to the fast tier (filling it);
    then its archive objects are lost (or cut short) behind strataio's back."""
    with two_tier_session(root) as s:
        ds = s.create_dataset("a", (20, 20), "f4", (10, 10), hint="REMOTETAPE")
        ds[...] = A[:20, :20]
        assert ds.stage(to="fast").wait().moved == 4
        ds.close()
    for p in (root / "archive" / "a" / "c").rglob("*"):
        if p.is_file():
            if truncate:
                p.write_bytes(p.read_bytes()[:100])
            else:
                p.unlink()


@pytest.mark.parametrize("open_a", [False, True])
def test_eviction_for_room_never_drops_a_copy_whose_other_copy_was_lost(tmp_path, open_a):
    """A write that needs the fast tier's room evicts chunks whose archive copy the catalog
    names but whose object was lost: they are written back first (the lost copy forgotten,
    put again), never dropped as kept elsewhere."""
    _staged_with_archive_lost(tmp_path)
    with two_tier_session(tmp_path) as s:
        a = s.open_dataset("a") if open_a else None
        b = s.create_dataset("b", (20, 20), "f4", (10, 10), hint="LOCALDISK")
        b[...] = A[20:, 20:]
        assert s.placement.evictions >= 1
        np.testing.assert_array_equal(b[...], A[20:, 20:])
        b.close()
        if a is not None:
            a.close()
        a = s.open_dataset("a")
        np.testing.assert_array_equal(a[...], A[:20, :20])
        a.close()
        assert settled_fsck(s.catalog, s.tiers).clean
        check_agreement(s)


def test_eviction_for_room_keeps_a_copy_whose_other_copy_is_damaged(tmp_path):
    """The archive objects cut short behind strataio's back: the fast copies, the only good
    ones, are not evicted; the write that wanted their room goes on to the archive."""
    _staged_with_archive_lost(tmp_path, truncate=True)
    with two_tier_session(tmp_path) as s:
        b = s.create_dataset("b", (20, 20), "f4", (10, 10), hint="LOCALDISK")
        b[...] = A[20:, 20:]
        np.testing.assert_array_equal(b[...], A[20:, 20:])
        b.close()
        assert {c.key for c in s.catalog.residency("a") if c.tier == "fast"} == {
            "c/0/0",
            "c/0/1",
            "c/1/0",
            "c/1/1",
        }
        sizes = [p.stat().st_size for p in (tmp_path / "fast" / "a").rglob("c/*/*")]
        assert sizes == [400] * 4
