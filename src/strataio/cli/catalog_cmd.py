"""Commands over the configuration and the catalog: ``init``, ``ls``, ``du``, ``rm``.

A missing catalog is created from the configuration, as a Session creates it
(:mod:`strataio.cli.context`). Exit status: 0 success; 2 a usage or configuration problem (bad
or missing file, a catalog that cannot be created), with a one-line message; 1 a runtime
failure (database unreachable, I/O error).
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import click
import numpy as np
from rich.markup import escape
from rich.table import Table

from strataio.catalog import Catalog, ChunkCopy, TierRecord, TierUsage
from strataio.cli import main
from strataio.cli.context import (
    catalog_exists,
    make_tier_dirs,
    missing_tier_dir,
    open_configured_catalog,
    open_session,
)
from strataio.cli.output import UsageProblem as _UsageProblem
from strataio.cli.output import handle_errors as _handle_errors
from strataio.cli.output import make_console
from strataio.config import CONFIG_FILENAME, Config, default_config_text, load_config
from strataio.errors import ConfigError, DatasetInUseError, NotFoundError
from strataio.sizes import counted, format_size
from strataio.tiers.remnants import by_dataset

if TYPE_CHECKING:
    from rich.console import Console

    from strataio.tiers.remnants import Deletion
    from strataio.tiers.tier import TierSet

#: what a user runs to delete the objects deleted datasets left on tiers that did not answer
PURGE_COMMAND = "strataio fsck --repair"

_config_option = click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Configuration file (default: ./strataio.toml, then $STRATAIO_CONFIG, then built-in).",
)
_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON, not a table.")


def _dims(t: tuple[int, ...]) -> str:
    return "×".join(map(str, t)) if t else "()"


def _tiers(cfg: Config, catalog: Catalog) -> list[TierRecord]:
    """The configured tiers in the configuration's order (fastest first; the catalog's record
    where it has one), then tiers the catalog still knows that the configuration dropped."""
    known = {t.name: t for t in catalog.tiers()}
    configured = [known.get(t.name) or t.record(i) for i, t in enumerate(cfg.tiers)]
    names = {t.name for t in configured}
    return configured + [t for t in known.values() if t.name not in names]


def _held_per_tier(catalog: Catalog) -> dict[str, tuple[str, bool]]:
    """What ``catalog`` records on each tier holding anything, in words (its chunk copies
    and their bytes, the objects of deleted datasets still to purge), and whether the
    latter (remnants) are among it."""
    copies: dict[str, tuple[int, int]] = {}
    for u in catalog.usage():
        n, nbytes = copies.get(u.tier, (0, 0))
        copies[u.tier] = (n + u.copies, nbytes + u.nbytes)
    deleted: dict[str, int] = {}
    for _, tier in catalog.remnants():
        deleted[tier] = deleted.get(tier, 0) + 1
    held = {}
    for tier in dict.fromkeys([*copies, *deleted]):
        parts = []
        if tier in copies:
            n, nbytes = copies[tier]
            parts.append(f"{counted(n, 'chunk copy', 'chunk copies')} ({format_size(nbytes)})")
        if tier in deleted:
            parts.append(f"the objects of {counted(deleted[tier], 'deleted dataset')}")
        held[tier] = (" and ".join(parts), tier in deleted)
    return held


@main.command("init")
@click.option("--force", is_flag=True, help=f"Overwrite an existing ./{CONFIG_FILENAME}.")
@click.option(
    "--remake-tier",
    "remake",
    multiple=True,
    metavar="NAME",
    help="Make the missing directory of tier NAME new and empty although the catalog records "
    "copies or deleted datasets' objects there (they are then gone). Repeatable.",
)
@_handle_errors
def init_cmd(force: bool, remake: tuple[str, ...]) -> None:
    """Write a commented ./strataio.toml, then create what it names that is missing: the
    catalog (with the configured tiers) and the POSIX tier directories.

    An existing ./strataio.toml is kept (--force overwrites it with the default): init then
    only creates what is missing, and says what it did. The missing directory of a tier on
    which the catalog records chunk copies, or objects of deleted datasets still to purge, is
    not made (a volume not mounted would be replaced by
    an empty directory on another disk, which later writes would fill and a mount would
    hide): init says so and exits 1, unless --remake-tier names that tier."""
    target = Path.cwd() / CONFIG_FILENAME
    if remake and (force or not target.exists()):
        # (the default's tiers: a name not among them is refused before the file is written)
        import tomllib

        _check_remake_names(remake, tomllib.loads(default_config_text())["tiers"], str(target))
    if target.exists() and not force:
        try:
            cfg = load_config(target)
        except ConfigError as exc:
            raise _UsageProblem(
                f"{exc}; fix {target}, or run `strataio init --force` to replace it with the "
                "default"
            ) from None
        click.echo(f"kept {target} (--force replaces it with the default)")
    else:
        target.write_text(default_config_text())
        cfg = load_config(target)
        click.echo(f"wrote {target}")
    _check_remake_names(
        remake, [{"name": t.name} for t in cfg.tiers], cfg.source or "the configuration"
    )
    fixed = sorted(t.name for t in cfg.tiers if t.name in remake and t.read_only)
    if fixed:
        raise _UsageProblem(
            f"--remake-tier: tier {', '.join(map(repr, fixed))} is read-only: nothing makes "
            "its directory (it must hold its data)"
        )
    created = False
    existed = catalog_exists(cfg)
    catalog, new_tiers = open_configured_catalog(cfg, make_dirs=False)  # (made below)
    try:
        held = _held_per_tier(catalog)
    finally:
        catalog.close()
    names = ", ".join(f"{t.name} ({t.role})" for t in new_tiers)
    if existed is False:
        click.echo(f"created catalog {cfg.catalog.display_url} with tiers {names}")
        created = True
    elif new_tiers:
        click.echo(f"catalog {cfg.catalog.display_url}: registered tiers {names}")
        created = True
    for t in cfg.tiers:
        if t.name in remake and not missing_tier_dir(t):
            click.echo(
                f"tier {t.name!r}: its directory {t.path} is in place, not made anew "
                "(--remake-tier makes only a missing one)"
            )
    kept = {name: what for name, what in held.items() if name not in remake}
    for made, path in make_tier_dirs(cfg, keep=set(kept)):
        lost = ""
        if made.name in held:
            what, remnants = held[made.name]
            lost = (
                f" (new and empty: {what} the catalog records there are gone; "
                f"`{PURGE_COMMAND}` drops the rows of copies with another copy elsewhere"
                + (" and forgets those remnants" if remnants else "")
                + ", and a chunk with no other copy stays lost until it is written again or "
                "its dataset deleted: `strataio rm`)"
            )
        click.echo(f"created tier directory {path}{lost}")
        created = True
    absent = [t for t in cfg.tiers if t.read_only and missing_tier_dir(t)]
    for t in absent:
        recorded = f", and the catalog records {held[t.name][0]} there" if t.name in held else ""
        click.echo(
            f"{'error' if recorded else 'note'}: tier {t.name!r} is read-only: its directory "
            f"{t.path} is missing{recorded}: not made (it must hold its data: mount it or "
            "put it back)",
            err=True,
        )
    refused = [t for t in cfg.tiers if t.name in kept and missing_tier_dir(t) and not t.read_only]
    if any(t.name in held for t in absent):
        sys.exit(1)
    for t in refused:
        click.echo(
            f"error: tier {t.name!r}: its directory {t.path} is missing, and the catalog records "
            f"{kept[t.name][0]} there: not made (a volume not mounted?). Mount it or put it "
            "back; to make it new and empty, losing what is recorded there, run "
            f"`strataio init --remake-tier {t.name}`",
            err=True,
        )
    if refused:
        sys.exit(1)
    if not created:
        click.echo(
            f"catalog {cfg.catalog.display_url} and every tier are in place: nothing to create"
        )


def _check_remake_names(remake: tuple[str, ...], tiers: list[dict], source: str) -> None:
    """Refuse (usage error) the ``--remake-tier`` names that no tier of ``tiers`` (tables
    with a ``name``, as configured in ``source``) has."""
    unknown = sorted(set(remake) - {t.get("name") for t in tiers})
    if unknown:
        raise _UsageProblem(f"--remake-tier: no tier {', '.join(map(repr, unknown))} in {source}")


@main.command("ls")
@_config_option
@_json_option
@click.option(
    "--remnants",
    is_flag=True,
    help="List the deleted datasets whose objects still wait on a tier to be purged.",
)
@_handle_errors
def ls_cmd(config_path: Path | None, as_json: bool, remnants: bool) -> None:
    """List the datasets in the catalog, with their chunk copies per tier.

    An array shows its shape, dtype and chunks (their number in brackets). A superfile
    (kind "superfile": named members packed into containers, see
    ``Session.superfile``) shows no shape or dtype; its chunks are its sealed containers,
    listed as their number and the size they close at, and its size is their bytes. Its
    members are not counted (that reads every container's index; ``strataio info NAME``
    does): --json gives ``containers`` and ``container_bytes``.

    With --remnants, the deleted datasets whose objects may still lie on a tier (it was down
    or read-only when they were deleted, or an object refused its deletion), with the
    tiers and their state: ``strataio fsck --repair`` purges them from the tiers that
    answer, and until then no dataset of such a name can be created. A plain listing says
    how many there are below its table.
    """
    from strataio.tiers.superfile import is_superfile, record_container_bytes

    cfg = load_config(config_path)
    if remnants:
        _ls_remnants(cfg, as_json)
        return
    with open_configured_catalog(cfg)[0] as catalog:
        deleted = {d for d, _ in catalog.remnants()}
        datasets = catalog.list_datasets()
        usage = catalog.usage()
        tiers = _tiers(cfg, catalog)
        # a superfile's containers, one size each however many tiers hold copies
        containers = {
            d.name: _distinct_chunks(catalog.residency(d.name)) for d in datasets if is_superfile(d)
        }
    per: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    for u in usage:
        per[u.dataset][u.tier] = (u.copies, u.nbytes)
    rows = []
    for d in datasets:
        row: dict[str, object] = {"name": d.name}
        if d.name in containers:
            sizes = containers[d.name]
            row.update(kind="superfile", shape=None, dtype=None, chunks=None)
            row.update(nchunks=len(sizes), containers=len(sizes))
            row.update(container_bytes=record_container_bytes(d))
            size: int | None = sum(sizes.values())
        else:
            grid = [math.ceil(s / c) if c else 0 for s, c in zip(d.shape, d.chunks)]
            try:
                size = math.prod(d.shape) * np.dtype(d.dtype).itemsize
            except TypeError:
                size = None
            row.update(kind="array", shape=list(d.shape), dtype=d.dtype, chunks=list(d.chunks))
            row.update(nchunks=math.prod(grid))
        row.update(
            hint=d.hint,
            state=d.state,
            size_bytes=size,
            stored_bytes=sum(b for _, b in per[d.name].values()),
            chunks_per_tier={t.name: per[d.name].get(t.name, (0, 0))[0] for t in tiers},
        )
        rows.append(row)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    console = make_console()
    if not rows:
        console.print(f"no datasets in catalog {cfg.catalog.display_url}")
        _remnants_note(console, len(deleted))
        return
    table = Table(title=f"datasets in {cfg.catalog.display_url}")
    for col in ("name", "kind", "shape", "dtype", "chunks", "hint", "state", "size", "stored"):
        table.add_column(col, justify="right" if col in ("size", "stored") else "left")
    for t in tiers:
        table.add_column(f"on {t.name}", justify="right")
    for r in rows:
        if r["kind"] == "superfile":
            n = r["containers"]
            shape, dtype = "-", "-"
            chunks = f"{counted(n, 'container')} (close at {format_size(r['container_bytes'])})"
        else:
            shape, dtype = _dims(tuple(r["shape"])), r["dtype"]
            chunks = f"{_dims(tuple(r['chunks']))} ({r['nchunks']})"
        table.add_row(
            r["name"],
            r["kind"],
            shape,
            dtype,
            chunks,
            r["hint"],
            r["state"],
            format_size(r["size_bytes"]),
            format_size(r["stored_bytes"]),
            *(str(r["chunks_per_tier"][t.name]) for t in tiers),
        )
    console.print(table)
    _remnants_note(console, len(deleted))


def _remnants_note(console: Console, deleted: int) -> None:
    """Below a listing: how many deleted datasets still have objects waiting to be purged
    (nothing where none has)."""
    if deleted:
        one = deleted == 1
        console.print(
            f"{counted(deleted, 'deleted dataset')} {'has' if one else 'have'} objects "
            f"waiting to be purged: 'strataio ls --remnants' lists them, '{PURGE_COMMAND}' "
            "purges them",
            highlight=False,
        )


def _ls_remnants(cfg: Config, as_json: bool) -> None:
    """``strataio ls --remnants``: each deleted dataset whose objects may remain on a tier
    (:meth:`Catalog.remnants`), with those tiers and their state."""
    with open_configured_catalog(cfg)[0] as catalog:
        left = catalog.remnants()
        tiers = {t.name: t for t in _tiers(cfg, catalog)}
    configured = {t.name for t in cfg.tiers}
    by_ds = by_dataset(left)
    if as_json:
        click.echo(json.dumps([{"dataset": d, "tiers": t} for d, t in by_ds.items()], indent=2))
        return
    console = make_console()
    if not by_ds:
        console.print(
            f"no remnants in catalog {cfg.catalog.display_url}: every deleted dataset's "
            "objects are gone",
            highlight=False,
        )
        return
    table = Table(title=f"remnants in {cfg.catalog.display_url}")
    for col in ("dataset", "tier", "tier state"):
        table.add_column(col)
    for ds, names in by_ds.items():
        for tier in names:
            t = tiers.get(tier)
            state = t.state if t is not None else "unknown"
            if tier not in configured:
                state += " (not in this configuration)"
            table.add_row(ds, tier, state)
    console.print(table)
    console.print(
        "the objects of these deleted datasets wait to be purged from these tiers: "
        f"'{PURGE_COMMAND}' deletes them from each tier that answers (a tier down is probed "
        "first); until then no dataset of these names, nor one above or below them, can be "
        "created",
        highlight=False,
    )


def _distinct_chunks(copies: list[ChunkCopy]) -> dict[str, int]:
    """Each chunk's size, from its copies (one entry however many tiers hold it)."""
    sizes: dict[str, int] = {}
    for c in copies:
        sizes[c.key] = max(sizes.get(c.key, 0), c.nbytes)
    return sizes


