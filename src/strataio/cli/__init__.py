"""The ``strataio`` command: one click group; command modules register themselves below."""

from __future__ import annotations

import click

from strataio import __version__


class _Commands(click.Group):
    """The ``strataio`` group: a command interrupted (Ctrl-C, SIGINT) says so in one line on
    stderr and exits 130, as a shell reports a command SIGINT ended (not click's bare
    ``Aborted!`` and exit 1, which a script cannot tell from a failure)."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo(
                "\nerror: interrupted; run the command again to finish it (strataio fsck --repair "
                "settles a move or write it cut short)",
                err=True,
            )
            raise click.exceptions.Exit(130) from None


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="strataio")
def main() -> None:
    """strataio: parallel I/O of scientific arrays across a storage hierarchy."""


@main.group()
def bench() -> None:
    """Benchmarks, each against its baseline in the same run."""


# Command modules register themselves on `main` or `bench` when imported.
from strataio.cli import (
    bench_cmd,
    catalog_cmd,
    collective_cmd,
    dataset_cmd,
    demo_cmd,
    flatten_cmd,
    predict_cmd,
    tiers_cmd,
)
