"""``strataio calibrate`` (the paper's PTool), ``strataio predict`` (its Figure 11) and
``strataio bench predict`` (prediction accuracy)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from strataio.cli import bench, main
from strataio.cli.output import (
    COUNTS,
    ByteSize,
    UsageProblem,
    count_option,
    handle_errors,
    json_option,
    make_console,
    write_json,
)

#: measurements per transfer size in a calibration
_repeat_option = count_option("--repeat", 3, "measurements per size")


def _max_size_option(default: str, help: str) -> Callable[[Any], Any]:
    """``--max-size``: the largest transfer size a calibration measures, 1 KiB at least
    (its smallest)."""
    return click.option(
        "--max-size", type=ByteSize(least=1024), default=default, show_default=True, help=help
    )


_config_option = click.option(
    "-c",
    "--config",
    "config",
    type=click.Path(dir_okay=False),
    default=None,
    help="configuration (default: ./strataio.toml, $STRATAIO_CONFIG, built-in)",
)


def _finite(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """``value`` unless it is not a number (``nan``, which every range check lets through;
    ``inf`` is fine: wait as long as it takes)."""
    if value != value:
        raise click.BadParameter(f"{value} is not a number of seconds")
    return value


_wait_option = click.option(
    "--wait",
    type=click.FloatRange(min=0),
    callback=_finite,
    default=0,
    show_default=True,
    metavar="SECONDS",
    help="wait this long for a tier another calibration or measured run is using "
    "(0: fail at once, naming that process)",
)


def _say_waiting(console: Console) -> Callable[[str], None]:
    """``on_wait`` for the library: each message on ``console`` (stderr), as it is."""
    return lambda message: console.print(message, markup=False, highlight=False)


@main.command("calibrate")
@click.option("--tier", "tiers", multiple=True, help="tier to calibrate (repeatable; default all)")
@_max_size_option(
    "256MiB", "largest transfer size (sizes go 1 KiB, 4 KiB, ... ×4 up to it, not past it)"
)
@_repeat_option
@click.option(
    "--concurrency",
    type=COUNTS,
    default="1,2,4",
    show_default=True,
    help="processes calling at once, comma-separated (each level is one mpiexec launch)",
)
@click.option("--quick", is_flag=True, help="small and fast: up to 1 MiB, 2 repeats, 1 and 2")
@click.option("--warm", is_flag=True, help="do not drop the page cache before reads")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="draw the curves log-log into this PNG",
)
@_wait_option
@_config_option
@handle_errors
def calibrate_cmd(
    tiers: tuple[str, ...],
    max_size: int,
    repeat: int,
    concurrency: list[int],
    quick: bool,
    warm: bool,
    plot: Path | None,
    wait: float,
    config: str | None,
) -> None:
    """Measure each tier's connection, open, seek, view, close and transfer times for sizes
    1 KiB … 256 MiB (×4 steps) into the catalog's performance table."""
    from strataio.cli.context import open_configured_catalog
    from strataio.config import load_config
    from strataio.predict.calibrate import calibrate, default_sizes, plot_perf
    from strataio.predict.perfdb import PerfTable
    from strataio.sizes import format_size

    top = max_size
    levels = sorted(set(concurrency))
    if quick:
        top, repeat, levels = min(top, 1 << 20), min(repeat, 2), [c for c in levels if c <= 2]
        if not levels:  # (it measured nothing and said "0 measurements stored")
            raise UsageProblem(
                f"--quick measures at 1 and 2 processes only: --concurrency "
                f"{','.join(map(str, concurrency))} leaves no level (add 1 or 2, or drop --quick)"
            )
    if plot is not None and not plot.parent.is_dir():
        # (said before the calibration, which takes minutes, rather than after it)
        raise UsageProblem(f"--plot {plot}: no folder {plot.parent}")
    cfg = load_config(config)
    catalog, _ = open_configured_catalog(cfg)
    console = make_console()
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=make_console(stderr=True),
        ) as bar:
            tasks: dict[str, int] = {}

            def progress(tier: str, done: int, total: int) -> None:
                if tier not in tasks:
                    tasks[tier] = bar.add_task(f"calibrating {tier}", total=total)
                bar.update(tasks[tier], completed=done)

            rows = calibrate(
                cfg,
                catalog,
                tiers or None,
                sizes=default_sizes(top),
                repeat=repeat,
                levels=levels,
                cold=not warm,
                on_progress=progress,
                wait=wait,
                on_wait=_say_waiting(bar.console),
            )
        perf = PerfTable(rows)
        console.print(calibration_table(perf))
        sizes = default_sizes(top)
        console.print(
            f"{len(rows)} measurements of transfers of {format_size(sizes[0])} … "
            f"{format_size(sizes[-1])} stored in {cfg.catalog.display_url}"
        )
        if plot is not None:
            plot_perf(perf, plot)
            console.print(f"curves drawn in {plot}")
    finally:
        catalog.close()


