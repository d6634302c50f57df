"""Launch a benchmark's ranks under the ``mpiexec`` installed beside this Python."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from strataio.errors import StrataError


def mpiexec() -> str:
    """The launcher named by ``$STRATAIO_MPIEXEC``, else the ``mpiexec`` beside this Python
    (the mpich extra), else the one on ``PATH``."""
    named = os.environ.get("STRATAIO_MPIEXEC")
    if named:
        return named
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


def rank_command(nprocs: int, module: str, args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``python -m module args`` on ``nprocs``
    ranks (this Python's folder first on ``PATH``, as the ranks' own launches expect)."""
    cmd = [mpiexec(), "-n", str(nprocs), sys.executable, "-m", module, *args]
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return cmd, env


def launcher_failed(launcher: str, exc: OSError) -> StrataError:
    """The error for a launcher that cannot be started (missing, not executable)."""
    return StrataError(
        f"cannot run the MPI launcher {launcher!r} ({exc.strerror or exc}): install "
        "strataio's mpich extra or name a launcher program in $STRATAIO_MPIEXEC"
    )


def silent_end(code: int, output: str = "") -> str:
    """What a run of ranks that wrote nothing to stderr most likely met, from its exit
    status (hydra exits with the number of the signal that killed a rank, a shell with 128
    plus it) and the end of what it wrote to stdout (where hydra reports a rank's end)."""
    if code in (-signal.SIGKILL, signal.SIGKILL, 128 + signal.SIGKILL):
        said = "the run was killed (SIGKILL) before it said why: out of memory, most likely"
    else:
        said = "the ranks said nothing on stderr"
    tail = output.strip()[-1000:]
    return f"{said}; the end of its output:\n{tail}" if tail else said


def run_ranks(nprocs: int, module: str, args: list[str], timeout: float) -> Any:
    """Run ``python -m module args`` on ``nprocs`` ranks; the JSON its last stdout line holds
    (rank 0 prints it). A failed launch, or one still running after ``timeout`` seconds,
    raises :class:`StrataError` with the ranks' stderr."""
    cmd, env = rank_command(nprocs, module, args)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except OSError as exc:
        raise launcher_failed(cmd[0], exc) from None
    except subprocess.TimeoutExpired:
        raise StrataError(
            f"mpiexec -n {nprocs} {module} still running after {timeout:g} s: stopped"
        ) from None
    if proc.returncode != 0:
        said = proc.stderr[-3000:].strip() or silent_end(proc.returncode, proc.stdout)
        raise StrataError(f"mpiexec -n {nprocs} failed (exit {proc.returncode}):\n{said}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
