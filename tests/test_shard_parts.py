"""The temporary files of collective shard writes (``<shard>.<token>.part``): the shared lock
every rank writing one holds until the call ends, judged by the rule of a put's temporary
file, and what happens to a call whose file is gone before its index is written."""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import strataio
from strataio.arrays import collective_shards, shard_parts
from strataio.arrays.shard_parts import PartLocks, is_part_file, part_files, part_path
from strataio.errors import BackendError
from strataio.storage.posix import LeftoverState, judge_leftover


def test_part_names() -> None:
    assert part_path("/d/c/0/1", "0badc0de") == "/d/c/0/1.0badc0de.part"
    assert is_part_file("c/0/1.0badc0de.part") and is_part_file("c.0.1.0badc0de.part")
    for name in ("c/0/1", "c/0/1.part", "c/0/1.0badc0de.part.x", "c/0/1.1.2.strataio-tmp"):
        assert not is_part_file(name), name


def test_a_part_file_is_live_while_any_of_its_writers_holds_it(tmp_path) -> None:
    """Each rank writing a .part file holds a shared lock on it: the judge's exclusive lock is
    refused while any of them holds it, and a file nobody holds is deleted at once."""
    path = part_path(str(tmp_path / "c" / "0" / "0"), "0badc0de")
    ranks = [PartLocks(), PartLocks()]  # (separate open files, as two processes have)
    for r in ranks:
        r.hold(path)
        r.hold(path)  # (held once)
        assert len(r) == 1
    assert list(part_files(str(tmp_path))) == [path]
    ranks[0].release()  # (one rank killed: the other still writes it)
    for remove in (False, True):
        assert judge_leftover(path, remove=remove) is LeftoverState.LIVE
    ranks[1].release()
    assert judge_leftover(path) is LeftoverState.DEAD and os.path.exists(path)
    assert judge_leftover(path, remove=True) is LeftoverState.DEAD
    assert not os.path.exists(path)


def test_a_part_file_judged_before_its_lock_is_opened_again(tmp_path, monkeypatch) -> None:
    """Between opening a .part file and locking it a rank holds nothing: a judge there
    deletes it (nothing was written to it), and the rank, finding it unlinked under its
    lock, opens the name again."""
    path = part_path(str(tmp_path / "c" / "0" / "0"), "0badc0de")
    real_flock = shard_parts.fcntl.flock
    judged: list[LeftoverState] = []

    def flock(fd, op):
        if op == shard_parts.fcntl.LOCK_SH and not judged:  # the rank's own lock
            judged.append(judge_leftover(path, remove=True))
        return real_flock(fd, op)

    monkeypatch.setattr(shard_parts.fcntl, "flock", flock)
    held = PartLocks()
    held.hold(path)
    assert judged == [LeftoverState.DEAD]
    assert os.path.exists(path) and judge_leftover(path) is LeftoverState.LIVE
    held.release()


def _sharded(tmp_path, a):
    ds = strataio.create_dataset(
        tmp_path / "a", a.shape, "i8", (3, 4), shards=(6, 8), codec="zstd", comm=MPI.COMM_SELF
    )
    ds.write_all(..., a)
    return ds


@pytest.mark.parametrize("value", [1, 0])
def test_a_shard_write_holds_its_part_files_until_it_ends(tmp_path, monkeypatch, value) -> None:
    """While the indexes are written every .part file is live (a judge deletes nothing),
    those of shards whose inner chunks are all the fill value (no run: only the leader
    writes to it, the index) included; once renamed they are gone."""
    a = np.arange(12 * 12, dtype="i8").reshape(12, 12)
    ds = _sharded(tmp_path, a)
    seen: list[LeftoverState] = []
    real = collective_shards._write_indexes

    def write_indexes(comm, store, codec, rows, keys, temps, *args):
        seen.extend(judge_leftover(t, remove=True) for t in temps)
        real(comm, store, codec, rows, keys, temps, *args)
        seen.extend(judge_leftover(t) for t in temps)

    monkeypatch.setattr(collective_shards, "_write_indexes", write_indexes)
    b = (a + 1) * value
    ds.write_all(..., b)
    assert seen == [LeftoverState.LIVE] * 4 + [LeftoverState.GONE] * 4
    np.testing.assert_array_equal(ds.read_all(...), b)
    assert list(part_files(str(tmp_path))) == [] and ds.nchunks_stored() == 4


def test_a_shard_whose_part_file_is_gone_before_its_index_is_not_replaced(
    tmp_path, monkeypatch
) -> None:
    """A .part file deleted before its index is written (by hand: fsck never deletes a held
    one) fails the call, never a shard of an index alone; the old shard stays."""
    a = np.arange(12 * 12, dtype="i8").reshape(12, 12)
    ds = _sharded(tmp_path, a)
    real = collective_shards._write_runs

    def write_runs(comm, group, codec, runs, temps, *args, **kw):
        rows = real(comm, group, codec, runs, temps, *args, **kw)
        os.unlink(temps[0])
        return rows

    monkeypatch.setattr(collective_shards, "_write_runs", write_runs)
    with pytest.raises(BackendError, match="was deleted before its index was written"):
        ds.write_all(np.s_[0:6, 0:8], -1)
    np.testing.assert_array_equal(ds.read_all(...), a)
    assert list(part_files(str(tmp_path))) == []
