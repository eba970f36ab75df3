"""Helpers shared by the tests: small cells, a controllable step-time model, chain programs."""
from __future__ import annotations

from pathlib import Path

from simcore.config import EngineArgs, get_cell
from simcore.workload import Call, Program

ROOT = Path(__file__).resolve().parent.parent
LISTINGS = ROOT / "tests" / "data" / "listings"

# The deployable observation schema (DESIGN §2, "Causal observation boundary"), written out
# on purpose: simcore/pcb.py is its one definition, and adding a field there must be a
# conscious decision that also changes this line (tests compare the two).
EXPECTED_PCB_FIELDS = frozenset({
    "program_id", "arrival_s", "turn_index", "turns_completed", "attained_service_s", "context_tokens",
    "last_instance", "kv_resident", "kv_resident_tokens", "kv_protected", "protect_until", "kv_tier",
    "tool_name", "gap_started_s", "release_s", "returned_tool_durations", "returned_tool_names",
    "completed_output_tokens", "completed_prompt_tokens"})
SHARED = ROOT.parent / "shared" / "reference"


class ConstantPerf:
    """Every step takes `dt` seconds: makes service times exact for queueing-theory checks."""

    def __init__(self, dt: float = 0.01) -> None:
        self.dt = dt

    def step_time(self, prefills, n_decode, decode_kv_sum) -> float:
        return self.dt

    def decode_steps_time(self, n_decode, decode_kv_sum, steps) -> float:
        return self.dt * steps

    def kv_transfer_time(self, tokens) -> float:
        return 0.0


def small_cell(name: str = "rtx70b_swe10_0.1", **engine_and_cell):
    """A configured cell with engine/cell fields overridden (cells are frozen)."""
    cell = get_cell(name)
    eng_keys = set(EngineArgs.model_fields)
    eng = {k: v for k, v in engine_and_cell.items() if k in eng_keys}
    rest = {k: v for k, v in engine_and_cell.items() if k not in eng_keys}
    if eng:
        rest["engine"] = cell.engine.model_copy(update=eng)
    return cell.model_copy(update=rest)


def chain_program(pid: str, prompts: list[int], outputs: list[int], gaps: list[float],
                  tool: str = "bash") -> Program:
    calls = []
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        last = i == len(prompts) - 1
        calls.append(Call(p, o, None if last else tool, 0.0 if last else gaps[i]))
    return Program(pid, tuple(calls))


def chain_programs(min_size: int = 1, max_size: int = 8):
    """Hypothesis strategy: lists of chain programs (1-5 calls each) with growing prompts,
    short outputs and tool gaps of up to 0.5 s -- small enough to force queueing and
    preemption on a small cell."""
    import numpy as np
    from hypothesis import strategies as st
    call_lists = st.integers(min_value=1, max_value=5).flatmap(lambda n: st.tuples(
        st.lists(st.integers(16, 700), min_size=n, max_size=n).map(lambda xs: list(np.cumsum(xs))),
        st.lists(st.integers(1, 60), min_size=n, max_size=n),
        st.lists(st.floats(0.0, 0.5), min_size=n, max_size=n)))
    return st.lists(call_lists, min_size=min_size, max_size=max_size).map(
        lambda drawn: [chain_program(f"p{i}", p, o, g) for i, (p, o, g) in enumerate(drawn)])