def calibration_table(perf) -> Table:  # type: ignore[no-untyped-def]
    """The paper's Table 1 (fixed costs) with the transfer curves' ends, per tier at the
    fewest processes its latest calibration measured (the ``processes`` column)."""
    table = Table(
        title="performance database: milliseconds, at the fewest processes measured; "
        "transfers at the smallest and the largest size measured"
    )
    cols = ["tier", "processes", "connect", "open", "view", "close", "disconnect"]
    for c in cols:
        table.add_column(c, justify="right" if c != "tier" else "left")
    ops = ("write", "read", "write_all", "read_all", "put", "get")
    for op in ops:
        table.add_column(f"{op} smallest→largest", justify="right")
    for tier in perf.tiers:
        levels = [perf.curve(tier, op).levels[0] for op in (*cols[2:], *ops) if perf.has(tier, op)]
        fewest = int(min(levels)) if levels else 1
        row = [tier, str(fewest) if levels else "-"]
        for op in cols[2:]:
            if not perf.has(tier, op):
                row.append("damaged" if perf.damage(tier, op) else "-")
                continue
            row.append(f"{perf.time(tier, op, 0, fewest) * 1e3:.3f}")
        for op in ops:
            if not perf.has(tier, op):
                row.append("damaged" if perf.damage(tier, op) else "-")
                continue
            lo, hi = perf.measured_range(tier, op)
            t_lo, t_hi = perf.time(tier, op, lo, fewest), perf.time(tier, op, hi, fewest)
            row.append(f"{t_lo * 1e3:.2f}→{t_hi * 1e3:.1f}")
        table.add_row(*row)
    return table


@main.command("predict")
@click.argument("workload", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--measure", is_flag=True, help="also run the workload under mpiexec and time each dataset"
)
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON instead")
@_wait_option
@_config_option
@handle_errors
def predict_cmd(
    workload: Path, measure: bool, as_json: bool, wait: float, config: str | None
) -> None:
    """Predict the I/O time of the WORKLOAD file (equation (2)) per dataset and in total, as the
    paper's Figure 11 shows it; with --measure, run it and show the measured time beside."""
    from strataio.cli.context import open_configured_catalog
    from strataio.config import load_config
    from strataio.predict.perfdb import PerfTable
    from strataio.predict.workload import WorkloadError, load_workload

    cfg = load_config(config)
    try:
        wl = load_workload(workload)
        wl.check_capacity({t.name: t.capacity_bytes for t in cfg.tiers})
    except WorkloadError as exc:
        raise UsageProblem(str(exc)) from None
    catalog, _ = open_configured_catalog(cfg)
    try:
        perf = PerfTable(catalog.perf_rows())
    finally:
        catalog.close()
    from strataio.predict.native import measured_settings, unmeasurable
    from strataio.predict.runner import predict_and_measure

    for tier in dict.fromkeys(wl.tier_of(ds) for ds in wl.datasets):
        why = None if perf.has(tier) else unmeasurable(cfg.tier(tier))
        if why is not None:  # (UncalibratedError would advise a calibration it refuses)
            raise UsageProblem(
                f"{why}; the performance database has no calibration of it to predict with: "
                "place the workload's datasets on posix tiers that take writes"
            )
        stale = perf.changed_since(tier, measured_settings(cfg.tier(tier)))
        if stale is not None:
            raise UsageProblem(stale)

    result = predict_and_measure(
        wl,
        perf,
        cfg if measure else None,
        wait=wait,
        on_wait=_say_waiting(make_console(stderr=True)),
    )
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    make_console().print(figure11_table(wl, result))


def figure11_table(wl, result: dict) -> Table:  # type: ignore[no-untyped-def]
    """The paper's Figure 11: one row per dataset, and the total."""
    run = wl.run
    measured = result["measured_total_s"] is not None
    table = Table(
        title=f"{wl.source}: {run.iterations} iterations, {run.ranks} processes, {run.method} I/O",
        caption=None if measured else "predicted by equation (2); --measure runs it",
    )
    for c in ("name", "access mode", "ndims", "etype", "pattern", "dims", "location", "frequency"):
        table.add_column(c)
    table.add_column("predicted (s)", justify="right")
    if measured:
        table.add_column("measured (s)", justify="right")
        table.add_column("error", justify="right")
    for ds, row in zip(wl.datasets, result["datasets"]):
        cells = [
            ds.name,
            ds.mode,
            str(len(ds.dims)),
            ds.dtype.name,
            ds.pattern,
            ",".join(map(str, ds.dims)),
            wl.tier_of(ds),
            str(ds.frequency),
            f"{row['predicted_s']:.4f}",
        ]
        if measured:
            cells += [f"{row['measured_s']:.4f}", _error(row["predicted_s"], row["measured_s"])]
        table.add_row(*cells)
    total = ["total", "", "", "", "", "", "", "", f"{result['predicted_total_s']:.4f}"]
    if measured:
        p, m = result["predicted_total_s"], result["measured_total_s"]
        total += [f"{m:.4f}", _error(p, m)]
    table.add_row(*total, style="bold")
    return table


