"""A tier's native interfaces, as calibration measures them and measured runs use them.

Two per tier, both over the tier's POSIX directory: a :class:`strataio.File` there (the
``naive`` and ``collective`` methods), and the tier's backend (a chunk store: the ``chunked``
method). A tier shaped by a cost model (``shaped = "remote_disk_2002"`` ...) is shaped on both:
its backend is the :class:`~strataio.storage.shaped.Shaped` backend the configuration builds,
and a File there opens through the shaped driver with the same model's bandwidth, and its
fixed time per object access (``open + seek + close`` of the direction) charged per call, both
scaled by the tier's ``time_scale``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from strataio.errors import StrataError
from strataio.storage.base import Backend

#: folder under a tier's directory where calibration and measured runs put their files
WORK_DIR = ".strataio-predict"


def tier_dir(tc: Any) -> str:
    """The POSIX directory of tier config ``tc`` (calibration and runs need one)."""
    if getattr(tc, "kind", None) != "posix" or not tc.path:
        raise StrataError(
            f"tier {tc.name!r} is a {tc.kind} tier: calibration and measured runs need a "
            "posix tier (a File opens a path)"
        )
    return tc.path


def work_path(tc: Any, *parts: str) -> str:
    """A path under the tier's work folder (the folder is created)."""
    base = os.path.join(tier_dir(tc), WORK_DIR)
    os.makedirs(base, exist_ok=True)
    return os.path.join(base, *parts)


def file_hints(tc: Any, write: bool) -> dict[str, str]:
    """Hints making a :class:`strataio.File` on tier ``tc`` cost what the tier costs."""
    if not getattr(tc, "shaped", None):
        return {}
    from strataio.storage.shaped import CostModel

    model = CostModel.from_preset(tc.shaped)
    op = model.write if write else model.read
    return {
        "strataio_driver": "shaped",
        "strataio_driver_bandwidth": str(int(op.bandwidth)),
        "strataio_driver_latency": repr(op.open + op.seek + op.close),
        "strataio_driver_time_scale": repr(float(tc.time_scale)),
    }


def tier_backend(tc: Any) -> Backend:
    """A fresh backend of tier ``tc``, shaped as configured (its own connection)."""
    from strataio.tiers.tier import tier_from_config

    tier_dir(tc)
    return tier_from_config(tc, 0).backend


def drop_cached(path: str) -> None:
    """Evict the file at ``path``, or every file under the folder ``path``, from the page cache
    (for cold reads; dirty pages are flushed first). Missing paths are no error."""
    from strataio.storage.posix import PosixBackend

    if os.path.isfile(path):
        PosixBackend(os.path.dirname(path)).drop_cache(os.path.basename(path))
        return
    if not os.path.isdir(path):
        return
    backend = PosixBackend(path)
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                backend.drop_cache(os.path.relpath(os.path.join(root, name), path))
