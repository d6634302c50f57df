"""``strataio bench superfile``: many small files from a shaped remote tier, superfile versus
one object per file (the multi-storage paper's Figure 10(c)).

``count`` members of ``member_bytes`` random bytes each are written twice to a POSIX
directory: as one object per file (``files/f00000`` ...) and into a superfile
(:mod:`strataio.tiers.superfile`). Then that directory is read back behind
:class:`~strataio.storage.shaped.Shaped` with a preset of the paper's Table 1, the way a viewer
reads images: one file after the other.

- **one object per file** (the baseline, the paper's naive approach): one ``get`` per file, in
  order, on the shaped backend itself (no catalog, no session: the cheapest the baseline gets);
- **superfile**: a fresh :class:`~strataio.session.Session` on the shaped tier opens the
  superfile read-only and ``get``\\ s every member; the first read of each container brings it
  whole into the prefetch cache, the others are served from memory.

Each is reported as modelled seconds (what the cost model charges; independent of
``time_scale``) and wall seconds (the model's sleeps scaled by ``time_scale``, plus
everything else the run does), and the ratio baseline / superfile of each. The ratio is
bounded by the model: with ``remote_disk_2002`` a 64 KiB file costs 1.05 s of fixed cost plus
0.21 s of transfer, and a superfile still moves every byte, so no packing can gain more than
(1.05 + 0.21) / 0.21 = 6x there; with ``remote_tape_2002`` (6.6 s per mount) the bound is 32x.

``sweep`` reads the largest count again with each container size given (modelled seconds
only, ``time_scale`` 0): the measurement behind
:data:`~strataio.tiers.superfile.DEFAULT_CONTAINER_BYTES`.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from strataio.storage.posix import PosixBackend
from strataio.storage.shaped import Shaped
from strataio.tiers.superfile import DEFAULT_CONTAINER_BYTES
from strataio.tiers.tier import Tier, TierSet

PRESETS = ("remote_disk_2002", "remote_tape_2002")


def _tiers(root: Path, preset: str | None, time_scale: float) -> TierSet:
    remote: Any = PosixBackend(root / "remote")
    if preset is not None:
        remote = Shaped(remote, preset, time_scale)
    # the remote role for both presets: a tape-role tier would stage each container to a
    # disk tier first, which is a different experiment (bench tape)
    return TierSet([Tier("remote", remote, "remotedisk", order=0)])


def _write(root: Path, payload: list[bytes], container_bytes: int, name: str) -> None:
    from strataio.session import Session

    files = PosixBackend(root / "remote")
    for i, data in enumerate(payload):
        files.put(f"files/f{i:05d}", data, durable=True)
    with Session(tiers=_tiers(root, None, 0.0), catalog=root / "cat.db") as s:
        sf = s.superfile(name, container_bytes=container_bytes)
        for i, data in enumerate(payload):
            sf.put(f"f{i:05d}", data)
        sf.close()


def _read_superfile(
    root: Path, preset: str, time_scale: float, name: str, payload: list[bytes]
) -> tuple[float, float, int]:
    from strataio.session import Session

    cache = 4 * sum(len(p) for p in payload) + (64 << 20)
    with Session(
        tiers=_tiers(root, preset, time_scale), catalog=root / "cat.db", cache_bytes=cache
    ) as s:
        remote = s.tiers["remote"].backend
        t0 = time.perf_counter()
        sf = s.superfile(name, "r")
        for i, data in enumerate(payload):
            if sf.get(f"f{i:05d}") != data:
                raise AssertionError(f"superfile member {i} read back wrong")
        wall = time.perf_counter() - t0
        stats = remote.stats()
        sf.close()
    return wall, stats.simulated, stats.requests


def _read_files(
    root: Path, preset: str, time_scale: float, payload: list[bytes]
) -> tuple[float, float, int]:
    remote = Shaped(PosixBackend(root / "remote"), preset, time_scale)
    t0 = time.perf_counter()
    for i, data in enumerate(payload):
        if bytes(remote.get(f"files/f{i:05d}")) != data:
            raise AssertionError(f"file {i} read back wrong")
    wall = time.perf_counter() - t0
    stats = remote.stats()
    remote.close()
    return wall, stats.simulated, stats.requests


def run_superfile(
    counts: Sequence[int] = (100, 1000),
    member_bytes: int = 64 << 10,
    presets: Sequence[str] = PRESETS,
    time_scale: float = 0.001,
    container_bytes: int = DEFAULT_CONTAINER_BYTES,
    sweep: Sequence[int] = (),
    seed: int = 0,
) -> dict[str, Any]:
    """Read ``counts`` files of ``member_bytes`` both ways on each preset; see the module doc."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {
        "member_bytes": member_bytes,
        "time_scale": time_scale,
        "container_bytes": container_bytes,
        "rows": [],
        "sweep": [],
    }
    with tempfile.TemporaryDirectory(prefix="strataio-bench-superfile-") as tmp:
        for count in counts:
            root = Path(tmp) / f"n{count}"
            payload = [rng.bytes(member_bytes) for _ in range(count)]
            _write(root, payload, container_bytes, "files")
            for preset in presets:
                fw, fm, fr = _read_files(root, preset, time_scale, payload)
                sw, sm, sr = _read_superfile(root, preset, time_scale, "files", payload)
                out["rows"].append(
                    {
                        "preset": preset,
                        "files": count,
                        "files_wall_s": fw,
                        "files_model_s": fm,
                        "files_requests": fr,
                        "superfile_wall_s": sw,
                        "superfile_model_s": sm,
                        "superfile_requests": sr,
                        "speedup_wall": fw / sw if sw else float("inf"),
                        "speedup_model": fm / sm if sm else float("inf"),
                    }
                )
        if sweep and counts:
            count = max(counts)
            payload = [rng.bytes(member_bytes) for _ in range(count)]
            for size in sweep:
                root = Path(tmp) / f"sweep{size}"
                _write(root, payload, size, "files")
                for preset in presets:
                    _, model, requests = _read_superfile(root, preset, 0.0, "files", payload)
                    out["sweep"].append(
                        {
                            "preset": preset,
                            "files": count,
                            "container_bytes": size,
                            "model_s": model,
                            "requests": requests,
                        }
                    )
    return out


