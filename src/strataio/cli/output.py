"""Where the CLI prints (rich consoles that do not wrap piped output at 80 columns) and how
its commands fail: one message on stderr and a documented exit status, never a traceback."""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from strataio.errors import ConfigError, StrataError


class OutputFile(click.Path):
    """A file a command writes when it is done (``--json``, a chart): its folder must exist,
    checked when the options are read rather than after a run of minutes."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        folder = Path(path).parent
        if not folder.is_dir():
            self.fail(f"{str(value)!r}: no folder {folder} to write it in", param, ctx)
        return path


#: ``--json FILE``: every benchmark command can also write its results for machines
json_option = click.option(
    "--json",
    "json_path",
    type=OutputFile(),
    default=None,
    help="Also write the results to this file as JSON.",
)


class CountList(click.ParamType):
    """Comma-separated counts of at least 1, e.g. ``1,2,4`` (rank counts, levels): a list of
    ints in the order given, each once."""

    name = "N[,N...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, list):
            return value
        try:
            counts = [int(x) for x in str(value).split(",") if x.strip()]
        except ValueError:
            self.fail(f"{value!r}: expected counts like 1,2,4", param, ctx)
        if not counts:
            self.fail(f"{value!r}: expected counts like 1,2,4", param, ctx)
        if min(counts) < 1:
            self.fail(f"{value!r}: every count must be at least 1", param, ctx)
        return list(dict.fromkeys(counts))


class FiniteFloat(click.ParamType):
    """A finite number above 0, or from 0 with ``zero`` (sizes in MiB, scale factors, time
    factors where 0 means no waiting): ``nan`` and ``inf`` refused."""

    name = "float"

    def __init__(self, zero: bool = False) -> None:
        self.zero = zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number < 0 or (number == 0 and not self.zero):
            least = "0 or more" if self.zero else "above 0"
            self.fail(f"{value!r}: expected a finite number {least}", param, ctx)
        return number


class ByteSize(click.ParamType):
    """A size in bytes, an integer or a number with a unit (``64KiB``, ``1.5MB``:
    :func:`strataio.sizes.parse_size`), of at least ``least`` bytes; with ``many`` a
    comma-separated list of them (in the order given, at least one). Anything else, a
    negative size among them, is a usage error naming the option, as a count below its
    range is."""

    def __init__(self, least: int = 1, many: bool = False) -> None:
        self.least = least
        self.many = many
        self.name = "SIZE[,SIZE...]" if many else "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from strataio.sizes import format_size, parse_size

        if isinstance(value, list if self.many else int):
            return value
        texts = [t for t in str(value).split(",") if t.strip()] if self.many else [value]
        if not texts:
            self.fail(f"{value!r}: expected sizes like 64KiB,1MiB", param, ctx)
        least = format_size(self.least) if self.least >= 1024 else f"{self.least} B"
        sizes = []
        for text in texts:
            n = None
            if not str(text).strip().startswith("-"):  # (0 and -5 are refused alike)
                try:
                    n = parse_size(text)
                except StrataError as exc:
                    self.fail(str(exc).removeprefix("size: "), param, ctx)
            if n is None or n < self.least:
                self.fail(f"{text!r}: expected a size of at least {least}", param, ctx)
            sizes.append(n)
        return sizes if self.many else sizes[0]


def count_option(name: str, default: int, help: str, least: int = 1) -> Callable[[Any], Any]:
    """A click option taking a count of at least ``least`` (repetitions, ranks, pieces,
    loops: 1), its default shown: a smaller one is a usage error naming the option and the
    least it takes, not a run of nothing."""
    return click.option(
        name, default=default, type=click.IntRange(min=least), show_default=True, help=help
    )


class HintSetting(click.ParamType):
    """An MPI-IO hint as ``KEY=VALUE`` (the key stripped of blanks), once a known hint's value
    is one it takes (:func:`strataio.collective.hints.check_hint`, here, before any
    ``mpiexec`` starts; unknown keys pass, as ROMIO ignores them)."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from strataio.collective.hints import check_hint
        from strataio.errors import HintError

        key, eq, setting = str(value).partition("=")
        key = key.strip()
        if not eq or not key:
            self.fail(f"{value!r} is not KEY=VALUE", param, ctx)
        try:
            check_hint(key, setting)
        except HintError as exc:
            self.fail(str(exc), param, ctx)
        return f"{key}={setting}"


HINT = HintSetting()
#: a size in bytes above 0, and a comma-separated list of them
SIZE = ByteSize()
SIZES = ByteSize(many=True)
COUNTS = CountList()
POSITIVE = FiniteFloat()
NON_NEGATIVE = FiniteFloat(zero=True)


def write_json(path: Path | None, result: Any) -> None:
    """Write ``result`` as JSON to ``path`` (nothing when None) and say so on stderr."""
    if path is None:
        return
    path.write_text(json.dumps(result, indent=1))
    make_console(stderr=True).print(f"results written to {path}")


def rate(x: float) -> str:
    """A rate or time for a table: whole numbers from 100 up, three significant figures
    below (a small run's 0.0213 MB/s is no ``0``)."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def make_console(stderr: bool = False) -> Console:
    """A console for stdout (or stderr); piped output keeps full-width tables for scripts."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 200)


class UsageProblem(Exception):
    """Raised inside a command for a problem the user fixes (exit status 2)."""


def handle_errors(fn: Callable[..., None]) -> Callable[..., None]:
    """Map failures to ``error: MESSAGE`` on stderr and the exit status every command shares:
    2 for a usage or configuration problem (:class:`UsageProblem`,
    :class:`~strataio.errors.ConfigError`), 1 for a runtime failure (any other
    :class:`~strataio.errors.StrataError`, an ``OSError``); no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except (ConfigError, UsageProblem) as exc:
            click.echo(f"error: {exc}", err=True)
            raise click.exceptions.Exit(2) from None
        except (StrataError, OSError) as exc:
            click.echo(f"error: {exc}", err=True)
            raise click.exceptions.Exit(1) from None

    return wrapper
