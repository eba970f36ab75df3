"""The search loop: OpenEvolve 0.4.0's controller with our iteration worker.

OpenEvolve keeps the population (islands, MAP-Elites archive, migration, elite/exploration/
exploitation sampling) and its checkpoints; we replace only its process pool:
  - its pool forks the driver, and a forked Ray driver hangs; OpenEvolve also has no
    executor hook. Our controller subclass runs each iteration on a driver thread instead:
    the prompt is built in the main thread when the iteration is submitted, the LLM call
    and the Ray evaluation happen on the thread, results are released in submission order
    (see determinism.OrderedExecutor);
  - every candidate is written to the run directory as soon as it is scored, and every
    LLM answer is journaled, so `evolve resume` can replay the run exactly (see driver).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openevolve.config import Config, LLMModelConfig
from openevolve.controller import OpenEvolve
from openevolve.database import Program
from openevolve.process_parallel import ProcessParallelController, SerializableResult
from openevolve.utils.code_utils import apply_diff_blocks, extract_diffs, format_diff_summary
from openevolve.utils.metrics_utils import safe_numeric_average

from evaluator.service import Evaluation, EvaluationCancelled, RayEvaluator, source_hash

from .determinism import OrderedExecutor, seeded_openevolve
from .llm import Backend
from .offline import OfflineMutator
from .progress import Progress
from .rundir import RunDir, now_iso
from .settings import SearchSettings

ENTRY_FILE = Path(__file__).resolve().parent.parent / "evaluator" / "oe_entry.py"


def candidate_id(iteration: int, source: str) -> str:
    return f"c{iteration:04d}-{source_hash(source)[:8]}"


def oe_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The numeric metrics OpenEvolve ranks by (combined_score = fitness)."""
    m = result.get("metrics") or {}
    lo, hi = result.get("fitness_ci") or (0.0, 0.0)
    out = {"combined_score": float(result["fitness"]), "fitness_lo": float(lo), "fitness_hi": float(hi)}
    for k in ("mean_jct_s", "p99_jct_s", "stage1_fitness"):
        if isinstance(m.get(k), (int, float)):
            out[k] = float(m[k])
    return out


@dataclass
class Job:
    iteration: int
    island: int
    parent_id: str
    parent_cid: str | None
    parent_code: str
    parent_generation: int
    parent_metrics: dict[str, Any]
    prompt: dict[str, str]
    prompt_hash: str


def build_config(settings: SearchSettings, system_message: str, run: RunDir) -> Config:
    cfg = Config()
    cfg.max_iterations = settings.iterations
    cfg.checkpoint_interval = settings.checkpoint_interval
    cfg.random_seed = settings.seed
    cfg.language = "python"
    cfg.log_level = "INFO"
    cfg.log_dir = str(run.root / "logs")
    cfg.diff_based_evolution = settings.diff_based
    cfg.max_code_length = settings.max_code_length
    cfg.enforce_evolve_blocks = False          # we score edits outside the block 0 instead, with a reason
    cfg.database.population_size = settings.population
    cfg.database.archive_size = min(settings.archive_size, settings.population)
    cfg.database.num_islands = settings.islands
    cfg.database.migration_interval = settings.migration_interval
    cfg.database.migration_rate = settings.migration_rate
    cfg.database.elite_selection_ratio = settings.elite_ratio
    cfg.database.exploration_ratio = settings.exploration
    cfg.database.exploitation_ratio = settings.exploitation
    cfg.database.random_seed = settings.seed
    cfg.database.log_prompts = False
    cfg.prompt.system_message = system_message
    cfg.prompt.num_top_programs = settings.num_top_programs
    cfg.prompt.num_diverse_programs = settings.num_diverse_programs
    cfg.prompt.use_template_stochasticity = False
    cfg.prompt.include_artifacts = False
    cfg.evaluator.cascade_evaluation = False   # our evaluator runs its own cascade on Ray
    cfg.evaluator.parallel_evaluations = settings.effective_workers()
    cfg.evaluator.timeout = int(settings.timeout_s * 3)
    cfg.evaluator.enable_artifacts = False
    # The model list only satisfies OpenEvolve's constructor; our worker calls the backends.
    cfg.llm.models = [LLMModelConfig(name="agentservesim-backends", weight=1.0,
                                     init_client=lambda c: OfflineMutator(seed=settings.seed))]
    cfg.llm.evaluator_models = []
    return cfg


