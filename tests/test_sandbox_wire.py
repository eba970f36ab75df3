"""What crosses the pipe: only the observation fields a candidate's source can read, and one
CPU shared by the simulator thread and its worker for the length of a run."""
from __future__ import annotations

import os
import textwrap

import pytest

from sandbox.client import load_sandboxed_policy
from sandbox.gate import AXIS_BASES, check_source
from sandbox.wire import ViewEncoder, select_fields
from simcore.pcb import observation_schema
from simcore.policies.registry import policy_class_from_source
from simcore.sim import simulate
from tests.test_sandbox_worker import Died, pview, sig, worker_views


def wire_of(body: str, axis: str = "scheduling") -> dict:
    return select_fields(check_source(f"class P({AXIS_BASES[axis]}):\n" + textwrap.indent(body, "    "),
                                      axis).observed_names)


def test_only_named_fields_are_sent():
    w = wire_of("def priority(self, pcb, now):\n    return int(pcb.attained_service_s)\n")
    assert w == {"view": ["program_id", "attained_service_s"], "hist": [], "inst": [], "signals": None}


def test_derived_members_bring_the_fields_they_read():
    w = wire_of("def priority(self, pcb, now):\n"
                "    g = pcb.gap_elapsed_s(now)\n"
                "    return sum(i.inflight for i in self.signals.instances) + len(pcb.returned_tool_names)\n")
    assert w["view"] == ["program_id", "gap_started_s"] and w["hist"] == ["returned_tool_names"]
    assert w["inst"] == ["running", "waiting"] and w["signals"] == ["instances"]


@pytest.mark.parametrize("expr", ["repr(pcb)", "str(pcb)", "ascii(pcb)", "hash(pcb)", "f'{pcb}'",
                                  "'%s' % (pcb,)"])
def test_whole_view_text_or_hash_sends_everything(expr: str):
    """Text and hashes of a view must be what they are in-process, so all fields go."""
    w = wire_of(f"def priority(self, pcb, now):\n    return len({expr})\n")
    assert w == select_fields(None)
    assert w["view"] + w["hist"] == observation_schema()["ProgramView"]["fields"]


def test_arithmetic_modulo_keeps_the_selection():
    w = wire_of("def priority(self, pcb, now):\n    return pcb.turn_index % 2\n")
    assert w["view"] == ["program_id", "turn_index"]


def test_signals_go_when_the_source_reads_them_or_overrides_bind():
    assert wire_of("def priority(self, pcb, now):\n    return 0\n")["signals"] is None
    w = wire_of("def bind(self, s):\n    self.t = s.now\ndef priority(self, pcb, now):\n    return 0\n")
    assert w["signals"] == ["now"]


def test_unsent_fields_are_a_reason_not_a_made_up_value():
    """A field left out is never read silently: the worker stops with a reason."""
    wire = select_fields(frozenset({"context_tokens", "completed_output_tokens"}))
    enc = ViewEncoder(wire)
    w = worker_views(wire)
    try:
        v = pview(k=3)
        got = w.make_view(enc.view(v))
        assert got.context_tokens == v.context_tokens and got.completed_output_tokens == v.completed_output_tokens
        with pytest.raises(Died, match="ProgramView.attained_service_s"):
            got.attained_service_s  # noqa: B018
        with pytest.raises(Died, match="prints a whole ProgramView"):
            repr(got)
        s = w.make_signals(enc.signals(sig(), 8.0))
        assert len(enc.signals(sig(), 8.0)) == 0
        with pytest.raises(Died, match="Signals.kv_utilization"):
            s.kv_utilization  # noqa: B018
    finally:
        worker_views()


HISTORY_AND_SIGNALS = '''
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        busy = sum(i.inflight for i in self.signals.instances)
        tail = pcb.returned_tool_durations[-3:]
        g = pcb.gap_elapsed_s(now) or 0.0
        return int(1000 * sum(tail)) + busy + int(g) + len(pcb.completed_output_tokens)
'''


def test_selected_fields_make_the_same_decisions_as_in_process():
    cls = policy_class_from_source(HISTORY_AND_SIGNALS, "scheduling")
    log_a: list = []
    simulate("rtx70b_swe10_0.1", decision_log=log_a, scheduling=cls())
    pol = load_sandboxed_policy(HISTORY_AND_SIGNALS, "scheduling")
    assert pol.sandbox.wire["view"] == ["program_id", "gap_started_s"]
    try:
        log_b: list = []
        simulate("rtx70b_swe10_0.1", decision_log=log_b, scheduling=pol)
    finally:
        pol.close()
    assert log_a == log_b and len(log_a) > 100


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_session_pins_thread_and_worker_then_restores(tmp_path, monkeypatch):
    from sandbox import cpus, process
    # private lock files: a search running elsewhere on this machine must not hold our CPUs
    monkeypatch.setattr(cpus, "_lock_path", lambda c: str(tmp_path / f"cpu{c}.lock"))
    pol = load_sandboxed_policy("class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n"
                                "        return pcb.turn_index\n", "scheduling")
    before = os.sched_getaffinity(0)
    try:
        with pol.simulation_run():
            inside = os.sched_getaffinity(0)
            if process.getcpu is not None:  # Linux/glibc: the run is pinned
                assert pol.sandbox.pinned
                assert len(inside) == 1 and os.sched_getaffinity(pol.sandbox.pid) == inside
            pol.bind(sig())
            assert pol.priority(pview(k=4), 1.0) == 4
        assert os.sched_getaffinity(0) == before and not pol.sandbox.pinned
        simulate("rtx70b_swe10_0.1", scheduling=pol)  # simulate enters simulation_run itself
        assert os.sched_getaffinity(0) == before
    finally:
        pol.close()


def test_cpu_claims_are_exclusive_across_threads_and_processes(tmp_path):
    import subprocess
    import sys

    from sandbox import cpus
    path = lambda c: str(tmp_path / f"cpu{c}.lock")  # noqa: E731
    a = cpus.claim({0, 1}, here=1, lock_path=path)
    assert a is not None and a.cpu == 1                      # the current CPU first
    b = cpus.claim({0, 1}, here=1, lock_path=path)
    assert b is not None and b.cpu == 0                      # then a free one
    assert cpus.claim({0, 1}, here=0, lock_path=path) is None  # none free: do not pin
    code = ("import sys; from sandbox import cpus; "
            f"c = cpus.claim({{0}}, 0, lambda c: {str(tmp_path)!r} + '/cpu%d.lock' % c); "
            "sys.exit(0 if c is None else 1)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0   # held by this process
    b.release()
    assert subprocess.run([sys.executable, "-c", code]).returncode == 1   # released: free again
    a.release()
    a.release()  # idempotent
