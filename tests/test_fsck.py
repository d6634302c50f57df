"""fsck: finds and repairs bad copies, orphans and leftovers; kill -9 in the middle of moves and
writes never loses data."""

from __future__ import annotations

import errno
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import strataio
from strataio.catalog import ChunkCopy
from strataio.errors import ChecksumError
from strataio.storage.posix import PosixBackend
from strataio.tiers.fsck import (
    Action,
    CopyCheck,
    Inventory,
    Kind,
    Leftover,
    MetaCheck,
    UnnamedObject,
    Verdict,
    apply,
    fsck,
    inspect,
    plan,
)
from strataio.tiers.meta import MetaCopies
from strataio.tiers.tier import Tier, TierSet, checksum

sys.path.insert(0, str(Path(__file__).parent))
import tiers_worker  # noqa: E402

WORKER = Path(__file__).parent / "tiers_worker.py"


def open_session(root, catalog=None, **kw):
    """A session on the tiers under ``root`` and ``catalog`` (default: ``root/cat.db``)."""
    catalog = root / "cat.db" if catalog is None else catalog
    return strataio.Session(tiers=tiers_worker.tiers(root), catalog=catalog, **kw)


def make(root, *, hint="LOCALDISK", half_on_tape=True, catalog=None):
    with open_session(root, catalog) as s:
        ds = s.create_dataset("a", tiers_worker.SHAPE, "f4", tiers_worker.CHUNKS, hint=hint)
        ds[...] = tiers_worker.version(0)
        ds.flush()
        if half_on_tape:
            ds.migrate(np.s_[0:40, :], to="tape").wait()
        ds.close()


def check_chunks(root, allowed, catalog=None):
    """Every chunk reads back as one whole version among ``allowed``; returns versions seen."""
    seen = set()
    with open_session(root, catalog, stage_on_read=False) as s:
        ds = s.open_dataset("a")
        got = ds[...]
        for i in range(0, 80, 10):
            for j in range(0, 80, 10):
                block = got[i : i + 10, j : j + 10]
                ok = [
                    k
                    for k in allowed
                    if np.array_equal(block, tiers_worker.version(k)[i : i + 10, j : j + 10])
                ]
                assert ok, f"chunk ({i}, {j}) is torn or lost"
                seen.add(ok[0])
        ds.close()
    return seen


def _zarr_json_left_on_disk(root):
    """Dataset ``a`` whose zarr.json on tier ``disk`` is from before an attribute change
    (the tier did not answer then); returns the current one's bytes."""
    make(root, half_on_tape=False)
    disk = root / "disk"
    with open_session(root) as s:
        disk.rename(root / "disk.away")
        disk.write_bytes(b"")  # (a file in its place: the tier does not answer)
        ds = s.open_dataset("a", "r+")
        ds.attrs["units"] = "K"
        ds.close()
    disk.unlink()
    (root / "disk.away").rename(disk)
    return (root / "tape" / "a" / "zarr.json").read_bytes()


def test_fsck_rewrites_a_zarr_json_left_from_before_an_attribute_change(tmp_path):
    """A tier that did not answer while attributes were set keeps the zarr.json from
    before: fsck reports it (stale-meta) and --repair rewrites it with the current one."""
    current = _zarr_json_left_on_disk(tmp_path)
    disk = tmp_path / "disk"
    with open_session(tmp_path) as s:
        report = fsck(s.catalog, s.tiers)
        assert [(f.kind, f.tier, f.dataset, f.key, f.action) for f in report.problems] == [
            (Kind.STALE_META, "disk", "a", "zarr.json", Action.REWRITE)
        ]
        assert (disk / "a" / "zarr.json").read_bytes() != current
        assert fsck(s.catalog, s.tiers, repair=True).repaired
        assert (disk / "a" / "zarr.json").read_bytes() == current
        assert fsck(s.catalog, s.tiers).clean


def test_a_stale_zarr_json_is_reported_where_the_current_one_is_on_a_tier_not_checked(tmp_path):
    """The tier holding the current zarr.json does not answer, and the one that does holds
    the older one: fsck said "0 problems" (opens refused it, rightly). It reports that copy
    (stale-meta, no repair while the current one cannot be read), and rewrites it once the
    tier holding the current one answers again."""
    current = _zarr_json_left_on_disk(tmp_path)
    tape = tmp_path / "tape"
    with open_session(tmp_path) as s:
        tape.rename(tmp_path / "tape.away")
        tape.write_bytes(b"")  # (a file in its place: the tier does not answer)
        report = fsck(s.catalog, s.tiers, repair=True)
        assert [(f.kind, f.tier, f.key, f.action) for f in report.problems] == [
            (Kind.STALE_META, "disk", "zarr.json", Action.NONE)
        ]
        assert "not checked: tape" in report.problems[0].detail
        tape.unlink()
        (tmp_path / "tape.away").rename(tape)
        s.tiers["tape"].check()
        assert fsck(s.catalog, s.tiers, repair=True).repaired
        assert (tmp_path / "disk" / "a" / "zarr.json").read_bytes() == current
        assert fsck(s.catalog, s.tiers).clean


class _ChangedMeanwhile:
    """Catalog ``catalog``, running ``change`` once, just after the first dataset record is
    read through it (and returning the record as read before it)."""

    def __init__(self, catalog, change):
        self.catalog, self.change = catalog, change

    def __getattr__(self, name):
        return getattr(self.catalog, name)

    def get_dataset(self, name):
        got = self.catalog.get_dataset(name)
        change, self.change = self.change, None
        if change is not None:
            change()
        return got


def _another_change(root, catalog, name):
    """A change of dataset ``name``'s attributes to ``{"units": "C"}`` by another process,
    to whom only tier ``disk`` answers; returns its zarr.json."""
    meta = json.loads((root / "tape" / name / "zarr.json").read_text())
    newer = json.dumps({**meta, "attributes": {"units": "C"}}).encode()
    elsewhere = tiers_worker.tiers(root)
    elsewhere["tape"].mark_down("does not answer")
    return newer, functools.partial(
        MetaCopies(name, lambda: list(elsewhere), lambda: catalog).put, newer
    )


def test_a_zarr_json_rewrite_leaves_a_change_made_since_it_looked(tmp_path):
    """fsck --repair rewrote a zarr.json it found stale once the record still named the
    version it had read, whatever the copy held by then: a whole attribute change made
    between that look and the rewrite, its zarr.json put on that tier alone, was lost. The
    rewrite is made only over the copy inspected, and such a change is left in flight."""
    _zarr_json_left_on_disk(tmp_path)
    with open_session(tmp_path) as s:
        newer, change = _another_change(tmp_path, s.catalog, "a")
        report = fsck(_ChangedMeanwhile(s.catalog, change), s.tiers, repair=True)
        assert [(f.kind, f.tier, f.action) for f in report.findings] == [
            (Kind.IN_FLIGHT, "disk", Action.LEAVE)
        ]
        assert (tmp_path / "disk" / "a" / "zarr.json").read_bytes() == newer
    with open_session(tmp_path) as s:
        assert dict(s.open_dataset("a").attrs) == {"units": "C"}


