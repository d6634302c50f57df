"""``strataio bench collective``: strataio.File against ROMIO, launched under mpiexec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from strataio.bench.collective import (
    CONTENDERS,
    FILE_PER_RANK,
    PATTERNS,
    PHASES,
    STEP_CONTENDERS,
    pipeline_contenders,
)
from strataio.bench.mpi import run_ranks
from strataio.cli import bench
from strataio.cli.output import COUNTS, POSITIVE, json_option, make_console, rate, write_json
from strataio.errors import StrataError
from strataio.sizes import counted

#: the patterns of the open-to-close table when none is given
STEP_PATTERNS = ["contig", "hpio64", "hpio512", "hpio4096", "tile2d"]


def _launch(nprocs: int, args: list[str], timeout: float) -> list:
    try:
        return run_ranks(nprocs, "strataio.bench.collective", args, timeout)
    except StrataError as exc:
        raise click.ClickException(str(exc)) from None


def _styled(ratio: float) -> str:
    style = "green" if ratio >= 1.0 else "red"
    return f"[{style}]{ratio:.2f}[/{style}]"


def _given_on_command_line() -> set[str]:
    """The names of the current command's parameters the user gave on its command line."""
    ctx = click.get_current_context()
    return {
        name
        for name in ctx.params
        if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
    }


@bench.command("collective")
@click.option("--pattern", "patterns", multiple=True, type=click.Choice(PATTERNS))
@click.option("--all", "run_all", is_flag=True, help="Every pattern.")
@click.option(
    "--ranks", type=COUNTS, default="1,2,4", show_default=True, help="Comma-separated rank counts."
)
@click.option(
    "--mode",
    type=click.Choice(["open-close", "call"]),
    default="open-close",
    show_default=True,
    help="open-close: each repetition opens, sets the view, reads or writes, closes, timed "
    "from the first rank's start to the last rank's end; call: only the *_all call on an "
    "open file.",
)
@click.option(
    "--reps",
    default=7,
    show_default=True,
    type=click.IntRange(min=1),
    help="Repetitions per contender.",
)
@click.option(
    "--size",
    default=64.0,
    show_default=True,
    type=POSITIVE,
    help="MiB moved in all (open-close).",
)
@click.option(
    "--per-rank",
    type=POSITIVE,
    default=None,
    help="Weak scaling (open-close): MiB each rank moves, instead of --size; also times each "
    "rank with a file of its own and prints each rank count's efficiency against the fewest "
    "ranks.",
)
@click.option(
    "--scale",
    default=1.0,
    show_default=True,
    type=POSITIVE,
    help="Scale every pattern (call).",
)
@click.option(
    "--op", "ops", multiple=True, type=click.Choice(["write", "read"]), help="Default both."
)
@click.option(
    "--sync/--no-sync",
    default=False,
    show_default=True,
    help="Write the node's dirty pages back (os.sync, untimed) before each timed write.",
)
@json_option
@click.option(
    "--timeout", type=POSITIVE, default=600.0, show_default=True, help="Seconds per mpiexec launch."
)
@click.option(
    "--pipeline",
    type=COUNTS,
    default=None,
    help="Group counts, e.g. 1,2,4: time strataio's pipelined two-phase I/O at each "
    "(every rank aggregates) against the first and ROMIO (call mode).",
)
def collective(
    patterns: tuple[str, ...],
    run_all: bool,
    ranks: list[int],
    mode: str,
    reps: int,
    size: float,
    per_rank: float | None,
    scale: float,
    ops: tuple[str, ...],
    sync: bool,
    json_path: Path | None,
    timeout: float,
    pipeline: list[int] | None,
) -> None:
    """Collective write/read: strataio.File against ROMIO's collective and independent calls,
    same job, same view, same file state.

    By default (open-close) every repetition is open -> set_view -> read_all/write_all ->
    close (ROMIO: Open -> Set_view -> Read_all/Write_all or Read/Write -> Close), timed from
    the first rank's start to the last rank's end, for contig, hpio64, hpio512, hpio4096
    and tile2d; the table gives min / median / max MB/s, ratio = better ROMIO median time /
    strataio's, and each phase's slowest rank (median).

    With --per-rank M each rank moves M MiB at every rank count (weak scaling); a further
    table gives each contender's efficiency, bytes per rank per second at N over the same at
    the fewest ranks (1.00: perfect), beside a file per rank, the node's ceiling."""
    given = _given_on_command_line()
    if pipeline:
        if "mode" in given and mode != "call":
            raise click.UsageError("--pipeline times single calls on an open file: drop --mode")
        mode = "call"
    # (an option the chosen mode does not use would be ignored in silence)
    unused = ("size", "ops", "sync") if mode == "call" else ("scale",)
    if wrong := [n for n in unused if n in given]:
        names = ", ".join("--" + ("op" if n == "ops" else n) for n in wrong)
        raise click.UsageError(
            f"{names} only {'applies' if len(wrong) == 1 else 'apply'} to "
            f"{'--mode open-close' if mode == 'call' else '--mode call'}"
        )
    if per_rank is not None:
        if pipeline:
            raise click.UsageError("--per-rank times open to close: drop --pipeline")
        if mode == "call":
            raise click.UsageError("--per-rank times open to close: drop --mode call")
        if "size" in given:
            raise click.UsageError("give --size (MiB in all) or --per-rank, not both")
    chosen = list(patterns)
    if run_all:
        chosen = [p for p in PATTERNS if mode == "call" or not p.endswith("-ind")]
    if mode == "open-close" and any(p.endswith("-ind") for p in chosen):
        raise click.UsageError("the *-ind patterns time independent calls: use --mode call")
    if not chosen:
        if mode == "call":
            raise click.UsageError("give --pattern (repeatable) or --all")
        chosen = STEP_PATTERNS
    base = ["--reps", str(reps), "--mode", mode]
    if mode == "call":
        base += ["--scale", str(scale)]
        base += ["--pipeline", ",".join(map(str, pipeline))] if pipeline else []
    else:
        base += [a for op in ops for a in ("--op", op)] + (["--sync"] if sync else [])
        base += ["--reference"] if per_rank is not None else []
    rows: list[dict[str, Any]] = []
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=make_console(stderr=True), transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task("collective", total=len(ranks) * len(chosen))
        for n in ranks:
            for p in chosen:
                progress.update(task, description=f"{p} at {n} rank{'s' * (n > 1)}")
                args = ["--pattern", p, *base]
                if mode == "open-close":
                    args += ["--size", str(size if per_rank is None else per_rank * n)]
                got = _launch(n, args, timeout)
                for r in got if per_rank is not None else []:
                    r["per rank MiB"] = per_rank
                rows += got
                progress.advance(task)
    if pipeline:
        _pipeline_table(rows, pipeline)
    elif mode == "call":
        _call_table(rows)
    else:
        _step_table(rows)
        if per_rank is not None:
            _weak_table(rows, per_rank)
    write_json(json_path, rows)


