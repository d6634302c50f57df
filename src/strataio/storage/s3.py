"""S3 backend: objects in a bucket of an S3-compatible object store, through obstore.

Reads of Extents become ranged GETs: the pieces are sorted, pieces closer than ``merge_gap``
bytes share one request, and the requests run in parallel. Whole-object ``put`` is one PUT, or
a multipart upload above ``multipart_threshold``; either way the object appears atomically and
is durable once the call returns, so ``durable`` needs nothing extra. S3 cannot update bytes in
place, so ``write`` is a read-modify-write of the whole object guarded by a conditional PUT
(``If-Match`` the ETag that was read, ``If-None-Match: *`` for a new object): concurrent
partial writers to one object retry instead of losing each other's bytes.

Credentials come from the arguments or the usual ``AWS_*`` environment variables and are never
shown: ``url``, ``repr`` and error messages name the endpoint and bucket only. Timeouts and a
short retry budget make a dead or hung server fail in seconds with :class:`BackendError`, so a
tier layer can fail over.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import random
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from strataio.errors import (
    BackendError,
    ExistsError,
    NotFoundError,
    ShapeMismatchError,
    StoreMissingError,
    StrataError,
)
from strataio.layout.extents import Extents
from strataio.layout.pieces import copy_pieces
from strataio.storage.base import Backend, BytesLike, Capabilities, Version, validate_key
from strataio.storage.s3_signed import (
    BUCKET_NAME,
    ConditionNotSupported,
    SignedClient,
)

try:
    import obstore
    from obstore.exceptions import (
        AlreadyExistsError,
        PermissionDeniedError,
        PreconditionError,
        UnauthenticatedError,
    )
    from obstore.exceptions import BaseError as ObstoreError
except ImportError:  # pragma: no cover - obstore is an optional dependency (extra "s3")
    obstore = None

MiB = 1 << 20
#: objects larger than this are uploaded in parts (S3's minimum part size is 5 MiB)
MULTIPART_THRESHOLD = 8 * MiB
#: pieces closer than this share one ranged GET (a gap costs less than a request's latency)
MERGE_GAP = 256 * 1024
#: the error code and message in an S3 server's XML answer to a refused request
_XML_CODE = re.compile(r"<Code>([^<]+)</Code>")
_XML_MESSAGE = re.compile(r"<Message>([^<]+)</Message>")
#: the kind of a request's failure with no answer (connect, timeout...) and the system's
#: word for it, in the account of the failure obstore appends to its message
_HTTP_KIND = re.compile(r"HttpError \{\s*kind: (\w+)")
_OS_MESSAGE = re.compile(r'message: "([^"]+)"')
#: the bytes of UTF-8 an S3 object key may have
KEY_BYTES = 1024
#: the S3 error codes of a request refused for what its one object is, not for what the
#: store is, and the errno of the same refusal on a file system, which a
#: :class:`BackendError` of them carries (a tier then leaves itself up for them)
_OBJECT_CODES = {
    "KeyTooLongError": errno.ENAMETOOLONG,
    "EntityTooLarge": errno.EFBIG,
    "MetadataTooLarge": errno.EFBIG,
    "InvalidArgument": errno.EINVAL,
}
#: a read-modify-write retries this often when another writer changed the object meanwhile
RMW_ATTEMPTS = 8


def _version(meta: Any) -> Version:
    """The (ETag, version id) of an object's metadata or a PUT's result ("" where the store
    gives none)."""
    return (meta["e_tag"] or "", meta["version"] or "")


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def _env(name: str, given: str | None) -> str | None:
    return given if given is not None else (os.environ.get(name) or None)


class S3Backend(Backend):
    """Objects under ``prefix`` in ``bucket`` of an S3-compatible store.

    ``endpoint`` (e.g. ``http://127.0.0.1:8333``; default ``AWS_ENDPOINT_URL`` or AWS itself),
    ``region`` (default ``AWS_REGION`` or ``us-east-1``), ``access_key`` / ``secret_key``
    (default ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``; ``anonymous=True`` sends
    unsigned requests instead), ``session_token`` for temporary credentials (default
    ``AWS_SESSION_TOKEN``); secrets never appear in ``repr`` or error messages. A plain
    ``http://`` endpoint needs ``allow_http=True``.
    ``connect_timeout`` / ``read_timeout`` (seconds without progress) / ``request_timeout``
    (whole request) bound each request; ``retries`` transient failures (connection errors,
    5xx, timeouts of idempotent requests) are retried within ``retry_timeout`` seconds.
    """

    content_versions = True

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        allow_http: bool = False,
        anonymous: bool = False,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        part_size: int = MULTIPART_THRESHOLD,
        merge_gap: int = MERGE_GAP,
        max_concurrency: int = 8,
        connect_timeout: float = 2.0,
        read_timeout: float = 10.0,
        request_timeout: float = 300.0,
        retries: int = 2,
        retry_timeout: float = 5.0,
    ) -> None:
        if obstore is None:  # pragma: no cover
            raise StrataError("S3Backend needs the 'obstore' package (pip install strataio[s3])")
        if not isinstance(bucket, str) or not BUCKET_NAME.match(bucket):
            raise StrataError(f"invalid S3 bucket name {bucket!r}")
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
        if part_size < 5 * MiB:
            raise StrataError(f"S3 part_size must be at least 5 MiB, got {part_size}")
        endpoint = _env("AWS_ENDPOINT_URL", endpoint)
        region = _env("AWS_REGION", region) or "us-east-1"
        access_key = _env("AWS_ACCESS_KEY_ID", access_key)
        secret_key = _env("AWS_SECRET_ACCESS_KEY", secret_key)
        session_token = None if anonymous else _env("AWS_SESSION_TOKEN", session_token)
        if endpoint is not None:
            endpoint = endpoint.rstrip("/")
            scheme = urlsplit(endpoint).scheme
            if scheme not in ("http", "https"):
                raise StrataError(f"S3 endpoint {endpoint!r} must be an http(s) URL")
            if scheme == "http" and not allow_http:
                raise StrataError(
                    f"S3 endpoint {endpoint} is plain http; pass allow_http=True to use it"
                )
        if not anonymous and (access_key is None or secret_key is None):
            raise StrataError(
                "no S3 credentials: pass access_key and secret_key, set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or use anonymous=True"
            )
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint = endpoint
        self.region = region
        self.multipart_threshold = int(multipart_threshold)
        self.part_size = int(part_size)
        self.merge_gap = int(merge_gap)
        self.max_concurrency = int(max_concurrency)
        self._secrets = tuple(s for s in (secret_key, session_token) if s)
        where = endpoint or "https://s3.amazonaws.com"
        self.url = f"s3:{where}/{bucket}" + (f"/{prefix}" if prefix else "")
        self.capabilities = Capabilities(
            partial_write=False, append=False, preferred_io_size=8 * MiB, latency=1e-3
        )
        config: dict[str, Any] = {"region": region}
        if endpoint is not None:
            config["endpoint"] = endpoint
        if anonymous:
            config["skip_signature"] = True
        else:
            config["access_key_id"] = access_key
            config["secret_access_key"] = secret_key
            if session_token:
                config["session_token"] = session_token
        self._store = obstore.store.S3Store(
            bucket,
            config=config,
            client_options={
                "allow_http": allow_http,
                "connect_timeout": _td(connect_timeout),
                "read_timeout": _td(read_timeout),
                "timeout": _td(request_timeout),
            },
            retry_config={
                "max_retries": int(retries),
                "retry_timeout": _td(retry_timeout),
                "backoff": {"init_backoff": _td(0.05), "max_backoff": _td(1.0), "base": 2},
            },
        )
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        # (conditional DELETEs, which obstore does not make; False once the store refused one)
        self._signed = SignedClient(
            endpoint, bucket, region,
            None if anonymous else access_key, None if anonymous else secret_key, session_token,
            timeout=connect_timeout + read_timeout, retries=int(retries),
        )  # fmt: skip
        self._conditional_delete = True

    def __repr__(self) -> str:
        return f"S3Backend({self.url!r})"

    # ----------------------------------------------------------------- helpers
    def _path(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _clean(self, text: str) -> str:
        """First line of an obstore message, its server's XML answer replaced by the S3 error
        code and message it holds, with any secret masked."""
        line = text.strip().splitlines()[0] if text.strip() else text
        line = line.split("<?xml", 1)[0].rstrip(" :")
        code = _XML_CODE.search(text)
        if code:
            said = _XML_MESSAGE.search(text)
            line += f": {code.group(1)}" + (f" ({said.group(1)})" if said else "")
        elif kind := _HTTP_KIND.search(text):  # (no answer: the connection's failure, and why)
            said = _OS_MESSAGE.search(text)
            line += f" ({kind.group(1).lower()}" + (f": {said.group(1)})" if said else ")")
        for s in self._secrets:
            line = line.replace(s, "***")
        return line

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        """Map obstore's exceptions to strataio's, naming the key and endpoint."""
        try:
            yield
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise StoreMissingError(
                    f"{self.url}: bucket {self.bucket!r} does not exist ({op} {key!r})"
                ) from exc
            raise NotFoundError(f"no object {key!r} in {self.url}") from exc
        except (PermissionDeniedError, UnauthenticatedError) as exc:
            raise BackendError(
                f"{self.url}: {op} {key!r} refused (access denied; check the credentials): "
                f"{self._clean(str(exc))}"
            ) from exc
        except ObstoreError as exc:
            if "<Code>NoSuchBucket</Code>" in str(exc):  # (a listing's, say)
                raise StoreMissingError(
                    f"{self.url}: bucket {self.bucket!r} does not exist ({op} {key!r})"
                ) from exc
            err = BackendError(f"{self.url}: {op} {key!r} failed: {self._clean(str(exc))}")
            code = _XML_CODE.search(str(exc))
            if code and code.group(1) in _OBJECT_CODES:
                err.errno = _OBJECT_CODES[code.group(1)]  # (see _OBJECT_CODES)
            raise err from exc

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="s3")
            return self._pool

    def _put(self, path: str, data: memoryview, mode: Any = None) -> Version:
        """One PUT (a multipart upload above the threshold, unless ``mode`` makes it
        conditional); the version (:meth:`object_versions`) of the object it put."""
        if mode is None and len(data) > self.multipart_threshold:
            got = obstore.put(
                self._store,
                path,
                data,
                use_multipart=True,
                chunk_size=self.part_size,
                max_concurrency=self.max_concurrency,
            )
        else:
            got = obstore.put(self._store, path, data, mode=mode, use_multipart=False)
        return _version(got)

    def _ranges(self, key: str, path: str, starts: np.ndarray, ends: np.ndarray) -> list[Any]:
        """Fetch sorted disjoint byte ranges; parts past the end of the object come back short
        (or empty). The first range is fetched alone to learn the object's size, so no request
        asks for a range that starts past the end."""
        with self._errors("GET", key):
            try:
                first = obstore.get(
                    self._store, path, options={"range": (int(starts[0]), int(ends[0]))}
                )
                size = int(first.meta["size"])
                out = [first.bytes()]
            except ObstoreError as exc:
                if "416" not in str(exc):
                    raise
                # the first range starts past the end: HEAD tells the size
                size = int(obstore.head(self._store, path)["size"])
                if size > starts[0]:
                    raise
                out = [b""]
        s = starts[1:]
        e = np.minimum(ends[1:], size)
        live = e > s
        if live.any():
            with self._errors("GET", key):
                got = obstore.get_ranges(
                    self._store, path, starts=s[live].tolist(), ends=e[live].tolist(), coalesce=0
                )
            it = iter(got)
            out.extend(next(it) if ok else b"" for ok in live.tolist())
        else:
            out.extend(b"" for _ in range(len(s)))
        return out

    # ----------------------------------------------------------------- Backend
    def read(self, key: str, extents: Extents) -> bytearray:
        """The pieces at their positions ``extents.mem``; bytes past the end read as zeros."""
        path = self._path(key)
        out = bytearray(int((extents.mem + extents.lengths).max(initial=0)))
        ext = extents.compact()
        if len(ext) == 0:
            if not self.exists(key):
                raise NotFoundError(f"no object {key!r} in {self.url}")
            return out
        # requests: the byte set of the pieces, with gaps up to merge_gap bridged
        u = ext.union()
        brk = np.flatnonzero(u.offsets[1:] - u.ends[:-1] > self.merge_gap) + 1
        first = np.concatenate(([0], brk))
        starts = u.offsets[first]
        ends = np.maximum.reduceat(u.ends, first)
        bufs = self._ranges(key, path, starts, ends)
        # stage the responses back to back (short ones zero-padded), then gather the pieces
        base = np.concatenate(([0], np.cumsum(ends - starts)))
        stage = np.zeros(int(base[-1]), dtype=np.uint8)
        for b0, buf in zip(base[:-1].tolist(), bufs):
            n = len(buf)
            if n:
                stage[b0 : b0 + n] = np.frombuffer(buf, dtype=np.uint8)
        j = np.searchsorted(starts, ext.offsets, side="right") - 1
        src = base[j] + (ext.offsets - starts[j])
        copy_pieces(np.frombuffer(out, dtype=np.uint8), ext.mem, stage, src, ext.lengths)
        return out

    def write(self, key: str, extents: Extents, data: BytesLike) -> None:
        """Read-modify-write of the whole object (created, and grown with zeros, as needed),
        committed by a conditional single PUT (so objects up to S3's 5 GiB PUT limit)."""
        path = self._path(key)
        ext = extents.compact()
        src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        need = int((ext.mem + ext.lengths).max(initial=0))
        if src.size < need:
            raise ShapeMismatchError(
                f"write {key!r}: the extents need {need} bytes of data, got {src.size}"
            )
        for attempt in range(RMW_ATTEMPTS):
            if attempt:  # lost a race: let the winner's PUT settle, desynchronize the losers
                time.sleep(random.uniform(0, 0.005 * attempt))
            with self._errors("GET", key):
                try:
                    cur = obstore.get(self._store, path)
                    old = cur.bytes()
                    tag = {k: cur.meta[k] for k in ("e_tag", "version") if cur.meta[k]}
                    mode: Any = tag or "overwrite"  # a store without ETags: last writer wins
                except FileNotFoundError as exc:
                    if "NoSuchBucket" in str(exc):
                        raise
                    old, mode = b"", "create"
            if len(ext) == 0 and mode != "create":
                return
            buf = np.zeros(max(len(old), ext.last), dtype=np.uint8)
            buf[: len(old)] = np.frombuffer(old, dtype=np.uint8)
            copy_pieces(buf, ext.offsets, src, ext.mem, ext.lengths)
            try:
                with self._errors("PUT", key):
                    self._put(path, memoryview(buf), mode=mode)
                return
            except BackendError as exc:
                if not isinstance(exc.__cause__, PreconditionError | AlreadyExistsError):
                    raise
        raise BackendError(
            f"{self.url}: write {key!r} lost {RMW_ATTEMPTS} races with concurrent writers"
        )

    def key_problem(self, key: str) -> str:
        """Why ``key`` can name no object here: its S3 key (the prefix's, then its own) over
        the :data:`KEY_BYTES` an S3 key may have; "" where it can."""
        n = len(self._path(key).encode("utf-8", "surrogatepass"))
        if n <= KEY_BYTES:
            return ""
        return f"its S3 key of {n} bytes is over the {KEY_BYTES} bytes an S3 key may have"

    def get(self, key: str) -> memoryview:
        path = self._path(key)
        with self._errors("GET", key):
            return memoryview(obstore.get(self._store, path).bytes())

    def put(self, key: str, data: BytesLike, *, durable: bool = False) -> None:
        self.put_versioned(key, data)

    # Object versions are (ETag, version id) pairs, the tokens S3's conditional requests
    # compare: puts that must find a version (put_if) or no object (put_new) are conditional
    # PUTs (If-Match, If-None-Match: *), and delete_if a conditional DELETE, each atomic at
    # the server. An ETag is a hash of the bytes, so two puts of the same bytes have one
    # version where the bucket keeps no version ids.
    def put_versioned(self, key: str, data: BytesLike, *, durable: bool = False) -> Version:
        path = self._path(key)
        with self._errors("PUT", key):
            return self._put(path, memoryview(data).cast("B"))

    def put_new(self, key: str, data: BytesLike, *, durable: bool = False) -> Version:
        return self._put_conditional(key, data, "create")

    def put_if(
        self, key: str, data: BytesLike, version: Version | None, *, durable: bool = False
    ) -> Version:
        if version is None:
            return self._put_conditional(key, data, "create")
        etag, vid = version
        return self._put_conditional(
            key, data, {"e_tag": etag, **({"version": vid} if vid else {})}
        )

    def _put_conditional(self, key: str, data: BytesLike, mode: Any) -> Version:
        path = self._path(key)
        try:
            with self._errors("PUT", key):
                return self._put(path, memoryview(data).cast("B"), mode=mode)
        except BackendError as exc:
            if isinstance(exc.__cause__, AlreadyExistsError):
                raise ExistsError(f"object {key!r} exists already in {self.url}") from None
            if isinstance(exc.__cause__, PreconditionError):
                raise ExistsError(
                    f"object {key!r} in {self.url} changed since it was looked at"
                ) from None
            raise

    def delete_if(self, key: str, version: Version) -> bool:
        """Delete the object only while it is at ``version``: a DELETE with ``If-Match`` its
        ETag (or of that version id), which the server checks and applies in one step, so a
        put by another process between this process's look and its delete is never the
        object deleted. A look comes first all the same: a store that ignores the header
        deletes only what the look found. Where the store refuses the header, a look and a
        delete in two steps, from then on."""
        if self.object_versions([key]) != [version]:
            return False
        if self._conditional_delete:
            etag, vid = version
            try:
                return self._signed.delete_if(self._path(key), etag, vid)
            except ConditionNotSupported:
                self._conditional_delete = False
        self.delete(key)
        return True

    def delete_if_many(self, keys: Sequence[str], versions: Sequence[Version]) -> list[bool]:
        if len(keys) < 2:
            return super().delete_if_many(keys, versions)
        return list(self._executor().map(self.delete_if, keys, versions))

    def object_versions(self, keys: Sequence[str]) -> list[Version | None]:
        """Per key the object's (ETag, version id), None where there is none: one HEAD per
        key, run in parallel."""
        keys = list(keys)

        def one(k: str) -> Version | None:
            path = self._path(k)
            try:
                with self._errors("HEAD", k):
                    return _version(obstore.head(self._store, path))
            except NotFoundError:
                return None

        if len(keys) < 2:
            return [one(k) for k in keys]
        return list(self._executor().map(one, keys))

    def size(self, key: str) -> int:
        path = self._path(key)
        with self._errors("HEAD", key):
            return int(obstore.head(self._store, path)["size"])

    def head(self, key: str) -> dict[str, Any]:
        """The object's metadata: ``size`` (bytes), ``e_tag``, ``last_modified``, ``version``.

        A multipart upload's ETag ends in ``-<parts>``.
        """
        path = self._path(key)
        with self._errors("HEAD", key):
            meta = dict(obstore.head(self._store, path))
        meta["path"] = key
        return meta

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except NotFoundError:
            return False
        return True

    def delete(self, key: str) -> None:
        path = self._path(key)
        with self._errors("DELETE", key):
            obstore.delete(self._store, path)

    def list(self, prefix: str = "") -> Iterator[str]:
        p = prefix.strip("/")
        if p:
            validate_key(p)
        full = "/".join(x for x in (self.prefix, p) if x)
        strip = len(self.prefix) + 1 if self.prefix else 0
        want = p + "/" if p else ""
        keys: list[str] = []
        with self._errors("LIST", prefix):
            for batch in obstore.list(self._store, full or None):
                keys.extend(m["path"][strip:] for m in batch)
        yield from sorted(k for k in keys if k.startswith(want))

    def get_many(self, keys: Iterable[str]) -> list[BytesLike | None]:
        keys = list(keys)
        for k in keys:
            validate_key(k)

        def one(k: str) -> BytesLike | None:
            try:
                return self.get(k)
            except NotFoundError:
                return None

        if len(keys) < 2:
            return [one(k) for k in keys]
        return list(self._executor().map(one, keys))

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._signed.close()