class _OpenEvolve(OpenEvolve):
    def _setup_logging(self) -> None:
        """File log only: the terminal belongs to the progress display."""
        import logging
        log_dir = self.config.log_dir or str(Path(self.output_dir) / "logs")
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        root = logging.getLogger()
        root.setLevel(getattr(logging, self.config.log_level))
        for h in list(root.handlers):
            if getattr(h, "_agentservesim", False):
                root.removeHandler(h)
                h.close()
        fh = logging.FileHandler(str(Path(log_dir) / "openevolve.log"))
        fh.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
        fh._agentservesim = True  # type: ignore[attr-defined]
        root.addHandler(fh)


class _EvaluatorAdapter:
    """What OpenEvolve's controller calls for the initial (seed) program."""

    def __init__(self, engine: "SearchEngine") -> None:
        self.engine = engine

    async def evaluate_program(self, program_code: str, program_id: str = "") -> dict[str, float]:
        cid, result = await asyncio.to_thread(self.engine.score, program_code, 0, None, 0, 0)
        self.engine.oe_to_cid[program_id] = cid
        return oe_metrics(result)

    def get_pending_artifacts(self, program_id: str) -> None:
        return None


class SearchEngine:
    def __init__(self, run: RunDir, meta: dict[str, Any], settings: SearchSettings,
                 evaluator: RayEvaluator, backends: list[Backend], progress: Progress,
                 system_message: str) -> None:
        self.run_dir, self.meta, self.settings = run, meta, settings
        self.evaluator, self.backends, self.progress = evaluator, backends, progress
        self.system_message = system_message
        self.oe_to_cid: dict[str, str] = {}
        self._lock = threading.Lock()
        self._best: dict[str, Any] | None = None
        self.oe: OpenEvolve | None = None
        self._by_source: dict[str, dict[str, Any]] = {}   # source hash -> evaluation, within this run
        # (iteration, island, reason, edit) of candidates that scored 0, in the order the main
        # loop processed them; shown in later prompts of the same island
        self.failures: list[tuple[int, int, str, str]] = []

    # ------------------------------------------------------------------ scoring
    def score(self, source: str, iteration: int, parent_cid: str | None, island: int,
              generation: int) -> tuple[str, dict[str, Any]]:
        """Evaluate (or reuse the stored evaluation of) one candidate and record it."""
        cid = candidate_id(iteration, source)
        stored = self.run_dir.read_candidate(cid)
        if stored is not None and stored[0] == source:
            result = stored[1]
            self.progress.record(result, replayed=True)
        else:
            h = source_hash(source)
            with self._lock:
                prev = self._by_source.get(h)
            if prev is not None:   # the same program again: the simulator is deterministic
                ev_fields = {k: prev[k] for k in ("fitness", "fitness_ci", "metrics", "status", "reason",
                                                  "failure_kind")}
                ev_fields.update(wall_s=0.0, duplicate_of=prev["candidate_id"])
            else:
                ev: Evaluation = self.evaluator.evaluate(source)
                ev_fields = {"fitness": ev.fitness, "fitness_ci": list(ev.fitness_ci), "metrics": ev.metrics,
                             "status": ev.status, "reason": ev.reason, "failure_kind": ev.kind,
                             "wall_s": round(ev.wall_s, 3)}
            result = {"candidate_id": cid, "parent_id": parent_cid, "island": island,
                      "generation": generation, "iteration": iteration, **ev_fields, "created_at": now_iso()}
            self.run_dir.write_candidate(cid, source, result)
            self.progress.record(result)
        with self._lock:
            self._by_source.setdefault(source_hash(source), result)
        self._offer_best(source, result)
        return cid, result

    def _offer_best(self, source: str, result: dict[str, Any]) -> None:
        if result["status"] != "ok":
            return
        key = (float(result["fitness"]), -int(result["iteration"]))
        with self._lock:
            if self._best is None or key > (float(self._best["fitness"]), -int(self._best["iteration"])):
                self._best = result
                self.run_dir.write_best(source, result)
                self.meta["best_candidate"] = result["candidate_id"]
                self.run_dir.save_meta(self.meta)

    @property
    def best(self) -> dict[str, Any] | None:
        return self._best

    # ------------------------------------------------------------------ one iteration
    def _pick_backend(self, iteration: int) -> Backend:
        if len(self.backends) == 1:
            return self.backends[0]
        h = hashlib.sha256(f"{self.settings.seed}:model:{iteration}".encode()).digest()
        rng = random.Random(int.from_bytes(h[:8], "big"))
        return rng.choices(self.backends, weights=[b.weight for b in self.backends], k=1)[0]

    def _llm_answer(self, job: Job) -> str:
        rec = self.run_dir.journal_get(job.iteration, job.prompt_hash)
        if rec is not None:
            return rec["response"]
        backend = self._pick_backend(job.iteration)
        kwargs: dict[str, Any] = {}
        if isinstance(backend.client, OfflineMutator):
            kwargs = {"parent_code": job.parent_code, "iteration": job.iteration}
        t0 = time.perf_counter()
        response = asyncio.run(backend.client.generate_with_context(
            job.prompt["system"], [{"role": "user", "content": job.prompt["user"]}], **kwargs))
        if not isinstance(response, str):
            raise RuntimeError(f"{backend.spec} returned no text")
        self.run_dir.journal_put(job.iteration, {
            "iteration": job.iteration, "model": backend.spec, "prompt_hash": job.prompt_hash,
            "response": response, "llm_s": round(time.perf_counter() - t0, 3), "created_at": now_iso()})
        return response

    def _error(self, job: Job, msg: str) -> SerializableResult:
        self.progress.iteration_error(job.iteration, msg)
        return SerializableResult(error=msg, iteration=job.iteration)

    def _save_progress(self) -> None:
        with self._lock:
            self.meta["iterations_done"] = self.progress.iterations_done
            self.run_dir.save_meta(self.meta)

    def run_job(self, job: Job) -> SerializableResult:
        try:
            return self._run_job(job)
        finally:
            self._save_progress()     # run.json shows live progress to `evolve runs`

    def _run_job(self, job: Job) -> SerializableResult:
        t0 = time.perf_counter()
        try:
            response = self._llm_answer(job)
        except Exception as e:  # noqa: BLE001 - an LLM failure costs one iteration, not the run
            return self._error(job, f"LLM call failed: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
        try:
            diffs = extract_diffs(response)
        except ValueError as e:
            return self._error(job, f"malformed SEARCH/REPLACE answer: {e}")
        if not diffs:
            return self._error(job, "the answer contained no SEARCH/REPLACE block")
        child, applied = apply_diff_blocks(job.parent_code, diffs)
        if applied == 0:
            return self._error(job, f"none of the {len(diffs)} SEARCH blocks matched the parent program")
        if child == job.parent_code:
            return self._error(job, "the edit did not change the program")
        if len(child) > self.settings.max_code_length:
            return self._error(job, f"program too long ({len(child)} > {self.settings.max_code_length} chars)")
        try:
            cid, result = self.score(child, job.iteration, job.parent_cid, job.island, job.parent_generation + 1)
        except EvaluationCancelled:
            return SerializableResult(error="evaluation cancelled (shutting down)", iteration=job.iteration)
        metadata = {"changes": format_diff_summary(diffs), "parent_metrics": job.parent_metrics,
                    "island": job.island}
        if result["status"] != "ok":
            metadata["failure"] = f"{result.get('failure_kind')}: {result.get('reason')}"
        program = Program(id=cid, code=child, language="python", parent_id=job.parent_id,
                          generation=job.parent_generation + 1, timestamp=float(job.iteration),
                          iteration_found=job.iteration, metrics=oe_metrics(result), metadata=metadata)
        return SerializableResult(child_program_dict=program.to_dict(), parent_id=job.parent_id,
                                  iteration_time=time.perf_counter() - t0, prompt=job.prompt,
                                  llm_response=response, iteration=job.iteration,
                                  target_island=job.island)

    # ------------------------------------------------------------------ prompt (main thread)
    def make_job(self, iteration: int, island: int) -> Job:
        oe = self.oe
        db, pcfg = oe.database, oe.config.prompt
        parent, inspirations = db.sample_from_island(island_id=island,
                                                     num_inspirations=pcfg.num_diverse_programs)
        parent_island = parent.metadata.get("island", island)
        island_programs = [db.programs[p] for p in db.islands[parent_island] if p in db.programs]
        island_programs.sort(key=lambda p: (-p.metrics.get("combined_score", safe_numeric_average(p.metrics)),
                                            p.iteration_found, p.id))
        shown = island_programs[: pcfg.num_top_programs + pcfg.num_diverse_programs]
        prompt = oe.prompt_sampler.build_prompt(
            current_program=parent.code, parent_program=parent.code, program_metrics=parent.metrics,
            previous_programs=[p.to_dict() for p in island_programs[: pcfg.num_top_programs]],
            top_programs=[p.to_dict() for p in shown], inspirations=[p.to_dict() for p in inspirations],
            language="python", evolution_round=iteration, diff_based_evolution=oe.config.diff_based_evolution,
            program_artifacts=None, feature_dimensions=db.config.feature_dimensions)
        recent = [f for f in self.failures if f[1] == parent_island][-3:]
        if recent:
            lines = [f"- iteration {it}: {text[:300]}\n  edit: {changes[:300]}" for it, _isl, text, changes in recent]
            prompt["user"] += ("\n\n# Recent candidates that scored 0 (avoid repeating these mistakes)\n"
                               + "\n".join(lines))
        ph = hashlib.sha256(json.dumps(prompt, sort_keys=True).encode()).hexdigest()
        return Job(iteration, island, parent.id, self.resolve_cid(parent), parent.code, parent.generation,
                   dict(parent.metrics), prompt, ph)

    def resolve_cid(self, program: Program) -> str | None:
        """Our candidate id for an OpenEvolve program (migrants are copies of a candidate)."""
        db = self.oe.database
        seen = 0
        while program is not None and seen < 100:
            if program.id in self.oe_to_cid:
                return self.oe_to_cid[program.id]
            if program.id.startswith("c") and self.run_dir.candidate_dir(program.id).is_dir():
                return program.id
            program = db.get(program.parent_id) if program.parent_id else None
            seen += 1
        return None

    # ------------------------------------------------------------------ whole run
    def _keep_failures_out(self, db: Any) -> None:
        """Failed candidates stay on disk and in the prompt's feedback, not in the population:
        a parent that fails admission would only breed children that fail the same way."""
        add = db.add

        def add_unless_failed(program: Program, iteration: int | None = None,
                              target_island: int | None = None) -> str | None:
            failure = program.metadata.get("failure")
            if failure:
                island = program.metadata.get("island", target_island or 0)
                self.failures.append((program.iteration_found, island, failure,
                                      str(program.metadata.get("changes", ""))))
                return None       # OpenEvolve treats this as "not admitted" and moves on
            return add(program, iteration=iteration, target_island=target_island)

        db.add = add_unless_failed

    def controller_class(self) -> type:
        engine = self

        class ThreadedController(ProcessParallelController):
            def start(self) -> None:
                self.executor = OrderedExecutor(self.num_workers)

            def stop(self) -> None:
                self.shutdown_event.set()
                engine.evaluator.cancel_all()
                ex, self.executor = self.executor, None
                if ex is not None:
                    ex.shutdown(wait=False)

            def request_shutdown(self) -> None:
                engine.progress.interrupted = True
                super().request_shutdown()
                engine.progress.note("interrupt received: stopping after cancelling evaluations in flight")
                engine.evaluator.cancel_all()

            def _submit_iteration(self, iteration: int, island_id: int | None = None):
                island = island_id if island_id is not None else self.database.current_island
                job = engine.make_job(iteration, island)
                engine.progress.submitted(iteration)
                return self.executor.submit(engine.run_job, job)

        return ThreadedController

    def run(self) -> bool:
        """Run (or replay, then continue) the search; True if all iterations completed."""
        import signal
        cfg = build_config(self.settings, self.system_message, self.run_dir)
        # OpenEvolve installs SIGINT/SIGTERM handlers for its run; put the caller's back after.
        saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._run(cfg)
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)

    def _run(self, cfg: Config) -> bool:
        with seeded_openevolve(self.settings.seed, self.controller_class()):
            self.oe = _OpenEvolve(str(self.run_dir.seed_py), str(ENTRY_FILE), cfg, str(self.run_dir.root))
            self.oe.evaluator = _EvaluatorAdapter(self)
            self._keep_failures_out(self.oe.database)
            asyncio.run(self.oe.run(iterations=self.settings.iterations))
        return not self.progress.interrupted and self.progress.iterations_done >= self.settings.iterations
