"""The search loop: OpenEvolve's ProgramDatabase and PromptSampler, driven by a small loop of ours.

OpenEvolve keeps the population (islands, MAP-Elites feature grid, archive, elite/
exploration/exploitation sampling) and builds the prompts; we use only its public objects
(`ProgramDatabase.add / sample_from_island / should_migrate / increment_island_generation
/ save`, `PromptSampler.build_prompt`, its template manager, its diff utilities). The loop
itself is ours:
  - iteration j is submitted once iterations 1..j-depth are committed (depth = workers),
    and results are committed strictly in iteration order, so the database, and every
    prompt built from it, is a function of the run seed at any parallelism;
  - each iteration's LLM call and evaluation run on a daemon thread (a slow LLM server
    never holds the process at exit); the evaluation's CPU work runs in Ray tasks;
  - every prompt and answer is journaled and every candidate written as soon as it is
    scored, so `evolve resume` replays the run exactly and asks nothing twice;
  - Python's global `random`, which the database and sampler draw from, is seeded per
    iteration before each database step; migrants get deterministic ids (we migrate
    through `ProgramDatabase.add` with OpenEvolve's ring rule), and the process runs
    with PYTHONHASHSEED=0 (search/cli.py) because the database iterates sets of ids.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from openevolve.config import Config
from openevolve.database import Program, ProgramDatabase
from openevolve.prompt.sampler import PromptSampler
from openevolve.utils.code_utils import apply_diff_blocks, extract_diffs, format_diff_summary, parse_full_rewrite

from evaluator.admission import Rejected, check_markers
from evaluator.service import Evaluation, EvaluationCancelled, RayEvaluator, source_hash

from .llm import Backend, LLMCallError
from .progress import Progress
from .prompt import DIFF_USER, FRAGMENTS, feedback_section, key_features
from .rundir import CandidateResult, Counts, FormatFailure, JournalRecord, RunDir, now_iso
from .settings import SearchSettings


def candidate_id(iteration: int, source: str) -> str:
    return f"c{iteration:04d}-{source_hash(source)[:8]}"


def _rng_seed(seed: int, *parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()[:8], "big")


def oe_metrics(result: CandidateResult) -> dict[str, float]:
    """What OpenEvolve ranks by: both higher-is-better (see search/prompt.py)."""
    return {"combined_score": float(result.score), "fitness": float(result.fitness)}


def build_config(settings: SearchSettings, system: str) -> Config:
    cfg = Config()
    cfg.random_seed = settings.seed
    cfg.language = "python"
    cfg.diff_based_evolution = settings.diff_based
    cfg.max_code_length = settings.max_code_length
    db = cfg.database
    db.population_size = settings.population
    db.archive_size = min(settings.archive_size, settings.population)
    db.num_islands = settings.islands
    db.migration_interval = settings.migration_interval
    db.migration_rate = settings.migration_rate
    db.elite_selection_ratio = settings.elite_ratio
    db.exploration_ratio = settings.exploration
    db.exploitation_ratio = settings.exploitation
    db.random_seed = settings.seed
    db.log_prompts = False
    p = cfg.prompt
    p.system_message = system
    p.num_top_programs = settings.num_top_programs
    p.num_diverse_programs = settings.num_diverse_programs
    p.use_template_stochasticity = False
    p.include_artifacts = False
    p.suggest_simplification_after_chars = None   # our files carry docstrings outside the block
    p.code_length_threshold = None
    p.include_changes_under_chars = 300
    return cfg


@dataclass
class Job:
    iteration: int
    island: int
    parent: Program
    parent_cid: str
    prompt: dict[str, str]
    prompt_hash: str


@dataclass
class Outcome:
    iteration: int
    island: int
    parent_cid: str
    parent_pid: str = ""
    parent_metrics: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    llm_error: str | None = None
    format_failure: tuple[FormatFailure, str] | None = None
    source: str | None = None
    result: CandidateResult | None = None
    changes: str = ""
    cancelled: bool = False
    internal_error: str | None = None


@dataclass
class LoopState:
    committed: int = 0
    consecutive_llm_failures: int = 0
    counts: Counts = field(default_factory=Counts)
    stopped_reason: str | None = None


class SearchLoop:
    def __init__(self, run: RunDir, settings: SearchSettings, evaluator: RayEvaluator, backends: list[Backend],
                 progress: Progress, system: str, seed_source: str, depth: int,
                 stop: threading.Event) -> None:
        self.run_dir, self.settings, self.evaluator = run, settings, evaluator
        self.backends, self.progress, self.seed_source = backends, progress, seed_source
        self.depth, self.stop = max(1, depth), stop
        self.cfg = build_config(settings, system)
        self.db = ProgramDatabase(self.cfg.database)
        self.sampler = PromptSampler(self.cfg.prompt)
        for name, text in FRAGMENTS.items():
            self.sampler.template_manager.add_fragment(name, text)
        self.sampler.template_manager.add_template("diff_user", DIFF_USER)
        self.sampler.template_manager.add_template("full_rewrite_user", DIFF_USER)
        self.results: dict[str, CandidateResult] = {}      # committed candidates by id
        self.by_source: dict[str, str] = {}                  # source hash -> first committed candidate id
        self.by_behaviour: dict[str, str] = {}               # behaviour hash -> first committed candidate id
        self.feedback: dict[int, list[tuple[int, str]]] = {}
        self.best: CandidateResult | None = None
        self.state = LoopState()
        self._evals: dict[str, Evaluation] = {}              # source hash -> evaluation (reuse, any thread)
        self._lock = threading.Lock()
        self._done: dict[int, Outcome] = {}
        self._cv = threading.Condition()
        self.seed_cid = candidate_id(0, seed_source)

    # ------------------------------------------------------------------ database steps (main thread)
    def _seeded(self, *parts: Any) -> None:
        random.seed(_rng_seed(self.settings.seed, *parts))

    def _program(self, pid: str, cid: str, source: str, result: CandidateResult, parent_id: str | None,
                 generation: int, iteration: int, metadata: dict[str, Any]) -> Program:
        return Program(id=pid, code=source, language="python", parent_id=parent_id, generation=generation,
                       timestamp=float(iteration), iteration_found=iteration, metrics=oe_metrics(result),
                       metadata={"cid": cid, **metadata})

    def add_seed(self, result: CandidateResult) -> None:
        """The seed starts every island (OpenEvolve's controller copies it the same way)."""
        self._seeded("seed")
        self.results[result.candidate_id] = result
        self.by_source[source_hash(self.seed_source)] = result.candidate_id
        if result.behaviour:
            self.by_behaviour[result.behaviour] = result.candidate_id
        for isl in range(self.settings.islands):
            pid = self.seed_cid if isl == 0 else f"{self.seed_cid}@i{isl}"
            self.db.add(self._program(pid, self.seed_cid, self.seed_source, result, None, 0, 0, {}),
                        iteration=0, target_island=isl)
        self._offer_best(result, self.seed_source)

    def make_job(self, iteration: int) -> Job:
        island = (iteration - 1) % self.settings.islands
        self._seeded("sample", iteration)
        parent, inspirations = self.db.sample_from_island(island, num_inspirations=self.settings.num_diverse_programs)
        island_ids = sorted(p for p in self.db.islands[island] if p in self.db.programs)
        members = [self.db.programs[p] for p in island_ids]
        ranked = sorted(members, key=lambda p: (-p.metrics.get("combined_score", 0.0), p.iteration_found, p.id))
        recent = sorted(members, key=lambda p: (p.iteration_found, p.id))[-3:]
        shown = ranked[: self.settings.num_top_programs + self.settings.num_diverse_programs]
        prompt = self.sampler.build_prompt(
            current_program=parent.code, parent_program=parent.code, program_metrics=dict(parent.metrics),
            previous_programs=[self._view(p) for p in recent], top_programs=[self._view(p) for p in shown],
            inspirations=[self._view(p) for p in inspirations], language="python", evolution_round=iteration,
            diff_based_evolution=self.settings.diff_based, program_artifacts=None,
            feature_dimensions=self.db.config.feature_dimensions)
        prompt = {"system": prompt["system"],
                  "user": prompt["user"] + feedback_section(self.feedback.get(island, [])[-3:])}
        ph = hashlib.sha256(json.dumps(prompt, sort_keys=True).encode()).hexdigest()
        return Job(iteration, island, parent, str(parent.metadata.get("cid") or self.seed_cid), prompt, ph)

    def _view(self, p: Program) -> dict[str, Any]:
        d = p.to_dict()
        r = self.results.get(str(p.metadata.get("cid")))
        if r is not None:
            d["key_features"] = key_features(r)
        return d

    def _migrate(self) -> None:
        """OpenEvolve's ring migration (the best `migration_rate` of each island to both
        neighbours), through the public `add`, with ids derived from the candidate's."""
        n = len(self.db.islands)
        if n < 2:
            return
        gen = max(self.db.island_generations)
        moves = []
        for i, island in enumerate(self.db.islands):
            progs = sorted((self.db.programs[p] for p in island if p in self.db.programs),
                           key=lambda p: (-p.metrics.get("combined_score", 0.0), p.id))
            for p in progs[: max(1, int(len(progs) * self.settings.migration_rate))]:
                if p.metadata.get("migrant"):
                    continue
                for t in sorted({(i + 1) % n, (i - 1) % n} - {i}):
                    if any(self.db.programs[q].code == p.code for q in self.db.islands[t] if q in self.db.programs):
                        continue
                    moves.append((p, t))
        for p, t in moves:
            cid = str(p.metadata.get("cid"))
            copy = Program(id=f"{cid}@i{t}g{gen}", code=p.code, language="python", parent_id=p.id,
                           generation=p.generation, timestamp=p.timestamp, iteration_found=p.iteration_found,
                           metrics=dict(p.metrics), metadata={**p.metadata, "island": t, "migrant": True})
            self.db.add(copy, target_island=t)
        self.db.last_migration_generation = gen

    def commit(self, out: Outcome) -> None:
        """Apply one iteration's outcome, in iteration order."""
        st, it = self.state, out.iteration
        self._seeded("commit", it)
        if out.llm_error is not None:
            st.counts.llm_failures += 1
            st.consecutive_llm_failures += 1
            self.progress.iteration_error(it, f"LLM call failed: {out.llm_error}")
            if st.consecutive_llm_failures >= self.settings.llm.max_consecutive_failures:
                st.stopped_reason = (f"stopped after {st.consecutive_llm_failures} consecutive failed LLM calls; "
                                     f"last: {out.llm_error}")
        else:
            st.consecutive_llm_failures = 0
        if out.format_failure is not None:
            kind, text = out.format_failure
            st.counts.format_failures += 1
            self.feedback.setdefault(out.island, []).append((it, text))
            self.progress.iteration_error(it, f"no candidate ({kind}): {text}")
            self._journal_outcome(it, f"format: {text}", kind)
        if out.result is not None and out.source is not None:
            self._commit_candidate(out)
        st.committed = it
        if it % self.settings.checkpoint_interval == 0:
            self.db.save(str(self.run_dir.root / "checkpoints" / f"checkpoint_{it}"), iteration=it)

    def _commit_candidate(self, out: Outcome) -> None:
        r, src, it = out.result, out.source, out.iteration
        assert r is not None and src is not None
        st = self.state
        labels: dict[str, Any] = {"duplicate_of": None, "same_behaviour_as": None, "noop": False}
        h = source_hash(src)
        if h in self.by_source:
            labels["duplicate_of"] = self.by_source[h]
        elif r.status == "ok" and r.behaviour in self.by_behaviour:
            first = self.by_behaviour[r.behaviour]
            labels["same_behaviour_as"] = first
            labels["noop"] = first == self.seed_cid
        if any(labels[k] != getattr(r, k) for k in labels):
            r = r.model_copy(update=labels)
            self.run_dir.write_result(r)
        self.results[r.candidate_id] = r
        self.by_source.setdefault(h, r.candidate_id)
        if r.status == "ok" and r.behaviour:
            self.by_behaviour.setdefault(r.behaviour, r.candidate_id)
        self._journal_outcome(it, f"candidate {r.candidate_id}", None)
        if r.status != "ok":
            st.counts.failed_candidates += 1
            self.feedback.setdefault(out.island, []).append(
                (it, f"candidate scored 0 ({r.failure_kind}): {r.reason}; edit: {out.changes[:300]}"))
            return
        if r.duplicate_of or r.same_behaviour_as:
            st.counts.duplicates += 1
            what = ("the same program as " + r.duplicate_of if r.duplicate_of else
                    "no change in any decision that matters: every JCT equals the seed's" if r.noop else
                    "exactly the same JCTs as " + str(r.same_behaviour_as))
            self.feedback.setdefault(out.island, []).append((it, f"the edit gave {what}; try a different idea"))
            return       # adds nothing to the population
        prog = self._program(r.candidate_id, r.candidate_id, src, r, out.parent_pid or None, r.generation, it,
                             {"changes": out.changes, "parent_metrics": out.parent_metrics})
        self.db.add(prog, iteration=it, target_island=out.island)
        self.db.increment_island_generation(out.island)
        if self.db.should_migrate():
            self._migrate()
        self._offer_best(r, src)

    def _journal_outcome(self, iteration: int, outcome: str, kind: FormatFailure | None) -> None:
        rec = self.run_dir.journal_get(iteration)
        if rec is not None and (rec.outcome != outcome or rec.format_failure != kind):
            self.run_dir.journal_put(rec.model_copy(update={"outcome": outcome, "format_failure": kind}))

    def _offer_best(self, r: CandidateResult, source: str) -> None:
        if r.status != "ok" or r.duplicate_of or r.same_behaviour_as:
            return
        if self.best is None or r.insample_key() < self.best.insample_key():
            self.best = r
            self.run_dir.write_best(source, r)
            self.run_dir.update(best_candidate=r.candidate_id)

    # ------------------------------------------------------------------ one iteration (worker thread)
    def _backend(self, iteration: int) -> Backend:
        if len(self.backends) == 1:
            return self.backends[0]
        rng = random.Random(_rng_seed(self.settings.seed, "model", iteration))
        return rng.choices(self.backends, weights=[b.weight for b in self.backends], k=1)[0]

    def _answer(self, job: Job) -> tuple[str | None, str, str | None]:
        """(response, model, error) for a job: the journaled answer for this exact prompt, else a call."""
        rec = self.run_dir.journal_get(job.iteration)
        if rec is not None and rec.prompt_hash == job.prompt_hash and rec.response is not None:
            return rec.response, rec.model, None
        backend = self._backend(job.iteration)
        self.progress.llm_started(job.iteration, backend.spec)
        record = JournalRecord(iteration=job.iteration, island=job.island, parent_id=job.parent_cid,
                               model=backend.spec, prompt=job.prompt, prompt_hash=job.prompt_hash)
        t0 = time.monotonic()
        try:
            c = backend.complete(job.prompt["system"], job.prompt["user"], job.iteration,
                                 parent_code=job.parent.code)
            record = record.model_copy(update={"response": c.text, "seconds": round(c.seconds, 3),
                                               "attempts": c.attempts, "usage": c.usage})
            return c.text, backend.spec, None
        except LLMCallError as e:
            record = record.model_copy(update={"error": str(e), "seconds": round(time.monotonic() - t0, 3)})
            return None, backend.spec, str(e)
        except Exception as e:  # noqa: BLE001 - an unexpected client error is still one failed call
            msg = f"{backend.spec} at {backend.endpoint}: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
            record = record.model_copy(update={"error": msg, "seconds": round(time.monotonic() - t0, 3)})
            return None, backend.spec, msg
        finally:
            self.progress.llm_finished(job.iteration)
            if not self.stop.is_set() or record.response is not None:
                self.run_dir.journal_put(record)

    def _child(self, job: Job, response: str) -> tuple[str | None, str, tuple[FormatFailure, str] | None]:
        """(child source, change summary, format failure) from an answer."""
        parent = job.parent.code
        try:
            diffs = extract_diffs(response)
        except ValueError as e:
            return None, "", ("no-edit", f"malformed SEARCH/REPLACE answer: {e}")
        if diffs:
            child, applied = apply_diff_blocks(parent, diffs)
            if applied == 0:
                first = " ".join(diffs[0][0].split())[:80]
                return None, "", ("no-match", f"none of the {len(diffs)} SEARCH blocks matched the current "
                                              f"program exactly (first SEARCH: '{first}')")
            changes = format_diff_summary(diffs)
        elif re.search(r"```[a-zA-Z]*\n", response):
            child = parse_full_rewrite(response, "python") or ""
            if parent.endswith("\n") and not child.endswith("\n"):
                child += "\n"
            try:
                check_markers(child, self.seed_source)
            except Rejected as e:
                return None, "", ("rewrite-outside-block", f"a full program was given but it changes text "
                                                           f"outside the EVOLVE block ({e.reason[:160]})")
            changes = "full rewrite of the EVOLVE block"
        else:
            return None, "", ("no-edit", "the answer has no SEARCH/REPLACE block and no complete program")
        if child == parent:
            return None, "", ("unchanged", "the edit did not change the program")
        if len(child) > self.settings.max_code_length:
            return None, "", ("too-long", f"program too long ({len(child)} > {self.settings.max_code_length} chars)")
        return child, changes, None

    def score(self, source: str, iteration: int, parent_cid: str | None, island: int, generation: int,
              model: str | None) -> CandidateResult:
        """Evaluate (or reuse the stored evaluation of) one candidate and write it."""
        cid = candidate_id(iteration, source)
        stored = self.run_dir.read_candidate(cid)
        if stored is not None and stored[0] == source:
            self.progress.record(stored[1], replayed=True)
            return stored[1]
        h = source_hash(source)
        with self._lock:
            ev = self._evals.get(h)
        if ev is None:
            ev = self.evaluator.evaluate(source)
            with self._lock:
                self._evals.setdefault(h, ev)
        else:
            ev = ev.model_copy(update={"wall_s": 0.0})
        result = CandidateResult(
            candidate_id=cid, parent_id=parent_cid, island=island, generation=generation, iteration=iteration,
            status=ev.status, **CandidateResult.from_estimate(ev.estimate), failure_kind=ev.kind, reason=ev.reason,
            metrics=ev.metrics, behaviour=ev.behaviour, model=model, wall_s=round(ev.wall_s, 3))
        self.run_dir.write_candidate(source, result)
        self.progress.record(result)
        return result

    def run_job(self, job: Job) -> Outcome:
        out = Outcome(job.iteration, job.island, job.parent_cid, job.parent.id, dict(job.parent.metrics))
        try:
            response, out.model, out.llm_error = self._answer(job)
            if self.stop.is_set():
                out.cancelled = True
                return out
            if response is None:
                return out
            child, out.changes, out.format_failure = self._child(job, response)
            if child is None:
                return out
            out.source = child
            out.result = self.score(child, job.iteration, job.parent_cid, job.island,
                                    int(job.parent.generation) + 1, out.model)
        except EvaluationCancelled:
            out.cancelled = True
        return out

    def _thread(self, job: Job) -> None:
        try:
            out = self.run_job(job)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which fails the run
            out = Outcome(job.iteration, job.island, job.parent_cid,
                          internal_error=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
        with self._cv:
            self._done[job.iteration] = out
            self._cv.notify_all()

    # ------------------------------------------------------------------ whole search
    def run(self, first: int, last: int) -> str:
        """Iterations first..last; returns 'finished', 'interrupted' or 'failed' (state.stopped_reason)."""
        nxt = first
        committed = first - 1
        while committed < last:
            if self.stop.is_set():
                return "interrupted"
            while nxt <= last and nxt - committed <= self.depth and not self.stop.is_set():
                job = self.make_job(nxt)
                self.progress.submitted(nxt)
                threading.Thread(target=self._thread, args=(job,), daemon=True, name=f"search-it{nxt}").start()
                nxt += 1
            with self._cv:
                self._cv.wait_for(lambda: committed + 1 in self._done or self.stop.is_set(), timeout=0.25)
                out = self._done.pop(committed + 1, None)
            if out is None:
                continue
            if out.internal_error:
                self.state.stopped_reason = f"internal error in iteration {out.iteration}: {out.internal_error}"
                return "failed"
            if out.cancelled:
                return "interrupted"
            self.commit(out)
            committed = out.iteration
            self.run_dir.update(iterations_done=committed, counts=self.state.counts.model_copy())
            if self.state.stopped_reason:
                return "failed"
        if self.state.counts.llm_failures >= self.state.committed > 0:
            self.state.stopped_reason = f"every LLM call failed ({self.state.counts.llm_failures})"
            return "failed"
        return "finished"


def seed_result(cid: str, ev: Evaluation) -> CandidateResult:
    return CandidateResult(candidate_id=cid, parent_id=None, island=0, generation=0, iteration=0,
                           status="ok", **CandidateResult.from_estimate(ev.estimate), metrics=ev.metrics,
                           behaviour=ev.behaviour, model=None, created_at=now_iso())
