"""The catalog names a copy only once it is durable, whatever triggers the commit; DISABLE
datasets accept every write (partial ones included) and drop it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import strataio
from strataio.catalog.base import open_catalog
from strataio.storage.posix import PosixBackend
from strataio.tiers.placement import DatasetDisabledError
from strataio.tiers.tier import Tier, TierSet


class Ledger:
    """Objects put without fsync and not yet synced, per tier, and the commits that named one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.unsynced: dict[str, set[str]] = {}
        self.syncs = 0
        self.violations: list[str] = []
        self.commits = 0


class RecordingBackend(PosixBackend):
    """A real POSIX backend that remembers which puts have not been made durable yet."""

    def __init__(self, root, tier: str, ledger: Ledger) -> None:
        super().__init__(root)
        self.tier, self.ledger = tier, ledger

    def put(self, key, data, *, durable=False):
        super().put(key, data, durable=durable)
        with self.ledger.lock:
            pending = self.ledger.unsynced.setdefault(self.tier, set())
            (pending.discard if durable else pending.add)(key)

    def sync(self, keys=None):
        super().sync(keys)
        with self.ledger.lock:
            pending = self.ledger.unsynced.setdefault(self.tier, set())
            if keys is None:
                pending.clear()
            else:
                pending.difference_update(keys)
            self.ledger.syncs += 1


def recording_session(root, ledger: Ledger, *, fast_cap=None):
    tiers = TierSet(
        [
            Tier(n, RecordingBackend(root / n, n, ledger), r, capacity=cap, order=i)
            for i, (n, r, cap) in enumerate(
                [
                    ("local", "localdisk", fast_cap),
                    ("remote", "remotedisk", None),
                    ("tape", "remotetape", None),
                ]
            )
        ]
    )
    cat = open_catalog(root / "cat.db")
    commit = cat.commit

    def checked_commit(upserts=(), deletes=(), **kw):
        with ledger.lock:
            ledger.commits += 1
            for c in upserts:
                if c.state != "in-transit" and (
                    f"{c.dataset}/{c.key}" in ledger.unsynced.get(c.tier, ())
                ):
                    ledger.violations.append(f"{c.tier}:{c.dataset}/{c.key}")
        return commit(upserts, deletes, **kw)

    cat.commit = checked_commit
    return strataio.Session(tiers=tiers, catalog=cat), cat


A = np.arange(40 * 40, dtype="f4").reshape(40, 40)


@pytest.mark.parametrize("trigger", ["stage", "read"])
def test_stage_commit_syncs_unflushed_writes_first(tmp_path, trigger):
    ledger = Ledger()
    s, cat = recording_session(tmp_path, ledger)
    with s:
        ds = s.create_dataset("a", A.shape, A.dtype, (10, 10), hint="REMOTETAPE")
        ds[...] = A  # 16 puts on tape, not flushed
        assert len(ledger.unsynced["tape"]) == 16
        if trigger == "stage":
            ds.stage(np.s_[0:10, :], to="local").wait()
        else:
            np.testing.assert_array_equal(ds[0:10, 0:10], A[0:10, 0:10])  # stages from tape
        assert ledger.commits >= 1
        assert ledger.violations == []
        assert not ledger.unsynced["tape"]
        # the commit recorded the unflushed tape copies, now durable
        assert sum(c.tier == "tape" for c in cat.residency("a")) == 16
        ds.close()
    cat.close()


def test_eviction_commit_syncs_the_victims_dataset_first(tmp_path):
    ledger = Ledger()
    s, cat = recording_session(tmp_path, ledger, fast_cap=6 * 400)
    with s:
        a = s.create_dataset("a", (20, 20), "f4", (10, 10), hint="LOCALDISK")
        a[...] = 1.0  # 4 chunks on local, not flushed
        b = s.create_dataset("b", (20, 20), "f4", (10, 10), hint="LOCALDISK")
        b[...] = 2.0  # 4 more: 2 of "a" are written back and evicted; "a" is committed
        assert s.placement.evictions >= 2
        assert ledger.violations == []
        assert {c.tier for c in cat.residency("a")} == {"local", "remote"}
        b.close()
        a.close()
        a = s.open_dataset("a")
        np.testing.assert_array_equal(a[...], np.ones((20, 20), "f4"))
        a.close()
    assert ledger.violations == []
    cat.close()


