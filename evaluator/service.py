"""Driver-side evaluation: candidate source -> Ray tasks -> fitness record.

A candidate runs in up to two stages, each one Ray task with a hard deadline:
  stage 1 - a short cell (e.g. rtx70b_swe10_0.1) that cheaply filters broken candidates
            (and, with a threshold, clearly bad ones);
  full    - the target cell plus any extra cells, on every workload seed.
The seed policy's runs are computed once per (cell, workload seed) and cached. A timed-out
task is force-cancelled (OpenEvolve's own timeout does not stop running code); a worker
that dies is retried once by Ray, then the candidate fails with the reason.
"""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from . import fitness as fit
from .task import DEFAULT_SIMULATOR, run_policy


@dataclass(frozen=True)
class EvalPlan:
    axis: str
    seed_source: str
    cells: tuple[str, ...]                  # target cell first, then extra cells
    workload_seeds: tuple[int, ...] = (0,)
    stage1_cell: str | None = None
    stage1_threshold: float = 0.0           # stage-1 fitness below this fails the candidate
    timeout_s: float = 900.0
    simulator: str = DEFAULT_SIMULATOR
    leak_check: bool = True                 # counterfactual leakage test (3 extra runs of the first stage's cell)
    allow_weak_sandbox: bool = False        # run candidates where an isolation layer is unavailable


@dataclass
class Evaluation:
    status: str                              # "ok" | "failed"
    fitness: float
    fitness_ci: tuple[float, float]
    metrics: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    kind: str | None = None                  # failure class: markers|gate|leak|load|crash|timeout|worker|stage1
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fitness_ci"] = list(self.fitness_ci)
        return d

    @staticmethod
    def failed(kind: str, reason: str, wall_s: float = 0.0, metrics: dict | None = None) -> "Evaluation":
        return Evaluation("failed", 0.0, (0.0, 0.0), metrics or {}, reason, kind, wall_s)


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


class EvaluationCancelled(Exception):
    """The run is shutting down; the candidate was not scored (and must not be recorded)."""


class _TaskFailed(Exception):
    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind, self.reason = kind, reason


