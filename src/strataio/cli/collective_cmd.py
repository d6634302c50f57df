"""``strataio bench collective``: strataio.File against ROMIO, launched under mpiexec."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
from rich.table import Table

from strataio.bench.collective import CONTENDERS, PATTERNS, pipeline_contenders
from strataio.cli import bench
from strataio.cli.output import json_option, make_console, write_json


def _mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


def _launch(
    nprocs: int, patterns: list[str], reps: int, scale: float, timeout: float, pipeline: str = ""
) -> list:
    cmd = [_mpiexec(), "-n", str(nprocs), sys.executable, "-m", "strataio.bench.collective"]
    for p in patterns:
        cmd += ["--pattern", p]
    cmd += ["--reps", str(reps), "--scale", str(scale)]
    if pipeline:
        cmd += ["--pipeline", pipeline]
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise click.ClickException(f"mpiexec -n {nprocs} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _styled(ratio: float) -> str:
    style = "green" if ratio >= 1.0 else "red"
    return f"[{style}]{ratio:.2f}[/{style}]"


@bench.command("collective")
@click.option("--pattern", "patterns", multiple=True, type=click.Choice(PATTERNS))
@click.option("--all", "run_all", is_flag=True, help="Every pattern.")
@click.option("--ranks", default="1,2,4", show_default=True, help="Comma-separated rank counts.")
@click.option("--reps", default=5, show_default=True, help="Repetitions (median reported).")
@click.option("--scale", default=1.0, show_default=True, help="Scale every pattern's size.")
@json_option
@click.option("--timeout", default=600.0, show_default=True, help="Seconds per mpiexec launch.")
@click.option(
    "--pipeline",
    default="",
    help="Group counts, e.g. 1,2,4: time strataio's pipelined two-phase I/O at each "
    "(every rank aggregates) against G = 1 and ROMIO.",
)
def collective(
    patterns: tuple[str, ...],
    run_all: bool,
    ranks: str,
    reps: int,
    scale: float,
    json_path: Path | None,
    timeout: float,
    pipeline: str,
) -> None:
    """Collective write/read MB/s: strataio vs ROMIO collective and independent, same job."""
    chosen = list(PATTERNS) if run_all else list(patterns)
    if not chosen:
        raise click.UsageError("give --pattern (repeatable) or --all")
    rows = []
    for n in [int(x) for x in ranks.split(",") if x.strip()]:
        rows += _launch(n, chosen, reps, scale, timeout, pipeline)
    if pipeline:
        _pipeline_table(rows, [int(g) for g in pipeline.split(",") if g.strip()])
        write_json(json_path, rows)
        return
    table = Table(title="Collective I/O, aggregate MB/s (median; slowest rank)")
    columns = ["pattern", "ranks", "op", *CONTENDERS, "path", "ratio", "paired (IQR)", "ratio wall"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("pattern", "op", "path") else "right")
    for r in rows:
        p = r["paired"]
        paired = f"{_styled(p['median'])} ({p['q1']:.2f}–{p['q3']:.2f})"
        table.add_row(
            r["pattern"], str(r["ranks"]), r["op"], *[f"{r[c]:.0f}" for c in CONTENDERS],
            r.get("path", ""), _styled(r["ratio"]), paired, _styled(r["ratio wall"]),
        )  # fmt: skip
    console = make_console()
    console.print(table)
    console.print(
        "ratio = strataio / max(ROMIO coll, ROMIO ind); paired = the same per round against "
        "the better of the two, median (quartiles); ratio wall = ratio with each call timed "
        "from the first rank's start to the last rank's end"
    )
    write_json(json_path, rows)


def _pipeline_table(rows: list, groups: list[int]) -> None:
    contenders = pipeline_contenders(groups)
    pipelined = contenders[: len(groups)]
    table = Table(title="Pipelined collective I/O, aggregate MB/s (median; slowest rank)")
    for col in ["pattern", "ranks", "op", *contenders, *[f"{c} / G=1" for c in pipelined[1:]]]:
        table.add_column(col, justify="left" if col in ("pattern", "op") else "right")
    for r in rows:
        ratios = []
        for c in pipelined[1:]:
            p = r["pipeline"][c]
            ratios.append(f"{_styled(p['median'])} ({p['q1']:.2f}–{p['q3']:.2f})")
        table.add_row(
            r["pattern"], str(r["ranks"]), r["op"], *[f"{r[c]:.0f}" for c in contenders], *ratios
        )
    console = make_console()
    console.print(table)
    console.print(
        "strataio G=g: two-phase, every rank aggregating, strataio_pipeline_groups=g; "
        "ratio = time at G=1 / time at G=g within each round, median (quartiles)"
    )