@main.command("du")
@_config_option
@_json_option
@click.option("-b", "--bytes", "raw", is_flag=True, help="Exact byte counts, not KiB/MiB/GiB.")
@_handle_errors
def du_cmd(config_path: Path | None, as_json: bool, raw: bool) -> None:
    """Bytes stored per tier (against its capacity) and per dataset."""
    cfg = load_config(config_path)
    with open_configured_catalog(cfg)[0] as catalog:
        usage = catalog.usage()
        tiers = _tiers(cfg, catalog)
    by_tier: dict[str, list[int]] = {t.name: [0, 0] for t in tiers}
    by_ds: dict[str, dict[str, int]] = defaultdict(dict)
    for u in usage:
        slot = by_tier.setdefault(u.tier, [0, 0])
        slot[0] += u.copies
        slot[1] += u.nbytes
        by_ds[u.dataset][u.tier] = u.nbytes
    if as_json:
        out = {
            "tiers": [
                {
                    "name": t.name,
                    "role": t.role,
                    "state": t.state,
                    "capacity_bytes": t.capacity_bytes,
                    "copies": by_tier[t.name][0],
                    "bytes": by_tier[t.name][1],
                }
                for t in tiers
            ],
            "datasets": {d: dict(v) for d, v in sorted(by_ds.items())},
        }
        click.echo(json.dumps(out, indent=2))
        return
    console = make_console()
    table = Table(title=f"tiers of {cfg.catalog.display_url} (fastest first)")
    for col in ("tier", "role", "state", "capacity", "used", "use%", "copies"):
        table.add_column(col, justify="left" if col in ("tier", "role", "state") else "right")
    for t in tiers:
        copies, used = by_tier[t.name]
        pct = f"{100 * used / t.capacity_bytes:.1f}" if t.capacity_bytes else "-"
        table.add_row(
            t.name,
            t.role,
            t.state,
            format_size(t.capacity_bytes, raw=raw),
            format_size(used, raw=raw),
            pct,
            str(copies),
        )
    console.print(table)
    if not by_ds:
        console.print("no chunk copies stored")
        return
    table = Table(title="bytes per dataset")
    table.add_column("dataset")
    for t in tiers:
        table.add_column(t.name, justify="right")
    table.add_column("total", justify="right")
    for name, per in sorted(by_ds.items()):
        table.add_row(
            name,
            *(format_size(per.get(t.name, 0), raw=raw) for t in tiers),
            format_size(sum(per.values()), raw=raw),
        )
    console.print(table)


