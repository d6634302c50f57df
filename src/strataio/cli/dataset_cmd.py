"""Commands about sub-filed datasets on disk: ``info``, and ``fsck PATH`` (called by the
``fsck`` command of :mod:`strataio.cli.tiers_cmd` for a path)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import click
import numpy as np
from rich import box
from rich.table import Table

from strataio.arrays import Dataset, open_dataset
from strataio.arrays.verify import verify_chunks
from strataio.cli import main
from strataio.cli.output import make_console
from strataio.errors import ConfigError, NotFoundError, StrataError
from strataio.sizes import counted, format_size
from strataio.storage.posix import LeftoverState, judge_leftover, on_read_only_file_system

#: what made a temporary file: a put (``*.strataio-tmp``), a collective shard write
#: (``*.<token>.part``, and its lock file ``.<token>.lock``), or a change of ``zarr.json``
#: (its lock file ``.zarr.json.lock``)
PUT, SHARD_WRITE, META_CHANGE = "put", "collective shard write", "zarr.json change"
KINDS = (PUT, SHARD_WRITE, META_CHANGE)


@dataclass(frozen=True, slots=True)
class TemporaryFile:
    """A temporary file in a dataset's folder: its ``path``, what made it (``kind``:
    :data:`PUT`, :data:`SHARD_WRITE` or :data:`META_CHANGE`) and, for a shard write's, the
    array's ``folder``, where its call's lock file lies."""

    path: str
    kind: str
    folder: str = ""

    @property
    def what(self) -> str:
        """What it is, in words: a shard write's or a zarr.json change's "lock file", else
        a "temporary file"."""
        from strataio.arrays.shard_parts import is_lock_file

        lock = self.kind == META_CHANGE or (self.kind == SHARD_WRITE and is_lock_file(self.path))
        return "lock file" if lock else "temporary file"

    def judge(self, *, remove: bool = False) -> LeftoverState:
        """Whether its write still runs, by its lock (:func:`judge_leftover` for a put's,
        :func:`strataio.arrays.shard_parts.judge` for a shard write's,
        :func:`strataio.arrays.meta_lock.judge` for a zarr.json change's); with ``remove``,
        delete it where its writer is gone."""
        if self.kind == PUT:
            return judge_leftover(self.path, remove=remove)
        if self.kind == META_CHANGE:
            from strataio.arrays import meta_lock

            return meta_lock.judge(self.path, remove=remove)
        from strataio.arrays.shard_parts import judge

        return judge(self.path, self.folder, remove=remove)


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


def temporary_files(ds: Dataset) -> list[TemporaryFile]:
    """The temporary files in dataset ``ds``'s folder, sorted by path: those of writes
    running now and those of writers killed before their rename, which
    :meth:`TemporaryFile.judge` tells apart by their locks (:mod:`strataio.storage.posix`,
    :mod:`strataio.arrays.shard_parts`, :mod:`strataio.arrays.meta_lock`). A shard write's
    lock file sorts before its ``.part`` files."""
    from strataio.arrays.meta_lock import lock_path
    from strataio.arrays.shard_parts import call_locks, part_files

    listing = getattr(getattr(ds.store, "backend", None), "leftovers", None)
    found = [TemporaryFile(f, PUT) for f in (listing() if listing is not None else ())]
    path_of = getattr(ds.store, "chunk_path", None)
    chunks = path_of("c") if path_of is not None else None
    if chunks is not None:  # (the array's folder: shards lie in it or in its "c" folder)
        folder = os.path.dirname(chunks)
        for f in (*call_locks(folder), *part_files(folder)):
            found.append(TemporaryFile(f, SHARD_WRITE, folder))
        if os.path.lexists(lock_path(folder)):
            found.append(TemporaryFile(lock_path(folder), META_CHANGE))
    return sorted(found, key=lambda t: t.path)


def fail(message: str, status: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr, one line, and exit with ``status``: 2 (the
    default) for a usage-level error, 1 for a runtime failure."""
    click.echo(f"error: {message}", err=True)
    sys.exit(status)


def _not_catalogued(config: str | None) -> str:
    """Where a dataset name was looked for, for a message: the catalog, or that there is
    none at the configured place (info never creates one just to look)."""
    from strataio.cli.context import catalog_exists
    from strataio.config import load_config

    try:
        cfg = load_config(config)
    except StrataError as exc:
        return f"no catalog to look in ({exc})"
    if catalog_exists(cfg) is False:
        return f"no catalog at {cfg.catalog.display_url}"
    return f"not in catalog {cfg.catalog.display_url}"


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
    or, for the NAME of a catalogued dataset, its chunks and bytes per tier (for a superfile:
    its members, containers and their bytes, and its containers per tier).

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
    opened = _open_array(path)
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
            # (temporary files of writes not renamed yet; those renamed meanwhile are gone)
            judged = [(t.path, t.kind, t.judge()) for t in temporary_files(ds)]
            left = [(f, kind, st) for f, kind, st in judged if st is not LeftoverState.GONE]
            if left:
                live = dict.fromkeys(KINDS, 0)
                dead = dict(live)
                for _, kind, state in left:
                    (live if state is LeftoverState.LIVE else dead)[kind] += 1
                said = [f"{n} of a {kind} running now" for kind, n in live.items() if n]
                gone = [
                    f"{n} left by a {kind} whose ranks were killed"
                    if kind == SHARD_WRITE
                    else f"{n} left by a writer killed in a {kind}"
                    for kind, n in dead.items()
                    if n
                ]
                if gone:
                    said.append(
                        ", ".join(gone) + f", which 'strataio fsck {path} --repair' deletes"
                    )
                rows.append(
                    (
                        "unfinished writes",
                        f"{len(left)} temporary file(s), e.g. {left[0][0]}: " + "; ".join(said),
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


def _node_type(path: Path) -> str | None:
    """The ``node_type`` of the ``zarr.json`` at ``path`` (None: none there, or unreadable;
    opening it then says why)."""
    try:
        with open(path / "zarr.json", "rb") as f:
            got = json.load(f)
    except (OSError, ValueError):
        return None
    return got.get("node_type") if isinstance(got, dict) else None


def _open_array(path: Path) -> Dataset:
    """The plain dataset at ``path``, opened to read; where there is none (nothing, a folder
    without zarr.json, a Zarr group) a usage error (exit 2), and where its zarr.json cannot
    be used or read a failure (exit 1)."""
    if _node_type(path) == "group":
        fail(f"{path} is a Zarr group, not an array: give the path of one of its arrays")
    try:
        return open_dataset(path, mode="r")
    except NotFoundError as exc:  # nothing there: the path given is not a dataset
        fail(str(exc))
    except (StrataError, OSError) as exc:  # a zarr.json there that cannot be used
        fail(str(exc), 1)


def fsck_dataset_dir(
    path: Path,
    repair: bool,
    *,
    quick: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """``strataio fsck PATH``: the dataset's stored chunks, each decoded (with ``quick``
    sized: :func:`strataio.arrays.verify.verify_chunks`, ``progress`` following it), one
    that does not a **corrupt** finding left as it is (it has no other copy); then the
    temporary files of writes into the dataset at ``PATH``:
    those of puts (``*.strataio-tmp``), of collective shard writes (``*.<token>.part``) and
    of changes of ``zarr.json`` (its lock file, ``.zarr.json.lock``).

    A plain dataset has no catalog, so what a crash leaves in it is only these files (a chunk
    or shard is replaced by renaming a whole new file over it, never torn). Each one whose
    writer still holds its lock (:func:`strataio.storage.posix.judge_leftover`: a put holds
    its file; every rank of a shard write holds its call's lock file, ``.<token>.lock``,
    listed among these files too, :mod:`strataio.arrays.shard_parts`; a change of
    ``zarr.json`` holds its lock file, :mod:`strataio.arrays.meta_lock`) belongs to a write
    running now and is reported **in-flight** and left alone; every other is a **leftover**
    of a killed writer, which ``repair`` deletes at once (no waiting: the lock dies with its
    process). On a file system that keeps no locks, or one mounted read-only (where a lock
    cannot be taken for writing, and the finding says so), a temporary file cannot be
    judged: it is reported and left. Exit 0 clean (in-flight files included), 1 corrupt
    chunks or leftovers remain, 2 no dataset at ``PATH``.
    """
    if not path.exists():
        fail(
            f"no dataset at {path}: no such file or directory (a catalogued dataset's name? "
            "'strataio fsck' without PATH checks every catalogued copy)"
        )
        return
    with _open_array(path) as ds:
        try:
            checked = verify_chunks(ds, quick=quick, progress=progress)
        except (StrataError, OSError) as exc:  # (the chunks cannot be listed or read)
            fail(f"dataset {path}: its chunks cannot be checked: {exc}", 1)
        temps = temporary_files(ds)
    findings: list[tuple[str, str, str, str]] = [
        ("corrupt", key, detail, "- (no other copy: write the chunk again)")
        for key, detail in checked.problems
    ]
    live: dict[str, int] = dict.fromkeys(KINDS, 0)
    read_only = 0
    for t in temps:
        f, kind, what = t.path, t.kind, t.what
        state = t.judge(remove=repair)
        if state is LeftoverState.LIVE:
            live[kind] += 1
            findings.append(("in-flight", f, f"{what} of a {kind} running now", "left alone"))
        elif state is LeftoverState.DEAD:
            killed = (
                f"a {kind} whose ranks were killed" if kind == SHARD_WRITE else f"a {kind} killed"
            )
            before = "" if what == "lock file" else " before its rename"
            findings.append(("leftover", f, f"{what} of {killed}{before}", "delete"))
        elif state is LeftoverState.UNKNOWN:
            if on_read_only_file_system(f):
                read_only += 1
                why = (
                    f"the file system is read-only: its lock cannot be taken to tell whether "
                    f"a {kind} still writes it, nor can it be deleted; run 'strataio fsck "
                    f"{path} --repair' where it is writable"
                )
            else:
                why = (
                    f"no lock to tell whether a {kind} still writes it: delete it once no "
                    "process writes this dataset"
                )
            findings.append(("leftover", f, why, "-"))
    console = make_console()
    if findings:
        table = Table(title="fsck findings")
        for col in ("kind", "file", "detail", "repair"):
            table.add_column(col, overflow="fold" if col == "file" else None)
        for row in findings:
            table.add_row(*row)
        console.print(table)
    dead = sum(action == "delete" for *_, action in findings)
    unknown = sum(action == "-" for *_, action in findings)
    corrupt = len(checked.problems)
    console.print(
        f"dataset {path}: {counted(checked.chunks, 'chunk')} {checked.how}, {corrupt} corrupt; "
        f"{counted(len(findings) - corrupt, 'temporary file')}; "
        f"{dead} of writers that are gone"
        + (", deleted" if repair and dead else "")
        + (f"; {unknown} that cannot be judged here, left" if unknown else "")
        + (f" ({read_only} on a read-only file system)" if read_only else "")
        + "".join(f"; {n} of {kind}s running now, left alone" for kind, n in live.items() if n),
        soft_wrap=True,  # (one line, however long its path: scripts read it)
    )
    if corrupt or unknown or (dead and not repair):
        sys.exit(1)
