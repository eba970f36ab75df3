"""Create, run, extend and resume a search run (everything between the CLI and the loop).

A run is: the seed scored on the in-sample draws, `iterations` LLM proposals scored the
same way (search/loop.py), then the held-out check: the best few candidates (by the lower
bound of their in-sample interval) re-scored on workload draws the search never saw. The
run's pick is the candidate with the best held-out lower bound; it is called a winner only
if that bound is above 1.0 (family-wise 95 %: Bonferroni over the re-scored candidates).
"""
from __future__ import annotations

import signal
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sandbox.errors import SandboxUnavailable
from simcore.config import ConfigError, cell_catalog, get_cell
from simcore.display import strip_control
from simcore.errors import UserError
from simcore.packaged import SEED_FILES, seed_source
from simcore.policies.base import AXES

from .rundir import CandidateResult, HeldOut, HeldOutPlan, LLMPhase, RunDir, RunMeta, atomic_write_text, now_iso
from .settings import ModelEntry, SearchSettings


class SearchError(UserError, RuntimeError):
    """A search cannot start; one line for the user."""


def default_seed_source(axis: str) -> str:
    return seed_source(axis)


def short_cell(target: str, setting: str | None) -> str | None:
    """The leakage test's cell: 'auto' = the family's 10-program cell at the same rate."""
    if setting in (None, "", "none", "off"):
        return None
    cells = cell_catalog()
    if setting != "auto":
        if setting not in cells:
            raise SearchError(f"evaluator.leak_cell: unknown cell '{setting}' (see `evolve cells`)")
        return setting
    family, _, rate = target.rpartition("_")
    guess = f"{family}10_{rate}"
    return guess if guess in cells else target


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SearchError(f"{path}: {what} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise SearchError(f"{path}: cannot read {what}: {e.strerror}") from None


def parse_with(values: list[str] | None, axis: str) -> dict[str, tuple[str, str | None]]:
    """`--with AXIS=POLICY` (repeatable) -> {axis: (name or path, source of a file or None)}."""
    from simcore.policies.registry import policy_names
    out: dict[str, tuple[str, str | None]] = {}
    for v in values or []:
        other, eq, pol = v.partition("=")
        other, pol = other.strip(), pol.strip()
        if not eq or not other or not pol:
            raise SearchError(f"--with '{v}': expected AXIS=POLICY, e.g. --with retention=ttl")
        if other not in AXES:
            raise SearchError(f"--with '{v}': unknown axis '{other}' (retention, scheduling or routing)")
        if other == axis:
            raise SearchError(f"--with '{v}': {axis} is the axis being searched; fix only the other axes")
        if other in out:
            raise SearchError(f"--with: {other} is given twice")
        if pol in policy_names(other):
            out[other] = (pol, None)
        elif Path(pol).is_file():
            src = _read_text(pol, f"the {other} policy")
            from evaluator.admission import Rejected, gate
            try:
                gate(src, other)
            except Rejected as e:
                raise SearchError(f"--with {other}={pol}: {e.reason}") from None
            out[other] = (pol, src)
        else:
            raise SearchError(f"--with '{v}': unknown {other} policy '{pol}' (shipped: "
                              f"{', '.join(policy_names(other))}; or a policy file)")
    return out


def create_run(axis: str, cell: str, settings: SearchSettings, llm_label: str, llm_entries: list[dict],
               run_dir: str | None, seed_file: str | None, runs_root: str = "runs",
               fixed: dict[str, tuple[str, str | None]] | None = None) -> RunDir:
    try:
        get_cell(cell)
        for c in settings.evaluator.extra_cells:
            get_cell(c)
    except ConfigError as e:
        raise SearchError(str(e)) from None
    short_cell(cell, settings.evaluator.leak_cell)
    sim_mod, sep, sim_fn = settings.evaluator.simulator.rpartition(":")
    if sep and sim_mod.endswith(".py"):      # a simulator file: an absolute path, whatever the workers' cwd
        ev = settings.evaluator.model_copy(update={"simulator": f"{Path(sim_mod).resolve()}:{sim_fn}"})
        settings = settings.model_copy(update={"evaluator": ev})
    seed_src = _read_text(seed_file, "the seed file") if seed_file else default_seed_source(axis)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_id = f"{axis}-{cell}-{stamp}"
    root = Path(run_dir) if run_dir else Path(runs_root) / run_id
    try:
        if root.exists() and any(root.iterdir()):
            raise SearchError(f"{root}: run directory exists and is not empty (use `evolve resume {root}`)")
        run = RunDir(root)
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run.seed_py, seed_src)
        fixed_meta: dict[str, dict[str, str]] = {}
        for other, (pol, src) in (fixed or {}).items():
            if src is None:
                fixed_meta[other] = {"name": pol}
            else:
                atomic_write_text(root / "fixed" / f"{other}.py", src)
                fixed_meta[other] = {"file": f"fixed/{other}.py", "origin": str(Path(pol).resolve())}
        run.create_meta(RunMeta(
            run_id=root.name if run_dir else run_id, axis=axis, cell=cell,
            seed_file=seed_file or f"seeds/{SEED_FILES[axis]}", config=settings.model_dump(mode="json"),
            fixed_policies=fixed_meta, llm=llm_label, llm_models=llm_entries,
            llm_history=[LLMPhase(from_iteration=1, llm=llm_label, llm_models=llm_entries)],
            iterations_planned=settings.iterations, pipeline_depth=settings.effective_workers()))
    except OSError as e:
        raise SearchError(f"{root}: cannot write the run directory: {e.strerror}") from None
    return run


