"""``strataio demo``: the Astro3D pipeline under the paper's five placement scenarios
(:mod:`strataio.demo`), and ``strataio demo sections``: write a sample dataset, read APRIL's
patterns A-H from it, check them."""

from __future__ import annotations

import statistics
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
from strataio.cli.output import (
    NON_NEGATIVE,
    OutputFile,
    handle_errors,
    json_option,
    make_console,
    rate,
    write_json,
)
from strataio.demo.astro3d import ALL, SCENARIOS, DemoParams
from strataio.demo.pipeline import DEFAULT_TIME_SCALE, DEMO
from strataio.errors import StrataError
from strataio.layout.sections import Section


@main.group("demo", invoke_without_command=True)
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".strataio/astro3d"),
    show_default=True,
    help="Folder of the demo's configuration, tiers and catalog (kept between runs while the "
    "time scale is unchanged, so the calibration is reused).",
)
@click.option(
    "--size",
    type=click.IntRange(min=1),
    default=DEMO.size,
    show_default=True,
    help="Side of every dataset's cube (the paper's Table 2: 128).",
)
@click.option(
    "--iterations",
    type=click.IntRange(min=0),
    default=DEMO.iterations,
    show_default=True,
    help="Steps of the run (the paper: 120); steps 0 ... N are simulated.",
)
@click.option(
    "--freq",
    type=click.IntRange(min=1),
    default=DEMO.freq,
    show_default=True,
    help="Every how many steps the analysis, visualization and checkpoint datasets are written.",
)
@click.option(
    "--ranks",
    "-n",
    type=click.IntRange(min=1),
    default=DEMO.ranks,
    show_default=True,
    help="Processes, launched under mpiexec by this command.",
)
@click.option(
    "--scenario",
    "scenarios",
    type=click.IntRange(1, 5),
    multiple=True,
    help="Figure 9 scenario to run (repeatable; default all five): "
    + "; ".join(f"({k}) {v[0]}" for k, v in SCENARIOS.items()),
)
@click.option(
    "--time-scale",
    type=NON_NEGATIVE,
    default=DEFAULT_TIME_SCALE,
    show_default=True,
    help="Factor on the shaped remote-disk and tape tiers' modelled times (0: no delay).",
)
@click.option(
    "--chart",
    type=OutputFile(),
    default=None,
    help="PNG bar chart of predicted and measured times (default: DIR/astro3d.png).",
)
@click.option("--recalibrate", is_flag=True, help="Calibrate the tiers even if calibrated.")
@json_option
@click.pass_context
@handle_errors
def demo_group(
    ctx: click.Context,
    directory: Path,
    size: int,
    iterations: int,
    freq: int,
    ranks: int,
    scenarios: tuple[int, ...],
    time_scale: float,
    chart: Path | None,
    recalibrate: bool,
    json_path: Path | None,
) -> None:
    """The Astro3D pipeline of the multi-storage paper (Figure 2, Table 2): a producer writes
    the analysis (press temp rho ux uy uz; float32), visualization (vr_*; uint8) and
    checkpoint (restart_*) datasets of a SIZE^3 grid every FREQ of ITERATIONS steps with
    collective writes; then the MSE analysis of consecutive temp dumps, a volume-rendering
    stand-in writing one image per dump into a superfile, and a viewer reading the images
    back. It runs under each of Figure 9's placement scenarios on RANKS processes, on the
    embedded default configuration (local disk, remote disk and tape tiers, the latter two
    shaped by the paper's 2002 models at TIME-SCALE), and prints the I/O time predicted by
    equation (2) beside the measured one; both are drawn in a bar chart.

    `strataio demo sections` is the APRIL section-read demo."""
    if ctx.invoked_subcommand is not None:
        # (the Astro3D run's options would be ignored in silence by a subcommand)
        given = [
            p.opts[0]
            for p in ctx.command.params
            if ctx.get_parameter_source(p.name) is click.core.ParameterSource.COMMANDLINE
        ]
        if given:
            sub = ctx.command.get_command(ctx, ctx.invoked_subcommand)
            own = {o for p in getattr(sub, "params", ()) for o in p.opts}
            after = [o for o in given if o in own]
            raise click.UsageError(
                f"{', '.join(given)}: options of the Astro3D run ('strataio demo'), not of "
                f"'demo {ctx.invoked_subcommand}'"
                + (f": give {', '.join(after)} after '{ctx.invoked_subcommand}'" if after else "")
            )
        return
    params = DemoParams(size=size, iterations=iterations, freq=freq, ranks=ranks)
    result = run_astro3d(
        directory, params, sorted(set(scenarios)) or list(SCENARIOS), time_scale, chart, recalibrate
    )
    write_json(json_path, result)


@demo_group.command("sections")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".strataio/demo"),
    show_default=True,
    help="Where the sample dataset is written (replaced if it exists).",
)
@click.option(
    "--size",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    help="Side of the square array.",
)
@click.option(
    "--chunk",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Side of the square chunks.",
)
@click.option("--codec", default="zstd+crc32c", show_default=True, help="Codec pipeline.")
def sections_cmd(directory: Path, size: int, chunk: int, codec: str) -> None:
    """Write a SIZE x SIZE float32 dataset in CHUNK x CHUNK sub-files, then read the APRIL
    access patterns A-H (scaled to SIZE; x runs along a row) and check each against numpy.

    Exit 0 every pattern read back right; 1 a pattern read back different data, or the
    dataset could not be written or read; 2 a usage error (a --codec refused among them)."""
    console = make_console()
    path = directory / "sample.zarr"
    data = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    t0 = time.perf_counter()
    try:
        created = strataio.create_dataset(
            path, (size, size), "float32", (chunk, chunk), codec=codec, overwrite=True
        )
    except OSError as exc:  # (the folder cannot be made or written: a failure)
        fail(f"demo failed: {exc}", 1)
    except StrataError as exc:  # (an argument refused, --codec most often: a usage error)
        fail(f"demo failed: {exc}")
    try:
        with created as ds:
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
                    rate(got.nbytes / dt / 1e6),
                    "[green]ok[/green]" if ok else "[red]MISMATCH[/red]",
                )
            stored, disk = ds.nchunks_stored(), bytes_on_disk(ds)
    except (StrataError, OSError) as exc:  # (writing or reading it failed)
        fail(f"demo failed: {exc}", 1)
    console.print(table)
    console.print(
        f"wrote {data.nbytes / 1e6:.0f} MB in {t_write:.2f} s as {stored} chunks, "
        f"{disk / 1e6:.1f} MB on disk ({codec}); inspect it with: strataio info {path}"
    )
    if failures:
        fail(f"{failures} pattern(s) read back different data", 1)


