"""The discrete-event loop that wires the planes together, and `simulate()`, the entry point.

Data flows one way: workload -> orchestrator -> dispatch -> instance -> retention -> metrics.
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import time
from typing import Any, Sequence

from .config import Cell, get_cell
from .dispatch import DeferredPriorities, DispatchPlane
from .errors import UserError
from .instance import Instance, StepObserver, StepTimer
from .kv import KVManager
from .metrics import MetricsRecorder, SimResult, collect
from .orchestrator import Orchestrator, ViewHook
from .policies.registry import load_policy
from .retention import RetentionPlane
from .workload import Program, WorkloadError, load_programs, poisson_arrivals

ARRIVAL, STEP_DONE, RELEASE = 0, 1, 2


class SimulationError(UserError, RuntimeError):
    """The simulation cannot run (workload does not fit the cell, a policy failed)."""


def cell_programs(cell: Cell, seed: int) -> list[Program]:
    """The cell's workload: generated from its seed, or read from a trace file."""
    wl = cell.workload
    if wl.kind == "file":
        progs = load_programs(wl.path)  # type: ignore[arg-type]
        return progs[: wl.programs] if wl.programs else progs
    from .generators import generate  # local: generators pull in their parameter files
    return generate(wl.kind, wl.programs, seed)  # type: ignore[arg-type]


