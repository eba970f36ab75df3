"""A tiny deterministic stand-in for simcore.sim.simulate, for fast search tests.

One "server" runs programs to completion in priority order (lower first, ties by index),
so mean JCT is smallest when short programs go first: here attained service says little
about size and context tokens say a lot, so a policy that ranks by context beats PLAS, and the ranking matters, so
fitness moves when the policy changes. Program sizes come from (cell name, seed).

Control knobs for fault-injection tests, read from the directory named by FAKESIM_CONTROL:
  block_once  - the first simulate() call that sees it writes its pid to `pid`, deletes
                `block_once` and sleeps (the test then kills the worker process);
  block_all   - every call writes its pid and sleeps;
  sleep       - every call sleeps forever (a hung evaluation).
FAKESIM_DELAY_S makes every call take that long (so a test can kill a run mid-way).
"""
from __future__ import annotations

import hashlib
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simcore.pcb import ProgramView, Signals

N_PROGRAMS = 12


@dataclass
class FakeResult:
    jct_s: list[float]
    summary: dict[str, Any] = field(default_factory=dict)


def _control() -> None:
    delay = float(os.environ.get("FAKESIM_DELAY_S", "0") or 0)
    if delay > 0:
        time.sleep(delay)
    d = os.environ.get("FAKESIM_CONTROL")
    if not d:
        return
    d = Path(d)
    if (d / "sleep").exists():
        while True:
            time.sleep(1)
    once = d / "block_once"
    if (d / "block_all").exists() or once.exists():
        try:
            once.unlink()
        except FileNotFoundError:
            pass
        (d / "pid").write_text(str(os.getpid()))
        time.sleep(120)


def _view(i: int, attained: float, ctx: int, now: float) -> ProgramView:
    return ProgramView(program_id=f"p{i}", arrival_s=0.0, turn_index=0, turns_completed=i % 3,
                       attained_service_s=attained, context_tokens=ctx, last_instance=None,
                       kv_resident=i % 2 == 0, kv_resident_tokens=ctx if i % 2 == 0 else 0,
                       kv_protected=False, protect_until=None, kv_tier=None, tool_name=None,
                       gap_started_s=None, release_s=now, returned_tool_durations=(),
                       returned_tool_names=(), completed_output_tokens=(), completed_prompt_tokens=())


def simulate(cell: Any, programs: Any = None, retention: Any = None, scheduling: Any = None,
             routing: Any = None, seed: int | None = None, **_: Any) -> FakeResult:
    _control()
    name = cell if isinstance(cell, str) else getattr(cell, "name", str(cell))
    h = hashlib.sha256(f"{name}:{seed}".encode()).digest()
    rng = random.Random(int.from_bytes(h[:8], "big"))
    sizes = [rng.uniform(1.0, 20.0) for _ in range(N_PROGRAMS)]
    # context length is a noisy but informative proxy of size
    ctxs = [int(s * 1000 + rng.uniform(-3000, 3000)) + 4000 for s in sizes]
    # attained service so far says little about the remaining size here (PLAS is weak)
    attained = [rng.uniform(0.0, 2.0) for _ in sizes]
    now = 1.0
    prio = []
    for i, c in enumerate(ctxs):
        if scheduling is not None and not isinstance(scheduling, str):
            scheduling.bind(Signals(now=now, kv_utilization=0.5))
            p = int(scheduling.priority(_view(i, attained[i], c, now), now))
        else:
            p = 0
        prio.append((p, i))
    t, jct = 0.0, [0.0] * N_PROGRAMS
    for _p, i in sorted(prio):
        t += sizes[i]
        jct[i] = t
    mean = sum(jct) / len(jct)
    # which fixed policies of the other axes reached the simulator (`--with`)
    others = ",".join(f"{k}={v if isinstance(v, str) else type(v).__name__}"
                      for k, v in (("retention", retention), ("routing", routing)) if v is not None)
    return FakeResult(jct, {"mean_jct_s": mean, "p99_jct_s": max(jct), "programs": N_PROGRAMS,
                            "calls": N_PROGRAMS, "makespan_s": t, "wall_s": 0.0, "fixed": others})