def fixed_for_tasks(run: RunDir, meta: RunMeta) -> dict[str, dict[str, str]]:
    """run.json's fixed policies as the evaluator's tasks take them (file sources inline)."""
    out = {}
    for axis, spec in meta.fixed_policies.items():
        if "file" in spec:
            out[axis] = {"source": _read_text(str(run.root / spec["file"]), f"the fixed {axis} policy")}
        else:
            out[axis] = {"name": spec["name"]}
    return out


def fixed_label(meta: RunMeta) -> dict[str, str]:
    return {a: s.get("name") or s.get("origin") or s.get("file", "?") for a, s in meta.fixed_policies.items()}


class _Interrupts:
    """First Ctrl-C / SIGTERM: stop promptly and save; a second Ctrl-C raises at once."""

    def __init__(self, stop: threading.Event, note: Any) -> None:
        self.stop, self.note = stop, note
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> "_Interrupts":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.getsignal(sig)
                signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt
        self.stop.set()
        self.note("interrupt received: cancelling evaluations in flight and saving the run "
                  "(press Ctrl-C again to quit at once)")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


def execute(run: RunDir, ray_address: str | None = None, console: Console | None = None,
            preflight: bool = True, extend_to: int | None = None,
            llm_entries: list[ModelEntry] | None = None, runtime_env: dict[str, Any] | None = None) -> int:
    """Run (or resume, extend, re-model) the search in `run`; returns a process exit code."""
    from evaluator import raypool
    from evaluator.admission import Rejected, admit
    from evaluator.service import EvalPlan, RayEvaluator

    from .llm import LLMSetupError, build_backends, label_for
    from .loop import SearchLoop, seed_result
    from .progress import Progress
    from .prompt import system_message

    console = console or Console(highlight=False, soft_wrap=True)
    meta = run.load_meta()
    settings = SearchSettings.model_validate(meta.config)
    done = meta.iterations_done
    if extend_to is not None:
        if extend_to < done:
            raise SearchError(f"--iterations {extend_to}: the run already has {done} iterations; give the new total "
                              f"(e.g. --iterations {done + settings.iterations})")
        settings = settings.model_copy(update={"iterations": extend_to})
    if llm_entries is not None:
        history = list(meta.llm_history) + [LLMPhase(from_iteration=done + 1, llm=label_for(llm_entries),
                                                     llm_models=[e.model_dump() for e in llm_entries])]
        run.update(llm=label_for(llm_entries), llm_models=[e.model_dump() for e in llm_entries],
                   llm_history=history)
        meta = run.meta
    try:
        run.update(config=settings.model_dump(mode="json"), iterations_planned=settings.iterations)
    except OSError as e:
        raise SearchError(f"{run.run_json}: cannot write: {e.strerror}") from None
    axis, cell_name = meta.axis, meta.cell
    seed_src = run.seed_py.read_text(encoding="utf-8")
    try:
        admit(seed_src, axis, seed_src)
    except Rejected as e:
        raise SearchError(f"{run.seed_py}: the seed policy fails admission: {e}") from None
    entries = [ModelEntry.model_validate(m) for m in meta.llm_models or [{"backend": "offline"}]]
    stop = threading.Event()
    try:
        backends = build_backends(entries, settings.llm, settings.seed, preflight=preflight, stop=stop)
    except LLMSetupError as e:
        raise SearchError(str(e)) from None
    cell = get_cell(cell_name)
    ev_cfg = settings.evaluator
    draws = tuple(ev_cfg.workload_seeds)
    plan = EvalPlan(axis=axis, seed_source=seed_src,
                    cells=(cell_name, *[c for c in ev_cfg.extra_cells if c != cell_name]), draws=draws,
                    stage1=ev_cfg.stage1, stage1_threshold=ev_cfg.stage1_threshold,
                    leak_cell=short_cell(cell_name, ev_cfg.leak_cell) if ev_cfg.leak_check else None,
                    timeout_s=settings.timeout_s, simulator=ev_cfg.simulator, fixed=fixed_for_tasks(run, meta),
                    allow_weak_sandbox=ev_cfg.allow_weak_sandbox)
    workers = settings.effective_workers()
    try:
        where = raypool.connect(ray_address, workers)
    except raypool.RayUnavailable as e:
        raise SearchError(str(e)) from None
    resumed = meta.status != "created"
    run.update(status="running", started_at=meta.started_at or now_iso(), finished_at=None, error=None)
    fixed_txt = "".join(f", {a}={p}" for a, p in fixed_label(meta).items())
    title = f"evolve {axis} on {cell_name}{fixed_txt}  ({meta.llm}; {where})  {run.root}"
    evaluator = RayEvaluator(plan, runtime_env=runtime_env)
    progress = Progress(title, settings.iterations, lambda: evaluator.in_flight, console)
    system = system_message(axis, cell, fixed_label(meta), list(draws), plan.stage1, list(plan.cells[1:]))
    loop = SearchLoop(run, settings, evaluator, backends, progress, system, seed_src, meta.pipeline_depth, stop)
    status, code, error = "failed", 1, None
    try:
        with progress, _Interrupts(stop, progress.note):
            progress.note(f"run {run.root}: llm {meta.llm}; evaluations on {where}")
            if resumed:
                progress.note(f"resuming: replaying stored candidates and LLM answers, then iterations up to "
                              f"{settings.iterations}")
            progress.note(f"scoring the seed on {', '.join(plan.cells)} (draws {list(draws)})")
            seed = seed_result(loop.seed_cid, evaluator.seed_evaluation())
            if run.read_candidate(seed.candidate_id) is None:
                run.write_candidate(seed_src, seed)
            loop.add_seed(seed)
            status = loop.run(1, settings.iterations)
            if status == "finished":
                if not heldout_phase(run, loop, evaluator, settings, progress, stop):
                    status = "interrupted"
            if status == "failed":
                error = loop.state.stopped_reason
        code = {"finished": 0, "interrupted": 130}.get(status, 1)
    except KeyboardInterrupt:
        status, code = "interrupted", 130
    except SearchError:
        raise
    except SandboxUnavailable as e:   # the machine, not a candidate: say so whole (it names the flag)
        error, status, code = str(e), "failed", 2
    except Exception as e:  # noqa: BLE001 - record the failure in run.json, then report one line
        error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        status, code = "failed", 1
    finally:
        evaluator.cancel_all()
        try:
            run.update(status=status, iterations_done=loop.state.committed, counts=loop.state.counts,
                       finished_at=now_iso(), error=error)
        except OSError as e:   # e.g. the disk filled up or became read-only mid-run
            console.print(Text(f"error: {run.run_json}: cannot record the run's end: {e.strerror}", style="red"))
            code = 1
        raypool.shutdown()
    _report(console, run, loop)
    return code


