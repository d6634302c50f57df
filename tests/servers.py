"""Real servers the tests start: a SeaweedFS S3 endpoint (``weed mini``) on 127.0.0.1 and a
private PostgreSQL (``pgserver``) on a Unix socket.

The S3 server binds loopback only (``-ip.bind=127.0.0.1``) and never phones home
(``-master.telemetry=false``). Every port is an explicit one picked free, outside the kernel's
ephemeral range (where the local ends of outgoing connections land, which could take a port
between the pick and the server's bind). A port can still be taken by another process in that
window (parallel test sessions pick too): a start that fails is retried with fresh ports or a
fresh directory, :data:`START_ATTEMPTS` times at most, and the error that ends it quotes each
attempt's last output lines.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest


def missing(reason: str) -> None:
    """Skip a test whose real component cannot be had here; under CI that fails instead, so a
    green run never hides a missing install step."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI runs every test against the real component)")
    pytest.skip(reason)


#: services of ``weed mini`` that get an explicit port (plus a gRPC port where they have one)
_PORTS = ("master", "volume", "filer", "s3", "admin")


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the test process dies (Linux), so a test
    run killed by a timeout leaves no server behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def find_weed() -> str | None:
    """Path of the ``weed`` binary: beside this interpreter (the venv), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("weed")


#: how many times a server start is tried (fresh ports or directory each time) before giving up
START_ATTEMPTS = 5


class ServerStartError(RuntimeError):
    """A test server did not start in :data:`START_ATTEMPTS` tries; the message quotes why."""


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux; else IANA's)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 49152, 65535


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int, *, offset: int = 0) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now, outside the ephemeral range (so no
    outgoing connection takes one before the server binds it); with ``offset``, ``p + offset``
    is free and outside that range too (for a service that dials its port plus a fixed
    offset). Random picks, so that parallel test sessions rarely try the same ones."""
    lo, hi = ephemeral_range()
    # usable ports: 1024..65535 minus [lo, hi]; the offset port must be usable as well
    candidates = [(a, b - offset) for a, b in ((1024, lo - 1), (hi + 1, 65535)) if b - offset >= a]
    picked: list[int] = []
    for _ in range(200 * max(n, 1)):
        if len(picked) == n:
            return picked
        a, b = random.choice(candidates)
        p = random.randint(a, b)
        twin = p + offset
        if offset and lo <= twin <= hi:
            continue
        if p in picked or (offset and twin in picked):
            continue
        if _port_is_free(p) and (not offset or _port_is_free(twin)):
            picked.append(p)
    raise ServerStartError(f"no {n} free ports on 127.0.0.1 outside {lo}-{hi}")


