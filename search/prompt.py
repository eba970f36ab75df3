"""What the LLM is told: the system message, and OpenEvolve's prompt templates made truthful.

OpenEvolve's PromptSampler builds the user message from a parent, top programs and
inspirations. Its stock wording assumes every metric is higher-is-better, labels every
program "performs well on" each metric, and advises "simplifying" any file longer than a
threshold (our seeds' docstrings alone exceed it). We therefore give it only
higher-is-better metrics (`combined_score` = the fitness interval's lower bound, and
`fitness`), describe each program with our own `key_features` (fitness with interval,
mean JCT against the seed, lower is better), replace the misleading fragments, and turn
the length advice off. Everything goes through the sampler's public template manager.
"""
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

# OpenEvolve fragments whose stock text would mislead (see the module docstring).
FRAGMENTS = {
    "fitness_improved": "This program scores {current:.4f}; the most recent attempt on this island scored {prev:.4f}",
    "fitness_declined": "This program scores {current:.4f}; the most recent attempt on this island scored {prev:.4f}",
    "fitness_stable": "This program and the most recent attempt on this island both score {current:.4f}",
    "no_specific_guidance": "Lower the mean JCT on the target cell (raise the score)",
    "attempt_all_metrics_improved": "better than its parent (score and fitness both higher)",
    "attempt_all_metrics_regressed": "worse than its parent (score and fitness both lower)",
    "attempt_mixed_metrics": "mixed: not better than its parent on both score and fitness",
    "attempt_unknown_changes": "(no description)",
    "inspiration_type_score_high_performer": "from this island",
    "inspiration_type_score_alternative": "from this island",
    "inspiration_type_score_experimental": "from this island",
    "inspiration_type_score_exploratory": "from this island",
    "inspiration_metrics_excellent": "{metric_name} {value:.4f}",
    "inspiration_metrics_alternative": "{metric_name} low",
    "inspiration_no_features_postfix": "another approach",
}

DIFF_USER = """# About the current program
- Score (lower end of the 95% fitness interval; the search ranks by it): {fitness_score}
- Notes: {improvement_areas}
{artifacts}
# Evolution history
{evolution_history}

# Current program
```{language}
{current_program}
```

# Task
Change the policy so that programs finish sooner: a lower mean job completion time (JCT) on
the target cell raises fitness = seed mean JCT / candidate mean JCT. A change must hold on
every workload draw to raise the score; a gain on one draw and a loss on another does not.
OpenEvolve also keeps programs that differ in {feature_dimensions}.

Change only the code between # EVOLVE-BLOCK-START and # EVOLVE-BLOCK-END. Answer with one or
more SEARCH/REPLACE blocks; each SEARCH section must match the current program exactly:

<<<<<<< SEARCH
(lines copied exactly from the current program)
=======
(their replacement)
>>>>>>> REPLACE

A complete program in one ```python block is accepted too, if everything outside the
EVOLVE block is unchanged. Explain briefly why the change should lower JCT.
"""


def system_message(axis: str, cell: Any, fixed: dict[str, str], draws: list[int],
                   stage1: bool, extra_cells: list[str]) -> str:
    pcb_fields = ", ".join(sorted(OBSERVABLE_PCB_FIELDS))
    sig = ", ".join(sorted(OBSERVABLE_SIGNAL_FIELDS))
    inst = ", ".join(sorted(OBSERVABLE_INSTANCE_FIELDS))
    wl = cell.workload
    others = {"retention": cell.policies.retention, "scheduling": cell.policies.scheduling,
              "routing": cell.policies.routing}
    others.pop(axis)
    other_txt = ", ".join(f"{a} {fixed[a]} (fixed for this search)" if a in fixed else f"{a} {p} (cell default)"
                          for a, p in others.items())
    cascade = (f"Candidates are first scored on draw {draws[0]}; one clearly worse than the seed there stops.\n"
               if stage1 and len(draws) > 1 else "")
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
{wl.programs or 'file'} {wl.kind} programs arriving at {cell.rate_jps} jobs/s. Other axes: {other_txt}.

FITNESS: seed mean JCT / candidate mean JCT, pooled over {len(draws)} workload and arrival draws
({', '.join(map(str, draws))}); 1.0 = parity, higher is better; JCT itself is lower-is-better.
The score the search ranks by (combined_score) is the lower end of fitness's 95% interval over
(draw, program) pairs, so only a gain that holds across draws and programs counts.
{cascade}{extra}
RULES:
- Change only code between # EVOLVE-BLOCK-START and # EVOLVE-BLOCK-END; edits elsewhere score 0.
- Keep the class name and method signatures. Only `math`, heapq, bisect, collections, itertools,
  functools, statistics, dataclasses and enum may be imported; no dunder attributes, no
  getattr/eval/exec/open/type; no I/O. Each decision must be fast (microseconds): no loops over
  large ranges. Return values must follow the interface above.
- Answer with SEARCH/REPLACE blocks whose SEARCH text matches the current program exactly.
"""


def key_features(result: Any) -> list[str]:
    """How a scored candidate is described in prompts (`result` is a CandidateResult)."""
    lo, hi = result.fitness_ci
    feats = [f"fitness {result.fitness:.4f} (95% interval {lo:.4f} to {hi:.4f})"]
    m = result.metrics or {}
    if isinstance(m.get("mean_jct_s"), (int, float)) and isinstance(m.get("seed_mean_jct_s"), (int, float)):
        feats.append(f"mean JCT {m['mean_jct_s']:,.0f} s vs the seed's {m['seed_mean_jct_s']:,.0f} s "
                     "(lower is better)")
    if result.per_draw:
        feats.append("per draw " + ", ".join(f"{d}: {v:.4f}" for d, v in result.per_draw.items()))
    return feats


def feedback_section(items: list[tuple[int, str]]) -> str:
    """Recent attempts on this island that produced no usable candidate, with the reason."""
    if not items:
        return ""
    lines = [f"- iteration {it}: {text}" for it, text in items]
    return ("\n\n# Recent attempts that failed (do not repeat these mistakes)\n" + "\n".join(lines))