def _step_table(rows: list[dict[str, Any]]) -> None:
    """The open-to-close table: MB/s min / median / max per contender, ratio, phases."""
    table = Table(title="Collective I/O open -> close, MB/s (min / median / max of the reps)")
    for col in ["pattern", "ranks", "op", *STEP_CONTENDERS, "ratio", "paired (IQR)", "stalls"]:
        table.add_column(col, justify="left" if col in ("pattern", "op") else "right")
    phases = Table(title="Per phase, ms (median of the reps; slowest rank)")
    for col in ["pattern", "ranks", "op", "contender", *PHASES, "total"]:
        phases.add_column(col, justify="left" if col in ("pattern", "op", "contender") else "right")
    for r in rows:
        mb = r["bytes"] / 1e6
        cells = [
            f"{rate(mb / r[c]['max'])} / [bold]{rate(mb / r[c]['median'])}[/bold] / "
            f"{rate(mb / r[c]['min'])}"
            for c in STEP_CONTENDERS
        ]
        p = r["paired"]
        paired = f"{_styled(p['median'])} ({p['q1']:.2f}–{p['q3']:.2f})"
        head = [r["pattern"], str(r["ranks"]), r["op"]]
        table.add_row(*head, *cells, _styled(r["ratio"]), paired, _stalls(r["strataio"]))
        for c in ("strataio", r["best ROMIO"]):
            ph = r[c]["phases"]
            total = f"{r[c]['median'] * 1e3:.2f}"
            phases.add_row(*head, c, *[f"{ph[k] * 1e3:.2f}" for k in PHASES], total)
    console = make_console()
    console.print(table)
    console.print(
        "ratio = better ROMIO median time / strataio median time (> 1: strataio faster); "
        "paired = the same within each round, median (quartiles); a repetition is timed from "
        "the first rank's start to the last rank's end; stalls = strataio's slowest and "
        "fastest repetition: ms, then the node's CPU / I/O pressure stalls (ms) while it ran"
    )
    threads = sorted({(r["ranks"], r.get("read threads", 1)) for r in rows})
    if any(t > 1 for _, t in threads):
        console.print(
            "strataio shares each rank's reads of 8 MiB or more among threads on the cores "
            "its node has to spare (ROMIO reads on one): "
            + ", ".join(f"{counted(n, 'rank')}: {t}" for n, t in threads)
        )
    console.print(phases)


