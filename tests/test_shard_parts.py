"""The temporary files of collective shard writes (``<shard>.<token>.part``) and their call's
lock file (``.<token>.lock``), on which every rank holds a shared lock until the call ends:
how a judge tells a running call's files from a killed one's, the races of making the lock
file, the descriptors a call holds, and what happens to a call whose file is gone before its
index is written."""

from __future__ import annotations

import fcntl
import os

import numpy as np
import pytest
from mpi4py import MPI

import strataio
from strataio.arrays import collective_shards, shard_parts
from strataio.arrays.shard_parts import (
    CallLock,
    call_locks,
    is_lock_file,
    is_part_file,
    judge,
    lock_path,
    part_files,
    part_path,
)
from strataio.errors import BackendError, ShapeMismatchError
from strataio.storage.posix import LeftoverState

TOKEN = "0badc0de"


def test_part_and_lock_names() -> None:
    assert part_path("/d/c/0/1", TOKEN) == "/d/c/0/1.0badc0de.part"
    assert is_part_file("c/0/1.0badc0de.part") and is_part_file("c.0.1.0badc0de.part")
    for name in ("c/0/1", "c/0/1.part", "c/0/1.0badc0de.part.x", "c/0/1.1.2.strataio-tmp"):
        assert not is_part_file(name), name
    assert lock_path("/d", TOKEN) == "/d/.0badc0de.lock"
    assert is_lock_file("/d/.0badc0de.lock") and is_lock_file(".0badc0de.lock")
    for name in ("/d/0badc0de.lock", "/d/.0badc0de.lock.x", "/d/.0badc0de.part", "/d/x.lock"):
        assert not is_lock_file(name), name


def _part(folder) -> str:
    path = part_path(str(folder / "c" / "0" / "0"), TOKEN)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"run")
    return path


def test_a_calls_files_are_live_while_any_rank_holds_its_lock(tmp_path) -> None:
    """Each rank holds a shared lock on the call's lock file: a judge's exclusive lock is
    refused while any of them holds it, and the files of a call nobody holds (its lock file
    left by a killed rank 0) are dead and deleted at once, the lock file too."""
    folder = str(tmp_path)
    lock = lock_path(folder, TOKEN)
    ranks = [CallLock.create(lock), CallLock.join(lock)]  # (rank 0, which makes it, and 1)
    part = _part(tmp_path)
    assert list(part_files(folder)) == [part] and list(call_locks(folder)) == [lock]
    for remove in (False, True):
        assert judge(part, folder, remove=remove) is LeftoverState.LIVE
        assert judge(lock, folder, remove=remove) is LeftoverState.LIVE
    ranks[1].release()  # (a rank ended: rank 0 still writes)
    assert judge(part, folder, remove=True) is LeftoverState.LIVE
    ranks[0].release()  # (rank 0 killed: its lock file stays)
    assert judge(part, folder) is LeftoverState.DEAD and os.path.exists(part)
    assert judge(lock, folder) is LeftoverState.DEAD and os.path.exists(lock)
    assert judge(lock, folder, remove=True) is LeftoverState.DEAD
    assert not os.path.exists(lock)
    # (no lock file: the call is over, its .part files dead)
    assert judge(part, folder) is LeftoverState.DEAD and os.path.exists(part)
    assert judge(part, folder, remove=True) is LeftoverState.DEAD
    assert not os.path.exists(part)
    assert judge(part, folder) is LeftoverState.GONE
    assert judge(lock, folder) is LeftoverState.GONE
    with pytest.raises(ValueError):
        judge(str(tmp_path / "c" / "0" / "0"), folder)