def test_a_repair_a_tier_refuses_is_reported_and_the_repair_goes_on(tmp_path):
    """A tier that refuses fsck --repair's rewrite of a zarr.json (its device full, say) or
    deletion of an orphan (an I/O error) made the repair raise, and what it had not done yet
    (deleting leftovers, forgetting writers that are gone) was left undone: each such
    finding now says what failed, and the rest is done."""
    current = _zarr_json_left_on_disk(tmp_path)
    stale = (tmp_path / "disk" / "a" / "zarr.json").read_bytes()
    leftover = tmp_path / "disk" / "a" / "c" / "7" / "7.123.0.strataio-tmp"
    leftover.write_bytes(b"half")
    orphan = tmp_path / "tape" / "a" / "c" / "0" / "0"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "disk" / "a" / "c" / "0" / "0", orphan)
    with open_session(tmp_path) as s:

        def fail(code):
            def refuse(*args, **kw):
                raise OSError(code, os.strerror(code))

            return refuse

        for name in ("put", "put_if"):
            setattr(s.tiers["disk"].backend, name, fail(errno.ENOSPC))
        for name in ("delete", "delete_if"):
            setattr(s.tiers["tape"].backend, name, fail(errno.EIO))
        report = fsck(s.catalog, s.tiers, repair=True)
        got = {f.kind: f for f in report.problems}
        assert set(got) == {Kind.STALE_META, Kind.ORPHAN, Kind.LEFTOVER}
        meta, orphaned = got[Kind.STALE_META], got[Kind.ORPHAN]
        assert (meta.tier, meta.action) == ("disk", Action.NONE)
        assert "not rewritten" in meta.detail and "no space left" in meta.detail
        assert (orphaned.tier, orphaned.action) == ("tape", Action.NONE)
        assert "not deleted" in orphaned.detail
        assert {meta, orphaned} == set(report.unrepairable)
        assert got[Kind.LEFTOVER].action is Action.DELETE and not leftover.exists()
    assert (tmp_path / "disk" / "a" / "zarr.json").read_bytes() == stale != current
    assert orphan.exists()


def _refusing(backend, name, key, code):
    """Make ``backend``'s call ``name`` fail with OSError ``code`` for object ``key`` alone."""
    real = getattr(backend, name)

    def call(k, *args, **kw):
        if k == key:
            raise OSError(code, os.strerror(code), str(backend.path(k)))
        return real(k, *args, **kw)

    setattr(backend, name, call)


def test_a_repair_one_object_refuses_leaves_its_tier_up(tmp_path):
    """fsck --repair's deletion or rewrite of one object failing (permission denied on it,
    an I/O error) while its tier answers is that object's: reported in its finding, the
    tier left up, here and in the catalog, and the rest of that tier's repair made. It
    marked the tier down, for every process, and the rest there was not done."""
    _zarr_json_left_on_disk(tmp_path)
    stale = (tmp_path / "disk" / "a" / "zarr.json").read_bytes()
    orphans = [tmp_path / "tape" / "a" / "c" / "0" / k for k in ("0", "1", "2")]
    orphans[0].parent.mkdir(parents=True, exist_ok=True)
    for o in orphans:
        shutil.copy(tmp_path / "disk" / "a" / "c" / "0" / o.name, o)
    with open_session(tmp_path) as s:
        for name in ("delete", "delete_if"):
            _refusing(s.tiers["tape"].backend, name, "a/c/0/1", errno.EACCES)
        _refusing(s.tiers["disk"].backend, "put_if", "a/zarr.json", errno.EIO)
        report = fsck(s.catalog, s.tiers, repair=True)
        got = {(f.tier, f.key): f for f in report.problems}
        assert [(f.tier, f.key, f.action) for f in report.unrepairable] == [
            ("tape", "c/0/1", Action.NONE),
            ("disk", "zarr.json", Action.NONE),
        ]
        assert "not deleted" in got["tape", "c/0/1"].detail
        assert "Permission denied" in got["tape", "c/0/1"].detail
        assert "not rewritten" in got["disk", "zarr.json"].detail
        assert "tier down" not in got["tape", "c/0/1"].detail
        assert [f.action for k, f in got.items() if k[1] in ("c/0/0", "c/0/2")] == [
            Action.DELETE,
            Action.DELETE,
        ]
        assert [o.exists() for o in orphans] == [False, True, False]
        assert s.tiers["disk"].up and s.tiers["tape"].up
        assert {t.name: t.state for t in s.catalog.tiers()} == {"disk": "up", "tape": "up"}
    assert (tmp_path / "disk" / "a" / "zarr.json").read_bytes() == stale


def test_fsck_finds_and_repairs(tmp_path):
    make(tmp_path)
    with open_session(tmp_path) as s:
        ds = s.open_dataset("a", "r+")
        ds.stage(np.s_[0:20, :], to="disk").wait()  # chunks of rows 0-1 now on both tiers
        ds.close()
        assert fsck(s.catalog, s.tiers).clean
        d, t = tmp_path / "disk" / "a", tmp_path / "tape" / "a"
        (d / "c/0/0").write_bytes(b"\0" * 400)  # corrupt, with a good copy on tape
        (t / "c/0/1").unlink()  # missing, with a good copy on disk
        (t / "c/5/5").parent.mkdir(parents=True, exist_ok=True)
        (t / "c/5/5").write_bytes((d / "c/5/5").read_bytes())  # orphan: no row names it
        (d / "c/7/7.123.0.strataio-tmp").write_bytes(b"half")  # leftover of a put
        (t / "c/3/3").unlink()  # rows 0-3 were migrated: its only copy -> lost
        (d / "c/6/6").write_bytes(b"\1" * 400)  # its only copy, corrupt: reported, not adopted
        report = fsck(s.catalog, s.tiers)
        kinds = sorted((f.kind, f.tier, f.key) for f in report.findings)
        assert ("checksum", "disk", "c/0/0") in kinds
        assert ("missing", "tape", "c/0/1") in kinds
        assert ("orphan", "tape", "c/5/5") in kinds
        assert any(k == "leftover" for k, _, _ in kinds)
        assert sorted((f.kind, f.key) for f in report.lost) == [
            ("corrupt", "c/6/6"),
            ("lost", "c/3/3"),
        ]
        assert not report.clean
        fsck(s.catalog, s.tiers, repair=True)
        assert not (d / "c/0/0").exists() and not (t / "c/5/5").exists()
        assert not (d / "c/7/7.123.0.strataio-tmp").exists()
        again = fsck(s.catalog, s.tiers)
        # only the unrecoverable remains, and the corrupt bytes were left for inspection
        assert sorted(f.kind for f in again.findings) == ["corrupt", "lost"]
        assert (d / "c/6/6").read_bytes() == b"\1" * 400


