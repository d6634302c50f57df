"""A POSIX tier that stops answering and answers again, as a storage outage does."""

from __future__ import annotations

from pathlib import Path


def stop_answering(root: Path) -> None:
    """The POSIX tier at ``root`` stops answering (a file in its place: I/O errors)."""
    root.rename(root.with_name(root.name + ".away"))
    root.write_bytes(b"")


def answer_again(root: Path) -> None:
    """The tier :func:`stop_answering` stopped answers again, holding what it held."""
    root.unlink()
    root.with_name(root.name + ".away").rename(root)
