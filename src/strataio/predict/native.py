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
import fcntl
import os
import shutil
import socket
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from strataio.errors import BusyError, StrataError
from strataio.storage.base import Backend

#: folder under a tier's directory where calibration and measured runs put their files
WORK_DIR = ".strataio-predict"
#: the file in a tier's work folder whose lock a process measuring the tier holds
LOCK_NAME = "calibrate.lock"
#: seconds between tries while waiting for a tier's lock
_POLL_S = 0.05

#: descriptors of the measurement locks this process holds (see :func:`held_lock_fds`)
_held: set[int] = set()


def unmeasurable(tc: Any) -> str | None:
    """Why tier config ``tc`` can be neither calibrated nor measured (None: it can)."""
    if getattr(tc, "kind", None) != "posix" or not tc.path:
        return (
            f"tier {tc.name!r} is a {tc.kind} tier: calibration and measured runs need a "
            "posix tier (a File opens a path)"
        )
    if getattr(tc, "read_only", False):
        return (
            f"tier {tc.name!r} is read-only (read_only = true): calibration and measured runs "
            "write files there to time them, so it is neither calibrated nor measured"
        )
    return None


def measured_settings(tc: Any) -> str:
    """What of tier config ``tc`` its calibration's times depend on, as text to record with
    them: its place, and the device model laid over it with its time scale."""
    out = tc.url
    if getattr(tc, "shaped", None):
        out += f" shaped={tc.shaped} time_scale={tc.time_scale:g}"
    return out


def tier_dir(tc: Any, known: Collection[str] | None = None) -> str:
    """The POSIX directory of tier config ``tc`` (calibration and runs need one). With
    ``known``, the tiers the catalog has registered, a missing directory is made for a tier
    new to it, as a Session makes it (:func:`~strataio.tiers.tier.tier_from_config`); one of
    a known tier raises, as it leaves the tier down there: a volume not mounted is not
    measured as an empty tier. A ``read_only`` tier raises too: measuring writes there."""
    why = unmeasurable(tc)
    if why is not None:
        raise StrataError(why)
    if known is not None and not os.path.isdir(tc.path):
        from strataio.tiers.tier import tier_from_config

        tier = tier_from_config(tc, 0, known=tc.name in known)
        if not tier.up:
            raise StrataError(f"tier {tc.name!r} cannot be measured: {tier.last_error}")
    return tc.path


def work_path(tc: Any, *parts: str) -> str:
    """A path under the tier's work folder (the folder is made, the tier's directory not:
    :func:`tier_dir`)."""
    root = tier_dir(tc)
    if not os.path.isdir(root):
        raise StrataError(
            f"tier {tc.name!r}: its directory {root} is missing (a volume not mounted, or the "
            "directory removed); mount it or put it back, or make it with `strataio init`"
        )
    base = os.path.join(root, WORK_DIR)
    os.makedirs(base, exist_ok=True)
    return os.path.join(base, *parts)


@contextlib.contextmanager
def lock_tiers(
    tcs: Iterable[Any],
    what: str,
    *,
    wait: float = 0.0,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold the measurement lock of each tier config in ``tcs`` while the block runs: every
    process that measures I/O on a tier takes it (a calibration, which writes the performance
    database from its measurements; a measured run; the demo's access costs). Two at once
    would time each other's I/O (a calibration would record a tier slowed by the other) and
    share the tier's work folder. Reading the database to predict needs no lock (the
    catalog records a calibration in one transaction).

    The lock is an ``flock`` on :data:`LOCK_NAME` in the tier's work folder, which the system
    releases when the holder dies; the holder writes its pid, host, start and ``what`` there.
    Ranks launched meanwhile (:func:`strataio.predict.ranks.launch`) hold it too
    (:func:`held_lock_fds`): a holder killed while they measure leaves the tier locked until
    they end.
    Tiers are locked in name order (two processes locking the same tiers cannot deadlock).
    A tier another process holds is waited for up to ``wait`` seconds in all (0: not at
    all), ``on_wait(message)`` saying once per tier who holds it; then
    :class:`~strataio.errors.BusyError` names the holder and the lock file. A file system
    without locks (``ENOLCK``) leaves the tier unguarded."""
    deadline = time.monotonic() + max(0.0, float(wait))
    unique = {tc.name: tc for tc in tcs}
    with contextlib.ExitStack() as stack:
        for name in sorted(unique):
            stack.enter_context(_tier_locked(unique[name], what, wait, deadline, on_wait))
        yield


@contextlib.contextmanager
def _tier_locked(
    tc: Any,
    what: str,
    wait: float,
    deadline: float,
    on_wait: Callable[[str], None] | None,
) -> Iterator[None]:
    path = work_path(tc, LOCK_NAME)
    with open(path, "a+") as f:  # closing it releases the lock
        told = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                held = f"{_holder(f.read().strip())} holds {path}"
                left = deadline - time.monotonic()
                if left <= 0:
                    busy = f"still busy after {wait:g} s" if wait > 0 else "busy"
                    raise BusyError(
                        f"tier {tc.name!r} is {busy}: {held}. Measurements of one tier at once "
                        "(calibrations, measured runs) time each other's I/O and share its "
                        "work folder; run one after the other"
                        + ("" if wait > 0 else " (--wait SECONDS waits for it)")
                    ) from None
                if not told and on_wait is not None:
                    # (in tenths: the wait asked for, less the little spent before this look)
                    up_to = f"{round(left, 1):g} s" if left >= 0.1 else "0.1 s"
                    on_wait(f"waiting up to {up_to} for tier {tc.name!r}: {held}")
                    told = True
                time.sleep(min(_POLL_S, left))
                continue
            except OSError:  # a file system without locks (ENOLCK): measure unguarded
                break
            f.seek(0)
            f.truncate()
            since = time.strftime("%Y-%m-%d %H:%M:%S")
            f.write(f"pid {os.getpid()} on {socket.gethostname()} since {since} ({what})")
            f.flush()
            _held.add(f.fileno())
            _clear_leftovers(os.path.dirname(path))
            break
        try:
            yield
        finally:
            _held.discard(f.fileno())


def _clear_leftovers(folder: str) -> None:
    """Delete what a killed measurement left in a tier's work folder ``folder`` (its files
    and datasets; not the lock file): the caller holds the tier's lock, which every process
    measuring there holds while it writes, so nothing in it is in use."""
    for entry in os.scandir(folder):
        if entry.name == LOCK_NAME:
            continue
        with contextlib.suppress(FileNotFoundError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.remove(entry.path)


def _holder(said: str) -> str:
    """Who holds a lock whose file says ``said`` (``pid N on HOST since ...``): the process
    named, or where it ran on this host and has ended, the processes it launched."""
    words = said.split()
    if len(words) < 4 or words[0] != "pid" or words[2] != "on" or not words[1].isdigit():
        return said or "another process"
    if words[3] != socket.gethostname():
        return said
    try:
        os.kill(int(words[1]), 0)
    except ProcessLookupError:
        return (
            f"{said} (that process has ended; the ranks it launched, still running, hold "
            "the lock until they end)"
        )
    except OSError:  # (alive, another user's)
        pass
    return said


def held_lock_fds() -> tuple[int, ...]:
    """Descriptors of the measurement locks (:func:`lock_tiers`) this process holds now: a
    process started meanwhile inherits them (an ``flock`` belongs to the open file, so the
    lock then holds until the last of them exits)."""
    return tuple(sorted(_held))


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
