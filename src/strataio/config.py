"""The strataio configuration: where the catalog lives and which storage tiers exist.

A TOML file, looked for at ``./strataio.toml``, then at ``$STRATAIO_CONFIG``; with neither,
the embedded default (:func:`default_config_text`): an SQLite catalog and three POSIX tiers under
``./.strataio/`` (local; a remote disk and a tape archive shaped by the paper's 2002 cost models
at time scale 0.001). Relative paths in a file are relative to the file's directory (to the
working directory for the default). Tiers are listed fastest first.

Credentials are never printed: they are left out of every ``repr`` and message. A value of the
form ``"${NAME}"`` is read from the environment variable ``NAME`` when the file is loaded.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strataio.catalog.base import TIER_ROLES, TierRecord, redact_url
from strataio.errors import ConfigError
from strataio.sizes import parse_size

#: file looked for in the working directory, and the variable naming a file elsewhere
CONFIG_FILENAME = "strataio.toml"
CONFIG_ENV = "STRATAIO_CONFIG"

TIER_KINDS = ("posix", "s3", "memory")
#: credential keys an S3 tier accepts
CREDENTIAL_KEYS = ("access_key_id", "secret_access_key", "session_token")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


@dataclass(frozen=True, slots=True)
class CatalogConfig:
    """Where the catalog is: an SQLite file path (absolute) or a ``postgresql://`` URL."""

    url: str = field(repr=False)

    @property
    def display_url(self) -> str:
        """The URL with any password masked, for listings and messages."""
        return redact_url(self.url)

    def __repr__(self) -> str:
        return f"CatalogConfig(url={self.display_url!r})"


@dataclass(frozen=True, slots=True)
class TierConfig:
    """One storage tier, as configured.

    ``capacity_bytes`` is ``None`` for unbounded. ``path`` (posix; absolute) or ``bucket`` /
    ``prefix`` / ``endpoint`` / ``region`` (s3) locate the storage; ``credentials`` holds
    ``access_key_id`` / ``secret_access_key`` / ``session_token`` when given (else the S3
    client's own environment lookup applies). ``shaped`` names a latency/bandwidth model laid
    over the backend (e.g. ``"remote_tape_2002"``), with its times multiplied by
    ``time_scale`` (0: account only, no sleeping). ``concurrency`` caps simultaneous
    transfers on the tier (``None``: the role's default). ``read_only``: storage this
    process may read but not write (:attr:`strataio.tiers.tier.Tier.read_only`).
    """

    name: str
    kind: str
    role: str
    capacity_bytes: int | None = None
    path: str | None = None
    bucket: str | None = None
    prefix: str = ""
    endpoint: str | None = None
    region: str | None = None
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    shaped: str | None = None
    time_scale: float = 1.0
    concurrency: int | None = None
    read_only: bool = False

    @property
    def url(self) -> str:
        """A short locator: ``posix:/abs/path``, ``s3://bucket/prefix``, ``memory:name``."""
        if self.kind == "posix":
            return f"posix:{self.path}"
        if self.kind == "s3":
            return f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return f"memory:{self.name}"

    def record(self, order: int) -> TierRecord:
        """This tier as a catalog row, at position ``order`` (0 = fastest)."""
        return TierRecord(self.name, self.url, self.role, self.capacity_bytes, order)


@dataclass(frozen=True, slots=True)
class Config:
    """A loaded configuration. ``source`` is the file it came from (``None``: the default)."""

    catalog: CatalogConfig
    tiers: tuple[TierConfig, ...]
    source: str | None = None

    def tier(self, name: str) -> TierConfig:
        """The tier of that name; :class:`ConfigError` if there is none."""
        for t in self.tiers:
            if t.name == name:
                return t
        known = ", ".join(t.name for t in self.tiers)
        raise ConfigError(f"no tier {name!r} in {self._where()} (tiers: {known})")

    def tier_records(self) -> list[TierRecord]:
        """The tiers as catalog rows, fastest first."""
        return [t.record(i) for i, t in enumerate(self.tiers)]

    def _where(self) -> str:
        return self.source or "the default configuration"


