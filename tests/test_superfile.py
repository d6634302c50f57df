"""Superfiles: round trips on every backend and tier, corrupt containers, fsck findings, and a
kill -9 in the middle of writing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import strataio
from strataio.catalog import ChunkCopy
from strataio.errors import ChunksNotStoredError, NotFoundError, StrataError
from strataio.storage.memory import MemoryBackend
from strataio.storage.posix import PosixBackend
from strataio.storage.shaped import Shaped
from strataio.storage.superfile import (
    ContainerBuilder,
    MemberNotFoundError,
    SuperfileError,
    SuperfileIndexError,
    check_container,
    read_index,
)
from strataio.tiers.fsck import Action, Kind, fsck
from strataio.tiers.residency import object_key
from strataio.tiers.tier import Tier, TierSet, checksum

sys.path.insert(0, str(Path(__file__).parent))
import superfile_worker  # noqa: E402

WORKER = Path(__file__).parent / "superfile_worker.py"


def image(i: int, shape=(16, 24)) -> np.ndarray:
    return ((np.arange(np.prod(shape)) * 7 + i * 13) % 251).astype(np.uint8).reshape(shape)


def disk_tape(root: Path) -> TierSet:
    return superfile_worker.tiers(root)


def one_tier(backend, role="remotedisk") -> TierSet:
    return TierSet([Tier("only", backend, role, order=0)])


def round_trip(tiers_factory, catalog, n=12, container_bytes=2000):
    with strataio.Session(tiers=tiers_factory(), catalog=catalog) as s:
        sf = s.superfile("images", container_bytes=container_bytes)
        for i in range(n):
            sf.put(f"iter{i:04d}", image(i))
        sf.put("note", b"rendered with the default transfer function")
        sf.put("iter0003", image(99))  # put again: the last value wins
        assert np.array_equal(sf.get("iter0001"), image(1))  # before and after sealing
        sf.close()
        assert len(sf.containers()) >= 2
    with strataio.Session(tiers=tiers_factory(), catalog=catalog) as s:
        sf = s.superfile("images", "r")
        assert sf.members() == sorted([f"iter{i:04d}" for i in range(n)] + ["note"])
        for i in range(n):
            got = sf.get(f"iter{i:04d}")
            assert got.dtype == np.uint8 and got.shape == (16, 24)
            assert np.array_equal(got, image(99 if i == 3 else i))
        assert sf.get("note") == b"rendered with the default transfer function"
        with pytest.raises(MemberNotFoundError, match="images.*nope"):
            sf.get("nope")
        with pytest.raises(SuperfileError, match="read-only"):
            sf.put("x", b"1")
        assert fsck(s.catalog, s.tiers).clean


def test_round_trip_posix(tmp_path):
    round_trip(lambda: one_tier(PosixBackend(tmp_path / "d")), tmp_path / "cat.db")


def test_round_trip_memory(tmp_path):
    mem = MemoryBackend()  # one namespace shared by both sessions
    round_trip(lambda: one_tier(mem), tmp_path / "cat.db")


def test_round_trip_shaped(tmp_path):
    inner = PosixBackend(tmp_path / "remote")
    round_trip(
        lambda: one_tier(Shaped(inner, "remote_disk_2002", time_scale=0.0)), tmp_path / "cat.db"
    )


def test_round_trip_s3(tmp_path, s3_backend):
    round_trip(lambda: one_tier(s3_backend), tmp_path / "cat.db")


def test_round_trip_postgres_catalog(tmp_path, pg_url):
    round_trip(lambda: one_tier(PosixBackend(tmp_path / "d")), pg_url)


def test_array_members_come_back_with_their_shape(tmp_path):
    """A 0-d array, an empty one and a strided view come back with the dtype and shape they
    were put with, from the open container and from a sealed one read anew."""
    values = {
        "scalar": np.array(3.5),
        "empty": np.zeros((0, 3), dtype="<i2"),
        "strided": np.arange(24, dtype=">f4").reshape(4, 6)[:, ::2],
    }

    def same(got, want):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want)

    with strataio.Session(tiers=disk_tape(tmp_path), catalog=tmp_path / "c.db") as s:
        sf = s.superfile("v")
        for name, value in values.items():
            sf.put(name, value)
            same(sf.get(name), value)
        sf.close()
    with strataio.Session(tiers=disk_tape(tmp_path), catalog=tmp_path / "c.db") as s:
        sf = s.superfile("v", "r")
        for name, value in values.items():
            same(sf.get(name), value)


def test_tiers_stage_and_migrate(tmp_path):
    """On the archive tier a read stages the container to disk; a migration moves it back."""
    cat = tmp_path / "cat.db"
    with strataio.Session(tiers=disk_tape(tmp_path), catalog=cat) as s:
        sf = s.superfile("vr", hint="REMOTETAPE", container_bytes=1500)
        for i in range(6):
            sf.put(f"i{i}", image(i))
        sf.flush()
        tiers_of = {c.tier for cs in sf._store.residency_table().values() for c in cs}
        assert tiers_of == {"tape"}
        sf.close()
    with strataio.Session(tiers=disk_tape(tmp_path), catalog=cat) as s:
        sf = s.superfile("vr")
        assert np.array_equal(sf.get("i5"), image(5))
        staged = {c.tier for cs in sf._store.residency_table().values() for c in cs}
        assert "disk" in staged
        sf.migrate("tape").wait()
        assert {c.tier for cs in sf._store.residency_table().values() for c in cs} == {"tape"}
        assert [np.array_equal(sf.get(f"i{i}"), image(i)) for i in range(6)] == [True] * 6
        sf.close()


def test_first_read_brings_container_then_serves_from_memory(tmp_path):
    inner = PosixBackend(tmp_path / "remote")
    make = lambda: one_tier(Shaped(inner, "remote_disk_2002", time_scale=0.0))  # noqa: E731
    with strataio.Session(tiers=make(), catalog=tmp_path / "c.db") as s:
        sf = s.superfile("imgs", container_bytes=1 << 20)
        for i in range(20):
            sf.put(f"{i}", image(i))
        sf.close()
    with strataio.Session(tiers=make(), catalog=tmp_path / "c.db") as s:
        remote = s.tiers["only"].backend
        sf = s.superfile("imgs", "r")
        remote.reset_stats()
        for i in range(20):
            assert np.array_equal(sf.get(f"{i}"), image(i))
        assert remote.stats().requests == 1  # one whole-container read for twenty members
        assert s.cache.nbytes <= s.cache.capacity


def test_memory_stays_within_cache(tmp_path):
    """Reading every member of many containers keeps at most the cache's capacity."""
    with strataio.Session(
        tiers=one_tier(PosixBackend(tmp_path / "d")), catalog=tmp_path / "c.db", cache_bytes=5000
    ) as s:
        sf = s.superfile("imgs", container_bytes=1000)
        for i in range(40):
            sf.put(f"{i}", image(i))
        sf.flush()
        for _ in range(2):
            for i in range(40):
                assert np.array_equal(sf.get(f"{i}"), image(i))
                assert s.cache.nbytes <= 5000
        assert len(sf.containers()) == 14  # three 384-byte images seal a container