@main.command("rm")
@_config_option
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@click.option("-y", "--yes", is_flag=True, help="Delete without asking first.")
@_handle_errors
def rm_cmd(config_path: Path | None, names: tuple[str, ...], yes: bool) -> None:
    """Delete the catalogued datasets (or superfiles) NAME...: their catalog records and
    rows, then every object under their names on every tier that answers, and the folders
    those leave empty (``Session.delete_dataset``).

    Says what each holds, per tier, and asks before deleting (on stderr), unless --yes;
    with nothing to answer (no terminal) nothing is deleted. Then says what was removed:
    chunks and bytes per tier, and the tiers where objects stay as remnants (a tier down
    or read-only here, an object that refused its deletion). 'strataio ls --remnants'
    lists those, and 'strataio fsck --repair' purges them once their tier answers; until
    then no dataset of that name can be created.

    Exit 0 every NAME deleted; 1 a dataset some process has open (close it there first:
    the others are deleted), a deletion declined (nothing deleted), or a runtime failure;
    2 a NAME the catalog does not have (nothing deleted) or a configuration problem.
    """
    from strataio.tiers.superfile import is_superfile

    cfg = load_config(config_path)  # (a missing or bad file: ConfigError, exit 2)
    names = tuple(dict.fromkeys(names))
    if catalog_exists(cfg) is False:  # (no catalog is created just to find nothing in it)
        raise _UsageProblem(
            f"no dataset {', '.join(map(repr, names))}: no catalog at "
            f"{cfg.catalog.display_url}; nothing deleted"
        )
    console = make_console()
    failed = False
    with open_session(config_path, stage_on_read=False) as s:
        catalog = s.catalog
        assert catalog is not None
        units: dict[str, str] = {}  # (what each one's chunks are called)
        unknown: list[str] = []
        for name in names:
            try:
                units[name] = "containers" if is_superfile(catalog.get_dataset(name)) else "chunks"
            except NotFoundError:
                unknown.append(name)
        if unknown:
            raise _UsageProblem(_unknown_names(catalog, cfg, unknown))
        held: dict[str, list[TierUsage]] = defaultdict(list)
        for u in catalog.usage():
            if u.dataset in units:
                held[u.dataset].append(u)
        for name in names:
            console.print(f"{escape(name)}: {_per_tier(held[name], units[name])}", highlight=False)
        if not yes and not _confirmed(names):
            click.echo(
                "nothing deleted (answer y, or pass --yes to delete without asking)", err=True
            )
            sys.exit(1)
        for name in names:
            try:
                done = s.delete_dataset(name)
            except (DatasetInUseError, NotFoundError) as exc:  # (others go on)
                click.echo(f"error: {exc}", err=True)
                failed = True
                continue
            _print_deletion(console, done, units[name], s.tiers)
    if failed:
        sys.exit(1)


