"""A superfile's life against a dict oracle: put, get, flush (seal a container), reopen, drop
containers from the prefetch cache, tiers full (a put or flush whose container no tier
takes), and a bench run at a tiny size."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import strataio
from strataio.errors import ChunksNotStoredError
from strataio.storage.posix import PosixBackend
from strataio.storage.superfile import MemberNotFoundError
from strataio.tiers.fsck import fsck
from strataio.tiers.tier import Tier, TierSet

NAMES = st.sampled_from([f"m{i}" for i in range(12)])
CACHE = 1500  # a few containers: reads keep evicting


def value(seed: int, kind: int):
    if kind == 0:
        return bytes([seed % 256]) * (seed % 300)
    rng = np.random.default_rng(seed)
    return rng.integers(0, 255, size=(seed % 7 + 1, 9), dtype=np.uint8)


def same(a, b) -> bool:
    if isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


class SuperfileMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="strataio-sf-sm-"))
        self.oracle: dict[str, object] = {}
        self.full = False
        self._open()

    def _open(self) -> None:
        tiers = TierSet(
            [
                Tier("disk", PosixBackend(self.root / "disk"), "localdisk", order=0),
                Tier("tape", PosixBackend(self.root / "tape"), "remotetape", order=1),
            ]
        )
        self.s = strataio.Session(tiers=tiers, catalog=self.root / "c.db", cache_bytes=CACHE)
        self.sf = self.s.superfile("sf", hint="LOCALDISK", container_bytes=400)

    @rule(name=NAMES, seed=st.integers(0, 10_000), kind=st.integers(0, 1))
    def put(self, name, seed, kind):
        v = value(seed, kind)
        try:
            self.sf.put(name, v)
        except ChunksNotStoredError:
            assert self.full  # (refused: the member is not put, its earlier value stays)
            return
        self.oracle[name] = v

    @rule(name=NAMES)
    def get(self, name):
        if name in self.oracle:
            assert same(self.sf.get(name), self.oracle[name])
        else:
            try:
                self.sf.get(name)
            except MemberNotFoundError:
                pass
            else:
                raise AssertionError(f"{name} read back though never put")

    @rule()
    def flush(self):
        try:
            self.sf.flush()
        except ChunksNotStoredError:
            assert self.full  # (the open container's members wait for the next seal)

    @rule()
    def fill_tiers(self):
        """No tier has room for another container (their capacity is what they hold)."""
        for t in self.s.tiers:
            t.capacity = t.used + t.reserved
        self.full = True

    def _give_room(self):
        for t in self.s.tiers:
            t.capacity = None
        self.full = False

    @rule()
    def give_room(self):
        self._give_room()

    @rule()
    def reopen(self):
        self._give_room()
        self.s.close()  # closes (and seals) the superfile too
        self._open()

    @rule()
    def evict_from_cache(self):
        self.s.cache.invalidate("sf")

    @precondition(lambda self: self.oracle and not self.full)
    @rule()
    def migrate_to_tape(self):
        self.sf.migrate("tape").wait()

    @invariant()
    def members_match(self):
        assert self.sf.members() == sorted(self.oracle)

    @invariant()
    def cache_within_bound(self):
        assert self.s.cache.nbytes <= CACHE

    def teardown(self):
        try:
            self._give_room()
            for name, v in self.oracle.items():
                assert same(self.sf.get(name), v)
            self.sf.close()
            assert fsck(self.s.catalog, self.s.tiers).clean
        finally:
            self.s.close()
            shutil.rmtree(self.root, ignore_errors=True)


SuperfileMachine.TestCase.settings = settings(
    max_examples=12,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSuperfileMachine = SuperfileMachine.TestCase


def test_bench_superfile_tiny(tmp_path):
    from strataio.cli import main

    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        main,
        ["bench", "superfile", "--counts", "8", "--size", "4KiB", "--time-scale", "0",
         "--sweep", "8KiB,64KiB", "--json", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "superfile" in res.output
    got = json.loads(out.read_text())
    (disk, tape) = got["rows"]
    assert (disk["files_requests"], disk["superfile_requests"]) == (8, 1)
    assert disk["speedup_model"] > 1 and tape["speedup_model"] > disk["speedup_model"]
    # 8 KiB containers hold two 4 KiB files: four reads instead of one
    assert [r["requests"] for r in got["sweep"] if r["preset"] == "remote_disk_2002"] == [4, 1]


def test_bench_superfile_names_an_unknown_preset_as_a_usage_error(tmp_path):
    from strataio.cli import main

    for presets, says in (("remote_disk_2002,fast", "'fast'"), (",", "none named")):
        res = CliRunner().invoke(main, ["bench", "superfile", "--presets", presets])
        assert res.exit_code == 2, res.output
        assert says in res.output and "known: remote_disk_2002, remote_tape_2002" in res.output
