"""Tiers, placement hints, capacity and eviction, and the Session over a real SQLite catalog."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import re
import shutil
import threading
import time
from collections import Counter

import numpy as np
import pytest

import strataio
from mpirun import run_mpi
from outage import answer_again, stop_answering
from racing import race
from strataio.catalog.base import ChunkCopy, open_catalog
from strataio.errors import (
    ArgumentError,
    BackendError,
    ChecksumError,
    ChunksNotStoredError,
    DatasetInUseError,
    ExistsError,
    HintError,
    MetadataError,
    NotFoundError,
    ObjectError,
    ReadOnlyError,
    StrataError,
    TierDownError,
    WritesRefusedError,
)
from strataio.storage.base import Backend
from strataio.storage.memory import MemoryBackend
from strataio.storage.posix import PosixBackend
from strataio.tiers import meta as meta_module
from strataio.tiers.fsck import fsck
from strataio.tiers.meta import CHANGE_ATTR, META_ATTR, MetaCopies, _announced
from strataio.tiers.placement import DatasetDisabledError, Placement
from strataio.tiers.residency import Residency
from strataio.tiers.tier import Tier, TierSet, checksum


def make_tiers(root, *, fast_cap=None, roles=("localdisk", "remotedisk", "remotetape")):
    names = {"localdisk": "local", "remotedisk": "remote", "remotetape": "tape"}
    return TierSet(
        [
            Tier(
                names[r],
                PosixBackend(root / names[r]),
                r,
                capacity=fast_cap if i == 0 else None,
                order=i,
            )
            for i, r in enumerate(roles)
        ]
    )


def session(root, **kw):
    return strataio.Session(tiers=make_tiers(root, **kw), catalog=root / "cat.db")


def where(ds):
    """{chunk key: [tiers holding it]}"""
    return {k: [c.tier for c in v] for k, v in ds.residency().items()}


def test_hints_map_to_tiers_by_role(tmp_path):
    a = np.random.default_rng(0).random((40, 30)).astype("f4")
    with session(tmp_path) as s:
        for hint, tier in (
            ("LOCALDISK", "local"),
            ("REMOTEDISK", "remote"),
            ("REMOTETAPE", "tape"),
            ("AUTO", "tape"),
        ):
            ds = s.create_dataset(hint.lower(), a.shape, a.dtype, (10, 10), hint=hint)
            ds[...] = a
            ds.close()
            ds = s.open_dataset(hint.lower())
            assert {t for ts in where(ds).values() for t in ts} == {tier}, hint
            assert len(where(ds)) == 12
            np.testing.assert_array_equal(ds[...], a)
            ds.close()
            assert (tmp_path / tier / hint.lower() / "c" / "0" / "0").is_file()
        with pytest.raises(StrataError, match="unknown placement hint"):
            s.create_dataset("bad", (4,), "i4", (2,), hint="CLOUD")
        with pytest.raises(ExistsError):
            s.create_dataset("auto", (4,), "i4", (2,))
    # the catalog, reopened by another client, holds the same residency
    cat = open_catalog(tmp_path / "cat.db")
    assert {c.tier for c in cat.residency("localdisk")} == {"local"}
    assert cat.get_dataset("remotetape").hint == "REMOTETAPE"
    cat.close()


def test_hint_for_missing_role_is_refused_before_anything_is_stored(tmp_path):
    with session(tmp_path, roles=("localdisk", "remotetape")) as s:
        with pytest.raises(StrataError, match="remotedisk"):
            s.create_dataset("x", (4,), "i4", (2,), hint="REMOTEDISK")
        with pytest.raises(NotFoundError):
            s.open_dataset("x")


def test_a_write_whose_hint_names_a_role_the_configuration_lost_is_refused(tmp_path):
    """A dataset created LOCALDISK, opened where no tier has that role: reads use its
    copies, a write is refused naming the dataset, the hint and the tiers, nothing stored."""
    a = np.arange(16, dtype="f4")
    with session(tmp_path) as s:
        ds = s.create_dataset("x", (16,), "f4", (4,), hint="REMOTEDISK")
        ds[...] = a
        ds.close()
    before = sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".db")
    tiers = TierSet(
        [
            Tier("remote", PosixBackend(tmp_path / "remote"), "localdisk", order=0),
            Tier("tape", PosixBackend(tmp_path / "tape"), "remotetape", order=1),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.open_dataset("x", "r+")
        np.testing.assert_array_equal(ds[...], a)
        with pytest.raises(HintError, match=r"dataset 'x'.*REMOTEDISK.*remotedisk.*remote=loc"):
            ds[0:4] = 5
        np.testing.assert_array_equal(ds[...], a)
        ds.close()
        assert where(s.open_dataset("x")) == {f"c/{i}": ["remote"] for i in range(4)}
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".db") == before


def test_a_write_no_tier_takes_says_why_each_tier_took_none(tmp_path):
    """LOCALDISK on a read-only local tier and a full tape: the error names each tier and
    why (it said "all tiers full or down" of a tier that was up and read-only)."""
    (tmp_path / "local").mkdir()
    tiers = TierSet(
        [
            Tier("local", PosixBackend(tmp_path / "local"), "localdisk", order=0, read_only=True),
            Tier("tape", PosixBackend(tmp_path / "tape"), "remotetape", order=1, capacity=40),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("x", (16,), "f4", (4,), hint="LOCALDISK")
        with pytest.raises(ChunksNotStoredError) as info:
            ds[...] = np.arange(16, dtype="f4")
        msg = str(info.value)
        assert "dataset 'x'" in msg and "hint LOCALDISK" in msg, msg
        assert "tier 'local' up (read-only); tier 'tape' full" in msg, msg
        ds.close()


def test_a_session_s_bad_arguments_are_argument_errors(tmp_path):
    """As :func:`strataio.open_dataset`'s: a ValueError the caller can catch as such."""
    with session(tmp_path) as s:
        s.create_dataset("x", (4,), "i4", (2,), hint="LOCALDISK").close()
        with pytest.raises(ArgumentError, match="mode must be one of"):
            s.open_dataset("x", "w")
        with pytest.raises(ValueError, match="reserved"):
            s.create_dataset("y/zarr.json", (4,), "i4", (2,), hint="LOCALDISK")


def test_disable_drops_writes_and_reads_raise(tmp_path):
    with session(tmp_path) as s:
        ds = s.create_dataset("scratch", (20, 20), "f8", (10, 10), hint="DISABLE")
        ds[...] = 1.0  # accepted
        ds.close()
        assert s.catalog.get_dataset("scratch").state == "disabled"
        assert s.catalog.residency("scratch") == []
        assert not any((tmp_path / t / "scratch").exists() for t in ("local", "remote", "tape"))
        ds = s.open_dataset("scratch")
        with pytest.raises(DatasetDisabledError, match="DISABLE"):
            ds[0:2, 0:2]
        with pytest.raises(DatasetDisabledError):
            ds.stage()
        ds.close()


def _stored_attrs(root, tier, name):
    """The attributes of ``name``'s zarr.json on tier directory ``tier``."""
    return json.loads((root / tier / name / "zarr.json").read_text())["attributes"]


def test_tiered_attrs_live_in_zarr_json_and_not_in_the_catalog_record(tmp_path):
    """A tiered dataset's user attributes are in its zarr.json only: the catalog record holds
    none (it would go stale at the first set), and a new Session reads the ones set last."""

    def record_attrs():
        kept = json.loads(s.catalog.get_dataset("x").attrs)
        assert set(kept) == {"strataio.array", META_ATTR}
        return kept["strataio.array"]["attributes"]

    with session(tmp_path) as s:
        ds = s.create_dataset("x", (8,), "i4", (4,), hint="LOCALDISK", attrs={"units": "K"})
        assert record_attrs() == {}
        ds.attrs["units"] = "C"
        ds.attrs["step"] = 3
        ds.close()
        assert record_attrs() == {}
    for tier in ("local", "remote", "tape"):
        assert _stored_attrs(tmp_path, tier, "x") == {"units": "C", "step": 3}, tier
    with session(tmp_path) as s:
        assert dict(s.open_dataset("x").attrs) == {"units": "C", "step": 3}


def test_tiered_attrs_set_through_several_handles_all_stay(tmp_path):
    """Each set applies to the attributes zarr.json holds then (as for a plain dataset):
    handles in one Session and in two keep each other's attributes; a dataset with a handle
    open is not deleted, and one deleted and created again under its name has a zarr.json of
    its own."""
    with session(tmp_path) as s, session(tmp_path) as other:
        ds = s.create_dataset("x", (8,), "i4", (4,), hint="LOCALDISK", attrs={"units": "K"})
        ds[...] = 7
        ds.close()
        one, two = s.open_dataset("x", "r+"), s.open_dataset("x", "r+")
        three = other.open_dataset("x", "r+")
        one.attrs["a"] = 1
        two.attrs["b"] = 2
        three.attrs["units"] = "C"
        del one.attrs["b"]
        two.attrs["c"] = 3
        for h in (one, two, three):
            h.close()
    with session(tmp_path) as s:
        ds = s.open_dataset("x", "r+")
        assert dict(ds.attrs) == {"units": "C", "a": 1, "c": 3}
        np.testing.assert_array_equal(ds[...], 7)
        with pytest.raises(DatasetInUseError, match="'x' is open in this process"):
            s.delete_dataset("x")
        ds.attrs["kept"] = True
        ds.close()
        s.delete_dataset("x")
        s.create_dataset("x", (3,), "f8", (3,), hint="LOCALDISK").close()
        assert _stored_attrs(tmp_path, "local", "x") == {}


def test_tiered_attrs_are_not_set_where_no_tier_that_answers_holds_zarr_json(tmp_path):
    """Opened while the only tier holding its zarr.json is down, a dataset's attributes
    cannot be set: a zarr.json written from the catalog record would stand beside the one
    that tier holds. Once the tier is up, the attributes are the ones it held."""
    with session(tmp_path) as s:
        ds = s.create_dataset("x", (8,), "i4", (4,), hint="LOCALDISK", attrs={"units": "K"})
        ds.attrs["step"] = 3
        ds.close()
        s.catalog.set_tier_state("tape", "down")
    for tier in ("local", "remote"):
        (tmp_path / tier / "x" / "zarr.json").unlink()
    with session(tmp_path) as s:
        assert not s.tiers["tape"].up
        stop_answering(tmp_path / "tape")  # (else the open's probe finds it answering)
        ds = s.open_dataset("x", "r+")
        with pytest.raises(MetadataError, match="no tier that answers holds its zarr.json"):
            ds.attrs["step"] = 4
        ds.close()
        assert not any((tmp_path / t / "x" / "zarr.json").exists() for t in ("local", "remote"))
        answer_again(tmp_path / "tape")
        s.catalog.set_tier_state("tape", "up")
    with session(tmp_path) as s:
        assert dict(s.open_dataset("x").attrs) == {"units": "K", "step": 3}


def test_an_open_that_reaches_no_zarr_json_keeps_the_fill_value_and_dimension_names(tmp_path):
    """With every tier holding its zarr.json down, a dataset opens as its catalog record
    keeps it: the fill value (what a read of an unwritten chunk returns) and dimension names
    of its creation, without user attributes. A record written before it kept them is
    refused rather than opened with a fill value of 0."""
    with session(tmp_path) as s:
        ds = s.create_dataset(
            "x", (4, 4), "f8", (2, 2), hint="LOCALDISK", fill_value=np.nan, dims=("y", "x")
        )
        ds.attrs["units"] = "K"
        ds.close()
        record = s.catalog.get_dataset("x")
    for tier in ("local", "remote", "tape"):
        (tmp_path / tier / "x" / "zarr.json").unlink()
    with session(tmp_path) as s:
        ds = s.open_dataset("x")
        assert np.isnan(ds.fill_value) and ds.dims == ("y", "x")
        assert np.isnan(ds[...]).all()
        assert dict(ds.attrs) == {}
        ds.close()
        s.catalog.update_dataset(dataclasses.replace(record, attrs="{}"))
        with pytest.raises(MetadataError, match="does not keep its fill value"):
            s.open_dataset("x")


def test_a_dataset_opened_while_the_tiers_holding_zarr_json_are_marked_down_probes_them(
    tmp_path, monkeypatch
):
    """A dataset opened while every tier holding its zarr.json is marked down, though they
    answer again, probes them (as a read of a chunk whose copies are on down tiers does)
    and reads its attributes and fill value there; they were taken as none (the catalog
    record's array, fill value 0, no attributes) until something else probed the tiers."""
    with session(tmp_path) as s:
        ds = s.create_dataset(
            "x", (8,), "f8", (4,), hint="LOCALDISK", attrs={"units": "K"}, fill_value=-1.0
        )
        ds[0:4] = 7.0
        ds.close()
        monkeypatch.setattr(Tier, "RECHECK_S", 0.0)
        for t in s.tiers:
            t.mark_down("did not answer a moment ago")
        ds = s.open_dataset("x", "r+")
        assert dict(ds.attrs) == {"units": "K"}
        np.testing.assert_array_equal(ds[...], [7.0] * 4 + [-1.0] * 4)
        ds.attrs["step"] = 3
        ds.close()
        assert s.tiers["local"].up
    assert _stored_attrs(tmp_path, "local", "x") == {"units": "K", "step": 3}


TWO_TIERS = ("localdisk", "remotedisk")


def _attrs_set_while_local_is_down(root):
    """Dataset ``x`` (chunks on ``remote``) created with ``units``; ``step`` set while tier
    ``local``, ordered first, does not answer; ``local`` then answers again (marked up)."""
    with session(root, roles=TWO_TIERS) as s:
        ds = s.create_dataset("x", (8,), "i4", (4,), hint="REMOTEDISK", attrs={"units": "K"})
        ds[...] = 7
        ds.close()
    with session(root, roles=TWO_TIERS) as s:
        stop_answering(root / "local")
        ds = s.open_dataset("x", "r+")
        ds.attrs["step"] = 3
        ds.close()
        assert not s.tiers["local"].up
    answer_again(root / "local")
    assert _stored_attrs(root, "local", "x") == {"units": "K"}
    assert _stored_attrs(root, "remote", "x") == {"units": "K", "step": 3}


def test_a_tier_that_missed_an_attribute_change_is_not_read_as_current(tmp_path):
    """A tier down while attributes were set keeps the zarr.json from before; up again and
    ordered first, it was read first: every open showed the older attributes, and the next
    set started from them and dropped the newer. The catalog names the current version: an
    open reads it where it is, rewrites the older copy, and a second set keeps the first's."""
    _attrs_set_while_local_is_down(tmp_path)
    with session(tmp_path, roles=TWO_TIERS) as s:
        assert s.check_tiers() == {"local": True, "remote": True}
        ds = s.open_dataset("x", "r+")
        assert dict(ds.attrs) == {"units": "K", "step": 3}
        assert _stored_attrs(tmp_path, "local", "x") == {"units": "K", "step": 3}
        ds.attrs["note"] = "b"
        ds.close()
    for tier in ("local", "remote"):
        assert _stored_attrs(tmp_path, tier, "x") == {"units": "K", "step": 3, "note": "b"}
    with session(tmp_path, roles=TWO_TIERS) as s:
        ds = s.open_dataset("x")
        assert dict(ds.attrs) == {"units": "K", "step": 3, "note": "b"}
        np.testing.assert_array_equal(ds[...], [7] * 8)
        ds.close()