def superfile_tables(result: dict[str, Any]) -> list[Table]:
    """The comparison table, and the container-size sweep when one was run."""
    kib = result["member_bytes"] // 1024
    t = Table(
        title=f"Reading small files ({kib} KiB) from a shaped remote tier, one after the other",
        caption=f"model s: the cost model's seconds; wall s: at time_scale {result['time_scale']}",
    )
    for col in ("preset", "files", "per-file model s", "superfile model s", "speedup (model)",
                "per-file wall s", "superfile wall s", "speedup (wall)", "requests"):  # fmt: skip
        t.add_column(col, justify="left" if col == "preset" else "right")
    for r in result["rows"]:
        t.add_row(
            r["preset"],
            str(r["files"]),
            f"{r['files_model_s']:.1f}",
            f"{r['superfile_model_s']:.1f}",
            f"{r['speedup_model']:.1f}x",
            f"{r['files_wall_s']:.3f}",
            f"{r['superfile_wall_s']:.3f}",
            f"{r['speedup_wall']:.1f}x",
            f"{r['files_requests']} / {r['superfile_requests']}",
        )
    tables = [t]
    if result["sweep"]:
        s = Table(title="Container size: modelled seconds to read every member")
        for col in ("preset", "files", "container", "model s", "requests"):
            s.add_column(col, justify="left" if col == "preset" else "right")
        for r in result["sweep"]:
            s.add_row(
                r["preset"],
                str(r["files"]),
                f"{r['container_bytes'] / (1 << 20):g} MiB",
                f"{r['model_s']:.1f}",
                str(r["requests"]),
            )
        tables.append(s)
    return tables