def heldout_phase(run: RunDir, loop: Any, evaluator: Any, settings: SearchSettings, progress: Any,
                  stop: threading.Event) -> bool:
    """Re-score the best few candidates on held-out draws and pick the run's candidate.
    Returns False if interrupted."""
    ho = settings.evaluator.heldout
    pool = sorted((r for r in loop.results.values()
                   if r.status == "ok" and r.iteration > 0 and not (r.duplicate_of or r.same_behaviour_as)),
                  key=CandidateResult.insample_key)
    picked = pool[: ho.top]
    if not picked or not ho.draws:
        verdict = ("no candidate scored ok" if not pool else
                   _insample_verdict(loop.best))
        run.update(verdict=verdict, winner=None, heldout=None)
        return True
    level = 1.0 - 0.05 / len(picked)
    run.update(heldout=HeldOutPlan(draws=list(ho.draws), top=ho.top, level=level))
    progress.note(f"held-out check: re-scoring the best {len(picked)} on draws {list(ho.draws)} "
                  f"({level:.1%} intervals, family-wise 95%)")
    results: dict[str, CandidateResult] = {}

    def one(r: CandidateResult) -> None:
        if r.heldout is not None and r.heldout.draws == list(ho.draws) and abs(r.heldout.level - level) < 1e-12:
            results[r.candidate_id] = r
            return
        stored = run.read_candidate(r.candidate_id)
        if stored is None:
            return
        ev = evaluator.score_on(stored[0], list(ho.draws), level=level, check=False)
        if ev.status == "ok" and ev.estimate is not None:
            e = ev.estimate
            h = HeldOut(fitness=e.fitness, fitness_ci=[e.lo, e.hi], level=level, draws=list(ho.draws),
                        per_draw=dict(e.per_draw), significant=e.lo > 1.0, mean_jct_s=ev.metrics.get("mean_jct_s"),
                        seed_mean_jct_s=ev.metrics.get("seed_mean_jct_s"))
        else:
            h = HeldOut(fitness=0.0, fitness_ci=[0.0, 0.0], level=level, draws=list(ho.draws), per_draw={},
                        significant=False, failure=f"{ev.kind}: {ev.reason}")
        nr = stored[1].model_copy(update={"heldout": h})
        run.write_result(nr)
        results[r.candidate_id] = nr

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in picked]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            if stop.is_set():
                return False
            t.join(0.2)
    scored = sorted(results.values(), key=lambda r: (-r.heldout.fitness_ci[0], -r.heldout.fitness, r.iteration))
    if not scored:
        return not stop.is_set()
    pick = scored[0]
    for r in results.values():
        loop.results[r.candidate_id] = r
    src = run.read_candidate(pick.candidate_id)
    if src is not None:
        run.write_best(src[0], pick)
    h = pick.heldout
    k = len(ho.draws)
    if h.significant:
        verdict = (f"{pick.candidate_id} beats the seed on {k} held-out draws: fitness {h.fitness:.4f} "
                   f"[{h.fitness_ci[0]:.4f}, {h.fitness_ci[1]:.4f}] ({level:.1%} interval)")
    else:
        verdict = (f"no candidate is significantly better than the seed on the {k} held-out draws "
                   f"(best re-scored: {pick.candidate_id}, {h.fitness:.4f} [{h.fitness_ci[0]:.4f}, "
                   f"{h.fitness_ci[1]:.4f}]); the seed remains the policy to use")
    run.update(best_candidate=pick.candidate_id, winner=pick.candidate_id if h.significant else None,
               verdict=verdict)
    return True


