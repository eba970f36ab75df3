"""Driver-side evaluation: candidate source -> Ray tasks -> fitness record.

A candidate runs in up to two stages, each one Ray task with a hard deadline:
  stage 1 - admission (markers, gate, observation allow-list), the counterfactual leakage
            test on a short cell, and the target cell on the first workload draw. That
            draw separates candidates exactly as the full evaluation does (it is part of
            it), so `stage1_threshold` can stop a candidate that is clearly worse than the
            seed before it costs the other draws;
  stage 2 - the remaining draws of the target cell and every draw of the extra cells.
Fitness pools all draws (evaluator/fitness.py). The seed policy's runs are computed once
per (cell, draw) and cached. A timed-out task is force-cancelled; a worker that dies is
retried once by Ray, then the candidate fails with the reason.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from sandbox.errors import SandboxUnavailable

from . import fitness as fit
from .task import DEFAULT_SIMULATOR, FailureKind, Fixed, run_policy


@dataclass(frozen=True)
class EvalPlan:
    axis: str
    seed_source: str
    cells: tuple[str, ...]                  # target cell first, then extra cells
    draws: tuple[int, ...] = (0, 1, 2)      # in-sample workload/arrival draws
    stage1: bool = True                     # target cell on the first draw first (see module doc)
    stage1_threshold: float = 0.0           # stage-1 fitness below this fails the candidate
    leak_cell: str | None = None            # counterfactual leakage test here (None = off)
    timeout_s: float = 900.0
    simulator: str = DEFAULT_SIMULATOR
    fixed: Fixed = field(default_factory=dict)   # the other axes' policies (--with)
    allow_weak_sandbox: bool = False        # run candidates where an isolation layer is unavailable


class Evaluation(BaseModel):
    """What one candidate's evaluation produced."""

    status: Literal["ok", "failed"]
    estimate: fit.FitnessEstimate | None = None
    kind: FailureKind | None = None
    reason: str | None = None
    metrics: dict[str, Any] = {}
    behaviour: str | None = None             # hash of every JCT: equal hashes = identical decisions' effect
    wall_s: float = 0.0

    @property
    def fitness(self) -> float:
        return self.estimate.fitness if self.estimate is not None else 0.0

    @staticmethod
    def failed(kind: FailureKind, reason: str, wall_s: float = 0.0,
               metrics: dict[str, Any] | None = None) -> "Evaluation":
        return Evaluation(status="failed", kind=kind, reason=reason, metrics=metrics or {}, wall_s=wall_s)


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def behaviour_hash(runs: dict[str, dict[str, Any]]) -> str:
    """Identity of a policy's effect: the JCT of every program on every (cell, draw)."""
    flat = {cell: {d: [round(x, 6) for x in r["jct_s"]] for d, r in sorted(per.items())}
            for cell, per in sorted(runs.items())}
    return hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).hexdigest()[:16]


class EvaluationCancelled(Exception):
    """The run is shutting down; the candidate was not scored (and must not be recorded)."""


class _TaskFailed(Exception):
    def __init__(self, kind: FailureKind, reason: str) -> None:
        super().__init__(reason)
        self.kind, self.reason = kind, reason