def test_a_lock_file_deleted_before_rank_0_locks_it_is_made_again(tmp_path, monkeypatch) -> None:
    """Between making the lock file and locking it rank 0 holds nothing: a judge there may
    delete it (on NFS: rename it away, its link count staying 1), and rank 0, finding under
    its lock that the name no longer holds its file, makes it again."""
    lock = lock_path(str(tmp_path), TOKEN)
    real_flock = shard_parts.fcntl.flock
    gone: list[str] = []

    def flock(fd, op):
        if op == fcntl.LOCK_SH and len(gone) < 2:  # rank 0's own lock
            if gone:
                hidden = str(tmp_path / ".nfs0")
                os.rename(lock, hidden)  # (what NFS makes of an unlink of an open file)
            else:
                os.unlink(lock)  # (what a judge of another process that got it does)
                hidden = ""
            gone.append(hidden)
        return real_flock(fd, op)

    monkeypatch.setattr(shard_parts.fcntl, "flock", flock)
    held = CallLock.create(lock)
    assert len(gone) == 2 and os.path.exists(lock)
    assert os.stat(lock).st_ino == os.fstat(held._fd).st_ino
    monkeypatch.undo()
    assert judge(lock, str(tmp_path)) is LeftoverState.LIVE
    held.release(remove=True)
    assert not os.path.exists(lock)


def test_a_judge_judges_by_the_lock_file_the_name_holds(tmp_path, monkeypatch) -> None:
    """A lock file replaced between a judge's opening it and its lock (a dead one deleted,
    a running call's made at the name) is looked at again: the judge never takes the old
    file's lock for the running call's."""
    folder = str(tmp_path)
    lock = lock_path(folder, TOKEN)
    with open(lock, "wb"):  # (left by a killed call)
        pass
    part = _part(tmp_path)
    real_flock = shard_parts.fcntl.flock
    other: list[int] = []

    def flock(fd, op):
        if op & fcntl.LOCK_EX and not other:  # the judge's lock: another process's call
            os.unlink(lock)
            other.append(os.open(lock, os.O_RDWR | os.O_CREAT, 0o644))
            real_flock(other[0], fcntl.LOCK_SH)
        return real_flock(fd, op)

    monkeypatch.setattr(shard_parts.fcntl, "flock", flock)
    try:
        assert judge(part, folder, remove=True) is LeftoverState.LIVE
        assert os.path.exists(part)
    finally:
        os.close(other[0])


def test_a_process_never_opens_a_lock_file_it_holds_again(tmp_path, monkeypatch) -> None:
    """On NFS closing any descriptor of a file drops the process's fcntl locks on it (and the
    process's own lock never refuses it another): a judge in a process that holds the lock
    file answers from what it holds and never opens it, during a running call too."""
    folder = str(tmp_path)
    lock = lock_path(folder, TOKEN)
    opened: list[str] = []
    real_open = os.open

    def spy(path, *args, **kw):
        opened.append(os.fspath(path))
        return real_open(path, *args, **kw)

    monkeypatch.setattr(os, "open", spy)
    held = CallLock.create(lock)
    part = _part(tmp_path)
    for f in (part, lock):
        for remove in (False, True):
            assert judge(f, folder, remove=remove) is LeftoverState.LIVE
    assert opened.count(lock) == 1 and os.path.exists(part)
    held.release()
    assert judge(part, folder) is LeftoverState.DEAD and opened.count(lock) == 2

    a = np.arange(12 * 12, dtype="i8").reshape(12, 12)
    ds = _sharded(tmp_path, a)
    opened.clear()
    real = collective_shards._write_temp
    seen: list[LeftoverState] = []

    def write_temp(path, *args, **kw):
        real(path, *args, **kw)
        seen.extend(judge(f, ds_folder, remove=True) for f in (path, *call_locks(ds_folder)))

    ds_folder = str(tmp_path / "a")
    monkeypatch.setattr(collective_shards, "_write_temp", write_temp)
    ds.write_all(..., a + 1)
    locks = [f for f in opened if is_lock_file(f)]
    assert len(locks) == 1 and seen == [LeftoverState.LIVE] * 16, (locks, seen)
    np.testing.assert_array_equal(ds.read_all(...), a + 1)


def _sharded(tmp_path, a, shards=(6, 8)):
    ds = strataio.create_dataset(
        tmp_path / "a", a.shape, "i8", (3, 4), shards=shards, codec="zstd", comm=MPI.COMM_SELF
    )
    ds.write_all(..., a)
    return ds