class RayEvaluator:
    """Evaluates candidates for one search run; thread-safe (one call per worker thread)."""

    def __init__(self, plan: EvalPlan) -> None:
        import ray
        self.plan = plan
        self._ray = ray
        # max_retries=1: Ray reruns a task once if its worker process dies.
        self._remote = ray.remote(num_cpus=1, max_retries=1, retry_exceptions=False)(run_policy)
        self._baseline: dict[tuple[str, int], list[float]] = {}
        self._baseline_summary: dict[tuple[str, int], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.in_flight = 0
        self._refs: set[Any] = set()
        self._closing = False
        self._seed_hash = source_hash(plan.seed_source)

    # ------------------------------------------------------------------ ray plumbing
    def _run(self, source: str, cells: list[str], check: bool, leak_check: bool = False) -> dict[str, Any]:
        ray = self._ray
        with self._lock:
            if self._closing:
                raise EvaluationCancelled()
            ref = self._remote.remote(source, self.plan.axis, self.plan.seed_source, cells,
                                      list(self.plan.workload_seeds), self.plan.simulator, check, leak_check,
                                      self.plan.allow_weak_sandbox)
            self.in_flight += 1
            self._refs.add(ref)
        try:
            ready, _ = ray.wait([ref], timeout=self.plan.timeout_s)
            if self._closing:
                raise EvaluationCancelled()
            if not ready:
                ray.cancel(ref, force=True)
                raise _TaskFailed("timeout", f"evaluation exceeded the {self.plan.timeout_s:g} s limit "
                                             f"on {', '.join(cells)} and was killed")
            try:
                return ray.get(ref)
            except ray.exceptions.TaskCancelledError:
                raise _TaskFailed("timeout", "evaluation was cancelled") from None
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                    ray.exceptions.LocalRayletDiedError) as e:
                raise _TaskFailed("worker", f"evaluation worker died twice (retried once): "
                                            f"{type(e).__name__}") from None
            except ray.exceptions.RayError as e:
                msg = " ".join(str(e).split())[:300]
                raise _TaskFailed("worker", f"evaluation task failed: {type(e).__name__}: {msg}") from None
        finally:
            with self._lock:
                self.in_flight -= 1
                self._refs.discard(ref)

    def cancel_all(self) -> None:
        """Stop every evaluation in flight (shutdown); their candidates stay unscored."""
        with self._lock:
            self._closing = True
            refs = list(self._refs)
        for ref in refs:
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already finished or worker gone
                pass

    # ------------------------------------------------------------------ baseline
    def ensure_baseline(self) -> None:
        """Run the seed on every cell/seed the plan needs (once per run)."""
        cells = list(self.plan.cells) + ([self.plan.stage1_cell] if self.plan.stage1_cell else [])
        missing = [c for c in cells if any((c, s) not in self._baseline for s in self.plan.workload_seeds)]
        if not missing:
            return
        out = self._run(self.plan.seed_source, missing, check=False)
        if not out["ok"]:
            raise RuntimeError(f"the seed policy itself failed: {out['kind']}: {out['reason']}")
        for cell, per_seed in out["runs"].items():
            for s, run in per_seed.items():
                self._baseline[(cell, int(s))] = run["jct_s"]
                self._baseline_summary[(cell, int(s))] = run["summary"]

    def baseline_mean_jct(self, cell: str) -> float:
        vals = [x for s in self.plan.workload_seeds for x in self._baseline[(cell, s)]]
        return sum(vals) / len(vals)

    def _score(self, runs: dict[str, Any], cells: list[str]) -> tuple[float, float, float, dict[str, float]]:
        pairs, per_cell = [], {}
        for cell in cells:
            seed_j, cand_j = [], []
            for s in self.plan.workload_seeds:
                seed_j += self._baseline[(cell, s)]
                cand_j += runs[cell][str(s)]["jct_s"]
            pairs.append((seed_j, cand_j))
            per_cell[cell] = fit.ratio(seed_j, cand_j)
        f, lo, hi = fit.paired_bootstrap(pairs)
        return f, lo, hi, per_cell

    @staticmethod
    def _mean_summary(runs_for_cell: dict[str, Any]) -> dict[str, Any]:
        """Numeric summary fields averaged over workload seeds."""
        keys: dict[str, list[float]] = {}
        for run in runs_for_cell.values():
            for k, v in run["summary"].items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    keys.setdefault(k, []).append(float(v))
        return {k: sum(v) / len(v) for k, v in keys.items()}

    # ------------------------------------------------------------------ public
    def evaluate(self, source: str) -> Evaluation:
        t0 = time.perf_counter()
        self.ensure_baseline()
        plan = self.plan
        metrics: dict[str, Any] = {}
        try:
            if plan.stage1_cell and plan.stage1_cell not in plan.cells:
                out = self._run(source, [plan.stage1_cell], check=True, leak_check=plan.leak_check)
                if not out["ok"]:
                    return Evaluation.failed(out["kind"], f"stage 1 ({plan.stage1_cell}): {out['reason']}",
                                             time.perf_counter() - t0)
                f1, _, _, _ = self._score(out["runs"], [plan.stage1_cell])
                metrics["stage1_fitness"] = f1
                if f1 < plan.stage1_threshold:
                    return Evaluation.failed(
                        "stage1", f"stage 1 ({plan.stage1_cell}) fitness {f1:.4f} is below the "
                                  f"cascade threshold {plan.stage1_threshold:g}", time.perf_counter() - t0, metrics)
            leak_here = plan.leak_check and not (plan.stage1_cell and plan.stage1_cell not in plan.cells)
            out = self._run(source, list(plan.cells), check=True, leak_check=leak_here)
        except _TaskFailed as e:
            return Evaluation.failed(e.kind, e.reason, time.perf_counter() - t0, metrics)
        if not out["ok"]:
            return Evaluation.failed(out["kind"], out["reason"], time.perf_counter() - t0, metrics)
        f, lo, hi, per_cell = self._score(out["runs"], list(plan.cells))
        target = plan.cells[0]
        metrics.update(self._mean_summary(out["runs"][target]))
        metrics["seed_mean_jct_s"] = self.baseline_mean_jct(target)
        metrics["fitness_per_cell"] = per_cell
        return Evaluation("ok", f, (lo, hi), metrics, None, None, time.perf_counter() - t0)
