"""``strataio bench flatten`` (datatype flattening) and ``strataio bench sieving``."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from strataio.bench.flatten import GOAL_SECONDS, run_flatten
from strataio.cli import bench
from strataio.cli.output import count_option, json_option, make_console, write_json


def _ms(t: float) -> str:
    return f"{t * 1e3:.1f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} µs"


@bench.command("flatten")
@count_option("--pieces", 1_000_000, "Blocks per datatype.")
@count_option("--realms", 16, "File realms to split over.")
@count_option("--repeat", 5, "Repetitions (median reported).")
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
@count_option("--file-mib", 32, "File size in MiB.")
@count_option("--repeat", 3, "Repetitions (median reported).")
@click.option(
    "--sweep",
    is_flag=True,
    help="Instead: the two-phase window sweep (extent 1 KiB - 1 MiB, sieved vs one call per "
    "piece), its crossovers and the sieving threshold it picks.",
)
@count_option("--rounds", 5, "With --sweep: whole sweeps, pooled.")
@json_option
def sieving_cmd(
    file_mib: int, repeat: int, sweep: bool, rounds: int, json_path: Path | None
) -> None:
    """Independent strided reads and writes: direct vs data sieving vs ROMIO."""
    from strataio.bench.sieving import run_sieving

    if sweep:
        _sweep(repeat, rounds, json_path)
        return

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


def _sweep(repeat: int, rounds: int, json_path: Path | None) -> None:
    from strataio.bench.sieving import run_sweep

    result = run_sweep(repeat=repeat, rounds=rounds)
    table = Table(
        title="Conditional data sieving inside two-phase: one 16 MiB aggregator window",
        caption=f"median over {rounds} rounds of medians of {repeat}; "
        "ratio = one call per piece / sieved (> 1: sieving wins)",
    )
    for col in ("op", "density", "extent", "pieces", "sieved", "per piece", "ratio"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for c in result.cells:
        table.add_row(
            c.op, f"{c.density:.2f}", f"{c.extent:,}", f"{c.pieces:,}", _ms(c.sieved),
            _ms(c.per_piece), f"{c.per_piece / c.sieved:.2f}",
        )  # fmt: skip
    console = make_console()
    console.print(table)
    for x in result.crossovers:
        console.print(
            f"crossover {x.op} density {x.density:.2f}: extent {x.extent / 1024:.1f} KiB, "
            f"hole {x.hole / 1024:.1f} KiB, bytes per call saved {x.extra / 1024:.1f} KiB"
        )
    what = {"read": "hole", "write": "extent + hole"}
    for op in ("read", "write"):
        console.print(
            f"threshold picked ({op}): sieve while {what[op]} <= {result.threshold[op]:,} "
            f"bytes (strataio uses {result.current[op]:,})"
        )
    write_json(
        json_path,
        {
            "benchmark": "sieving-sweep",
            "config": {"repeat": repeat, "rounds": rounds},
            "results": [c.as_dict() for c in result.cells],
            "crossovers": [
                {
                    "op": x.op,
                    "density": x.density,
                    "extent": x.extent,
                    "hole": x.hole,
                    "extra": x.extra,
                }
                for x in result.crossovers
            ],
            "threshold": result.threshold,
            "current": result.current,
        },
    )
