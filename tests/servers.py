"""Real servers the tests start on 127.0.0.1: a SeaweedFS S3 endpoint (``weed mini``).

The server binds loopback only (``-ip.bind=127.0.0.1``) and never phones home
(``-master.telemetry=false``); every port is an explicit free one, so parallel test sessions
do not collide.
"""

from __future__ import annotations

import contextlib
import json
import os
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


def _free_admin_ports() -> tuple[int, int]:
    """A free port ``p`` with ``p + 10000`` free too: the embedded maintenance worker dials the
    admin gRPC service at that fixed offset, whatever ``-admin.port.grpc`` says."""
    for _ in range(200):
        (p,) = free_ports(1)
        if p + 10000 > 65535:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", p + 10000))
        except OSError:
            continue
        return p, p + 10000
    raise RuntimeError("no free port pair for the SeaweedFS admin service")


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that are free on 127.0.0.1 right now (bind to port 0)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
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
    def log_path(self) -> Path:
        assert self._tmp is not None
        return Path(self._tmp.name) / "weed.log"

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> SeaweedServer:
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="strataio-seaweed-")
            root = Path(self._tmp.name)
            (root / "data").mkdir()
            ports = free_ports(2 * len(_PORTS))
            for i, name in enumerate(_PORTS):
                self.ports[name] = ports[2 * i]
                self.ports[name + ".grpc"] = ports[2 * i + 1]
            self.ports["admin"], self.ports["admin.grpc"] = _free_admin_ports()
            conf = {
                "identities": [
                    {
                        "name": "strataio-test",
                        "credentials": [
                            {"accessKey": self.access_key, "secretKey": self.secret_key}
                        ],
                        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                    }
                ]
            }
            (root / "s3.json").write_text(json.dumps(conf))
        self._launch()
        return self

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
        env = dict(os.environ, GOMEMLIMIT="256MiB")
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
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
        self.stop()
        raise TimeoutError(f"SeaweedFS S3 not ready within {self.start_timeout} s: {last}")

    def _probe(self) -> None:
        from strataio.storage.s3 import S3Backend, create_bucket

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

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

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

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as a crashed server would."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def restart(self) -> None:
        """Start again on the same ports and data directory after ``stop`` or ``kill``."""
        self.stop()
        self._launch()

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
