"""Commands about the storage hierarchy: ``tiers``, ``stage``, ``migrate``, ``evict``, ``fsck``,
and the benchmarks ``bench tape`` / ``bench overlap``.

Exit codes (shared with every command, :func:`strataio.cli.output.handle_errors`): 0 ok
(clean), 1 problems found or the operation failed, 2 a usage or configuration error; failures
print one ``error:`` line on stderr, never a traceback.
``strataio info NAME`` shows a catalogued dataset's per-tier residency through
:func:`residency_info`, which the ``info`` command calls for names that are not a path.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from strataio.bench.tape import HIDDEN_GOAL, OVERLAP_ROWS
from strataio.bench.tape import MIN_SIZE as TAPE_MIN_SIZE
from strataio.cli import bench, main
from strataio.cli.context import catalog_exists, open_session
from strataio.cli.output import (
    NON_NEGATIVE,
    UsageProblem,
    count_option,
    handle_errors,
    json_option,
    make_console,
    write_json,
)
from strataio.errors import HintError, SelectionError, StrataError
from strataio.layout.sections import Section
from strataio.sizes import counted, format_size

_config_opt = click.option(
    "-c",
    "--config",
    "config",
    type=click.Path(dir_okay=False),
    default=None,
    help="configuration file (default: ./strataio.toml, $STRATAIO_CONFIG, built-in)",
)


def parse_section(spec: str | None) -> Any:
    """A numpy index from ``"0:100,0:80"`` (``:`` = whole axis, ``5`` = one index)."""
    if spec is None or spec.strip() in ("all", ":"):
        return None
    if not spec.strip():
        # (an empty shell variable, most likely: never taken for the whole dataset)
        raise UsageProblem(
            "--section '' is empty: leave it out (or write 'all') for the whole dataset, or "
            "write start:stop per axis, e.g. 0:100,0:80"
        )
    parts: list[Any] = []
    for p in spec.split(","):
        fields = [f.strip() for f in p.split(":")]
        try:
            if len(fields) == 2:
                a, b = fields
                parts.append(slice(int(a) if a else None, int(b) if b else None))
            elif len(fields) == 1:
                parts.append(int(fields[0]))
            else:
                raise ValueError
        except ValueError:
            raise UsageProblem(
                f"--section {spec!r}: write a section as start:stop per axis (no step), "
                "e.g. 0:100,0:80"
            ) from None
    return tuple(parts)


# ----------------------------------------------------------------------------- tiers
@main.command("tiers")
@_config_opt
@click.option("--check", is_flag=True, help="probe every tier and record up/down in the catalog")
@handle_errors
def tiers_command(config: str | None, check: bool) -> None:
    """Show the tiers: health, capacity, usage. Exit 1 if any tier is down (one the
    configuration lacks that the catalog knows counts only where copies are recorded there)."""
    console = make_console()
    with open_session(config) as s:
        if check:
            s.check_tiers()
        usage = s.usage()
        table = Table(title="storage tiers (fastest first)")
        for col in ("tier", "role", "location", "state", "capacity", "used", "last error"):
            # (a long location or error is wrapped, a long path folded, where the table is
            # too wide: never cut, as an error's reason comes last)
            table.add_column(col, overflow="fold" if col in ("location", "last error") else None)
        for t in s.tiers:
            # (an up tier that takes no writes says why: read-only, refusing writes, full)
            why = t.condition.partition(" ")[2]
            state = ("[green]up[/]" if t.up else "[red]down[/]") + (f" {why}" if why else "")
            table.add_row(
                t.name,
                t.role,
                t.backend.url,
                state,
                format_size(t.capacity, none="unbounded"),
                format_size(usage.get(t.name, 0)),
                Text(t.last_error),  # (not markup: "[Errno 2]" is shown as it is)
            )
        console.print(table)
        down = [t.name for t in s.tiers if not t.up and t.configured]
        gone = [t.name for t in s.tiers if not t.configured and usage.get(t.name, 0)]
    if gone:
        console.print(
            f"[red]tiers not configured, holding copies that cannot be read here:[/] "
            f"{', '.join(gone)} (add them back to the configuration to reach them)"
        )
    if down:
        again = "" if check else " ('strataio tiers --check' probes them again)"
        console.print(f"[red]tiers down:[/] {', '.join(down)}{again}")
    if down or gone:
        sys.exit(1)


# ----------------------------------------------------------------------------- moves
def _run_move(handle: Any, label: str, unit: str = "chunks") -> Any:
    """Wait for ``handle`` and return its result, meanwhile showing a transient progress bar
    (counting ``unit``) on stderr, only on a terminal: stdout holds the summary alone."""
    err = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} " + unit),
        TextColumn("{task.fields[moved]}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task(escape(label), total=max(1, handle.progress.total), moved="0 B")
        while not handle.done():
            p = handle.progress
            bar.update(task, completed=p.done, moved=format_size(p.nbytes))
            time.sleep(0.05)
        p = handle.progress
        bar.update(task, completed=p.total, moved=format_size(p.nbytes))
    return handle.result()


def _is_superfile(s: Any, name: str, tier: str | None) -> bool:
    """True if catalogued ``name`` is a superfile (whose containers move whole, through
    :class:`~strataio.tiers.superfile.Superfile`, not as an array's chunks). A ``name`` the
    catalog does not know, or a ``tier`` (None: the default) that is not configured, is a
    usage error; one that is the path of a plain dataset says so."""
    from strataio.errors import NotFoundError
    from strataio.tiers.superfile import is_superfile

    try:
        if tier is not None:
            s.tiers[tier]  # (NotFoundError naming the tiers there are)
        return is_superfile(s.catalog.get_dataset(name))
    except NotFoundError as exc:
        note = _plain_dataset_note(name)
        raise UsageProblem(f"{exc}: {note}" if note else str(exc)) from None


def _plain_dataset_note(name: str) -> str:
    """What to say where ``name``, not in the catalog, is the path of a plain dataset (a Zarr
    array made by :func:`strataio.create_dataset`): the hierarchy does not manage it; "" where
    ``name`` is no such path."""
    from strataio.cli.dataset_cmd import _node_type

    if _node_type(Path(name)) != "array":
        return ""
    return (
        f"{name} is a plain dataset (a Zarr array at that path), which the storage hierarchy "
        "does not manage: stage, migrate and evict move the datasets a Session hands out; to "
        "bring its data under a Session, create a dataset there "
        "(strataio.Session().create_dataset(name, shape, dtype, chunks)) and write the "
        "array's values into it"
    )


def _move(config: str | None, name: str, op: str, section: str | None, tier: str | None) -> None:
    """Stage, migrate or evict a catalogued dataset's section, or a superfile's containers."""
    console = make_console()
    idx = parse_section(section)
    with open_session(config) as s:
        superfile = _is_superfile(s, name, tier)
        if superfile and idx is not None:
            raise UsageProblem(
                f"--section {section!r}: {name} is a superfile, whose containers move whole; "
                "leave --section out"
            )
        obj = s.superfile(name, "r") if superfile else s.open_dataset(name, "r+")
        unit = "containers" if superfile else "chunks"
        try:
            if idx is not None:
                try:
                    empty = Section.from_index(idx, obj.shape).size == 0
                except SelectionError as exc:
                    raise UsageProblem(
                        f"--section {section!r} does not fit {name} {obj.shape}: {exc}"
                    ) from None
                if empty:
                    raise UsageProblem(
                        f"--section {section!r} selects nothing of {name} {obj.shape}"
                    )
            where = () if superfile else (idx,)
            if op == "stage":
                handle = obj.stage(*where, to=tier)
            elif op == "migrate":
                handle = obj.migrate(*where, to=tier)
            else:
                handle = obj.evict(*where, tier=tier)
            label = f"{op} superfile {name}" if superfile else f"{op} {name}"
            result = _run_move(handle, label, unit)
            if op == "stage":
                from strataio.tiers.store import keys_of

                keys = obj.containers() if superfile else keys_of(obj, idx)
                short = _stage_short_of(obj.store, keys, tier, result, unit)
            else:
                short = ""
            full = _no_room_tiers(obj.store, tier) if op == "stage" and result.no_room else ""
        except BaseException:
            # the first failure is the one to report, not a close failing after it
            with contextlib.suppress(StrataError, OSError):
                obj.close()
            raise
        obj.close()
    console.print(_summary(op, result, tier, full, unit))
    if short:
        console.print(f"[yellow]note[/]: {short}")
    _print_failures(console, result.failed, unit)
    one = unit.removesuffix("s")
    if result.no_room and not result.moved:
        # nothing the stage had to do could be done: say so where errors go, and fail
        click.echo(
            f"error: nothing staged: no room on {full} for the {counted(result.no_room, one)} "
            f"of {name} that needed staging (taking no writes, or full with nothing there to "
            "evict: copies of datasets another process has open, or with nowhere slower to "
            "go); free room there ('strataio evict') or stage to a tier with room",
            err=True,
        )
        sys.exit(1)
    if result.no_room:
        console.print(
            f"[yellow]note[/]: {counted(result.no_room, one)} not staged: no room on {full} "
            "(taking no writes, or full with nothing there to evict); they stay readable where "
            "they are"
        )
    if result.failed:
        sys.exit(1)


#: failed chunks a move lists one by one (the summary counts them all)
SHOWN_FAILURES = 10


def _print_failures(console: Console, failed: list[tuple[str, str]], unit: str) -> None:
    """The first :data:`SHOWN_FAILURES` of a move's ``failed`` chunks (key, why) in the
    order of their keys (``c/0/2`` before ``c/0/10``; the moves finish in any order), then
    how many more there are. ``unit``: what the chunks are called."""
    ordered = sorted(failed, key=lambda f: _key_order(f[0]))
    for key, msg in ordered[:SHOWN_FAILURES]:
        console.print(f"  [red]{escape(key)}[/]: {escape(msg)}")
    if len(ordered) > SHOWN_FAILURES:
        n = len(ordered) - SHOWN_FAILURES
        console.print(
            f"  … and {n} more {unit if n != 1 else unit.removesuffix('s')} of the "
            f"{len(ordered)} failed"
        )


def _key_order(key: str) -> list[Any]:
    """Sort key of a chunk key: its numbers compared as numbers (``c/0/2`` < ``c/0/10``)."""
    # (re.split with a group alternates text and digits: like compares with like)
    return [int(p) if i % 2 else p for i, p in enumerate(re.split(r"(\d+)", key))]


def _no_room_tiers(store: Any, tier: str | None) -> str:
    """The tier(s) a stage found without room, for its messages: ``tier`` when given, else
    the persistent tiers faster than the slowest; each that takes no writes (read-only,
    its storage refusing writes, its device full) with its condition, which says why."""
    persistent = store.placement.persistent()
    tiers = [store.tiers[tier]] if tier is not None else persistent[:-1] or persistent[-1:]
    return ", ".join(t.name if t.condition == "up" else f"{t.name}: {t.condition}" for t in tiers)


def _stage_short_of(
    store: Any, keys: list[str], tier: str | None, result: Any, unit: str = "chunks"
) -> str:
    """Where a stage's chunks (``keys`` of ``store``) did not all stay where it put them (a
    stage never evicts its own chunks, but another process's writes or moves may have made
    room since), a line saying how many did; else "". A stage to ``tier`` counts the chunks on it or a faster disk tier
    (there, they were reused); the default stage, which takes the fastest tier with room,
    those on any tier faster than the slowest. ``unit``: what the chunks are called."""
    tiers, copies = store.tiers, store.residency_table()
    if tier is not None:
        target = tiers[tier]
        limit, where = tiers.rank(target.name), f"{target.name} or a faster tier"
        room = f"its capacity ({format_size(target.capacity)})" if target.capacity else "it"
    else:
        persistent = store.placement.persistent()
        if len(persistent) < 2:
            return ""
        limit = tiers.rank(persistent[-1].name) - 1
        where, room = f"a tier faster than {persistent[-1].name}", "their capacity"
    wanted = result.moved + result.reused
    held = sum(
        1
        for k in keys
        if any(
            tiers.rank(c.tier) <= limit and not tiers[c.tier].volatile for c in copies.get(k, ())
        )
    )
    if held >= wanted:
        return ""
    smaller = "a smaller section, or " if unit == "chunks" else ""
    return (
        f"only {held} of the {counted(wanted, unit.removesuffix('s'))} staged or already there "
        f"are on {where} now: the others were evicted since to make room there ({room} "
        f"is shared; stage {smaller}to a larger tier)"
    )


def _summary(op: str, result: Any, tier: str | None, full: str = "", unit: str = "chunks") -> str:
    """One line saying what a move did, in the words of its kind (``full``: the tiers a
    stage found without room, named when it left chunks unstaged for want of it; ``unit``:
    what the chunks are called, "containers" for a superfile)."""
    size, tail = (
        format_size(result.nbytes),
        f"{len(result.failed)} failed, in {result.seconds:.2f} s",
    )
    where = f" {tier}" if tier else ""
    if result.unwritten:
        tail = f"{result.unwritten} never written (nothing to move), {tail}"
    one = unit.removesuffix("s")
    copies = (f"{one} copy", f"{one} copies")
    left = (
        f"; the objects of {counted(result.left, *copies)} stay there, their tier down or "
        "failing: 'strataio fsck --repair' deletes them once it is back"
        if result.left
        else ""
    )
    if op == "evict":
        return (
            f"evict: {counted(result.moved, *copies)} dropped "
            f"from{where or ' the fastest tier'} "
            f"({size} written back first), {result.reused} not there, {tail}{left}"
        )
    if op == "migrate":
        kept = (
            f", {counted(result.kept, *copies)} kept there, catalogued (on a tier that takes "
            "no writes, or changed by another process since the move looked)"
            if result.kept
            else ""
        )
        return (
            f"migrate: {counted(result.moved, one)} copied ({size}), {result.reused} already on"
            f"{where or ' the slowest tier'}; copies on faster tiers: {result.removed} removed"
            f"{kept}; {tail}{left}"
        )
    if result.no_room:
        tail = f"{result.no_room} not staged (no room on {full or 'the target tier'}), {tail}"
    return f"stage: {counted(result.moved, one)} staged ({size}), {result.reused} already there, {tail}"


@main.command("stage")
@_config_opt
@click.argument("name")
@click.option("--section", default=None, help="e.g. 0:1000,0:80 (default: whole dataset)")
@click.option("--to", "to", default=None, help="target tier (default: fastest disk tier)")
@handle_errors
def stage_command(config: str | None, name: str, section: str | None, to: str | None) -> None:
    """Stage a dataset section from the archive to a faster tier; for a superfile NAME, all
    its containers (no --section: they move whole).

    Says how many chunks were staged, how many were already there (on the target or a
    faster tier), and how many could not be staged because the target tier (--to; by
    default every tier faster than the archive) had no room: full, with nothing on it that
    could be evicted (copies of datasets another process has open, or whose only copy has
    nowhere slower to go). Exit 0 when everything is staged or already there, and also when
    some chunks were staged and others found no room (a note says how many); 1 when chunks
    needed staging and none could be (no room anywhere, or tiers down), or any chunk
    failed; 2 for a usage or configuration error (a dataset or tier name that is not
    there among them).
    """
    _move(config, name, "stage", section, to)


@main.command("migrate")
@_config_opt
@click.argument("name")
@click.option("--section", default=None, help="e.g. 0:1000,0:80 (default: whole dataset)")
@click.option("--to", "to", default=None, help="target tier (default: the slowest)")
@handle_errors
def migrate_command(config: str | None, name: str, section: str | None, to: str | None) -> None:
    """Migrate a dataset section, or a superfile's containers, to a slower tier (copy,
    verify, commit, delete source)."""
    _move(config, name, "migrate", section, to)


@main.command("evict")
@_config_opt
@click.argument("name")
@click.option("--section", default=None, help="e.g. 0:1000,0:80 (default: whole dataset)")
@click.option("--tier", "tier", default=None, help="tier to free (default: the fastest)")
@handle_errors
def evict_command(config: str | None, name: str, section: str | None, tier: str | None) -> None:
    """Drop a section's copies, or a superfile's containers', from a tier (writing back
    those that have no other copy)."""
    _move(config, name, "evict", section, tier)


# ----------------------------------------------------------------------------- fsck
@main.command("fsck")
@_config_opt
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--repair", is_flag=True, help="fix what can be fixed")
@click.option("--quick", is_flag=True, help="check existence and size only (no checksums)")
@handle_errors
def fsck_command(config: str | None, path: Path | None, repair: bool, quick: bool) -> None:
    """Verify every catalogued chunk copy, or with PATH the plain dataset there. Exit 0
    clean, 1 problems (left) found.

    With --repair, bad copies that have a good copy elsewhere are dropped, rewrites
    interrupted by a crash are resolved (old or new bytes, whichever the object holds),
    orphans (objects no catalog row names) and temporary leftovers are deleted, and a
    dataset's zarr.json left at an older version on a tier that missed an attribute change
    is rewritten with the current one. A copy something not strataio's stands in the way of
    (a directory where its object goes, a file where its folder goes) is reported as
    "blocked", naming the path, and kept (exit 1): move that away. It is
    safe beside running jobs and needs no waiting after a crash: what a live process may
    still be writing (its announced rewrites, unnamed objects of datasets it has open) is
    listed as "in-flight" and left alone; what a process that died left is resolved at once
    (a process's liveness is a lock the system releases when it dies). A tier marked down
    is probed first and checked if it answers; one that still does not is named, with the
    error, and not checked (exit 1). Deleted datasets whose objects may still lie on a tier
    (remnants: it was down at the deletion) are named at the end, as long as any is left:
    --repair purges them from the tiers that answer, their folders too.

    With PATH (a dataset directory, no catalog): every stored chunk read and decoded (with
    --quick only sized, which tells where chunks are stored raw or with crc32c); one that
    does not decode is "corrupt" (exit 1), which --repair cannot mend: it has no other copy.
    Then its temporary files, of puts and of collective shard writes (*.part, and each
    call's lock file .<token>.lock). Those of a writer killed in a put, or of a shard write
    whose ranks were killed, are leftovers, which --repair deletes at once; those of a write
    running now (it holds their lock) are listed as "in-flight" and left alone.
    """
    if path is not None:
        from strataio.cli.dataset_cmd import fsck_dataset_dir

        if config is not None:  # (a plain dataset has no catalog: a configuration says nothing)
            raise click.UsageError(
                "-c/--config names the catalog whose copies fsck checks; a dataset at PATH "
                "has none: give one or the other"
            )
        with _fsck_progress("chunks") as progress:
            fsck_dataset_dir(path, repair, quick=quick, progress=progress)
        return
    from strataio.tiers.fsck import fsck

    console = make_console()
    with open_session(config) as s, _fsck_progress() as progress:
        report = fsck(s.catalog, s.tiers, repair=repair, verify=not quick, progress=progress)
    if report.findings:
        table = Table(title="fsck findings")
        for col in ("kind", "tier", "dataset", "chunk", "detail", "repair"):
            table.add_column(col)
        for f in report.findings[:200]:
            table.add_row(str(f.kind), f.tier, f.dataset, f.key, f.detail, str(f.action) or "-")
        console.print(table)
        if len(report.findings) > 200:
            console.print(f"... and {len(report.findings) - 200} more findings")
    skipped = "; tiers down, not checked: " + ", ".join(
        f"{name} ({escape(report.skipped_why.get(name, 'down'))})" for name in report.skipped_tiers
    )
    young = len(report.in_flight)
    left = len(report.unrepairable)
    fixed = len(report.problems) - left if report.repaired else 0
    console.print(
        f"{counted(report.copies, 'copy', 'copies')} of {counted(report.chunks, 'chunk')} "
        f"checked, {counted(len(report.problems), 'problem')}"
        + (f", {fixed} repaired" if fixed else "")
        + (f", {left} left" if fixed and left else "")
        + (f"; {young} in flight in running processes, left alone" if young else "")
        + (
            f"; {counted(report.writers_gone, 'session')} ended without closing"
            + (" (forgotten)" if repair else "")
            if report.writers_gone
            else ""
        )
        + (skipped if report.skipped_tiers else "")
        + _remnants_left(report.remnants, repair)
    )
    unresolved = report.unrepairable or (report.problems and not report.repaired)
    if unresolved or report.skipped_tiers:
        sys.exit(1)


def _remnants_left(remnants: list[tuple[str, str]], repaired: bool) -> str:
    """The end of fsck's summary for the remnants of deleted datasets left (objects that
    may still lie on a tier): which, and how they are purged; "" where none is."""
    from strataio.tiers.remnants import by_dataset

    if not remnants:
        return ""
    which = ", ".join(f"{escape(ds)} on {', '.join(t)}" for ds, t in by_dataset(remnants).items())
    how = (
        "their tiers did not answer, or objects refused their deletion"
        if repaired
        else "'strataio fsck --repair' purges them"
    )
    return f"; objects of deleted datasets wait to be purged ({which}): {how}"


@contextlib.contextmanager
def _fsck_progress(unit: str = "copies") -> Iterator[Callable[[int, int], None]]:
    """A transient progress bar on stderr (only on a terminal) fed by ``(done, total)``."""
    err = Console(stderr=True)
    with Progress(
        TextColumn("fsck"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task("fsck", total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


# ----------------------------------------------------------------------------- info
def residency_info(name: str, config: str | None = None, console: Console | None = None) -> bool:
    """Print per-tier residency of catalogued dataset ``name``; False if the catalog does not
    know it (the caller then treats ``name`` as a path). Raises :class:`ConfigError` for a
    configuration that cannot be loaded or set up, and other :class:`StrataError` for a
    catalog that cannot be opened.

    A superfile is described as one: its members (counted from every container's index, a
    ranged read of each container's tail, or the whole container where it can be read only
    whole, as on an archive tier; nothing is staged), its containers and their bytes, the
    size they close at, and its containers per tier. A superfile whose members cannot be
    counted (a container without a readable copy, a corrupt index) is described all the
    same, then the error is raised."""
    from strataio.config import load_config
    from strataio.session import placement_decision
    from strataio.tiers.superfile import is_superfile

    console = console or make_console()
    if catalog_exists(load_config(config)) is False:
        return False  # no catalog here: do not create one just to look
    # (a look moves nothing: a superfile's container read from an archive is not staged)
    s = open_session(config, stage_on_read=False)  # not set up: ConfigError
    failed: StrataError | None = None
    with s:
        try:
            rec = s.catalog.get_dataset(name)
        except StrataError:
            return False
        copies = s.catalog.residency(name)
        decision = placement_decision(rec)
        chosen = decision.tier if decision else None
        try:
            writes_to = [t.name for t in s.placement.write_order(rec.hint, chosen, probe=False)]
            nowhere = None
        except HintError as exc:  # (its role left the configuration)
            writes_to, nowhere = [], str(exc)
        superfile = is_superfile(rec)
        if superfile:
            members, failed = _count_members(s, name)
    per: dict[str, list[int]] = {}
    chunks: dict[str, int] = {}
    for c in copies:
        n = per.setdefault(c.tier, [0, 0, 0])
        n[0] += 1
        n[1] += c.nbytes
        n[2] += c.state == "dirty"
        chunks[c.key] = max(chunks.get(c.key, 0), c.nbytes)
    unit = "containers" if superfile else "chunks"
    if superfile:
        from strataio.tiers.superfile import record_container_bytes

        n = len(chunks)
        console.print(
            f"[bold]{rec.name}[/]  superfile: {members} member{'' if members == 1 else 's'} in "
            f"{counted(n, 'container')} of {format_size(sum(chunks.values()))} "
            f"(a container closes at {format_size(record_container_bytes(rec))}) "
            f"hint={rec.hint} state={rec.state}",
            highlight=False,
        )
    else:
        console.print(
            f"[bold]{rec.name}[/]  shape={rec.shape} dtype={rec.dtype} chunks={rec.chunks} "
            f"hint={rec.hint} state={rec.state} stored chunks={len(chunks)}"
        )
    table = Table(title=f"residency of {name}")
    for col in ("tier", unit, "bytes", "dirty"):
        table.add_column(col)
    for t in s.tiers:
        n = per.get(t.name, [0, 0, 0])
        table.add_row(t.name, str(n[0]), format_size(n[1]), str(n[2]))
    console.print(table)
    from strataio.cli.predict_cmd import placement_lines

    for line in placement_lines(rec, writes_to, nowhere):
        console.print(line, highlight=False)
    if failed is not None:
        raise failed
    return True


def _count_members(s: Any, name: str) -> tuple[int | str, StrataError | None]:
    """The number of members of superfile ``name`` (``"?"`` and the error, naming the
    superfile, where they cannot be counted)."""
    try:
        sf = s.superfile(name, "r")
        try:
            return len(sf.members()), None
        finally:
            sf.close()
    except StrataError as exc:
        why = type(exc)(f"superfile {name!r}: its members cannot be counted: {exc}")
        return "?", why


# ----------------------------------------------------------------------------- benchmarks
@bench.command("tape")
@count_option(
    "--size", 4000, "array edge (elements; Figure 4 reads sixteenths of it)", least=TAPE_MIN_SIZE
)
@count_option("--chunk", 80, "chunk edge (elements)")
@click.option(
    "--time-scale",
    type=NON_NEGATIVE,
    default=0.001,
    show_default=True,
    help="tape model time factor",
)
@json_option
def bench_tape(size: int, chunk: int, time_scale: float, json_path: Path | None) -> None:
    """APRIL tape experiment: sub-filing + staging vs whole-file recall, Figure 4 reuse."""
    from strataio.bench.tape import run_tape, tape_tables

    results = run_tape(size=size, chunk=chunk, time_scale=time_scale)
    console = make_console()
    for table in tape_tables(results):
        console.print(table)
    write_json(json_path, results)


@bench.command("overlap")
@click.option(
    "--sections",
    type=click.IntRange(2, OVERLAP_ROWS),
    default=8,
    show_default=True,
    help=f"row bands of the {OVERLAP_ROWS}² array the loop computes on, one after another",
)
@click.option(
    "--time-scale",
    type=NON_NEGATIVE,
    default=0.002,
    show_default=True,
    help="tape model time factor",
)
@json_option
def bench_overlap(sections: int, time_scale: float, json_path: Path | None) -> None:
    """Prestaging: compute on section k while section k+1 stages.

    Exits 1, saying so on stderr, if the loop hides less than 90 % of the staging time (it
    waited on staging for more than 10 % of it). The times are measured: on a busy machine
    the staging threads fall behind and the check may fail where it passes on an idle one.
    """
    from strataio.bench.tape import overlap_table, run_overlap

    result = run_overlap(sections=sections, time_scale=time_scale)
    make_console().print(overlap_table(result))
    write_json(json_path, result)
    hidden = result["hidden_fraction"]
    if hidden < HIDDEN_GOAL:
        click.echo(
            f"error: the loop hid {100 * hidden:.1f} % of the staging time, less than the "
            f"{100 * HIDDEN_GOAL:.0f} % asked: it waited {result['exposed_wait_s']:.3f} s for "
            f"stages of {result['stage_only_s']:.3f} s in all (staging threads slowed by a "
            "busy machine, most often: run it again on an idle one, or with a larger "
            "--time-scale)",
            err=True,
        )
        sys.exit(1)
