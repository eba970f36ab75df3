"""Metrics: per program (JCT, preemptions), per call (TTFT, TPOT, queueing, e2e), system
(KV utilisation over time, generated-token throughput, energy).

`MetricsRecorder` is an instance observer (instance.StepObserver): it records each step and
each finished call as they happen; `collect` turns the records into a `SimResult`."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from .config import Cell
from .pcb import PCB
from .request import Request

if TYPE_CHECKING:
    from .instance import Instance


@dataclass
class SimResult:
    cell: str
    policies: dict[str, str]
    seed: int
    programs: pd.DataFrame          # one row per program
    calls: pd.DataFrame             # one row per call
    kv_timeline: list[pd.DataFrame]  # per instance: t, kv_utilization
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def jct_s(self) -> list[float]:
        return self.programs["jct_s"].tolist()

    def to_json(self) -> dict[str, Any]:
        return {"cell": self.cell, "policies": self.policies, "seed": self.seed, **self.summary}

    def write(self, out_dir: str | Path) -> Path:
        """summary.json, programs.csv, calls.csv, kv_timeline.csv; each written atomically."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)

        def atomic(name: str, writer) -> None:
            tmp = out / f".{name}.tmp"
            writer(tmp)
            os.replace(tmp, out / name)

        atomic("summary.json", lambda p: p.write_text(json.dumps(self.to_json(), indent=2)))
        atomic("programs.csv", lambda p: self.programs.to_csv(p, index=False))
        atomic("calls.csv", lambda p: self.calls.to_csv(p, index=False))
        tl = pd.concat([df.assign(instance=i) for i, df in enumerate(self.kv_timeline)], ignore_index=True)
        atomic("kv_timeline.csv", lambda p: tl.to_csv(p, index=False))
        return out


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if len(a) else float("nan")


@dataclass
class InstanceRecord:
    """What one instance did, step by step."""
    t: list[float] = field(default_factory=list)            # step start times
    kv_utilization: list[float] = field(default_factory=list)
    inflight: list[int] = field(default_factory=list)        # running + waiting after scheduling
    busy_s: float = 0.0
    steps: int = 0
    preemptions: int = 0
    prefill_tokens: int = 0


class MetricsRecorder:
    """Records steps and finished calls through the instance hooks."""

    def __init__(self, n_instances: int) -> None:
        self.instances = [InstanceRecord() for _ in range(n_instances)]
        self.finished: list[Request] = []

    def on_step(self, inst: "Instance", now: float, dt: float, steps: int, scheduled: Sequence[list],
                admitted: Sequence[Request], preempted: Sequence[Request], prefill_tokens: int) -> None:
        rec = self.instances[inst.index]
        rec.t.append(now)
        rec.kv_utilization.append(inst.kv.usage())
        rec.inflight.append(len(inst.running) + len(inst.waiting))
        rec.busy_s += dt
        rec.steps += steps
        rec.preemptions += len(preempted)
        rec.prefill_tokens += prefill_tokens

    def on_finish(self, inst: "Instance", req: Request, now: float) -> None:
        self.finished.append(req)


# The columns of programs.csv and calls.csv before the derived latencies (add_call_latencies):
# a simulation (collect) and a replay against a server (search/live/replay.py) write the same.
PROGRAM_COLUMNS = ("program_id", "arrival_s", "finish_s", "jct_s", "calls", "preemptions", "attained_service_s")
CALL_COLUMNS = ("program_id", "turn", "instance", "release_s", "first_scheduled_s", "first_token_s", "finish_s",
                "prompt_tokens", "output_tokens", "prefix_hit_tokens", "host_hit_tokens", "preemptions")


