"""The on-disk layout of a search run and its records. This module owns run.json.

runs/<run-id>/
  run.json                       RunMeta (below)
  seed.py                        the seed policy file the run started from
  fixed/<axis>.py                a policy file fixed with `--with AXIS=FILE` (copied in)
  candidates/<id>/program.py     every evaluated candidate's source
  candidates/<id>/result.json    CandidateResult (below)
  journal/llm/<iteration>.json   JournalRecord: the prompt, the model, its answer or error
  best/policy.py, best/result.json
Every file is written atomically (temporary file + os.replace), so a kill -9 leaves
either the old or the new version, never a torn one. run.json changes only through
`RunDir.update`, under a lock, from the in-memory RunMeta.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evaluator.fitness import FitnessEstimate
from evaluator.task import FailureKind

RunStatus = Literal["created", "running", "finished", "failed", "interrupted"]
# Why an iteration produced no candidate (the LLM's answer could not become a program).
FormatFailure = Literal["no-edit", "no-match", "unchanged", "too-long", "rewrite-outside-block"]


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class RunError(ValueError):
    """A run directory is missing or malformed; one line naming the file."""


class _Record(BaseModel):
    # Unknown fields are kept: runs written by a newer (or older) version still load and
    # round-trip without losing what they carry.
    model_config = ConfigDict(extra="allow")


class LLMPhase(_Record):
    from_iteration: int
    llm: str
    llm_models: list[dict[str, Any]]


class Counts(_Record):
    llm_failures: int = 0          # LLM calls that failed (after their retries)
    format_failures: int = 0       # answers that did not yield a program (no edit, SEARCH not found, ...)
    failed_candidates: int = 0     # candidates that scored 0 (markers, gate, leak, crash, ...)
    duplicates: int = 0            # candidates whose source or behaviour repeats an earlier one


class HeldOutPlan(_Record):
    draws: list[int]
    top: int
    level: float                   # per-candidate level (Bonferroni over the `top` candidates)


class RunMeta(_Record):
    run_id: str
    axis: str
    cell: str
    seed_file: str
    config: dict[str, Any]
    fixed_policies: dict[str, dict[str, str]] = {}   # axis -> {"name": N} | {"file": "fixed/<axis>.py", "origin": P}
    llm: str
    llm_models: list[dict[str, Any]]
    llm_history: list[LLMPhase] = []
    status: RunStatus = "created"
    iterations_planned: int
    iterations_done: int = 0
    pipeline_depth: int = 1
    started_at: str | None = None
    finished_at: str | None = None
    best_candidate: str | None = None      # the run's pick (held-out when re-scored, else in-sample)
    winner: str | None = None              # best_candidate when it beats the seed significantly on held-out draws
    verdict: str | None = None             # one line: what the run found
    heldout: HeldOutPlan | None = None
    counts: Counts = Counts()
    error: str | None = None


class HeldOut(_Record):
    """A candidate re-scored on workload draws the search never saw."""
    fitness: float
    fitness_ci: list[float]
    level: float
    draws: list[int]
    per_draw: dict[str, float]
    significant: bool
    mean_jct_s: float | None = None
    seed_mean_jct_s: float | None = None
    failure: str | None = None              # why re-scoring failed (then fitness is 0)


class CandidateResult(_Record):
    candidate_id: str
    parent_id: str | None
    island: int
    generation: int
    iteration: int
    status: Literal["ok", "failed"]
    fitness: float                          # point estimate over the in-sample draws (0 if failed)
    fitness_ci: list[float]                 # [lo, hi] of the (draw, program) bootstrap
    score: float | None = None              # ranking key: the lower bound (filled from fitness_ci if absent)
    draws: list[int] = []
    per_draw: dict[str, float] = {}
    failure_kind: FailureKind | None = None
    reason: str | None = None
    metrics: dict[str, Any] = {}
    behaviour: str | None = None
    duplicate_of: str | None = None         # same source as this earlier candidate
    same_behaviour_as: str | None = None    # different source, identical JCTs everywhere
    noop: bool = False                      # identical JCTs to the seed: changes no decision that matters
    model: str | None = None                # the LLM that proposed it
    heldout: HeldOut | None = None
    wall_s: float = 0.0
    created_at: str = Field(default_factory=now_iso)

    @model_validator(mode="after")
    def _score(self) -> "CandidateResult":
        if self.score is None:    # results written before the score existed: their lower bound
            self.score = float(self.fitness_ci[0]) if self.fitness_ci else 0.0
        return self

    @staticmethod
    def from_estimate(est: FitnessEstimate | None) -> dict[str, Any]:
        if est is None:
            return {"fitness": 0.0, "fitness_ci": [0.0, 0.0], "score": 0.0}
        return {"fitness": est.fitness, "fitness_ci": [est.lo, est.hi], "score": est.lo,
                "draws": list(est.draws), "per_draw": dict(est.per_draw)}

    def insample_key(self) -> tuple:
        """Best first on the in-sample draws: ok, lower bound, point fitness, earlier iteration."""
        return (self.status != "ok", -self.score, -self.fitness, self.iteration, self.candidate_id)

    def rank_key(self) -> tuple:
        """Best first: ok, then held-out lower bound (when re-scored), in-sample lower bound,
        point fitness, earlier iteration."""
        ho = self.heldout.fitness_ci[0] if self.heldout is not None else float("-inf")
        return (self.status != "ok", -ho, -self.score, -self.fitness, self.iteration, self.candidate_id)


class JournalRecord(_Record):
    iteration: int
    island: int
    parent_id: str | None
    model: str
    prompt: dict[str, str]                  # {"system": ..., "user": ...}
    prompt_hash: str
    response: str | None = None
    error: str | None = None                # one line: what failed, where, after how long
    seconds: float = 0.0
    attempts: int = 1
    usage: dict[str, Any] | None = None
    outcome: str | None = None              # "candidate <id>" or "format: <what>"
    format_failure: FormatFailure | None = None
    created_at: str = Field(default_factory=now_iso)


class RunDir:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._meta: RunMeta | None = None

    # paths
    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def seed_py(self) -> Path:
        return self.root / "seed.py"

    def candidate_dir(self, cid: str) -> Path:
        return self.root / "candidates" / cid

    def journal_path(self, iteration: int) -> Path:
        return self.root / "journal" / "llm" / f"{iteration:05d}.json"

    # run.json
    def load_meta(self) -> RunMeta:
        if not self.run_json.is_file():
            raise RunError(f"{self.run_json}: not a search run (run.json missing)")
        try:
            meta = RunMeta.model_validate(read_json(self.run_json))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RunError(f"{self.run_json}: unreadable: {e}") from None
        except ValidationError as e:
            err = e.errors()[0]
            raise RunError(f"{self.run_json}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        with self._lock:
            self._meta = meta
        return meta

    @property
    def meta(self) -> RunMeta:
        return self._meta if self._meta is not None else self.load_meta()

    def create_meta(self, meta: RunMeta) -> None:
        with self._lock:
            self._meta = meta
            atomic_write_json(self.run_json, meta.model_dump(mode="json"))

    def update(self, **changes: Any) -> RunMeta:
        """Change fields of run.json and write it (atomically, under a lock)."""
        with self._lock:
            base = self._meta if self._meta is not None else RunMeta.model_validate(read_json(self.run_json))
            self._meta = base.model_copy(update=changes)
            atomic_write_json(self.run_json, self._meta.model_dump(mode="json"))
            return self._meta

    # candidates
    def write_candidate(self, source: str, result: CandidateResult) -> None:
        d = self.candidate_dir(result.candidate_id)
        atomic_write_text(d / "program.py", source)
        self.write_result(result)     # written last: its presence means complete

    def write_result(self, result: CandidateResult) -> None:
        atomic_write_json(self.candidate_dir(result.candidate_id) / "result.json", result.model_dump(mode="json"))

    def read_candidate(self, cid: str) -> tuple[str, CandidateResult] | None:
        d = self.candidate_dir(cid)
        try:
            return (d / "program.py").read_text(encoding="utf-8"), CandidateResult.model_validate(
                read_json(d / "result.json"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValidationError):
            return None

    def candidates(self) -> list[CandidateResult]:
        out = []
        base = self.root / "candidates"
        if base.is_dir():
            for d in sorted(base.iterdir()):
                r = d / "result.json"
                if r.is_file():
                    try:
                        out.append(CandidateResult.model_validate(read_json(r)))
                    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValidationError):
                        continue
        return out

    def leaderboard(self) -> list[CandidateResult]:
        return sorted(self.candidates(), key=CandidateResult.rank_key)

    def write_best(self, source: str, result: CandidateResult) -> None:
        atomic_write_text(self.root / "best" / "policy.py", source)
        atomic_write_json(self.root / "best" / "result.json", result.model_dump(mode="json"))

    # LLM journal
    def journal_get(self, iteration: int) -> JournalRecord | None:
        try:
            return JournalRecord.model_validate(read_json(self.journal_path(iteration)))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValidationError):
            return None

    def journal_put(self, record: JournalRecord) -> None:
        atomic_write_json(self.journal_path(record.iteration), record.model_dump(mode="json"))
