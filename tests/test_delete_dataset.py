"""Deleting a tiered dataset: every object under its name goes, those no catalog row names
included; a dataset a live process has open is not deleted; objects a tier that did not
answer kept keep the name from being created again until they are gone, so a new dataset
of that name never reads (nor fsck adopts) a value of the old one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import strataio
from outage import answer_again, stop_answering
from strataio.errors import DatasetInUseError, ExistsError
from strataio.tiers.fsck import Action, Kind, UnnamedObject, fsck, plan
from strataio.tiers.fsck import Inventory as FsckInventory

sys.path.insert(0, str(Path(__file__).parent))
import tiers_worker  # noqa: E402

SHAPE, CHUNKS = tiers_worker.SHAPE, tiers_worker.CHUNKS


def open_session(root):
    return strataio.Session(tiers=tiers_worker.tiers(root), catalog=root / "cat.db")


def objects(root, name="a"):
    """The objects under dataset ``name`` on each tier, as ``tier/key``."""
    out = []
    for tier in ("disk", "tape"):
        base = root / tier / name
        if base.is_dir():
            out += [f"{tier}/{p.relative_to(base)}" for p in base.rglob("*") if p.is_file()]
    return sorted(out)


def read(s, name="a"):
    ds = s.open_dataset(name)
    try:
        return ds[...]
    finally:
        ds.close()


_UNFLUSHED = """
import sys, time
from pathlib import Path
import numpy as np
import strataio
sys.path.insert(0, sys.argv[2])
import tiers_worker
root = Path(sys.argv[1])
with strataio.Session(tiers=tiers_worker.tiers(root), catalog=root / "cat.db") as s:
    ds = s.open_dataset("a", "r+")
    ds[...] = np.full(tiers_worker.SHAPE, 7, "f4")  # its objects put, no row recorded yet
    print("written", flush=True)
    time.sleep(120)
"""


def test_a_killed_writers_unflushed_chunks_go_with_its_dataset(tmp_path):
    """A writer killed (kill -9) before its first flush leaves objects no row names; the
    deletion of its dataset removes them too, and a dataset created again under that name
    reads its fill value, before and after fsck --repair (which finds nothing to adopt)."""
    with open_session(tmp_path) as s:
        s.create_dataset("a", SHAPE, "f4", CHUNKS, hint="LOCALDISK").close()
    child = subprocess.Popen(
        [sys.executable, "-c", _UNFLUSHED, str(tmp_path), str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "written"
    finally:
        child.kill()  # SIGKILL: no flush, no cleanup
        child.wait()
    assert sum("/c/" in f"/{o}" for o in objects(tmp_path)) == 64
    with open_session(tmp_path) as s:
        s.delete_dataset("a")
        assert objects(tmp_path) == [] and s.catalog.remnants() == []
        report = fsck(s.catalog, s.tiers, repair=True)
        assert report.findings == [] and report.writers_gone == 1
        s.create_dataset("a", SHAPE, "f4", CHUNKS, hint="LOCALDISK").close()
        np.testing.assert_array_equal(read(s), 0)
        report = fsck(s.catalog, s.tiers, repair=True)
        assert report.findings == [] and not report.repaired
        np.testing.assert_array_equal(read(s), 0)


_DELETER = """
import sys
from pathlib import Path
import strataio
from strataio.errors import DatasetInUseError
sys.path.insert(0, sys.argv[2])
import tiers_worker
root = Path(sys.argv[1])
with strataio.Session(tiers=tiers_worker.tiers(root), catalog=root / "cat.db") as s:
    s.catalog.MARK_LINGER_S = 0.0  # (lingering marks of others are waited for 1 s more)
    try:
        s.delete_dataset("a")
    except DatasetInUseError as exc:
        print("refused:", exc)
    else:
        print("deleted")
