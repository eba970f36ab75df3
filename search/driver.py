"""Create, run and resume a search run (everything between the CLI and the engine)."""
from __future__ import annotations

import sys
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console

from simcore.config import ConfigError, cell_catalog, get_cell

from .rundir import RunDir, now_iso
from .settings import SearchSettings

SEED_FILES = {"retention": "retention_ttl.py", "scheduling": "scheduling_plas.py",
              "routing": "routing_affinity.py"}


class SearchError(RuntimeError):
    """A search cannot start; one line for the user."""


def default_seed_source(axis: str) -> str:
    return resources.files("seeds").joinpath(SEED_FILES[axis]).read_text(encoding="utf-8")


def stage1_cell(target: str, setting: str | None) -> str | None:
    """The cascade's first-stage cell: 'auto' = the family's 10-program cell at the same rate."""
    if setting in (None, "", "none", "off"):
        return None
    cells = cell_catalog()
    if setting != "auto":
        if setting not in cells:
            raise SearchError(f"evaluator.stage1_cell: unknown cell '{setting}' (see `evolve cells`)")
        return None if setting == target else setting
    family, _, rate = target.rpartition("_")
    guess = f"{family}10_{rate}"
    return guess if guess in cells and guess != target else None


def create_run(axis: str, cell: str, settings: SearchSettings, llm_label: str, llm_entries: list[dict],
               run_dir: str | None, seed_file: str | None, runs_root: str = "runs") -> RunDir:
    try:
        get_cell(cell)
        for c in settings.evaluator.extra_cells:
            get_cell(c)
    except ConfigError as e:
        raise SearchError(str(e)) from None
    if seed_file:
        try:
            seed_src = Path(seed_file).read_text(encoding="utf-8")
        except OSError as e:
            raise SearchError(f"{seed_file}: cannot read seed file: {e.strerror}") from None
    else:
        seed_src = default_seed_source(axis)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_id = f"{axis}-{cell}-{stamp}"
    root = Path(run_dir) if run_dir else Path(runs_root) / run_id
    if root.exists() and any(root.iterdir()):
        raise SearchError(f"{root}: run directory exists and is not empty (use `evolve resume {root}`)")
    run = RunDir(root)
    root.mkdir(parents=True, exist_ok=True)
    from .rundir import atomic_write_text
    atomic_write_text(run.seed_py, seed_src)
    meta = {"run_id": root.name if run_dir else run_id, "axis": axis, "cell": cell,
            "seed_file": seed_file or f"seeds/{SEED_FILES[axis]}",
            "config": settings.model_dump(mode="json"), "llm": llm_label, "llm_models": llm_entries,
            "status": "created", "iterations_planned": settings.iterations, "iterations_done": 0,
            "started_at": None, "finished_at": None, "best_candidate": None}
    run.save_meta(meta)
    return run


def execute(run: RunDir, ray_address: str | None = None, console: Console | None = None,
            preflight: bool = True) -> int:
    """Run (or resume) the search in `run`; returns a process exit code."""
    from evaluator import raypool
    from evaluator.admission import Rejected, admit
    from evaluator.service import EvalPlan, RayEvaluator

    from .engine import SearchEngine
    from .llm import LLMSetupError, build_models
    from .progress import Progress
    from .prompt import system_message
    from .settings import ModelEntry

    console = console or Console(highlight=False, soft_wrap=True)
    meta = run.load_meta()
    settings = SearchSettings.model_validate(meta["config"])
    axis, cell_name = meta["axis"], meta["cell"]
    seed_src = run.seed_py.read_text(encoding="utf-8")
    try:
        admit(seed_src, axis, seed_src)
    except Rejected as e:
        raise SearchError(f"{run.seed_py}: the seed policy fails admission: {e}") from None
    entries = [ModelEntry.model_validate(m) for m in meta.get("llm_models") or [{"backend": "offline"}]]
    try:
        backends = build_models(entries, settings.llm, settings.seed, preflight=preflight)
    except LLMSetupError as e:
        raise SearchError(str(e)) from None
    cell = get_cell(cell_name)
    s1 = stage1_cell(cell_name, settings.evaluator.stage1_cell)
    plan = EvalPlan(axis=axis, seed_source=seed_src,
                    cells=(cell_name, *[c for c in settings.evaluator.extra_cells if c != cell_name]),
                    workload_seeds=tuple(settings.evaluator.workload_seeds), stage1_cell=s1,
                    stage1_threshold=settings.evaluator.stage1_threshold, timeout_s=settings.timeout_s,
                    simulator=settings.evaluator.simulator, leak_check=settings.evaluator.leak_check,
                    allow_weak_sandbox=settings.evaluator.allow_weak_sandbox)
    workers = settings.effective_workers()
    try:
        where = raypool.connect(ray_address, workers)
    except raypool.RayUnavailable as e:
        raise SearchError(str(e)) from None
    resumed = meta["status"] not in ("created",)
    meta.update(status="running", started_at=meta.get("started_at") or now_iso(), finished_at=None)
    run.save_meta(meta)
    title = f"evolve {axis} on {cell_name}  [{meta['llm']}, {where}]  {run.root}"
    evaluator = RayEvaluator(plan)
    progress = Progress(title, settings.iterations, lambda: evaluator.in_flight, console)
    engine = SearchEngine(run, meta, settings, evaluator, backends, progress,
                          system_message(axis, cell, s1, list(plan.cells[1:])))
    status, code = "failed", 1
    try:
        with progress:
            progress.note(f"run {run.root}: llm {meta['llm']}; evaluations on {where}")
            if resumed:
                progress.note(f"resuming {run.root}: replaying stored candidates and LLM answers")
            progress.note(f"scoring the seed on {', '.join(plan.cells + ((s1,) if s1 else ()))} "
                          f"(workload seeds {list(plan.workload_seeds)})")
            evaluator.ensure_baseline()
            complete = engine.run()
        status, code = ("finished", 0) if complete else ("interrupted", 130)
    except (KeyboardInterrupt, SystemExit):
        status, code = "interrupted", 130
    except SearchError:
        raise
    except Exception as e:  # noqa: BLE001 - record the failure in run.json, then report one line
        meta["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        status, code = "failed", 1
    finally:
        evaluator.cancel_all()
        meta.update(status=status, iterations_done=progress.iterations_done, finished_at=now_iso())
        run.save_meta(meta)
        raypool.shutdown()
    _report(console, run, meta, engine.best, status)
    return code


def _report(console: Console, run: RunDir, meta: dict[str, Any], best: dict[str, Any] | None,
            status: str) -> None:
    if meta.get("error"):
        console.print(f"[red]search failed:[/red] {meta['error']}")
    if best is None:
        console.print(f"no candidate scored yet; run: {run.root} ({status})")
        return
    lo, hi = best["fitness_ci"]
    console.print(f"best candidate: {best['candidate_id']} (iteration {best['iteration']}, island {best['island']})")
    console.print(f"fitness: {best['fitness']:.4f}  95% interval [{lo:.4f}, {hi:.4f}]  "
                  f"(seed mean JCT / candidate mean JCT; 1.0 = parity)")
    console.print(f"policy: {run.root / 'best' / 'policy.py'}")
    console.print(f"run: {run.root}  status: {status}  iterations: {meta['iterations_done']}/{meta['iterations_planned']}")
    if status == "interrupted":
        console.print(f"continue with: evolve resume {run.root}")
    sys.stdout.flush()