def default_config_text() -> str:
    """The commented TOML that ``strataio init`` writes, and the configuration in force when
    no file is found."""
    return """\
# strataio configuration. Relative paths are relative to this file's directory.
# Looked for at ./strataio.toml, then at $STRATAIO_CONFIG.

[catalog]
# An SQLite file (embedded, zero setup), or a PostgreSQL URL for multi-node use, e.g.
# url = "postgresql://user@dbhost/strataio"
url = ".strataio/catalog.db"

# Storage tiers, FASTEST FIRST. Each has:
#   name      a short identifier used in placement and on the command line
#   kind      posix | s3 | memory
#   role      memory | localdisk | remotedisk | remotetape (what location hints map to)
#   capacity  optional: bytes, or a string like "10GiB" / "500GB"; absent = unbounded
#   path      (posix) a directory, made when the catalog first meets the tier; once the
#             catalog knows the tier, a missing one (a volume not mounted) leaves the tier
#             down and is not made again (`strataio init` makes it, new and empty)
#   bucket, prefix, endpoint, region   (s3)
#   credentials = { access_key_id = "${AWS_ACCESS_KEY_ID}", secret_access_key = "${AWS_SECRET_ACCESS_KEY}" }
#             (s3) "${NAME}" reads an environment variable; absent = the S3 client's defaults
#   shaped    optional latency/bandwidth model over the tier: "remote_disk_2002" or
#             "remote_tape_2002" (the 2002 SRB/HPSS measurements),
#   time_scale  with its times multiplied by this factor (e.g. 0.001 for tests; 0 = no delay)
#   concurrency optional: at most this many simultaneous transfers on the tier
#   read_only optional: true for storage that is read but never written (a read-only mount,
#             an archive served to readers): no writes, moves or evictions go there, and
#             its health probe only reads (a writable tier whose storage turns out to
#             refuse writes, a file system remounted read-only, is read-only for a while)

[[tiers]]
name = "local"
kind = "posix"
role = "localdisk"
path = ".strataio/local"

# A remote disk and a tape archive, both posix folders here, shaped to cost what the paper's
# 2002 SRB remote disk and HPSS tapes cost, at a thousandth of their time (remove `shaped` for
# a real remote mount; raise time_scale toward 1 for the full cost).
[[tiers]]
name = "remote"
kind = "posix"
role = "remotedisk"
path = ".strataio/remote"
shaped = "remote_disk_2002"
time_scale = 0.001

[[tiers]]
name = "archive"
kind = "posix"
role = "remotetape"
path = ".strataio/archive"
shaped = "remote_tape_2002"
time_scale = 0.001
"""