def test_an_open_that_reaches_only_a_zarr_json_from_before_a_change_says_so(tmp_path):
    """Where the tiers that answer hold only a zarr.json older than the catalog names, and
    a tier that may hold the current one does not answer, an open raises, naming the
    dataset, rather than show the older attributes; once that tier answers, it opens."""
    _attrs_set_while_local_is_down(tmp_path)
    with session(tmp_path, roles=TWO_TIERS) as s:
        stop_answering(tmp_path / "remote")
        assert s.check_tiers() == {"local": True, "remote": False}
        with pytest.raises(MetadataError, match="dataset 'x': no tier that answers holds the"):
            s.open_dataset("x")
        assert _stored_attrs(tmp_path, "local", "x") == {"units": "K"}
    answer_again(tmp_path / "remote")
    with session(tmp_path, roles=TWO_TIERS) as s:
        s.check_tiers()
        assert dict(s.open_dataset("x").attrs) == {"units": "K", "step": 3}


def test_an_open_that_fails_leaves_the_dataset_in_use_by_no_one(tmp_path):
    """An open that raises once the dataset is marked in use (only a zarr.json from before
    an attribute change answers) takes the mark back: it stood for the session's life, and
    fsck in another process left the older zarr.json alone as a running change's."""
    _attrs_set_while_local_is_down(tmp_path)
    with session(tmp_path, roles=TWO_TIERS) as s:
        s.catalog.MARK_LINGER_S = 0
        stop_answering(tmp_path / "remote")
        s.check_tiers()
        for _ in range(2):
            with pytest.raises(MetadataError):
                s.open_dataset("x")
        assert s.catalog.datasets_in_use() == set()
        answer_again(tmp_path / "remote")
        with open_catalog(tmp_path / "cat.db") as other:
            assert other.datasets_in_use() == set()
            found = fsck(other, make_tiers(tmp_path, roles=TWO_TIERS)).problems
            assert [(f.kind.value, f.tier) for f in found] == [("stale-meta", "local")]


@pytest.mark.mpi
def test_a_parallel_open_that_reaches_only_an_older_zarr_json_raises_on_every_rank(tmp_path):
    """Rank 0 reads zarr.json for every rank: where it raises (only a copy from before an
    attribute change answers), every rank raises, rather than wait for its answer for good."""
    _attrs_set_while_local_is_down(tmp_path)
    out = run_mpi(2, "tiers_rank0_meta_failure.py", tmp_path, "open", timeout=60)
    assert out.strip().splitlines()[-1] == "ok"


def test_a_create_that_cannot_store_zarr_json_leaves_the_dataset_in_use_by_no_one(tmp_path):
    """A create while no tier answers catalogues the dataset and raises, storing no
    zarr.json: it left the dataset in use by the session for its life."""
    with session(tmp_path, roles=TWO_TIERS) as s:
        s.catalog.MARK_LINGER_S = 0
        for name in ("local", "remote"):
            stop_answering(tmp_path / name)
        with pytest.raises(BackendError, match="no tier took its zarr.json"):
            s.create_dataset("x", (8,), "i4", (4,), hint="LOCALDISK")
        assert s.catalog.datasets_in_use() == set()


def test_a_create_whose_zarr_json_changed_at_every_look_names_those_tiers(tmp_path, monkeypatch):
    """Where the copy of zarr.json on every tier changed at every look (other processes
    putting it), the create's error names each tier and says so: it said "(none)"."""
    from strataio.tiers import meta

    monkeypatch.setattr(meta.MetaCopies, "_put_on", lambda *args: meta._Put.MISSED)
    with (
        session(tmp_path, roles=TWO_TIERS) as s,
        pytest.raises(BackendError, match="no tier took its zarr.json") as err,
    ):
        s.create_dataset("x", (8,), "i4", (4,), hint="LOCALDISK")
    for name in ("local", "remote"):
        assert f"{name}: {meta._Put.MISSED.value}" in str(err.value), str(err.value)


@pytest.mark.mpi
def test_a_parallel_create_that_cannot_store_zarr_json_raises_on_every_rank(tmp_path):
    """Rank 0 stores the new dataset's zarr.json for every rank: where it raises, every rank
    raises (the others went on with a dataset rank 0 had given up)."""
    out = run_mpi(2, "tiers_rank0_meta_failure.py", tmp_path, "create", timeout=60)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.mpi
def test_a_parallel_delete_raises_on_every_rank_what_rank_0_met(tmp_path):
    """Rank 0 deletes a dataset for every rank: its refusal (the job has the dataset open) or
    its NotFoundError is raised on every rank (the others returned as if it was deleted)."""
    out = run_mpi(2, "tiers_delete_refused.py", tmp_path, timeout=60)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.mpi
def test_a_parallel_create_open_or_delete_the_ranks_call_differently_raises_on_every_rank(
    tmp_path,
):
    """A Session's create, open and delete are collective: ranks passing another dtype,
    shape, chunks, attrs, hint, name or mode raise ArgumentError on every rank, naming the
    argument and the ranks, before anything is created (each rank went on with a handle of
    its own dtype or name, and what one wrote read back as garbage on all); the same calls
    with the same arguments work."""
    out = run_mpi(2, "tiers_create_arguments.py", tmp_path, timeout=120)
    assert out.strip().splitlines()[-1] == "ok"


def test_a_record_that_names_no_zarr_json_version_reads_as_before(tmp_path):
    """A catalog record written before records named the zarr.json version reads the first
    copy that answers, as before; the next attribute change names its version."""
    with session(tmp_path, roles=TWO_TIERS) as s:
        s.create_dataset("x", (8,), "i4", (4,), hint="REMOTEDISK", attrs={"units": "K"}).close()
        s.catalog.annotate_dataset("x", META_ATTR, lambda value: None)
        assert META_ATTR not in json.loads(s.catalog.get_dataset("x").attrs)
        older = tmp_path / "local" / "x" / "zarr.json"
        meta = json.loads(older.read_text())
        meta["attributes"] = {"units": "C"}
        older.write_text(json.dumps(meta))
        assert dict(s.open_dataset("x").attrs) == {"units": "C"}
        ds = s.open_dataset("x", "r+")
        ds.attrs["step"] = 1
        ds.close()
        named = json.loads(s.catalog.get_dataset("x").attrs)[META_ATTR]
        assert named == [checksum(older.read_bytes())]
    assert _stored_attrs(tmp_path, "remote", "x") == {"units": "C", "step": 1}


def test_something_in_a_chunk_s_way_fails_that_chunk_and_no_tier_goes_down(tmp_path):
    """A directory where a chunk's object goes, or a file where its folder goes, made the
    put fail as if the tier had: marked down, for every process, and the write gone on to
    the next tier. Now only that chunk fails, naming the object and the tier; the tier stays
    up, the other chunks are written and read there, and a read of the object fails alone."""
    a = np.arange(16, dtype="i4").reshape(4, 4)
    local = tmp_path / "local"
    with session(tmp_path, roles=TWO_TIERS) as s:
        ds = s.create_dataset("x", (4, 4), "i4", (2, 2), hint="LOCALDISK")
        (local / "x" / "c" / "0" / "1").mkdir(parents=True)
        with pytest.raises(
            ObjectError,
            match=r"chunk 'c/0/1' of dataset 'x' not written: tier 'local': object "
            r"'.*/local/x/c/0/1' cannot be used: Is a directory .* not marked down",
        ):
            ds[...] = a
        assert {t.name: t.state for t in s.catalog.tiers()} == {"local": "up", "remote": "up"}
        assert all(t.up for t in s.tiers)
        assert where(ds) == {"c/0/0": ["local"], "c/1/0": ["local"], "c/1/1": ["local"]}
        ds[2:4, :] = a[2:4] + 100
        ds.close()
        ds = s.open_dataset("x", "r+")
        np.testing.assert_array_equal(
            ds[...], np.block([[a[0:2, 0:2], np.zeros((2, 2))], [a[2:4] + 100]])
        )
        (local / "x" / "c" / "0" / "1").rmdir()
        ds[0:2, 2:4] = 7
        ds.close()
        (local / "x" / "c" / "0" / "1").unlink()
        (local / "x" / "c" / "0" / "1").mkdir()
        ds = s.open_dataset("x")
        with pytest.raises(ObjectError, match=r"chunk 'c/0/1' of 'x': tier 'local': .*Is a dir"):
            ds[...]
        np.testing.assert_array_equal(ds[2:4, :], a[2:4] + 100)
        ds.close()
        ds = s.create_dataset("y", (4, 4), "i4", (2, 2), hint="LOCALDISK")
        (local / "y" / "c").mkdir(parents=True)
        (local / "y" / "c" / "1").write_bytes(b"")
        with pytest.raises(ObjectError, match=r"object '.*/local/y/c/1/0' .*Not a directory"):
            ds[...] = a
        np.testing.assert_array_equal(ds[0:2, :], a[0:2])
        ds.close()
        assert all(t.up for t in s.tiers)


def test_a_write_with_chunks_in_the_way_stores_every_other_chunk_or_names_it(tmp_path):
    """A write one of whose chunks something was in the way of on a tier raised at once,
    naming that chunk alone: the chunks with no room on that tier were never tried on the
    next, nor named, and other chunks in the way went unnamed. Now the others go on as
    always, and the ObjectError names (``keys``) every chunk not stored, and why."""
    a = np.arange(16, dtype="i4").reshape(4, 4)
    local, remote = tmp_path / "local", tmp_path / "remote"
    # (room on local for two of the four chunks: 16 bytes and a CRC-32C each)
    with session(tmp_path, fast_cap=45, roles=TWO_TIERS) as s:
        ds = s.create_dataset("x", (4, 4), "i4", (2, 2), hint="LOCALDISK")
        (local / "x" / "c" / "0" / "0").mkdir(parents=True)
        (local / "x" / "c" / "0" / "1").mkdir()
        with pytest.raises(ObjectError, match=r"chunk 'c/0/0' .*Is a dir.*c/0/1.* 2 of 4") as e:
            ds[...] = a
        assert e.value.keys == ["c/0/0", "c/0/1"]
        assert where(ds) == {"c/1/0": ["remote"], "c/1/1": ["remote"]}
        np.testing.assert_array_equal(ds[2:4, :], a[2:4])
        ds.close()
        ds = s.create_dataset("y", (4, 4), "i4", (2, 2), hint="LOCALDISK")
        (local / "y" / "c" / "0" / "0").mkdir(parents=True)
        stop_answering(remote)
        with pytest.raises(ObjectError, match=r"c/1/0, c/1/1, stored on no tier.*'remote'") as e:
            ds[...] = a
        assert e.value.keys == ["c/0/0", "c/1/0", "c/1/1"]
        assert where(ds) == {"c/0/1": ["local"]}
        np.testing.assert_array_equal(ds[0:2, 2:4], a[0:2, 2:4])
        ds.close()
        answer_again(remote)
        assert s.tiers["local"].up


def test_a_put_refused_again_leaves_the_chunk_its_previous_value(tmp_path):
    """A put something is in the way of, of a chunk with no copy, was announced from the
    second try on (its first failure left the row's deletion pending), and its failure
    withdrew that announcement by deleting the row, which the commit kept as the chunk's
    last row: the residency took it for a copy, and reads of the chunk failed for good
    ("no readable intact copy"). Now the withdrawal stands: the chunk reads as before."""
    local = tmp_path / "local"
    with session(tmp_path, roles=TWO_TIERS) as s:
        ds = s.create_dataset("x", (4, 4), "i4", (2, 2), hint="LOCALDISK")
        ds[2:4, :] = 5
        (local / "x" / "c" / "0" / "0").mkdir(parents=True)
        for _ in range(3):
            with pytest.raises(ObjectError, match=r"chunk 'c/0/0' .*Is a directory") as e:
                ds[0:2, :] = 7
            assert e.value.keys == ["c/0/0"]
        want = np.block([[np.zeros((2, 2)), np.full((2, 2), 7)], [np.full((2, 4), 5)]])
        np.testing.assert_array_equal(ds[...], want)
        ds.flush()
        assert "c/0/0" not in {c.key for c in s.catalog.residency("x")}
        np.testing.assert_array_equal(ds[...], want)
        ds.close()
        (local / "x" / "c" / "0" / "0").rmdir()
        with s.open_dataset("x") as ds:
            np.testing.assert_array_equal(ds[...], want)
        report = fsck(s.catalog, s.tiers)
        assert report.clean, report.problems


def test_many_objects_one_thing_is_in_the_way_of_cost_one_probe_of_their_tier(
    tmp_path, monkeypatch
):
    """Each object something is in the way of probed its tier (a put, a get and a delete,
    holding one of its slots) to tell that from the tier's own root in the way: a write of
    400 chunks under one file where their folder goes made 400 probes. A probe that found
    the tier answering stands for ``Tier.RECHECK_S`` seconds; a root in the way is found by
    the first probe after that, and the tier marked down."""
    probes = Counter()
    check = Tier.check

    def counting(tier):
        probes[tier.name] += 1
        return check(tier)

    monkeypatch.setattr(Tier, "check", counting)
    n = 400
    with session(tmp_path, roles=TWO_TIERS) as s:
        local = s.tiers["local"]
        local.RECHECK_S = 60.0  # (however slow the write: all of it within one interval)
        ds = s.create_dataset("x", (n,), "i4", (1,), hint="LOCALDISK")
        (tmp_path / "local" / "x" / "c").write_bytes(b"")
        probes.clear()
        with pytest.raises(ObjectError, match=r"Not a directory") as e:
            ds[...] = np.arange(n)
        assert len(e.value.keys) == n
        assert probes["local"] == 1 and local.up
        ds.close()
        local.RECHECK_S = 0.0  # (the last probe is old now)
        stop_answering(tmp_path / "local")
        with s.create_dataset("y", (4,), "i4", (4,), hint="LOCALDISK") as ds:
            ds[...] = 7
            assert where(ds) == {"c/0": ["remote"]}
        assert not local.up and probes["local"] >= 2


class _Paused:
    """Catalog ``catalog`` as a :class:`MetaCopies` sees it, pausing at its calls: after the
    first annotation (the announcement) ``announced`` is set, and before the second (the
    settlement) ``puts_done`` is set, then ``go_on`` waited for."""

    def __init__(self, catalog):
        self.catalog = catalog
        self.calls = 0
        self.announced, self.puts_done, self.go_on = (threading.Event() for _ in range(3))

    def __getattr__(self, name):
        return getattr(self.catalog, name)

    def annotate_dataset(self, name, key, change):
        self.calls += 1
        if self.calls == 2:
            self.puts_done.set()
            assert self.go_on.wait(30)
        got = self.catalog.annotate_dataset(name, key, change)
        if self.calls == 1:
            self.announced.set()
        return got


def test_attribute_changes_run_at_once_take_effect_in_the_order_they_were_announced(tmp_path):
    """Change A announces its zarr.json, then change B; B puts its own on every tier, then A
    did, and B's settlement dropped A's version, which A's then left dropped: the record
    named B's version, which no tier held, and an open with a tier down raised. A change
    leaves a copy of a version announced after its own: every tier holds B's, named."""
    with session(tmp_path, roles=TWO_TIERS) as s:
        s.create_dataset("x", (8,), "i4", (4,), hint="REMOTEDISK", attrs={"units": "K"}).close()
        meta = json.loads((tmp_path / "local" / "x" / "zarr.json").read_text())
        a, b = (json.dumps({**meta, "attributes": {"by": who}}).encode() for who in ("A", "B"))
        cat_a, cat_b = _Paused(s.catalog), _Paused(s.catalog)
        tiers = s.placement.persistent

        def tiers_after_b_puts():
            assert cat_b.puts_done.wait(30)
            return tiers()

        worker = threading.Thread(
            target=MetaCopies("x", tiers_after_b_puts, lambda: cat_a).put, args=(a,)
        )
        worker.start()
        assert cat_a.announced.wait(30)
        other = threading.Thread(target=MetaCopies("x", tiers, lambda: cat_b).put, args=(b,))
        other.start()
        assert cat_a.puts_done.wait(30)  # A's puts are over before B settles, then A
        cat_b.go_on.set()
        other.join(30)
        cat_a.go_on.set()
        worker.join(30)
        assert not (worker.is_alive() or other.is_alive())
        named = json.loads(s.catalog.get_dataset("x").attrs)[META_ATTR]
        assert named == [checksum(b)]
        for tier in ("local", "remote"):
            assert _stored_attrs(tmp_path, tier, "x") == {"by": "B"}
        stop_answering(tmp_path / "remote")
        s.check_tiers()
        assert dict(s.open_dataset("x").attrs) == {"by": "B"}