def run_astro3d(
    directory: Path,
    params: DemoParams,
    scenarios: list[int],
    time_scale: float,
    chart: Path | None,
    recalibrate: bool,
) -> dict:
    """Calibrate if needed, predict and run each scenario with progress, print the table,
    draw the chart; the results as ``--json`` writes them."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from strataio.config import load_config
    from strataio.demo.pipeline import (
        ensure_access_costs,
        ensure_calibrated,
        plot_results,
        prepare_folder,
        run_demo,
    )

    console = make_console()
    config_path, kept = prepare_folder(directory, time_scale, fresh=recalibrate)
    config = load_config(config_path)
    shaped = ", ".join(f"{t.name} ({t.role}) shaped {t.shaped}" for t in config.tiers if t.shaped)
    console.print(
        f"configuration: the embedded default (strataio init), in {config_path}; tiers "
        f"{', '.join(t.name for t in config.tiers)}; {shaped}, "
        f"[bold]time-scaled x{time_scale:g}[/bold] (every modelled delay multiplied by it)"
    )
    console.print(
        f"Astro3D: {params.size}^3 grid, steps 0..{params.iterations}, every {params.freq} "
        f"({params.dumps} dumps of {len(ALL)} datasets), "
        f"{params.ranks} processes under mpiexec"
    )
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=make_console(stderr=True),
    )
    with bar:
        tasks: dict[str, int] = {}

        def calibrating(tier: str, done: int, total: int) -> None:
            if tier not in tasks:
                tasks[tier] = bar.add_task(f"calibrating {tier}", total=total)
            bar.update(tasks[tier], completed=done)

        perf, calibrated = ensure_calibrated(config, params, calibrating)
        access = bar.add_task("Session access costs per tier", total=None)
        perf, _ = ensure_access_costs(config, config_path, params, perf)
        bar.update(access, total=1, completed=1)
        current: list[int] = []

        def start(scenario: int, total: int) -> None:
            current.append(bar.add_task(f"scenario ({scenario})", total=total))

        results = run_demo(
            config_path,
            params,
            scenarios,
            perf,
            on_start=start,
            on_progress=lambda k: bar.advance(current[-1], k),
        )
    console.print(
        "tiers calibrated now (quick: two repeats, small sizes); the calibration is kept in "
        f"{config.catalog.display_url}"
        if calibrated
        else f"calibration reused from {config.catalog.display_url} (--recalibrate to redo it)"
    )
    table = Table(
        title=f"Astro3D I/O time per Figure 9 scenario, {params.ranks} processes "
        f"(shaped tiers at time scale {time_scale:g})",
        box=box.SIMPLE_HEAD,
    )
    table.add_column("scenario", justify="left")
    table.add_column("placement", justify="left")
    table.add_column("predicted (s)", justify="right")
    table.add_column("measured (s)", justify="right")
    table.add_column("|error|", justify="right")
    table.add_column("backend only (s)", justify="right")
    table.add_column("|error|", justify="right")
    table.add_column("check", justify="left")
    failures = 0
    for r in results:
        ok = r.consumers_ok(params)
        failures += not ok
        table.add_row(
            f"({r.scenario})",
            r.title,
            f"{r.predicted_s:.3f}",
            f"{r.measured_s:.3f}",
            f"{r.error:.1%}",
            f"{r.backend_only_s:.3f}",
            f"{r.backend_only_error:.1%}",
            "[green]ok[/green]" if ok else "[red]MISMATCH[/red]",
        )
    console.print(table)
    errors = [r.error for r in results]
    backend = [r.backend_only_error for r in results]
    console.print(
        f"median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%} "
        f"(backend only: {statistics.median(backend):.1%}, {max(backend):.1%}); predicted by "
        "equation (2) on the performance database, measured between barriers"
    )
    chart = chart or directory / "astro3d.png"
    plot_results(
        results,
        chart,
        f"{params.size}^3, {params.iterations} steps every {params.freq}, {params.ranks} "
        f"processes, shaped tiers at time scale {time_scale:g}",
    )
    console.print(f"chart: {chart}")
    if failures:
        raise StrataError(f"{failures} scenario(s) read back different data")
    return {
        "params": {
            "size": params.size,
            "iterations": params.iterations,
            "freq": params.freq,
            "ranks": params.ranks,
            "time_scale": time_scale,
        },
        "calibrated_now": calibrated,
        "chart": str(chart),
        "scenarios": [
            {
                "scenario": r.scenario,
                "placement": r.title,
                "predicted_s": r.predicted_s,
                "measured_s": r.measured_s,
                "error": r.error,
                "backend_only_s": r.backend_only_s,
                "backend_only_error": r.backend_only_error,
                "predicted": r.predicted,
                "measured": r.measured,
                "mse": r.mse,
                "images": r.viewed,
            }
            for r in results
        ],
    }
