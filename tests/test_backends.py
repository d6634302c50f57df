"""Every backend against the shared contract, plus what is particular to S3 and Shaped.

S3 runs against a real SeaweedFS server on 127.0.0.1 (the session's ``s3_server``).
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from backend_contract import BackendContract, as_array, oracle_read, random_extents
from strataio.errors import (
    ArgumentError,
    BackendError,
    ExistsError,
    NotFoundError,
    ShapeMismatchError,
    StrataError,
)
from strataio.layout.extents import Extents
from strataio.storage.memory import MemoryBackend
from strataio.storage.posix import PosixBackend
from strataio.storage.s3 import S3Backend
from strataio.storage.s3_signed import ConditionNotSupported, create_bucket
from strataio.storage.shaped import PRESETS, CostModel, OpCost, Shaped

MiB = 1 << 20


class TestMemoryBackend(BackendContract):
    @pytest.fixture
    def backend(self):
        return MemoryBackend()


class TestPosixBackend(BackendContract):
    @pytest.fixture
    def backend(self, tmp_path):
        return PosixBackend(tmp_path / "root")


class TestS3Backend(BackendContract):
    @pytest.fixture
    def backend(self, s3_backend):
        return s3_backend


class TestShapedPosix(BackendContract):
    @pytest.fixture
    def backend(self, tmp_path):
        # the tape model at 1/10000 of its time: ~0.7 ms per access
        return Shaped(PosixBackend(tmp_path / "root"), "remote_tape_2002", time_scale=1e-4)


# --------------------------------------------------------------------------- S3 specifics
def _s3(server, **kw) -> S3Backend:
    return S3Backend(
        server.bucket,
        prefix=kw.pop("prefix", "s3-specific"),
        endpoint=kw.pop("endpoint", server.endpoint),
        access_key=server.access_key,
        secret_key=kw.pop("secret_key", server.secret_key),
        allow_http=True,
        **kw,
    )


def _dead_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there once the socket is closed


def test_s3_multipart_upload(s3_server) -> None:
    be = _s3(s3_server, multipart_threshold=5 * MiB, part_size=5 * MiB)
    obj = np.random.default_rng(7).integers(0, 256, 11 * MiB, dtype=np.uint8)
    be.put("big", obj)
    assert be.head("big")["e_tag"].strip('"').endswith("-3")  # three parts
    np.testing.assert_array_equal(as_array(be.get("big")), obj)
    be.put("small", obj[: 5 * MiB])
    assert "-" not in be.head("small")["e_tag"]
    # pieces straddling part boundaries
    ext = Extents([5 * MiB - 3, 10 * MiB - 1, 0], [6, 1 * MiB + 5, 2])
    np.testing.assert_array_equal(as_array(be.read("big", ext)), oracle_read(obj, ext))
    be.delete("big")
    be.delete("small")


@pytest.mark.parametrize("merge_gap", [0, 4096, 64 * MiB])
def test_s3_ranged_reads_match_oracle(s3_backend, merge_gap: int) -> None:
    rng = np.random.default_rng(merge_gap)
    obj = rng.integers(0, 256, 3 * MiB, dtype=np.uint8)
    s3_backend.put("ranged", obj)
    s3_backend.merge_gap = merge_gap
    ext = random_extents(rng, int(obj.size * 1.01), 300, max_length=3000)
    assert len(ext.union()) > 100  # many separate ranges, which merge_gap may bridge
    np.testing.assert_array_equal(as_array(s3_backend.read("ranged", ext)), oracle_read(obj, ext))
    # everything past the end: zeros, after learning the size
    far = Extents([obj.size + 10, obj.size + 100], [5, 5])
    assert bytes(s3_backend.read("ranged", far)) == bytes(10)


def test_s3_dead_server_fails_fast(s3_server) -> None:
    be = _s3(s3_server, endpoint=_dead_endpoint())
    for op in (
        lambda: be.get("k/x"),
        lambda: be.put("k/x", b"1"),
        lambda: be.read("k/x", Extents.single(0, 4)),
        lambda: be.write("k/x", Extents.single(0, 1), b"1"),
        lambda: be.size("k/x"),
        lambda: be.exists("k/x"),
        lambda: list(be.list("k")),
    ):
        t0 = time.monotonic()
        with pytest.raises(BackendError, match="k") as info:
            op()
        assert time.monotonic() - t0 < 5.0
        assert be.endpoint in str(info.value)
        assert not isinstance(info.value, NotFoundError)
        # the reason the request failed, not only that it did
        assert "Connection refused" in str(info.value), str(info.value)


def test_s3_hung_server_times_out() -> None:
    # a server that accepts connections (the kernel completes the handshake) but never answers
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        be = S3Backend(
            "hung",
            endpoint=f"http://127.0.0.1:{srv.getsockname()[1]}",
            access_key="k",
            secret_key="s",
            allow_http=True,
            read_timeout=0.5,
            request_timeout=1.0,
            retries=1,
            retry_timeout=1.0,
        )
        t0 = time.monotonic()
        with pytest.raises(BackendError, match="'x'") as info:
            be.get("x")
        assert time.monotonic() - t0 < 6.0
        assert "(timeout" in str(info.value), str(info.value)


def test_s3_killed_server_then_restart(s3_server) -> None:
    be = _s3(s3_server, prefix="restart")
    be.put("kept", b"durable bytes", durable=True)
    s3_server.kill()
    try:
        t0 = time.monotonic()
        with pytest.raises(BackendError):
            be.get("kept")
        assert time.monotonic() - t0 < 5.0
    finally:
        s3_server.restart()
    # a completed PUT survived the crash
    assert bytes(be.get("kept")) == b"durable bytes"


def test_s3_credentials_never_shown(s3_server, monkeypatch) -> None:
    be = _s3(s3_server)
    bad = _s3(s3_server, secret_key="wrong-" + s3_server.secret_key[:10])
    texts = [repr(be), str(be), be.url, repr(bad), bad.url]
    with pytest.raises(NotFoundError) as nf:
        be.get("absent")
    with pytest.raises(BackendError, match="access denied") as denied:
        bad.get("absent")
    texts += [str(nf.value), str(denied.value), str(denied.value.__cause__)]
    for t in texts:
        assert s3_server.secret_key not in t
        assert s3_server.secret_key[:10] not in t
    assert s3_server.endpoint in be.url and s3_server.bucket in be.url


def test_s3_refusal_names_the_servers_reason(s3_server) -> None:
    # a wrong secret: the message says what the server said (its error code and message), not
    # the opening line of its XML answer
    bad = _s3(s3_server, secret_key="wrong-" + s3_server.secret_key[:10])
    for op in (lambda: bad.get("absent"), lambda: bad.put("x", b"never stored")):
        with pytest.raises(BackendError, match="access denied") as denied:
            op()
        text = str(denied.value)
        assert "SignatureDoesNotMatch" in text and "signature we calculated" in text
        assert "<" not in text and "\n" not in text
    assert not _s3(s3_server).exists("x")  # nothing was written


def test_s3_credentials_from_environment(s3_server, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    be = S3Backend(s3_server.bucket, "env", allow_http=True)
    be.put("x", b"from env")
    assert bytes(be.get("x")) == b"from env"
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    with pytest.raises(StrataError, match="no S3 credentials"):
        S3Backend(s3_server.bucket, "env", allow_http=True)
    with pytest.raises(StrataError, match="allow_http"):
        S3Backend(s3_server.bucket, access_key="a", secret_key="b")


def test_s3_concurrent_partial_writes_all_land(s3_backend) -> None:
    # read-modify-write with conditional PUTs: no writer loses another's bytes
    s3_backend.put("shared", bytes(4000))
    pieces = [bytes([65 + i]) * 100 for i in range(4)]

    def writer(i: int) -> None:
        s3_backend.write("shared", Extents.single(1000 * i + 7, 100), pieces[i])

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = bytes(s3_backend.get("shared"))
    for i in range(4):
        assert got[1000 * i + 7 : 1000 * i + 107] == pieces[i]


def test_s3_delete_if_never_deletes_a_put_made_after_its_look(s3_server) -> None:
    """Another process's put between a deleter's look and its DELETE survives: the server
    checks the version seen (``If-Match``) as it deletes."""
    deleter, putter = _s3(s3_server, prefix="cdel"), _s3(s3_server, prefix="cdel")
    seen = putter.put_versioned("a/c/0", b"old")
    look = deleter.object_versions

    def look_then_let_the_other_put(keys):
        got = look(keys)
        putter.put("a/c/0", b"new")
        return got

    deleter.object_versions = look_then_let_the_other_put  # type: ignore[method-assign]
    assert not deleter.delete_if("a/c/0", seen)
    assert bytes(putter.get("a/c/0")) == b"new"
    # a delete of the version there now still deletes, over the same kept-alive connection
    deleter.object_versions = look  # type: ignore[method-assign]
    (now,) = putter.object_versions(["a/c/0"])
    assert deleter.delete_if("a/c/0", now) and not putter.exists("a/c/0")


def test_s3_delete_if_falls_back_to_look_then_delete_where_the_store_refuses_it(
    s3_server, monkeypatch
) -> None:
    """A store that answers a conditional DELETE with NotImplemented is remembered: deletes
    after a look, as before, from then on."""
    be = _s3(s3_server, prefix="cdel-old")
    refused = []

    def not_implemented(path, etag, version_id=""):
        refused.append(path)
        raise ConditionNotSupported("conditional DELETE not supported (NotImplemented)")

    monkeypatch.setattr(be._signed, "delete_if", not_implemented)
    for key in ("x", "y"):
        seen = be.put_versioned(key, b"bytes")
        assert be.delete_if(key, seen) and not be.exists(key)
    assert refused == ["cdel-old/x"]  # (asked once)
    seen = be.put_versioned("z", b"one")
    be.put("z", b"two")
    assert not be.delete_if("z", seen) and be.exists("z")


def test_create_bucket(s3_server) -> None:
    args = (s3_server.endpoint, "made-by-test", s3_server.access_key, s3_server.secret_key)
    assert create_bucket(*args) is True
    assert create_bucket(*args) is False
    with pytest.raises(ExistsError):
        create_bucket(*args, exist_ok=False)
    with pytest.raises(BackendError, match="SignatureDoesNotMatch"):
        create_bucket(s3_server.endpoint, "other", s3_server.access_key, "wrong")
    with pytest.raises(BackendError):
        create_bucket(_dead_endpoint(), "other", "a", "b", timeout=2)
    with pytest.raises(BackendError, match="never-made|does not exist"):
        S3Backend(
            "never-made",
            endpoint=s3_server.endpoint,
            access_key=s3_server.access_key,
            secret_key=s3_server.secret_key,
            allow_http=True,
        ).get("x")


# --------------------------------------------------------------------------- Shaped specifics
def test_presets_are_table_1() -> None:
    disk, tape = PRESETS["remote_disk_2002"], PRESETS["remote_tape_2002"]
    # Table 1 (seconds): conn, open, seek, close, connclose
    assert (disk.connect, disk.read.open, disk.read.seek, disk.read.close) == (
        0.44,
        0.42,
        0.40,
        0.63,
    )
    assert (disk.write.open, disk.write.close, disk.disconnect) == (0.42, 0.83, 0.0002)
    assert (tape.connect, tape.read.open, tape.read.close, tape.write.close) == (
        0.81,
        6.17,
        0.46,
        0.42,
    )
    # equation (3)'s worked example: a 2 MB write to remote disk costs 8.47 s
    assert disk.call_time(2 * MiB, write=True) == pytest.approx(8.47)
    assert CostModel.from_preset("remote_tape_2002", drives=3).drives == 3
    with pytest.raises(
        ArgumentError, match="unknown cost model preset 'floppy'; known: remote_disk"
    ):
        CostModel.from_preset("floppy")


def test_a_bad_argument_of_shaped_is_an_argument_error() -> None:
    """An unknown preset names the known ones; a time scale must be a finite number >= 0."""
    with pytest.raises(
        ArgumentError, match="preset 'nope'; known: remote_disk_2002, remote_tape_2002"
    ):
        Shaped(MemoryBackend(), "nope")
    with pytest.raises(ArgumentError, match="model must be a CostModel or a preset name"):
        Shaped(MemoryBackend(), None)  # type: ignore[arg-type]
    for bad in (-1, float("nan"), float("inf"), "1", True):
        with pytest.raises(ArgumentError, match="time_scale must be a finite number >= 0"):
            Shaped(MemoryBackend(), "remote_disk_2002", bad)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="drives must be >= 1"):
        CostModel.from_preset("remote_tape_2002", drives=0)
    assert Shaped(MemoryBackend(), "remote_disk_2002", np.float32(0.5)).time_scale == 0.5


def test_shaped_accounting_follows_equation_1() -> None:
    model = PRESETS["remote_disk_2002"]
    be = Shaped(MemoryBackend(), model, time_scale=0)
    bw = model.read.bandwidth
    be.put("x", bytes(3000))
    be.get("x")
    be.read("x", Extents([0, 100, 2000], [10, 50, 40]))  # three runs: three seeks
    be.size("x")
    s = be.stats()
    expect = (
        0.44
        + (0.42 + 3000 / bw + 0.83)
        + (0.42 + 3000 / bw + 0.63)
        + (0.42 + 3 * 0.40 + 100 / bw + 0.63)
    )
    assert s.simulated == pytest.approx(expect)
    assert (s.requests, s.bytes_read, s.bytes_written, s.connects) == (4, 3100, 3000, 1)
    be.close()
    assert be.stats().simulated == pytest.approx(expect + 0.0002)

    per = Shaped(
        MemoryBackend(), CostModel.from_preset("remote_disk_2002", connect_per_request=True), 0
    )
    for _ in range(5):
        per.exists("x")
    assert per.stats().simulated == pytest.approx(5 * (0.44 + 0.0002))


def test_shaped_drives_limit_concurrency() -> None:
    """At most ``drives`` accesses are inside the inner backend at once; the rest queue."""
    import dataclasses

    class Counting(MemoryBackend):
        def __init__(self) -> None:
            super().__init__()
            self.active = 0
            self.peak = 0
            self.guard = threading.Lock()

        def get(self, key: str) -> bytes:
            with self.guard:
                self.active += 1
                self.peak = max(self.peak, self.active)
            time.sleep(0.02)  # hold the drive long enough for the others to pile up
            with self.guard:
                self.active -= 1
            return super().get(key)

    mount = CostModel(name="mount", read=OpCost(open=1.0))

    def peak(drives: int) -> tuple[int, Shaped]:
        inner = Counting()
        be = Shaped(inner, dataclasses.replace(mount, drives=drives), 0.01)
        inner.put("obj", b"x")
        threads = [threading.Thread(target=be.get, args=("obj",)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return inner.peak, be

    p1, be1 = peak(1)
    p2, be2 = peak(2)
    assert p1 == 1
    assert 1 <= p2 <= 2
    # every access paid its mount in the model, queued or not
    assert be1.stats().simulated == pytest.approx(6 * 1.0)
    assert be2.stats().simulated == pytest.approx(6 * 1.0)
    assert be1.stats().drive_wait > 0


def test_shaped_capabilities(tmp_path) -> None:
    inner = PosixBackend(tmp_path)
    be = Shaped(inner, "remote_tape_2002", time_scale=0.5)
    model = PRESETS["remote_tape_2002"]
    assert be.capabilities.partial_write and be.capabilities.append
    assert be.capabilities.latency == pytest.approx(0.5 * (6.17 + 0.46))
    # merging pays below bandwidth x latency bytes
    assert be.capabilities.preferred_io_size >= int(model.read.bandwidth * 6.6)
    assert "remote_tape_2002" in be.url and str(tmp_path) in be.url
    mem = MemoryBackend()
    mem.capabilities = type(mem.capabilities)(partial_write=False, append=False)
    assert not Shaped(mem, "remote_disk_2002", 0).capabilities.partial_write


def test_s3_write_refuses_short_data_before_any_request(s3_backend) -> None:
    with pytest.raises(ShapeMismatchError, match="need 10 bytes"):
        s3_backend.write("short", Extents([0, 5], [5, 5]), b"12345")
    assert not s3_backend.exists("short")
