"""Deferred priorities (simcore/policies/base.py): a scheduling policy may answer priorities
in batches, when the engine first needs an order. The decisions, the decision log and every
metric must be exactly those of calling `priority` at each release."""
from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.policies.base import SchedulingPolicy
from simcore.policies.registry import load_policy
from simcore.sim import simulate
from simcore.workload import poisson_arrivals

from tests.helpers import chain_programs, small_cell


class Scrambled(SchedulingPolicy):
    """Priorities with many ties and no relation to arrival order: every ordering rule of
    the queue (priority, then arrival, then id) and the preemption victim get exercised."""
    engine_args = {"scheduling_policy": "priority"}

    def __init__(self) -> None:
        self.n = 0

    def priority(self, pcb, now):
        self.n += 1  # state: the answer depends on the order of the calls as well
        return (sum(map(ord, pcb.program_id)) % 5) * 3 + (self.n * 7 + pcb.turn_index) % 3


class Deferring(SchedulingPolicy):
    """Wraps a policy: the same calls, with the same views and signals, answered later."""
    defers_priority = True

    def __init__(self, inner: SchedulingPolicy) -> None:
        self.inner = inner
        self.engine_args = inner.engine_args
        self.queue: list = []
        self.batches: list[int] = []

    def defer_priority(self, pcb, now):
        self.queue.append((pcb, now, self.signals))

    def collect_priorities(self):
        out = []
        for pcb, now, signals in self.queue:
            self.inner.bind(signals)
            out.append(self.inner.priority(pcb, now))
        self.batches.append(len(self.queue))
        self.queue = []
        return out


def _both(make, cell, **kw):
    eager_log: list = []
    eager = simulate(cell, scheduling=make(), decision_log=eager_log, **kw)
    pol = Deferring(make())
    lazy_log: list = []
    lazy = simulate(cell, scheduling=pol, decision_log=lazy_log, **kw)
    return eager, eager_log, lazy, lazy_log, pol


def _same(eager, eager_log, lazy, lazy_log):
    assert lazy_log == eager_log
    pd.testing.assert_frame_equal(lazy.programs, eager.programs)
    pd.testing.assert_frame_equal(lazy.calls, eager.calls)


@pytest.mark.parametrize("make", [lambda: load_policy("scheduling", "plas"), Scrambled,
                                  lambda: load_policy("scheduling", "fcfs")],
                         ids=["plas", "scrambled", "fcfs"])
@pytest.mark.parametrize("cell", ["rtx70b_swe10_0.1", "b200x4_8b_swe_0.5"])
def test_deferred_priorities_decide_exactly_as_eager_ones(make, cell):
    eager, eager_log, lazy, lazy_log, pol = _both(make, cell)
    _same(eager, eager_log, lazy, lazy_log)
    calls = sum(1 for e in eager_log if e[1] == "scheduling")
    assert sum(pol.batches) == calls
    # fewer collections than calls: orders are needed only when two or more wait
    assert len(pol.batches) < calls
    if make().engine_args.get("scheduling_policy") == "fcfs":
        assert len(pol.batches) == 1  # FCFS never needs a priority: one batch, at the end


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(progs=chain_programs(min_size=2, max_size=10), rate=st.floats(0.5, 30.0), instances=st.sampled_from([1, 2]),
       policy=st.sampled_from(["plas", "scrambled"]))
def test_deferred_priorities_match_under_preemption(progs, rate, instances, policy):
    biggest = max(c.prompt_tokens + c.output_tokens for p in progs for c in p.calls)
    # a pool barely larger than the biggest call: preemption and queueing on every draw
    cell = small_cell("rtx70b_swe10_0.1", kv_pool_tokens=biggest + 64, max_num_batched_tokens=256,
                      max_num_seqs=4, instances=instances)
    make = Scrambled if policy == "scrambled" else (lambda: load_policy("scheduling", "plas"))
    arrivals = poisson_arrivals(len(progs), rate, 1)
    _same(*_both(make, cell, programs=progs, arrivals=arrivals)[:4])


def test_a_failing_deferred_priority_fails_the_simulation():
    from simcore.policies.base import PolicyError

    class Bad(Scrambled):
        def priority(self, pcb, now):
            if self.n == 5:
                raise ValueError("fifth")
            return super().priority(pcb, now)

    with pytest.raises(PolicyError, match="fifth"):
        simulate("rtx70b_swe10_0.1", scheduling=Deferring(Bad()))
