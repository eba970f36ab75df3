"""The system message: what the LLM must know to edit a serving policy safely and usefully."""
from __future__ import annotations

from typing import Any

from simcore.pcb import OBSERVABLE_INSTANCE_FIELDS, OBSERVABLE_PCB_FIELDS, OBSERVABLE_SIGNAL_FIELDS

_INTERFACE = {
    "scheduling": (
        "class EvolvedScheduling(SchedulingPolicy):\n"
        "    def priority(self, pcb, now) -> int   # smaller runs first (vLLM priority scheduling)\n"
        "It is called when a call of program `pcb` is released to the engine queue and decides the\n"
        "order in which waiting calls are admitted and which running call is preempted first."),
    "retention": (
        "class EvolvedRetention(RetentionPolicy):\n"
        "    def on_turn_complete(self, pcb, request_id, now)  # a call just finished; its tool gap starts\n"
        "    def on_turn_arrival(self, pcb, now)               # the next call of the program arrived\n"
        "Each returns ('protect', until[, value]) to keep the program's KV cached until `until` (s),\n"
        "'release' (cached, reclaimable in LRU order), 'evict' (drop now), 'offload' or None."),
    "routing": (
        "class EvolvedRouting(RoutingPolicy):\n"
        "    def select(self, pcb, inflight, now) -> int   # index of the serving instance\n"
        "`inflight` is a tuple of instance views, one per instance."),
}


def system_message(axis: str, cell: Any, stage1_cell: str | None, extra_cells: list[str]) -> str:
    pcb_fields = ", ".join(sorted(OBSERVABLE_PCB_FIELDS))
    sig = ", ".join(sorted(OBSERVABLE_SIGNAL_FIELDS))
    inst = ", ".join(sorted(OBSERVABLE_INSTANCE_FIELDS))
    wl = cell.workload
    cascade = f"Candidates first run on the short cell {stage1_cell}; broken ones stop there.\n" if stage1_cell else ""
    extra = f"Fitness is the geometric mean over {cell.name} and {', '.join(extra_cells)}.\n" if extra_cells else ""
    return f"""You are an expert in LLM serving systems (vLLM, KV-cache management, agent workloads).
You improve one serving policy of AgentServeSim, a simulator of LLM-agent programs (multi-turn
calls separated by tool executions) served by vLLM-v1-style engines.

POLICY AXIS: {axis}
{_INTERFACE[axis]}

OBSERVATIONS (the causal boundary; anything else is rejected as leakage):
- pcb (a frozen view of the program): {pcb_fields}; method pcb.gap_elapsed_s(now).
  attained_service_s is the program's attained service A_p(t) in seconds; context_tokens is the
  prompt length of the released/last call; kv_resident / kv_protected tell whether its KV is cached.
- self.signals: {sig}; each entry of signals.instances (and of `inflight`) has: {inst}.
- now: the current simulated time in seconds.
Hidden (never available): output length of a running call, duration of a running tool, number
of remaining calls, future prompts.

TARGET CELL: {cell.name} - {cell.description}
{cell.instances} instance(s) of {cell.model.key} on {cell.hardware.key} (TP{cell.tp}), KV pool {cell.kv_pool_tokens} tokens,
{wl.programs or 'file'} {wl.kind} programs arriving at {cell.rate_jps} jobs/s; other axes use the cell defaults
(retention {cell.policies.retention}, scheduling {cell.policies.scheduling}, routing {cell.policies.routing}).

FITNESS: seed mean JCT / candidate mean JCT on the same workload (1.0 = parity; higher is better).
{cascade}{extra}
RULES:
- Change only code between # EVOLVE-BLOCK-START and # EVOLVE-BLOCK-END; edits elsewhere score 0.
- Keep the class name and method signatures. Only `math`, heapq, bisect, collections, itertools,
  functools, statistics, dataclasses and enum may be imported; no dunder attributes, no
  getattr/eval/exec/open/type; no I/O. Each decision must be fast (microseconds): no loops over
  large ranges. Return values must follow the interface above.
- Answer with SEARCH/REPLACE blocks whose SEARCH text matches the current program exactly.
"""