def _check_fits(programs: Sequence[Program], cell: Cell) -> None:
    bs = cell.engine.block_size
    usable = (cell.kv_pool_tokens // bs - 1) * bs  # one block is vLLM's null block
    for p in programs:
        for k, c in enumerate(p.calls):
            need = c.prompt_tokens + c.output_tokens
            if need - 1 > usable:  # the last output token is never computed
                raise SimulationError(
                    f"program '{p.program_id}' call {k}: context of {need} tokens can never fit the "
                    f"KV pool of cell '{cell.name}' ({usable} usable tokens)")


def recorded_arrivals(programs: Sequence[Program]) -> list[float]:
    """Arrival times kept by an importer in meta.arrival_s, shifted so the first is 0."""
    missing = [p.program_id for p in programs if not isinstance(p.meta.get("arrival_s"), (int, float))]
    if missing:
        raise WorkloadError(f"--arrivals recorded: program '{missing[0]}' has no numeric meta.arrival_s "
                            f"({len(missing)} of {len(programs)} programs lack one)")
    t = [float(p.meta["arrival_s"]) for p in programs]
    t0 = min(t)
    return [x - t0 for x in t]


def _policy_label(spec: Any, obj: Any) -> str:
    if isinstance(spec, str):
        return spec
    return getattr(obj, "name", "") or type(obj).__name__


class Simulation:
    def __init__(self, cell: Cell, programs: Sequence[Program], arrivals: Sequence[float],
                 retention: Any, scheduling: Any, routing: Any,
                 decision_log: list | None = None, view_hook: ViewHook | None = None,
                 perf: StepTimer | None = None, observers: Sequence[StepObserver] = ()) -> None:
        """`perf` replaces the cell's performance model and `observers` watch every instance
        (the vLLM parity harness uses both: constant steps, a step log)."""
        from .perf import build_perf_model
        self.cell = cell
        eng = cell.engine
        mode = dict(getattr(scheduling, "engine_args", {}) or {}).get("scheduling_policy", eng.scheduling_policy)
        if mode not in ("fcfs", "priority"):
            raise SimulationError(f"scheduling policy asks for unknown engine scheduling_policy '{mode}'")
        perf = perf if perf is not None else build_perf_model(cell)
        args = eng.model_copy(update={"scheduling_policy": mode})
        blocks = cell.kv_pool_tokens // eng.block_size
        host_tokens = int(cell.hardware.host_kv_gib * 2**30 // cell.model.kv_bytes_per_token)
        self.metrics = MetricsRecorder(cell.instances)
        deferred = (DeferredPriorities(scheduling, decision_log)
                    if getattr(scheduling, "defers_priority", False) else None)
        self.instances = [
            Instance(i, KVManager(blocks, eng.block_size, host_tokens // eng.block_size, eng.enable_prefix_caching),
                     perf, args, resolve_priorities=deferred.resolve if deferred else None,
                     observers=(self.metrics, *observers))
            for i in range(cell.instances)]
        self.orch = Orchestrator(programs, arrivals, self.instances,
                                 DispatchPlane(routing, scheduling, self.instances, decision_log, deferred),
                                 RetentionPlane(retention, self.instances, decision_log), view_hook)
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._relevant: list[float] = []   # times of events that can change an instance's batch
        self.events = 0

    def _push(self, t: float, kind: int, payload: Any, relevant: bool = True) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, payload))
        if relevant:
            heapq.heappush(self._relevant, t)

    def _horizon(self, now: float) -> float:
        rel = self._relevant
        while rel and rel[0] <= now:
            heapq.heappop(rel)
        return rel[0] if rel else math.inf

    def _kick(self, inst: Instance, now: float) -> None:
        end = inst.step(now, self._horizon(now))
        # Only a step that finishes a call can change another instance's batch.
        self._push(end, STEP_DONE, inst, relevant=inst.finishing)

    def run(self) -> None:
        orch = self.orch
        for pcb in orch.pcbs:
            self._push(pcb.arrival_s, ARRIVAL, pcb)
        ev = self._events
        idle_ready: set[int] = set()
        while ev:
            now, _, kind, payload = heapq.heappop(ev)
            self.events += 1
            if kind == STEP_DONE:
                inst = payload
                for req in inst.finish_step(now):
                    nxt = orch.complete(req, now)
                    if nxt is not None:
                        self._push(nxt, RELEASE, orch.pcbs[req.pid])
                if inst.busy():
                    idle_ready.add(inst.index)
            else:  # ARRIVAL or RELEASE: both release the program's next call (Eq. 2)
                inst = orch.release(payload, now)
                if not inst.stepping:
                    idle_ready.add(inst.index)
            if idle_ready and (not ev or ev[0][0] > now):
                for i in sorted(idle_ready):
                    inst = self.instances[i]
                    if not inst.stepping and inst.busy():
                        self._kick(inst, now)
                idle_ready.clear()
        self.orch.dispatch.resolve_priorities()  # the decision log gets every deferred priority


def simulate(cell: Cell | str, programs: Sequence[Program] | None = None, retention: Any = None,
             scheduling: Any = None, routing: Any = None, seed: int | None = None,
             decision_log: list | None = None, view_hook: ViewHook | None = None,
             arrivals: Sequence[float] | str | None = None) -> SimResult:
    """Simulate one cell under one policy combination.

    Policies are shipped names, policy-file paths or policy objects; None takes the
    cell's default. `seed` draws the workload (if generated) and the Poisson arrivals;
    every policy gets the same draw (common random numbers). `arrivals` may be a list of
    times, "poisson", or "recorded" (meta.arrival_s of imported traces); None follows the
    cell's workload spec.
    """
    t0 = time.perf_counter()
    if isinstance(cell, str):
        cell = get_cell(cell)
    seed = cell.seed if seed is None else seed
    specs = {"retention": retention or cell.policies.retention,
             "scheduling": scheduling or cell.policies.scheduling,
             "routing": routing or cell.policies.routing}
    pol = {axis: load_policy(axis, spec) for axis, spec in specs.items()}
    progs = list(programs) if programs is not None else cell_programs(cell, seed)
    if not progs:
        raise WorkloadError("workload has no programs")
    _check_fits(progs, cell)
    if arrivals is None:
        arrivals = cell.workload.arrivals
    if arrivals == "recorded":
        arrivals = recorded_arrivals(progs)
    elif arrivals == "poisson":
        arrivals = poisson_arrivals(len(progs), cell.rate_jps, seed)
    elif isinstance(arrivals, str):
        raise WorkloadError(f"unknown arrivals mode '{arrivals}' (known: poisson, recorded)")
    if len(arrivals) != len(progs):
        raise WorkloadError(f"{len(arrivals)} arrival times for {len(progs)} programs")
    sim = Simulation(cell, progs, arrivals, pol["retention"], pol["scheduling"], pol["routing"],
                     decision_log, view_hook)
    with contextlib.ExitStack() as stack:
        for p in {id(p): p for p in pol.values()}.values():  # one object may serve two axes
            run_ctx = getattr(p, "simulation_run", None)
            if callable(run_ctx):  # optional (policies/base.py); a sandboxed policy pins its worker
                stack.enter_context(run_ctx())
        sim.run()
    unfinished = [p.program_id for p in sim.orch.pcbs if p.finished_s is None]
    if unfinished:
        raise SimulationError(f"{len(unfinished)} programs never finished (first: {unfinished[0]}): engine stalled")
    labels = {axis: _policy_label(specs[axis], pol[axis]) for axis in pol}
    return collect(cell, sim.orch.pcbs, sim.metrics, labels, seed, time.perf_counter() - t0, sim.events)
