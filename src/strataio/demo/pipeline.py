"""``strataio demo``'s driver: the Astro3D pipeline (:mod:`strataio.demo.astro3d`) under each
of Figure 9's scenarios, predicted by equation (2) and measured under ``mpiexec``.

The configuration is the embedded default (``strataio init``'s: local disk, a remote disk
shaped ``remote_disk_2002`` and a tape archive shaped ``remote_tape_2002``) written into the
demo folder, so its tiers and catalog live there, with the shaped tiers' ``time_scale`` set to
the demo's. The catalog's calibration is reused while the configuration is unchanged; without
one the tiers are calibrated first, quickly (sizes up to a few times the largest access, two
repeats, at one process and at the demo's rank count).

Prediction (:func:`predict_scenario`): a workload of the same parameters, method ``chunked``
(each dump of a dataset is one chunk per rank, as the demo writes it): the producer's datasets
as ``write`` datasets on their scenario's tier (DISABLEd ones move nothing and are left out),
``temp`` read once per dump by the analysis and ``vr_temp`` by Volren. The image superfile,
which the workload format has no word for, is predicted from the same performance database as
one container ``put`` when Volren closes it and one ``get`` when the viewer first reads it.

The calibration's ``put`` / ``get`` are a chunk through the tier's backend. A Session dataset
pays more per access: the catalog learns of each rewrite before it is made and records it
after, and ``flush`` syncs the tier's objects (a shaped tier charges that too). The demo
measures that once per calibration (:func:`~strataio.demo.astro3d.measure_access_costs`: a
block-sized dump written and read through a Session dataset on each tier, at the demo's rank
count), and stores the difference from the database's ``put`` / ``get`` at that size as the
constant ops ``tiered_put`` / ``tiered_rewrite`` (a checkpoint's dump in place) /
``tiered_get`` of the tier's calibration, which equation (2)'s
unit time then includes. The prediction without them ("backend only") is shown beside.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strataio.demo.astro3d import (
    ALL,
    ROLE_HINTS,
    SCENARIOS,
    DemoParams,
    expected_images,
    expected_mse,
    launch_args,
    placement,
)

__all__ = [
    "COMPONENTS",
    "ScenarioResult",
    "demo_config_text",
    "ensure_calibrated",
    "plot_results",
    "predict_scenario",
    "run_demo",
]

COMPONENTS = ("producer", "analysis", "volren", "viewer")
#: the demo's parameters: Table 2's scaled to about two minutes on two cores (all five
#: scenarios, the calibration included)
DEMO = DemoParams(size=32, iterations=24, freq=6, ranks=4)
#: factor on the shaped tiers' modelled times in the demo
DEFAULT_TIME_SCALE = 0.01
CONFIG_NAME = "strataio.toml"


def demo_config_text(time_scale: float) -> str:
    """The embedded default configuration with its shaped tiers at ``time_scale``."""
    from strataio.config import default_config_text

    return re.sub(r"(?m)^time_scale = .*$", f"time_scale = {time_scale!r}", default_config_text())


def prepare_folder(directory: Path, time_scale: float, fresh: bool = False) -> tuple[Path, bool]:
    """Write the demo configuration into ``directory``; the folder is emptied first if
    ``fresh`` or unless it holds this very configuration already (then its calibration is
    kept). Returns the configuration's path and whether the folder was kept."""
    path = directory / CONFIG_NAME
    text = demo_config_text(time_scale)
    kept = not fresh and path.is_file() and path.read_text() == text
    if not kept:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path, kept


def largest_access(params: DemoParams) -> int:
    """Bytes of the largest single call the demo makes (a float32 block, or the images)."""
    from strataio.predict.workload import Partition

    block = Partition.of(params.dims, "BBB", params.ranks).block
    return max(4 * block[0] * block[1] * block[2], params.dumps * params.size**2)


