"""Evaluation file handed to OpenEvolve's constructor, which insists on loading one.

`search.engine` replaces OpenEvolve's evaluator with its own Ray-backed one, so this
`evaluate` only runs if someone drives OpenEvolve directly; it then evaluates the file
in-process on the target cell named by AGENTSERVESIM_CELL / AGENTSERVESIM_AXIS.
"""
from __future__ import annotations

import os
from pathlib import Path


def evaluate(program_path: str) -> dict:
    from evaluator.task import run_policy
    axis = os.environ.get("AGENTSERVESIM_AXIS", "scheduling")
    cell = os.environ.get("AGENTSERVESIM_CELL", "rtx70b_swe_0.1")
    src = Path(program_path).read_text(encoding="utf-8")
    out = run_policy(src, axis, src, [cell], [0], check=False)
    if not out["ok"]:
        return {"combined_score": 0.0}
    jct = out["runs"][cell]["0"]["jct_s"]
    return {"combined_score": 1.0 / (sum(jct) / len(jct))}