#: changes the attributes of dataset ``x`` of a Session on tiers ``local`` and ``remote``
#: under argv[1] (see racing.set_and_delete_attrs)
_TIERED_SETTER = """
import sys
import strataio
from racing import set_and_delete_attrs
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet
root = sys.argv[1]
roles = (("local", "localdisk"), ("remote", "remotedisk"))
tiers = TierSet([Tier(t, PosixBackend(f"{root}/{t}"), r, order=i) for i, (t, r) in enumerate(roles)])
with strataio.Session(tiers=tiers, catalog=f"{root}/cat.db") as s:
    ds = s.open_dataset("x", "r+")
    set_and_delete_attrs(ds, sys.argv[2:])
    ds.close()
"""


def test_tiered_attrs_set_and_deleted_by_two_processes_at_once_all_take_effect(tmp_path):
    """Two processes set 30 attributes each, one at a time, at once, each deleting 10 others
    meanwhile: every change holds the dataset's change claim in the catalog from its read of
    zarr.json to its settlement, so every set stays and every deleted one goes on every
    tier. Without it, of two changes that overlapped only the later one stayed: attributes
    set were lost and deleted ones came back. No claim is left in the record."""
    drop = [f"d{i}" for i in range(20)]
    with session(tmp_path, roles=TWO_TIERS) as s:
        attrs = {"units": "K"} | dict.fromkeys(drop, 0)
        s.create_dataset("x", (4,), "f4", (2,), hint="REMOTEDISK", attrs=attrs).close()
    root = str(tmp_path)
    race(_TIERED_SETTER, [[root, "x", "30", *drop[:10]], [root, "y", "30", *drop[10:]]])
    want = {"units": "K"} | {f"{k}{i}": i for k in "xy" for i in range(30)}
    for tier in ("local", "remote"):
        assert _stored_attrs(tmp_path, tier, "x") == want, tier
    with session(tmp_path, roles=TWO_TIERS) as s:
        assert dict(s.open_dataset("x").attrs) == want
        assert set(json.loads(s.catalog.get_dataset("x").attrs)) == {"strataio.array", META_ATTR}


def test_an_attribute_change_waits_for_a_running_one_and_takes_a_claim_left_by_a_dead_one(
    tmp_path, monkeypatch
):
    """An attribute change waits while another writer's change holds the dataset's claim,
    and raises naming that writer once it has waited CHANGE_WAIT seconds, having put
    nothing. A claim whose writer is gone (its process ended), or that this process left
    (its release failed), is taken at once."""
    monkeypatch.setattr(meta_module, "CHANGE_WAIT", 0.3)
    with session(tmp_path, roles=TWO_TIERS) as s:
        s.create_dataset("x", (4,), "f4", (2,), hint="REMOTEDISK", attrs={"units": "K"}).close()
        other = session(tmp_path, roles=TWO_TIERS)
        held = [other.writer, "elsewhere:1:0123456789ab:0123456789ab:0123456789ab"]
        s.catalog.annotate_dataset("x", CHANGE_ATTR, lambda _: held)
        ds = s.open_dataset("x", "r+")
        with pytest.raises(BackendError, match=f"attribute change by writer {other.writer}"):
            ds.attrs["step"] = 3
        assert _stored_attrs(tmp_path, "remote", "x") == {"units": "K"}
        other.close()  # (its writer's token released: the claim is a dead change's)
        ds.attrs["step"] = 3
        assert CHANGE_ATTR not in json.loads(s.catalog.get_dataset("x").attrs)
        left = [s.writer, meta_module._new_claim_id()]
        s.catalog.annotate_dataset("x", CHANGE_ATTR, lambda _: left)
        ds.attrs["note"] = "b"
        ds.close()
        assert CHANGE_ATTR not in json.loads(s.catalog.get_dataset("x").attrs)
    assert _stored_attrs(tmp_path, "remote", "x") == {"units": "K", "step": 3, "note": "b"}


def test_a_change_back_to_a_version_still_named_takes_effect(tmp_path):
    """A change to attributes C is killed after its puts, before its settlement: the record
    names K's version, then C's, and the tiers hold C's. Setting the attributes back to K
    announced K's version in its old place, before C's: every tier was left with C's, newer
    by that order, and reads kept C. The version announced last is the newest."""
    with session(tmp_path, roles=TWO_TIERS) as s:
        s.create_dataset("x", (8,), "i4", (4,), hint="REMOTEDISK", attrs={"units": "K"}).close()
        meta = json.loads((tmp_path / "local" / "x" / "zarr.json").read_text())
        dead = json.dumps({**meta, "attributes": {"units": "C"}}).encode()
        s.catalog.annotate_dataset("x", META_ATTR, functools.partial(_announced, checksum(dead)))
        for tier in ("local", "remote"):
            (tmp_path / tier / "x" / "zarr.json").write_bytes(dead)
        ds = s.open_dataset("x", "r+")
        assert dict(ds.attrs) == {"units": "C"}
        ds.attrs["units"] = "K"
        ds.close()
        assert dict(s.open_dataset("x").attrs) == {"units": "K"}
        for tier in ("local", "remote"):
            assert _stored_attrs(tmp_path, tier, "x") == {"units": "K"}


def test_a_read_rewriting_an_older_zarr_json_leaves_a_change_made_since_it_looked(tmp_path):
    """A read rewrites a copy of zarr.json older than the one it read once the record still
    names that one alone: a whole attribute change made between that check and the
    rewrite, put on that tier alone, was overwritten and lost. The rewrite is made only
    over the copy there before the check."""
    _attrs_set_while_local_is_down(tmp_path)
    with session(tmp_path, roles=TWO_TIERS) as s:
        assert s.check_tiers() == {"local": True, "remote": True}
        meta = json.loads((tmp_path / "remote" / "x" / "zarr.json").read_text())
        newer = json.dumps({**meta, "attributes": {"units": "C"}}).encode()
        elsewhere = make_tiers(tmp_path, roles=TWO_TIERS)
        elsewhere["remote"].mark_down("does not answer")
        change = MetaCopies("x", lambda: list(elsewhere), lambda: s.catalog)
        looks = []

        class Meanwhile:  # the change runs just after the read's second look at the record
            def __getattr__(self, name):
                return getattr(s.catalog, name)

            def get_dataset(self, name):
                got = s.catalog.get_dataset(name)
                looks.append(name)
                if len(looks) == 2:
                    change.put(newer)
                return got

        read = MetaCopies("x", s.placement.persistent, Meanwhile).get()
        assert json.loads(read)["attributes"] == {"units": "K", "step": 3}
        assert len(looks) == 2
        assert (tmp_path / "local" / "x" / "zarr.json").read_bytes() == newer
    with session(tmp_path, roles=TWO_TIERS) as s:
        assert dict(s.open_dataset("x").attrs) == {"units": "C"}


def test_a_dataset_named_inside_another_is_refused_and_no_tier_goes_down(tmp_path):
    """Dataset ``v``'s chunk ``c/0`` is the object ``v/c/0``: a dataset of that name would put
    its ``zarr.json`` under that object's path, and the put failed as if the tier had (every
    tier was marked down, for every process). Such a name is refused before anything is
    stored, in either order."""
    with session(tmp_path) as s:
        with s.create_dataset("v/c/0", (4,), "f4", (2,), hint="LOCALDISK") as ds:
            ds[...] = 7
        with pytest.raises(ExistsError, match="would lie inside dataset 'v/c/0'|lies inside it"):
            s.create_dataset("v", (4,), "f4", (2,), hint="LOCALDISK")
        s.create_dataset("w", (4,), "f4", (2,), hint="LOCALDISK").close()
        with pytest.raises(ExistsError, match="would lie inside dataset 'w'"):
            s.create_dataset("w/c", (4,), "f4", (2,), hint="LOCALDISK")
        assert all(t.up for t in s.tiers)
        np.testing.assert_array_equal(s.open_dataset("v/c/0")[...], [7] * 4)
    assert not (tmp_path / "local" / "w" / "c" / "zarr.json").exists()


def test_a_name_that_is_no_unicode_text_is_refused_clearly(tmp_path):
    """A name with a lone surrogate (a file name's undecodable byte, as os.listdir gives it)
    is refused with ArgumentError naming it, before anything is stored, where it raised a
    bare UnicodeEncodeError from the catalog's driver."""
    from strataio.errors import ArgumentError

    with session(tmp_path) as s:
        with pytest.raises(ArgumentError, match="is not Unicode text"):
            s.create_dataset("a\udc80b", (4,), "f4", (2,), hint="LOCALDISK")
        with pytest.raises(ArgumentError, match="is not Unicode text"):
            s.open_dataset("a\udc80b")
        with pytest.raises(ArgumentError, match="is not Unicode text"):
            s.delete_dataset("a\udc80b")
        assert s.catalog.list_datasets() == []
    assert not any(
        p.name.startswith("a") for t in ("local", "remote") for p in (tmp_path / t).iterdir()
    )


def test_disable_drops_attributes_as_it_drops_data(tmp_path):
    """A DISABLE dataset stores nothing, zarr.json included: attributes given or set are
    shown by the handle and dropped; the catalog record holds none of them either."""
    with session(tmp_path) as s:
        ds = s.create_dataset("scratch", (8,), "i4", (4,), hint="DISABLE", attrs={"units": "K"})
        ds.attrs["step"] = 3
        assert dict(ds.attrs) == {"units": "K", "step": 3}
        ds.close()
        assert json.loads(s.catalog.get_dataset("scratch").attrs) == {}
        assert dict(s.open_dataset("scratch").attrs) == {}
    assert not any((tmp_path / t / "scratch").exists() for t in ("local", "remote", "tape"))


def test_auto_fills_archive_then_spills_to_faster_tiers(tmp_path):
    tiers = TierSet(
        [
            Tier("local", PosixBackend(tmp_path / "l"), "localdisk", order=0),
            Tier("tape", PosixBackend(tmp_path / "t"), "remotetape", capacity=4 * 400, order=1),
        ]
    )
    a = np.arange(40 * 40, dtype="f4").reshape(40, 40)
    with strataio.Session(tiers=tiers, catalog=tmp_path / "c.db") as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10))  # 16 chunks of 400 bytes
        ds[...] = a
        ds.close()
        ds = s.open_dataset("a")
        placed = [ts[0] for ts in where(ds).values()]
        assert placed.count("tape") == 4 and placed.count("local") == 12
        states = {c.tier: c.state for cs in ds.residency().values() for c in cs}
        assert states == {"tape": "valid", "local": "dirty"}  # dirty: not at its home tier
        assert s.usage() == {"local": 12 * 400, "tape": 4 * 400}
        np.testing.assert_array_equal(ds[...], a)
        assert s.usage() == {"local": 16 * 400, "tape": 4 * 400}  # the read staged 4 chunks
        ds.close()


def test_full_fast_tier_evicts_lru_clean_chunks_and_writes_back_dirty(tmp_path):
    a = np.arange(40 * 40, dtype="f4").reshape(40, 40)
    with session(tmp_path, fast_cap=6 * 400) as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="REMOTETAPE")
        ds[...] = a
        ds.flush()
        # staging 16 chunks into a 6-chunk local tier: LRU eviction keeps it within capacity
        for r in range(4):
            ds.stage(np.s_[r * 10 : (r + 1) * 10, :], to="local").wait()
            assert s.tiers["local"].used <= 6 * 400
        on_local = sorted(k for k, ts in where(ds).items() if "local" in ts)
        assert len(on_local) == 6  # full, and the most recently staged chunks are the ones kept
        assert {f"c/3/{j}" for j in range(4)} <= set(on_local)
        assert all(k.startswith(("c/2/", "c/3/")) for k in on_local)
        assert all("tape" in ts for ts in where(ds).values())  # every chunk kept its archive copy
        ds.close()
        # a LOCALDISK dataset's chunks have no other copy: eviction writes them back first
        b = s.create_dataset("b", (20, 30), "f4", (10, 10), hint="LOCALDISK")
        b[...] = 7.0  # 6 chunks fill local; the LRU ones of "a" make room
        b.flush()
        c = s.create_dataset("c", (10, 20), "f4", (10, 10), hint="LOCALDISK")
        c[...] = 3.0  # 2 more chunks: 2 of "b" (only copies) are written back to "remote"
        c.close()
        b.close()
        b = s.open_dataset("b")
        assert sum("remote" in ts for ts in where(b).values()) == 2
        np.testing.assert_array_equal(b[...], np.full((20, 30), 7.0, "f4"))
        b.close()
        assert s.usage()["local"] <= 6 * 400
        # files on disk match the catalog: evicted copies were deleted after the commit
        files = {
            p.relative_to(tmp_path / "local").as_posix()
            for p in (tmp_path / "local").rglob("*/c/*/*")
        }
        cat = {f"{x.dataset}/{x.key}" for x in s.catalog.all_residency() if x.tier == "local"}
        assert files == cat


def test_writes_into_a_full_tier_evict_to_low_water_in_few_commits(tmp_path):
    """Hysteresis: a full tier is emptied to the low-water mark (10 % of its capacity free
    by default), so one eviction round, committed once, makes room for several chunks."""
    cap = 40 * 400  # 40 chunks of 400 bytes; one round frees 1600 bytes = 4 chunks
    a = np.arange(40 * 100, dtype="f4").reshape(40, 100)
    b = np.random.default_rng(7).random((400, 10)).astype("f4")
    cat = open_catalog(tmp_path / "cat.db")
    commits: list[int] = []
    commit = cat.commit

    def counting_commit(upserts=(), deletes=(), **kw):
        upserts, deletes = list(upserts), list(deletes)
        commits.append(len(upserts) + len(deletes))
        return commit(upserts, deletes, **kw)

    cat.commit = counting_commit
    with strataio.Session(tiers=make_tiers(tmp_path, fast_cap=cap), catalog=cat) as s:
        local = s.tiers["local"]
        da = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="REMOTETAPE")
        da[...] = a
        da.flush()
        da.stage(None, to="local").wait()
        assert local.used == cap  # full of "a", whose chunks all have a tape copy
        db = s.create_dataset("b", b.shape, b.dtype, (10, 10), hint="LOCALDISK")
        before = len(commits)
        for i in range(40):  # one chunk per write: one claim each on the full tier
            db[i * 10 : (i + 1) * 10] = b[i * 10 : (i + 1) * 10]
            assert local.used + local.reserved <= cap
        # 40 evictions in rounds of 4 chunks: 10 commits of "a" (one per chunk before)
        assert s.placement.evictions == 40
        assert len(commits) - before <= 40 // 4
        with pytest.raises(StrataError, match="low_water_fraction"):
            Placement(s.tiers, low_water_fraction=1.5)
        db.close()
        da.close()
        assert {c.key for c in cat.residency("b")} == {f"c/{i}/0" for i in range(40)}
        assert all(c.tier == "local" for c in cat.residency("b"))
        assert not any(c.tier == "local" for c in cat.residency("a"))
        assert sum(c.tier == "tape" for c in cat.residency("a")) == 40
        db = s.open_dataset("b")
        np.testing.assert_array_equal(db[...], b)
        db.close()
        da = s.open_dataset("a")
        np.testing.assert_array_equal(da[...], a)
        da.close()
    cat.close()