def test_api_errors(tmp_path):
    with strataio.Session(tiers=disk_tape(tmp_path), catalog=tmp_path / "c.db") as s:
        with pytest.raises(NotFoundError, match="no superfile 'absent'"):
            s.superfile("absent", "r")
        with pytest.raises(SuperfileError, match="mode"):
            s.superfile("x", "w")
        with pytest.raises(StrataError):
            s.superfile("x", hint="NOWHERE")
        s.create_dataset("arr", (4,), "f4").close()
        with pytest.raises(SuperfileError, match="'arr' is an array dataset"):
            s.superfile("arr")
        s.superfile("v").close()
        with pytest.raises(SuperfileError, match=r"'v' is a superfile, not an array dataset"):
            s.open_dataset("v")
        s.delete_dataset("v")  # (the refused open left it in use by no one)
        with pytest.raises(SuperfileError, match="container_bytes must be a positive integer"):
            s.superfile("x", container_bytes="10")
        with pytest.raises(StrataError, match="reserved"):
            s.superfile("x/zarr.json")  # (would be the metadata object of a dataset 'x')
        sf = s.superfile("x")
        with pytest.raises(SuperfileError, match="bytes or a numpy array"):
            sf.put("a", 3.5)
        with pytest.raises(SuperfileError, match="non-empty"):
            sf.put("", b"")
        rec = np.zeros(3, [("a", "<i4"), ("b", "<f8")])
        with pytest.raises(SuperfileError, match=r"dtype \[\('a', '<i4'\).*without its fields"):
            sf.put("rec", rec)  # (it read back as |V12, fields gone)
        assert sf.members() == []
        sf.close()
        with pytest.raises(SuperfileError, match="closed"):
            sf.get("a")


