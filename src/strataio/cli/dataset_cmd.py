"""Commands about sub-filed datasets on disk: ``info``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
import numpy as np
from rich import box
from rich.table import Table

from strataio.arrays import Dataset, open_dataset
from strataio.cli import main
from strataio.cli.output import make_console
from strataio.errors import ConfigError, NotFoundError, StrataError
from strataio.sizes import format_size


def bytes_on_disk(ds: Dataset) -> int:
    """Sum of the sizes of the chunk objects stored (metadata excluded)."""
    store = ds.store
    path_of = getattr(store, "chunk_path", None)
    total = 0
    for key in store.list_chunks():
        path = path_of(key) if path_of is not None else None
        if path is not None:
            total += os.stat(path).st_size
        else:
            blob = store.get_chunks([key])[0]
            total += 0 if blob is None else len(blob)
    return total


def fail(message: str, status: int = 2) -> None:
    """Print ``error: message`` on stderr, one line, and exit with ``status``: 2 (the
    default) for a usage-level error, 1 for a runtime failure."""
    click.echo(f"error: {message}", err=True)
    sys.exit(status)


def _not_catalogued(config: str | None) -> str:
    """Where a dataset name was looked for, for a message."""
    from strataio.config import load_config

    try:
        return f"not in catalog {load_config(config).catalog.display_url}"
    except StrataError as exc:
        return f"no catalog to look in ({exc})"


@main.command("info")
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "-c",
    "--config",
    "config",
    type=click.Path(dir_okay=False),
    default=None,
    help="configuration whose catalog names datasets (default: ./strataio.toml, "
    "$STRATAIO_CONFIG, built-in)",
)
def info_cmd(path: Path, config: str | None) -> None:
    """Describe the dataset at PATH: shape, dtype, chunks, codecs, chunks stored, bytes on disk;
    or, for the NAME of a catalogued dataset, its chunks and bytes per tier.

    Exit 0 described; 2 nothing to describe (no dataset at PATH, no catalogued NAME) or a
    configuration problem; 1 a dataset that cannot be read (a corrupt or unsupported
    zarr.json, an I/O error, a catalog that cannot be opened). Errors are one line on
    stderr, naming the file or dataset.
    """
    if not path.is_dir():
        from strataio.cli.tiers_cmd import residency_info  # a dataset name in the catalog

        try:
            if residency_info(str(path), config):
                return
        except StrataError as exc:
            if not path.exists():
                fail(str(exc), 2 if isinstance(exc, ConfigError) else 1)
                return
            # else a file by that name: described below as a path
        if not path.exists():
            where = _not_catalogued(config)
            fail(f"no dataset {str(path)!r}: {where}, and no dataset directory there")
            return
    try:
        opened = open_dataset(path, mode="r")
    except NotFoundError as exc:  # nothing there: the path given is not a dataset
        fail(str(exc))
        return
    except (StrataError, OSError) as exc:  # a zarr.json there that cannot be used
        fail(str(exc), 1)
        return
    try:
        with opened as ds:
            present = ds.nchunks_stored()
            on_disk = bytes_on_disk(ds)
            rows = [
                ("path", str(path)),
                ("shape", " x ".join(map(str, ds.shape)) or "()"),
                ("dtype", str(ds.dtype)),
                ("chunks", " x ".join(map(str, ds.chunks)) or "()"),
                ("chunk grid", " x ".join(map(str, ds.grid.grid_shape)) or "()"),
                ("codecs", ds.codecs.describe()),
                ("fill value", repr(np.asarray(ds.fill_value).item())),
                ("chunks present", f"{present} / {ds.nchunks}"),
                ("bytes on disk", f"{on_disk} ({format_size(on_disk)})"),
                ("logical bytes", f"{ds.nbytes} ({format_size(ds.nbytes)})"),
                ("attributes", ", ".join(sorted(ds.attrs)) or "-"),
            ]
            # (temporary files of puts that never reached their rename: the store's backend
            # lists them, as fsck's does for a tier)
            leftovers = getattr(getattr(ds.store, "backend", None), "leftovers", None)
            left = sorted(leftovers()) if leftovers is not None else []
            if left:
                rows.append(
                    (
                        "unfinished writes",
                        f"{len(left)} temporary file(s), e.g. {left[0]}: left by a writer killed "
                        "in a put (or a put running now); delete them once no process writes "
                        "this dataset",
                    )
                )
    except (StrataError, OSError) as exc:
        fail(str(exc), 1)
        return
    table = Table(title=f"dataset {path}", show_header=False, box=box.SIMPLE)
    table.add_column("field", style="bold")
    table.add_column("value")
    for k, v in rows:
        table.add_row(k, v)
    make_console().print(table)