def _confirmed(names: tuple[str, ...]) -> bool:
    """Whether the user answers yes to deleting datasets ``names`` (no answer: no)."""
    what = repr(names[0]) if len(names) == 1 else f"these {len(names)} datasets"
    try:
        return click.confirm(f"delete {what}?", default=False, err=True)
    except click.Abort:  # (end of input, or interrupted)
        click.echo("", err=True)
        return False


def _unknown_names(catalog: Catalog, cfg: Config, names: list[str]) -> str:
    """The message for ``names`` that no catalogued dataset has: where they were looked for,
    and for each one a deleted dataset whose objects wait to be purged, or a plain
    dataset's directory, what it is."""
    said = [
        f"no dataset{'s' if len(names) != 1 else ''} {', '.join(map(repr, names))} in catalog "
        f"{cfg.catalog.display_url}"
    ]
    left = by_dataset(catalog.remnants())
    for name in names:
        if left.get(name):
            said.append(
                f"{name!r} was deleted, and its objects on {', '.join(left[name])} wait to be "
                f"purged ('{PURGE_COMMAND}')"
            )
        elif (Path(name) / "zarr.json").is_file():
            said.append(
                f"{name!r} is a plain dataset's directory, not a catalogued dataset: remove "
                "the directory itself"
            )
    return "; ".join(said) + "; nothing deleted"


