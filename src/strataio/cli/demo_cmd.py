"""``strataio demo``: write a sample dataset, read APRIL's patterns A-H from it, check them."""

from __future__ import annotations

import time
from pathlib import Path

import click
import numpy as np
from rich import box
from rich.table import Table

import strataio
from strataio.bench.sections import scaled_patterns
from strataio.cli import main
from strataio.cli.dataset_cmd import bytes_on_disk, fail
from strataio.cli.output import make_console
from strataio.errors import StrataError
from strataio.layout.sections import Section


@main.command("demo")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".strataio/demo"),
    show_default=True,
    help="Where the sample dataset is written (replaced if it exists).",
)
@click.option("--size", default=2000, show_default=True, help="Side of the square array.")
@click.option("--chunk", default=200, show_default=True, help="Side of the square chunks.")
@click.option("--codec", default="zstd+crc32c", show_default=True, help="Codec pipeline.")
def demo_cmd(directory: Path, size: int, chunk: int, codec: str) -> None:
    """Write a SIZE x SIZE float32 dataset in CHUNK x CHUNK sub-files, then read the APRIL
    access patterns A-H (scaled to SIZE; x runs along a row) and check each against numpy."""
    console = make_console()
    path = directory / "sample.zarr"
    data = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    try:
        t0 = time.perf_counter()
        with strataio.create_dataset(
            path, (size, size), "float32", (chunk, chunk), codec=codec, overwrite=True
        ) as ds:
            ds[...] = data
        t_write = time.perf_counter() - t0
        table = Table(
            title=f"patterns A-H on {path} ({size}x{size} float32, chunks {chunk}x{chunk})",
            box=box.SIMPLE_HEAD,
        )
        for name in ("pattern", "section", "elements", "chunks touched", "read", "MB/s", "check"):
            left = name in ("pattern", "section")
            table.add_column(name, justify="left" if left else "right", no_wrap=True)
        failures = 0
        with strataio.open_dataset(path) as ds:
            for name, (start, stop) in scaled_patterns(size).items():
                sec = Section(tuple(start), tuple(stop))
                t0 = time.perf_counter()
                got = ds.read_section(start, stop)
                dt = time.perf_counter() - t0
                ok = np.array_equal(got, data[sec.to_slices()])
                failures += not ok
                table.add_row(
                    name,
                    f"[{start[0]}:{stop[0]}, {start[1]}:{stop[1]}]",
                    str(sec.size),
                    str(len(ds.grid.cover(sec))),
                    f"{dt * 1e3:.2f} ms",
                    f"{got.nbytes / dt / 1e6:.0f}",
                    "[green]ok[/green]" if ok else "[red]MISMATCH[/red]",
                )
            stored, disk = ds.nchunks_stored(), bytes_on_disk(ds)
    except (StrataError, OSError) as exc:
        fail(f"demo failed: {exc}")
        return
    console.print(table)
    console.print(
        f"wrote {data.nbytes / 1e6:.0f} MB in {t_write:.2f} s as {stored} chunks, "
        f"{disk / 1e6:.1f} MB on disk ({codec}); inspect it with: strataio info {path}"
    )
    if failures:
        fail(f"{failures} pattern(s) read back different data")
