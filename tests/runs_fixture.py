"""Build small search-run directories (the search/rundir.py layout) with real simulated metrics."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simcore.packaged import SEED_FILES, seed_source

CELL = "rtx70b_swe10_0.1"
ROUTING_CELL = "h100x2_8b_swe_0.1"   # routing needs more than one instance
# (candidate id, parent, island, iteration, edit of the seed source or None = failed candidate)
VARIANTS = {
    "scheduling": [
        ("it0001-aaaa", "it0000-seed", 0, 1,
         ("return int(round(pcb.attained_service_s * 1000.0))",
          "return int(round(pcb.attained_service_s * 1000.0 + pcb.context_tokens * 0.01))")),
        ("it0002-bbbb", "it0000-seed", 1, 2, None),
        ("it0003-cccc", "it0001-aaaa", 1, 3,
         ("return int(round(pcb.attained_service_s * 1000.0))",
          "return int(round(pcb.attained_service_s * 500.0 - (now - pcb.arrival_s) * 10.0))")),
    ],
    "retention": [
        ("it0001-aaaa", "it0000-seed", 0, 1, ("TAU_S = 2.0", "TAU_S = 30.0")),
        ("it0002-bbbb", "it0000-seed", 1, 2, None),
    ],
    "routing": [
        ("it0001-aaaa", "it0000-seed", 0, 1, ("MAX_EXTRA_INFLIGHT = 4", "MAX_EXTRA_INFLIGHT = 1")),
    ],
}


def _write(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) if not isinstance(obj, str) else obj, encoding="utf-8")


def make_run(root: Path, axis: str = "scheduling", status: str = "finished", run_id: str | None = None,
             started_at: str = "2026-11-30T01:00:00+00:00", fixed: dict[str, dict[str, str]] | None = None) -> Path:
    """A run with the seed, ok and failed candidates, metrics from real simulations (seed 0).
    `fixed` is run.json's fixed_policies (e.g. {"retention": {"name": "ttl"}}); the metrics
    are simulated with those policies."""
    from simcore.sim import simulate
    cell = ROUTING_CELL if axis == "routing" else CELL
    run_id = run_id or f"{axis}-{cell}-fixture"
    d = root / run_id
    seed = seed_source(axis)
    _write(d / "seed.py", seed)
    (d / "checkpoints").mkdir(parents=True, exist_ok=True)
    others = {a: s["name"] for a, s in (fixed or {}).items()}
    seed_summary = simulate(cell, seed=0, **others, **{axis: str(d / "seed.py")}).summary
    rows = [("it0000-seed", None, 0, 0, seed)]
    for cid, parent, island, it, edit in VARIANTS[axis]:
        rows.append((cid, parent, island, it, None if edit is None else seed.replace(*edit)))
    best, best_fit = None, -1.0
    for cid, parent, island, it, src in rows:
        cdir = d / "candidates" / cid
        if src is None:
            _write(cdir / "program.py", seed.replace("import math", "import os"))
            res = {"status": "failed", "fitness": 0.0, "fitness_ci": [0.0, 0.0], "metrics": {},
                   "failure_kind": "gate", "reason": "imports a forbidden module 'os'"}
        else:
            _write(cdir / "program.py", src)
            m = dict(simulate(cell, seed=0, **others, **{axis: str(cdir / "program.py")}).summary)
            fit = seed_summary["mean_jct_s"] / m["mean_jct_s"]
            res = {"status": "ok", "fitness": fit, "fitness_ci": [fit * 0.97, fit * 1.03], "score": fit * 0.97,
                   "draws": [0], "per_draw": {"0": fit}, "metrics": {**m, "seed_mean_jct_s": seed_summary["mean_jct_s"]},
                   "reason": None, "model": None if cid == "it0000-seed" else "offline"}
            if fit > best_fit:
                best, best_fit, best_src, best_res = cid, fit, src, res
        res.update({"candidate_id": cid, "parent_id": parent, "island": island, "generation": it and 1,
                    "iteration": it, "created_at": started_at})
        _write(cdir / "result.json", res)
        if it > 0:   # the LLM journal: prompt and answer (with text that Rich would read as markup)
            _write(d / "journal" / "llm" / f"{it:05d}.json", {
                "iteration": it, "island": island, "parent_id": parent, "model": "offline",
                "prompt": {"system": "You improve one serving policy.",
                           "user": f"Prompt of iteration {it}: keep [bold]this[/bold] literal\x1b[31m."},
                "prompt_hash": "0" * 64, "response": f"Answer of iteration {it}: [red]not markup[/red]",
                "seconds": 0.5, "attempts": 1, "outcome": f"candidate {cid}"})
    _write(d / "best" / "policy.py", best_src)
    _write(d / "best" / "result.json", best_res)
    _write(d / "run.json", {
        "run_id": run_id, "axis": axis, "cell": cell, "seed_file": f"seeds/{SEED_FILES[axis]}",
        "config": {"iterations": 3, "evaluator": {"workload_seeds": [0]}}, "llm": "offline",
        "llm_models": [{"backend": "offline", "weight": 1.0, "api_base": None}], "status": status,
        "fixed_policies": fixed or {}, "iterations_planned": 3, "iterations_done": 3 if status == "finished" else 1,
        "started_at": started_at, "finished_at": started_at if status == "finished" else None,
        "best_candidate": best, "counts": {"llm_failures": 0, "format_failures": 0, "failed_candidates": 1,
                                           "duplicates": 0}})
    return d


def exported_package(tmp_path_factory: Any, axis: str = "scheduling") -> Path:
    """A fixture run of `axis` exported with `evolve export` (the package folder)."""
    from search.cli import main

    root = tmp_path_factory.mktemp("runs")
    make_run(root, axis)
    out = tmp_path_factory.mktemp("export") / "pkg"
    assert main(["export", f"{axis}-{CELL}-fixture", "--to", "vllm", "--out", str(out), "--runs-dir", str(root)]) == 0
    return out
