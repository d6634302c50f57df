"""A PostgreSQL catalog whose connection ends under it (a server restart, a backend
terminated by an administrator or an idle timeout) opens it again at its next call, and
takes back its writers' liveness tokens, rows and dataset marks; a change cut off midway
raises, saying its outcome is the server's."""

from __future__ import annotations

import time

import numpy as np
import pytest

import strataio
from strataio.catalog import ChunkCopy, DatasetRecord, TierRecord, open_catalog
from strataio.errors import BackendError
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet


def _terminate(pg_server, cat) -> None:
    """End ``cat``'s server backend, as an administrator's ``pg_terminate_backend`` does, and
    wait until the server has let it go (its advisory locks with it)."""
    import psycopg

    pid = cat._conn.info.backend_pid
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
        deadline = time.monotonic() + 30
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, "the terminated backend did not end"
            time.sleep(0.01)


@pytest.fixture
def two(pg_url):
    """Two catalog objects on one database: ``mine``, whose connection the tests end, and
    ``other``, another process's view."""
    mine, other = open_catalog(pg_url), open_catalog(pg_url)
    mine.register_tiers([TierRecord("local", "posix:/scratch", "localdisk", None, 0)])
    yield mine, other
    mine.close()
    other.close()


def _local(root) -> TierSet:
    """One POSIX tier under ``root``, as each process of a test builds its own."""
    return TierSet([Tier("local", PosixBackend(root / "local"), "localdisk", order=0)])


def _record(name: str) -> DatasetRecord:
    return DatasetRecord(name, shape=(4,), dtype="<f8", chunks=(1,), codec="[]", hint="AUTO")


def test_a_query_after_the_connection_ended_opens_it_again_and_answers(pg_server, two):
    mine, other = two
    mine.create_dataset(_record("a"))
    writer = mine.register_writer()
    mine.use_dataset("a", writer)
    _terminate(pg_server, mine)
    assert other.alive([writer]) == set()  # (the server let its token go with the backend)
    assert mine.get_dataset("a").name == "a"
    assert other.alive([writer]) == {writer}
    (seen,) = other.writers()
    assert (seen.id, seen.alive, seen.datasets) == (writer, True, ("a",))


def test_writers_forgotten_meanwhile_come_back_with_their_marks(pg_server, two):
    """Another process that saw the writer dead and forgot it (fsck does) finds it back,
    with its marks, once the writer's catalog has reconnected; the first call after the
    loss being a change (its begin found the connection gone) changes as asked."""
    mine, other = two
    for name in ("a", "b"):
        mine.create_dataset(_record(name))
    writer = mine.register_writer()
    mine.use_dataset("a", writer)
    mine.use_dataset("b", writer)
    mine.unuse_dataset("b", writer)  # (its mark lingers: still restored)
    _terminate(pg_server, mine)
    other.forget_writers([writer])
    assert other.writers() == []
    mine.commit([ChunkCopy("a", "c/0", "local", 8, "00000001")])
    assert [c.key for c in other.residency("a")] == ["c/0"]
    (seen,) = other.writers()
    assert (seen.id, seen.alive, seen.datasets) == (writer, True, ("a", "b"))


def test_a_change_cut_off_midway_raises_and_the_next_call_reconnects(pg_server, two):
    mine, other = two
    mine.create_dataset(_record("a"))
    with pytest.raises(BackendError, match="lost during a change") as err, mine._write() as cur:
        cur.execute(
            "INSERT INTO residency (dataset, key, tier, nbytes, checksum, state, "
            "last_access, old_checksum, writer) "
            "VALUES ('a', 'c/0', 'local', 8, '00000001', 'valid', 0, '', '')"
        )
        _terminate(pg_server, mine)
        cur.execute("SELECT 1")
    assert "next call opens the connection again" in str(err.value)
    assert other.residency("a") == []  # (cut off before its commit: rolled back)
    mine.commit([ChunkCopy("a", "c/1", "local", 8, "00000002")])
    assert [c.key for c in other.residency("a")] == ["c/1"]


