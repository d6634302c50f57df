"""What commands need from the configuration: its catalog and a Session over its tiers.

Every command that needs the catalog creates it from the configuration when it is missing,
as :class:`strataio.Session` does, and registers the configured tiers in it (keeping the
up/down state the catalog holds for tiers it knows): no command tells the user to run another
one first. A POSIX tier's directory is made by a command only where the tier is new to the
catalog; one missing where the catalog knows the tier leaves it down until it is mounted or
put back, or ``strataio init`` makes it new and empty (``--remake-tier`` where the catalog
records copies there).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from strataio.catalog import Catalog, TierRecord, open_catalog
from strataio.config import Config, TierConfig, load_config
from strataio.errors import ConfigError
from strataio.tiers.tier import register_configured_tiers

if TYPE_CHECKING:
    from strataio.session import Session


def catalog_exists(cfg: Config) -> bool | None:
    """Whether the configured catalog exists already: known for an SQLite file, ``None``
    (unknown without connecting) for a database server."""
    url = cfg.catalog.url
    if "://" in url and not url.startswith("sqlite://"):
        return None
    return os.path.exists(url.removeprefix("sqlite://"))


def open_configured_catalog(
    cfg: Config, *, make_dirs: bool = True
) -> tuple[Catalog, list[TierRecord]]:
    """Open (creating when missing) the catalog of ``cfg`` and register its tiers; returns the
    catalog and the tiers it did not know before.

    A tier is set up as it is registered: the directory of a POSIX tier new to the catalog
    (and not read-only) is made where missing, as a Session makes it (one that cannot be made
    is left for the session to report: the tier is then down), since a Session makes no
    directory of a tier the catalog knows. ``make_dirs`` false leaves that to the caller
    (``strataio init``, which says what it made)."""
    catalog = open_catalog(cfg.catalog.url)  # a file that cannot be made: BackendError
    try:
        new = register_configured_tiers(catalog, cfg, make_dirs=make_dirs)
    except BaseException:
        catalog.close()
        raise
    return catalog, new


def make_tier_dirs(cfg: Config, *, keep: Collection[str] = ()) -> list[tuple[TierConfig, Path]]:
    """Create the directories of the configured POSIX tiers that do not exist, but those of
    the tiers named in ``keep`` and of read-only tiers (which must hold their data: an empty
    directory made in a volume's place would only hide it); returns each tier made so, with
    its directory.

    This is ``strataio init``'s, and the one way a directory of a tier the catalog already
    knows is made again, new and empty (a Session makes only those of tiers new to the
    catalog: one missing where the catalog knows the tier is a volume not mounted, or a
    directory removed, and leaves that tier down)."""
    return [
        (t, path)
        for t in cfg.tiers
        if t.name not in keep and not t.read_only and (path := _make_tier_dir(cfg, t)) is not None
    ]


def missing_tier_dir(t: TierConfig) -> bool:
    """Whether ``t`` is a POSIX tier whose directory is missing."""
    return t.kind == "posix" and t.path is not None and not os.path.isdir(t.path)


def _make_tier_dir(cfg: Config, t: TierConfig) -> Path | None:
    """Make the directory of tier ``t`` of ``cfg`` where it is a POSIX tier's and missing;
    returns it where made. One that cannot be made: :class:`ConfigError`."""
    if not missing_tier_dir(t):
        return None
    try:
        os.makedirs(t.path, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the directory of tier {t.name!r} configured in "
            f"{cfg.source or 'the default configuration'}: {exc}"
        ) from None
    return Path(t.path)


def open_session(config: str | os.PathLike[str] | None, *, stage_on_read: bool = True) -> Session:
    """A Session on the configuration at ``config`` (or the one found as usual). A POSIX tier
    whose directory cannot be used is down (see ``tier_from_config``), and so is one the
    catalog knows whose directory is missing, which is not made again (:func:`make_tier_dirs`,
    ``strataio init``, does that); any other tier that cannot be set up is a configuration
    problem (:class:`ConfigError`, exit 2). ``stage_on_read`` false: reads leave chunks where
    they are (a command that only looks)."""
    from strataio.session import Session

    cfg = load_config(config)  # ConfigError: exit 2
    return Session(cfg, stage_on_read=stage_on_read)
