"""``strataio bench flatten`` (datatype flattening) and ``strataio bench sieving``."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from strataio.bench.flatten import GOAL_SECONDS, run_flatten
from strataio.cli import bench
from strataio.cli.output import json_option, make_console, write_json


def _ms(t: float) -> str:
    return f"{t * 1e3:.1f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} µs"


@bench.command("flatten")
@click.option("--pieces", default=1_000_000, show_default=True, help="Blocks per datatype.")
@click.option("--realms", default=16, show_default=True, help="File realms to split over.")
@click.option("--repeat", default=5, show_default=True, help="Repetitions (median reported).")
@json_option
def flatten_cmd(pieces: int, realms: int, repeat: int, json_path: Path | None) -> None:
    """Flatten million-piece MPI datatypes and split them over file realms."""
    results = run_flatten(pieces=pieces, realms=realms, repeat=repeat)
    table = Table(
        title=f"Datatype flattening, {pieces:,} blocks, split over {realms} realms",
        caption=f"median of {repeat}; goal: flatten + split < {GOAL_SECONDS * 1e3:.0f} ms; "
        "cpu = CPU time of flatten + split; baseline = mpi4py decode + Python loop per block",
    )
    cols = (
        "datatype",
        "pieces",
        "flatten",
        "cached",
        "split",
        "total",
        "cpu",
        "baseline",
        "speedup",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "datatype" else "right")
    for r in results:
        ok = "green" if r.total_s < GOAL_SECONDS else "red"
        table.add_row(
            r.name,
            f"{r.pieces:,}",
            _ms(r.flatten_s),
            _ms(r.cached_s),
            _ms(r.split_s),
            f"[{ok}]{_ms(r.total_s)}[/{ok}]",
            _ms(r.cpu_s),
            _ms(r.baseline_s),
            f"{r.ratio:.0f}x",
        )
    make_console().print(table)
    write_json(
        json_path,
        {
            "benchmark": "flatten",
            "config": {"pieces": pieces, "realms": realms, "repeat": repeat},
            "results": [r.as_dict() for r in results],
        },
    )


@bench.command("sieving")
@click.option("--file-mib", default=32, show_default=True, help="File size in MiB.")
@click.option("--repeat", default=3, show_default=True, help="Repetitions (median reported).")
@json_option
def sieving_cmd(file_mib: int, repeat: int, json_path: Path | None) -> None:
    """Independent strided reads and writes: direct vs data sieving vs ROMIO."""
    from strataio.bench.sieving import run_sieving

    results = run_sieving(file_mib=file_mib, repeat=repeat)
    table = Table(
        title=f"Independent strided I/O on a {file_mib} MiB page-cached file",
        caption=f"median of {repeat}; speedup = direct time / method time",
    )
    for col in ("pattern", "op", "method", "pieces", "time", "MB/s", "speedup"):
        table.add_column(col, justify="left" if col in ("pattern", "op", "method") else "right")
    for r in results:
        rate = r.nbytes / r.seconds / 1e6 if r.seconds else float("inf")
        table.add_row(
            r.pattern,
            r.op,
            r.method,
            f"{r.pieces:,}",
            _ms(r.seconds),
            f"{rate:.0f}",
            f"{r.speedup:.2f}x",
        )
    make_console().print(table)
    write_json(
        json_path,
        {
            "benchmark": "sieving",
            "config": {"file_mib": file_mib, "repeat": repeat},
            "results": [r.as_dict() for r in results],
        },
    )