def test_eviction_reaches_datasets_not_open_in_this_process(tmp_path):
    """A full fast tier held by a closed dataset makes room for a new one: the catalog names
    the least recently used copies, and their dataset's residency is loaded to evict them."""
    a = np.arange(40 * 40, dtype="f4").reshape(40, 40)  # 16 chunks of 400 bytes
    with session(tmp_path, fast_cap=16 * 400) as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="REMOTETAPE")
        ds[...] = a
        ds.flush()
        for r in range(4):  # row 0 is staged first: the least recently used
            ds.stage(np.s_[r * 10 : (r + 1) * 10, :], to="local").wait()
            time.sleep(0.01)
        ds.close()
    with session(tmp_path, fast_cap=16 * 400) as s:
        assert s.tiers["local"].used == 16 * 400
        b = s.create_dataset("b", (20, 40), "f4", (10, 10), hint="LOCALDISK")
        b[...] = 5.0  # 8 chunks: 8 of "a", its two oldest rows, leave local
        b.close()
        rows = s.catalog.residency("a")
        assert sorted(c.key for c in rows if c.tier == "local") == sorted(
            f"c/{i}/{j}" for i in (2, 3) for j in range(4)
        )
        assert sum(c.tier == "tape" for c in rows) == 16  # the archive copies stay
        assert {c.tier for c in s.catalog.residency("b")} == {"local"}
        assert s.usage()["local"] == 16 * 400
        files = {
            p.relative_to(tmp_path / "local").as_posix()
            for p in (tmp_path / "local").rglob("*/c/*/*")
        }
        cat = {f"{x.dataset}/{x.key}" for x in s.catalog.all_residency() if x.tier == "local"}
        assert files == cat  # evicted objects deleted after the commit that forgot them
        report = fsck(s.catalog, s.tiers)
        assert report.clean, report.problems
        ds = s.open_dataset("a")
        np.testing.assert_array_equal(ds[...], a)
        ds.close()
        b = s.open_dataset("b")
        np.testing.assert_array_equal(b[...], np.full((20, 40), 5.0, "f4"))
        b.close()
        assert s.usage()["local"] <= 16 * 400
        report = fsck(s.catalog, s.tiers)
        assert report.clean, report.problems


def test_reads_stage_archive_chunks_and_reuse_them(tmp_path):
    """Figure 4: a second read overlapping the first stages only the chunks it adds."""
    a = np.random.default_rng(1).random((60, 60)).astype("f4")
    with session(tmp_path) as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="REMOTETAPE")
        ds[...] = a
        ds.close()
        ds = s.open_dataset("a")
        np.testing.assert_array_equal(ds[0:20, 0:20], a[0:20, 0:20])
        staged = {k for k, ts in where(ds).items() if "local" in ts}
        assert staged == {f"c/{i}/{j}" for i in range(2) for j in range(2)}
        h = ds.stage(np.s_[10:30, 10:30])  # overlaps the first read in one chunk
        r = h.wait()
        assert (r.moved, r.reused) == (3, 1)
        np.testing.assert_array_equal(ds[10:30, 10:30], a[10:30, 10:30])
        ds.close()
    # residency survives the session: a new one sees the staged copies without staging again
    with session(tmp_path) as s:
        ds = s.open_dataset("a")
        assert sum("local" in ts for ts in where(ds).values()) == 7
        r = ds.stage(np.s_[0:30, 0:30]).wait()
        assert (r.moved, r.reused) == (2, 7)
        ds.close()


def test_prefetch_fills_bounded_cache(tmp_path):
    a = np.arange(100 * 100, dtype="f8").reshape(100, 100)
    with strataio.Session(
        tiers=make_tiers(tmp_path), catalog=tmp_path / "c.db", cache_bytes=10 * 800
    ) as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="LOCALDISK")
        ds[...] = a
        ds.close()
        ds = s.open_dataset("a")
        r = ds.prefetch(np.s_[0:10, :]).wait()  # 10 chunks of 800 bytes
        assert r.moved == 10 and r.nbytes == 8000
        assert len(s.cache) == 10 and s.cache.nbytes <= 8000
        # the bytes on disk are gone, the read is served from memory
        for p in (tmp_path / "local" / "a" / "c" / "0").iterdir():
            p.write_bytes(b"\0" * 800)
        np.testing.assert_array_equal(ds[0:10, :], a[0:10, :])
        ds.prefetch(np.s_[10:20, :]).wait()
        assert s.cache.nbytes <= 8000 and len(s.cache) == 10  # LRU: the first row left
        ds.close()


def test_session_from_config_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "strataio.toml").write_text(
        """
[catalog]
url = "cat.db"
[[tiers]]
name = "fast"
kind = "posix"
role = "localdisk"
path = "fast"
capacity = "1MiB"
[[tiers]]
name = "arch"
kind = "posix"
role = "remotetape"
path = "arch"
shaped = "remote_tape_2002"
time_scale = 0.0
"""
    )
    with strataio.Session() as s:
        assert s.tiers.names == ["fast", "arch"]
        assert s.tiers["fast"].capacity == 1 << 20
        ds = s.create_dataset("x", (8, 8), "i2", (4, 4), attrs={"units": "K"})
        ds[...] = np.arange(64, dtype="i2").reshape(8, 8)
        ds.close()
        ds = s.open_dataset("x")
        assert ds.attrs["units"] == "K"
        assert ds[7, 7] == 63
        ds.close()
    assert (tmp_path / "arch" / "x" / "zarr.json").is_file()


@pytest.mark.mpi
def test_mpi_session_only_rank0_touches_the_catalog(tmp_path):
    out = run_mpi(3, "tiers_session.py", tmp_path)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.mpi
def test_mpi_sessions_from_a_configuration_make_only_new_tiers_directories(tmp_path):
    """Every rank builds its tiers from the configuration once rank 0's catalog says which
    it knows: a known tier's missing directory is made on no rank."""
    out = run_mpi(2, "tiers_config_session.py", tmp_path)
    assert out.strip().splitlines()[-1] == "ok"


def test_mpi_rank0_announces_in_place_rewrites(tmp_path):
    out = run_mpi(2, "tiers_rewrite.py", tmp_path)
    assert out.strip().splitlines()[-1] == "ok"


def test_session_on_postgresql_catalog(tmp_path, pg_url):
    a = np.random.default_rng(5).random((30, 30))
    tiers = make_tiers(tmp_path)
    with strataio.Session(tiers=tiers, catalog=pg_url) as s:
        ds = s.create_dataset("pg", a.shape, a.dtype, (10, 10), hint="REMOTETAPE")
        ds[...] = a
        ds.close()
        ds = s.open_dataset("pg")
        np.testing.assert_array_equal(ds[0:10, :], a[0:10, :])  # stages row 0 to local
        ds.close()
    with strataio.Session(tiers=make_tiers(tmp_path), catalog=pg_url) as s:
        rows = s.catalog.residency("pg")
        assert sum(c.tier == "tape" for c in rows) == 9
        assert sorted(c.key for c in rows if c.tier == "local") == ["c/0/0", "c/0/1", "c/0/2"]
        assert s.usage()["local"] == 3 * 800


def test_read_fails_over_to_another_copy_and_marks_tier_down(tmp_path):
    a = np.random.default_rng(6).random((20, 20))
    with session(tmp_path) as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="REMOTETAPE")
        ds[...] = a
        ds.close()
        ds = s.open_dataset("a")
        ds.stage(None, to="local").wait()  # every chunk on local and tape
        # the local disk breaks: its root is no longer a directory (I/O errors, not "missing")
        (tmp_path / "local").rename(tmp_path / "local.broken")
        (tmp_path / "local").write_bytes(b"")
        np.testing.assert_array_equal(ds[...], a)
        assert not s.tiers["local"].up and s.tiers["local"].last_error
        assert {t.name: t.state for t in s.catalog.tiers()}["local"] == "down"
        ds.close()


def _written(s, shape, hint, *, seed):
    """Dataset ``a`` of session ``s``: random floats of ``shape`` in 10² chunks, placed by
    ``hint``, written whole (not flushed); the values and the open dataset."""
    a = np.random.default_rng(seed).random(shape)
    ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint=hint)
    ds[...] = a
    return a, ds


def test_a_running_session_reads_again_from_a_tier_that_answers_again(tmp_path, monkeypatch):
    """A chunk whose only copy sits on a tier that went down fails to read, saying so (and
    that the catalog still records the copy there, not that nothing is lost: the tier may
    have lost it); once the tier answers, the same session reads it again: a read probes a
    down tier again, at most every ``Tier.RECHECK_S`` seconds."""
    root = tmp_path / "remote"
    with session(tmp_path) as s:
        a, ds = _written(s, (20, 20), "REMOTEDISK", seed=7)
        ds.close()
        ds = s.open_dataset("a")
        stop_answering(root)
        monkeypatch.setattr(Tier, "RECHECK_S", 3600.0)
        with pytest.raises(BackendError) as info:
            ds[...]
        msg = str(info.value)
        assert "tiers that are down" in msg and "still records them" in msg and "fsck" not in msg
        assert not s.tiers["remote"].up
        answer_again(root)
        with pytest.raises(BackendError):
            ds[...]  # (probed again only RECHECK_S after its failure)
        monkeypatch.setattr(Tier, "RECHECK_S", 0.0)
        np.testing.assert_array_equal(ds[...], a)
        assert s.tiers["remote"].up
        assert {t.name: t.state for t in s.catalog.tiers()}["remote"] == "up"
        ds.close()


def test_reads_return_to_a_faster_copy_once_its_tier_answers_again(tmp_path, monkeypatch):
    """Chunks on local and remote read from remote while local is down; once local answers,
    the same session's reads go back to it (a read probes a down tier holding a faster copy
    than the one it reads, at most every ``Tier.RECHECK_S``), not to remote for good."""
    root = tmp_path / "local"
    keys = ["c/0/0", "c/0/1", "c/1/0", "c/1/1"]
    with session(tmp_path) as s:
        s.cache.capacity = 0
        a, ds = _written(s, (20, 20), "REMOTEDISK", seed=9)
        ds.close()
        ds = s.open_dataset("a")
        ds.stage(None, to="local").wait()
        np.testing.assert_array_equal(ds[...], a)

        def served_by():
            s.cache.invalidate("a")
            np.testing.assert_array_equal(ds[...], a)
            return {v[0].split("/")[-1] for v in ds.store.chunk_versions(keys)}

        assert served_by() == {"local"}
        stop_answering(root)
        monkeypatch.setattr(Tier, "RECHECK_S", 3600.0)
        assert served_by() == {"remote"}
        assert not s.tiers["local"].up
        answer_again(root)
        assert served_by() == {"remote"}  # (probed again only RECHECK_S after its failure)
        monkeypatch.setattr(Tier, "RECHECK_S", 0.0)
        assert served_by() == {"local"}
        assert s.tiers["local"].up
        ds.close()


def test_a_running_session_writes_again_to_its_home_tier_once_it_answers(tmp_path, monkeypatch):
    """Writes fail over from a home tier that went down to the next one; once the home tier
    answers, the same session's writes go there again: a write probes a down tier preferred
    over every tier that is up, at most every ``Tier.RECHECK_S`` seconds."""
    root = tmp_path / "local"
    with session(tmp_path) as s:
        a, ds = _written(s, (20, 20), "LOCALDISK", seed=8)
        ds.flush()
        assert {t for ts in where(ds).values() for t in ts} == {"local"}
        stop_answering(root)
        monkeypatch.setattr(Tier, "RECHECK_S", 3600.0)
        ds[0:10, 0:10] = a[0:10, 0:10] + 1  # fails over to the next tier
        ds.flush()
        assert not s.tiers["local"].up
        assert where(ds)["c/0/0"] == ["remote"]
        answer_again(root)
        ds[0:10, 10:20] = a[0:10, 10:20] + 2
        ds.flush()
        assert where(ds)["c/0/1"] == ["remote"]  # (probed again only RECHECK_S after)
        monkeypatch.setattr(Tier, "RECHECK_S", 0.0)
        # (strataio info shows the write order without probing)
        assert [t.name for t in s.placement.write_order("LOCALDISK", probe=False)][0] != "local"
        assert not s.tiers["local"].up
        ds[10:20, 0:10] = a[10:20, 0:10] + 3
        ds.flush()
        assert s.tiers["local"].up
        assert where(ds)["c/1/0"] == ["local"]
        want = a.copy()
        want[0:10, 0:10] += 1
        want[0:10, 10:20] += 2
        want[10:20, 0:10] += 3
        np.testing.assert_array_equal(ds[...], want)
        ds.close()


def test_a_copy_made_obsolete_while_its_tier_was_down_goes_once_the_tier_answers(
    tmp_path, monkeypatch
):
    """A chunk rewritten while its tier is down goes to the next tier; its old copy there is
    obsolete. The flush after the tier answers again probes it and deletes that copy,
    rather than leaving an orphan that fsck would report."""
    with session(tmp_path) as s:
        a, ds = _written(s, (10, 10), "LOCALDISK", seed=9)
        ds.flush()
        assert where(ds) == {"c/0/0": ["local"]}
        monkeypatch.setattr(Tier, "RECHECK_S", 3600.0)
        stop_answering(tmp_path / "local")
        ds[...] = a + 1  # (whole: the old bytes need not be read)
        answer_again(tmp_path / "local")
        monkeypatch.setattr(Tier, "RECHECK_S", 0.0)
        ds.flush()
        assert where(ds) == {"c/0/0": ["remote"]}
        assert not (tmp_path / "local" / "a" / "c" / "0" / "0").exists()
        assert fsck(s.catalog, s.tiers).clean
        np.testing.assert_array_equal(ds[...], a + 1)
        ds.close()


def _rewritten_during_an_outage(root, s, *, seed):
    """Dataset ``a`` of ``s`` (:func:`_written`, flushed to the local tier), rewritten whole
    and flushed while that tier did not answer (the local copy's row went, its object could
    not), the tier answering again; the new values and the open dataset."""
    a, ds = _written(s, (10, 10), "LOCALDISK", seed=seed)
    ds.flush()
    stop_answering(root / "local")
    ds[...] = a + 1
    ds.flush()
    answer_again(root / "local")
    return a, ds


def test_a_copy_whose_row_went_while_its_tier_was_down_goes_at_a_later_commit(
    tmp_path, monkeypatch
):
    """A commit made while a tier is down drops the rows of copies there a rewrite made
    obsolete, but cannot delete their objects: they stay this process's to delete, and a
    later commit (here a flush with nothing else to record) deletes them once the tier
    answers, rather than leaving an orphan that fsck may not remove while the job runs."""
    monkeypatch.setattr(Tier, "RECHECK_S", 0.0)
    with session(tmp_path) as s:
        a, ds = _rewritten_during_an_outage(tmp_path, s, seed=11)
        assert where(ds) == {"c/0/0": ["remote"]}
        assert (tmp_path / "local" / "a" / "c" / "0" / "0").exists()
        ds.flush()
        assert not (tmp_path / "local" / "a" / "c" / "0" / "0").exists()
        report = fsck(s.catalog, s.tiers)
        assert report.clean and not report.in_flight, report.findings
        np.testing.assert_array_equal(ds[...], a + 1)
        ds.close()