class SeaweedServer:
    """A throwaway SeaweedFS (master + volume + filer + S3) in a temporary directory.

    Use as a context manager; ``endpoint``, ``access_key``, ``secret_key``, ``region`` describe
    the S3 service. ``kill()`` stops it abruptly and ``restart()`` brings it back on the same
    ports and data directory (for failover tests).
    """

    region = "us-east-1"

    def __init__(self, weed: str | None = None, *, start_timeout: float = 30.0) -> None:
        self.weed = weed or find_weed()
        if self.weed is None:
            raise FileNotFoundError("the SeaweedFS 'weed' binary is not installed")
        self.start_timeout = start_timeout
        self.access_key = "strataio-" + secrets.token_hex(6)
        self.secret_key = secrets.token_urlsafe(30)
        #: the credentials of an identity that may only read objects (no listing, no writes)
        self.reader_key = "strataio-reader-" + secrets.token_hex(6)
        self.reader_secret = secrets.token_urlsafe(30)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0
        self.ports: dict[str, int] = {}
        #: a bucket name the owner of this server has created (set by whoever creates it)
        self.bucket = ""

    # ----------------------------------------------------------------- properties
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of the running server (None when stopped)."""
        return self._proc.pid if self.running else None  # type: ignore[union-attr]

    @property
    def log_path(self) -> Path:
        assert self._tmp is not None
        return Path(self._tmp.name) / "weed.log"

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> SeaweedServer:
        """Start on fresh ports; a start that fails (a port taken meanwhile, a server that
        exits or does not answer) is retried on other ports, :data:`START_ATTEMPTS` times."""
        if self._tmp is not None:
            self._launch()
            return self
        self._tmp = tempfile.TemporaryDirectory(prefix="strataio-seaweed-")
        root = Path(self._tmp.name)
        (root / "data").mkdir()
        conf = {
            "identities": [
                {
                    "name": "strataio-test",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                },
                {
                    "name": "strataio-reader",
                    "credentials": [
                        {"accessKey": self.reader_key, "secretKey": self.reader_secret}
                    ],
                    "actions": ["Read"],
                },
            ]
        }
        (root / "s3.json").write_text(json.dumps(conf))
        failures = []
        for attempt in range(1, START_ATTEMPTS + 1):
            self._pick_ports()
            try:
                self._launch()
                return self
            except (RuntimeError, TimeoutError) as exc:
                failures.append(f"attempt {attempt} (ports {self._port_list()}): {exc}")
                self.kill()
                # a fresh data directory: a half-started server may have written there
                shutil.rmtree(root / "data", ignore_errors=True)
                (root / "data").mkdir()
        self.close()
        raise ServerStartError(
            f"weed mini did not start in {START_ATTEMPTS} attempts:\n" + "\n".join(failures)
        )

    def _pick_ports(self) -> None:
        ports = free_ports(2 * len(_PORTS))
        for i, name in enumerate(_PORTS):
            self.ports[name] = ports[2 * i]
            self.ports[name + ".grpc"] = ports[2 * i + 1]
        # the embedded maintenance worker dials the admin gRPC service at admin port + 10000,
        # whatever -admin.port.grpc says
        while True:
            (admin,) = free_ports(1, offset=10000)
            if admin not in ports and admin + 10000 not in ports:
                break
        self.ports["admin"], self.ports["admin.grpc"] = admin, admin + 10000

    def _port_list(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.ports.items())

    def _launch(self) -> None:
        root = Path(self._tmp.name)  # type: ignore[union-attr]
        args = [
            self.weed,
            "mini",
            f"-dir={root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            f"-s3.config={root / 's3.json'}",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        ]
        for name in _PORTS:
            args.append(f"-{name}.port={self.ports[name]}")
            args.append(f"-{name}.port.grpc={self.ports[name + '.grpc']}")
        # (its logs go to the temporary directory, which TMPDIR names, not to /tmp)
        env = dict(os.environ, GOMEMLIMIT="256MiB", TMPDIR=str(root))
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        self._log_start = log.tell()  # this launch's lines start here
        try:
            self._proc = subprocess.Popen(
                args,
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        finally:
            log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Block until S3 serves a signed PUT and GET. The S3 port answers before the filer and
        volume server behind it are ready (after a restart, requests would hang meanwhile)."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"weed mini exited early; log:\n{self.log_tail()}")
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=1.0).close()
                break
            except urllib.error.HTTPError:
                break
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        last: Exception | None = None
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"weed mini exited early; log:\n{self.log_tail()}")
            try:
                self._probe()
                return
            except Exception as exc:  # not ready yet: any failure means try again
                last = exc
                time.sleep(0.1)
        self.kill()
        raise TimeoutError(
            f"SeaweedFS S3 not ready within {self.start_timeout} s: {last}; log:\n"
            + self.log_tail()
        )

    def _probe(self) -> None:
        from strataio.storage import S3Backend, create_bucket

        create_bucket(self.endpoint, "ready-probe", self.access_key, self.secret_key, timeout=2.0)
        be = S3Backend(
            "ready-probe",
            endpoint=self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            allow_http=True,
            read_timeout=2.0,
            request_timeout=3.0,
            retries=0,
        )
        token = secrets.token_bytes(16)
        be.put("probe", token)
        if bytes(be.get("probe")) != token:
            raise RuntimeError("probe object read back wrong")

    def log_tail(self, n: int = 20) -> str:
        """The last ``n`` lines the server printed since its latest launch."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-n:]) or "(no output)"

    def stop(self, timeout: float = 8.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; the data directory is kept."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._remove_sockets()

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as a crashed server would."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        """Remove the local sockets the server made: weed puts them in /tmp whatever TMPDIR
        says, named by service and port, and leaves them when it exits."""
        for port in self.ports.values():
            for sock in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    os.unlink(sock)

    def restart(self) -> None:
        """Start again on the same ports and data directory after ``stop`` or ``kill`` (the
        clients know the endpoint, so the ports cannot change): a failed start is retried after
        a pause, :data:`START_ATTEMPTS` times, in case a port is still being released."""
        self.stop()
        failures = []
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._launch()
                return
            except (RuntimeError, TimeoutError) as exc:
                failures.append(f"attempt {attempt}: {exc}")
                self.kill()
                time.sleep(0.5 * attempt)
        raise ServerStartError(
            f"weed mini did not restart on ports {self._port_list()} in {START_ATTEMPTS} "
            "attempts:\n" + "\n".join(failures)
        )

    def close(self) -> None:
        """Stop the server and remove its data directory."""
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"SeaweedServer({self.endpoint if self.ports else '-'}, {state})"


def _tail(path: Path, n: int = 20) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return "(no log)"
    return "\n".join(lines) or "(empty log)"


def _stop_postmaster(pgdata: Path) -> None:
    """Stop a server a failed start may have left running there (SIGQUIT: PostgreSQL's
    immediate shutdown), so that a retry in a fresh directory leaves nothing behind."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.05)


def start_postgres(*, attempts: int | None = None) -> tuple[Any, Path]:
    """A private PostgreSQL server (the ``pgserver`` wheel) in a fresh temporary directory,
    listening on a Unix socket there; returns ``(server, directory)``. A start that fails or a
    server that does not answer ``SELECT 1`` is retried in a fresh directory
    (:data:`START_ATTEMPTS` times); the error that ends it quotes each attempt's log tail.

    The directory is not under pytest's basetemp: run as root, the server drops to its own
    user and needs to traverse the parent folders, which pytest keeps private (0700)."""
    import warnings

    import psycopg

    # pgserver keeps its lock in the user's runtime folder; without XDG_RUNTIME_DIR (as in
    # CI) platformdirs warns and falls back to /tmp/runtime-<uid>, which serves as well.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import pgserver

    failures = []
    for attempt in range(1, (attempts or START_ATTEMPTS) + 1):
        root = Path(tempfile.mkdtemp(prefix="strataio-pg-"))
        try:
            srv = pgserver.get_server(root, cleanup_mode="stop")
            with psycopg.connect(srv.get_uri(), connect_timeout=10) as conn:
                conn.execute("SELECT 1")
            return srv, root
        except Exception as exc:
            failures.append(
                f"attempt {attempt} in {root}: {type(exc).__name__}: {exc}\n{_tail(root / 'log')}"
            )
            _stop_postmaster(root)
            shutil.rmtree(root, ignore_errors=True)
    raise ServerStartError(
        f"PostgreSQL (pgserver) did not start in {len(failures)} attempts:\n" + "\n".join(failures)
    )


def s3_tier_toml(server: SeaweedServer, prefix: str) -> str:
    """The TOML lines of an S3 tier under ``prefix`` of ``server``'s bucket (its ``bucket``
    attribute), from ``kind`` to ``credentials``, for a tier table of a test's config."""
    return (
        f'kind = "s3"\nbucket = "{server.bucket}"\nprefix = "{prefix}"\n'  # type: ignore[attr-defined]
        f'endpoint = "{server.endpoint}"\nregion = "{server.region}"\n'
        f'credentials = {{ access_key_id = "{server.access_key}", '
        f'secret_access_key = "{server.secret_key}" }}'
    )