def test_files_under_a_dataset_that_are_no_chunk_of_it_are_never_adopted(tmp_path):
    """Files of someone else's under a catalogued dataset's folder (notes beside zarr.json, a
    key outside the chunk grid, a file inside a directory in a chunk's way) were reported
    unrecorded and adopted as chunk copies by --repair: the dataset counted more chunks than
    its grid holds, and once the directory in the way was moved and the chunk put back,
    fsck reported the real chunk file in the way of the adopted "c/0/0/x" for good. Only
    keys of the dataset's chunk grid are judged; the rest are not fsck's."""
    make(tmp_path, half_on_tape=False)
    d = tmp_path / "disk" / "a"
    with open_session(tmp_path) as s:
        rows = sorted((c.key, c.tier) for c in s.catalog.all_residency())
        (d / "README.txt").write_text("notes")
        (d / "c" / "99").mkdir()
        (d / "c" / "99" / "99").write_bytes(b"x")
        (d / "c" / "0" / "0").rename(tmp_path / "c00")
        (d / "c" / "0" / "0").mkdir()
        (d / "c" / "0" / "0" / "x").write_bytes(b"")
        report = fsck(s.catalog, s.tiers, repair=True)
        assert [(f.kind, f.key) for f in report.findings] == [("blocked", "c/0/0")]
        assert sorted((c.key, c.tier) for c in s.catalog.all_residency()) == rows
        (d / "c" / "0" / "0" / "x").unlink()
        (d / "c" / "0" / "0").rmdir()
        (tmp_path / "c00").rename(d / "c" / "0" / "0")
        assert fsck(s.catalog, s.tiers, repair=True).clean


@pytest.mark.parametrize("verify", [True, False])
def test_a_copy_something_stands_in_the_way_of_is_reported_and_kept(tmp_path, verify):
    """A directory where a copy's object goes, or a file where its folder goes, crashed fsck
    (IsADirectoryError, NotADirectoryError). Each such copy is reported (blocked, naming the
    path) and the others checked; a repair keeps its row, deletes nothing in the way, adopts
    no file in the way as a chunk, and drops a missing copy beside it as before. Once what is
    in the way is moved, the copies are whole again."""
    make(tmp_path)
    with open_session(tmp_path) as s:
        ds = s.open_dataset("a", "r+")
        ds.stage(np.s_[0:20, :], to="disk").wait()  # chunks of rows 0-1 now on both tiers
        ds.close()
        rows = sorted((c.key, c.tier) for c in s.catalog.all_residency())
        d, t = tmp_path / "disk" / "a" / "c", tmp_path / "tape" / "a" / "c"
        (d / "0" / "0").rename(tmp_path / "c00")
        (d / "0" / "0").mkdir()  # a directory where an object goes (a good copy on tape)
        (d / "7").rename(tmp_path / "c7")
        (d / "7").write_bytes(b"")  # a file where a folder goes (the only copies)
        (t / "0" / "1").unlink()  # missing, with a good copy on disk
        report = fsck(s.catalog, s.tiers, verify=verify)
        found = sorted((f.kind, f.tier, f.key, f.action) for f in report.findings)
        assert found == [("blocked", "disk", "c/0/0", "")] + [
            ("blocked", "disk", f"c/7/{j}", "") for j in range(8)
        ] + [("missing", "tape", "c/0/1", "drop copy")]
        details = {f.key: f.detail for f in report.findings}
        assert f"Is a directory: {d / '0' / '0'}" in details["c/0/0"]
        assert f"Not a directory: {d / '7' / '3'}" in details["c/7/3"]
        assert len(report.unrepairable) == 9
        repaired = fsck(s.catalog, s.tiers, repair=True, verify=verify)
        assert sorted((f.kind, f.key) for f in repaired.findings) == [
            (k, key) for k, _, key, _ in found
        ]
        assert (d / "0" / "0").is_dir() and (d / "7").read_bytes() == b""
        assert sorted((c.key, c.tier) for c in s.catalog.all_residency()) == [
            r for r in rows if r != ("c/0/1", "tape")
        ]
        (d / "0" / "0").rmdir()
        (tmp_path / "c00").rename(d / "0" / "0")
        (d / "7").unlink()
        (tmp_path / "c7").rename(d / "7")
        assert fsck(s.catalog, s.tiers, repair=True, verify=verify).clean
    assert check_chunks(tmp_path, [0]) == {0}


@pytest.mark.parametrize("how", ["gone", "a file", "read-only, gone"])
def test_a_tier_whose_directory_is_unusable_is_not_checked_and_keeps_its_rows(tmp_path, how):
    """A POSIX tier whose directory went (or has a file in its place) while it was up listed
    as empty: fsck judged every copy there missing, and a repair dropped the rows of those
    with another copy; a probe put its object, making the directory again, empty; a
    read-only one answered its probe as empty. It does not answer now: fsck names it, with
    why, and checks the others; no row goes, no directory is made, and a read of a chunk
    only it holds marks it down. Once the directory is back, all is as before."""
    make(tmp_path)  # chunks of rows 0-3 on tape, the others on disk
    with open_session(tmp_path) as s:
        ds = s.open_dataset("a", "r+")
        ds.stage(np.s_[0:20, :], to="disk").wait()  # chunks of rows 0-1 now on both tiers
        ds.close()
        rows = sorted((c.key, c.tier) for c in s.catalog.all_residency())
    read_only = how.startswith("read-only")
    tape_root = tmp_path / "tape"
    tiers = TierSet(
        [
            Tier("disk", PosixBackend(tmp_path / "disk"), "localdisk", order=0),
            Tier(
                "tape",
                PosixBackend(tape_root, create=not read_only),
                "remotetape",
                order=1,
                read_only=read_only,
            ),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        tape_root.rename(tmp_path / "tape.away")
        if how == "a file":
            tape_root.write_bytes(b"")
        ds = s.open_dataset("a")
        with pytest.raises(strataio.StrataError):
            ds[20:30, 0:10]  # only on tape
        ds.close()
        assert not s.tiers["tape"].up
        s.tiers["tape"].mark_up()  # (as another process's catalog may have it)
        for repair in (False, True):
            report = fsck(s.catalog, s.tiers, repair=repair)
            assert report.skipped_tiers == ["tape"] and not report.findings
            assert str(tape_root) in report.skipped_why["tape"]
            assert sorted((c.key, c.tier) for c in s.catalog.all_residency()) == rows
        assert not s.check_tiers()["tape"] and not s.tiers["tape"].up
        assert tape_root.is_file() if how == "a file" else not tape_root.exists()
        if how == "a file":
            tape_root.unlink()
        (tmp_path / "tape.away").rename(tape_root)
        assert fsck(s.catalog, s.tiers, repair=True).clean and s.tiers["tape"].up
        assert sorted((c.key, c.tier) for c in s.catalog.all_residency()) == rows
    assert check_chunks(tmp_path, [0]) == {0}


def _crash_loop(tmp_path, mode, iterations, seed):
    """Run ``iterations`` workers at once on copies of one dataset, SIGKILL each at a random
    moment, then fsck each copy and check its data against the oracle."""
    rng = random.Random(seed)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    template = tmp_path / "template"
    template.mkdir()
    make(template)
    roots, procs = [], []
    for it in range(iterations):
        root = tmp_path / f"{mode}{it}"
        shutil.copytree(template, root)
        roots.append(root)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), str(root), mode],
                stdout=subprocess.PIPE,
                stderr=open(root / "stderr.txt", "w"),  # noqa: SIM115 - the child owns it
                text=True,
                env=env,
            )
        )
    for p in procs:
        assert p.stdout.readline().strip() == "ready", (root / "stderr.txt").read_text()
    t0 = time.monotonic()
    for delay, p in sorted((rng.uniform(0.05, 0.8), p) for p in procs):
        time.sleep(max(0.0, t0 + delay - time.monotonic()))
        p.kill()  # SIGKILL: no cleanup, no flush
    for root, p in zip(roots, procs):
        out = p.stdout.read().split()  # through the text buffer readline() filled
        p.wait()
        done = int(out[-1]) if out else 0
        with open_session(root) as s:
            first = fsck(s.catalog, s.tiers, repair=True)
            assert not first.lost, first.lost
            second = fsck(s.catalog, s.tiers)
            assert second.clean, second.problems
            # every chunk has at least one valid copy
            keys = {c.key for c in s.catalog.residency("a")}
            assert len(keys) == 64
        allowed = [0] if mode == "migrate" else [done, done + 1]
        check_chunks(root, allowed)
        yield done, first