def test_parallel_session_refused(tmp_path):
    class Comm:  # what Session needs of a one-rank communicator
        def Get_rank(self):
            return 0

        def Get_size(self):
            return 1

        def bcast(self, v, root=0):
            return v

        def allreduce(self, v, op=None):
            return v

    s = strataio.Session(tiers=disk_tape(tmp_path), catalog=tmp_path / "c.db", comm=Comm())
    with pytest.raises(SuperfileError, match="one process"):
        s.superfile("x")
    s.close()


# ------------------------------------------------------------------ corrupt containers
def sealed(members) -> bytes:
    b = ContainerBuilder()
    for name, data in members:
        b.add(name, data, None, None)
    return b.seal()[0]


def test_format_errors_name_container_and_member():
    blob = bytearray(sealed([("a", b"x" * 100), ("b", b"y" * 50)]))
    assert [m.name for m in read_index(blob, "C").members] == ["a", "b"]
    assert check_container(blob, "C") == []
    bad_magic = bytes(blob[:-32]) + b"NOTSUPER" + bytes(blob[-24:])
    with pytest.raises(SuperfileIndexError, match="container C: no superfile footer"):
        read_index(bad_magic, "C")
    bad_index = bytearray(blob)
    bad_index[155] ^= 0xFF  # inside the JSON index
    with pytest.raises(SuperfileIndexError, match="index fails its checksum"):
        read_index(bad_index, "C")
    assert check_container(bad_index, "C")[0].kind == "index"
    bad_member = bytearray(blob)
    bad_member[120] ^= 0xFF  # inside member b
    (p,) = check_container(bad_member, "C")
    assert (p.kind, p.member) == ("checksum", "b")
    with pytest.raises(SuperfileIndexError, match="too short"):
        read_index(b"abc", "C")


def corrupt_recorded(s, name, key, mutate):
    """Replace container ``key`` by ``mutate(bytes)`` and make the catalog record the new
    bytes: a container written wrong, which only its own index can reveal."""
    (copy,) = s.catalog.residency(name)
    tier = s.tiers[copy.tier]
    data = mutate(bytearray(tier.backend.get(object_key(name, key))))
    tier.backend.put(object_key(name, key), bytes(data), durable=True)
    s.catalog.commit([ChunkCopy(name, key, copy.tier, len(data), checksum(data), "valid")])


def test_corrupt_member_and_index_raise_and_fsck_reports(tmp_path):
    def tiers():
        return one_tier(PosixBackend(tmp_path / "d"), "localdisk")

    cat = tmp_path / "c.db"
    with strataio.Session(tiers=tiers(), catalog=cat) as s:
        sf = s.superfile("imgs")
        for i in range(3):
            sf.put(f"m{i}", image(i))
        sf.close()
        key = sf.containers()[0]

        def flip_member(b):
            b[500] ^= 0xFF  # inside m1 (each image is 384 bytes)
            return b

        corrupt_recorded(s, "imgs", key, flip_member)
    with strataio.Session(tiers=tiers(), catalog=cat) as s:
        sf = s.superfile("imgs", "r")
        assert np.array_equal(sf.get("m0"), image(0))
        with pytest.raises(SuperfileIndexError, match=r"sf/00000000.*imgs.*member 'm1'"):
            sf.get("m1")
        report = fsck(s.catalog, s.tiers)
        (f,) = report.problems
        assert f.kind is Kind.BAD_MEMBER and "'m1'" in f.detail and f.key == key
        sf.close()

        def break_index(b):
            b[-40] ^= 0xFF  # the end of the JSON index
            return b

        corrupt_recorded(s, "imgs", key, break_index)
    with strataio.Session(tiers=tiers(), catalog=cat) as s:
        sf = s.superfile("imgs", "r")
        with pytest.raises(SuperfileIndexError, match=r"sf/00000000.*imgs.*index"):
            sf.get("m0")
        (f,) = fsck(s.catalog, s.tiers).problems
        assert f.kind is Kind.BAD_INDEX and f.dataset == "imgs"
        assert not fsck(s.catalog, s.tiers, repair=True).repaired  # reported, never "fixed"