def test_a_server_that_stays_away_is_reported_and_asked_again_at_the_next_call(
    pg_server, two, monkeypatch
):
    mine, _ = two
    mine.create_dataset(_record("a"))
    _terminate(pg_server, mine)
    real_connect = type(mine)._connect

    def refused(self):
        raise BackendError("cannot connect to catalog: connection refused")

    monkeypatch.setattr(type(mine), "_connect", refused)
    for _ in range(2):
        with pytest.raises(BackendError, match="lost .* could not be opened again"):
            mine.get_dataset("a")
    monkeypatch.setattr(type(mine), "_connect", real_connect)
    assert mine.get_dataset("a").name == "a"


def _read_back_settled(pg_url, root, expected) -> None:
    """A later process reads dataset ``run`` as ``expected``, every row settled and fsck
    finding nothing."""
    from strataio.tiers.fsck import fsck

    with strataio.Session(tiers=_local(root), catalog=pg_url) as s:
        with s.open_dataset("run") as ds:
            np.testing.assert_array_equal(ds[...], expected)
        assert {c.state for c in s.catalog.residency("run")} == {"valid"}
        assert fsck(s.catalog, s.tiers).clean


def test_a_session_writes_and_reads_on_across_a_lost_connection(pg_server, pg_url, tmp_path):
    """A job's Session outlives its catalog connection: a rewrite announced before the loss
    is flushed after it, and a later process reads the values written last."""
    a = np.random.default_rng(3).random((40, 40))
    with strataio.Session(tiers=_local(tmp_path), catalog=pg_url) as s:
        ds = s.create_dataset("run", a.shape, a.dtype, (10, 10), hint="LOCALDISK")
        ds[...] = a
        ds.flush()
        a[5:25, 5:25] += 1
        ds[5:25, 5:25] = a[5:25, 5:25]  # (announced, not flushed)
        _terminate(pg_server, s.catalog)
        ds.flush()
        a[30:, :] = -1
        ds[30:, :] = a[30:, :]
        _terminate(pg_server, s.catalog)
        np.testing.assert_array_equal(ds[...], a)
        ds.close()
    _read_back_settled(pg_url, tmp_path, a)


def test_a_rewrite_settled_by_fsck_while_its_writer_was_cut_off_keeps_its_value(
    pg_server, pg_url, tmp_path
):
    """While the connection is lost, the writer's token is gone: another process's fsck
    takes its announced rewrite for a dead writer's and settles it to the bytes on the
    tier, and forgets the writer. The writer's flush after reconnecting records the same
    rows, and a later process reads its values, every row settled."""
    from strataio.tiers.fsck import fsck

    a = np.random.default_rng(4).random((20, 20))
    with strataio.Session(tiers=_local(tmp_path), catalog=pg_url) as s:
        ds = s.create_dataset("run", a.shape, a.dtype, (10, 10), hint="LOCALDISK")
        ds[...] = a
        ds.flush()
        a[:10, :10] = 7
        ds[:10, :10] = a[:10, :10]  # (announced and put, not flushed)
        _terminate(pg_server, s.catalog)
        with open_catalog(pg_url) as cat:
            report = fsck(cat, _local(tmp_path), repair=True)
        assert report.repaired and report.writers_gone == 1
        assert [(f.key, f.action.name) for f in report.findings] == [("c/0/0", "ADOPT")]
        ds.flush()  # (the rows fsck settled are the ones this flush records)
        np.testing.assert_array_equal(ds[...], a)
        ds.close()
    _read_back_settled(pg_url, tmp_path, a)


def test_writers_and_marks_hold_across_lost_connections(pg_server, pg_url):
    """:class:`test_catalog.WriterRegistry` on PostgreSQL, with two more steps: the
    connection ended under the catalog, and that plus another process forgetting its
    writers as dead. After every step the catalog answers as the model says (the
    invariant's first call reconnects, where a step left the connection lost)."""
    from hypothesis import settings
    from hypothesis.stateful import rule, run_state_machine_as_test

    from test_catalog import WriterRegistry

    class AcrossLostConnections(WriterRegistry):
        def __init__(self) -> None:
            super().__init__()
            self.cat.close()
            self.cat = open_catalog(pg_url)
            self.cat.EVICTION_WAIT = 0.02
            self.cat.MARK_LINGER_S = 3600.0

        @rule()
        def lose_connection(self):
            _terminate(pg_server, self.cat)

        @rule()
        def forgotten_as_dead(self):
            _terminate(pg_server, self.cat)
            with open_catalog(pg_url) as other:
                other.forget_writers(w.id for w in other.writers())

    run_state_machine_as_test(
        AcrossLostConnections,
        settings=settings(max_examples=25, stateful_step_count=15, deadline=None),
    )