def ensure_calibrated(
    config: Any,
    params: DemoParams,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> tuple[Any, bool]:
    """The performance database of ``config``'s catalog, calibrating every tier first when it
    has none. Returns ``(PerfTable, calibrated_now)``."""
    from strataio.catalog import open_catalog
    from strataio.predict.calibrate import calibrate, default_sizes
    from strataio.predict.perfdb import PerfTable
    from strataio.tiers.tier import register_configured_tiers

    with open_catalog(config.catalog.url) as catalog:
        register_configured_tiers(catalog, config)
        rows = catalog.perf_rows()
        tiers = {t.name for t in config.tiers}
        if rows and tiers <= {r.tier for r in rows}:
            return PerfTable(rows), False
        top = 1024
        while top < largest_access(params):
            top *= 4
        calibrate(
            config,
            catalog,
            sizes=default_sizes(top),
            repeat=2,
            levels=[params.ranks],
            on_progress=on_progress,
        )
        return PerfTable(catalog.perf_rows()), True


#: constant ops, per access, of the tiered layer above the backend's put / get: a dump of a
#: new step, a checkpoint's rewrite in place, a read
TIERED_OPS = {"write": "tiered_put", "rewrite": "tiered_rewrite", "read": "tiered_get"}


def ensure_access_costs(
    config: Any, config_path: Path, params: DemoParams, perf: Any
) -> tuple[Any, bool]:
    """``perf`` with the tiered layer's per-access cost of every tier (see the module docs),
    measured under ``mpiexec`` and recorded with the tier's calibration when missing.
    Returns ``(PerfTable, measured_now)``."""
    from strataio.catalog import open_catalog
    from strataio.catalog.base import PerfRow
    from strataio.predict.native import lock_tiers
    from strataio.predict.perfdb import PerfTable
    from strataio.predict.ranks import launch

    tiers = [t.name for t in config.tiers if t.role in ROLE_HINTS]

    def complete(table: Any) -> bool:
        return all(table.has(t, op) for t in tiers for op in TIERED_OPS.values())

    if complete(perf):
        return perf, False
    args = launch_args(os.fspath(config_path), params, "access-costs")
    # measured and recorded holding the tiers' lock, as a calibration is (neither times the
    # other); the table is read again under it, for a calibration or another demo may have
    # recorded rows meanwhile, and the extras are taken over the calibration they carry
    with lock_tiers([config.tier(t) for t in tiers], "measuring the demo's access costs"):
        with open_catalog(config.catalog.url) as catalog:
            perf = PerfTable(catalog.perf_rows())
            if complete(perf):
                return perf, False
        costs = launch(params.ranks, "strataio.demo.astro3d", args)["costs"]
        rows = []
        for t in tiers:
            c = costs[t]
            for what, op in (("write", "put"), ("rewrite", "put"), ("read", "get")):
                extra = max(0.0, c[what] - perf.time(t, op, c["nbytes"], params.ranks))
                rows.append(
                    PerfRow(t, TIERED_OPS[what], 0, extra, params.ranks, perf.measured_at[t])
                )
        with open_catalog(config.catalog.url) as catalog:
            catalog.record_perf(rows)
            return PerfTable(catalog.perf_rows()), True


def tier_of_hint(config: Any, hint: str) -> str | None:
    """The tier a location hint sends a dataset to (the first of its role), None for DISABLE."""
    from strataio.tiers.placement import HINT_ROLES

    role = HINT_ROLES.get(hint)
    if role is None:
        return None
    return next(t.name for t in config.tiers if t.role == role)


def scenario_workload(config: Any, params: DemoParams, scenario: int) -> Any:
    """The workload predicting ``scenario`` (see the module docs); dataset names are
    ``component:dataset``."""
    import numpy as np

    from strataio.predict.workload import DatasetSpec, RunSpec, Workload

    specs = []

    def add(component: str, name: str, mode: str) -> None:
        tier = tier_of_hint(config, placement(scenario, name))
        if tier is None:
            return
        dtype = np.dtype("uint8" if name.startswith("vr_") else "float32")
        specs.append(
            DatasetSpec(f"{component}:{name}", dtype, params.dims, "BBB", params.freq, mode, tier)
        )

    for name in ALL:
        add("producer", name, "write")
    add("analysis", "temp", "read")
    add("volren", "vr_temp", "read")
    first = specs[0].tier if specs else "local"
    run = RunSpec(params.ranks, params.iterations, first, "chunked")
    return Workload(run, tuple(specs), f"astro3d scenario {scenario}")


def predict_scenario(
    config: Any, params: DemoParams, scenario: int, perf: Any, tiered: bool = True
) -> dict:
    """Predicted I/O seconds of ``scenario`` per component (:data:`COMPONENTS`); with
    ``tiered``, each access also pays its tier's ``tiered_put`` / ``tiered_get`` where
    measured."""
    from strataio.predict.model import predict

    out = dict.fromkeys(COMPONENTS, 0.0)
    wl = scenario_workload(config, params, scenario)
    if wl.datasets:
        for d in predict(wl, perf).datasets:
            seconds = d.predicted_s
            kind = "read" if d.spec.mode == "read" else "write"
            if d.spec.name.startswith("producer:restart_"):
                kind = "rewrite"
            extra = TIERED_OPS[kind]
            if tiered and perf.has(d.tier, extra):
                seconds += d.accesses * perf.time(d.tier, extra, 0, d.calls.concurrency)
            out[d.spec.name.split(":")[0]] += seconds
    images = tier_of_hint(config, placement(scenario, "vr_temp"))
    if images is not None:
        container = params.dumps * params.size**2
        out["volren"] += perf.time(images, "put", container, 1)
        out["viewer"] += perf.time(images, "get", container, 1)
    return out


@dataclass
class ScenarioResult:
    """One scenario: what it does, and predicted / measured seconds per component."""

    scenario: int
    title: str
    predicted: dict[str, float]
    measured: dict[str, float]
    #: predicted seconds from the backend's calibration alone (no ``tiered_*`` ops)
    backend_only_s: float = 0.0
    mse: list[tuple[float, float]] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    viewed: list[str] = field(default_factory=list)

    @property
    def predicted_s(self) -> float:
        return sum(self.predicted.values())

    @property
    def measured_s(self) -> float:
        return sum(self.measured.values())

    def consumers_ok(self, params: DemoParams) -> bool:
        """Whether the consumers read what numpy computes from the same fields: the MSE
        pairs, and the images as Volren wrote them and as the viewer read them back."""
        import numpy as np

        if placement(self.scenario, "temp") != "DISABLE":
            want = expected_mse(params)
            if len(self.mse) != len(want) or not np.allclose(self.mse, want, rtol=1e-5):
                return False
        if placement(self.scenario, "vr_temp") != "DISABLE":
            want_images = expected_images(params)
            return self.images == want_images and self.viewed == want_images
        return True

    @property
    def error(self) -> float:
        """|predicted - measured| / measured (0 when nothing was measured)."""
        return _error(self.predicted_s, self.measured_s)

    @property
    def backend_only_error(self) -> float:
        return _error(self.backend_only_s, self.measured_s)


def _error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured if measured > 0 else 0.0


def progress_total(params: DemoParams, scenario: int) -> int:
    """Progress steps the ranks report for ``scenario``."""
    total = params.dumps
    if placement(scenario, "temp") != "DISABLE":
        total += params.dumps
    if placement(scenario, "vr_temp") != "DISABLE":
        total += 2 * params.dumps
    return total


def run_scenario(
    config_path: Path,
    params: DemoParams,
    scenario: int,
    on_progress: Callable[[int], None] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Launch ``scenario`` under ``mpiexec -n params.ranks``; what rank 0 reports."""
    from strataio.predict.ranks import launch

    args = launch_args(os.fspath(config_path), params, scenario)
    return launch(
        params.ranks, "strataio.demo.astro3d", args, on_progress=on_progress, timeout=timeout
    )


def run_demo(
    config_path: Path,
    params: DemoParams,
    scenarios: list[int],
    perf: Any,
    on_start: Callable[[int, int], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> list[ScenarioResult]:
    """Predict and run each scenario in turn. ``on_start(scenario, total)`` before each
    launch, ``on_progress(k)`` as its ranks advance."""
    from strataio.config import load_config

    config = load_config(config_path)
    results = []
    for s in scenarios:
        predicted = predict_scenario(config, params, s, perf)
        backend_only = sum(predict_scenario(config, params, s, perf, tiered=False).values())
        if on_start is not None:
            on_start(s, progress_total(params, s))
        got = run_scenario(config_path, params, s, on_progress)
        measured = dict.fromkeys(COMPONENTS, 0.0) | got["measured"]
        results.append(
            ScenarioResult(
                s,
                SCENARIOS[s][0],
                predicted,
                measured,
                backend_only,
                [tuple(x) for x in got["mse"]],
                got["images"],
                got["viewed"],
            )
        )
    return results


def plot_results(results: list[ScenarioResult], path: Path, subtitle: str = "") -> None:
    """A bar chart of predicted and measured I/O seconds per scenario, stacked by component
    (the paper's Figures 9 and 10 side by side)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(results))
    width = 0.38
    colors = dict(zip(COMPONENTS, ("#4C72B0", "#DD8452", "#55A868", "#C44E52")))
    fig, ax = plt.subplots(figsize=(9, 5))
    for offset, which, hatch in ((-width / 2, "predicted", "//"), (width / 2, "measured", "")):
        bottom = np.zeros(len(results))
        for comp in COMPONENTS:
            vals = np.array([getattr(r, which)[comp] for r in results])
            ax.bar(
                x + offset,
                vals,
                width,
                bottom=bottom,
                color=colors[comp],
                hatch=hatch,
                edgecolor="white",
                label=f"{comp} ({which})",
            )
            bottom += vals
        for xi, total in zip(x + offset, bottom):
            ax.text(xi, total, f"{total:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [f"({r.scenario})" for r in results])
    ax.set_xlabel("Figure 9 scenario (left bar: predicted, hatched; right bar: measured)")
    ax.set_ylabel("I/O time (s)")
    ax.set_title(
        "Astro3D pipeline: predicted vs measured I/O time" + (f"\n{subtitle}" if subtitle else ""),
        fontsize=10,
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