def _per_tier(usage: list[TierUsage], unit: str, where: str = "on") -> str:
    """Copies per tier, in words: ``20 chunks (78.1 KiB) on disk, ...`` (``where``: the
    word before each tier)."""
    if not usage:
        return f"no {unit} stored"
    return ", ".join(f"{_copies(u, unit)} {where} {u.tier}" for u in usage)


def _copies(u: TierUsage, unit: str) -> str:
    """``20 chunks (78.1 KiB)``: the copies of ``u`` and their bytes."""
    return f"{counted(u.copies, unit.removesuffix('s'), unit)} ({format_size(u.nbytes)})"


def _print_deletion(console: Console, done: Deletion, unit: str, tiers: TierSet) -> None:
    """What deleting one dataset did: what it removed per tier, and each tier where its
    objects stay as remnants, why, and how they are purged."""
    name = escape(done.name)
    kept = {u.tier: u for u in done.removed if u.tier in done.remnants}
    gone = [u for u in done.removed if u.tier not in kept]
    said = f": {_per_tier(gone, unit, 'from')}" if gone or not kept else ""
    console.print(f"deleted {name}{said}", highlight=False)
    for tier in done.remnants:
        if tier not in tiers or not tiers[tier].configured:
            why, when = "not in this configuration", "with a configuration that has it"
        elif not (t := tiers[tier]).up:
            why, when = f"down: {escape(t.last_error)}", "once it answers"
        elif t.read_only:
            why, when = "read-only here", "with a configuration that writes there"
        else:
            why, when = "an object there refused its deletion", "once it can be deleted"
        what = _copies(kept[tier], unit) if tier in kept else f"objects (no {unit} catalogued)"
        console.print(
            f"  [yellow]remnant[/]: {what} of {name} stay on {tier} ({why}), waiting to be "
            f"purged: run '{PURGE_COMMAND}' {when}; until then no dataset named {name} can "
            "be created ('strataio ls --remnants' lists what waits)",
            highlight=False,
        )