"""


def _delete_elsewhere(root: Path) -> str:
    got = subprocess.run(
        [sys.executable, "-c", _DELETER, str(root), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        check=True,
    )
    return got.stdout.strip()


def test_a_dataset_open_in_another_process_is_not_deleted(tmp_path):
    """Another process's deletion of a dataset open here is refused, naming this process's
    writer: writes here go on and close cleanly. Once closed here, the deletion waits out
    the mark the close leaves lingering, and succeeds."""
    a = tiers_worker.version(0)
    with open_session(tmp_path) as s:
        ds = s.create_dataset("a", SHAPE, "f4", CHUNKS, hint="LOCALDISK")
        ds[...] = a
        ds.close()
        ds = s.open_dataset("a", "r+")
        said = _delete_elsewhere(tmp_path)
        assert said.startswith("refused: dataset 'a' is in use by another process")
        assert s.writer in said
        ds[0:10, 0:10] = 1.0
        # (before the close: the timer it starts for its lingering mark is then a short one
        # too, not the default's, which a loaded machine's deleter could wait out in vain)
        s.catalog.MARK_LINGER_S = 0.3
        ds.close()
        a[0:10, 0:10] = 1.0
        np.testing.assert_array_equal(read(s), a)
        assert fsck(s.catalog, s.tiers).findings == []
        read(s)  # (its mark lingers 0.3 s after the close)
        assert _delete_elsewhere(tmp_path) == "deleted"
        assert s.list_datasets() == [] and objects(tmp_path) == []


def test_a_deletion_says_what_it_removed_and_leaves_no_empty_folder(tmp_path):
    """delete_dataset returns the chunk copies and bytes it removed per tier, and no
    remnant where every tier answered; the folders of the dataset go with its objects (they
    stayed, empty), and nothing above its name: a dataset beside it keeps its folders, and
    the tiers their roots. A dataset created again under the name is written as before."""
    with open_session(tmp_path) as s:
        for name in ("run/a", "run/b"):
            ds = s.create_dataset(name, SHAPE, "f4", CHUNKS, hint="LOCALDISK")
            ds[...] = tiers_worker.version(1)
            ds.migrate(np.s_[0:40, :], to="tape").wait()
            ds.close()
        held = [u for u in s.catalog.usage() if u.dataset == "run/a"]
        assert [(u.tier, u.copies) for u in held] == [("disk", 32), ("tape", 32)]
        s.catalog.end_lingering()
        done = s.delete_dataset("run/a")
        assert done.name == "run/a" and done.removed == tuple(held) and done.remnants == ()
        assert done.nbytes == sum(u.nbytes for u in held) > 0
        for tier in ("disk", "tape"):
            assert not (tmp_path / tier / "run" / "a").exists()
        assert len(objects(tmp_path, "run/b")) == 66  # (beside it: untouched)
        s.delete_dataset("run/b")
        for tier in ("disk", "tape"):  # ("run" is no dataset's: never removed)
            assert os.listdir(tmp_path / tier) == ["run"] and not os.listdir(
                tmp_path / tier / "run"
            )
        ds = s.create_dataset("run/a", SHAPE, "f4", CHUNKS, hint="LOCALDISK")
        ds[...] = 3.0
        ds.close()
        np.testing.assert_array_equal(read(s, "run/a"), 3.0)


@pytest.mark.parametrize("cleaner", ["fsck", "create"])
def test_a_tier_down_at_deletion_keeps_the_name_until_its_objects_are_gone(tmp_path, cleaner):
    """Objects on a tier that did not answer when their dataset was deleted stay recorded as
    its remnants: the name cannot be created again meanwhile. Once the tier answers, fsck
    --repair deletes them (orphans of a deleted dataset), or the next create_dataset of the
    name does; the new dataset reads its fill value."""
    with open_session(tmp_path) as s:
        ds = s.create_dataset("a", SHAPE, "f4", CHUNKS, hint="LOCALDISK")
        ds[...] = tiers_worker.version(1)
        ds.migrate(np.s_[0:40, :], to="tape").wait()
        ds.close()
    on_tape = [o for o in objects(tmp_path) if o.startswith("tape/")]
    assert "tape/zarr.json" in on_tape and len(on_tape) == 33
    with open_session(tmp_path) as s:
        stop_answering(tmp_path / "tape")
        s.tiers["tape"].mark_down("stopped answering")
        try:
            s.delete_dataset("a")
            assert s.catalog.remnants() == [("a", "tape")]
            with pytest.raises(ExistsError, match=r"'a' on tier 'tape'"):
                s.create_dataset("a", SHAPE, "f4", CHUNKS, hint="LOCALDISK")
        finally:
            answer_again(tmp_path / "tape")
    assert objects(tmp_path) == on_tape
    with open_session(tmp_path) as s:
        if cleaner == "fsck":
            report = fsck(s.catalog, s.tiers, repair=True)
            assert {(f.kind, f.tier, f.action) for f in report.findings} == {
                (Kind.ORPHAN, "tape", Action.DELETE)
            }
            assert sorted(f"tape/{f.key}" for f in report.findings) == on_tape
            assert report.repaired and s.catalog.remnants() == report.remnants == []
            assert not (tmp_path / "tape" / "a").exists()  # (its folders too)
        s.create_dataset("a", SHAPE, "f4", CHUNKS, hint="LOCALDISK").close()
        assert objects(tmp_path) == ["disk/zarr.json", "tape/zarr.json"]
        np.testing.assert_array_equal(read(s), 0)
        report = fsck(s.catalog, s.tiers, repair=True)
        assert report.findings == [] and not report.repaired
        np.testing.assert_array_equal(read(s), 0)


@pytest.mark.parametrize(("deleted", "created"), [("a", "a/b"), ("a/b/c", "a/b")])
def test_a_create_purges_the_remnants_of_names_above_and_below_it(tmp_path, deleted, created):
    """Remnants of a deleted dataset keep the names above and below it from being created
    too; once their tier answers, the create of such a name deletes them, as it does its
    own name's."""
    with open_session(tmp_path) as s:
        ds = s.create_dataset(deleted, SHAPE, "f4", CHUNKS, hint="LOCALDISK")
        ds[...] = 1.0
        ds.migrate(None, to="tape").wait()
        ds.close()
        stop_answering(tmp_path / "tape")
        s.tiers["tape"].mark_down("stopped answering")
        try:
            s.delete_dataset(deleted)
            with pytest.raises(ExistsError, match=rf"'{deleted}' on tier 'tape'"):
                s.create_dataset(created, SHAPE, "f4", CHUNKS, hint="LOCALDISK")
        finally:
            answer_again(tmp_path / "tape")
        assert len(objects(tmp_path, deleted)) == 65
    with open_session(tmp_path) as s:
        s.create_dataset(created, SHAPE, "f4", CHUNKS, hint="LOCALDISK").close()
        assert s.catalog.remnants() == []
        assert objects(tmp_path, "a") == [f"{t}/b/zarr.json" for t in ("disk", "tape")]
        np.testing.assert_array_equal(read(s, created), 0)


