"""The ``strataio`` command: one click group; command modules register themselves below."""

from __future__ import annotations

import click

from strataio import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
