"""``strataio bench sections``: APRIL Tables 2-3 and §6.1, scaled (see strataio.bench.sections)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from strataio.bench.contenders import CONTENDERS
from strataio.bench.mpi import run_ranks
from strataio.bench.sections import (
    CACHES,
    COLLECTIVE_CACHES,
    COLLECTIVE_PATTERNS,
    PAPER_ADAPTIVE_GAINS,
    PAPER_GAINS,
    CollectiveSectionsConfig,
    SectionsConfig,
    check_baseline,
    compare_with_baseline,
    count_steps,
    plan_passes,
    run_sections,
)
from strataio.cli import bench
from strataio.cli.output import (
    COUNTS,
    HINT,
    NON_NEGATIVE,
    POSITIVE,
    SIZE,
    SIZES,
    ByteSize,
    count_option,
    json_option,
    make_console,
    rate,
    write_json,
)
from strataio.errors import StrataError

_MODULES = {
    "h5py": "h5py",
    "zarr": "zarr",
    "tensorstore": "tensorstore",
    "tensorstore-cached": "tensorstore",
}
_SHORT = {
    "tensorstore": "tstore",
    "tensorstore-cached": "tstore-c",
    "strataio-tiered": "tiered",
    "strataio-tiered-written": "tiered-w",
    "strataio-crc32c": "crc32c",
}
#: ratio columns (numerator, denominator, heading): strataio against its peers, and the
#: tiered dataset against the plain one on the same disk, without and with checksums
_RATIOS = (
    ("strataio", "zarr", "s/zarr"),
    ("strataio", "tensorstore", "s/tstore"),
    ("strataio", "tensorstore-cached", "s/tstore-c"),
    ("strataio-tiered", "strataio", "tiered/s"),
    ("strataio-tiered-written", "strataio", "tiered-w/s"),
    ("strataio-tiered", "strataio-crc32c", "tiered/crc"),
)
#: the tables need about this many columns; a narrower terminal would fold every cell
_TABLE_WIDTH = 240


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _fmt_time(t: float) -> str:
    if t >= 1:
        return f"{t:.2f}s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g}ms"
    return f"{t * 1e6:.3g}µs"


def _fmt_bw(b: float) -> str:
    return f"{b / 1e9:.2f} GB/s" if b >= 1e9 else f"{b / 1e6:.1f} MB/s"


def _fmt_gain(g: float) -> str:
    color = "green" if g > 0 else "red"
    return f"[{color}]{g:+.0f}%[/{color}]"


def render_tables(result: dict[str, Any], console: Console) -> None:
    """Print one Table-3-like table per chunk shape, then the bandwidth summary."""
    timed = {r["contender"] for ps in result["passes"] for r in ps["results"]}
    contenders = [c for c in result["config"]["contenders"] if c != "naive" and c in timed]
    for ps in result["passes"]:
        col = ps["paper_column"]
        adaptive = ps["label"].startswith("adaptive")
        rows_c, cols_c = ps["chunks"]
        title = f"Sections, chunks {rows_c}x{cols_c}"
        if col is not None:
            title += f" (APRIL {('small', 'large')[col]} chunk)"
        elif adaptive:
            title += " (APRIL §6.1: chunk shaped like pattern E)"
        if result["config"].get("reopen"):
            title += ", each call open → section → close"
        table = Table(
            title=title,
            caption="time gain-vs-naive %; s/x = strataio time / x time (< 1: strataio "
            "faster); tiered/s = tiered dataset time / plain strataio time; tiered-w/s = the "
            "same for a tiered dataset whose copies no read checked since their write; "
            "tiered/crc = tiered over the plain dataset checking a CRC-32C of every chunk it "
            "reads",
            box=box.SIMPLE_HEAD,
        )
        for name in ("Pat", "Op", "Cache", "naive"):  # (never cut: naive is the baseline)
            table.add_column(name, justify="left" if name != "naive" else "right", no_wrap=True)
        for c in contenders:
            table.add_column(_SHORT.get(c, c), justify="right", no_wrap=True)
        show_paper = col is not None or adaptive
        if show_paper:
            table.add_column("APRIL", justify="right")
        ratios = [(a, b, h) for a, b, h in _RATIOS if a in contenders and b in contenders]
        for _a, _b, heading in ratios:
            table.add_column(heading, justify="right", no_wrap=True)
        by_key: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
        for r in ps["results"]:
            by_key.setdefault((r["pattern"], r["op"], r["cache"]), {})[r["contender"]] = r
        for (pat, op, cache), rs in by_key.items():
            cells = [pat, op, cache, _fmt_time(rs["naive"]["seconds"])]
            for c in contenders:
                r = rs[c]
                cells.append(f"{_fmt_time(r['seconds'])} {_fmt_gain(r['gain_pct'])}")
            if show_paper:
                g = PAPER_ADAPTIVE_GAINS[op] if adaptive else PAPER_GAINS[(pat, op)][col]
                cells.append(f"{g:+.0f}%")
            for a, b, _h in ratios:
                cells.append(f"{rs[a]['seconds'] / rs[b]['seconds']:.2f}")
            table.add_row(*cells)
        console.print(table)
    for mode, meaning in result.get("caches", {}).items():
        console.print(f"cache mode [bold]{mode}[/bold]: {meaning}")
    mem = result["memcpy_bytes_per_s"]
    cache = result["chunk_cache_bytes"]
    console.print(
        f"strataio chunk cache: {cache / 2**20:.0f} MiB" if cache else "strataio chunk cache: off"
    )
    console.print(f"numpy memcpy bandwidth: {_fmt_bw(mem)}")
    for c in result["pattern_c_warm_read"]:
        frac = c["fraction_of_memcpy"]
        verdict = "[green]>= 50%[/green]" if frac >= 0.5 else "[red]< 50%[/red]"
        console.print(
            f"strataio pattern C warm read into an existing array, chunks "
            f"{c['chunks'][0]}x{c['chunks'][1]}: "
            f"{_fmt_bw(c['bytes_per_s'])} = {frac:.1%} of memcpy "
            f"({_fmt_bw(c['memcpy_bytes_per_s'])} right after) {verdict}"
        )


def render_baseline(rows: list[dict[str, Any]], source: str, console: Console) -> None:
    """One table per pass run now: each row's median time in the earlier run and now, and
    their ratio (a row the earlier run lacks shown as such); then a count of the earlier
    run's rows not run now (all of them are in the JSON)."""
    passes: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        passes.setdefault(r["pass"], []).append(r)
    for label, rs in passes.items():
        now = [r for r in rs if r["after"] is not None]
        gone = len(rs) - len(now)
        if now:
            table = Table(
                title=f"Before and after, chunks {label}",
                caption=f"before = {source}; new/old = time now / time before (< 1: faster now)",
                box=box.SIMPLE_HEAD,
            )
            for name in ("Pat", "Op", "Cache", "Store", "before", "now", "new/old"):
                table.add_column(
                    name, justify="right" if name in ("before", "now", "new/old") else "left"
                )
            for r in now:
                ratio = r["ratio"]
                if ratio is None:
                    shown = "[yellow]no earlier row[/yellow]"
                else:
                    color = "green" if ratio <= 1 else "red"
                    shown = f"[{color}]{ratio:.2f}[/{color}]"
                before = "-" if r["before"] is None else _fmt_time(r["before"])
                table.add_row(
                    r["pattern"], r["op"], r["cache"], r["contender"], before,
                    _fmt_time(r["after"]), shown,
                )  # fmt: skip
            console.print(table)
        if gone:
            console.print(f"chunks {label}: {gone} rows of the earlier run not run now")