def weak_efficiency(rows: list[dict[str, Any]], contender: str) -> dict[tuple, dict[int, float]]:
    """Per (pattern, op), each rank count's weak-scaling efficiency of ``contender``: bytes per
    rank per second (median time) at N over the same at the fewest ranks timed (1.0: perfect)."""
    rates: dict[tuple, dict[int, float]] = {}
    for r in rows:
        rate = _ratio(r["bytes"] / r["ranks"], r[contender]["median"])
        rates.setdefault((r["pattern"], r["op"]), {})[r["ranks"]] = rate
    return {
        key: {n: _ratio(rate, by_n[min(by_n)]) for n, rate in sorted(by_n.items())}
        for key, by_n in rates.items()
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def _weak_table(rows: list[dict[str, Any]], per_rank: float) -> None:
    """Each contender's MB/s and weak-scaling efficiency per rank count (see --per-rank)."""
    counts = sorted({r["ranks"] for r in rows})
    contenders = [*STEP_CONTENDERS, FILE_PER_RANK]
    table = Table(
        title=f"Weak scaling, {per_rank:g} MiB per rank: MB/s (median) and efficiency "
        f"against {counts[0]} rank{'s' * (counts[0] > 1)}"
    )
    for col in ["pattern", "op", "contender", *[f"{n} rank{'s' * (n > 1)}" for n in counts]]:
        table.add_column(col, justify="left" if col in ("pattern", "op", "contender") else "right")
    by_key = {(r["pattern"], r["op"], r["ranks"]): r for r in rows}
    efficiency = {c: weak_efficiency(rows, c) for c in contenders}
    for pattern, op in dict.fromkeys((r["pattern"], r["op"]) for r in rows):
        for c in contenders:
            cells = []
            for n in counts:
                r = by_key.get((pattern, op, n))
                if r is None:
                    cells.append("")
                    continue
                eff = efficiency[c][pattern, op][n]
                style = "green" if eff >= 0.8 else "red"
                cells.append(
                    f"{rate(r['bytes'] / r[c]['median'] / 1e6)} ([{style}]{eff:.2f}[/{style}])"
                )
            table.add_row(pattern, op, c, *cells)
    console = make_console()
    console.print(table)
    console.print(
        "efficiency = bytes per rank per second (median time) at N / the same at the fewest "
        f"ranks (1.00: perfect; green from 0.80); {FILE_PER_RANK}: each rank writes or reads as "
        "many bytes as its share, in one call, to a file of its own (no shared file; not in "
        "the ratio)"
    )


def _stalls(timed: dict[str, Any]) -> str:
    """The slowest and the fastest repetition with the pressure stalls they met."""
    times, stalls = timed["times"], timed.get("stalls ms") or []
    if len(stalls) != len(times) or not times:
        return ""
    cells = []
    for k in (
        max(range(len(times)), key=times.__getitem__),
        min(range(len(times)), key=times.__getitem__),
    ):
        cpu, io = stalls[k][0], stalls[k][1]
        cells.append(f"{times[k] * 1e3:.0f}: {cpu:.0f}/{io:.0f}")
    return "  ".join(cells)


def _call_table(rows: list[dict[str, Any]]) -> None:
    table = Table(title="Collective I/O, aggregate MB/s (median; slowest rank)")
    columns = ["pattern", "ranks", "op", *CONTENDERS, "path", "ratio", "paired (IQR)", "ratio wall"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("pattern", "op", "path") else "right")
    for r in rows:
        p = r["paired"]
        paired = f"{_styled(p['median'])} ({p['q1']:.2f}–{p['q3']:.2f})"
        table.add_row(
            r["pattern"], str(r["ranks"]), r["op"], *[rate(r[c]) for c in CONTENDERS],
            r.get("path", ""), _styled(r["ratio"]), paired, _styled(r["ratio wall"]),
        )  # fmt: skip
    console = make_console()
    console.print(table)
    console.print(
        "ratio = strataio / max(ROMIO coll, ROMIO ind); paired = the same per round against "
        "the better of the two, median (quartiles); ratio wall = ratio with each call timed "
        "from the first rank's start to the last rank's end"
    )


def _pipeline_table(rows: list, groups: list[int]) -> None:
    """The pipelined runs' table: each G's MB/s, marked where G exceeds the ranks (it runs as
    one group per rank), and its ratio against the first G given."""
    contenders = pipeline_contenders(groups)
    pipelined = contenders[: len(groups)]
    first = f"G={groups[0]}"
    table = Table(title="Pipelined collective I/O, aggregate MB/s (median; slowest rank)")
    for col in ["pattern", "ranks", "op", *contenders, *[f"{c} / {first}" for c in pipelined[1:]]]:
        table.add_column(col, justify="left" if col in ("pattern", "op") else "right")
    for r in rows:
        n = r["ranks"]
        speeds = [rate(r[c]) for c in contenders]
        for i, g in enumerate(groups):
            if g > n:  # (clamped to cb_nodes, every rank with "*:*")
                speeds[i] += f" (as G={n})"
        ratios = []
        for c in pipelined[1:]:
            p = r["pipeline"][c]
            ratios.append(f"{_styled(p['median'])} ({p['q1']:.2f}–{p['q3']:.2f})")
        table.add_row(r["pattern"], str(n), r["op"], *speeds, *ratios)
    console = make_console()
    console.print(table)
    console.print(
        "strataio G=g: two-phase, every rank aggregating, strataio_pipeline_groups=g (more "
        "groups than ranks run as one per rank: as G=ranks); "
        f"ratio = time at {first} / time at G=g within each round, median (quartiles)"
    )
