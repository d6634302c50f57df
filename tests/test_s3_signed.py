"""The signed S3 client's conditional DELETE against a canned server on 127.0.0.1: what each
answer means, what it sends, and its retries (the real server's behaviour is checked in
``test_backends.py``)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from strataio.errors import BackendError
from strataio.storage.s3_signed import ConditionNotSupported, SignedClient


class Canned(http.server.BaseHTTPRequestHandler):
    """Answers each DELETE with the next of ``answers`` (status, body) and notes what it got."""

    answers: list[tuple[int, bytes]] = []
    seen: list[tuple[str, dict[str, str]]] = []

    def do_DELETE(self) -> None:  # noqa: N802 (the handler's naming)
        Canned.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        status, body = Canned.answers.pop(0)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Canned.answers, Canned.seen = [], []
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _error(code: str) -> bytes:
    return f"<Error><Code>{code}</Code></Error>".encode()


def test_each_answer_of_a_conditional_delete(server: str) -> None:
    client = SignedClient(server, "bucket1", "us-east-1", "AKID", "secret", retries=1)
    Canned.answers = [
        (204, b""),
        (412, _error("PreconditionFailed")),
        (404, _error("NoSuchKey")),
        (501, _error("NotImplemented")),
        (400, _error("InvalidArgument")),
        (403, _error("AccessDenied")),
        (503, _error("SlowDown")),
        (204, b""),
    ]
    assert client.delete_if("p/c/0", '"etag1"') is True
    assert client.delete_if("p/c/0", '"etag1"') is False  # (another version there)
    assert client.delete_if("p/c/0", '"etag1"') is False  # (gone)
    for _ in range(2):
        with pytest.raises(ConditionNotSupported):
            client.delete_if("p/c/0", '"etag1"')
    with pytest.raises(BackendError, match="AccessDenied") as denied:
        client.delete_if("p/c/0", '"etag1"')
    assert "secret" not in str(denied.value)
    assert client.delete_if("p/c/0", '"etag1"') is True  # (a 503, retried)
    path, headers = Canned.seen[0]
    assert path == "/bucket1/p/c/0"
    assert headers["if-match"] == '"etag1"'
    assert headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKID/")
    assert "if-match" in headers["authorization"]  # (signed with the request)
    assert len(Canned.seen) == 8


def test_a_version_id_deletes_that_version_without_if_match(server: str) -> None:
    client = SignedClient(server, "bucket1", "us-east-1", None, None)  # (anonymous)
    Canned.answers = [(204, b"")]
    assert client.delete_if("a b/c", '"etag"', version_id="v 1")
    path, headers = Canned.seen[0]
    assert path == "/bucket1/a%20b/c?versionId=v%201"
    assert "if-match" not in headers and "authorization" not in headers


def test_a_dead_endpoint_fails_after_its_retries() -> None:
    client = SignedClient("http://127.0.0.1:9", "bucket1", "us-east-1", "a", "b", retries=1)
    with pytest.raises(BackendError, match="DELETE failed"):
        client.delete_if("k", '"e"')