def render_collective(rows: list[dict[str, Any]], console: Console) -> None:
    """One row per chunk shape, pattern and cache state: chunks read and time, each rank on
    its own against the ranks together."""
    table = Table(
        title=f"Sub-columns of one region, {rows[0]['ranks'] if rows else 0} ranks",
        caption="chunks = chunks read from storage by all ranks together; time = slowest "
        "rank, median; ratio = independent time / collective time (> 1: collective faster)",
        box=box.SIMPLE_HEAD,
    )
    for name in ("chunks", "Pat", "Cache", "chunks ind", "chunks coll", "ind", "coll", "ratio"):
        table.add_column(name, justify="left" if name in ("Pat", "Cache") else "right")
    by_key: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault((tuple(r["chunks"]), r["pattern"], r["cache"]), {})[r["mode"]] = r
    for (chunks, pat, cache), rs in by_key.items():
        ind, coll = rs["independent"], rs["collective"]
        table.add_row(
            f"{chunks[0]}x{chunks[1]}", pat, cache, str(ind["chunks_read"]),
            str(coll["chunks_read"]), _fmt_time(ind["seconds"]), _fmt_time(coll["seconds"]),
            f"{ind['seconds'] / coll['seconds']:.2f}",
        )  # fmt: skip
    console.print(table)


