"""Benchmark: the default offline search, 50 iterations on rtx70b_swe_0.1 (paper §5.3 cell).

Runs `python -m search` exactly as a user would (local Ray, offline mutator, default
settings from configs/search.yaml) and prints wall time and the best fitness with its
95% bootstrap interval. Target on the 2-core development machine: <= 10 minutes.

    .venv/bin/python benchmarks/bench_search.py [--iterations 50] [--workers 2] [--cell rtx70b_swe_0.1]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cell", default="rtx70b_swe_0.1")
    ap.add_argument("--axis", default="scheduling")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--run-dir", default=None, help="keep the run here (default: a temporary directory)")
    ap.add_argument("--config", default=None, help="extra search settings YAML (e.g. more workload seeds)")
    a = ap.parse_args()
    run_dir = Path(a.run_dir) if a.run_dir else Path(tempfile.mkdtemp(prefix="bench_search_")) / "run"
    cmd = [sys.executable, "-m", "search", "--axis", a.axis, "--cell", a.cell, "--llm", "offline",
           "--iterations", str(a.iterations), "--workers", str(a.workers), "--seed", str(a.seed),
           "--run-dir", str(run_dir)] + (["--config", a.config] if a.config else [])
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return proc.returncode
    meta = json.loads((run_dir / "run.json").read_text())
    best = json.loads((run_dir / "best" / "result.json").read_text())
    results = [json.loads(p.read_text()) for p in (run_dir / "candidates").glob("*/result.json")]
    failed = sum(r["status"] != "ok" for r in results)
    lo, hi = best["fitness_ci"]
    print(f"offline search: {a.axis} on {a.cell}, {meta['iterations_done']}/{a.iterations} iterations, "
          f"{a.workers} workers")
    print(f"wall time: {wall:.1f} s ({wall / 60:.2f} min)")
    print(f"candidates: {len(results)} scored, {failed} failed")
    print(f"best: {best['candidate_id']} fitness {best['fitness']:.4f}  95% CI [{lo:.4f}, {hi:.4f}]  "
          f"(mean JCT {best['metrics'].get('mean_jct_s', float('nan')):.1f} s vs seed "
          f"{best['metrics'].get('seed_mean_jct_s', float('nan')):.1f} s)")
    print(f"run: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