def test_failed_sync_commits_nothing_on_a_move(tmp_path):
    ledger = Ledger()
    s, cat = recording_session(tmp_path, ledger)
    with s:
        ds = s.create_dataset("a", A.shape, A.dtype, (10, 10), hint="REMOTETAPE")
        ds[...] = A
        tape = s.tiers["tape"].backend

        def broken(keys=None):
            raise OSError("EIO on fsync")

        tape.sync = broken
        with pytest.raises(strataio.StrataError, match="not be durable.*flush again"):
            ds.stage(np.s_[0:10, :], to="local").wait()
        assert cat.residency("a") == []  # nothing named: the tape copies may not be durable
        del tape.sync
        s.tiers["tape"].state = "up"
        ds.flush()
        assert sum(c.tier == "tape" for c in cat.residency("a")) == 16
        ds.close()
    cat.close()


@pytest.mark.parametrize(
    "write",
    [
        lambda ds: ds.__setitem__((slice(0, 5), slice(0, 5)), 1.0),
        lambda ds: ds.__setitem__((slice(3, 17), 4), 2.0),
        lambda ds: ds.__setitem__(Ellipsis, 3.0),
        lambda ds: ds.write_section((5, 5), np.ones((10, 10))),
    ],
    ids=["partial", "strided-partial", "full", "write_section"],
)
def test_disable_accepts_and_drops_partial_and_full_writes(tmp_path, write):
    with strataio.Session(
        tiers=TierSet([Tier("local", PosixBackend(tmp_path / "l"), "localdisk")]),
        catalog=tmp_path / "c.db",
    ) as s:
        ds = s.create_dataset("scratch", (20, 20), "f8", (10, 10), hint="DISABLE")
        write(ds)  # accepted
        ds.flush()
        assert s.catalog.residency("scratch") == []
        with pytest.raises(DatasetDisabledError, match="DISABLE"):
            ds[0:2, 0:2]
        ds.close()
        assert s.catalog.get_dataset("scratch").state == "disabled"
        assert not (tmp_path / "l" / "scratch").exists()
        ds = s.open_dataset("scratch", "r+")
        write(ds)
        with pytest.raises(DatasetDisabledError):
            ds.read_section((0, 0), (1, 1))
        ds.close()


def test_announced_rewrites_reach_the_disk_before_their_objects(tmp_path):
    """A rewrite's announcement is committed without waiting for the disk; the flush that
    follows syncs the catalog's log before it syncs any rewritten object (so a power cut
    can never keep an object its announcement did not reach the disk for), and a flush with
    no announcement since syncs no log."""
    ledger = Ledger()
    s, cat = recording_session(tmp_path, ledger)
    events: list[str] = []
    sync_log = cat.sync_log
    cat.sync_log = lambda: (events.append("log"), sync_log())
    for tier in s.tiers:
        sync = tier.backend.sync
        tier.backend.sync = lambda keys=None, sync=sync, name=tier.name: (
            events.append(f"sync {name}"),
            sync(keys),
        )
    a = np.arange(400, dtype="f4").reshape(20, 20)
    with s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="LOCALDISK")
        ds[...] = a
        ds.flush()
        assert "log" not in events  # new chunks: nothing announced
        events.clear()
        ds[0:5, 0:5] = -1  # a rewrite in place: announced
        assert events == []
        ds.flush()
        assert events[:2] == ["log", "sync local"]
        events.clear()
        ds[15:20, 15:20] = -2
        ds[0:5, 0:5] = -3
        ds.flush()
        assert events.count("log") == 1 and events[0] == "log"
        events.clear()
        ds.flush()  # nothing written since
        assert "log" not in events
        ds.close()
        want = a.copy()
        want[0:5, 0:5], want[15:20, 15:20] = -3, -2
        np.testing.assert_array_equal(s.open_dataset("a")[...], want)
    assert ledger.violations == []
