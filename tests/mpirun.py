"""Run a script of ``tests/mpi_scripts`` under the ``mpiexec`` installed beside this Python."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from servers import missing

BIN = Path(sys.executable).parent
SCRIPTS = Path(__file__).resolve().parent / "mpi_scripts"


def run_mpi(nprocs: int, script: str, *args: object, timeout: float = 60) -> str:
    """Launch ``mpiexec -n nprocs python SCRIPT ARGS``; fail the test on a non-zero exit and
    return what the ranks printed on stdout."""
    proc = launch_mpi(nprocs, script, *args, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


def launch_mpi(
    nprocs: int, script: str, *args: object, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Launch ``mpiexec -n nprocs python SCRIPT ARGS`` and return how it ended, whatever the
    exit status (a hang fails the test by ``timeout``)."""
    mpiexec = BIN / "mpiexec"
    if not mpiexec.exists():
        missing("mpiexec is not installed beside this Python (the mpich extra)")
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    cmd = [str(mpiexec), "-n", str(nprocs), sys.executable, str(SCRIPTS / script)]
    cmd += [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
