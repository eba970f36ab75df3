"""Benchmark: the default offline search, and policy files scored the way the search scores.

    # the search as a user runs it (local Ray, offline mutator, configs/search.yaml)
    .venv/bin/python benchmarks/bench_search.py [--axis scheduling] [--cell rtx70b_swe_0.1]
            [--with retention=ttl] [--iterations 50] [--workers 2]
    # policy files (e.g. the paper's listings) scored like a candidate: in-sample draws, then
    # the held-out draws, against the axis's seed with the same fixed policies
    .venv/bin/python benchmarks/bench_search.py --score tests/data/listings/scheduling_evolved.py \
            --axis scheduling --cell rtx70b_swe_0.1 --with retention=ttl

Prints wall time, the best candidate's in-sample and held-out fitness with intervals, the
run's counts, and how well the cascade's first stage (the target cell on the first draw)
separates candidates: the spread of its fitness over candidates and its rank correlation
with the full in-sample fitness.
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


def _ci(f: float, ci: list[float]) -> str:
    return f"{f:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]"


def _spearman(a: list[float], b: list[float]) -> float:
    import numpy as np
    ra = np.argsort(np.argsort(a))
    rb = np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 2 else float("nan")


def run_search(a: argparse.Namespace) -> int:
    run_dir = Path(a.run_dir) if a.run_dir else Path(tempfile.mkdtemp(prefix="bench_search_")) / "run"
    cmd = [sys.executable, "-P", "-m", "search", "--axis", a.axis, "--cell", a.cell, "--llm", "offline",
           "--iterations", str(a.iterations), "--workers", str(a.workers), "--seed", str(a.seed),
           "--run-dir", str(run_dir)] + (["--config", a.config] if a.config else [])
    for w in a.with_ or []:
        cmd += ["--with", w]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return proc.returncode
    meta = json.loads((run_dir / "run.json").read_text())
    results = [json.loads(p.read_text()) for p in (run_dir / "candidates").glob("*/result.json")]
    print(f"offline search: {a.axis} on {a.cell} with {a.with_ or 'cell defaults'}, "
          f"{meta['iterations_done']}/{a.iterations} iterations, {a.workers} workers")
    print(f"wall time: {wall:.1f} s ({wall / 60:.2f} min)")
    c = meta["counts"]
    print(f"candidates: {len(results) - 1} scored ({c['failed_candidates']} failed, {c['duplicates']} duplicates "
          f"or no-ops), {c['format_failures']} answers without a program")
    ok = [r for r in results if r["status"] == "ok" and r["iteration"] > 0]
    best_in = sorted(ok, key=lambda r: (-r["score"], -r["fitness"], r["iteration"]))
    if best_in:
        b = best_in[0]
        print(f"best in-sample (by lower bound): {b['candidate_id']} {_ci(b['fitness'], b['fitness_ci'])} "
              f"per draw {b['per_draw']}")
    for r in sorted((r for r in results if r.get("heldout")), key=lambda r: -r["heldout"]["fitness_ci"][0]):
        h = r["heldout"]
        print(f"  {r['candidate_id']}: in-sample {_ci(r['fitness'], r['fitness_ci'])}  held-out "
              f"{_ci(h['fitness'], h['fitness_ci'])} ({h['level']:.1%})  significant={h['significant']}")
    print(f"verdict: {meta.get('verdict')}")
    s1 = [(r["metrics"]["stage1_fitness"], r["fitness"]) for r in ok if "stage1_fitness" in r["metrics"]]
    stopped = sum(r.get("failure_kind") == "stage1" for r in results)
    if s1:
        import numpy as np
        x = np.array([v for v, _ in s1])
        print(f"stage 1 (target cell, draw 0) over {len(s1)} ok candidates: fitness min {x.min():.4f} max {x.max():.4f}"
              f" std {x.std():.4f}, {len(set(np.round(x, 6)))} distinct values; Spearman with in-sample fitness "
              f"{_spearman([v for v, _ in s1], [f for _, f in s1]):.3f}; {stopped} candidates stopped at stage 1")
    if a.compare_short_cell and ok:
        compare_short_cell(a, run_dir, meta, ok)
    print(f"run: {run_dir}")
    return 0


def compare_short_cell(a: argparse.Namespace, run_dir: Path, meta: dict, ok: list[dict]) -> None:
    """The old cascade stage: the family's 10-program cell. How many distinct fitness values
    does it give the same candidates?"""
    import numpy as np

    from evaluator import raypool
    from evaluator.service import EvalPlan, RayEvaluator
    from search.driver import fixed_for_tasks, short_cell
    from search.rundir import RunDir
    short = short_cell(a.cell, "auto")
    rd = RunDir(run_dir)
    plan = EvalPlan(axis=a.axis, seed_source=rd.seed_py.read_text(), cells=(short,), draws=(0,), stage1=False,
                    leak_cell=None, fixed=fixed_for_tasks(rd, rd.load_meta()))
    raypool.connect(None, a.workers)
    try:
        e = RayEvaluator(plan)
        vals = []
        for r in ok:
            src = (run_dir / "candidates" / r["candidate_id"] / "program.py").read_text()
            ev = e.score_on(src, [0], check=False)
            vals.append(ev.fitness if ev.status == "ok" else float("nan"))
        x = np.array(vals)
        print(f"the same {len(x)} candidates on {short} (draw 0, the old stage 1): min {np.nanmin(x):.4f} "
              f"max {np.nanmax(x):.4f} std {np.nanstd(x):.4f}, {len(set(np.round(x, 6)))} distinct values")
    finally:
        raypool.shutdown()


def score_files(a: argparse.Namespace) -> int:
    from evaluator import raypool
    from evaluator.service import EvalPlan, RayEvaluator
    from search.driver import default_seed_source, parse_with
    from search.settings import load_settings

    settings = load_settings(a.config)
    ev = settings.evaluator
    fixed = {ax: ({"name": p} if src is None else {"source": src})
             for ax, (p, src) in parse_with(a.with_, a.axis).items()}
    seed = Path(a.seed_file).read_text() if a.seed_file else default_seed_source(a.axis)
    plan = EvalPlan(axis=a.axis, seed_source=seed, cells=(a.cell,), draws=tuple(ev.workload_seeds), stage1=False,
                    leak_cell=None, timeout_s=settings.timeout_s, fixed=fixed)
    raypool.connect(None, a.workers)
    try:
        e = RayEvaluator(plan)
        for f in a.score:
            src = Path(f).read_text()
            t0 = time.perf_counter()
            ins = e.score_on(src, list(ev.workload_seeds), check=False)
            out = e.score_on(src, list(ev.heldout.draws), check=False)
            if ins.status != "ok" or out.status != "ok":
                print(f"{f}: failed: {ins.reason or out.reason}")
                continue
            i, o = ins.estimate, out.estimate
            print(f"{f} ({a.axis} on {a.cell}, fixed {a.with_ or 'cell defaults'}):")
            print(f"  in-sample draws {i.draws}: {_ci(i.fitness, [i.lo, i.hi])}  per draw "
                  + ", ".join(f"{d}: {v:.4f}" for d, v in i.per_draw.items()))
            print(f"  held-out draws {o.draws}: {_ci(o.fitness, [o.lo, o.hi])}  per draw "
                  + ", ".join(f"{d}: {v:.4f}" for d, v in o.per_draw.items())
                  + f"   ({time.perf_counter() - t0:.1f} s)")
    finally:
        raypool.shutdown()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cell", default="rtx70b_swe_0.1")
    ap.add_argument("--axis", default="scheduling")
    ap.add_argument("--with", dest="with_", action="append", metavar="AXIS=POLICY")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--run-dir", default=None, help="keep the run here (default: a temporary directory)")
    ap.add_argument("--config", default=None, help="extra search settings YAML")
    ap.add_argument("--compare-short-cell", action="store_true",
                    help="also score the run's candidates on the family's 10-program cell (the old stage 1)")
    ap.add_argument("--score", nargs="+", metavar="FILE", help="score these policy files instead of searching")
    ap.add_argument("--seed-file", help="the baseline policy for --score (default: the axis's shipped seed)")
    a = ap.parse_args()
    return score_files(a) if a.score else run_search(a)


if __name__ == "__main__":
    sys.exit(main())
