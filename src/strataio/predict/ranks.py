"""Launch a module's ranks under ``mpiexec`` and follow what rank 0 reports as it goes.

Rank 0 writes one JSON object per line on stdout: ``{"progress": k}`` lines while it works,
and its result as the last line. :func:`report` is the rank side, :func:`launch` the caller's.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from strataio.bench.mpi import launcher_failed, rank_command, silent_end
from strataio.errors import StrataError
from strataio.predict.native import held_lock_fds


def _started(cmd: list[str], errfile: Any, env: dict[str, str]) -> subprocess.Popen[str]:
    # (the tier locks held here go along: a caller killed mid-run leaves them held by the
    # run until it ends, not free for a calibration to time the run's I/O)
    try:
        return subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=errfile,
            text=True,
            env=env,
            pass_fds=held_lock_fds(),
        )
    except OSError as exc:
        raise launcher_failed(cmd[0], exc) from None


def launch(
    nprocs: int,
    module: str,
    args: list[str],
    *,
    on_progress: Callable[[int], None] | None = None,
    timeout: float | None = None,
) -> Any:
    """Run ``python -m module args`` on ``nprocs`` ranks; call ``on_progress(k)`` for each
    progress line and return the last line's JSON. A failed run, or one still going after
    ``timeout`` seconds (then killed), raises :class:`StrataError` with the ranks' stderr."""
    cmd, env = rank_command(nprocs, module, args)
    # stderr to a file: a pipe nobody reads while stdout is followed could fill and stall
    with tempfile.TemporaryFile("w+") as errfile, _started(cmd, errfile, env) as proc:
        last = None
        assert proc.stdout is not None
        watchdog = threading.Timer(timeout, proc.kill) if timeout else None
        if watchdog is not None:
            watchdog.start()  # a hung rank ends the run instead of the caller waiting forever
        other: list[str] = []  # (the last lines that are not JSON: hydra's, say)
        for line in proc.stdout:
            line = line.strip()
            if not line.startswith("{"):
                other = [*other[-9:], line]
                continue
            msg = json.loads(line)
            if "progress" in msg and len(msg) == 1:
                if on_progress is not None:
                    on_progress(int(msg["progress"]))
            else:
                last = msg
        code = proc.wait()
        if watchdog is not None:
            watchdog.cancel()
        errfile.seek(0)
        err = errfile.read()
    if code != 0 or last is None:
        said = err[-3000:].strip() or silent_end(code, "\n".join(other))
        raise StrataError(f"mpiexec -n {nprocs} {module} failed (exit {code}):\n{said}")
    return last


def report(comm: Any, msg: dict[str, Any]) -> None:
    """Rank 0 writes ``msg`` as one JSON line (the other ranks write nothing)."""
    if comm.Get_rank() == 0:
        print(json.dumps(msg), flush=True)
