"""Counterfactual leakage checker: causal policies pass; oracles fed hidden data are caught."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sandbox import SandboxViolation
from sandbox.check import smoke_cell
from sandbox.client import load_sandboxed_policy
from sandbox.leakage import check_leakage, perturb_future
from simcore.config import get_cell
from simcore.policies.base import RetentionPolicy, RoutingPolicy, SchedulingPolicy
from simcore.policies.registry import SHIPPED, load_policy, policy_class_from_source
from simcore.sim import cell_programs, simulate
from tests.test_sandbox_gate import LISTINGS

CELL = get_cell("rtx70b_swe10_0.1")
PROGRAMS = cell_programs(CELL, CELL.seed)


class Leaky:
    """A view with one hidden value bolted on: the deliberately leaky observation."""

    def __init__(self, view, **hidden) -> None:
        self._view = view
        for k, v in hidden.items():
            object.__setattr__(self, k, v)

    def __getattr__(self, name: str):
        return getattr(self._view, name)


def leaky_hook(pcb, view):
    calls = pcb.program.calls
    k = pcb.turn if pcb.release_s is not None else pcb.turns_completed - 1
    nxt = calls[k + 1] if k + 1 < len(calls) else None
    return Leaky(view, remaining_output_tokens=calls[pcb.turn].output_tokens,
                 true_tool_duration_s=calls[k].tool_duration_s,
                 next_prompt_tokens=nxt.prompt_tokens if nxt else 0,
                 remaining_calls=len(calls) - pcb.turns_completed)


class OracleSJF(SchedulingPolicy):
    """Shortest-remaining-output first: needs the running call's output length."""
    def priority(self, pcb, now):
        return pcb.remaining_output_tokens


class OracleToolTTL(RetentionPolicy):
    """Protect exactly as long as the tool will run: needs the running tool's duration."""
    def on_turn_complete(self, pcb, request_id, now):
        return ("protect", now + pcb.true_tool_duration_s + 0.01)


class OracleNextPrompt(RetentionPolicy):
    """Protect longer for a longer next prompt: needs a future prompt."""
    def on_turn_complete(self, pcb, request_id, now):
        return ("protect", now + pcb.next_prompt_tokens / 10000.0)


class OracleRemainingCalls(SchedulingPolicy):
    """Fewest remaining calls first: needs the program's future length."""
    def priority(self, pcb, now):
        return pcb.remaining_calls


@pytest.mark.parametrize("axis,name", [(a, n) for a in ("retention", "scheduling", "routing") for n in SHIPPED[a]])
def test_shipped_policies_do_not_leak(axis: str, name: str):
    cell = smoke_cell(CELL, axis)
    rep = check_leakage(lambda _p: load_policy(axis, name), axis, cell, PROGRAMS)
    assert rep.ok, rep.reason
    assert rep.runs == 5 and rep.decisions_compared > 300 and rep.perturbed_values > 300


@pytest.mark.parametrize("name", sorted(LISTINGS))
def test_paper_listings_do_not_leak(name: str):
    axis, src = LISTINGS[name]
    cls = policy_class_from_source(src, axis)
    rep = check_leakage(lambda _p: cls(), axis, CELL, PROGRAMS)
    assert rep.ok, rep.reason


@pytest.mark.parametrize("oracle,axis", [(OracleSJF, "scheduling"), (OracleToolTTL, "retention"),
                                         (OracleNextPrompt, "retention"), (OracleRemainingCalls, "scheduling")])
def test_positive_controls_are_caught(oracle, axis: str):
    rep = check_leakage(lambda _p: oracle(), axis, CELL, PROGRAMS, view_hook=leaky_hook)
    assert not rep.ok
    assert rep.reason.startswith("leaks future information") and "\n" not in rep.reason


def test_the_same_policy_without_the_leak_passes():
    """Control for the control: the hook alone (a causal policy) must not be flagged."""
    class Causal(SchedulingPolicy):
        def priority(self, pcb, now):
            return pcb.context_tokens
    rep = check_leakage(lambda _p: Causal(), "scheduling", CELL, PROGRAMS, view_hook=leaky_hook)
    assert rep.ok, rep.reason


