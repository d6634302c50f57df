"""Pipelined collective I/O (``strataio_pipeline_groups``): the groups, the hint, and the
bytes: pipelined equals plain two-phase and ROMIO, bit for bit, on random views under
mpiexec at 1, 2 and 4 ranks (``tests/mpi_scripts/pipeline_diff.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import strataio
from mpirun import run_mpi
from strataio.collective.hints import parse_hints
from strataio.collective.pipeline import pipeline_groups
from strataio.errors import HintError


@pytest.mark.mpi
@pytest.mark.parametrize(("nprocs", "cases"), [(1, 10), (2, 10), (4, 4)])
def test_pipelined_equals_plain_and_romio(nprocs: int, cases: int, tmp_path: Path) -> None:
    args = ["--seed", 500 + nprocs, "--cases", cases, "--dir", tmp_path]
    out = run_mpi(nprocs, "pipeline_diff.py", *args, timeout=120)
    assert f"ok {cases}" in out


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_pipelined_equals_plain_and_romio_long(nprocs: int, seed: int, tmp_path: Path) -> None:
    args = ["--seed", seed * 7919 + nprocs, "--cases", 12, "--dir", tmp_path]
    assert "ok 12" in run_mpi(nprocs, "pipeline_diff.py", *args, timeout=300)


@pytest.mark.mpi
def test_failed_pipelined_read_raises_everywhere_and_leaves_no_io_behind(tmp_path: Path) -> None:
    """An aggregator's read fails while its I/O thread still has work: every rank raises, and
    the next pipelined write through the same realm buffers writes every byte."""
    out = run_mpi(2, "two_phase_failure_overlap.py", tmp_path, 2)
    assert json.loads(out.strip().splitlines()[-1]) == {
        "read": ["BackendError", "BackendError"],
        "wrong": 0,
    }


def test_groups_split_the_aggregators_in_rank_order() -> None:
    hints = parse_hints({"strataio_pipeline_groups": "2", "cb_nodes": "4"}, nprocs=4)
    aggs = np.array([3, 0, 2, 1])  # (realm order need not be rank order)
    groups = [pipeline_groups(hints, aggs, r) for r in range(4)]
    assert all(g is not None for g in groups)
    assert [g.mine for g in groups] == [0, 0, 1, 1]
    g0 = groups[0]
    assert g0.count == 2 and g0.ranks(0) == (0, 2) and g0.ranks(1) == (2, 4)
    assert g0.steps(2) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert g0.background
    # uneven: 3 aggregators in 2 groups, a client that does not aggregate
    odd = pipeline_groups(hints, np.array([0, 2, 4]), 3)
    assert odd is not None and odd.mine == -1 and odd.ranks(1) == (2, 5)


def test_one_group_is_plain_two_phase_and_groups_are_clamped() -> None:
    assert pipeline_groups(parse_hints(None), np.array([0, 1]), 0) is None
    one_node = parse_hints({"strataio_pipeline_groups": 4}, nprocs=4)  # cb_nodes 1 per node
    assert one_node.strataio_pipeline_groups == 1
    four = parse_hints({"strataio_pipeline_groups": 4, "cb_nodes": 2}, nprocs=4)
    assert four.strataio_pipeline_groups == 2
    assert pipeline_groups(four, np.array([0]), 0) is None  # one aggregator: one group
    off = parse_hints(
        {"strataio_pipeline_groups": 2, "cb_nodes": 2, "strataio_cb_overlap": "disable"}, 2
    )
    groups = pipeline_groups(off, np.array([0, 1]), 1)
    assert groups is not None and not groups.background


def test_hint_is_shown_clamped_and_checked(tmp_path: Path) -> None:
    with pytest.raises(HintError, match="strataio_pipeline_groups"):
        parse_hints({"strataio_pipeline_groups": "0"})
    with strataio.File.open(
        None, tmp_path / "f", "w", hints={"strataio_pipeline_groups": "4"}
    ) as f:
        assert f.hints["strataio_pipeline_groups"] == "1"  # one rank: one aggregator