@pytest.mark.parametrize("seed", [11])
def test_kill9_during_migrate_loses_nothing(tmp_path, seed):
    repaired = [len(r.findings) for _, r in _crash_loop(tmp_path, "migrate", 8, seed)]
    assert any(repaired), "no kill landed mid-move: the test exercised nothing"


@pytest.mark.parametrize("seed", [12])
def test_kill9_during_writes_keeps_flushed_data(tmp_path, seed):
    steps = [d for d, _ in _crash_loop(tmp_path, "write", 8, seed)]
    assert max(steps) >= 1 and min(steps) < max(steps)  # kills landed at different steps


class PausingBackend(PosixBackend):
    """A POSIX tier that holds a migration between its verified copy and its commit: the
    read-back of a durable put signals ``reached`` and waits for ``release``."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.reached, self.release = threading.Event(), threading.Event()

    def get(self, key):
        data = super().get(key)
        if "/c/" in key and not self.release.is_set():
            self.reached.set()
            assert self.release.wait(30)
        return data


def test_repair_beside_a_running_migrate_leaves_its_destination_alone(tmp_path):
    make(tmp_path, half_on_tape=False)
    tape = PausingBackend(tmp_path / "tape")
    tiers = TierSet(
        [
            Tier("disk", PosixBackend(tmp_path / "disk"), "localdisk", order=0),
            Tier("tape", tape, "remotetape", order=1),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as job:
        ds = job.open_dataset("a", "r+")
        handle = ds.migrate(np.s_[0:10, 0:10], to="tape")  # one chunk: c/0/0
        assert tape.reached.wait(30)
        # another process repairs while the copy is on tape but not yet committed
        with open_session(tmp_path) as s:
            report = fsck(s.catalog, s.tiers, repair=True)
        young = [(f.kind, f.tier, f.key, f.action) for f in report.findings]
        assert young == [("in-flight", "tape", "c/0/0", "left alone")]
        assert report.clean
        tape.release.set()
        handle.wait()
        ds.close()
    assert (tmp_path / "tape" / "a" / "c" / "0" / "0").is_file()
    assert not (tmp_path / "disk" / "a" / "c" / "0" / "0").exists()  # the source went
    assert check_chunks(tmp_path, [0]) == {0}


def test_orphans_and_leftovers_wait_only_for_a_live_writer(tmp_path):
    """Unnamed objects and temporary files of a dataset a live session has open are left to
    it, and for the short while its mark lingers after the close (``MARK_LINGER_S``); once
    no live session has the dataset marked they are removed at once (no clock)."""
    make(tmp_path, half_on_tape=False)
    d, t = tmp_path / "disk" / "a", tmp_path / "tape" / "a"
    (t / "c/5").mkdir(parents=True)
    orphan = t / "c/5/5"
    orphan.write_bytes((d / "c/5/5").read_bytes())
    leftover = d / "c/7/7.123.0.strataio-tmp"
    leftover.write_bytes(b"half")
    with open_session(tmp_path) as job:
        job.catalog.MARK_LINGER_S = 0.3
        ds = job.open_dataset("a", "r+")  # a live session has "a" open
        for step in ("open", "closed, its mark lingering"):
            with open_session(tmp_path) as s:
                report = fsck(s.catalog, s.tiers, repair=True)
                assert sorted((f.kind, f.action) for f in report.findings) == [
                    ("in-flight", "left alone"),
                    ("in-flight", "left alone"),
                ], step
                assert report.clean and not report.repaired
                assert orphan.exists() and leftover.exists()
            if step == "open":
                ds.close()
        deadline = time.monotonic() + 10
        while job.catalog.lingering_marks() and time.monotonic() < deadline:
            time.sleep(0.05)  # (the linger's timer drops the mark)
        assert [w.datasets for w in job.catalog.writers() if w.id == job.writer] == [()]
        with open_session(tmp_path) as s:
            report = fsck(s.catalog, s.tiers, repair=True)
            assert sorted((f.kind, f.action) for f in report.findings) == [
                ("leftover", "delete"),
                ("orphan", "delete"),
            ]
            assert not orphan.exists() and not leftover.exists()
            assert fsck(s.catalog, s.tiers).clean


_ANNOUNCER = """
import dataclasses, sys, time
from strataio.catalog import open_catalog
cat = open_catalog(sys.argv[1])
w = cat.register_writer()
(row,) = [c for c in cat.residency("a") if c.key == "c/1/1"]
# a rewrite in place announced, about to put the new bytes
cat.commit([row._replace(checksum="0badc0de", state="in-transit",
                                old_checksum=row.checksum, writer=w)])
print("announced", flush=True)
time.sleep(120)
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "cat.db")
    return request.getfixturevalue("pg_url")