def test_sandbox_never_forwards_the_leaky_field():
    src = "class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n        return pcb.remaining_output_tokens\n"
    pol = load_sandboxed_policy(src, "scheduling")
    try:
        with pytest.raises(SandboxViolation, match="AttributeError"):
            simulate(CELL, programs=PROGRAMS, scheduling=pol, view_hook=leaky_hook)
    finally:
        pol.close()


def test_perturbation_changes_only_values_revealed_after_the_cut():
    log: list = []
    res = simulate(CELL, programs=PROGRAMS, decision_log=log)
    c = res.calls
    rel = {(p, int(k)): float(t) for p, k, t in zip(c["program_id"], c["turn"], c["release_s"])}
    fin = {(p, int(k)): float(t) for p, k, t in zip(c["program_id"], c["turn"], c["finish_s"])}
    cut = float(np.median(list(fin.values())))
    progs, n, reveals = perturb_future(PROGRAMS, rel, fin, cut, CELL.kv_pool_tokens, np.random.default_rng(1))
    assert n > 50 and [p.program_id for p in progs] == [p.program_id for p in PROGRAMS]
    kinds = {"output": 0, "tool": 0, "prompt": 0, "length": 0}
    for a, b in zip(PROGRAMS, progs):
        for k in range(min(len(a.calls), len(b.calls))):
            x, y = a.calls[k], b.calls[k]
            if x.output_tokens != y.output_tokens:
                assert fin[(a.program_id, k)] >= cut
                kinds["output"] += 1
            if x.prompt_tokens != y.prompt_tokens:
                assert rel[(a.program_id, k)] >= cut
                kinds["prompt"] += 1
            if x.tool_duration_s != y.tool_duration_s and k + 1 < len(a.calls) and k + 1 < len(b.calls):
                assert rel[(a.program_id, k + 1)] >= cut
                kinds["tool"] += 1
        if len(a.calls) != len(b.calls):
            k = min(len(a.calls), len(b.calls)) - 1
            assert fin[(a.program_id, k)] >= cut
            kinds["length"] += 1
        assert all(c.prompt_tokens + c.output_tokens <= CELL.kv_pool_tokens for c in b.calls)
    assert all(v > 0 for v in kinds.values()), kinds
    assert all(math.isfinite(c.tool_duration_s) for p in progs for c in p.calls)


def test_nondeterminism_is_not_mistaken_for_a_leak():
    class Coin(SchedulingPolicy):
        """Decides by object identity: differs from run to run, sees no future."""
        def __init__(self):
            self.seen = set()

        def priority(self, pcb, now):
            self.seen.add(object())
            return hash(min(self.seen, key=hash)) % 1000
    rep = check_leakage(lambda _p: Coin(), "scheduling", CELL, PROGRAMS)
    assert not rep.ok and rep.reason.startswith("nondeterministic decisions")


def test_routing_is_checked_on_two_instances_even_on_a_one_instance_cell():
    class LeakyRoute(RoutingPolicy):
        def select(self, pcb, inflight, now):
            return pcb.remaining_output_tokens % len(inflight)
    assert CELL.instances == 1
    rep = check_leakage(lambda _p: LeakyRoute(), "routing", CELL, PROGRAMS, view_hook=leaky_hook)
    assert not rep.ok and "select" in rep.reason


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("oracle", [OracleToolTTL, OracleNextPrompt])
def test_in_flight_oracles_are_caught_on_any_draw(oracle, seed: int):
    """Cuts sit just after a decision, so the value that decision must not see (the running
    tool's duration, the next prompt) is always among the perturbed ones: catching an oracle
    does not depend on a cut happening to fall inside a tool gap."""
    programs = cell_programs(CELL, seed)
    rep = check_leakage(lambda _p: oracle(), "retention", CELL, programs, seed=seed, view_hook=leaky_hook)
    assert not rep.ok and rep.reason.startswith("leaks future information"), rep.reason
