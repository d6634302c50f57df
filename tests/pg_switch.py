"""``STRATAIO_TEST_CATALOG=postgresql``: the tests' SQLite catalogs on one PostgreSQL server.

Each catalog a test opens by file path (``open_catalog``, a Session's config) lands instead
in a schema named by that path, so every process naming one file shares one catalog. Python
children get the same through a ``sitecustomize`` on their ``PYTHONPATH``. Tests that read or copy
the SQLite file itself fail under it; off by default.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from urllib.parse import quote

ENV = "STRATAIO_TEST_CATALOG"
URI_ENV = "STRATAIO_TEST_PG_URI"


def serve(server, folder: Path) -> None:
    """Raise ``server``'s connection limit (a simulated kill leaves its connections open),
    install the switch here and in this process's Python children."""
    import psycopg
    from pgserver._commands import pg_ctl

    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_connections = 2000")
    pg_ctl(["-w", "restart"], pgdata=server.pgdata, user=server.system_user)
    os.environ[URI_ENV] = server.get_uri()
    (folder / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import pg_switch\npg_switch.install()\n"
    )
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(folder), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    install()


def install() -> None:
    """Make an SQLite catalog path open a PostgreSQL catalog in a schema of its own."""
    uri = os.environ.get(URI_ENV)
    if os.environ.get(ENV) != "postgresql" or not uri:
        return
    import psycopg

    from strataio.catalog import postgres, sqlite

    def on_postgresql(path, *args, **kwargs):
        schema = "f_" + hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:16]
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        sep = "&" if "?" in uri else "?"
        cat = postgres.PostgresCatalog(f"{uri}{sep}options={quote(f'-csearch_path={schema}')}")
        cat._locks = _Tokens(cat)  # (the tests' simulated kills release a writer's token so)
        return cat

    sqlite.SQLiteCatalog = on_postgresql


class _Tokens:
    def __init__(self, catalog) -> None:
        self.catalog = catalog

    def release(self, writer: str) -> None:
        self.catalog._release_token(writer)
