"""Policies: shipped ones run, the paper's listings run unchanged, the causal boundary holds."""
from __future__ import annotations

import dataclasses

import pytest

from simcore.pcb import OBSERVABLE_INSTANCE_FIELDS, OBSERVABLE_PCB_FIELDS, InstanceView, ProgramView, Signals
from simcore.policies.base import (
    PolicyError,
    RetentionPolicy,
    RoutingPolicy,
    SchedulingPolicy,
    parse_priority,
    parse_retention,
)
from simcore.policies.registry import AXES, load_policy, policy_names
from simcore.sim import simulate
from tests.helpers import EXPECTED_PCB_FIELDS, LISTINGS


def test_observation_schema_is_the_allow_list():
    assert OBSERVABLE_PCB_FIELDS == EXPECTED_PCB_FIELDS
    assert OBSERVABLE_INSTANCE_FIELDS == {"index", "running", "waiting", "kv_utilization", "free_tokens",
                                          "holds_program_kv"}


def test_every_shipped_policy_runs():
    for axis in AXES:
        for name in policy_names(axis):
            res = simulate("rtx70b_swe10_0.1" if axis != "routing" else "b200x4_8b_swe_0.1", **{axis: name})
            assert res.summary["programs"] > 0


_PRIMITIVE = (int, float, str, bool, type(None))


def _walk(x, path="pcb"):
    """Every value reachable from an observation is a primitive or a tuple of them."""
    if isinstance(x, _PRIMITIVE):
        return
    if isinstance(x, tuple) and not dataclasses.is_dataclass(x):
        for i, v in enumerate(x):
            _walk(v, f"{path}[{i}]")
        return
    if isinstance(x, (ProgramView, Signals, InstanceView)):
        for f in dataclasses.fields(x):
            _walk(getattr(x, f.name), f"{path}.{f.name}")
        return
    raise AssertionError(f"{path} exposes a {type(x).__name__}")


class _Spy:
    seen: list = []

    def _record(self, pcb):
        assert type(pcb) is ProgramView
        assert not hasattr(pcb, "__dict__")          # slots only: nothing attached on the side
        _walk(pcb)
        _walk(self.signals, "signals")
        self.seen.append(pcb)


class SpyRetention(_Spy, RetentionPolicy):
    def on_turn_complete(self, pcb, request_id, now):
        self._record(pcb)
        # The completed call's output is revealed; the *next* prompt is not.
        assert len(pcb.completed_output_tokens) == pcb.turns_completed
        return ("protect", now + 1.0)

    def on_turn_arrival(self, pcb, now):
        self._record(pcb)
        assert len(pcb.returned_tool_durations) == pcb.turn_index
        return "release"


class SpyScheduling(_Spy, SchedulingPolicy):
    def priority(self, pcb, now):
        self._record(pcb)
        assert pcb.turns_completed == pcb.turn_index   # the running call's output is hidden
        return int(pcb.attained_service_s * 1000)


class SpyRouting(_Spy, RoutingPolicy):
    def select(self, pcb, inflight, now):
        self._record(pcb)
        for v in inflight:
            _walk(v, "inflight")
        return pcb.turn_index % len(inflight)


def test_policies_receive_no_hidden_field():
    _Spy.seen = []
    simulate("b200x4_8b_swe_0.1", retention=SpyRetention(), scheduling=SpyScheduling(), routing=SpyRouting())
    assert len(_Spy.seen) > 100
    for v in _Spy.seen:
        assert {f.name for f in dataclasses.fields(v)} == OBSERVABLE_PCB_FIELDS


@pytest.mark.parametrize("listing,axis", [("retention_ttl_seed.py", "retention"), ("retention_evolved.py", "retention"),
                                          ("scheduling_plas_seed.py", "scheduling"),
                                          ("scheduling_evolved.py", "scheduling")])
def test_paper_listings_run_unchanged(listing, axis):
    res = simulate("rtx70b_swe10_0.1", **{axis: str(LISTINGS / listing)})
    assert res.summary["calls"] > 0


def test_plas_listing_equals_shipped_plas():
    a = simulate("rtx70b_swe10_0.1", retention="ttl", scheduling=str(LISTINGS / "scheduling_plas_seed.py"))
    b = simulate("rtx70b_swe10_0.1", retention="ttl", scheduling="plas")
    assert a.jct_s == b.jct_s


def test_evolved_scheduling_beats_its_plas_seed_on_target_cell():
    seed = simulate("rtx70b_swe_0.1", retention="ttl", scheduling=str(LISTINGS / "scheduling_plas_seed.py"))
    evo = simulate("rtx70b_swe_0.1", retention="ttl", scheduling=str(LISTINGS / "scheduling_evolved.py"))
    assert evo.summary["mean_jct_s"] < seed.summary["mean_jct_s"]


@pytest.mark.parametrize("bad", ["protect", ("protect",), ("protect", float("nan")), ("protect", 1.0, 2.0, "x"),
                                 "keep", 42, ("evict", 1)])
def test_malformed_retention_decisions_are_rejected(bad):
    with pytest.raises(PolicyError):
        parse_retention(bad)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1", None, True, [1]])
def test_malformed_priorities_are_rejected(bad):
    with pytest.raises(PolicyError):
        parse_priority(bad)


def test_huge_priority_is_clamped_not_fatal():
    assert parse_priority(10**40) == 2**62


def test_unknown_policy_lists_the_shipped_ones():
    with pytest.raises(PolicyError, match="shipped: .*plas"):
        load_policy("scheduling", "nope")


def test_policy_that_raises_fails_the_run_with_one_line():
    class Boom(SchedulingPolicy):
        def priority(self, pcb, now):
            raise ZeroDivisionError("x")
    with pytest.raises(PolicyError, match="Boom.priority raised ZeroDivisionError"):
        simulate("rtx70b_swe10_0.1", scheduling=Boom())


def test_policy_file_with_a_dataclass_loads_in_process():
    # The loader must not pass its own `from __future__ import annotations` to the file.
    from tests.helpers import ROOT
    res = simulate("rtx70b_swe10_0.1", scheduling=str(ROOT / "tests" / "data" / "dataclass_policy.py"))
    assert res.summary["calls"] > 0