def test_a_stranded_copy_another_process_has_rewritten_since_stays(tmp_path, monkeypatch):
    """An object left behind by a tier that was down is deleted later only while no catalog
    row names it: another process that has written the chunk there since (replacing the
    object, announced) keeps its copy."""
    monkeypatch.setattr(Tier, "RECHECK_S", 0.0)
    with session(tmp_path) as s:
        a, ds = _rewritten_during_an_outage(tmp_path, s, seed=12)
        with session(tmp_path) as other:
            theirs = other.open_dataset("a", "r+")
            theirs[...] = a + 2
            theirs.close()
            assert sorted(where(other.open_dataset("a"))["c/0/0"]) == ["local"]
        ds.flush()
        assert (tmp_path / "local" / "a" / "c" / "0" / "0").exists()
        ds.close()
        np.testing.assert_array_equal(s.open_dataset("a")[...], a + 2)
        assert fsck(s.catalog, s.tiers).clean


@pytest.mark.parametrize(
    "down, says",
    [("remote", "its tiers remote are down"), ("local", "tier 'local' is down")],
    ids=["the-source", "the-destination"],
)
def test_a_move_involving_a_tier_marked_down_probes_it(tmp_path, monkeypatch, down, says):
    """A stage of a chunk whose only copy is on a tier marked down, or to a tier marked
    down, probes that tier again: once it answers the stage copies the chunk; while it does
    not, the stage says the tier is down (of the source, it used to count the chunk as
    staged, doing nothing; of the destination, it failed without a probe)."""
    with session(tmp_path) as s:
        a, ds = _written(s, (10, 10), "REMOTEDISK", seed=10)
        ds.close()
        monkeypatch.setattr(Tier, "RECHECK_S", 0.0)
        stop_answering(tmp_path / down)
        assert not s.tiers[down].check()
        ds = s.open_dataset("a")
        with pytest.raises(StrataError, match=says):
            ds.stage(None, to="local").wait()
        answer_again(tmp_path / down)
        ds.stage(None, to="local").wait()
        assert s.tiers[down].up
        assert sorted(where(ds)["c/0/0"]) == ["local", "remote"]
        np.testing.assert_array_equal(ds[...], a)
        ds.close()


def test_fsck_probes_a_tier_marked_down_before_skipping_it(tmp_path):
    """fsck within a Session probes each tier marked down first: one that answers again is
    checked (here its only copy is found corrupt), one that still does not is skipped and named
    in the report with the error its probe met. (It skipped every tier marked down unprobed,
    reporting a hierarchy with a corrupt copy clean.)"""
    with session(tmp_path) as s:
        a, ds = _written(s, (10, 10), "REMOTEDISK", seed=15)
        ds.close()
        (tmp_path / "remote" / "a" / "c" / "0" / "0").write_bytes(b"x" * 800)
        s.tiers["remote"].mark_down("did not answer a moment ago")
        report = fsck(s.catalog, s.tiers)
        assert s.tiers["remote"].up
        assert report.skipped_tiers == [] and report.skipped_why == {}
        assert [(f.kind, f.tier) for f in report.problems] == [("corrupt", "remote")]
        checked = report.copies
        assert checked >= 1
        stop_answering(tmp_path / "remote")
        s.tiers["remote"].mark_down("did not answer a moment ago")
        report = fsck(s.catalog, s.tiers)
        assert report.skipped_tiers == ["remote"] and not report.problems
        # the copies on the tier not checked are not counted as checked (they were)
        on_remote = sum(c.tier == "remote" for c in s.catalog.all_residency())
        assert on_remote >= 1 and report.copies == checked - on_remote
        why = report.skipped_why["remote"]
        assert why and why != "did not answer a moment ago", why  # (the probe's own error)
        answer_again(tmp_path / "remote")


def _refusable(name):
    """POSIX backend call ``name``, refused (EROFS) while its backend's ``refusing`` is set."""
    real = getattr(PosixBackend, name)

    @functools.wraps(real)
    def call(self, *args, **kwargs):
        if not self.refusing:
            return real(self, *args, **kwargs)
        self.refused += 1
        raise OSError(errno.EROFS, "Read-only file system")

    return call


class _ReadOnlyPosix(PosixBackend):
    """A POSIX backend over storage that refuses every write (a read-only mount, EROFS), and
    reads, while ``refusing`` is set (until a test remounts it read-write)."""

    refusing = True

    def __init__(self, root):
        super().__init__(root, create=False)
        self.refused = 0

    write, put, put_versioned, put_new, put_if, truncate, delete, delete_if = map(
        _refusable,
        ("write", "put", "put_versioned", "put_new", "put_if", "truncate", "delete", "delete_if"),
    )


def test_a_read_only_tier_marked_down_is_probed_by_reads_and_read_again(tmp_path, monkeypatch):
    """A read-only tier (``read_only``) marked down is probed by reads alone: a read of a
    chunk whose only copy is there probes it, finds it answering and reads the copy, and
    a check reports it up. It takes no writes, so no write marks it down. (Its probe put an
    object, which the storage refused: once marked down it stayed down, and so did the
    data that only it held.)"""
    with session(tmp_path) as s:
        a, ds = _written(s, (10, 10), "REMOTEDISK", seed=16)
        ds.close()
    tiers = make_tiers(tmp_path)
    remote = tiers["remote"]
    remote.backend, remote.read_only = _ReadOnlyPosix(tmp_path / "remote"), True
    monkeypatch.setattr(Tier, "RECHECK_S", 0.0)
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        remote.mark_down("did not answer a moment ago")
        ds = s.open_dataset("a")
        np.testing.assert_array_equal(ds[...], a)
        assert remote.up
        ds.close()
        b = s.create_dataset("b", (10, 10), "f8", (10, 10), hint="REMOTEDISK")
        b[...] = 1.0
        b.close()
        assert where(s.open_dataset("b")) == {"c/0/0": ["tape"]}  # (the next tier)
        assert remote.up and remote.backend.refused == 0 and remote.free == 0
        remote.mark_down("did not answer a moment ago")
        assert s.check_tiers()["remote"] and remote.up
        stop_answering(tmp_path / "remote")
        assert not remote.check() and not remote.up
        answer_again(tmp_path / "remote")
        assert remote.recheck() and remote.backend.refused == 0


def test_nothing_on_a_read_only_tier_is_deleted_and_it_stays_up(tmp_path):
    """A write that makes a copy on a read-only tier obsolete, a migration off it and an
    eviction from it asked the tier to delete, which it refused, and it was marked down (its
    copies unread until a probe). Now it is never asked: the obsolete copy's row goes and its
    object stays, a migration keeps the copies there (catalogued), an eviction is refused,
    and fsck reports the object no row names and leaves it."""
    with session(tmp_path) as s:
        a, ds = _written(s, (20, 20), "REMOTEDISK", seed=17)
        ds.close()
    tiers = make_tiers(tmp_path)
    remote = tiers["remote"]
    remote.backend, remote.read_only = _ReadOnlyPosix(tmp_path / "remote"), True
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.open_dataset("a", "r+")
        ds[0:10, 0:10] = 5.0
        a[0:10, 0:10] = 5.0
        ds.flush()
        assert where(ds)["c/0/0"] == ["tape"]  # (the next tier the hint allows)
        assert (tmp_path / "remote" / "a" / "c" / "0" / "0").is_file()
        ds.migrate(np.s_[10:20, :], to="tape").wait()
        assert where(ds)["c/1/0"] == ["remote", "tape"] == where(ds)["c/1/1"]
        with pytest.raises(ReadOnlyError, match="'remote' is read-only"):
            ds.evict(None, "remote").wait()
        with pytest.raises(ReadOnlyError):
            remote.call(remote.backend.delete, "a/c/0/1")
        ds.close()
        assert remote.up and remote.backend.refused == 0
        assert {t.name: t.state for t in s.catalog.tiers()}["remote"] == "up"
        for repair in (False, True):
            report = fsck(s.catalog, s.tiers, repair=repair)
            assert [(f.kind, f.tier, f.key, f.action) for f in report.findings] == [
                ("orphan", "remote", "c/0/0", "")
            ]
            assert "read-only" in report.findings[0].detail
        assert (tmp_path / "remote" / "a" / "c" / "0" / "0").is_file()
        assert remote.up and remote.backend.refused == 0
        np.testing.assert_array_equal(s.open_dataset("a")[...], a)


def test_a_migration_to_a_tier_that_takes_no_writes_is_refused_before_anything_moves(
    tmp_path, clock
):
    """A migration to a tier configured read-only, or whose storage refuses writes now, is
    refused at once, as an eviction from it is, naming the tier and why; nothing moves. (It
    ran, and failed chunk by chunk saying the tier was full with nothing on it to evict.)"""
    with session(tmp_path) as s:
        a, ds = _written(s, (20, 20), "LOCALDISK", seed=23)
        ds.close()
    tiers = make_tiers(tmp_path)
    tiers["tape"].read_only = True
    tiers["remote"].backend = _ReadOnlyPosix(tmp_path / "remote")
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.open_dataset("a", "r+")
        with pytest.raises(ReadOnlyError, match="'tape' is read-only: nothing is migrated"):
            ds.migrate(None, to="tape")
        with pytest.raises(ReadOnlyError, match="'tape' is read-only"):
            ds.migrate(None)  # (the slowest tier, by default)
        tiers["remote"].mark_refused(OSError(errno.EROFS, "Read-only file system"))
        assert tiers["remote"].writes_refused
        with pytest.raises(WritesRefusedError, match="'remote' refuses writes for now"):
            ds.migrate(np.s_[0:10, :], to="remote")
        assert all(w == ["local"] for w in where(ds).values()), where(ds)
        np.testing.assert_array_equal(ds[...], a)
        ds.close()


def _on_local_turned_read_only(tmp_path, shape, *, seed):
    """Dataset ``a`` (:func:`_written`) on the local tier, closed; then that tier's file
    system refuses writes (:class:`_ReadOnlyPosix`): the values and the tiers to open."""
    with session(tmp_path) as s:
        a, ds = _written(s, shape, "LOCALDISK", seed=seed)
        ds.close()
    tiers = make_tiers(tmp_path)
    tiers["local"].backend = _ReadOnlyPosix(tmp_path / "local")
    return a, tiers


@pytest.fixture
def clock(monkeypatch):
    """The tiers' monotonic clock (their waits), which the test moves on (``clock.now``, s)."""
    import strataio.tiers.tier as tier_module

    class Clock:
        now = 1000.0

        @classmethod
        def monotonic(cls):
            return cls.now

        time = staticmethod(time.time)

    monkeypatch.setattr(tier_module, "time", Clock)
    return Clock


def test_a_tier_whose_file_system_turns_read_only_is_read_and_takes_writes_again(tmp_path, clock):
    """A tier whose file system turns read-only (EROFS on every change, as ext4 remounted
    read-only after disk errors) while its reads work is not marked down: the write that
    found it so goes on to the next tier, and the tier is read-only for a while, as one
    configured so: its chunks are read (the write's too), it is not asked to write or delete
    again, an eviction from it is refused, a migration off it keeps its copies, and a check
    finds it up and still refusing. A deletion that finds it refusing leaves the object
    there, and the tier up. Once the file system is read-write again the tier takes writes
    after the wait, and the objects left are deleted. (The first write refused marked the
    tier down, and its probe, a put, kept it down: every chunk only it held was unreadable.)"""
    a, tiers = _on_local_turned_read_only(tmp_path, (20, 20), seed=18)
    local = tiers["local"]
    first = tmp_path / "local" / "a" / "c" / "0" / "0"
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.open_dataset("a", "r+")
        ds[0:10, 0:10] = 5.0
        a[0:10, 0:10] = 5.0
        ds.flush()
        assert where(ds)["c/0/0"] == ["remote"] and where(ds)["c/1/1"] == ["local"]
        assert local.up and local.writes_refused and not local.has_room(1)
        assert local.condition == "up (read-only: its storage refuses writes)"
        assert "Read-only file system" in local.last_error
        assert {t.name: t.state for t in s.catalog.tiers()}["local"] == "up"
        np.testing.assert_array_equal(ds[...], a)
        with session(tmp_path) as other:  # (another process reads it too)
            np.testing.assert_array_equal(other.open_dataset("a")[...], a)
        refused = local.backend.refused
        b = s.create_dataset("b", (10, 10), "f8", (10, 10), hint="LOCALDISK")
        b[...] = 1.0
        b.close()
        assert where(s.open_dataset("b")) == {"c/0/0": ["remote"]}
        assert first.is_file() and local.backend.refused == refused  # (not asked again)
        with pytest.raises(ReadOnlyError, match="'local' refuses writes"):
            ds.evict(None, "local").wait()
        ds.migrate(np.s_[10:20, 0:10], to="remote").wait()
        assert where(ds)["c/1/0"] == ["local", "remote"]
        assert s.check_tiers()["local"] and local.writes_refused and local.up
        # the wait over, still read-only: the deletion of the object the write left there,
        # tried again, is refused; the tier stays up, and the migration keeps its copies
        clock.now += Tier.RECHECK_MAX_S
        assert not local.writes_refused
        ds.migrate(np.s_[10:20, 10:20], to="remote").wait()
        assert local.up and local.writes_refused and local.backend.refused > refused
        assert where(ds)["c/1/1"] == ["local", "remote"] and first.is_file()
        np.testing.assert_array_equal(ds[...], a)
        # read-write again: after the wait it takes writes and deletions
        local.backend.refusing = False
        clock.now += Tier.RECHECK_MAX_S
        assert not local.writes_refused and local.condition == "up"
        ds[0:10, 0:10] = 6.0
        a[0:10, 0:10] = 6.0
        ds.migrate(np.s_[10:20, 10:20], to="remote").wait()
        assert where(ds)["c/0/0"] == ["local"] and where(ds)["c/1/1"] == ["remote"]
        ds.close()
        assert not (tmp_path / "local" / "a" / "c" / "1" / "1").exists()
        np.testing.assert_array_equal(s.open_dataset("a")[...], a)
        assert fsck(s.catalog, s.tiers).clean


def test_a_migration_off_a_tier_found_refusing_by_its_deletions_keeps_the_copies(tmp_path, clock):
    """A migration off a tier whose file system is read-only, in a process that has not met
    the refusal yet, keeps the copies there, catalogued, as one off a tier known to refuse
    does: the deletion refused (EROFS) makes the tier refuse writes and the copies' rows are
    recorded again, so no object is left an orphan. (Their rows were dropped and the 16
    objects stayed, for fsck to report as orphans.)"""
    a, tiers = _on_local_turned_read_only(tmp_path, (40, 40), seed=19)
    local = tiers["local"]
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.open_dataset("a", "r+")
        assert not local.writes_refused
        result = ds.migrate(None, to="tape").wait()
        assert result.moved == 16 and result.kept == 16 and result.removed == 0
        assert local.up and local.writes_refused and local.backend.refused > 0
        assert all(w == ["local", "tape"] for w in where(ds).values()), where(ds)
        np.testing.assert_array_equal(ds[...], a)
        ds.close()
    with session(tmp_path) as s:  # (another process: the catalog names them)
        assert all(w == ["local", "tape"] for w in where(s.open_dataset("a")).values())
        report = fsck(s.catalog, s.tiers)
        assert report.clean, report.findings


def test_a_tier_whose_writes_are_refused_and_reads_fail_is_down():
    """Storage that refuses a change (EROFS, EACCES, EPERM) while its reads fail too does
    not answer: the tier is marked down, as for any failure. Write permission denied on one
    object, for a call about that object alone (fsck's), is that object's: the tier stays
    up and takes writes."""

    class Refusing(MemoryBackend):
        reads = True

        def put(self, key, data, *, durable=False):
            if key.startswith(".strataio/"):  # (a probe's object: where permission is granted)
                return super().put(key, data, durable=durable)
            raise OSError(errno.EACCES, "Permission denied")

        def size(self, key):
            if not self.reads:
                raise OSError(errno.EIO, "Input/output error")
            return super().size(key)

    t = Tier("t", Refusing(), "remotedisk")
    with pytest.raises(ObjectError, match="cannot be used"):
        t.call_alone(t.backend.put, "x", b"1")
    assert t.up and not t.writes_refused
    with pytest.raises(WritesRefusedError):
        t.call(t.backend.put, "x", b"1")
    assert t.up and t.writes_refused and t.free == 0
    t.backend.reads = False
    t2 = Tier("t2", t.backend, "remotedisk")
    with pytest.raises(TierDownError) as got:
        t2.call(t2.backend.put, "x", b"1")
    assert not isinstance(got.value, WritesRefusedError)
    assert not t2.up and not t2.writes_refused


