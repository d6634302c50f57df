"""Where the CLI prints: rich consoles that do not wrap piped output at 80 columns."""

from __future__ import annotations

import sys

from rich.console import Console


def make_console(stderr: bool = False) -> Console:
    """A console for stdout (or stderr); piped output keeps full-width tables for scripts."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 200)
