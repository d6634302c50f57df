"""Launch a module's ranks under ``mpiexec`` and follow what rank 0 reports as it goes.

Rank 0 writes one JSON object per line on stdout: ``{"progress": k}`` lines while it works,
and its result as the last line; a rank that fails writes ``{"error": said, "rank": r}`` and ends the job
(:func:`whole_job`). :func:`report` and :func:`whole_job` are the rank side, :func:`launch` the
caller's.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
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
    ``timeout`` seconds (then killed), raises :class:`StrataError`: what the rank that failed
    said (:func:`whole_job`), else the ranks' stderr."""
    cmd, env = rank_command(nprocs, module, args)
    # stderr to a file: a pipe nobody reads while stdout is followed could fill and stall
    with tempfile.TemporaryFile("w+") as errfile, _started(cmd, errfile, env) as proc:
        last = None
        assert proc.stdout is not None
        watchdog = threading.Timer(timeout, proc.kill) if timeout else None
        if watchdog is not None:
            watchdog.start()  # a hung rank ends the run instead of the caller waiting forever
        other: list[str] = []  # (the last lines that are not JSON: hydra's, say)
        failed: dict[str, list[int]] = {}  # (what ranks that failed said: which ranks)
        for line in proc.stdout:
            line = line.strip()
            if not line.startswith("{"):
                other = [*other[-9:], line]
                continue
            msg = json.loads(line)
            if set(msg) == {"error", "rank"}:
                failed.setdefault(str(msg["error"]), []).append(int(msg["rank"]))
            elif "progress" in msg and len(msg) == 1:
                if on_progress is not None:
                    on_progress(int(msg["progress"]))
            else:
                last = msg
        code = proc.wait()
        if watchdog is not None:
            watchdog.cancel()
        errfile.seek(0)
        err = errfile.read()
    if failed:
        said = "; ".join(
            f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, sorted(r)))}: {e}"
            for e, r in failed.items()
        )
        raise StrataError(f"mpiexec -n {nprocs} {module} failed: {said}")
    if code != 0 or last is None:
        said = err[-3000:].strip() or silent_end(code, "\n".join(other))
        raise StrataError(f"mpiexec -n {nprocs} {module} failed (exit {code}):\n{said}")
    return last


def report(comm: Any, msg: dict[str, Any]) -> None:
    """Rank 0 writes ``msg`` as one JSON line (the other ranks write nothing)."""
    if comm.Get_rank() == 0:
        print(json.dumps(msg), flush=True)


@contextlib.contextmanager
def whole_job(comm: Any) -> Iterator[None]:
    """Run a rank's part of a job: an exception on one rank ends every rank of it
    (``MPI_Abort``: the others would wait for it in their next collective call forever),
    after it writes ``{"error": said, "rank": r}`` on stdout (what :func:`launch` raises) and its
    traceback on stderr. Cleanup that needs the other ranks is for the block's success only."""
    try:
        yield
    except Exception as exc:
        said = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):  # (a caller gone: the job ends all the same)
            print(json.dumps({"error": said, "rank": comm.Get_rank()}), flush=True)
            traceback.print_exception(exc, file=sys.stderr)
            sys.stderr.flush()
        comm.Abort(1)
        raise  # (MPI_Abort does not return)
