"""Commands over the configuration and the catalog: ``init``, ``ls``, ``du``.

A missing catalog is created from the configuration, as a Session creates it
(:mod:`strataio.cli.context`). Exit status: 0 success; 2 a usage or configuration problem (bad
or missing file, a catalog that cannot be created), with a one-line message; 1 a runtime
failure (database unreachable, I/O error).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import click
import numpy as np
from rich.table import Table

from strataio.catalog import Catalog, ChunkCopy, TierRecord
from strataio.cli import main
from strataio.cli.context import catalog_exists, make_tier_dirs, open_configured_catalog
from strataio.cli.output import UsageProblem as _UsageProblem
from strataio.cli.output import handle_errors as _handle_errors
from strataio.cli.output import make_console
from strataio.config import CONFIG_FILENAME, Config, default_config_text, load_config
from strataio.errors import ConfigError
from strataio.sizes import format_size

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


@main.command("init")
@click.option("--force", is_flag=True, help=f"Overwrite an existing ./{CONFIG_FILENAME}.")
@_handle_errors
def init_cmd(force: bool) -> None:
    """Write a commented ./strataio.toml, then create what it names that is missing: the
    catalog (with the configured tiers) and the POSIX tier directories.

    An existing ./strataio.toml is kept (--force overwrites it with the default): init then
    only creates what is missing, and says what it did."""
    target = Path.cwd() / CONFIG_FILENAME
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
    created = False
    existed = catalog_exists(cfg)
    catalog, new_tiers = open_configured_catalog(cfg)
    catalog.close()
    names = ", ".join(f"{t.name} ({t.role})" for t in new_tiers)
    if existed is False:
        click.echo(f"created catalog {cfg.catalog.display_url} with tiers {names}")
        created = True
    elif new_tiers:
        click.echo(f"catalog {cfg.catalog.display_url}: registered tiers {names}")
        created = True
    for path in make_tier_dirs(cfg):
        click.echo(f"created tier directory {path}")
        created = True
    if not created:
        click.echo(
            f"catalog {cfg.catalog.display_url} and every tier are in place: nothing to create"
        )


@main.command("ls")
@_config_option
@_json_option
@_handle_errors
def ls_cmd(config_path: Path | None, as_json: bool) -> None:
    """List the datasets in the catalog, with their chunk copies per tier.

    An array shows its shape, dtype and chunks (their number in brackets). A superfile
    (kind "superfile": named members packed into containers, see
    ``Session.superfile``) shows no shape or dtype; its chunks are its sealed containers,
    listed as their number and the size they close at, and its size is their bytes. Its
    members are not counted (that reads every container's index; ``strataio info NAME``
    does): --json gives ``containers`` and ``container_bytes``.
    """
    from strataio.tiers.superfile import is_superfile, record_container_bytes

    cfg = load_config(config_path)
    with open_configured_catalog(cfg)[0] as catalog:
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
            chunks = (
                f"{n} container{'s' if n != 1 else ''} "
                f"(close at {format_size(r['container_bytes'])})"
            )
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
