"""The exported policy runs unchanged through the runtime shim."""
from __future__ import annotations

import hashlib

import {{PACKAGE}} as pkg
from {{PACKAGE}}.runtime import BASES, ProgramView, RetentionDecision, Signals, parse_priority, parse_retention


def sample_view(**kw) -> ProgramView:
    base = dict(program_id="p0", arrival_s=0.0, turn_index=1, turns_completed=1, attained_service_s=2.5,
                context_tokens=4000, last_instance=0, kv_resident=True, kv_resident_tokens=3968,
                kv_protected=False, protect_until=None, kv_tier="device", tool_name="bash", gap_started_s=3.0,
                release_s=5.0, returned_tool_durations=(2.0,), returned_tool_names=("bash",),
                completed_output_tokens=(120,), completed_prompt_tokens=(3800,))
    base.update(kw)
    return ProgramView(**base)


def test_policy_file_is_the_candidate_unchanged():
    assert hashlib.sha256(pkg.POLICY_FILE.read_bytes()).hexdigest() == pkg.METADATA["policy_sha256"]


def test_policy_loads_and_decides():
    pol = pkg.policy()
    axis = pkg.METADATA["axis"]
    assert isinstance(pol, BASES[axis])
    pol.bind(Signals(now=5.0, kv_utilization=0.5))
    v = sample_view()
    if axis == "scheduling":
        assert isinstance(parse_priority(pol.priority(v, 5.0)), int)
    elif axis == "retention":
        assert isinstance(parse_retention(pol.on_turn_complete(v, "p0/1", 5.0)), RetentionDecision)
        assert isinstance(parse_retention(pol.on_turn_arrival(v, 5.0)), RetentionDecision)
