"""The offline mutator proposes real, admissible SEARCH/REPLACE edits inside the EVOLVE block."""
import asyncio

import pytest
from openevolve.utils.code_utils import apply_diff_blocks, extract_diffs

from evaluator.admission import admit, load_policy
from search.offline import OfflineMutator
from simcore.packaged import SEED_FILES, seed_source
from simcore.pcb import InstanceView, ProgramView, Signals

VIEW = ProgramView(program_id="p", arrival_s=1.0, turn_index=3, turns_completed=3, attained_service_s=12.5,
                   context_tokens=9000, last_instance=0, kv_resident=True, kv_resident_tokens=9000,
                   kv_protected=True, protect_until=40.0, kv_tier="device", tool_name="bash",
                   gap_started_s=30.0, release_s=31.0, returned_tool_durations=(0.4, 2.5),
                   returned_tool_names=("bash", "bash"), completed_output_tokens=(100, 80, 60),
                   completed_prompt_tokens=(3000, 6000, 8000))
INST = (InstanceView(0, 3, 1, 0.8, 20000, True), InstanceView(1, 1, 0, 0.3, 90000, False))


def propose(code, iteration, seed=0):
    m = OfflineMutator(seed=seed)
    return asyncio.run(m.generate_with_context("", [{"role": "user", "content": ""}],
                                               parent_code=code, iteration=iteration))


def decide(pol, axis):
    pol.bind(Signals(now=35.0, kv_utilization=0.7, instances=INST))
    if axis == "scheduling":
        return pol.priority(VIEW, 35.0)
    if axis == "routing":
        return pol.select(VIEW, INST, 35.0)
    return pol.on_turn_complete(VIEW, "r1", 35.0), pol.on_turn_arrival(VIEW, 35.0)


@pytest.mark.parametrize("axis", sorted(SEED_FILES))
def test_chains_of_edits_stay_admissible_and_runnable(axis):
    seed = seed_source(axis)
    code, changed = seed, 0
    for it in range(25):
        diffs = extract_diffs(propose(code, it, seed=3))
        assert diffs, "every answer carries at least one SEARCH/REPLACE block"
        child, applied = apply_diff_blocks(code, diffs)
        assert applied == len(diffs)
        admit(child, axis, seed)                 # only the block changed; gate and allow-list pass
        pol = load_policy(child, axis)
        try:
            decide(pol, axis)
        finally:
            getattr(pol, "close", lambda: None)()
        changed += child != code
        code = child
    assert changed >= 20


def test_scheduling_edits_use_observable_terms_and_change_decisions():
    seed = seed_source("scheduling")
    seen = set()
    prios = set()
    for it in range(150):
        child, _ = apply_diff_blocks(seed, extract_diffs(propose(seed, it)))
        block = child.split("EVOLVE-BLOCK-START")[1]
        for field in ("context_tokens", "kv_resident", "sqrt", "log1p", "turns_completed", "arrival_s"):
            if field in block:
                seen.add(field)
        if it < 30:
            pol = load_policy(child, "scheduling")
            try:
                prios.add(decide(pol, "scheduling"))
            finally:
                getattr(pol, "close", lambda: None)()
    assert {"context_tokens", "kv_resident"} <= seen and ({"sqrt", "log1p"} & seen)
    assert len(prios) > 5


def test_proposals_are_a_function_of_seed_iteration_and_parent():
    seed = seed_source("scheduling")
    assert propose(seed, 5, seed=1) == propose(seed, 5, seed=1)
    assert len({propose(seed, i, seed=1) for i in range(20)}) > 3
    assert len({propose(seed, 5, seed=s) for s in range(20)}) > 3


def test_without_parent_code_it_reads_the_program_from_the_prompt():
    seed = seed_source("scheduling")
    prompt = f"# Current Program\n```python\n{seed}\n```\n# Task\n..."
    ans = asyncio.run(OfflineMutator(seed=0).generate("x" + prompt))
    assert apply_diff_blocks(seed, extract_diffs(ans))[1] >= 1