def _error(predicted: float, measured: float) -> str:
    return f"{(predicted - measured) / measured:+.1%}" if measured > 0 else "-"


def placement_lines(record, writes_to: list[str], nowhere: str | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    """What ``strataio info NAME`` says about a dataset's placement: the tiers its writes go
    to now (``writes_to``, in order of preference, down tiers left out; ``nowhere``: why
    none, where its hint cannot be used here) and, for an AUTO dataset, the placement by
    prediction and why."""
    from strataio.session import placement_decision

    if nowhere is not None:
        order = f"nowhere ({nowhere})"
    elif not writes_to:
        order = "nowhere (hint DISABLE, or every tier it may use is down)"
    else:
        order = writes_to[0]
        if len(writes_to) > 1:
            order += f", then {', '.join(writes_to[1:])} as it fills or is down"
    d = placement_decision(record)
    if d is None:
        return [f"writes go to: {order}"]
    asked = f"expected reads {d.expected_reads}"
    if d.deadline_s is not None:
        asked += f", deadline {d.deadline_s:g} s"
    how = (
        "the default AUTO (the slowest tier with room), not chosen by prediction"
        if d.tier is None
        else f"{d.tier}, chosen by prediction"
    )
    lines = [f"placement: {how} ({asked}): {d.reason}", f"writes go to: {order}"]
    for tier, (w, r) in d.predicted.items():
        mark = " <- chosen" if tier == d.tier else ""
        lines.append(f"  {tier}: predicted write {w:.4g} s + reads {r:.4g} s = {w + r:.4g} s{mark}")
    if d.skipped:
        lines.append(f"  not candidates: {', '.join(d.skipped)}")
    return lines


@bench.command("predict")
@click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="folder for the tiers and the catalog (default: a temporary one)",
)
@_max_size_option("4MiB", "largest calibrated size")
@_repeat_option
@click.option(
    "--no-calibrate", is_flag=True, help="reuse the calibration in --dir (which it needs)"
)
@count_option("--runs", 3, "measured runs per workload (median)")
@click.option("--workload", "names", multiple=True, help="run only these (repeatable)")
@json_option
@handle_errors
def bench_predict(
    root: Path | None,
    max_size: int,
    repeat: int,
    no_calibrate: bool,
    runs: int,
    names: tuple[str, ...],
    json_path: Path | None,
) -> None:
    """Prediction accuracy: calibrate a local, a shaped remote-disk and a shaped tape tier,
    then predict and measure workloads of every method; median and worst relative error."""
    import tempfile

    from strataio.predict.suite import SUITE, run_suite

    unknown = [n for n in names if n not in SUITE]
    if unknown:
        raise UsageProblem(f"unknown workload {unknown[0]!r} (known: {', '.join(SUITE)})")
    if no_calibrate and root is None:  # (a temporary folder holds no calibration to reuse)
        raise UsageProblem("--no-calibrate reuses the calibration in --dir: name the folder")
    err = make_console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="strataio-bench-predict-") as tmp:
        result = run_suite(
            root or tmp,
            names=list(names) or None,
            max_size=max_size,
            repeat=repeat,
            calibrate=not no_calibrate,
            runs=runs,
            on_step=lambda what: err.print(f"[dim]{what}…[/]"),
        )
    table = Table(title="predicted vs measured I/O time (4 processes; workload totals)")
    for c in ("workload", "method", "tiers", "predicted (s)", "measured (s)", "error"):
        table.add_column(c, justify="left" if c in ("workload", "method", "tiers") else "right")
    for r in result["workloads"]:
        table.add_row(
            r["name"],
            r["method"],
            ",".join(r["tiers"]),
            f"{r['predicted_s']:.3f}",
            f"{r['measured_s']:.3f}",
            _error(r["predicted_s"], r["measured_s"]),
        )
    console = make_console()
    console.print(table)
    console.print(f"median |error| {result['median_error']:.1%}, worst {result['worst_error']:.1%}")
    write_json(json_path, result)