@pytest.mark.parametrize("value", [1, 0])
def test_a_shard_write_holds_its_lock_until_it_ends(tmp_path, monkeypatch, value) -> None:
    """Every .part file is live from its first write until its rename (a judge deletes
    nothing), those of shards whose inner chunks are all the fill value (no run: the leader
    makes it with the index) included, and so is the call's lock file; once the call is
    over the .part files are renamed and the lock file is gone."""
    a = np.arange(12 * 12, dtype="i8").reshape(12, 12)
    ds = _sharded(tmp_path, a)
    folder = str(tmp_path / "a")
    seen: dict[str, list[LeftoverState]] = {}
    real = collective_shards._write_temp

    def write_temp(path, *args, **kw):
        real(path, *args, **kw)
        for f in (path, *call_locks(folder)):
            seen.setdefault(f, []).append(judge(f, folder, remove=True))

    monkeypatch.setattr(collective_shards, "_write_temp", write_temp)
    b = (a + 1) * value
    ds.write_all(..., b)
    monkeypatch.undo()
    (lock,) = [f for f in seen if is_lock_file(f)]
    parts = [f for f in seen if f != lock]
    assert len(parts) == 4 and all(is_part_file(f) for f in parts)
    writes = 2 if value else 1  # (a run and the index, or the index alone)
    assert all(seen[f] == [LeftoverState.LIVE] * writes for f in parts), seen
    assert seen[lock] == [LeftoverState.LIVE] * 4 * writes
    assert all(judge(f, folder) is LeftoverState.GONE for f in seen)
    np.testing.assert_array_equal(ds.read_all(...), b)
    assert list(part_files(folder)) == [] and ds.nchunks_stored() == 4
    assert list(call_locks(folder)) == []


def test_a_shard_write_holds_one_descriptor_however_many_shards(tmp_path, monkeypatch) -> None:
    """A rank holds the call's lock through one descriptor, not one per shard: a call
    writing more shards than the process may open files succeeds."""
    fds = "/proc/self/fd"
    if not os.path.isdir(fds):
        pytest.skip("no /proc/self/fd here")
    a = np.arange(4 * 256, dtype="i8").reshape(4, 256)
    ds = _sharded(tmp_path, a, shards=(6, 4))  # (64 shards)
    opened: list[int] = []
    real = collective_shards._write_indexes

    def write_indexes(*args):
        opened.append(len(os.listdir(fds)))  # (every run written, no index yet)
        real(*args)

    monkeypatch.setattr(collective_shards, "_write_indexes", write_indexes)
    before = len(os.listdir(fds))
    ds.write_all(..., a + 1)
    assert opened[0] - before <= 4, (before, opened)
    np.testing.assert_array_equal(ds.read_all(...), a + 1)


def test_a_failed_shard_write_leaves_no_file(tmp_path, monkeypatch) -> None:
    """A call that fails, before its runs are written or after, removes its .part files and
    its lock file; one whose lock file cannot be made writes nothing."""
    a = np.arange(12 * 12, dtype="i8").reshape(12, 12)
    ds = _sharded(tmp_path, a)
    folder = str(tmp_path / "a")
    with pytest.raises(ShapeMismatchError):
        ds.write_all(np.s_[0:6, 0:8], np.zeros((6, 7), "i8"))

    def failing_indexes(*args):
        raise OSError("disk full")

    monkeypatch.setattr(collective_shards, "_write_indexes", failing_indexes)
    with pytest.raises(OSError, match="disk full"):
        ds.write_all(..., -1)
    monkeypatch.undo()

    def refused(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(CallLock, "create", refused)
    with pytest.raises(BackendError, match="cannot make the lock file of the write"):
        ds.write_all(..., -2)
    np.testing.assert_array_equal(ds.read_all(...), a)
    assert list(part_files(folder)) == [] and list(call_locks(folder)) == []


def test_a_shard_whose_part_file_is_gone_before_its_index_is_not_replaced(
    tmp_path, monkeypatch
) -> None:
    """A .part file deleted before its index is written (by hand: fsck never deletes one of
    a running call) fails the call, never a shard of an index alone; the old shard stays."""
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
    assert list(call_locks(str(tmp_path / "a"))) == []
