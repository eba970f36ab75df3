"""Read search runs (the layout and records in search/rundir.py) into pandas tables.

Used by `evolve runs | leaderboard | show | plot | export`. Nothing here writes to a run.
"""
from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from simcore.errors import UserError

from .rundir import CandidateResult, JournalRecord, RunMeta

ENV_RUNS = "AGENTSERVESIM_RUNS"
FINISHED = "finished"
LEADER_COLUMNS = ["rank", "candidate_id", "fitness", "fitness_lo", "fitness_hi", "heldout_fitness",
                  "heldout_lo", "heldout_hi", "heldout_significant", "mean_jct_s", "p99_jct_s", "island",
                  "generation", "iteration", "parent_id", "model", "status", "failure_kind", "reason", "note"]


class RunsError(UserError, ValueError):
    """Unknown run or candidate, or a run/candidate that cannot be used; one line."""


def runs_root(cli_value: str | None = None) -> Path:
    """--runs-dir, else $AGENTSERVESIM_RUNS, else ./runs."""
    return Path(cli_value or os.environ.get(ENV_RUNS) or "runs")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunsError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunsError(f"{path}: unreadable: {' '.join(str(e).split())[:200]}") from None


def _result(path: Path) -> CandidateResult:
    try:
        return CandidateResult.model_validate(_read_json(path))
    except ValidationError as e:
        err = e.errors()[0]
        raise RunsError(f"{path}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


@dataclass(frozen=True)
class Run:
    root: Path
    meta: RunMeta

    @property
    def run_id(self) -> str:
        return str(self.meta.run_id or self.root.name)

    @property
    def axis(self) -> str:
        return self.meta.axis

    @property
    def cell(self) -> str:
        return self.meta.cell

    @property
    def status(self) -> str:
        return self.meta.status

    @property
    def workload_seeds(self) -> list[int]:
        """The in-sample workload/arrival draws."""
        ev = self.meta.config.get("evaluator") or {}
        return [int(s) for s in ev.get("workload_seeds") or [0]]

    @property
    def fixed_policies(self) -> dict[str, str]:
        """The other axes fixed with `--with`: axis -> shipped name or absolute path of the
        run's copy of the policy file (what `simulate(**{axis: value})` takes)."""
        out = {}
        for axis, spec in self.meta.fixed_policies.items():
            out[axis] = spec["name"] if "name" in spec else str((self.root / spec["file"]).resolve())
        return out

    @property
    def allow_weak_sandbox(self) -> bool:
        """Whether the run evaluated candidates with a sandbox lacking a layer (--allow-weak-sandbox)."""
        return bool((self.meta.config.get("evaluator") or {}).get("allow_weak_sandbox"))

    def seed_source(self) -> str:
        p = self.root / "seed.py"
        if not p.is_file():
            raise RunsError(f"{p}: missing (the run's seed policy)")
        return p.read_text(encoding="utf-8")

    def require_finished(self, what: str) -> None:
        if self.status in ("running", "created"):
            raise RunsError(f"run '{self.run_id}' is still in progress (status {self.status}); "
                            f"{what} needs a finished run")


def load_run(root: Path) -> Run:
    data = _read_json(root / "run.json")
    if not isinstance(data, dict):
        raise RunsError(f"{root / 'run.json'}: expected a JSON object")
    try:
        return Run(root, RunMeta.model_validate(data))
    except ValidationError as e:
        err = e.errors()[0]
        raise RunsError(f"{root / 'run.json'}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def all_runs(base: Path, unreadable: list[tuple[str, str]] | None = None) -> list[Run]:
    """Every readable run under `base`, oldest first (by started_at, then name). A run whose
    run.json cannot be read raises, unless `unreadable` collects (name, reason) instead."""
    if not base.is_dir():
        return []
    runs = []
    for d in sorted(base.iterdir()):
        if not (d / "run.json").is_file():
            continue
        try:
            runs.append(load_run(d))
        except RunsError as e:
            if unreadable is None:
                raise
            unreadable.append((d.name, str(e)))
    return sorted(runs, key=lambda r: (str(r.meta.started_at or ""), r.root.name))


def resolve_run(base: Path, ref: str | None) -> Run:
    """A run by id (directory name under `base`), by path, or the latest one when `ref` is None."""
    if ref is None:
        runs = all_runs(base)
        if not runs:
            raise RunsError(f"no runs under {base} (start one with `evolve --axis A --cell C`)")
        return runs[-1]
    for cand in (base / ref, Path(ref)):
        if (cand / "run.json").is_file():
            return load_run(cand)
    known = ", ".join(r.root.name for r in all_runs(base)[-5:]) or "none"
    raise RunsError(f"unknown run '{ref}' under {base} (latest: {known})")


def results(run: Run) -> list[CandidateResult]:
    base = run.root / "candidates"
    out = []
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        if (d / "result.json").is_file():      # being written: result.json lands last
            out.append(_result(d / "result.json"))
    return out


def _note(r: CandidateResult) -> str | None:
    if r.duplicate_of:
        return f"same source as {r.duplicate_of}"
    if r.noop:
        return "no-op: same JCTs as the seed"
    if r.same_behaviour_as:
        return f"same JCTs as {r.same_behaviour_as}"
    return None


def candidates(run: Run) -> pd.DataFrame:
    """One row per evaluated candidate: held-out-checked first (by held-out lower bound), then
    by in-sample lower bound, point fitness, earlier iteration; failed ones last."""
    rows = []
    for r in sorted(results(run), key=CandidateResult.rank_key):
        m = r.metrics or {}
        h = r.heldout
        lo, hi = (list(r.fitness_ci) + [None, None])[:2]
        rows.append({"candidate_id": r.candidate_id, "fitness": r.fitness, "fitness_lo": lo, "fitness_hi": hi,
                     "heldout_fitness": h.fitness if h else None, "heldout_lo": h.fitness_ci[0] if h else None,
                     "heldout_hi": h.fitness_ci[1] if h else None,
                     "heldout_significant": h.significant if h else None,
                     "mean_jct_s": m.get("mean_jct_s"), "p99_jct_s": m.get("p99_jct_s"), "island": r.island,
                     "generation": r.generation, "iteration": r.iteration, "parent_id": r.parent_id,
                     "model": r.model, "status": r.status, "failure_kind": r.failure_kind, "reason": r.reason,
                     "note": _note(r)})
    df = pd.DataFrame(rows, columns=LEADER_COLUMNS[1:])
    df.insert(0, "rank", range(1, len(df) + 1))
    return df


def best_fitness(run: Run) -> float | None:
    best = run.meta.best_candidate
    if best and (run.root / "candidates" / best / "result.json").is_file():
        return _result(run.root / "candidates" / best / "result.json").fitness
    return None


def runs_table(base: Path) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    broken: list[tuple[str, str]] = []
    for r in all_runs(base, broken):
        m = r.meta
        best, error = None, m.error
        if m.best_candidate and (r.root / "candidates" / m.best_candidate / "result.json").is_file():
            try:
                best = _result(r.root / "candidates" / m.best_candidate / "result.json")
            except RunsError as e:
                error = str(e)
        h = best.heldout if best else None
        rows.append({"run_id": r.root.name, "axis": r.axis, "cell": r.cell,
                     "fixed": ", ".join(f"{a}={p}" for a, p in sorted(
                         (a, s.get("name") or Path(s.get("origin") or s.get("file", "?")).name)
                         for a, s in m.fixed_policies.items())),
                     "llm": m.llm, "iterations": f"{m.iterations_done}/{m.iterations_planned}",
                     "best_candidate": m.best_candidate, "best_fitness": best.fitness if best else None,
                     "best_lo": best.fitness_ci[0] if best else None,
                     "heldout_fitness": h.fitness if h else None, "heldout_lo": h.fitness_ci[0] if h else None,
                     "winner": m.winner, "llm_failures": m.counts.llm_failures,
                     "format_failures": m.counts.format_failures, "failed_candidates": m.counts.failed_candidates,
                     "status": r.status, "started_at": m.started_at, "error": error,
                     "sandbox": "weak" if r.allow_weak_sandbox else "full"})
    # a damaged run is listed, not allowed to hide the others
    rows += [{"run_id": name, "status": "unreadable", "error": why} for name, why in broken]
    return pd.DataFrame(rows, columns=["run_id", "axis", "cell", "fixed", "llm", "iterations", "best_candidate",
                                       "best_fitness", "best_lo", "heldout_fitness", "heldout_lo", "winner",
                                       "llm_failures", "format_failures", "failed_candidates", "status",
                                       "started_at", "error", "sandbox"])


def candidate(run: Run, cid: str | None) -> tuple[str, dict[str, Any]]:
    """(source, result as a dict) of a candidate; None = the run's best."""
    if cid is None:
        cid = run.meta.best_candidate
        if not cid:
            raise RunsError(f"run '{run.run_id}' has no best candidate yet (no candidate scored ok)")
    d = run.root / "candidates" / cid
    if not (d / "result.json").is_file():
        raise RunsError(f"unknown candidate '{cid}' in run '{run.run_id}'")
    result = _result(d / "result.json").model_dump(mode="json")
    src = d / "program.py"
    if not src.is_file():
        raise RunsError(f"{src}: missing")
    return src.read_text(encoding="utf-8"), result


def require_ok(run: Run, result: dict[str, Any]) -> None:
    if result.get("status") != "ok":
        raise RunsError(f"candidate '{result.get('candidate_id')}' of run '{run.run_id}' failed "
                        f"({result.get('reason') or 'no reason recorded'}); pick an ok candidate")


def journal(run: Run, iteration: int) -> JournalRecord | None:
    """The prompt and answer of one iteration (None for the seed or a missing record)."""
    p = run.root / "journal" / "llm" / f"{iteration:05d}.json"
    if iteration <= 0 or not p.is_file():
        return None
    try:
        return JournalRecord.model_validate(_read_json(p))
    except ValidationError as e:
        raise RunsError(f"{p}: {e.errors()[0]['msg']}") from None


def lineage(run: Run, cid: str) -> list[dict[str, Any]]:
    """The candidate, its parent, ... back to the seed (parent_id None). Stops on a missing parent."""
    chain: list[dict[str, Any]] = []
    seen: set[str] = set()
    cur: str | None = cid
    while cur and cur not in seen:
        seen.add(cur)
        p = run.root / "candidates" / cur / "result.json"
        if not p.is_file():
            chain.append({"candidate_id": cur, "status": "missing"})
            break
        r = _read_json(p)
        chain.append(r)
        cur = r.get("parent_id")
    return chain


def seed_diff(run: Run, source: str, cid: str) -> str:
    seed = run.seed_source()
    return "".join(difflib.unified_diff(seed.splitlines(keepends=True), source.splitlines(keepends=True),
                                        fromfile="seed.py", tofile=f"{cid}/program.py"))


def fitness_progress(run: Run) -> pd.DataFrame:
    """Per island and iteration: the best candidate so far (by in-sample lower bound) with its
    fitness and interval. The seed (no parent) counts for every island."""
    ok = [r for r in results(run) if r.status == "ok" and not (r.duplicate_of or r.same_behaviour_as)]
    if not ok:
        return pd.DataFrame(columns=["island", "iteration", "best_fitness", "best_lo", "best_hi", "candidate_id"])
    islands = sorted({r.island for r in ok}) or [0]
    its = sorted({r.iteration for r in ok})
    rows = []
    for isl in islands:
        mine = [r for r in ok if r.parent_id is None or r.island == isl]
        best: CandidateResult | None = None
        for it in its:
            for r in (r for r in mine if r.iteration == it):
                if best is None or r.insample_key() < best.insample_key():
                    best = r
            if best is not None:
                rows.append({"island": isl, "iteration": it, "best_fitness": best.fitness,
                             "best_lo": best.fitness_ci[0], "best_hi": best.fitness_ci[1],
                             "candidate_id": best.candidate_id})
    return pd.DataFrame(rows)


def island_progress(run: Run) -> pd.DataFrame:
    """Best lower bound so far per island at every iteration (monotone), with fitness and interval."""
    return fitness_progress(run)