def find_config() -> Path | None:
    """The file :func:`load_config` would read: ``./strataio.toml``, else ``$STRATAIO_CONFIG``
    (which must then exist), else ``None``."""
    here = Path.cwd() / CONFIG_FILENAME
    if here.is_file():
        return here
    env = os.environ.get(CONFIG_ENV)
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise ConfigError(f"${CONFIG_ENV} names {env!r}, which is not a file")
        return p
    return None


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load and validate the configuration: ``path`` if given, else as :func:`find_config`
    finds it, else the embedded default. Raises :class:`ConfigError` naming the file and the
    key for anything missing, misspelled or malformed."""
    if path is not None:
        file: Path | None = Path(path).expanduser()
        if not file.is_file():
            raise ConfigError(f"configuration file {os.fspath(path)!r} does not exist")
    else:
        file = find_config()
    if file is None:
        data = tomllib.loads(default_config_text())
        return _build(data, base=Path.cwd(), source=None)
    try:
        with open(file, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{file}: not valid TOML: not UTF-8 text (byte {exc.start}), a binary file?"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror or exc}") from None
    file = file.resolve()
    return _build(data, base=file.parent, source=str(file))


# -- validation ---------------------------------------------------------------------------


class _Reader:
    """Typed access to one TOML table, with messages naming the file and the key."""

    def __init__(self, table: Mapping[str, Any], where: str, prefix: str) -> None:
        self.table, self.where, self.prefix = table, where, prefix
        self.used: set[str] = set()

    def key(self, k: str) -> str:
        return f"{self.prefix}{k}"

    def fail(self, k: str, msg: str) -> ConfigError:
        return ConfigError(f"{self.where}: {self.key(k)}: {msg}")

    def get(self, k: str, types: type | tuple[type, ...], default: Any = None, *, need=False):
        self.used.add(k)
        if k not in self.table:
            if need:
                raise ConfigError(f"{self.where}: {self.key(k)} is missing")
            return default
        v = self.table[k]
        if not isinstance(v, types) or isinstance(v, bool) and bool not in _tuple(types):
            names = " or ".join(t.__name__ for t in _tuple(types))
            raise self.fail(k, f"expected {names}, got {type(v).__name__}")
        return v

    def finish(self) -> None:
        extra = sorted(set(self.table) - self.used)
        if extra:
            raise self.fail(extra[0], f"unknown key (known: {', '.join(sorted(self.used))})")


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _resolve(base: Path, p: str) -> str:
    return str((base / Path(p).expanduser()).resolve())


def _env(value: str, where: str) -> str:
    m = _ENV_REF.match(value)
    if not m:
        return value
    got = os.environ.get(m.group(1))
    if got is None:
        raise ConfigError(f"{where}: environment variable {m.group(1)} is not set")
    return got


def _build(data: Mapping[str, Any], *, base: Path, source: str | None) -> Config:
    where = source or "default configuration"
    top = _Reader(data, where, "")
    cat_table = top.get("catalog", dict, {})
    tier_list = top.get("tiers", list, need=True)
    top.finish()

    cat = _Reader(cat_table, where, "catalog.")
    url = cat.get("url", str, ".strataio/catalog.db")
    cat.finish()
    if not url:
        raise cat.fail("url", "is empty")
    if url.startswith(("postgresql://", "postgres://")):
        catalog = CatalogConfig(url)
    elif url.startswith("sqlite://"):
        catalog = CatalogConfig(_resolve(base, url[len("sqlite://") :]))
    elif "://" in url:
        raise cat.fail(
            "url", f"unsupported scheme in {redact_url(url)!r} (use a path or postgresql://)"
        )
    else:
        catalog = CatalogConfig(_resolve(base, url))

    if not tier_list:
        raise ConfigError(f"{where}: tiers: at least one tier is needed")
    tiers: list[TierConfig] = []
    for i, raw in enumerate(tier_list):
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: tiers[{i}]: expected a table ([[tiers]])")
        tiers.append(_tier(raw, where, i, base))
    names = [t.name for t in tiers]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{where}: tiers: name {dup[0]!r} is used twice")
    return Config(catalog, tuple(tiers), source)


def _tier(raw: Mapping[str, Any], where: str, i: int, base: Path) -> TierConfig:
    r = _Reader(raw, where, f"tiers[{i}].")
    name = r.get("name", str, need=True)
    r.prefix = f"tiers[{i}] ({name}): "
    if not _NAME.match(name):
        raise r.fail("name", f"{name!r} is not a valid tier name (letters, digits, _ . -)")
    kind = r.get("kind", str, need=True)
    if kind not in TIER_KINDS:
        raise r.fail("kind", f"{kind!r} is not one of {', '.join(TIER_KINDS)}")
    role = r.get("role", str, need=True)
    if role not in TIER_ROLES:
        raise r.fail("role", f"{role!r} is not one of {', '.join(TIER_ROLES)}")
    if kind == "memory" and role != "memory":
        # a persistent role would catalogue copies that die with the process
        raise r.fail(
            "role",
            f"{role!r} keeps data across processes; a tier of kind 'memory' can only "
            "have role 'memory'",
        )
    capacity = parse_size(r.get("capacity", (int, str)), where=f"{where}: {r.key('capacity')}")
    shaped = r.get("shaped", str)
    if shaped is not None:
        from strataio.storage.shaped import PRESETS

        if shaped not in PRESETS:
            raise r.fail(
                "shaped", f"unknown model {shaped!r} (known: {', '.join(sorted(PRESETS))})"
            )
    time_scale = float(r.get("time_scale", (int, float), 1.0))
    if time_scale < 0 or not math.isfinite(time_scale):
        raise r.fail("time_scale", f"must be a finite number >= 0, got {time_scale}")
    concurrency = r.get("concurrency", int)
    if concurrency is not None and concurrency < 1:
        raise r.fail("concurrency", f"must be at least 1, got {concurrency}")
    read_only = r.get("read_only", bool, False)
    if read_only and kind == "memory":
        raise r.fail("read_only", "a tier of kind 'memory' holds only what is written to it")
    if "time_scale" in raw and shaped is None:
        raise r.fail("time_scale", "given without 'shaped'")
    kw: dict[str, Any] = {}
    if kind == "posix":
        kw["path"] = _resolve(base, r.get("path", str, need=True))
    elif kind == "s3":
        from urllib.parse import urlsplit

        from strataio.errors import InvalidKeyError
        from strataio.storage.base import validate_key
        from strataio.storage.s3_signed import BUCKET_NAME

        # (checked here, as the S3 backend checks them, rather than at the first Session)
        kw["bucket"] = r.get("bucket", str, need=True)
        if not BUCKET_NAME.match(kw["bucket"]):
            raise r.fail(
                "bucket",
                f"{kw['bucket']!r} is not a valid S3 bucket name (3 to 63 of a-z 0-9 . -, "
                "beginning and ending with a letter or digit)",
            )
        kw["prefix"] = r.get("prefix", str, "").strip("/")
        if kw["prefix"]:
            try:
                validate_key(kw["prefix"])
            except InvalidKeyError as exc:
                raise r.fail("prefix", str(exc)) from None
        kw["endpoint"] = r.get("endpoint", str)
        if kw["endpoint"] is not None and urlsplit(kw["endpoint"]).scheme not in (
            "http",
            "https",
        ):
            raise r.fail("endpoint", f"{kw['endpoint']!r} is not an http(s) URL")
        kw["region"] = r.get("region", str)
        creds = r.get("credentials", dict, {})
        cr = _Reader(creds, where, f"{r.prefix}credentials.")
        kw["credentials"] = {
            k: _env(cr.get(k, str), f"{where}: {cr.key(k)}") for k in CREDENTIAL_KEYS if k in creds
        }
        cr.used.update(CREDENTIAL_KEYS)
        cr.finish()
    r.finish()
    return TierConfig(
        name,
        kind,
        role,
        capacity,
        shaped=shaped,
        time_scale=time_scale,
        concurrency=concurrency,
        read_only=read_only,
        **kw,
    )
