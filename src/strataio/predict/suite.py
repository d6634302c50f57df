"""The prediction-accuracy benchmark (``strataio bench predict``): calibrate three tiers, then
predict and measure a fixed set of workloads covering the three methods on local and shaped
tiers, and compare.

The tiers live in a folder of their own: ``local`` (plain POSIX), ``remote``
(``remote_disk_2002``) and ``archive`` (``remote_tape_2002``), the shaped ones at ``time_scale``
0.01 so a workload takes seconds. Accuracy is ``|predicted - measured| / measured`` of each
workload's total; the benchmark reports its median and its worst.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from typing import Any

from strataio.predict.workload import parse_workload

__all__ = ["SUITE", "bench_config_text", "run_suite"]

TIME_SCALE = 0.01


def bench_config_text(time_scale: float = TIME_SCALE) -> str:
    """The benchmark's configuration (relative paths: under the folder it is written to)."""
    shaped = {"remote": "remote_disk_2002", "archive": "remote_tape_2002"}
    roles = {"local": "localdisk", "remote": "remotedisk", "archive": "remotetape"}
    out = ['[catalog]\nurl = "catalog.db"\n']
    for name, role in roles.items():
        out.append(
            f'[[tiers]]\nname = "{name}"\nkind = "posix"\nrole = "{role}"\npath = "{name}"\n'
        )
        if name in shaped:
            out.append(f'shaped = "{shaped[name]}"\ntime_scale = {time_scale}\n')
    return "\n".join(out)


def _workload(method: str, tier: str, iterations: int, datasets: list[tuple], **run: Any) -> str:
    lines = ["[run]", "ranks = 4", f"iterations = {iterations}", f'tier = "{tier}"']
    lines.append(f'method = "{method}"')
    lines += [f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"' for k, v in run.items()]
    for name, dtype, dims, pattern, freq, mode, *where in datasets:
        lines += [
            "",
            "[[dataset]]",
            f'name = "{name}"',
            f'dtype = "{dtype}"',
            f"dims = {list(dims)}",
            f'pattern = "{pattern}"',
            f"frequency = {freq}",
            f'mode = "{mode}"',
        ]
        if where:
            lines.append(f'tier = "{where[0]}"')
    return "\n".join(lines) + "\n"


_BIG = (128, 128, 64)
#: name -> workload TOML; four ranks each (the machine this runs on has two cores)
SUITE: dict[str, str] = {
    "naive-local": _workload(
        "naive",
        "local",
        8,
        [
            ("temp", "float32", _BIG, "BBB", 2, "write"),
            ("press", "float32", _BIG, "B**", 4, "read"),
        ],
    ),
    "collective-local": _workload(
        "collective",
        "local",
        8,
        [
            ("temp", "float32", _BIG, "BBB", 2, "write"),
            ("press", "float32", _BIG, "*B*", 4, "read"),
        ],
        cb_nodes=2,
        cb_buffer_size="1MiB",
    ),
    "chunked-local": _workload(
        "chunked",
        "local",
        8,
        [
            ("temp", "float32", _BIG, "BBB", 2, "write"),
            ("press", "float32", _BIG, "B**", 4, "read"),
        ],
    ),
    "naive-remote": _workload(
        "naive",
        "remote",
        4,
        [
            ("temp", "float32", (32, 32, 32), "BBB", 2, "write"),
            ("vr_temp", "uint8", (64, 64, 64), "B**", 2, "read"),
        ],
    ),
    "collective-archive": _workload(
        "collective",
        "archive",
        4,
        [
            ("temp", "float32", (64, 64, 64), "BBB", 2, "write", "remote"),
            ("restart_temp", "float32", (64, 64, 64), "BBB", 4, "write"),
        ],
        cb_nodes=2,
        cb_buffer_size="256KiB",
    ),
    "chunked-archive": _workload(
        "chunked",
        "archive",
        4,
        [
            ("restart_rho", "float32", (64, 64, 64), "BBB", 2, "write"),
            ("vr_temp", "uint8", (128, 128, 64), "BBB", 2, "read", "remote"),
        ],
    ),
}


def run_suite(
    root: str | os.PathLike[str],
    *,
    names: list[str] | None = None,
    max_size: int = 4 << 20,
    repeat: int = 3,
    calibrate: bool = True,
    runs: int = 3,
    on_step: Callable[[str], None] | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Calibrate the benchmark's tiers under ``root`` (with ``calibrate`` False, reuse the
    calibration there: :class:`UncalibratedError` where there is none), then predict each
    workload and measure it ``runs`` times (each dataset's median time counts: the machine
    is shared, one run can be unlucky). Returns ``{"workloads":
    [{"name", "method", "predicted_s", "measured_s", "error", "datasets": [...]}...],
    "median_error", "worst_error"}`` (errors as fractions, absolute)."""
    from strataio.catalog import open_catalog
    from strataio.config import load_config
    from strataio.predict.calibrate import calibrate as run_calibration
    from strataio.predict.calibrate import default_sizes
    from strataio.predict.model import predict
    from strataio.predict.perfdb import PerfTable, UncalibratedError
    from strataio.predict.runner import run_workload
    from strataio.tiers.tier import register_configured_tiers

    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, "strataio.toml")
    with open(path, "w") as f:
        f.write(bench_config_text())
    config = load_config(path)
    with open_catalog(config.catalog.url) as catalog:
        register_configured_tiers(catalog, config)
        if not calibrate and not catalog.perf_rows():
            raise UncalibratedError(
                f"no calibration in {root} to reuse (--no-calibrate): run once without it"
            )
        if calibrate:
            if on_step is not None:
                on_step("calibrating")
            run_calibration(
                config,
                catalog,
                sizes=default_sizes(max_size),
                repeat=repeat,
                on_progress=on_progress,
            )
        perf = PerfTable(catalog.perf_rows())
    results = []
    for name in names or list(SUITE):
        wl = parse_workload(SUITE[name], source=name)
        if on_step is not None:
            on_step(name)
        prediction = predict(wl, perf)
        each = [run_workload(wl, config) for _ in range(max(1, runs))]
        measured = {d.name: statistics.median(m[d.name] for m in each) for d in wl.datasets}
        total = sum(measured.values())
        results.append(
            {
                "name": name,
                "method": wl.run.method,
                "tiers": sorted({wl.tier_of(d) for d in wl.datasets}),
                "predicted_s": prediction.total_s,
                "measured_s": total,
                "error": abs(prediction.total_s - total) / total,
                "datasets": [
                    {
                        "name": d.spec.name,
                        "tier": d.tier,
                        "predicted_s": d.predicted_s,
                        "measured_s": measured[d.spec.name],
                    }
                    for d in prediction.datasets
                ],
            }
        )
    errors = [r["error"] for r in results]
    return {
        "workloads": results,
        "median_error": statistics.median(errors),
        "worst_error": max(errors),
    }
