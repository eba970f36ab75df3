"""The on-disk layout of a search run (kept exactly; `evolve runs/leaderboard/...` read it).

runs/<run-id>/
  run.json                       run_id, axis, cell, seed_file, config, llm, status,
                                 iterations_planned, iterations_done, started_at,
                                 finished_at, best_candidate
  seed.py                        the seed policy file the run started from
  candidates/<id>/program.py     every evaluated candidate's source
  candidates/<id>/result.json    candidate_id, parent_id, island, generation, iteration,
                                 fitness, fitness_ci, metrics, status, reason, created_at
  checkpoints/                   OpenEvolve checkpoints
  journal/llm/<iteration>.json   the LLM's answer per iteration (replayed on resume)
  best/policy.py, best/result.json
Every file is written atomically (temporary file + os.replace), so a kill -9 leaves
either the old or the new version, never a torn one.
"""
from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


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


class RunDir:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    # paths
    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def seed_py(self) -> Path:
        return self.root / "seed.py"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def candidate_dir(self, cid: str) -> Path:
        return self.root / "candidates" / cid

    def journal_path(self, iteration: int) -> Path:
        return self.root / "journal" / "llm" / f"{iteration:05d}.json"

    # run.json
    def load_meta(self) -> dict[str, Any]:
        if not self.run_json.is_file():
            raise RunError(f"{self.run_json}: not a search run (run.json missing)")
        try:
            meta = read_json(self.run_json)
        except (OSError, json.JSONDecodeError) as e:
            raise RunError(f"{self.run_json}: unreadable: {e}") from None
        for k in ("run_id", "axis", "cell", "config", "status", "iterations_planned"):
            if k not in meta:
                raise RunError(f"{self.run_json}: missing field '{k}'")
        return meta

    def save_meta(self, meta: dict[str, Any]) -> None:
        atomic_write_json(self.run_json, meta)

    # candidates
    def write_candidate(self, cid: str, source: str, result: dict[str, Any]) -> None:
        d = self.candidate_dir(cid)
        atomic_write_text(d / "program.py", source)
        atomic_write_json(d / "result.json", result)   # written last: its presence means complete

    def read_candidate(self, cid: str) -> tuple[str, dict[str, Any]] | None:
        d = self.candidate_dir(cid)
        try:
            return (d / "program.py").read_text(encoding="utf-8"), read_json(d / "result.json")
        except (OSError, json.JSONDecodeError):
            return None

    def candidates(self) -> list[dict[str, Any]]:
        out = []
        base = self.root / "candidates"
        if base.is_dir():
            for d in sorted(base.iterdir()):
                r = d / "result.json"
                if r.is_file():
                    try:
                        out.append(read_json(r))
                    except (OSError, json.JSONDecodeError):
                        continue
        return out

    def leaderboard(self) -> list[dict[str, Any]]:
        """Candidates best first (ties: earlier iteration, then id)."""
        return sorted(self.candidates(), key=lambda r: (-float(r.get("fitness") or 0.0),
                                                        int(r.get("iteration") or 0), r["candidate_id"]))

    def write_best(self, source: str, result: dict[str, Any]) -> None:
        atomic_write_text(self.root / "best" / "policy.py", source)
        atomic_write_json(self.root / "best" / "result.json", result)

    # LLM journal
    def journal_get(self, iteration: int, prompt_hash: str) -> dict[str, Any] | None:
        p = self.journal_path(iteration)
        try:
            rec = read_json(p)
        except (OSError, json.JSONDecodeError):
            return None
        return rec if rec.get("prompt_hash") == prompt_hash else None

    def journal_put(self, iteration: int, record: dict[str, Any]) -> None:
        atomic_write_json(self.journal_path(iteration), record)