def test_a_read_only_tier_is_configured_and_its_directory_is_not_made(tmp_path):
    """``read_only = true`` in a tier's configuration makes it read-only; a read-only POSIX
    tier's directory is not made where it is missing (the tier is down, saying so)."""
    from strataio.config import load_config

    (tmp_path / "c.toml").write_text(
        "[catalog]\nurl = 'cat.db'\n"
        "[[tiers]]\nname = 'disk'\nkind = 'posix'\nrole = 'localdisk'\npath = 'disk'\n"
        "[[tiers]]\nname = 'ro'\nkind = 'posix'\nrole = 'remotetape'\npath = 'ro'\n"
        "read_only = true\n"
    )
    tiers = TierSet.from_config(load_config(tmp_path / "c.toml"))
    assert not tiers["disk"].read_only and tiers["ro"].read_only
    assert not tiers["ro"].up and "not a directory" in tiers["ro"].last_error
    assert not (tmp_path / "ro").exists()
    (tmp_path / "ro").mkdir()
    assert tiers["ro"].check() and not list((tmp_path / "ro").iterdir())


def test_the_directory_of_a_tier_the_catalog_knows_is_not_made(tmp_path):
    """A POSIX tier the catalog knows (``known``) whose directory is missing is built down,
    saying so and how to bring it back, the directory not made; one with a file in its
    place says that; one new to the catalog has its directory made."""
    from strataio.config import load_config

    (tmp_path / "c.toml").write_text(
        "[catalog]\nurl = 'cat.db'\n"
        "[[tiers]]\nname = 'disk'\nkind = 'posix'\nrole = 'localdisk'\npath = 'disk'\n"
        "[[tiers]]\nname = 'tape'\nkind = 'posix'\nrole = 'remotetape'\npath = 'tape'\n"
    )
    cfg = load_config(tmp_path / "c.toml")
    tiers = TierSet.from_config(cfg, known=["disk", "gone"])
    assert tiers["tape"].up and (tmp_path / "tape").is_dir()
    disk = tiers["disk"]
    assert not disk.up and not (tmp_path / "disk").exists()
    assert f"its directory {tmp_path / 'disk'} is missing" in disk.last_error
    assert "mount it or put it back" in disk.last_error and "strataio init" in disk.last_error
    assert not disk.check() and not (tmp_path / "disk").exists()  # (a probe makes none)
    assert "is missing" in disk.last_error
    (tmp_path / "disk").write_bytes(b"")
    disk = TierSet.from_config(cfg, known=["disk"])["disk"]
    assert not disk.up and disk.last_error.endswith("Not a directory")
    (tmp_path / "disk").unlink()
    (tmp_path / "disk").mkdir()
    assert TierSet.from_config(cfg, known=["disk"])["disk"].up


def _device_full(backend, monkeypatch):
    """Every put to ``backend`` fails as on a device with no space left (ENOSPC)."""

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    for name in ("put", "put_new", "put_versioned", "put_if", "put_file"):
        if hasattr(backend, name):
            monkeypatch.setattr(backend, name, full)


def test_a_tier_whose_device_is_full_takes_no_writes_and_is_read_as_before(tmp_path, monkeypatch):
    """A put that finds the local tier's device full (ENOSPC) does not mark the tier down:
    the write goes on to the next tier, and the chunks already there are read, in this
    process and a new one, and moved off as before; a probe finds the tier answering. (It
    was marked down, so its intact data could not be read or migrated.)"""
    with session(tmp_path) as s:
        a, ds = _written(s, (10, 10), "LOCALDISK", seed=14)
        ds.close()
        _device_full(s.tiers["local"].backend, monkeypatch)
        b = s.create_dataset("b", (10, 10), "f8", (10, 10), hint="LOCALDISK")
        b[...] = 1.0
        b.close()
        local = s.tiers["local"]
        assert local.up and local.out_of_space and not local.has_room(1)
        assert where(s.open_dataset("b")) == {"c/0/0": ["remote"]}
        np.testing.assert_array_equal(s.open_dataset("a")[...], a)
        assert local.check() and local.up
        with session(tmp_path) as other:
            np.testing.assert_array_equal(other.open_dataset("a")[...], a)
        ds = s.open_dataset("a")
        ds.migrate(None, to="remote").wait()
        assert where(ds) == {"c/0/0": ["remote"]}
        np.testing.assert_array_equal(ds[...], a)
        ds.close()
        assert fsck(s.catalog, s.tiers).clean


def test_probes_of_a_tier_that_stays_down_back_off(clock):
    """A tier that keeps failing its probe is probed less and less often (``RECHECK_S``,
    doubled after each failure, up to ``RECHECK_MAX_S``): each probe of a tier that does not
    answer may cost a caller its backend's timeout. Once it answers the wait starts over."""

    class Flaky(MemoryBackend):
        answers = False
        puts = 0

        def put(self, key, data, *, durable=False):
            self.puts += 1
            if not self.answers:
                raise OSError("no answer")
            return super().put(key, data, durable=durable)

    backend = Flaky()
    t = Tier("t", backend, "remotedisk")
    t.mark_down("gone")
    probes_at = []
    for step in range(0, 200):
        clock.now = 1000.0 + step
        before = backend.puts
        assert not t.recheck()
        if backend.puts > before:
            probes_at.append(step)
    assert probes_at[:6] == [2, 6, 14, 30, 62, 122]  # waits of 2, 4, 8, 16, 32, then 60 s
    assert probes_at[6:] == [182]
    backend.answers = True
    clock.now = 1000.0 + 242
    assert t.recheck() and t.up
    t.mark_down("gone again")
    clock.now += 2
    assert t.recheck()  # (probed after RECHECK_S again)


def test_probes_of_one_tier_by_two_readers_at_once_leave_it_up(tmp_path):
    """Two readers probing one tier at once (here: a second probe runs in the middle of the
    first) each use a probe object of their own: neither deletes the other's, so a tier that
    answers stays up."""

    class ProbedMeanwhile(PosixBackend):
        other: Tier | None = None

        def get(self, key):
            if self.other is not None and "health-probe" in key:
                other, self.other = self.other, None
                t = threading.Thread(target=other.check)
                t.start()
                t.join()
            return super().get(key)

    backend = ProbedMeanwhile(tmp_path / "t")
    first = Tier("t", backend, "localdisk")
    backend.other = Tier("t", PosixBackend(tmp_path / "t"), "localdisk")
    assert first.check() and first.up
    assert backend.other is None and list(backend.list()) == []  # (both probes cleaned up)