def collect(cell: Cell, pcbs: Sequence[PCB], recorder: MetricsRecorder, policies: dict[str, str], seed: int,
            wall_s: float, events: int) -> SimResult:
    programs = pd.DataFrame({
        "program_id": [p.program_id for p in pcbs],
        "arrival_s": [p.arrival_s for p in pcbs],
        "finish_s": [p.finished_s for p in pcbs],
        "jct_s": [p.finished_s - p.arrival_s for p in pcbs],  # type: ignore[operator]
        "calls": [len(p.program.calls) for p in pcbs],
        "preemptions": [p.preemptions for p in pcbs],
        "attained_service_s": [p.attained_service_s for p in pcbs],
    }, columns=PROGRAM_COLUMNS)
    r = sorted(recorder.finished, key=lambda q: q.rid)  # release order
    calls = pd.DataFrame({
        "program_id": [pcbs[q.pid].program_id for q in r],
        "turn": [q.turn for q in r],
        "instance": [q.instance for q in r],
        "release_s": [q.arrival for q in r],
        "first_scheduled_s": [q.first_sched for q in r],
        "first_token_s": [q.first_token for q in r],
        "finish_s": [q.finished for q in r],
        "prompt_tokens": [q.prompt for q in r],
        "output_tokens": [q.output for q in r],
        "prefix_hit_tokens": [q.hit_tokens for q in r],
        "host_hit_tokens": [q.host_hit_tokens for q in r],
        "preemptions": [q.preemptions for q in r],
    }, columns=CALL_COLUMNS)
    calls = add_call_latencies(calls)

    instances = recorder.instances
    timelines = [pd.DataFrame({"t_s": i.t, "kv_utilization": i.kv_utilization}) for i in instances]
    summary = frame_summary(programs, calls)
    makespan = summary["makespan_s"]
    hw = cell.hardware
    # Energy: each GPU draws its max board power while a step runs, idle power otherwise.
    gpus = cell.tp
    energy_j = sum(gpus * (i.busy_s * hw.power_max_w + max(0.0, makespan - i.busy_s) * hw.power_idle_w)
                   for i in instances)
    summary.update({
        "prefill_tokens_computed": int(sum(i.prefill_tokens for i in instances)),
        "mean_kv_utilization": float(np.mean([np.mean(i.kv_utilization) for i in instances if i.kv_utilization]
                                              or [0.0])),
        "busy_s": sum(i.busy_s for i in instances),
        "energy_kj": energy_j / 1000.0,
        "engine_steps": int(sum(i.steps for i in instances)),
        "events": events,
        "wall_s": wall_s,
    })
    return SimResult(cell=cell.name, policies=policies, seed=seed, programs=programs, calls=calls,
                     kv_timeline=timelines, summary=summary)


# -- figures defined on the frames alone: collect() uses them, and so do runs measured outside
#    the engine (`evolve replay` against a real server) --------------------------------------

def add_call_latencies(calls: pd.DataFrame) -> pd.DataFrame:
    """queueing_s, ttft_s, e2e_s, tpot_s from a calls frame's timestamps."""
    calls = calls.copy()
    calls["queueing_s"] = calls["first_scheduled_s"] - calls["release_s"]
    calls["ttft_s"] = calls["first_token_s"] - calls["release_s"]
    calls["e2e_s"] = calls["finish_s"] - calls["release_s"]
    denom = (calls["output_tokens"] - 1).where(calls["output_tokens"] > 1)
    calls["tpot_s"] = (calls["finish_s"] - calls["first_token_s"]) / denom
    return calls


def frame_summary(programs: pd.DataFrame, calls: pd.DataFrame) -> dict[str, Any]:
    """The summary keys that depend only on programs.csv / calls.csv."""
    jct = programs["jct_s"].to_numpy(float)
    makespan = float(programs["finish_s"].max() - programs["arrival_s"].min()) if len(programs) else float("nan")
    out_tok = int(calls["output_tokens"].sum())
    prompt_tok = int(calls["prompt_tokens"].sum())
    hits = calls["prefix_hit_tokens"].sum() + calls["host_hit_tokens"].sum()
    return {
        "programs": int(len(programs)),
        "calls": int(len(calls)),
        "mean_jct_s": float(jct.mean()) if len(jct) else float("nan"),
        "p50_jct_s": _pct(jct, 50),
        "p90_jct_s": _pct(jct, 90),
        "p99_jct_s": _pct(jct, 99),
        "makespan_s": makespan,
        "mean_queueing_s": float(calls["queueing_s"].mean()),
        "mean_ttft_s": float(calls["ttft_s"].mean()),
        "mean_tpot_s": float(calls["tpot_s"].mean()),
        "mean_e2e_s": float(calls["e2e_s"].mean()),
        "preemptions": int(programs["preemptions"].sum()),
        "prefix_hit_rate": float(hits) / max(1, prompt_tok),
        "prompt_tokens": prompt_tok,
        "output_tokens": out_tok,
        "throughput_tok_s": out_tok / makespan if makespan > 0 else float("nan"),
    }
