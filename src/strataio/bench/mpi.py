"""Launch a benchmark's ranks under the ``mpiexec`` installed beside this Python."""

from __future__ import annotations

import json
import os
import shutil
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


def run_ranks(nprocs: int, module: str, args: list[str], timeout: float) -> Any:
    """Run ``python -m module args`` on ``nprocs`` ranks; the JSON its last stdout line holds
    (rank 0 prints it). A failed launch raises :class:`StrataError` with the ranks' stderr."""
    cmd = [mpiexec(), "-n", str(nprocs), sys.executable, "-m", module, *args]
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError:
        raise StrataError(
            f"no MPI launcher {cmd[0]!r}: install strataio's mpich extra or name one in "
            "$STRATAIO_MPIEXEC"
        ) from None
    if proc.returncode != 0:
        raise StrataError(f"mpiexec -n {nprocs} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