class RayEvaluator:
    """Evaluates candidates for one search run; thread-safe (one call per worker thread).

    `runtime_env` is passed to every task (e.g. environment variables a custom simulator
    reads on the worker).
    """

    def __init__(self, plan: EvalPlan, runtime_env: dict[str, Any] | None = None) -> None:
        import ray
        self.plan = plan
        self._ray = ray
        # max_retries=1: Ray reruns a task once if its worker process dies.
        remote = ray.remote(num_cpus=1, max_retries=1, retry_exceptions=False)(run_policy)
        self._remote = remote.options(runtime_env=runtime_env) if runtime_env else remote
        self._baseline: dict[tuple[str, int], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.in_flight = 0
        self._refs: set[Any] = set()
        self._closing = False

    # ------------------------------------------------------------------ ray plumbing
    def _submit(self, source: str, cells: list[str], draws: list[int], check: bool,
                leak_cell: str | None = None) -> Any:
        with self._lock:
            if self._closing:
                raise EvaluationCancelled()
            ref = self._remote.remote(source, self.plan.axis, self.plan.seed_source, cells, draws,
                                      self.plan.simulator, check, leak_cell, self.plan.fixed,
                                      self.plan.allow_weak_sandbox)
            self.in_flight += 1
            self._refs.add(ref)
        return ref

    def _wait(self, ref: Any, what: str) -> dict[str, Any]:
        ray = self._ray
        try:
            ready, _ = ray.wait([ref], timeout=self.plan.timeout_s)
            if self._closing:
                raise EvaluationCancelled()
            if not ready:
                ray.cancel(ref, force=True)
                raise _TaskFailed("timeout", f"evaluation exceeded the {self.plan.timeout_s:g} s limit "
                                             f"on {what} and was killed")
            try:
                out = ray.get(ref)
            except ray.exceptions.TaskCancelledError:
                if self._closing:
                    raise EvaluationCancelled() from None
                raise _TaskFailed("timeout", "evaluation was cancelled") from None
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                    ray.exceptions.LocalRayletDiedError) as e:
                raise _TaskFailed("worker", f"evaluation worker died twice (retried once): "
                                            f"{type(e).__name__}") from None
            except ray.exceptions.RayError as e:
                if self._closing:
                    raise EvaluationCancelled() from None
                msg = " ".join(str(e).split())[:300]
                raise _TaskFailed("worker", f"evaluation task failed: {type(e).__name__}: {msg}") from None
            if not out.get("ok") and out.get("kind") == "unavailable":
                # the machine, not the candidate: every evaluation would fail the same way
                raise SandboxUnavailable(out.get("reason") or "an isolation layer is unavailable")
            return out
        finally:
            with self._lock:
                self.in_flight -= 1
                self._refs.discard(ref)

    def _run(self, source: str, cells: list[str], draws: list[int], check: bool,
             leak_cell: str | None = None) -> dict[str, Any]:
        ref = self._submit(source, cells, draws, check, leak_cell)
        return self._wait(ref, f"{', '.join(cells)} (draws {', '.join(map(str, draws))})")

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
    def ensure_baseline(self, draws: tuple[int, ...] | list[int] | None = None) -> None:
        """Run the seed on every cell of the plan for `draws` (default: the in-sample draws),
        one task per missing draw, in parallel."""
        draws = list(self.plan.draws if draws is None else draws)
        cells = list(self.plan.cells)
        missing = [d for d in draws if any((c, d) not in self._baseline for c in cells)]
        refs = [(d, self._submit(self.plan.seed_source, cells, [d], check=False)) for d in missing]
        for d, ref in refs:
            out = self._wait(ref, f"the seed on draw {d}")
            if not out["ok"]:
                raise RuntimeError(f"the seed policy itself failed on draw {d}: {out['kind']}: {out['reason']}")
            for cell, per_seed in out["runs"].items():
                for s, run in per_seed.items():
                    self._baseline[(cell, int(s))] = run

    def baseline_mean_jct(self, cell: str, draws: tuple[int, ...] | None = None) -> float:
        vals = [x for d in (draws or self.plan.draws) for x in self._baseline[(cell, d)]["jct_s"]]
        return sum(vals) / len(vals)

    def _estimate(self, runs: dict[str, Any], cells: list[str], draws: list[int],
                  level: float = fit.LEVEL) -> fit.FitnessEstimate:
        pairs = [{d: (self._baseline[(c, d)]["jct_s"], runs[c][str(d)]["jct_s"]) for d in draws} for c in cells]
        return fit.estimate(pairs, level=level, cell_names=cells)

    @staticmethod
    def _mean_summary(runs_for_cell: dict[str, Any]) -> dict[str, Any]:
        """Numeric summary fields averaged over draws; text fields kept where every draw agrees."""
        keys: dict[str, list[float]] = {}
        texts: dict[str, set[str]] = {}
        for run in runs_for_cell.values():
            for k, v in run["summary"].items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    keys.setdefault(k, []).append(float(v))
                elif isinstance(v, str):
                    texts.setdefault(k, set()).add(v)
        out: dict[str, Any] = {k: next(iter(v)) for k, v in texts.items() if len(v) == 1}
        out.update({k: sum(v) / len(v) for k, v in keys.items()})
        return out

    # ------------------------------------------------------------------ public
    def seed_evaluation(self) -> Evaluation:
        """The seed against itself on the in-sample draws: parity by construction."""
        self.ensure_baseline()
        runs = {c: {str(d): self._baseline[(c, d)] for d in self.plan.draws} for c in self.plan.cells}
        est = self._estimate(runs, list(self.plan.cells), list(self.plan.draws))
        target = self.plan.cells[0]
        metrics = self._mean_summary(runs[target])
        metrics["seed_mean_jct_s"] = self.baseline_mean_jct(target)
        return Evaluation(status="ok", estimate=est, metrics=metrics, behaviour=behaviour_hash(runs))

    def evaluate(self, source: str) -> Evaluation:
        """Score a candidate on the in-sample draws (the search's fitness)."""
        t0 = time.perf_counter()
        self.ensure_baseline()
        plan = self.plan
        target, draws = plan.cells[0], list(plan.draws)
        metrics: dict[str, Any] = {}
        runs: dict[str, dict[str, Any]] = {c: {} for c in plan.cells}
        try:
            rest = draws
            if plan.stage1 and len(draws) > 1:
                out = self._run(source, [target], draws[:1], check=True, leak_cell=plan.leak_cell)
                if not out["ok"]:
                    return Evaluation.failed(out["kind"], f"stage 1: {out['reason']}", time.perf_counter() - t0)
                runs[target].update(out["runs"][target])
                f1 = fit.ratio(self._baseline[(target, draws[0])]["jct_s"], out["runs"][target][str(draws[0])]["jct_s"])
                metrics["stage1_fitness"] = f1
                if f1 < plan.stage1_threshold:
                    return Evaluation.failed(
                        "stage1", f"stage 1 ({target}, draw {draws[0]}): fitness {f1:.4f} is below the cascade "
                                  f"threshold {plan.stage1_threshold:g}", time.perf_counter() - t0, metrics)
                rest = draws[1:]
                check, leak = False, None        # admitted and leak-tested in stage 1
            else:
                check, leak = True, plan.leak_cell
            # stage 2: the other draws of the target cell, every draw of the extra cells
            if rest:
                out = self._run(source, [target], rest, check=check, leak_cell=leak)
                if not out["ok"]:
                    return Evaluation.failed(out["kind"], out["reason"], time.perf_counter() - t0, metrics)
                runs[target].update(out["runs"][target])
                check, leak = False, None
            if len(plan.cells) > 1:
                out = self._run(source, list(plan.cells[1:]), draws, check=check, leak_cell=leak)
                if not out["ok"]:
                    return Evaluation.failed(out["kind"], out["reason"], time.perf_counter() - t0, metrics)
                for c in plan.cells[1:]:
                    runs[c].update(out["runs"][c])
        except _TaskFailed as e:
            return Evaluation.failed(e.kind, e.reason, time.perf_counter() - t0, metrics)
        est = self._estimate(runs, list(plan.cells), draws)
        metrics.update(self._mean_summary(runs[target]))
        metrics["seed_mean_jct_s"] = self.baseline_mean_jct(target)
        return Evaluation(status="ok", estimate=est, metrics=metrics, behaviour=behaviour_hash(runs),
                          wall_s=time.perf_counter() - t0)

    def score_on(self, source: str, draws: list[int], level: float = fit.LEVEL,
                 check: bool = True) -> Evaluation:
        """Score a policy on other draws (held-out re-scoring): every cell, every draw, one task."""
        t0 = time.perf_counter()
        self.ensure_baseline(draws)
        try:
            out = self._run(source, list(self.plan.cells), list(draws), check=check)
        except _TaskFailed as e:
            return Evaluation.failed(e.kind, e.reason, time.perf_counter() - t0)
        if not out["ok"]:
            return Evaluation.failed(out["kind"], out["reason"], time.perf_counter() - t0)
        est = self._estimate(out["runs"], list(self.plan.cells), list(draws), level=level)
        target = self.plan.cells[0]
        metrics = self._mean_summary(out["runs"][target])
        metrics["seed_mean_jct_s"] = self.baseline_mean_jct(target, tuple(draws))
        return Evaluation(status="ok", estimate=est, metrics=metrics, behaviour=behaviour_hash(out["runs"]),
                          wall_s=time.perf_counter() - t0)
