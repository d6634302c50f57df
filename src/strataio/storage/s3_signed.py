"""Signed S3 requests that obstore does not make: creating a bucket, and deleting an object
only while it is the one seen (``If-Match`` its ETag, or ``versionId``).

Requests are path-style (``endpoint/bucket/key``), signed with AWS Signature V4 (service
``s3``), each thread keeping one connection alive. A conditional DELETE is decided by the
server, in one step: AWS S3 honours ``If-Match`` on DeleteObject (general purpose buckets
since September 2025) and SeaweedFS does since 4.x; a store that refuses the header
(``NotImplemented``, or a 400) is remembered by the caller, which then deletes after a look.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from urllib.parse import quote, urlsplit

from strataio.errors import BackendError, ExistsError, StrataError

__all__ = ["BUCKET_NAME", "ConditionNotSupported", "SignedClient", "create_bucket", "sign_v4"]

#: answers retried (the server busy or failing for now; 501 says what it cannot do)
_TRANSIENT = frozenset({500, 502, 503, 504})

#: what S3 takes as a bucket name
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


def sign_v4(
    method: str,
    url: str,
    region: str,
    access_key: str,
    secret_key: str,
    body: bytes = b"",
    *,
    headers: Mapping[str, str] | None = None,
    session_token: str | None = None,
) -> dict[str, str]:
    """The headers of an AWS Signature V4 signed request (service ``s3``): ``headers``
    (signed too), the date, the payload's hash, a session token where given, and
    ``Authorization``. ``url``'s path and query must already be URI-encoded."""
    parts = urlsplit(url)
    amz_date = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    payload = hashlib.sha256(body).hexdigest()
    out = dict(headers or {})
    out["x-amz-date"] = amz_date
    out["x-amz-content-sha256"] = payload
    if session_token:
        out["x-amz-security-token"] = session_token
    signing = {k.lower(): v.strip() for k, v in out.items()}
    signing["host"] = parts.netloc
    names = sorted(signing)
    query = "&".join(sorted(parts.query.split("&"))) if parts.query else ""
    canonical = "\n".join(
        [
            method,
            parts.path or "/",
            query,
            *(f"{n}:{signing[n]}" for n in names),
            "",
            ";".join(names),
            payload,
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + secret_key).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return out


class ConditionNotSupported(StrataError):
    """The store refused a conditional request's header (``NotImplemented``, or a 400)."""


class SignedClient:
    """Signed requests to one bucket: ``endpoint`` (``None``: AWS in ``region``), and the
    credentials (``access_key`` None: unsigned requests). ``timeout`` bounds each request
    (seconds); ``retries`` transient failures (connection errors; 500, 502, 503, 504) are
    retried."""

    def __init__(
        self,
        endpoint: str | None,
        bucket: str,
        region: str,
        access_key: str | None,
        secret_key: str | None,
        session_token: str | None = None,
        *,
        timeout: float = 10.0,
        retries: int = 2,
    ) -> None:
        self.base = (endpoint or f"https://s3.{region}.amazonaws.com").rstrip("/")
        self.bucket = bucket
        self.region = region
        self._credentials = (access_key, secret_key, session_token)
        self.timeout = timeout
        self.retries = retries
        self._local = threading.local()
        self._open: list[http.client.HTTPConnection] = []  # (every thread's, for close)
        self._open_lock = threading.Lock()

    def delete_if(self, path: str, etag: str, version_id: str = "") -> bool:
        """Delete object ``path`` (within the bucket) only while it is at ``version_id``
        (that exact version), else only while its ETag is ``etag``; True if the server
        deleted it, False where it was at another version or missing. Raises
        :class:`ConditionNotSupported` where the store does not take ``If-Match`` here."""
        target = f"/{self.bucket}/{quote(path, safe='/-_.~')}"
        if version_id:
            target += "?versionId=" + quote(version_id, safe="-_.~")
            headers: dict[str, str] = {}
        else:
            headers = {"If-Match": etag}
        status, body = self._request("DELETE", target, headers)
        if status in (200, 204):
            return True
        if status in (404, 412):
            return False
        code = _error_code(body) or f"HTTP {status}"
        if status in (400, 501) or code in ("NotImplemented", "InvalidArgument", "InvalidRequest"):
            # (a store that does not know the header on a DELETE refuses the request)
            raise ConditionNotSupported(f"{self.base}: conditional DELETE not supported ({code})")
        raise BackendError(f"{self.base}/{self.bucket}: DELETE {path!r} failed: {code}")

    def _request(self, method: str, target: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """One request on this thread's connection, retried on a connection error or a
        transient 5xx (with backoff); the status and the body."""
        access_key, secret_key, token = self._credentials
        delay = 0.05
        for attempt in range(self.retries + 1):
            if access_key is not None and secret_key is not None:
                sent = sign_v4(
                    method, self.base + target, self.region, access_key, secret_key,
                    headers=headers, session_token=token,
                )  # fmt: skip
            else:
                sent = dict(headers)
            sent["Host"] = urlsplit(self.base).netloc  # (as signed, port included)
            try:
                conn = self._connection()
                conn.request(method, urlsplit(self.base).path + target, headers=sent)
                resp = conn.getresponse()
                body = resp.read()
                if resp.status not in _TRANSIENT or attempt == self.retries:
                    return resp.status, body
            except (OSError, http.client.HTTPException) as exc:
                self._drop_connection()
                if attempt == self.retries:
                    raise BackendError(
                        f"{self.base}/{self.bucket}: {method} failed: {exc}"
                    ) from None
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            parts = urlsplit(self.base)
            cls = (
                http.client.HTTPSConnection
                if parts.scheme == "https"
                else http.client.HTTPConnection
            )
            conn = cls(parts.netloc, timeout=self.timeout)
            self._local.conn = conn
            with self._open_lock:
                self._open.append(conn)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close every thread's connection (a later request opens a new one)."""
        with self._open_lock:
            conns, self._open = self._open, []
        for conn in conns:
            conn.close()


def _error_code(body: bytes) -> str:
    found = re.search(rb"<Code>([^<]+)</Code>", body)
    return found.group(1).decode(errors="replace") if found else ""


def create_bucket(
    endpoint: str,
    bucket: str,
    access_key: str,
    secret_key: str,
    region: str = "us-east-1",
    *,
    exist_ok: bool = True,
    timeout: float = 10.0,
) -> bool:
    """Create ``bucket`` at ``endpoint`` (path-style S3 ``PUT /bucket``, SigV4-signed).

    Returns True when created, False when it already existed and belongs to these credentials
    (with ``exist_ok``). Raises :class:`~strataio.errors.ExistsError` when it exists and
    ``exist_ok`` is false, :class:`BackendError` on any other failure.
    """
    if not BUCKET_NAME.match(bucket):
        raise StrataError(f"invalid S3 bucket name {bucket!r}")
    url = f"{endpoint.rstrip('/')}/{bucket}"
    body = b""
    if region != "us-east-1":
        body = (
            "<CreateBucketConfiguration><LocationConstraint>"
            f"{region}</LocationConstraint></CreateBucketConfiguration>"
        ).encode()
    headers = sign_v4("PUT", url, region, access_key, secret_key, body)
    req = urllib.request.Request(url, data=body, method="PUT", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout):
            return True
    except urllib.error.HTTPError as exc:
        name = _error_code(exc.read()) or f"HTTP {exc.code}"
        if name == "BucketAlreadyOwnedByYou":
            if exist_ok:
                return False
            raise ExistsError(f"bucket {bucket!r} already exists at {endpoint}") from None
        raise BackendError(f"cannot create bucket {bucket!r} at {endpoint}: {name}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise BackendError(f"cannot create bucket {bucket!r} at {endpoint}: {reason}") from None