def test_fsck_adopts_whole_unrecorded_container_deletes_broken_one(tmp_path):
    def tiers():
        return one_tier(PosixBackend(tmp_path / "d"), "localdisk")

    cat = tmp_path / "c.db"
    with strataio.Session(tiers=tiers(), catalog=cat) as s:
        s.superfile("imgs").close()
    be = PosixBackend(tmp_path / "d")
    be.put("imgs/sf/00000000", sealed([("a", b"A" * 10)]), durable=True)  # sealed, not committed
    be.put("imgs/sf/00000001", sealed([("b", b"B" * 10)])[:-5], durable=True)  # not whole
    with strataio.Session(tiers=tiers(), catalog=cat) as s:
        report = fsck(s.catalog, s.tiers, repair=True)
        kinds = {(f.key, f.kind, f.action) for f in report.findings}
        assert kinds == {
            ("sf/00000000", Kind.UNRECORDED, Action.ADOPT),
            ("sf/00000001", Kind.BAD_INDEX, Action.DELETE),
        }
        assert fsck(s.catalog, s.tiers).clean
        sf = s.superfile("imgs", "r")
        assert sf.get("a") == b"A" * 10
        with pytest.raises(MemberNotFoundError):
            sf.get("b")


# ------------------------------------------------------------------ crash
@pytest.mark.parametrize("seed", [1, 2])
def test_kill_mid_write_members_whole_or_missing(tmp_path, seed):
    rng = np.random.default_rng(seed)
    with strataio.Session(tiers=disk_tape(tmp_path), catalog=tmp_path / "cat.db") as s:
        s.superfile("vr", hint="LOCALDISK", container_bytes=superfile_worker.CONTAINER).close()
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    durable: list[int] = []
    deadline = time.monotonic() + 0.3 + float(rng.random()) * 1.5
    while time.monotonic() < deadline:
        line = proc.stdout.readline().strip()
        if not line:
            break
        durable.append(int(line))  # every member up to this one was flushed
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert durable, "the worker flushed nothing before it was killed"
    with strataio.Session(tiers=disk_tape(tmp_path), catalog=tmp_path / "cat.db") as s:
        fsck(s.catalog, s.tiers, repair=True)
        assert fsck(s.catalog, s.tiers).clean
        sf = s.superfile("vr", "r")
        names = set(sf.members())
        for i in range(durable[-1] + 1):
            assert f"img{i:05d}" in names, f"flushed member {i} lost"
        for name in names:
            assert np.array_equal(sf.get(name), superfile_worker.member(int(name[3:])))


def test_a_superfile_made_again_elsewhere_is_not_read_from_the_prefetch_cache(tmp_path):
    """A long-lived session reads a superfile (its container held in the session's prefetch
    cache); another process deletes it and makes it again under its name, reusing the
    container keys. The first session's next read gets the new bytes: it served the old
    container from its cache, unchecked."""

    def session() -> strataio.Session:
        return strataio.Session(tiers=disk_tape(tmp_path), catalog=tmp_path / "cat.db")

    def make(s: strataio.Session, value: bytes) -> None:
        with s.superfile("s", hint="LOCALDISK") as sf:
            sf.put("m", value)

    def read(s: strataio.Session) -> bytes:
        with s.superfile("s", mode="r") as sf:
            return sf.get("m")

    with session() as reader:
        with session() as w:
            make(w, b"old value")
        assert read(reader) == b"old value"
        with session() as other:
            other.delete_dataset("s")
            make(other, b"new value")
        assert read(reader) == b"new value"


def test_two_writers_appending_at_once_keep_each_others_members(tmp_path):
    """Two sessions (two writers of one catalog) have one superfile open to append; each
    seals containers after the other opened it. Every member either flushed is read back:
    the second writer's container took a number of its own, not the first one's again."""

    def session() -> strataio.Session:
        return strataio.Session(tiers=disk_tape(tmp_path), catalog=tmp_path / "cat.db")

    with session() as s1, session() as s2:
        a = s1.superfile("s", hint="LOCALDISK", container_bytes=100)
        a.put("a0", b"first")
        a.flush()
        b = s2.superfile("s")
        a.put("a1", b"second")
        a.flush()
        b.put("b1", b"third")
        b.flush()
        a.put("a2", b"fourth")
        a.close()
        b.close()
    with session() as s:
        sf = s.superfile("s", "r")
        assert sf.members() == ["a0", "a1", "a2", "b1"]
        assert [sf.get(m) for m in sf.members()] == [b"first", b"second", b"fourth", b"third"]
        assert len(sf.containers()) == 4
        assert fsck(s.catalog, s.tiers).clean