def test_an_idle_writer_shows_alive_again_soon_after_its_connection_ended(pg_server, two):
    """A job holding a writer's token that makes no catalog call (it computes) has its
    connection looked at every ``KEEPALIVE_S``: another process sees the writer alive again
    soon after the server let its token go, before the job's next call."""
    mine, other = two
    mine.KEEPALIVE_S = 0.05
    writer = mine.register_writer()
    _terminate(pg_server, mine)
    deadline = time.monotonic() + 20
    while other.alive([writer]) != {writer}:
        assert time.monotonic() < deadline, "the idle writer never showed alive again"
        time.sleep(0.02)
    mine.close()
    assert not mine._keepalive.is_alive()


def test_a_connection_lost_again_while_reopened_leaves_no_token_held_twice(
    pg_server, two, monkeypatch
):
    """The connection ended again while the catalog takes its writers' tokens back on the
    new one: the call raises, the next opens a connection afresh, and each token is held
    once there, so a writer released afterwards is dead to every other process."""
    from strataio.catalog.postgres import PostgresCatalog

    mine, other = two
    writers = [mine.register_writer(), mine.register_writer()]
    take = PostgresCatalog._hold_token
    cuts = []

    def cut_then_take(self, writer):
        if self is mine and cuts:
            cuts.pop()
            _terminate(pg_server, self)
        take(self, writer)

    monkeypatch.setattr(PostgresCatalog, "_hold_token", cut_then_take)
    _terminate(pg_server, mine)
    cuts.append(1)
    try:
        mine.tiers()
    except BackendError as exc:
        assert "lost again" in str(exc)
    assert [t.name for t in mine.tiers()] == ["local"]
    assert other.alive(writers) == set(writers)
    for w in writers:
        mine.release_writer(w)
    assert other.alive(writers) == set()


def test_a_writer_registered_as_the_connection_ends_holds_its_token(pg_server, two, monkeypatch):
    """The connection ended between taking a new writer's token and writing its row: the
    row is written on the connection opened anew, and the token is taken there too, so the
    writer is alive to other processes (not dead from its start, its marks and rewrites
    then any other process's to override)."""
    from strataio.catalog.postgres import PostgresCatalog

    mine, other = two
    take = PostgresCatalog._hold_token
    cuts = [1]

    def take_then_cut(self, writer):
        take(self, writer)
        if self is mine and cuts:
            cuts.pop()
            _terminate(pg_server, self)

    monkeypatch.setattr(PostgresCatalog, "_hold_token", take_then_cut)
    writer = mine.register_writer()
    assert other.alive([writer]) == {writer}
    assert [w.id for w in other.writers()] == [writer]


def test_a_change_cut_off_by_a_session_the_server_ended_is_known_lost_at_once(two):
    """A server-ended session (class 57P) can surface as another error while the connection
    does not yet look closed (a pipeline of statements cut off raises "cannot exit pipeline
    mode while busy"): that change too is reported lost, and the next call opens a new
    connection rather than failing on the old one."""
    import psycopg

    mine, other = two
    mine.create_dataset(_record("a"))
    before = mine._conn.info.backend_pid
    with pytest.raises(BackendError, match="lost during a change"), mine._write():
        try:
            raise psycopg.errors.AdminShutdown("terminating connection")
        except psycopg.Error as ended:
            raise psycopg.OperationalError("cannot exit pipeline mode while busy") from ended
    assert not mine._conn.closed  # (as psycopg left it)
    mine.commit([ChunkCopy("a", "c/0", "local", 8, "00000001")])
    assert mine._conn.info.backend_pid != before
    assert [c.key for c in other.residency("a")] == ["c/0"]