@bench.command("sections")
@count_option("--size", 8000, "Side of the square float32 array.")
@click.option(
    "--chunks",
    default=None,
    help="Square chunk sides, comma-separated [default: APRIL's 1000,2000 scaled to --size, "
    "160,320 at 8000].",
)
@click.option("--patterns", default="ABCDEFGH", show_default=True, help="Patterns to run.")
@count_option("--repeat", 3, "Calls per measurement (median).")
@click.option("--ops", default="read,write", show_default=True, help="Operations.")
@click.option(
    "--cache",
    "caches",
    default=None,
    help=f"Cache modes, comma-separated, from {', '.join(CACHES)} [default: all three; "
    f"{','.join(COLLECTIVE_CACHES)} with --collective].",
)
@click.option(
    "--contenders",
    default=",".join(CONTENDERS),
    show_default=True,
    help="Stores to compare; naive is the baseline and always runs.",
)
@click.option(
    "--adaptive/--no-adaptive",
    default=True,
    show_default=True,
    help="Also run pattern E with chunks shaped like it (APRIL §6.1).",
)
@click.option(
    "--dir",
    "workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Parent of the work directory [default: the current directory]; removed afterwards.",
)
@click.option(
    "--chunk-cache",
    "chunk_cache",
    type=ByteSize(least=0),
    default=None,
    help="Size of strataio's decoded-chunk cache for the run, e.g. 64MiB; 0 turns it off "
    "[default: $STRATAIO_CHUNK_CACHE or 64MiB].",
)
@click.option(
    "--reopen",
    is_flag=True,
    help="Time each call as open → section → close: every store opens the array for the "
    "call and closes it after (strataio-tiered-written is left out).",
)
@click.option(
    "--collective",
    is_flag=True,
    help="Instead: --ranks ranks read sub-columns of each pattern's region (default "
    f"patterns {COLLECTIVE_PATTERNS}), each on its own and with Dataset.read_all.",
)
@click.option(
    "--ranks",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Ranks of the --collective run.",
)
@click.option(
    "--baseline",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="The --json of an earlier run: also show each row's earlier time and new/old ratio.",
)
@json_option
@click.option("--seed", default=0, show_default=True, help="Seed of the random array.")
def sections_cmd(
    size: int,
    chunks: str | None,
    patterns: str,
    repeat: int,
    ops: str,
    caches: str | None,
    contenders: str,
    adaptive: bool,
    workdir: Path | None,
    chunk_cache: str | None,
    reopen: bool,
    collective: bool,
    ranks: int,
    baseline: Path | None,
    json_path: Path | None,
    seed: int,
) -> None:
    """APRIL's sub-filing experiment (Tables 2-3, §6.1) scaled to a SIZE x SIZE float32 array.

    Times section reads and writes of patterns A-H for a naive single raw file (one system
    call per row piece), strataio sub-files (a plain dataset, and a tiered dataset of a
    Session on one local-disk tier), h5py, zarr-python and TensorStore (cache pool off, and
    on with strataio's chunk-cache budget) with the same chunks, and reports each one's gain
    over naive, in three cache modes: warm (every cache as the process has it, after an
    untimed call), first (a process's first read: each store's own in-process caches
    emptied before every call, as a process opening the array anew finds them, page cache
    warm) and cold (nothing in memory: the files evicted from the page cache too). A tiered
    dataset reads a copy whole and checks it once after each write of it (tiered-written
    shows that read), then in range. Timed writes end in the page cache (no fsync); the
    tiered dataset's also announce the rewrite in its catalog. Each pattern is first checked
    against numpy. With --baseline, the --json of an earlier run, each row's earlier time and
    new/old ratio are shown too. With --reopen, each timed call is a user's open → section →
    close, so the rows include what opening the array costs each store.

    Geometry: the paper's (x0,y0)-(x1,y1) is numpy a[y0:y1, x0:x1] with x along a row (G needs
    4000 naive calls, E one, F is the worst naive case): scaled to 8000, E is 13 full rows and
    F is 8000 rows x 13 columns.

    With --collective: --ranks ranks (under mpiexec) read the sub-columns of each pattern's
    region, one each, first each rank on its own (ds[...]), then together
    (Dataset.read_all, each shared chunk read once): chunks read from storage and time.
    """
    if collective and reopen:
        raise click.UsageError("--reopen times the single-process table; not with --collective")
    if collective:
        _sections_collective(
            size, chunks, patterns, repeat, caches or ",".join(COLLECTIVE_CACHES), ranks,
            workdir, json_path, seed,
        )  # fmt: skip
        return
    earlier = None
    if baseline is not None:
        try:
            earlier = json.loads(baseline.read_text())
            check_baseline(earlier)
        except (OSError, ValueError, StrataError) as exc:
            raise click.BadParameter(f"{baseline}: {exc}", param_hint="--baseline") from None
    err = make_console(stderr=True)
    names = ["naive", *[c for c in _csv(contenders) if c != "naive"]]
    missing = [c for c in names if c in _MODULES and importlib.util.find_spec(_MODULES[c]) is None]
    for c in missing:
        err.print(f"[yellow]skipping {c}: the {_MODULES[c]} package is not installed[/yellow]")
    try:
        sides = tuple(int(c) for c in _csv(chunks)) if chunks else None
    except ValueError:
        raise click.BadParameter(
            f"{chunks!r} is not a list of integers", param_hint="--chunks"
        ) from None
    cfg = SectionsConfig(
        chunk_cache=chunk_cache,
        size=size,
        chunks=sides,
        patterns=patterns.upper(),
        repeat=repeat,
        ops=_csv(ops),
        caches=_csv(caches or ",".join(CACHES)),
        contenders=tuple(c for c in names if c not in missing),
        adaptive=adaptive,
        workdir=workdir,
        seed=seed,
        reopen=reopen,
    )
    try:
        cfg.validate()
    except StrataError as exc:
        raise click.UsageError(str(exc)) from None
    total = count_steps(cfg, plan_passes(cfg))
    with Progress(
        TextColumn("[bold]{task.description}", justify="left"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task("generating data", total=total)
        result = run_sections(cfg, lambda d: progress.update(task, advance=1, description=d))
    out = make_console()
    out.width = max(out.width, _TABLE_WIDTH)
    render_tables(result, out)
    if earlier is not None:
        rows = compare_with_baseline(result, earlier)
        result["baseline"] = {"path": str(baseline), "rows": rows}
        render_baseline(rows, str(baseline), out)
    write_json(json_path, result)


def _sections_collective(
    size: int,
    chunks: str | None,
    patterns: str,
    repeat: int,
    caches: str,
    ranks: int,
    workdir: Path | None,
    json_path: Path | None,
    seed: int,
) -> None:
    """``bench sections --collective``: launch the ranks, print their table."""
    try:
        sides = tuple(int(c) for c in _csv(chunks)) if chunks else None
    except ValueError:
        raise click.BadParameter(
            f"{chunks!r} is not a list of integers", param_hint="--chunks"
        ) from None
    cfg = CollectiveSectionsConfig(
        size=size, chunks=sides, repeat=repeat, ranks=ranks, caches=_csv(caches),
        patterns=COLLECTIVE_PATTERNS if patterns == "ABCDEFGH" else patterns.upper(),
        workdir=workdir, seed=seed,
    )  # fmt: skip
    try:
        cfg.validate()
    except StrataError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        rows = run_ranks(ranks, "strataio.bench.sections", cfg.args(), timeout=3600)
    except StrataError as exc:
        raise click.ClickException(str(exc)) from None
    out = make_console()
    out.width = max(out.width, _TABLE_WIDTH)
    render_collective(rows, out)
    write_json(json_path, rows)


@bench.command("superfile")
@click.option(
    "--counts", type=COUNTS, default="100,1000", show_default=True, help="Numbers of files."
)
@click.option(
    "--size", "member_size", type=SIZE, default="64KiB", show_default=True, help="Bytes per file."
)
@click.option(
    "--presets",
    default="remote_disk_2002,remote_tape_2002",
    show_default=True,
    help="Cost-model presets of the remote tier (storage/shaped.py).",
)
@click.option(
    "--time-scale",
    type=NON_NEGATIVE,
    default=0.001,
    show_default=True,
    help="Factor on the model's sleeps.",
)
@click.option(
    "--container", type=SIZE, default=None, help="Container size (default: the library's)."
)
@click.option(
    "--sweep",
    type=SIZES,
    default=None,
    help="Container sizes to compare on the largest count (e.g. 1MiB,4MiB,16MiB,64MiB).",
)
@json_option
def superfile_cmd(
    counts: list[int],
    member_size: int,
    presets: str,
    time_scale: float,
    container: int | None,
    sweep: list[int] | None,
    json_path: Path | None,
) -> None:
    """Small files from a shaped remote tier: a superfile versus one object per file."""
    from strataio.bench.superfile import run_superfile, superfile_tables
    from strataio.storage.shaped import PRESETS
    from strataio.tiers.superfile import DEFAULT_CONTAINER_BYTES

    names = _csv(presets)
    unknown = [n for n in names if n not in PRESETS]
    if unknown or not names:
        what = f"unknown preset(s) {', '.join(map(repr, unknown))}" if unknown else "none named"
        raise click.BadParameter(
            f"{what}; known: {', '.join(sorted(PRESETS))}", param_hint="--presets"
        )
    try:
        result = run_superfile(
            counts=counts,
            member_bytes=member_size,
            presets=names,
            time_scale=time_scale,
            container_bytes=container or DEFAULT_CONTAINER_BYTES,
            sweep=sweep or [],
        )
    except (StrataError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    console = make_console()
    for table in superfile_tables(result):
        console.print(table)
    write_json(json_path, result)


# ---------------------------------------------------------------------------- realm policies
def _render_realms(rows: list[dict[str, Any]], console: Console) -> None:
    for row in rows:
        title = f"{row['bench']}, {row['ranks']} ranks, driver {row['driver']}"
        if "tile_bytes" in row:
            title += f" (tiles of {row['tile_bytes']} B, file {row['file_bytes']} B)"
        table = Table(title=title, caption="speedup = no caching time / policy time",
                      box=box.SIMPLE_HEAD)  # fmt: skip
        for name in ("policy", "stripe", "time", "speedup", "read MB", "written MB"):
            table.add_column(name, justify="left" if name == "policy" else "right")
        for policy, r in row["policies"].items():
            style = "green" if r["speedup"] >= 1 else "red"
            table.add_row(
                policy, str(r["stripe"] or "per call"), _fmt_time(r["seconds"]), f"[{style}]{r['speedup']:.2f}[/{style}]",
                f"{r['read_bytes'] / 1e6:.1f}", f"{r['written_bytes'] / 1e6:.1f}",
            )  # fmt: skip
        console.print(table)


def _realm_bench(benches: list[str], ranks: list[int], drivers: tuple[str, ...], reps: int,
                 scale: float, hints: tuple[str, ...], timeout: float) -> list[dict[str, Any]]:  # fmt: skip
    args = [a for b in benches for a in ("--bench", b)]
    args += [a for d in drivers for a in ("--driver", d)]
    args += ["--reps", str(reps), "--scale", str(scale)]
    args += [a for h in hints for a in ("--hint", h)]
    rows: list[dict[str, Any]] = []
    for n in ranks:
        try:
            rows += run_ranks(n, "strataio.bench.realms", args, timeout)
        except StrataError as exc:
            raise click.ClickException(str(exc)) from None
    return rows


#: repetitions of a benchmark's measurement, the median reported
_reps_option = count_option("--reps", 3, "Repetitions (median reported).")

_realm_options = [
    click.option("--ranks", type=COUNTS, default="1,2,4", show_default=True,
                 help="Comma-separated rank counts."),
    click.option("--driver", "drivers", multiple=True, type=click.Choice(["local", "pfs"]),
                 help="local disk, pfs (shaped driver, parallel-file-system preset); default both."),
    _reps_option,
    click.option("--hint", "hints", multiple=True, type=HINT, help="KEY=VALUE hint added to every policy."),
    json_option,
    click.option("--timeout", type=POSITIVE, default=600.0, show_default=True, help="Seconds per mpiexec launch."),
]  # fmt: skip


def _with_realm_options(fn: Any) -> Any:
    for option in reversed(_realm_options):
        fn = option(fn)
    return fn


@bench.command("sliding-window")
@click.option("--scale", default=1 / 4, type=POSITIVE, show_default=True,
              help="Tile size against the thesis's 3 MiB (1/4: 768 KiB tiles, a 48 MiB file).")  # fmt: skip
@_with_realm_options
def sliding_window_cmd(
    scale: float, ranks: list[int], drivers: tuple[str, ...], reps: int, hints: tuple[str, ...],
    json_path: Path | None, timeout: float,
) -> None:  # fmt: skip
    """Thesis §3.5.2: each rank reads then writes its tile of 8×8 and moves on, per realm
    policy (64K, 4M, fsize, aar, intelligent) against no caching: time and storage bytes."""
    rows = _realm_bench(["sliding-window"], ranks, drivers, reps, scale, hints, timeout)
    _render_realms(rows, make_console())
    write_json(json_path, rows)


@bench.command("realms")
@click.option("--pattern", "patterns", multiple=True, type=click.Choice(["block3d", "flash"]),
              help="Collective patterns of 'bench collective' (default both).")  # fmt: skip
@click.option(
    "--scale", type=POSITIVE, default=1.0, show_default=True, help="Scale the patterns' sizes."
)
@_with_realm_options
def realms_cmd(
    patterns: tuple[str, ...], scale: float, ranks: list[int], drivers: tuple[str, ...], reps: int,
    hints: tuple[str, ...], json_path: Path | None, timeout: float,
) -> None:  # fmt: skip
    """block3d and flash of 'bench collective', written then read on one open file, per realm
    policy (64K, 4M, fsize, aar) against no caching: time and storage bytes."""
    benches = list(patterns or ("block3d", "flash"))
    rows = _realm_bench(benches, ranks, drivers, reps, scale, hints, timeout)
    _render_realms(rows, make_console())
    write_json(json_path, rows)


@bench.command("compress")
@count_option("--ranks", 4, "Ranks (under mpiexec).")
@click.option(
    "--per-rank",
    "per_rank",
    type=SIZE,
    default="16MiB",
    show_default=True,
    help="Bytes each rank writes.",
)
@count_option("--repeat", 5, "Timed rounds (median).")
@click.option(
    "--bandwidth",
    type=SIZE,
    default="200MB",
    show_default=True,
    help="Bandwidth of the shaped device (shared by the ranks), per second.",
)
@click.option("--storages", default="local,shaped", show_default=True, help="local and/or shaped.")
@click.option(
    "--codec",
    default="lz4:1",
    show_default=True,
    help="Inner chunk codec, NAME[:LEVEL]: lz4 (in blosc), zstd or blosc (zstd in blosc).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Parent of the work directory [default: the system's temporary directory].",
)
@json_option
def compress_cmd(
    ranks: int,
    per_rank: int,
    repeat: int,
    bandwidth: int,
    storages: str,
    codec: str,
    workdir: Path | None,
    json_path: Path | None,
) -> None:
    """Collective writes of compressed shards (No et al. §4, Figure 5): write_all bandwidth
    at compression ratios 1:1, 2:1, 4:1 and 8:1 against the same write uncompressed, with
    one offset chain (plain) and two pipelined groups, on local disk and on a shaped device.
    """
    nbytes = per_rank
    unknown = set(_csv(storages)) - {"local", "shaped"}
    if unknown or ranks < 1 or repeat < 1:
        raise click.UsageError(
            f"--storages takes local and/or shaped (got {storages!r}); --ranks and --repeat "
            "must be >= 1"
        )
    from strataio.bench.compress import codec_spec

    try:
        codec_spec(codec)  # (here, rather than on every rank after mpiexec has started)
    except StrataError as exc:
        raise click.BadParameter(str(exc), param_hint="'--codec'") from None
    args = [
        f"--per-rank={nbytes}", f"--repeat={repeat}", f"--bandwidth={bandwidth}",
        f"--storages={','.join(_csv(storages))}", f"--codec={codec}",
    ]  # fmt: skip
    if workdir is not None:
        args.append(f"--workdir={workdir}")
    try:
        result = run_ranks(ranks, "strataio.bench.compress", args, timeout=3600)
    except StrataError as exc:
        raise click.ClickException(str(exc)) from None
    out = make_console()
    table = Table(
        title=f"compressed collective writes: {ranks} ranks, {rate(result['bytes'] / 2**20)} MiB, "
        f"codec {result['codec']}, shaped device {result['bandwidth_model'] / 1e6:.0f} MB/s; "
        "speed-up against the uncompressed write of the same storage and mode",
        box=box.SIMPLE,
    )
    for col in ("storage", "mode", "ratio", "achieved", "time", "bandwidth", "speed-up"):
        table.add_column(col, justify="left" if col in ("storage", "mode") else "right")
    for r in result["rows"]:
        table.add_row(
            r["storage"], r["mode"], r["ratio"], f"{r['achieved']:.2f}", _fmt_time(r["seconds"]),
            _fmt_bw(r["bandwidth"]), f"{r['speedup']:.2f}x",
        )  # fmt: skip
    out.print(table)
    if not result["verified"]:
        raise click.ClickException("the 8:1 dataset did not read back as written")
    write_json(json_path, result)


# ---------------------------------------------------------------------------- irregular I/O
def _launch(n: int, args: list[str], timeout: float) -> list[dict[str, Any]]:
    try:
        rows: list[dict[str, Any]] = run_ranks(n, "strataio.bench.irregular", args, timeout)
    except StrataError as exc:
        raise click.ClickException(str(exc)) from None
    return rows


def _render_irregular(rows: list[dict[str, Any]], console: Console) -> None:
    for row in rows:
        s, p, r, x = row["strataio"], row["pread"], row["romio"], row["speedup"]
        title = (f"irregular, {row['ranks']} ranks, {row['items_per_rank']} items of "
                 f"{row['itemsize']} B per rank ({rate(row['bytes_per_rank'] / 2**20)} MiB)")  # fmt: skip
        table = Table(title=title, box=box.SIMPLE_HEAD,
                      caption=f"schedule built once in {_fmt_time(s['build'])}; speedup = "
                              "contender time / strataio time")  # fmt: skip
        for name in ("op", "strataio", "pread/item", "romio", "romio core", "vs pread",
                     "vs romio", "vs core", "reuse"):  # fmt: skip
            table.add_column(name, justify="left" if name == "op" else "right")
        for op in ("read", "write"):
            table.add_row(
                op, _fmt_time(s[op]), _fmt_time(p[op]), _fmt_time(r[op]),
                _fmt_time(r[f"core_{op}"]), f"{x[f'{op}_vs_pread']:.1f}",
                f"{x[f'{op}_vs_romio']:.2f}", f"{x[f'{op}_vs_romio_core']:.2f}",
                f"{s[f'reuse_speedup_{op}']:.1f}",
            )  # fmt: skip
        if not (s["correct"] and p["correct"] and r["correct"]):
            console.print("[red]a contender read wrong data[/red]")
        console.print(table)


@bench.command("irregular")
@click.option(
    "--ranks", type=COUNTS, default="4", show_default=True, help="Comma-separated rank counts."
)
@count_option("--items", 262144, "Items per rank.")
@click.option("--itemsize", "itemsizes", type=COUNTS, default="16,32", show_default=True,
              help="Bytes per item (16, 32: 4 and 8 MiB per rank at the default items).")  # fmt: skip
@_reps_option
@json_option
@click.option(
    "--timeout", type=POSITIVE, default=600.0, show_default=True, help="Seconds per mpiexec launch."
)
def irregular_cmd(
    ranks: list[int],
    items: int,
    itemsizes: list[int],
    reps: int,
    json_path: Path | None,
    timeout: float,
) -> None:
    """Reads and writes through indirection arrays: index schedules against one pread per
    item and against ROMIO with an indexed file view (Read_all / Write_all)."""
    args = ["--bench", "irregular", "--items", str(items), "--reps", str(reps)]
    args += [a for s in itemsizes for a in ("--itemsize", str(s))]
    rows = [r for n in ranks for r in _launch(n, args, timeout)]
    _render_irregular(rows, make_console())
    write_json(json_path, rows)


def _render_loopcache(rows: list[dict[str, Any]], console: Console) -> None:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["ranks"], row["driver"], row["layout"], tuple(sorted(row["hints"].items())))
        groups.setdefault(key, []).append(row)
    for (nranks, driver, layout, hints), part in groups.items():
        extra = "".join(f", {k}={v}" for k, v in hints)
        table = Table(title=f"loopcache, {nranks} ranks, driver {driver}{extra}, {layout} "
                            f"windows, {part[0]['loops']} loops, 7/8 overlap",
                      caption="speedup = no caching time / caching time", box=box.SIMPLE_HEAD)  # fmt: skip
        for name in ("index array", "data", "no caching", "caching", "speedup", "items read",
                     "items written", "schedules", "same bytes"):  # fmt: skip
            table.add_column(name, justify="right")
        for r in part:
            style = "green" if r["speedup"] >= 1 else "red"
            table.add_row(
                f"{r['index_bytes'] // 1024} KB", f"{r['data_bytes'] / 2**20:.2f} MiB",
                _fmt_time(r["no_caching"]), _fmt_time(r["caching"]),
                f"[{style}]{r['speedup']:.2f}[/{style}]",
                f"{r['items_read']['caching']} / {r['items_read']['no_caching']}",
                f"{r['items_written']['caching']} / {r['items_written']['no_caching']}",
                _fmt_time(r["schedule_seconds"]), "yes" if r["same_bytes"] else "[red]NO[/red]",
            )  # fmt: skip
        console.print(table)


@bench.command("loopcache")
@click.option(
    "--ranks", type=COUNTS, default="4", show_default=True, help="Comma-separated rank counts."
)
@click.option("--index-bytes", "sizes", type=SIZES, default="4KiB,16KiB,64KiB,256KiB,1MiB",
              show_default=True, help="Indirection array per rank (4-byte indices).")  # fmt: skip
@count_option("--loops", 4, "Irregular loops.")
@click.option("--driver", "drivers", multiple=True, type=click.Choice(["local", "pfs"]),
              help="local disk, pfs (shaped driver, parallel-file-system preset); default both.")  # fmt: skip
@click.option("--layout", "layouts", multiple=True, type=click.Choice(["range", "scattered"]),
              help="range (the paper's Figure 1; default) or scattered windows.")  # fmt: skip
@click.option("--hint", "hints", multiple=True, type=HINT, help="KEY=VALUE hint for both methods.")
@_reps_option
@json_option
@click.option(
    "--timeout", type=POSITIVE, default=600.0, show_default=True, help="Seconds per mpiexec launch."
)
def loopcache_cmd(
    ranks: list[int], sizes: list[int], loops: int, drivers: tuple[str, ...], layouts: tuple[str, ...],
    hints: tuple[str, ...], reps: int, json_path: Path | None, timeout: float,
) -> None:  # fmt: skip
    """The paper's Figure 4: software caching across irregular loops (7/8 overlap) against
    reading and writing every loop in full: total time and items moved."""
    args = ["--bench", "loopcache", "--loops", str(loops), "--reps", str(reps)]
    args += [a for n in sizes for a in ("--index-bytes", str(n))]
    args += [a for d in drivers for a in ("--driver", d)]
    args += [a for lay in layouts for a in ("--layout", lay)]
    args += [a for h in hints for a in ("--hint", h)]
    rows = [r for n in ranks for r in _launch(n, args, timeout)]
    _render_loopcache(rows, make_console())
    write_json(json_path, rows)