def test_fsck_plans_a_deleted_datasets_objects_and_remnants():
    """An object of a deleted dataset is an orphan, deleted; left alone while a live process
    has the name in use, and reported and left on a read-only tier; a remnant is cleared
    only on a tier checked, of a name not in use (and once nothing of it is left there)."""
    inv = FsckInventory(
        unnamed=[
            UnnamedObject("tape", "old", "c/0/0", deleted=True),
            UnnamedObject("tape", "busy", "c/0/0", deleted=True),
            UnnamedObject("ro", "old", "c/0/0", deleted=True),
        ],
        remnants={("old", "tape"), ("old", "far"), ("busy", "tape"), ("old", "ro")},
        listed={"tape", "ro"},
        in_use={"busy"},
        read_only={"ro"},
    )
    p = plan(inv)
    assert [(f.kind, f.dataset, f.action) for f in p.findings] == [
        (Kind.ORPHAN, "old", Action.DELETE),
        (Kind.IN_FLIGHT, "busy", Action.LEAVE),
        (Kind.ORPHAN, "old", Action.NONE),
    ]
    assert p.findings[-1].detail.endswith(
        "left: a read-only tier, where nothing is deleted or written"
    )
    assert p.objects == [("tape", "old/c/0/0")] and p.upserts == []
    assert p.remnants == [("old", "ro"), ("old", "tape")]


class _CreatedAgainMeanwhile:
    """A catalog on which, right after fsck reads the remnants and before it lists the
    tiers, another process (``create``) creates the deleted dataset again."""

    def __init__(self, catalog, create):
        self._catalog, self._create = catalog, create

    def __getattr__(self, name):
        return getattr(self._catalog, name)

    def remnants(self, name=None):
        got = self._catalog.remnants(name)
        create, self._create = self._create, None
        if create is not None:
            create()
        return got


def test_fsck_leaves_a_dataset_created_again_since_it_read_the_remnants(tmp_path):
    """A dataset created again under a deleted name (its create purging the remnants) after
    fsck read the remnants keeps what is under its name: fsck --repair deletes an object of
    a deleted dataset only while the name has remnants, holding a claim of it, and reports
    the others left. A killed writer's unflushed chunk of the new dataset is adopted by the
    next fsck."""
    with open_session(tmp_path) as s:
        ds = s.create_dataset("a", SHAPE, "f4", CHUNKS, hint="LOCALDISK", attrs={"old": 1})
        ds[...] = 1.0
        ds.close()
        stop_answering(tmp_path / "tape")
        s.tiers["tape"].mark_down("stopped answering")
        try:
            s.delete_dataset("a")
        finally:
            answer_again(tmp_path / "tape")
        assert s.catalog.remnants() == [("a", "tape")]

    def create_again():
        with open_session(tmp_path) as other:
            ds = other.create_dataset("a", SHAPE, "f4", CHUNKS, hint="LOCALDISK", attrs={"new": 2})
            ds[0:10, :] = 5.0
            ds.close()
        disk = tmp_path / "disk" / "a" / "c"
        (disk / "7").mkdir()
        (disk / "7" / "7").write_bytes((disk / "0" / "0").read_bytes())  # no row names it

    with open_session(tmp_path) as s:
        report = fsck(_CreatedAgainMeanwhile(s.catalog, create_again), s.tiers, repair=True)
        assert objects(tmp_path) == [
            "disk/c/0/0", "disk/c/0/1", "disk/c/0/2", "disk/c/0/3", "disk/c/0/4", "disk/c/0/5",
            "disk/c/0/6", "disk/c/0/7", "disk/c/7/7", "disk/zarr.json", "tape/zarr.json",
        ]  # fmt: skip
        assert report.findings and all(f.action is Action.LEAVE for f in report.findings)
        assert "no remnant left now" in report.findings[0].detail
        ds = s.open_dataset("a")
        assert dict(ds.attrs) == {"new": 2}
        ds.close()
        report = fsck(s.catalog, s.tiers, repair=True)
        assert [(f.kind, f.tier, f.key, f.action) for f in report.findings] == [
            (Kind.UNRECORDED, "disk", "c/7/7", Action.ADOPT)
        ]
        want = np.zeros(SHAPE, "f4")
        want[0:10, :] = want[70:80, 70:80] = 5.0
        np.testing.assert_array_equal(read(s), want)


