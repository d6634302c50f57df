"""Processes started together: each runs one script, says it is ready, and goes on only once
every one of them is, so that what they do next overlaps in time."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

#: the line a racing script prints once it is ready, then it waits for a line on its stdin
READY = "ready"


def race(script: str, argvs: list[list[str]], timeout: float = 60.0) -> list[str]:
    """Run ``script`` (Python source) in one process per argument list of ``argvs``; each
    prints :data:`READY` and reads a line from its stdin before its racing part, which this
    sends to all of them at once once every one is ready. Returns each process's further
    output; raises AssertionError where one fails."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for argv in argvs
    ]
    try:
        for proc in procs:
            line = proc.stdout.readline()
            assert line == f"{READY}\n", f"{line!r}{proc.stderr.read()}"
        for proc in procs:
            proc.stdin.write("\n")
            proc.stdin.flush()
        outs = []
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, err
            outs.append(out)
        return outs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def set_and_delete_attrs(ds: Any, argv: list[str]) -> None:
    """In a racing process: say it is ready and wait for the start, then set attributes
    ``<who><i>`` = i of dataset ``ds``, i < n, one at a time, deleting attribute
    ``drop[i]`` after set i (``argv``: who, n, then the attributes to drop)."""
    who, n, drop = argv[0], int(argv[1]), argv[2:]
    print(READY, flush=True)
    sys.stdin.readline()
    for i in range(n):
        ds.attrs[f"{who}{i}"] = i
        if i < len(drop):
            del ds.attrs[drop[i]]
