"""The exported client-side tracker computes the simulator's priorities when it observes
what a client observes: each call's start and end, its first scheduling, tokens and tool."""
from __future__ import annotations

import importlib
import json

import pytest

from tests.export_helpers import load_exported
from tests.runs_fixture import CELL, exported_package
from simcore.sim import cell_programs, simulate
from simcore.config import get_cell

# Reads every field a client can measure (not the KV ones: the engine knows those).
RICH_POLICY = '''
class Observed(SchedulingPolicy):
    def priority(self, pcb, now):
        s = pcb.attained_service_s * 1000.0 + pcb.context_tokens * 0.01 + pcb.turns_completed * 50.0
        s -= (now - pcb.arrival_s) * 10.0 + (now - (pcb.release_s or now)) * 100.0
        s += sum(pcb.completed_output_tokens) * 0.5 + sum(pcb.completed_prompt_tokens) * 0.001
        s += sum(pcb.returned_tool_durations) * 7.0 + len(pcb.returned_tool_names) * 3.0
        s += 13.0 if pcb.tool_name is not None else 0.0
        s += (pcb.gap_elapsed_s(now) or 0.0) * 11.0 + pcb.turn_index * 2.0
        return int(round(s))
'''


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    out = exported_package(tmp_path_factory, "scheduling")
    return load_exported(out)


def replay(pkg, policy_path: str) -> tuple[dict, dict]:
    """Simulate, then feed the tracker the per-call observations; return both priority maps."""
    log: list = []
    res = simulate(CELL, scheduling=policy_path, seed=0, decision_log=log)
    sim = {(pid, turn): d for _, axis, hook, pid, turn, d in log if axis == "scheduling"}
    tools = {p.program_id: [c.tool_name for c in p.calls] for p in cell_programs(get_cell(CELL), 0)}
    rt = importlib.import_module(pkg.__name__ + ".runtime")
    tr = importlib.import_module(pkg.__name__ + ".tracker")
    tracker = tr.ProgramTracker(rt.load_policy(policy_path, "scheduling"))
    got = {}
    for row in res.calls.sort_values(["program_id", "turn"]).itertuples():
        c = tracker.begin_call(row.program_id, row.prompt_tokens, now=row.release_s)
        got[(row.program_id, row.turn)] = c.priority
        tracker.end_call(c, row.prompt_tokens, row.output_tokens, tool_name=tools[row.program_id][row.turn],
                         now=row.finish_s, first_scheduled_s=row.first_scheduled_s)
    return sim, got


@pytest.mark.parametrize("which", ["seed", "rich"])
def test_tracker_priorities_equal_the_simulators(pkg, tmp_path, which):
    if which == "seed":
        path = str(pkg.POLICY_FILE)
    else:
        path = str(tmp_path / "observed.py")
        (tmp_path / "observed.py").write_text(RICH_POLICY)
    sim, got = replay(pkg, path)
    assert len(sim) == len(got) > 100
    assert got == sim
    assert len(set(sim.values())) > 10   # the comparison is not between constants


def test_tracker_without_first_scheduling_counts_queueing(pkg):
    tr = importlib.import_module(pkg.__name__ + ".tracker")
    t = tr.ProgramTracker(None)
    c = t.begin_call("p", 100, now=1.0)
    t.end_call(c, 100, 10, now=4.0)                        # no server timing: start -> end
    c = t.begin_call("p", 200, now=6.0)
    t.end_call(c, 200, 10, now=8.0, queued_s=0.5)          # server reported its queueing
    v = t.view("p", 9.0)
    assert v.attained_service_s == pytest.approx(3.0 + 1.5)
    assert v.returned_tool_durations == (2.0,) and v.turns_completed == 2 and v.gap_started_s == 8.0


def test_tracker_refuses_overlapping_calls(pkg):
    tr = importlib.import_module(pkg.__name__ + ".tracker")
    t = tr.ProgramTracker(None)
    t.begin_call("p", 1, now=0.0)
    with pytest.raises(ValueError, match="has not ended"):
        t.begin_call("p", 1, now=1.0)


def test_metadata_is_json(pkg):
    assert json.loads(pkg.POLICY_FILE.with_name("metadata.json").read_text())["axis"] == "scheduling"
