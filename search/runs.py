"""Read search runs (the layout in search/rundir.py) into pandas tables.

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

from simcore.config import ConfigError

ENV_RUNS = "AGENTSERVESIM_RUNS"
FINISHED = "finished"
LEADER_COLUMNS = ["rank", "candidate_id", "fitness", "fitness_lo", "fitness_hi", "mean_jct_s", "p99_jct_s",
                  "island", "generation", "iteration", "parent_id", "status", "reason"]


class RunsError(ConfigError):
    """Unknown run or candidate, or a run/candidate that cannot be used; one line."""


def runs_root(cli_value: str | None = None) -> Path:
    """--runs-dir, else $AGENTSERVESIM_RUNS, else ./runs."""
    return Path(cli_value or os.environ.get(ENV_RUNS) or "runs")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunsError(f"{path}: missing") from None
    except (OSError, json.JSONDecodeError) as e:
        raise RunsError(f"{path}: unreadable: {e}") from None


@dataclass(frozen=True)
class Run:
    root: Path
    meta: dict[str, Any]

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id") or self.root.name)

    @property
    def axis(self) -> str:
        return str(self.meta["axis"])

    @property
    def cell(self) -> str:
        return str(self.meta["cell"])

    @property
    def status(self) -> str:
        return str(self.meta.get("status") or "unknown")

    @property
    def workload_seeds(self) -> list[int]:
        ev = (self.meta.get("config") or {}).get("evaluator") or {}
        return [int(s) for s in ev.get("workload_seeds") or [0]]

    @property
    def allow_weak_sandbox(self) -> bool:
        """Whether the run evaluated candidates with a sandbox lacking a layer (--allow-weak-sandbox)."""
        return bool(((self.meta.get("config") or {}).get("evaluator") or {}).get("allow_weak_sandbox"))

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
    meta = _read_json(root / "run.json")
    if not isinstance(meta, dict):
        raise RunsError(f"{root / 'run.json'}: expected a JSON object")
    for k in ("axis", "cell", "status"):
        if k not in meta:
            raise RunsError(f"{root / 'run.json'}: missing field '{k}'")
    return Run(root, meta)


def all_runs(base: Path) -> list[Run]:
    """Every readable run under `base`, oldest first (by started_at, then name)."""
    if not base.is_dir():
        return []
    runs = [load_run(d) for d in sorted(base.iterdir()) if (d / "run.json").is_file()]
    return sorted(runs, key=lambda r: (str(r.meta.get("started_at") or ""), r.root.name))


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


def candidates(run: Run) -> pd.DataFrame:
    """One row per evaluated candidate, best first (ties: earlier iteration, then id)."""
    rows = []
    base = run.root / "candidates"
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        if not (d / "result.json").is_file():
            continue  # being written: result.json lands last
        r = _read_json(d / "result.json")
        m = r.get("metrics") or {}
        lo, hi = (list(r.get("fitness_ci") or []) + [None, None])[:2]
        rows.append({"candidate_id": r.get("candidate_id", d.name), "fitness": float(r.get("fitness") or 0.0),
                     "fitness_lo": lo, "fitness_hi": hi, "mean_jct_s": m.get("mean_jct_s"),
                     "p99_jct_s": m.get("p99_jct_s"), "island": r.get("island"),
                     "generation": r.get("generation"), "iteration": int(r.get("iteration") or 0),
                     "parent_id": r.get("parent_id"), "status": r.get("status", "unknown"),
                     "reason": r.get("reason")})
    df = pd.DataFrame(rows, columns=LEADER_COLUMNS[1:])
    if df.empty:
        return df.assign(rank=pd.Series(dtype=int))[LEADER_COLUMNS]
    df["_ok"] = df["status"] == "ok"
    df = df.sort_values(["_ok", "fitness", "iteration", "candidate_id"], ascending=[False, False, True, True])
    df = df.drop(columns="_ok").reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    return df


def best_fitness(run: Run) -> float | None:
    df = candidates(run)
    ok = df[df["status"] == "ok"]
    return None if ok.empty else float(ok["fitness"].max())


def runs_table(base: Path) -> pd.DataFrame:
    rows = []
    for r in all_runs(base):
        done, planned = r.meta.get("iterations_done"), r.meta.get("iterations_planned")
        rows.append({"run_id": r.root.name, "axis": r.axis, "cell": r.cell,
                     "iterations": f"{done if done is not None else '?'}/{planned if planned is not None else '?'}",
                     "best_fitness": best_fitness(r), "best_candidate": r.meta.get("best_candidate"),
                     "status": r.status, "started_at": r.meta.get("started_at"),
                     "sandbox": "weak" if r.allow_weak_sandbox else "full"})
    return pd.DataFrame(rows, columns=["run_id", "axis", "cell", "iterations", "best_fitness",
                                       "best_candidate", "status", "started_at", "sandbox"])


def candidate(run: Run, cid: str | None) -> tuple[str, dict[str, Any]]:
    """(source, result) of a candidate; None = the run's best. Failed candidates are refused."""
    if cid is None:
        cid = run.meta.get("best_candidate")
        if not cid:
            raise RunsError(f"run '{run.run_id}' has no best candidate yet (no candidate scored ok)")
    d = run.root / "candidates" / cid
    if not (d / "result.json").is_file():
        raise RunsError(f"unknown candidate '{cid}' in run '{run.run_id}'")
    result = _read_json(d / "result.json")
    src = d / "program.py"
    if not src.is_file():
        raise RunsError(f"{src}: missing")
    return src.read_text(encoding="utf-8"), result


def require_ok(run: Run, result: dict[str, Any]) -> None:
    if result.get("status") != "ok":
        raise RunsError(f"candidate '{result.get('candidate_id')}' of run '{run.run_id}' failed "
                        f"({result.get('reason') or 'no reason recorded'}); pick an ok candidate")


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


def island_progress(run: Run) -> pd.DataFrame:
    """Best fitness so far per island at every iteration (ok candidates only).

    The seed (no parent) counts for every island: all islands start from it.
    """
    df = candidates(run)
    df = df[df["status"] == "ok"]
    if df.empty:
        return pd.DataFrame(columns=["island", "iteration", "best_fitness"])
    islands = sorted({int(i) for i in df["island"].dropna()}) or [0]
    its = sorted(df["iteration"].unique())
    rows = []
    for isl in islands:
        mine = df[df["parent_id"].isna() | (df["island"] == isl)]
        best = float("nan")
        for it in its:
            at = mine[mine["iteration"] == it]["fitness"]
            if not at.empty:
                best = max(best, float(at.max())) if best == best else float(at.max())
            rows.append({"island": isl, "iteration": int(it), "best_fitness": best})
    return pd.DataFrame(rows)