def test_a_read_racing_an_eviction_falls_back_to_the_archive(tmp_path):
    """An eviction may drop the fast copy between a read choosing it and reading it: the read
    must then take the archive copy, not skip it."""
    a = np.arange(20 * 20, dtype="f4").reshape(20, 20)
    with session(tmp_path, roles=("localdisk", "remotetape")) as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="REMOTETAPE")
        ds[...] = a
        ds.stage(None, to="local").wait()
        ds.close()
    evicted = []

    class EvictedWhileReading(PosixBackend):
        """The fast tier as a concurrent eviction leaves it: copy forgotten, object gone."""

        def get_many(self, keys):
            for k in keys:
                key = k.split("/", 1)[1]
                store.res.remove(key, "local", delete_object=False)
                evicted.append(key)
            return [None] * len(keys)

        def get(self, key):
            if key.endswith("zarr.json"):
                return super().get(key)
            self.get_many([key])
            raise NotFoundError(key)

        def readinto_range_versioned(self, key, offset, out, *, nowait=False):
            self.get_many([key])  # (a partial read's first, whole read of a copy)
            raise NotFoundError(key)

        # batches key by key, through the read above
        readinto_ranges_versioned = Backend.readinto_ranges_versioned

    tiers = TierSet(
        [
            Tier("local", EvictedWhileReading(tmp_path / "local"), "localdisk", order=0),
            Tier("tape", PosixBackend(tmp_path / "tape"), "remotetape", order=1),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.open_dataset("a")
        store = ds.store
        assert all("local" in ts for ts in where(ds).values())
        np.testing.assert_array_equal(ds[...], a)
        assert sorted(set(evicted)) == sorted(f"c/{i}/{j}" for i in range(2) for j in range(2))
        ds.close()


class CountingBackend(PosixBackend):
    """POSIX, counting the chunk bytes read whole (``get``) and by range."""

    def __init__(self, root):
        super().__init__(root)
        self.whole = self.ranged = self.gets = 0

    def get(self, key):
        data = super().get(key)
        if not key.endswith("zarr.json"):
            self.whole += len(data)
            self.gets += 1
        return data

    def readinto_range_versioned(self, key, offset, out, *, nowait=False):
        got = super().readinto_range_versioned(key, offset, out, nowait=nowait)
        if offset == 0 and len(out) == got[0]:  # the whole object (a first, checked read)
            self.whole += len(out)
        else:
            self.ranged += len(out)
        return got

    # batches key by key, through the count above
    readinto_ranges_versioned = Backend.readinto_ranges_versioned


@pytest.mark.parametrize("spare_keep", [None, 0], ids=["kept-buffer", "fresh-buffer"])
def test_tiered_partial_reads_check_each_copy_whole_once(tmp_path, monkeypatch, spare_keep):
    """A tiered dataset reads only the bytes a section touches once the copy was read whole
    and checked; a copy changed on disk afterwards is read whole and checked again. (First
    reads go whole into the thread's kept buffer, or into a fresh one above its size.)"""
    if spare_keep is not None:
        monkeypatch.setattr(strataio.tiers.store, "_SPARE_KEEP", spare_keep)
    a = np.arange(40 * 40, dtype="f4").reshape(40, 40)
    local = CountingBackend(tmp_path / "local")
    tiers = TierSet(
        [
            Tier("local", local, "localdisk", order=0),
            Tier("tape", PosixBackend(tmp_path / "tape"), "remotetape", order=1),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (20, 20), hint="LOCALDISK")
        ds[...] = a
        ds.close()
        assert ds.store.capabilities.partial_reads
        ds = s.open_dataset("a")
        np.testing.assert_array_equal(ds[3, :], a[3, :])
        assert (local.whole, local.ranged) == (2 * 1600, 0)  # two chunks, read whole once
        np.testing.assert_array_equal(ds[5, 10:30], a[5, 10:30])
        assert (local.whole, local.ranged) == (2 * 1600, 80)  # one row of 10 in each chunk
        np.testing.assert_array_equal(ds[...], a)  # (two chunks checked now, two new)
        assert local.whole == 6 * 1600  # (a box of a whole checked chunk reads it all too)
        # the medium changes one chunk under the reader (a new ctime marks the write)
        time.sleep(0.05)
        path = tmp_path / "local" / "a" / "c" / "0" / "1"
        raw = bytearray(path.read_bytes())
        raw[3 * 80 + 4] ^= 0xFF
        with open(path, "r+b") as f:
            f.write(raw)
        recorded = next(c.checksum for c in s.catalog.residency("a") if c.key == "c/0/1")
        with pytest.raises(ChecksumError, match=r"chunk 'c/0/1' of dataset 'a'") as info:
            ds[3, 25]
        # (the message gives each copy's bytes' checksum beside the one recorded for it)
        got = re.search(r"local holds (\w+), recorded (\w+)", str(info.value))
        assert got is not None and got[2] == recorded != got[1], str(info.value)
        np.testing.assert_array_equal(ds[30:, :20], a[30:, :20])  # the others read as before
        ds.close()
        ds = s.open_dataset("a", mode="r+")
        np.testing.assert_array_equal(ds[3, :20], a[3, :20])
        whole, gets = local.whole, local.gets
        ds[3, 5] = -1  # (a chunk checked before is updated from one read of it by range)
        assert (local.whole, local.gets) == (whole + 1600, gets)
        np.testing.assert_array_equal(ds[3, :20], np.where(np.arange(20) == 5, -1, a[3, :20]))
        with pytest.raises(ChecksumError, match=r"chunk 'c/0/1' of dataset 'a'"):
            ds[3, 25] = -1  # (a partial write reads the chunk it updates as a read does)
        assert path.read_bytes() == raw  # (nothing was put over it)
        ds.close()


@contextlib.contextmanager
def counted_session(tmp_path):
    """A Session over a counted local disk tier and a counted slower one, with dataset "a"
    (40 x 40 float32 in 20 x 20 chunks, hint LOCALDISK) written: (session, dataset, values,
    local backend, slow backend)."""
    a = np.arange(40 * 40, dtype="f4").reshape(40, 40)
    local, slow = CountingBackend(tmp_path / "local"), CountingBackend(tmp_path / "slow")
    tiers = TierSet(
        [Tier("local", local, "localdisk", order=0), Tier("slow", slow, "remotedisk", order=1)]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (20, 20), hint="LOCALDISK")
        ds[...] = a
        yield s, ds, a, local, slow


def test_a_checked_copy_moved_to_another_tier_is_read_there(tmp_path):
    """Range reads skip the copy checks only while the chunk's copies are unchanged: after a
    migration the next read finds the copy on its new tier, which the move read back and
    checked, and reads it there in range."""
    with counted_session(tmp_path) as (s, ds, a, local, slow):
        ds.close()
        ds = s.open_dataset("a")
        for _ in range(3):  # read whole and checked, then by range twice
            np.testing.assert_array_equal(ds[3, :], a[3, :])
        assert (local.whole, local.ranged, slow.whole) == (2 * 1600, 2 * 2 * 80, 0)
        ds.migrate(np.s_[:20, :], to="slow").wait()
        assert {c.tier for cs in ds.residency().values() for c in cs} == {"local", "slow"}
        assert not (tmp_path / "local" / "a" / "c" / "0" / "0").exists()
        moved = slow.whole  # (the move reads back what it put)
        assert moved == 2 * 1600
        np.testing.assert_array_equal(ds[3, :], a[3, :])
        assert slow.whole == moved and slow.ranged == 2 * 80  # in range on their new tier
        np.testing.assert_array_equal(ds[3, :], a[3, :])
        assert slow.whole == moved and slow.ranged == 2 * 2 * 80
        ds.close()


def test_a_chunks_stamp_moves_with_its_copies_and_puts_not_its_access_times(tmp_path):
    tiers = TierSet([Tier("local", PosixBackend(tmp_path / "t"), "localdisk", order=0)])
    res = Residency("a", [], tiers)
    seen = [res.stamp("c/0")]
    copy = ChunkCopy("a", "c/0", "local", 4, "x", "valid", 0.0)
    res.add(copy)
    seen.append(res.stamp("c/0"))
    res.touch(["c/0"], when=5.0)
    assert res.stamp("c/0") == seen[-1]
    with res.writing("c/0", "local"):
        seen.append(res.stamp("c/0"))
    seen.append(res.stamp("c/0"))
    res.remove("c/0", "local")
    seen.append(res.stamp("c/0"))
    assert len(set(seen)) == len(seen)
    assert res.stamp("c/1") == 0


def test_a_write_whose_announcement_fails_keeps_no_room_and_no_new_value(tmp_path, monkeypatch):
    """The catalog refusing a rewrite's announcement fails the write before any put: its
    room, and the room of the copies it would have replaced, are given back (also when those
    copies are evicted later), and every chunk keeps its value."""
    from strataio.tiers.commit import Commit

    a = np.arange(20 * 20, dtype="f4").reshape(20, 20)
    tiers = TierSet(
        [
            Tier("local", PosixBackend(tmp_path / "local"), "localdisk", capacity=4000, order=0),
            Tier("archive", PosixBackend(tmp_path / "archive"), "remotetape", order=1),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="LOCALDISK", codec=[])
        ds[...] = a
        ds.flush()
        local = s.tiers["local"]
        assert (local.used, local.reserved) == (1600, 0)

        def refuse(self, res, intents, *args, **kw):
            raise MetadataError("catalog unavailable")

        monkeypatch.setattr(Commit, "announce", refuse)
        with pytest.raises(MetadataError, match="catalog unavailable"):
            ds[...] = a + 1
        assert (local.used, local.reserved) == (1600, 0)
        monkeypatch.undo()
        np.testing.assert_array_equal(ds[...], a)
        ds.evict(np.s_[0:10, :], tier="local").wait()  # written back to the archive
        assert (local.used, local.reserved) == (800, 0)
        ds[10:20, 0:10] = -1
        ds.close()
        assert (local.used, local.reserved) == (800, 0)
        ds = s.open_dataset("a")
        want = a.copy()
        want[10:20, 0:10] = -1
        np.testing.assert_array_equal(ds[...], want)


def test_a_rewrite_announces_once_per_call_and_a_single_chunk_is_put_here(tmp_path, monkeypatch):
    """A write of many chunks hands the tiered store one batch (one announcement of the
    rewrites in place, puts overlapped on the mover's threads); a write of one chunk is put
    on the calling thread."""
    from strataio.tiers.commit import Commit

    announced: list[int] = []
    real = Commit.announce

    def counting(self, res, intents, *args, **kw):
        announced.append(len(intents))
        return real(self, res, intents, *args, **kw)

    monkeypatch.setattr(Commit, "announce", counting)
    threads: list[int] = []

    class Recording(PosixBackend):
        def put(self, key, data, *, durable=False):
            threads.append(threading.get_ident())
            super().put(key, data, durable=durable)

    a = np.arange(40 * 40, dtype="f4").reshape(40, 40)
    tiers = TierSet([Tier("local", Recording(tmp_path / "local"), "localdisk", order=0)])
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="LOCALDISK")
        ds[...] = a
        ds.flush()
        announced.clear()
        ds[...] = a + 1
        assert announced == [16]
        threads.clear()
        ds[2:5, 2:5] = 0
        assert threads == [threading.get_ident()]
        ds.close()
        ds = s.open_dataset("a")
        want = a + 1
        want[2:5, 2:5] = 0
        np.testing.assert_array_equal(ds[...], want)
        ds.close()


def test_the_decoded_chunk_cache_serves_a_tiered_dataset_until_its_copy_changes(
    tmp_path, monkeypatch
):
    """A tiered dataset's chunks are served from the process's decoded-chunk cache while the
    copy they were read from is the one a read would take; a copy put or moved is read again."""
    import strataio.arrays.chunk_cache as cc

    monkeypatch.setattr(cc, "SETTLE_NS", -(1 << 62))  # cache what was written moments ago
    with counted_session(tmp_path) as (s, ds, a, local, slow):
        ds.flush()
        ds.clear_cache()
        for _ in range(2):  # (a chunk is kept on its second read)
            np.testing.assert_array_equal(ds[...], a)
        read = (local.whole, local.ranged)
        np.testing.assert_array_equal(ds[...], a)
        assert (local.whole, local.ranged) == read  # all four chunks from the cache
        ds[0:2, 0:2] = -1  # a put: that chunk's entry goes
        a[0:2, 0:2] = -1
        np.testing.assert_array_equal(ds[...], a)
        assert local.whole > read[0]
        ds.migrate(np.s_[20:, :], to="slow").wait()  # moved: read from the new tier
        before = slow.whole + slow.ranged
        np.testing.assert_array_equal(ds[...], a)
        assert slow.whole + slow.ranged > before
        np.testing.assert_array_equal(ds[...], a)
        moved = slow.whole + slow.ranged
        np.testing.assert_array_equal(ds[...], a)
        assert slow.whole + slow.ranged == moved  # and cached again
        ds.close()


def test_chunk_versions_name_the_copy_a_read_takes_on_one_tier_or_several(tmp_path):
    """The versions the decoded-chunk cache keys on: per chunk, the tier's location and the
    object's version there, whether every chunk's checked copy sits on one tier (one call)
    or on several; None once the tier holding a copy is down."""
    with counted_session(tmp_path) as (s, ds, a, local, slow):
        ds.flush()
        keys = ["c/0/0", "c/0/1", "c/1/0", "c/1/1"]

        def backend_versions(backend, ks):
            return [(backend.url, *v) for v in backend.versions([f"a/{k}" for k in ks])]

        for _ in range(2):  # (checked whole, then read in range: checked copies)
            np.testing.assert_array_equal(ds[...], a)
        assert ds.store.chunk_versions(keys) == backend_versions(local, keys)
        ds.migrate(np.s_[20:, :], to="slow").wait()
        for _ in range(2):
            np.testing.assert_array_equal(ds[...], a)
        assert ds.store.chunk_versions(keys) == (
            backend_versions(local, keys[:2]) + backend_versions(slow, keys[2:])
        )
        s.tiers["slow"].mark_down("test")
        assert ds.store.chunk_versions(keys) == backend_versions(local, keys[:2]) + [None] * 2
        ds.close()


def test_a_chunk_rewritten_elsewhere_is_not_read_from_its_old_checked_copy(tmp_path):
    """A range read skips the copy checks only while the chunk's residency stamp holds: a
    chunk whose checked copy sits on one tier and is then rewritten onto another (the old
    object still on disk until the commit) reads its new values."""
    with counted_session(tmp_path) as (s, ds, a, local, slow):
        ds.flush()
        ds.migrate(np.s_[:20, :20], to="slow").wait()
        for _ in range(3):  # checked whole on slow, then by range on the fast path
            np.testing.assert_array_equal(ds[3, :20], a[3, :20])
        ds[0:20, 0:20] = -a[0:20, 0:20]  # the new chunk goes to local (its hint)
        assert (tmp_path / "slow" / "a" / "c" / "0" / "0").exists()  # (until the commit)
        np.testing.assert_array_equal(ds[3, :20], -a[3, :20])
        ds.close()


def test_a_batch_read_fails_over_when_its_tier_goes_down_meanwhile(tmp_path):
    """A tier another thread marks down between a batch's look at it and its read: every
    chunk of that batch is read alone, from the next copy."""
    a = np.arange(20 * 20, dtype="f4").reshape(20, 20)

    def tiers():
        return TierSet(
            [
                Tier("local", PosixBackend(tmp_path / "local"), "localdisk", order=0),
                Tier("slow", PosixBackend(tmp_path / "slow"), "remotedisk", order=1),
            ]
        )

    with strataio.Session(tiers=tiers(), catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="REMOTEDISK")
        ds[...] = a
        ds.stage(None, to="local").wait()
        ds.close()
    with strataio.Session(tiers=tiers(), catalog=tmp_path / "cat.db") as s:
        ds = s.open_dataset("a")
        store = ds.store
        keys = ["c/0/0", "c/0/1", "c/1/0"]
        outs = [bytearray(400) for _ in keys]
        for _ in range(2):  # checked whole, then in range: the copies on "local" are known
            store.read_spans_versioned(keys, [0] * 3, [memoryview(o) for o in outs])
        assert set(store._checked) == set(keys)
        # c/1/1's check is known once it is looked up: the stage read back every copy it
        # put, the catalog recorded those checks, and a chunk's checks come with its rows
        store.res.learn(["c/1/1"])
        assert store.verified_chunks() == {*keys, "c/1/1"}
        local = store.tiers["local"]
        call = local.call

        def failing_meanwhile(fn, *args, **kw):
            local.mark_down("EIO seen by another thread")
            return call(fn, *args, **kw)

        local.call = failing_meanwhile
        outs = [bytearray(400) for _ in keys]
        got = store.read_spans_versioned(keys, [0] * 3, [memoryview(o) for o in outs])
        for (key, out), (size, version) in zip(zip(keys, outs), got):
            i, j = map(int, key.split("/")[1:])
            want = a[10 * i : 10 * i + 10, 10 * j : 10 * j + 10]
            np.testing.assert_array_equal(np.frombuffer(out, "f4").reshape(10, 10), want)
            assert size == 400 and "slow" in version[0]
        ds.close()


def test_first_reads_on_a_tier_without_versions_read_each_copy_once(tmp_path):
    """Memory and object-store tiers keep no object versions: their copies are read whole
    and checked on every read, once per read."""
    reads = Counter()

    class Counting(MemoryBackend):
        def readinto_range_versioned(self, key, offset, out, *, nowait=False):
            reads[key] += 1
            return super().readinto_range_versioned(key, offset, out, nowait=nowait)

        def get_many(self, keys):
            reads.update(keys)
            return super().get_many(keys)

    a = np.arange(400, dtype="f4").reshape(20, 20)
    tiers = TierSet([Tier("remote", Counting("r"), "remotedisk", order=0)])
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="REMOTEDISK", codec=None)
        ds[...] = a
        ds.clear_cache()
        reads.clear()
        np.testing.assert_array_equal(ds[2:18, 3:17], a[2:18, 3:17])
        assert reads == Counter(f"a/c/{i}/{j}" for i in range(2) for j in range(2))
        reads.clear()
        np.testing.assert_array_equal(ds[2:18, 3:17], a[2:18, 3:17])  # checked again
        assert reads == Counter(f"a/c/{i}/{j}" for i in range(2) for j in range(2))
        ds.close()


def test_a_write_larger_than_every_tier_says_which_chunks_keep_their_values(tmp_path):
    """Room is claimed tier by tier as chunks are put: a write that outgrows every tier the
    hint allows stores what fits and says how many chunks were written and which were not;
    those read back as they were, and nothing else is lost."""
    tiers = TierSet(
        [
            Tier("local", PosixBackend(tmp_path / "local"), "localdisk", capacity=4 << 10),
            Tier("tape", PosixBackend(tmp_path / "tape"), "remotetape", capacity=8 << 10, order=1),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("x", (64, 64), "f4", (16, 16), hint="LOCALDISK")  # 1 KiB chunks
        with pytest.raises(BackendError, match=r"4 of 16 chunks could not be stored") as info:
            ds[...] = np.ones((64, 64), "f4")
        msg = str(info.value)
        assert "the other 12 were written" in msg and "keep their previous values" in msg
        assert isinstance(info.value, ChunksNotStoredError) and len(info.value.keys) == 4
        got = ds[...]
        assert (got == 1).sum() == 12 * 256 and (got == 0).sum() == 4 * 256
        for key in info.value.keys:  # the chunks named are those that read as before
            i, j = (int(x) * 16 for x in key.split("/")[1:])
            assert (got[i : i + 16, j : j + 16] == 0).all()
        ds.close()
        assert fsck(s.catalog, s.tiers).clean


def test_a_write_that_stores_one_chunk_of_two_says_so_in_the_singular(tmp_path):
    """The message of a write that stored some of its chunks agrees with their number (it
    said "the other 1 were written")."""
    tiers = TierSet([Tier("local", PosixBackend(tmp_path / "local"), "localdisk", capacity=1024)])
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("x", (2, 256), "f4", (1, 256), hint="LOCALDISK")  # 1 KiB chunks
        with pytest.raises(ChunksNotStoredError) as info:
            ds[...] = np.ones((2, 256), "f4")
        msg = str(info.value)
        assert "1 of 2 chunks could not be stored" in msg, msg
        assert re.search(r"the other 1 was written, and c/[01]/0 keeps its previous value", msg)
        ds.close()


def test_a_chunk_larger_than_a_tier_s_capacity_is_named_as_the_reason(tmp_path):
    """A tier smaller than one chunk is not "full": the error says it can never hold it."""
    tiers = TierSet(
        [Tier("local", PosixBackend(tmp_path / "local"), "localdisk", capacity=1 << 10)]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("x", (64, 64), "i4", (32, 32), hint="LOCALDISK")  # 4 KiB chunks
        with pytest.raises(ChunksNotStoredError) as info:
            ds[...] = np.ones((64, 64), "i4")
        msg = str(info.value)
        assert "tier 'local' holds 1024 bytes in all, less than a chunk of 4096 bytes" in msg
        assert "all tiers full" not in msg
        ds.close()


def test_a_copy_deleted_before_it_is_read_back_is_not_recorded(tmp_path, monkeypatch):
    """A move's put is read back before it is recorded. Where another process deleted the
    object meanwhile, the move says so as a ChecksumError (its callers leave that copy
    unrecorded), not with the backend's bare NotFoundError naming an internal object."""
    from strataio.tiers.tier import put_checked

    tier = Tier("t", PosixBackend(tmp_path / "t"), "localdisk")
    get = tier.backend.get

    def deleted_first(key):
        tier.backend.delete(key)  # (the other process)
        return get(key)

    monkeypatch.setattr(tier.backend, "get", deleted_first)
    with pytest.raises(ChecksumError, match="another process deleted the copy just put"):
        put_checked(tier, "a", "c/0/0", b"x" * 64)


def test_a_read_whose_copies_change_between_two_looks_looks_again(tmp_path, monkeypatch):
    """A read looks at a chunk's copies twice per round (whether to ask the catalog, then
    which copy to read). Where another thread changes them in between (the second look
    finds none left to try), the read looks again instead of saying the chunk is lost."""
    from strataio.tiers.residency import Residency

    a = np.arange(20 * 20, dtype="f4").reshape(20, 20)
    with strataio.Session(
        tiers=TierSet([Tier("local", PosixBackend(tmp_path / "local"), "localdisk")]),
        catalog=tmp_path / "cat.db",
    ) as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="LOCALDISK")
        ds[...] = a
        ds.clear_cache()
        ds.store.stage_on_read = False  # (no archive here: the two looks are the only ones)
        readable = Residency.readable
        calls = []

        def hidden_at_the_second_look(self, key, **kw):
            if key == "c/0/0":
                calls.append(key)
                if len(calls) == 2:
                    return []  # (another thread had it then)
            return readable(self, key, **kw)

        monkeypatch.setattr(Residency, "readable", hidden_at_the_second_look)
        (blob,) = ds.store.get_chunks(["c/0/0"])  # (raised "no readable intact copy")
        assert blob is not None and len(calls) >= 3
        monkeypatch.undo()
        np.testing.assert_array_equal(ds[0:10, 0:10], a[0:10, 0:10])
        ds.close()


def test_a_span_read_of_a_chunk_moved_to_the_archive_stages_it(tmp_path):
    """A migration reads back the archive copy it put, which counts as that copy's check;
    a span read of the chunk still stages it to disk first (APRIL's read path), as a read
    of an archive copy no process checked does, rather than reading the archive in range."""
    a = np.random.default_rng(2).random((20, 20)).astype("f4")
    with session(tmp_path) as s:
        ds = s.create_dataset("a", a.shape, a.dtype, (10, 10), hint="LOCALDISK")
        ds[...] = a
        ds.flush()
        ds.migrate(np.s_[0:10, 0:10], to="tape").wait()
        assert where(ds)["c/0/0"] == ["tape"]
        np.testing.assert_array_equal(ds[2:5, 3:7], a[2:5, 3:7])
        assert "local" in where(ds)["c/0/0"]


_LEFT_OPEN = """
import gc, sys, numpy as np, strataio
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet
root = sys.argv[1]
def write():
    s = strataio.Session(
        tiers=TierSet([Tier("local", PosixBackend(root + "/local"), "localdisk")]),
        catalog=root + "/cat.db",
    )
    ds = s.create_dataset("a", (40, 40), "i4", (10, 10), hint="LOCALDISK")
    ds[...] = np.full((40, 40), 7, "i4")
    ds.flush()
    ds[0:10, 0:20] = 9  # (not flushed, and neither the dataset nor the session is closed)
write()  # (the session dropped unclosed)
gc.collect()
"""


def test_a_forked_child_holds_none_of_its_parent_s_sessions(tmp_path):
    """A child forked while a Session is open holds none of its parent's sessions, so its
    exit closes none (closing would release the parent's writer and its datasets in use)."""
    import os

    from strataio import session as session_module

    tiers = TierSet([Tier("local", PosixBackend(tmp_path / "local"), "localdisk")])
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        assert id(s) in session_module._UNCLOSED
        pid = os.fork()
        if pid == 0:  # (the child leaves at once, as after exec: MPI forbids more after fork)
            os._exit(0 if not session_module._UNCLOSED else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert id(s) in session_module._UNCLOSED
    assert id(s) not in session_module._UNCLOSED


def test_a_session_left_open_at_exit_is_closed_and_its_writes_recorded(tmp_path):
    """A program that drops its Session unclosed and exits has its writes recorded, as Python
    flushes an unclosed file: the chunks read back as written, not as never written, and
    fsck finds nothing to adopt. The warning is a ResourceWarning (shown in dev mode)."""
    import subprocess
    import sys

    for flags in ([], ["-X", "dev"]):
        root = tmp_path / ("dev" if flags else "plain")
        root.mkdir()
        done = subprocess.run(
            [sys.executable, *flags, "-c", _LEFT_OPEN, str(root)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert ("was never closed: closed at exit" in done.stderr) == bool(flags), done.stderr
        want = np.full((40, 40), 7, "i4")
        want[0:10, 0:20] = 9
        tiers = TierSet([Tier("local", PosixBackend(root / "local"), "localdisk")])
        with strataio.Session(tiers=tiers, catalog=root / "cat.db") as s:
            ds = s.open_dataset("a")
            np.testing.assert_array_equal(ds[...], want)
            ds.close()
            assert fsck(s.catalog, s.tiers).clean


class _SyncRefusing(_ReadOnlyPosix):
    def sync(self, keys=None):
        if self.refusing:
            raise OSError(errno.EROFS, "Read-only file system")
        return super().sync(keys)


def test_a_sync_refused_by_a_read_only_file_system_does_not_mark_the_tier_down(tmp_path, clock):
    """A commit's sync refused with EROFS (fsync on an ext4 aborted after disk errors and
    remounted read-only) makes the tier refuse writes, as every other refused change does,
    rather than marking it down: the flush still fails (those puts may not be durable), and
    the chunks only the tier holds are read all along, at that flush and at the next."""
    with session(tmp_path) as s:
        a, ds = _written(s, (20, 20), "LOCALDISK", seed=8)
        ds.close()
    tiers = make_tiers(tmp_path)
    local = tiers["local"]
    local.backend = _SyncRefusing(tmp_path / "local")
    local.backend.refusing = False
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.open_dataset("a", "r+")
        ds[0:10, 0:10] = 5.0  # put, not synced yet
        local.backend.refusing = True  # the file system turns read-only before the flush
        with pytest.raises(StrataError):
            ds.flush()  # (the chunk may not be durable: refused, rightly)
        assert local.up and local.writes_refused, local.condition
        # a chunk only the tier holds is read as before
        np.testing.assert_array_equal(ds[10:20, 10:20], a[10:20, 10:20])
        clock.now += Tier.RECHECK_S + 0.1
        with pytest.raises(StrataError):
            ds.flush()
        assert local.up, local.condition
        np.testing.assert_array_equal(ds[10:20, 10:20], a[10:20, 10:20])
        local.backend.refusing = False  # (read-write again: the close's flush goes through)
        clock.now += Tier.RECHECK_MAX_S


def test_a_tier_s_condition_says_why_it_takes_no_writes_up_or_down(tmp_path):
    """Tier.condition, which `strataio tiers` shows: a configured read-only tier keeps its
    "(read-only)" when it is down too."""
    t = Tier("arch", PosixBackend(tmp_path / "arch"), "remotetape", order=0, read_only=True)
    assert t.condition == "up (read-only)"
    t.mark_down("gone")
    assert t.condition == "down (read-only)"
    w = Tier("disk", PosixBackend(tmp_path / "disk"), "localdisk", order=1)
    w.mark_down("gone")
    assert w.condition == "down"


def test_a_chunk_whose_only_copy_is_missing_says_how_it_can_be_mended(tmp_path):
    """A read of a chunk whose one copy is missing says the value is lost there and, with no
    other copy to repair it from, to write the chunk again or delete the dataset (it said
    that fsck --repair keeps the other value, of which there is none)."""
    with session(tmp_path) as s:
        a, ds = _written(s, (10, 10), "LOCALDISK", seed=3)
        ds.close()
        (tmp_path / "local" / "a" / "c" / "0" / "0").unlink()
        ds = s.open_dataset("a")
        with pytest.raises(StrataError, match="no copy is left to repair it from: write"):
            ds[...]
        ds.close()


@pytest.mark.mpi
def test_a_parallel_close_whose_object_has_a_file_in_its_folder_s_place_fails_on_every_rank(
    tmp_path,
):
    """A file put where a rank's new chunk's folder goes before the close fails the close on
    every rank, the tier still up: the ranks report no write the commit leaves out, and the
    sync passed such a key over, so the close returned with the write recorded nowhere."""
    out = run_mpi(2, "tiers_file_at_folder.py", tmp_path, timeout=60)
    assert out.strip().splitlines()[-1] == "ok"


def test_a_plain_flush_with_a_file_where_a_chunk_s_folder_goes_fails(tmp_path):
    """A plain dataset's flush fails, naming the object, where a file stands in its folder's
    place: its sync passed such a key over, so the flush returned as though it was stored."""
    ds = strataio.create_dataset(tmp_path / "a", (20, 10), "f4", (10, 10))
    ds[10:20, :] = 1.0
    (obj,) = [p for p in (tmp_path / "a" / "c").rglob("*") if p.is_file()]
    shutil.rmtree(obj.parent)
    obj.parent.write_bytes(b"")
    with pytest.raises((StrataError, OSError), match="Not a directory"):
        ds.flush()


@pytest.mark.mpi
def test_a_parallel_close_whose_written_objects_are_gone_fails_on_every_rank(tmp_path):
    """The new objects of two ranks' rewrites deleted before the close: the commit cannot
    record those writes, and the close raises ChunksNotStoredError on every rank naming both
    chunks (it returned, the writes lost in silence); their chunks keep their old values."""
    out = run_mpi(2, "tiers_lost_writes.py", tmp_path, timeout=60)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.mpi
def test_a_parallel_flush_after_a_collective_write_says_every_ranks_lost_writes(tmp_path):
    """As above, but a collective write_all records every rank's changes before the flush:
    the flush raises ChunksNotStoredError on every rank naming both chunks (the other rank's
    rewrite of a chunk with a previous value was lost in silence: its replaced values stayed
    on its rank)."""
    out = run_mpi(2, "tiers_lost_writes.py", tmp_path, "write_all", timeout=60)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.mpi
def test_a_collective_move_after_lost_writes_raises_them_on_every_rank(tmp_path):
    """As above, but a collective migrate follows: it raises ChunksNotStoredError on every
    rank naming both chunks and moves nothing (rank 0's move raised it alone, and the other
    ranks failed to unpickle it)."""
    out = run_mpi(2, "tiers_lost_writes.py", tmp_path, "migrate", timeout=60)
    assert out.strip().splitlines()[-1] == "ok"


def test_errors_naming_chunks_reach_the_other_ranks_of_a_job():
    """ChunksNotStoredError and ObjectError keep their chunk keys through a pickle (a
    broadcast to the other ranks), and a rank that did not fail raises a ChunksNotStoredError
    another rank's failure names (it raised TypeError: the class took no message alone)."""
    import pickle

    from strataio.agreed import raise_agreed

    for cls in (ChunksNotStoredError, ObjectError):
        got = pickle.loads(pickle.dumps(cls("dataset 'd': c/0 not stored", ["c/0"])))
        assert type(got) is cls and str(got) == "dataset 'd': c/0 not stored"
        assert got.keys == ["c/0"]

    class OneRankFailed:  # (rank 1 failed; this is rank 0, which did not)
        def allgather(self, mine):
            return [mine, (ChunksNotStoredError, "dataset 'd': c/0 not stored")]

    with pytest.raises(ChunksNotStoredError, match=r"c/0 not stored \(raised on rank 1\)"):
        raise_agreed(OneRankFailed(), None)


def test_copies_a_failed_close_could_not_delete_stay_the_session_s_to_delete(tmp_path, monkeypatch):
    """A rewrite while the tape is away leaves the tape's copy obsolete and undeletable; the
    handle's close then fails. The session still keeps that copy to delete (it was dropped
    with the failed close, an orphan until fsck --repair): the next handle of the dataset,
    the tape back, deletes it at its commit."""
    from strataio.tiers.commit import Commit

    monkeypatch.setattr(Tier, "RECHECK_S", 0.0)  # (the tape back is used at once)
    with session(tmp_path) as s:
        ds = s.create_dataset("a", (10, 10), "f4", (10, 10), hint="REMOTETAPE")
        ds[...] = 1.0
        ds.close()
        stop_answering(tmp_path / "tape")
        ds = s.open_dataset("a", "r+")
        ds[...] = 2.0  # (failed over to another tier: the tape's copy obsolete, the tape away)
        ds.flush()
        assert ds.store.res.is_stranded("tape", "c/0/0")
        close = Commit.close

        def failing(self, res):
            close(self, res)
            raise BackendError("the close failed")

        monkeypatch.setattr(Commit, "close", failing)
        with pytest.raises(BackendError, match="the close failed"):
            ds.close()
        monkeypatch.setattr(Commit, "close", close)
        answer_again(tmp_path / "tape")
        assert (tmp_path / "tape" / "a" / "c" / "0" / "0").is_file()
        ds = s.open_dataset("a")
        np.testing.assert_array_equal(ds[...], 2.0)
        ds.close()
        assert not (tmp_path / "tape" / "a" / "c" / "0" / "0").exists()


def test_a_tier_the_catalog_knows_and_the_tiers_lack_is_a_stand_in_that_stays_down(tmp_path):
    """A Session given tiers that lack one the catalog registers holds a stand-in for it,
    slowest: down (not configured), never probed up (nothing asked of any storage), its
    backend refusing every call, its catalog row left as it was, no role's tier."""

    def tiers(*names):
        roles = {"disk": "localdisk", "tape": "remotetape"}
        return TierSet(
            [Tier(n, PosixBackend(tmp_path / n), roles[n], order=i) for i, n in enumerate(names)]
        )

    with strataio.Session(tiers=tiers("disk", "tape"), catalog=tmp_path / "c.db") as s:
        ds = s.create_dataset("x", (8,), "f4", (4,), hint="LOCALDISK")
        ds[...] = 1
        ds.close()
    given = tiers("tape")
    with strataio.Session(tiers=given, catalog=tmp_path / "c.db") as s:
        assert s.tiers.names == ["tape", "disk"] and given.names == ["tape"]
        disk = s.tiers["disk"]
        assert disk.condition == "down (not configured)" and "not configured" in disk.last_error
        assert not disk.check() and not disk.recheck() and not disk.probe_due()
        disk.mark_up()
        assert not disk.up and s.tiers.by_role("localdisk") == []
        with pytest.raises(TierDownError, match="not configured"):
            disk.backend.get("x/c/0")
        with pytest.raises(TierDownError):
            disk.call(disk.backend.list)
        assert {r.name: r.state for r in s.catalog.tiers()}["disk"] == "up"
        assert [r.name for r in s.tiers.records()] == ["tape"]
        assert s.usage()["disk"] == 32
        ds = s.open_dataset("x")
        with pytest.raises(BackendError, match="disk"):  # (its only copies are there)
            ds[...]
        ds.close()
    assert sorted(p.name for p in (tmp_path / "disk" / "x" / "c").iterdir()) == ["0", "1"]


def test_a_name_with_a_part_longer_than_a_file_name_is_refused_and_no_tier_goes_down(tmp_path):
    """A name part of more than 255 bytes cannot be a file name: the first put of such a
    dataset or superfile failed as if the POSIX tier had, and marked it down for every
    process. Such a name is refused before anything is stored; 255 bytes are taken."""
    from strataio.errors import ArgumentError

    long = "run/" + "é" * 128  # (256 bytes of UTF-8)
    with session(tmp_path) as s:
        with pytest.raises(ArgumentError, match="a part of 256 bytes"):
            s.create_dataset(long, (4,), "f4", (2,), hint="LOCALDISK")
        with pytest.raises(ArgumentError, match="a part of 256 bytes"):
            s.superfile(long, hint="LOCALDISK")
        assert s.catalog.list_datasets() == []
        with s.superfile("a" * 255, hint="LOCALDISK") as sf:
            sf.put("m", b"x")
        with s.create_dataset("b" * 255, (4,), "f4", (2,), hint="LOCALDISK") as ds:
            ds[...] = 1
        assert all(t.up for t in s.tiers)
    with session(tmp_path) as s:
        assert all(t.up for t in s.tiers)
        assert s.superfile("a" * 255, "r").get("m") == b"x"


def test_a_path_too_long_for_the_file_system_fails_its_object_and_leaves_the_tier_up(tmp_path):
    """A put whose path is over PATH_MAX (ENAMETOOLONG) is that object's refusal, not the
    tier's failure: it marked the tier down in the catalog for every process. It raises
    ObjectError naming the object and the limit; the tier stays up and takes other puts."""
    name = "/".join(c * 250 for c in "abcdefghijklmnopq")  # (each part fits a file name)
    with session(tmp_path) as s:
        local = s.tiers["local"]
        with pytest.raises(ObjectError, match="over the 4095 bytes a path may have") as refused:
            local.call(local.backend.put_new, f"{name}/c/0", b"x", durable=True)
        assert "tier 'local'" in str(refused.value) and "/c/0'" in str(refused.value)
        with pytest.raises(ObjectError, match="4095 bytes"):
            local.call(local.backend.put_versioned, f"{name}/zarr.json", b"x", durable=True)
        assert local.up and local.last_error == ""
        with s.create_dataset("short", (4,), "f4", (2,), hint="LOCALDISK") as ds:
            ds[...] = 1
        assert where(s.open_dataset("short")) == {"c/0": ["local"], "c/1": ["local"]}
    with session(tmp_path) as s:
        assert all(t.state == "up" for t in s.catalog.tiers())
        assert s.tiers["local"].up


def test_a_name_over_a_path_s_limit_is_refused_at_create_and_no_tier_goes_down(tmp_path):
    """Each part of a name fits a file name, the whole with a tier's directory does not fit
    a path (PATH_MAX): its create put zarr.json, failing as if the tiers had, and marked
    every tier down for every process. It is refused before anything is stored, naming the
    tier and the limit."""
    from strataio.errors import ArgumentError

    name = "/".join(c * 250 for c in "abcdefghijklmnopq")
    with session(tmp_path) as s:
        with pytest.raises(ArgumentError, match="over the 4095 bytes a path may have") as refused:
            s.create_dataset(name, (4,), "f4", (2,), hint="LOCALDISK")
        assert "tier 'local'" in str(refused.value), str(refused.value)
        with pytest.raises(ArgumentError, match="4095 bytes"):
            s.superfile(name, hint="LOCALDISK")
        assert s.catalog.list_datasets() == []
        assert all(t.up for t in s.tiers)
    with session(tmp_path) as s:
        assert all(t.state == "up" for t in s.catalog.tiers())