def test_an_announced_rewrite_waits_only_for_a_live_writer(tmp_path, catalog_url):
    """(PostgreSQL: the writer's liveness is its connection's advisory lock, which the server
    drops once the killed process's connection ends.)"""
    make(tmp_path, half_on_tape=False, catalog=catalog_url)
    child = subprocess.Popen(
        [sys.executable, "-c", _ANNOUNCER, catalog_url],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "announced"
        with open_session(tmp_path, catalog_url) as s:
            report = fsck(s.catalog, s.tiers, repair=True)
            assert [(f.kind, f.key, f.action) for f in report.findings] == [
                ("in-flight", "c/1/1", "left alone")
            ]
            assert not report.repaired
            # a reader accepts the copy: its bytes are the announced old version
            assert check_chunks(tmp_path, [0], catalog_url) == {0}
    finally:
        child.kill()
        child.wait()
    # the writer died: resolved at once; the object holds the old bytes, so the row is restored
    with open_session(tmp_path, catalog_url) as s:
        report = fsck(s.catalog, s.tiers, repair=True)
        assert [(f.kind, f.key, f.action) for f in report.findings] == [
            ("state", "c/1/1", "adopt object")
        ]
        assert report.writers_gone == 1
        assert fsck(s.catalog, s.tiers).clean
        assert all(w.alive for w in s.catalog.writers())  # the dead one was forgotten
    assert check_chunks(tmp_path, [0], catalog_url) == {0}


def _check(tier, verdict, state="valid", writer="", n=8):
    copy = ChunkCopy("a", "c/0/0", tier, 8, "new", state, 0.0, "old" if state else "", writer)
    digest = {"new": "new", "old": "old", "good": "new", "checksum": "zz"}.get(verdict, "")
    return CopyCheck(copy, Verdict(verdict), n if verdict != "missing" else -1, digest)


@pytest.mark.parametrize(
    "checks, live, expected",
    [
        # an announced rewrite of a live writer: left alone, whatever its bytes
        ([_check("disk", "checksum", "in-transit", "w1")], {"w1"}, [("in-flight", "left alone")]),
        # its writer is gone: old bytes restore the row, new bytes are adopted
        ([_check("disk", "old", "in-transit", "w1")], set(), [("state", "adopt object")]),
        ([_check("disk", "new", "in-transit", "w1")], set(), [("state", "adopt object")]),
        # new bytes beside a good copy of the old version: the unflushed rewrite is dropped
        (
            [_check("disk", "new", "in-transit", "w1"), _check("tape", "good")],
            set(),
            [("state", "drop copy")],
        ),
        # old bytes beside a good copy of another value: an earlier write never flushed
        (
            [_check("disk", "old", "in-transit", "w1"), _check("tape", "good")],
            set(),
            [("state", "drop copy")],
        ),
        # ... and beside a good copy of the same value: the row is restored
        (
            [
                _check("disk", "old", "in-transit", "w1"),
                CopyCheck(ChunkCopy("a", "c/0/0", "tape", 8, "old"), Verdict.GOOD, 8, "old"),
            ],
            set(),
            [("state", "adopt object")],
        ),
        # bytes matching neither version, and nothing else: corrupt, reported only
        ([_check("disk", "checksum", "in-transit", "w1")], set(), [("corrupt", "")]),
        ([_check("disk", "missing"), _check("tape", "good")], set(), [("missing", "drop copy")]),
        ([_check("disk", "missing"), _check("tape", "missing")], set(), [("lost", "")]),
        # something in a copy's way: reported, its row kept; it may hold the chunk, as a
        # copy on a tier not checked may
        ([_check("disk", "blocked")], set(), [("blocked", "")]),
        (
            [_check("disk", "blocked"), _check("tape", "missing")],
            set(),
            [("blocked", ""), ("missing", "drop copy")],
        ),
        ([_check("disk", "good")], set(), []),
    ],
)
def test_plan_decides_from_the_inventory_alone(checks, live, expected):
    inv = Inventory(copies=[c.copy for c in checks], checks=checks, live_writers=live)
    p = plan(inv)
    assert [(f.kind, f.action) for f in p.findings] == expected
    assert all(isinstance(f.kind, Kind) and isinstance(f.action, Action) for f in p.findings)
    adopted = [u for u in p.upserts if u.state == "valid"]
    if ("state", "adopt object") in expected:
        (row,) = adopted
        assert row.checksum == checks[0].digest and row.writer == ""
    if live:
        assert not p.changes


def test_plan_unnamed_objects_and_leftovers():
    inv = Inventory(
        copies=[ChunkCopy("a", "c/0/0", "tape", 8, "x")],
        unnamed=[
            UnnamedObject("disk", "a", "c/0/0"),  # a copy of a catalogued chunk
            UnnamedObject("disk", "a", "c/9/9", 8, "y"),  # a chunk the catalog never saw
            UnnamedObject("disk", "b", "c/0/0"),  # of a dataset a live writer has open
        ],
        leftovers=[Leftover("disk", "/x/a/c/1.t", "a"), Leftover("disk", "/x/b/c/1.t", "b")],
        in_use={"b"},
        dead_writers=["gone"],
    )
    p = plan(inv)
    assert [(f.kind, f.dataset, f.action) for f in p.findings] == [
        ("orphan", "a", "delete"),
        ("unrecorded", "a", "adopt object"),
        ("in-flight", "b", "left alone"),
        ("leftover", "a", "delete"),
        ("in-flight", "b", "left alone"),
    ]
    assert p.objects == [("disk", "a/c/0/0")] and [f.path for f in p.files] == ["/x/a/c/1.t"]
    assert p.upserts == [ChunkCopy("a", "c/9/9", "disk", 8, "y")]
    assert p.forget_writers == ["gone"]


def test_plan_deletes_and_writes_nothing_on_a_read_only_tier():
    """On a read-only tier an orphan, a leftover and a stale zarr.json are reported and left,
    and a bad copy dropped loses its row only (a repair's delete or put there was refused,
    and the repair failed)."""
    bad = _check("disk", "checksum")
    inv = Inventory(
        copies=[bad.copy, _check("tape", "good").copy],
        checks=[bad, _check("tape", "good")],
        unnamed=[UnnamedObject("disk", "a", "c/0/0")],
        leftovers=[Leftover("disk", "/x/a/c/1.t", "a")],
        metas=[MetaCheck("a", ("new",), (("disk", "old"), ("tape", "new")), b"{}")],
        read_only={"disk"},
    )
    p = plan(inv)
    assert [(f.kind, f.tier, f.action) for f in p.findings] == [
        ("checksum", "disk", "drop copy"),
        ("orphan", "disk", ""),
        ("stale-meta", "disk", ""),
        ("leftover", "disk", ""),
    ]
    assert all("read-only" in f.detail for f in p.findings)
    assert p.deletes == [("a", "c/0/0", "disk")]
    assert not (p.objects or p.files or p.metas)


def test_apply_skips_datasets_opened_since_the_inspection(tmp_path):
    make(tmp_path, half_on_tape=False)
    d, t = tmp_path / "disk" / "a", tmp_path / "tape" / "a"
    (t / "c/5").mkdir(parents=True)
    orphan = t / "c/5/5"
    orphan.write_bytes((d / "c/5/5").read_bytes())
    with open_session(tmp_path) as s:
        p = plan(inspect(s.catalog, s.tiers))
        assert [(f.kind, f.key) for f in p.findings] == [("orphan", "c/5/5")]
        with open_session(tmp_path) as job:
            ds = job.open_dataset("a", "r+")  # it may be writing that very object now
            apply(p, s.catalog, s.tiers)
            assert orphan.exists()
            ds.close()
        apply(plan(inspect(s.catalog, s.tiers)), s.catalog, s.tiers)
        assert not orphan.exists()


class PausingPut(PosixBackend):
    """A POSIX tier whose put of ``key`` signals ``reached`` and waits for ``release``."""

    def __init__(self, root, key) -> None:
        super().__init__(root)
        self.key = key
        self.reached, self.release = threading.Event(), threading.Event()

    def put(self, key, data, *, durable=False):
        if key == self.key and not self.release.is_set():
            self.reached.set()
            assert self.release.wait(30)
        return super().put(key, data, durable=durable)


def test_a_commit_during_a_rewrite_keeps_its_announcement(tmp_path):
    """A commit from another thread while a rewrite's put runs (a stage ending, a flush)
    must record the announcement, never the replaced row: a crash right after it would
    leave a valid row naming bytes that are gone."""
    make(tmp_path, half_on_tape=False)
    disk = PausingPut(tmp_path / "disk", "a/c/0/0")
    tiers = TierSet(
        [
            Tier("disk", disk, "localdisk", order=0),
            Tier("tape", PosixBackend(tmp_path / "tape"), "remotetape", order=1),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.open_dataset("a", "r+")
        ds[...]  # noqa: B018 - touches every chunk: their rows ride along with the next commit
        new = tiers_worker.version(1)[0:10, 0:10]
        writer = threading.Thread(target=ds.__setitem__, args=(np.s_[0:10, 0:10], new))
        writer.start()
        assert disk.reached.wait(30)
        ds.flush()  # commits while the put of c/0/0 is under way
        (row,) = [c for c in s.catalog.residency("a") if c.key == "c/0/0"]
        assert (row.state, row.writer) == ("in-transit", s.writer)
        assert row.old_checksum and row.old_checksum != row.checksum
        disk.release.set()
        writer.join()
        ds.close()
        (row,) = [c for c in s.catalog.residency("a") if c.key == "c/0/0"]
        assert row.state == "valid" and not row.old_checksum
        assert fsck(s.catalog, s.tiers).clean


def test_chunks_that_end_with_their_own_crc32c_get_checksums_telling_versions_apart(tmp_path):
    """A plain CRC-32C of bytes ending with their own CRC-32C (codec ``crc32c`` last) is one
    constant for every chunk. The catalog's checksums start from a seeded register instead:
    two values of a chunk differ, and a copy holding another chunk's (self-consistent) bytes
    is found by fsck and never read as the chunk."""
    with open_session(tmp_path) as s:
        ds = s.create_dataset("x", (8, 16), "f8", (8, 8), hint="LOCALDISK", codec="zstd+crc32c")
        ds[:, 0:8] = 1.0
        ds[:, 8:16] = 2.0
        ds.flush()
        first = {k: cs[0].checksum for k, cs in ds.residency().items()}
        assert first["c/0/0"] != first["c/0/1"]
        ds[:, 0:8] = 3.0
        ds.flush()
        assert ds.residency()["c/0/0"][0].checksum not in (first["c/0/0"], first["c/0/1"])
        ds.migrate(None, to="tape").wait()
        ds.close()
    tape = tmp_path / "tape" / "x" / "c" / "0"
    shutil.copy(tape / "0", tape / "1")  # c/0/1's object now holds c/0/0's bytes
    with open_session(tmp_path) as s:
        report = fsck(s.catalog, s.tiers, verify=True)
        assert {p.key for p in report.problems} == {"c/0/1"}
        assert {p.kind for p in report.problems} <= {Kind.CHECKSUM, Kind.CORRUPT}
        with pytest.raises(ChecksumError, match="c/0/1"):
            s.open_dataset("x")[:, 8:16]


def test_a_catalog_of_plain_crc32c_checksums_still_reads_moves_and_checks(tmp_path):
    """A catalog written when the checksum of a chunk ending with its own CRC-32C was the
    plain CRC-32C (one constant, schema 4) is upgraded in place: those rows are marked as
    plain CRC-32C and still verify their copies; moves keep that kind for copies of the same
    bytes; a rewrite records the chunk's own CRC; other rows are left as they were."""
    import sqlite3

    a = np.arange(16 * 16, dtype="f4").reshape(16, 16)
    with open_session(tmp_path) as s:
        ds = s.create_dataset("x", a.shape, a.dtype, (8, 8), hint="LOCALDISK", codec="crc32c")
        ds[...] = a
        plain = s.create_dataset("y", a.shape, a.dtype, (8, 8), hint="LOCALDISK", codec=[])
        plain[...] = a
        ds.close()
        plain.close()
        kept = {c.key: c.checksum for c in s.catalog.residency("y")}
    db = sqlite3.connect(tmp_path / "cat.db")  # as the earlier code recorded them
    with db:
        db.execute("UPDATE residency SET checksum = '48674bc7' WHERE dataset = 'x'")
        db.execute("UPDATE schema_version SET version = 4")
        db.execute("DROP TABLE verified")  # (a version-4 catalog has none)
        db.execute("ALTER TABLE datasets DROP COLUMN generation")  # (nor this, of version 7)
        db.execute("DROP TABLE remnants")  # (nor this, of version 9)
        db.execute("DROP TABLE overtaken")  # (nor this, of version 10)
        db.execute("ALTER TABLE tiers DROP COLUMN why")  # (nor this)
        db.execute("ALTER TABLE perf DROP COLUMN settings")  # (nor this)
    db.close()
    with open_session(tmp_path) as s:
        assert {c.key: c.checksum for c in s.catalog.residency("y")} == kept
        ds = s.open_dataset("x", "r+")
        assert {c.checksum for cs in ds.residency().values() for c in cs} == {"crc32c:48674bc7"}
        np.testing.assert_array_equal(ds[...], a)
        ds.migrate(np.s_[0:8, :], to="tape").wait()
        moved = ds.residency()["c/0/0"]
        assert [(c.tier, c.checksum) for c in moved] == [("tape", "crc32c:48674bc7")]
        ds[8:16, 0:8] = -1
        ds.close()
        assert fsck(s.catalog, s.tiers, verify=True).clean
        ds = s.open_dataset("x")
        assert ds.residency()["c/1/0"][0].checksum != "crc32c:48674bc7"
        want = a.copy()
        want[8:16, 0:8] = -1
        np.testing.assert_array_equal(ds[...], want)


def _raw_16x16(s):
    """Dataset "x" of ``s``: 16² float32 in four raw 8² chunks, written and flushed."""
    a = np.arange(16 * 16, dtype="f4").reshape(16, 16)
    ds = s.create_dataset("x", a.shape, a.dtype, (8, 8), hint="LOCALDISK", codec=[])
    ds[...] = a
    ds.flush()
    return a, ds


def test_copies_of_one_chunk_holding_different_values_are_reported_and_left(tmp_path):
    """Two settled copies of one chunk with different checksums (each intact) break the rule
    that a chunk has one value: fsck reports it and repairs nothing there."""
    with open_session(tmp_path) as s:
        a, ds = _raw_16x16(s)
        ds.stage(np.s_[0:8, 0:8], to="disk").wait()
        ds.migrate(np.s_[0:8, 0:8], to="tape").wait()
        ds.stage(np.s_[0:8, 0:8], to="disk").wait()  # c/0/0 on disk and tape
        ds.close()
        rows = s.catalog.residency("x", ["c/0/0"])
        assert sorted(c.tier for c in rows) == ["disk", "tape"]
        other = (a[0:8, 0:8] + 1).tobytes()  # an intact copy of another value, on tape
        s.tiers["tape"].backend.put("x/c/0/0", other)
        tape = next(c for c in rows if c.tier == "tape")
        s.catalog.commit([tape._replace(checksum=checksum(other))], [])
        report = fsck(s.catalog, s.tiers, verify=True, repair=True)
        assert [(f.kind, f.key) for f in report.problems] == [(Kind.DIVERGED, "c/0/0")]
        assert report.unrepairable and not report.clean
        assert {c.checksum for c in s.catalog.residency("x", ["c/0/0"])} == {
            checksum(a[0:8, 0:8].tobytes()),
            checksum(other),
        }


def test_a_rewrite_announced_over_an_unflushed_write_gives_way_to_the_settled_copies(tmp_path):
    """A writer wrote a chunk without flushing, then announced its next rewrite of it, and
    died before the put. The object holds the first write's bytes, recorded as the old ones;
    the chunk's settled copies on other tiers hold the last flushed value. fsck keeps the
    flushed value, so the chunk's copies agree."""
    with open_session(tmp_path) as s:
        a, ds = _raw_16x16(s)
        ds.migrate(np.s_[0:8, 0:8], to="tape").wait()
        ds.close()
        (tape,) = s.catalog.residency("x", ["c/0/0"])
        unflushed, announced = (a[0:8, 0:8] + 1).tobytes(), (a[0:8, 0:8] + 2).tobytes()
        s.tiers["disk"].backend.put("x/c/0/0", unflushed)
        row = tape._replace(
            tier="disk",
            state="in-transit",
            checksum=checksum(announced),
            old_checksum=checksum(unflushed),
            writer="gone",
        )
        s.catalog.commit([row], [])
        report = fsck(s.catalog, s.tiers, repair=True)
        assert [(f.kind, f.tier, f.action) for f in report.findings] == [
            (Kind.STATE, "disk", Action.DROP_COPY)
        ]
        assert fsck(s.catalog, s.tiers, verify=True).clean
        assert [c.tier for c in s.catalog.residency("x", ["c/0/0"])] == ["tape"]
        assert not s.tiers["disk"].backend.exists("x/c/0/0")
        ds = s.open_dataset("x")
        np.testing.assert_array_equal(ds[...], a)
        ds.close()


def _chunk_values(root, key):
    """Chunk ``key`` (``c/i/j``) of dataset "a" as read back by a new session."""
    i, j = (int(x) * 10 for x in key.split("/")[1:])
    with open_session(root, stage_on_read=False) as s:
        ds = s.open_dataset("a")
        got = ds[i : i + 10, j : j + 10]
        ds.close()
    return got


def test_copies_rewritten_or_moved_while_fsck_checks_are_neither_bad_nor_deleted(tmp_path):
    """Another process rewrites a chunk (and flushes) and migrates another after fsck read
    the catalog's rows and before it read their objects, then closes. fsck checks the
    chunks that looked bad again against their rows as they are now: it reports nothing,
    and its repair deletes neither the rewritten copy nor the moved one (whose object no
    row it first read named)."""
    make(tmp_path, half_on_tape=False)
    with open_session(tmp_path) as s:
        read_rows = s.catalog.all_residency

        def rows_then_another_process_works():
            rows = read_rows()
            with open_session(tmp_path) as job:
                ds = job.open_dataset("a", "r+")
                ds[0:10, 0:10] = tiers_worker.version(1)[0:10, 0:10]  # c/0/0 rewritten
                ds.flush()
                ds.migrate(np.s_[10:20, 10:20], to="tape").wait()  # c/1/1 moved
                ds.close()
            return rows

        s.catalog.all_residency = rows_then_another_process_works
        report = fsck(s.catalog, s.tiers, repair=True)
        del s.catalog.all_residency
        assert [(f.kind, f.key, f.detail) for f in report.findings] == []
        assert report.clean
    np.testing.assert_array_equal(
        _chunk_values(tmp_path, "c/0/0"), tiers_worker.version(1)[0:10, 0:10]
    )
    np.testing.assert_array_equal(
        _chunk_values(tmp_path, "c/1/1"), tiers_worker.version(0)[10:20, 10:20]
    )
    assert (tmp_path / "tape" / "a" / "c" / "1" / "1").is_file()
    with open_session(tmp_path) as s:
        assert fsck(s.catalog, s.tiers).clean


def _plan_for_a_corrupt_disk_copy_of_c00(s, root):
    """Chunk c/0/0 staged to disk (a copy on tape too), the disk copy's bytes decayed:
    its path, and fsck's plan, which drops that copy."""
    ds = s.open_dataset("a", "r+")
    ds.stage(np.s_[0:10, 0:10], to="disk").wait()  # c/0/0 on disk and tape
    ds.close()
    disk = root / "disk" / "a" / "c" / "0" / "0"
    disk.write_bytes(b"\xff" * disk.stat().st_size)  # the disk copy decays
    p = plan(inspect(s.catalog, s.tiers))
    assert [(f.kind, f.tier, f.key, f.action) for f in p.findings] == [
        (Kind.CHECKSUM, "disk", "c/0/0", Action.DROP_COPY)
    ]
    return disk, p


def test_a_repair_leaves_a_copy_whose_row_changed_since_the_inspection(tmp_path):
    """fsck planned to drop a corrupt copy (the chunk has another, good one); before the
    repair, another process rewrote the chunk and flushed, so the row now names its new
    bytes (and the other copy went). The repair leaves that row and its object."""
    make(tmp_path)  # rows 0:40 on tape only
    with open_session(tmp_path) as s:
        disk, p = _plan_for_a_corrupt_disk_copy_of_c00(s, tmp_path)
        with open_session(tmp_path) as job:
            ds = job.open_dataset("a", "r+")
            ds[0:10, 0:10] = tiers_worker.version(1)[0:10, 0:10]
            ds.close()
        assert [c.tier for c in s.catalog.residency("a", ["c/0/0"])] == ["disk"]
        apply(p, s.catalog, s.tiers)
        assert [c.tier for c in s.catalog.residency("a", ["c/0/0"])] == ["disk"]
        assert disk.is_file()
    np.testing.assert_array_equal(
        _chunk_values(tmp_path, "c/0/0"), tiers_worker.version(1)[0:10, 0:10]
    )


def _apply_beside_a_writer_of_c00(p, s, root, monkeypatch):
    """Carry out repair ``p`` in session ``s``; right after its last look at the rows,
    another process rewrites chunk c/0/0 onto its home tier (disk) and commits. That
    chunk's row names disk afterwards."""
    fsck_module = sys.modules["strataio.tiers.fsck"]  # (the package names its function fsck)
    looked = fsck_module._rows_now

    def rows_then_a_writer(catalog, chunks):
        rows = looked(catalog, chunks)
        monkeypatch.setattr(fsck_module, "_rows_now", looked)
        with open_session(root) as job:
            ds = job.open_dataset("a", "r+")
            ds[0:10, 0:10] = tiers_worker.version(1)[0:10, 0:10]  # onto disk (its hint)
            ds.close()
        return rows

    monkeypatch.setattr(fsck_module, "_rows_now", rows_then_a_writer)
    apply(p, s.catalog, s.tiers)
    assert [c.tier for c in s.catalog.residency("a", ["c/0/0"])] == ["disk"]


def test_a_repair_that_drops_a_corrupt_copy_leaves_an_object_put_after_its_check(
    tmp_path, monkeypatch
):
    """fsck drops a corrupt copy (the chunk has another, good one) and then deletes its
    object; right after the repair's last look at the rows, another process rewrites the
    chunk onto that tier and commits. The object is deleted only at the version checked, so
    the new bytes stay (else the chunk's only current copy would be gone)."""
    make(tmp_path)  # rows 0:40 on tape only
    with open_session(tmp_path) as s:
        disk, p = _plan_for_a_corrupt_disk_copy_of_c00(s, tmp_path)
        _apply_beside_a_writer_of_c00(p, s, tmp_path, monkeypatch)
        assert disk.is_file()
    np.testing.assert_array_equal(
        _chunk_values(tmp_path, "c/0/0"), tiers_worker.version(1)[0:10, 0:10]
    )
    with open_session(tmp_path) as s:
        assert fsck(s.catalog, s.tiers).clean


def test_a_repair_deletes_no_object_put_after_its_inspection(tmp_path, monkeypatch):
    """fsck plans to delete an object no row names (a copy a killed stage left); right after
    the repair's last look at the rows, another process writes that chunk there and commits.
    The repair deletes objects only at the version it inspected: the new copy stays."""
    make(tmp_path, half_on_tape=False)
    with open_session(tmp_path) as s:
        ds = s.open_dataset("a", "r+")
        ds.migrate(np.s_[0:10, 0:10], to="tape").wait()  # c/0/0 on tape only
        ds.close()
        disk = tmp_path / "disk" / "a" / "c" / "0" / "0"
        disk.write_bytes((tmp_path / "tape" / "a" / "c" / "0" / "0").read_bytes())  # (the orphan)
        p = plan(inspect(s.catalog, s.tiers))
        assert [(f.kind, f.tier, f.key) for f in p.findings] == [(Kind.ORPHAN, "disk", "c/0/0")]
        _apply_beside_a_writer_of_c00(p, s, tmp_path, monkeypatch)
        assert disk.is_file()
    np.testing.assert_array_equal(
        _chunk_values(tmp_path, "c/0/0"), tiers_worker.version(1)[0:10, 0:10]
    )


def test_copies_that_look_bad_are_checked_again_in_parallel(tmp_path):
    """Every copy that looked bad is read again before its verdict stands; those reads run
    on fsck's workers at once, as the first ones do (a tier of many bad copies, S3 say,
    would otherwise be read twice over, the second time one copy after another)."""

    class Slow(PosixBackend):
        """Counts the most second reads of one object running at once (the re-checks)."""

        def __init__(self, root):
            super().__init__(root)
            self.now = self.most = 0
            self.seen = set()
            self.lock = threading.Lock()

        def get(self, key):
            with self.lock:
                again = key in self.seen
                self.seen.add(key)
                self.now += again
                self.most = max(self.most, self.now)
            try:
                time.sleep(0.05)
                return super().get(key)
            finally:
                with self.lock:
                    self.now -= again

    make(tmp_path, half_on_tape=False)  # every chunk on disk only
    for name in ("c/0/0", "c/0/1", "c/1/0", "c/1/1"):
        obj = tmp_path / "disk" / "a" / name
        obj.write_bytes(b"\xff" * obj.stat().st_size)
    disk = Slow(tmp_path / "disk")
    tiers = TierSet(
        [
            Tier("disk", disk, "localdisk", order=0),
            Tier("tape", PosixBackend(tmp_path / "tape"), "remotetape", order=1),
        ]
    )
    with open_session(tmp_path) as s:
        inv = inspect(s.catalog, tiers, workers=8)
    corrupt = sorted(f.key for f in plan(inv).findings if f.kind is Kind.CORRUPT)
    assert corrupt == ["c/0/0", "c/0/1", "c/1/0", "c/1/1"]
    assert disk.most >= 4


def test_a_dropped_copy_whose_object_appeared_after_its_version_was_asked_stays(tmp_path):
    """The version of a copy that looks bad is asked just before it is checked again; an
    object that was not there then (it appeared before the check read it: a put of another
    process) is not the one that was there when the row was judged, so a repair drops the
    row but leaves the object."""

    class AppearsLate(PosixBackend):
        def object_versions(self, keys):
            return [None for _ in keys]  # (as if asked just before the object was put)

    make(tmp_path)  # rows 0:40 on tape only
    with open_session(tmp_path) as s:
        ds = s.open_dataset("a", "r+")
        ds.stage(np.s_[0:10, 0:10], to="disk").wait()  # c/0/0 on disk and tape
        ds.close()
    disk = tmp_path / "disk" / "a" / "c" / "0" / "0"
    disk.write_bytes(b"\xff" * disk.stat().st_size)
    tiers = TierSet(
        [
            Tier("disk", AppearsLate(tmp_path / "disk"), "localdisk", order=0),
            Tier("tape", PosixBackend(tmp_path / "tape"), "remotetape", order=1),
        ]
    )
    with open_session(tmp_path) as s:
        p = plan(inspect(s.catalog, tiers))
        assert [(f.kind, f.tier, f.key, f.action) for f in p.findings] == [
            (Kind.CHECKSUM, "disk", "c/0/0", Action.DROP_COPY)
        ]
        assert p.objects == [] and p.deletes == [("a", "c/0/0", "disk")]


def test_a_repair_keeps_the_row_of_a_copy_put_back_where_one_was_missing(tmp_path):
    """fsck plans to drop the row of a copy whose object is missing (the chunk has another
    copy); before the repair, another process migrates the chunk off that tier (its row
    goes) and stages it back there, in a row just like the one judged (the same state and
    checksum). The repair looks at the object again in its transaction: the row stays
    (dropping it left the staged object there with no row naming it)."""
    make(tmp_path)  # rows 0:40 on tape only
    with open_session(tmp_path) as s:
        s.open_dataset("a", "r+").stage(np.s_[0:10, 0:10], to="disk").wait()
        disk = tmp_path / "disk" / "a" / "c" / "0" / "0"
        disk.unlink()
        p = plan(inspect(s.catalog, s.tiers))
        assert [(f.kind, f.tier, f.key) for f in p.findings] == [(Kind.MISSING, "disk", "c/0/0")]
        with open_session(tmp_path) as job:
            ds = job.open_dataset("a", "r+")
            ds.migrate(np.s_[0:10, 0:10], to="tape").wait()
            ds.stage(np.s_[0:10, 0:10], to="disk").wait()
            ds.close()
        assert disk.is_file()
        apply(p, s.catalog, s.tiers)
        assert sorted(c.tier for c in s.catalog.residency("a", ["c/0/0"])) == ["disk", "tape"]
        assert fsck(s.catalog, s.tiers).clean