def test_an_open_of_a_deleted_dataset_leaves_no_mark(tmp_path):
    """Opening a name no dataset has fails and leaves no in-use mark behind (it marks first,
    then reads the record: a deletion at the same moment is either refused or seen)."""
    with open_session(tmp_path) as s:
        s.create_dataset("a", SHAPE, "f4", CHUNKS, hint="LOCALDISK").close()
        s.catalog.end_lingering()
        s.delete_dataset("a")
        with pytest.raises(strataio.StrataError, match="no dataset 'a'"):
            s.open_dataset("a")
        assert [w.datasets for w in s.catalog.writers() if w.id == s.writer] == [()]
        ds = s.create_dataset("b", SHAPE, "f4", CHUNKS, hint="LOCALDISK")
        with pytest.raises(DatasetInUseError, match="'b' is open in this process"):
            s.delete_dataset("b")
        ds.close()
        s.delete_dataset("b")
        assert s.list_datasets() == [] and objects(tmp_path, "b") == []


def test_one_object_refusing_its_deletion_leaves_its_tier_up(tmp_path, monkeypatch):
    """An object of a deleted dataset whose deletion fails on its own (permission denied),
    where its tier answers, is that object's failure: the dataset's other objects go, the
    tier stays up (it was marked down, for every later call), and the name keeps a
    remnant there until the object goes."""
    with open_session(tmp_path) as s:
        ds = s.create_dataset("a", SHAPE, "f4", CHUNKS, hint="LOCALDISK")
        ds[...] = tiers_worker.version(1)
        ds.close()
        disk = s.tiers["disk"]
        delete = disk.backend.delete

        def refusing(key, *args, **kwargs):
            if key == "a/c/0/0":
                raise PermissionError(13, "Permission denied", key)
            return delete(key, *args, **kwargs)

        monkeypatch.setattr(disk.backend, "delete", refusing)
        s.delete_dataset("a")
        assert disk.up
        assert s.catalog.remnants() == [("a", "disk")]
        assert [o for o in objects(tmp_path) if o.startswith("disk/")] == ["disk/c/0/0"]
        monkeypatch.setattr(disk.backend, "delete", delete)
        s.create_dataset("a", SHAPE, "f4", CHUNKS, hint="LOCALDISK").close()
        np.testing.assert_array_equal(read(s), 0)


def test_a_remnant_on_a_tier_refusing_writes_is_cleared_once_nothing_is_left(tmp_path):
    """Purging a deleted dataset's remnant on a tier whose storage refuses writes clears it
    where nothing of the dataset is left there: the folders are only tidied where the tier
    takes changes, and a refused tidying kept the remnant, so the name could not be created
    again."""
    from strataio.catalog import open_catalog
    from strataio.storage.posix import PosixBackend
    from strataio.tiers.remnants import purge
    from strataio.tiers.tier import Tier, TierSet

    tiers = TierSet([Tier("disk", PosixBackend(tmp_path / "disk"), "localdisk", order=0)])
    (tmp_path / "disk" / "gone" / "c").mkdir(parents=True)  # (empty folders left behind)
    catalog = open_catalog(tmp_path / "cat.db")
    try:
        catalog.register_tiers(tiers.records())
        with catalog._write() as cur:  # (a deletion that left objects there, since gone)
            cur.execute("INSERT INTO remnants (dataset, tier) VALUES ('gone', 'disk')")
        tiers["disk"].mark_refused(OSError(30, "Read-only file system"))
        assert purge(catalog, tiers, "gone") == []
        assert catalog.remnants("gone") == []
        assert (tmp_path / "disk" / "gone" / "c").is_dir()  # (not tidied: refusing writes)
    finally:
        catalog.close()
