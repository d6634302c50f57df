"""What commands need from the configuration: its catalog and a Session over its tiers.

Every command that needs the catalog creates it from the configuration when it is missing,
as :class:`strataio.Session` does, and registers the configured tiers in it (keeping the
up/down state the catalog holds for tiers it knows): no command tells the user to run another
one first.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from strataio.catalog import Catalog, TierRecord, open_catalog
from strataio.config import Config, load_config
from strataio.errors import ConfigError

if TYPE_CHECKING:
    from strataio.session import Session


def catalog_exists(cfg: Config) -> bool | None:
    """Whether the configured catalog exists already: known for an SQLite file, ``None``
    (unknown without connecting) for a database server."""
    url = cfg.catalog.url
    if "://" in url and not url.startswith("sqlite://"):
        return None
    return os.path.exists(url.removeprefix("sqlite://"))


def open_configured_catalog(cfg: Config) -> tuple[Catalog, list[TierRecord]]:
    """Open (creating when missing) the catalog of ``cfg`` and register its tiers; returns the
    catalog and the tiers it did not know before."""
    catalog = open_catalog(cfg.catalog.url)  # a file that cannot be made: BackendError
    try:
        known = {t.name: t for t in catalog.tiers()}
        records = [
            dataclasses.replace(r, state=known[r.name].state) if r.name in known else r
            for r in cfg.tier_records()
        ]
        catalog.register_tiers(records)
    except BaseException:
        catalog.close()
        raise
    return catalog, [r for r in records if r.name not in known]


def make_tier_dirs(cfg: Config) -> list[Path]:
    """Create the directories of the configured POSIX tiers that do not exist; returns them."""
    made = []
    for t in cfg.tiers:
        if t.kind != "posix" or t.path is None or os.path.isdir(t.path):
            continue
        try:
            os.makedirs(t.path, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot create the directory of tier {t.name!r} configured in "
                f"{cfg.source or 'the default configuration'}: {exc}"
            ) from None
        made.append(Path(t.path))
    return made


def open_session(config: str | os.PathLike[str] | None, *, stage_on_read: bool = True) -> Session:
    """A Session on the configuration at ``config`` (or the one found as usual). A POSIX tier
    whose directory cannot be used is down (see ``tier_from_config``); any other tier that
    cannot be set up is a configuration problem (:class:`ConfigError`, exit 2).
    ``stage_on_read`` false: reads leave chunks where they are (a command that only looks)."""
    from strataio.session import Session
    from strataio.tiers.tier import TierSet

    cfg = load_config(config)  # ConfigError: exit 2
    try:
        tiers = TierSet.from_config(cfg)
    except OSError as exc:
        # e.g. a POSIX tier directory that cannot be created: the configuration names it
        where = cfg.source or "the default configuration"
        raise ConfigError(f"cannot set up the tiers configured in {where}: {exc}") from None
    try:
        return Session(cfg, tiers=tiers, stage_on_read=stage_on_read)
    except BaseException:
        tiers.close()
        raise