def _insample_verdict(best: CandidateResult | None) -> str:
    if best is None or best.iteration == 0:
        return "no candidate scored above the seed in-sample"
    lo, hi = best.fitness_ci
    sig = "significantly better" if lo > 1.0 else "not significantly better"
    return (f"{best.candidate_id} is {sig} than the seed in-sample: {best.fitness:.4f} [{lo:.4f}, {hi:.4f}] "
            f"(no held-out check)")


def _ci(v: float, ci: list[float]) -> str:
    return f"{v:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]"


def _report(console: Console, run: RunDir, loop: Any) -> None:
    meta = run.load_meta()
    if meta.error:
        console.print(Text(f"search failed: {strip_control(meta.error)}", style="red"))
    top = [r for r in run.leaderboard() if r.heldout is not None]
    best = loop.best
    if best is not None and best.iteration > 0:
        draws = ", ".join(map(str, best.draws))
        console.print(Text(f"best in-sample (draws {draws}): {best.candidate_id} fitness "
                           f"{_ci(best.fitness, best.fitness_ci)}  (seed mean JCT / candidate mean JCT; "
                           f"1.0 = parity; ranked by the interval's lower bound)"))
    if top:
        t = Table(title=f"held-out check (draws {', '.join(map(str, top[0].heldout.draws))}, "
                        f"{top[0].heldout.level:.1%} intervals)")
        for c in ("candidate", "in-sample fitness [95% CI]", "held-out fitness [CI]", "significant"):
            t.add_column(c, overflow="fold")
        for r in top:
            t.add_row(Text(r.candidate_id), _ci(r.fitness, r.fitness_ci),
                      _ci(r.heldout.fitness, r.heldout.fitness_ci) if not getattr(r.heldout, "failure", None)
                      else Text(f"failed: {strip_control(r.heldout.failure)}"),
                      "yes" if r.heldout.significant else "no")
        console.print(t)
    if meta.verdict and meta.status == "finished":
        console.print(Text(("winner: " if meta.winner else "result: ") + strip_control(meta.verdict),
                           style="bold green" if meta.winner else "bold"))
    if meta.best_candidate:
        best_file = run.root / "best" / "policy.py"
        if meta.winner or not meta.verdict:
            console.print(Text(f"policy: {best_file}"))
        else:   # held-out check done, nothing significant: best/ is the best re-scored, not a winner
            console.print(Text(f"seed (the policy to use): {run.seed_py}\n"
                               f"best re-scored candidate, not significantly better: {best_file}"))
    c = meta.counts
    console.print(Text(f"run: {run.root}  status: {meta.status}  iterations: {meta.iterations_done}/"
                       f"{meta.iterations_planned}  LLM failures: {c.llm_failures}, answers without a program: "
                       f"{c.format_failures}, failed candidates: {c.failed_candidates}, duplicates: {c.duplicates}"))
    if meta.status in ("interrupted", "failed"):
        console.print(Text(f"continue with: evolve resume {run.root}"))
    sys.stdout.flush()