def test_two_processes_creating_one_superfile_at_once_both_append(tmp_path, monkeypatch):
    """Two writers open a superfile that neither finds in the catalog (mode "a"); the second
    one's create meets the first one's record. It opens that superfile and appends, rather
    than raising ``ExistsError``, and both writers' members are read back."""

    def session() -> strataio.Session:
        return strataio.Session(tiers=disk_tape(tmp_path), catalog=tmp_path / "cat.db")

    with session() as s1, session() as s2:
        a = s1.superfile("s", hint="LOCALDISK")
        looked = s2.catalog.get_dataset

        def before_the_other_created(name: str):
            monkeypatch.setattr(s2.catalog, "get_dataset", looked)
            raise NotFoundError(f"no dataset {name!r}")  # as looked before s1 created it

        monkeypatch.setattr(s2.catalog, "get_dataset", before_the_other_created)
        b = s2.superfile("s", hint="LOCALDISK")
        a.put("a", b"from s1")
        b.put("b", b"from s2")
        a.close()
        b.close()
    with session() as s:
        sf = s.superfile("s", "r")
        assert [sf.get(m) for m in sf.members()] == [b"from s1", b"from s2"]
        assert fsck(s.catalog, s.tiers).clean


def test_a_superfile_whose_close_fails_leaves_the_sessions_others_closed(tmp_path):
    """Session.close meets a superfile whose container no tier can hold: it raises that
    error, and still seals the other superfile and commits the array dataset written, both
    of which read back in the next session."""

    def tiers() -> TierSet:
        return TierSet([Tier("d", PosixBackend(tmp_path / "d"), "localdisk", capacity=3000)])

    s = strataio.Session(tiers=tiers(), catalog=tmp_path / "c.db")
    big = s.superfile("big")
    small = s.superfile("small")
    arr = s.create_dataset("arr", (10,), "f4")
    arr[:] = np.arange(10, dtype="f4")
    small.put("m", b"kept" * 25)
    big.put("m", b"B" * 5000)  # (a container over the tier's capacity)
    with pytest.raises(StrataError, match="'big'.*holds 3000 bytes"):
        s.close()
    assert small.closed and arr.store.closed
    with strataio.Session(tiers=tiers(), catalog=tmp_path / "c.db") as s:
        with s.superfile("small", "r") as sf:
            assert sf.get("m") == b"kept" * 25
        with s.open_dataset("arr") as ds:
            assert np.array_equal(ds[:], np.arange(10, dtype="f4"))
        assert fsck(s.catalog, s.tiers).clean


def test_a_put_whose_container_no_tier_takes_is_not_put(tmp_path):
    """A put that fills a container the full tier refuses raises, and that member is not
    put: the open container keeps only the members before it, and does not grow with every
    later put refused alike. Once the tier has room, the next flush seals those members."""

    def tiers() -> TierSet:
        return TierSet([Tier("d", PosixBackend(tmp_path / "d"), "localdisk", capacity=3000)])

    with strataio.Session(tiers=tiers(), catalog=tmp_path / "c.db") as s:
        sf = s.superfile("sf", container_bytes=1000)
        for i in range(3):  # m0 and m1 seal a container of about 1900 bytes; m2 waits
            sf.put(f"m{i}", bytes([i]) * 900)
        for i in (3, 4):
            with pytest.raises(ChunksNotStoredError, match="tier 'd' full"):
                sf.put(f"m{i}", bytes([i]) * 900)
            assert f"m{i}" not in sf
        with pytest.raises(ChunksNotStoredError):
            sf.put("m2", b"new" * 300)  # (a name put again: its earlier value stays)
        assert sf.members() == ["m0", "m1", "m2"] and sf.get("m2") == bytes([2]) * 900
        s.tiers["d"].capacity = 4000  # room for m2 alone, not for the puts refused
        sf.flush()
        sf.close()
    with strataio.Session(tiers=tiers(), catalog=tmp_path / "c.db") as s:
        with s.superfile("sf", "r") as sf:
            assert sf.members() == ["m0", "m1", "m2"]
            assert [sf.get(f"m{i}") for i in range(3)] == [bytes([i]) * 900 for i in range(3)]
        assert fsck(s.catalog, s.tiers).clean


def test_a_strided_memoryview_is_put_as_its_bytes(tmp_path):
    """A memoryview of every other byte is bytes-like like any: it is put as the bytes it
    shows (``bytes(view)``), where it raised a bare TypeError from the cast."""
    view = memoryview(bytes(range(20)))[::2]
    with strataio.Session(tiers=disk_tape(tmp_path), catalog=tmp_path / "c.db") as s:
        with s.superfile("v", hint="LOCALDISK") as sf:
            sf.put("strided", view)
            assert sf.get("strided") == bytes(view)
        with s.superfile("v", "r") as sf:
            assert sf.get("strided") == bytes(range(0, 20, 2))
