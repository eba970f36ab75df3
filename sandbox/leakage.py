"""Counterfactual leakage checker: a policy must decide the same until the future is revealed.

Run the candidate on a workload, then on copies whose *hidden future* is perturbed: output
lengths of calls, durations of tools, prompts of later calls and the number of remaining
calls, for every value that the baseline run reveals at or after a cut time T. A causal
policy cannot tell the copies apart before the first instant any perturbed value is
revealed (a call's output length at its completion, a tool's duration when it returns, a
later call's prompt at its release, the end of a program when its last call completes),
so every decision logged before that instant must be identical. A difference means the
decision depended on information a deployment would not have: "leaks future information".

Each run gets a fresh policy from `factory(programs)` (policies keep state), the same
arrival times and the same seed, so nothing but the perturbed values differs. The baseline
is run twice first: a policy whose decisions differ between identical runs is reported as
nondeterministic rather than leaking.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from simcore.config import Cell, get_cell
from simcore.workload import Call, Program, poisson_arrivals

PolicyFactory = Callable[[Sequence[Program]], Any]


@dataclass(frozen=True)
class LeakReport:
    ok: bool
    reason: str
    runs: int
    decisions_compared: int
    perturbed_values: int


def exercising_cell(cell: Cell, axis: str) -> Cell:
    """A cell on which the axis is consulted: routing only decides with two instances or more."""
    if axis == "routing" and cell.instances < 2:
        return cell.model_copy(update={"instances": 2, "name": f"{cell.name}-x2"})
    return cell


def _reveal_times(res: Any) -> tuple[dict[tuple[str, int], float], dict[tuple[str, int], float]]:
    """(program_id, turn) -> release time and -> completion time, from a SimResult."""
    c = res.calls
    rel = {(p, int(k)): float(t) for p, k, t in zip(c["program_id"], c["turn"], c["release_s"])}
    fin = {(p, int(k)): float(t) for p, k, t in zip(c["program_id"], c["turn"], c["finish_s"])}
    return rel, fin


def perturb_future(programs: Sequence[Program], release: dict, finish: dict, cut: float, pool_tokens: int,
                   rng: np.random.Generator) -> tuple[list[Program], int, list[tuple[str, str, int]]]:
    """A copy of `programs` whose values revealed at or after `cut` (in the baseline) differ.

    Returns (programs, number of perturbed values, [(kind, program_id, turn)]) where kind
    says when the perturbation becomes observable: "complete" (at the completion of that
    call) or "release" (at the release of that call).
    """
    out: list[Program] = []
    n = 0
    reveals: list[tuple[str, str, int]] = []

    def scale(v: int, lo: int, hi: int, factors: tuple[float, ...]) -> int:
        w = int(round(v * float(rng.choice(factors))))
        if w == v:
            w = v + 1 if v + 1 <= hi else v - 1
        return max(lo, min(hi, w))

    # Outputs and tool durations only grow: a shorter output or tool would reveal itself
    # *earlier* than in the baseline, possibly before the cut, and shrink the window in
    # which the two runs must agree. Prompts may shrink too: they show at release only.
    grow, both = (1.4, 2.0, 3.0), (0.5, 0.7, 1.4, 2.0)

    for p in programs:
        calls = list(p.calls)
        pid = p.program_id
        for k, c in enumerate(calls):
            new = c
            if finish.get((pid, k), -math.inf) >= cut:
                # output length: revealed when the call completes
                out_tok = scale(c.output_tokens, 1, max(1, pool_tokens - c.prompt_tokens), grow)
                if out_tok != c.output_tokens:
                    new = dataclasses.replace(new, output_tokens=out_tok)
                    n += 1
                    reveals.append(("complete", pid, k))
            if k + 1 < len(calls) and c.tool_name is not None and release.get((pid, k + 1), -math.inf) >= cut:
                # tool duration: revealed when the tool returns (= the next call's release)
                d = c.tool_duration_s * float(rng.choice(grow)) + 0.05
                new = dataclasses.replace(new, tool_duration_s=d)
                n += 1
                reveals.append(("release", pid, k + 1))
            if release.get((pid, k), -math.inf) >= cut:
                # a later call's prompt (or a later program's first): revealed at its release
                prm = scale(c.prompt_tokens, 1, max(1, pool_tokens - new.output_tokens), both)
                if prm != c.prompt_tokens:
                    new = dataclasses.replace(new, prompt_tokens=prm)
                    n += 1
                    reveals.append(("release", pid, k))
            calls[k] = new
        last = len(calls) - 1
        if finish.get((pid, last), -math.inf) >= cut and rng.random() < 0.5:
            # one more call: the program's end is revealed when its last call completes
            c = calls[last]
            calls[last] = dataclasses.replace(c, tool_name=c.tool_name or "bash", tool_duration_s=1.0)
            extra_prompt = min(pool_tokens - c.output_tokens - 1, c.prompt_tokens + c.output_tokens + 64)
            calls.append(Call(max(1, extra_prompt), max(1, c.output_tokens), None, 0.0))
            n += 1
            reveals.append(("complete", pid, last))
        else:
            # or end the program early, at the first call that completes after the cut
            for k in range(len(calls) - 1):
                if finish.get((pid, k), -math.inf) >= cut and rng.random() < 0.3:
                    calls = calls[:k + 1]
                    calls[k] = dataclasses.replace(calls[k], tool_name=None, tool_duration_s=0.0)
                    n += 1
                    reveals.append(("complete", pid, k))
                    break
        out.append(Program(pid, tuple(calls), dict(p.meta)))
    return out, n, reveals


def _first_reveal(reveals: list[tuple[str, str, int]], release: dict, finish: dict) -> float:
    t = math.inf
    for kind, pid, k in reveals:
        table = finish if kind == "complete" else release
        t = min(t, table.get((pid, k), math.inf))
    return t


def _describe(e: tuple) -> str:
    now, axis, hook, pid, turn = e[:5]
    return f"{hook} for {pid} turn {turn} at t={now:.3f}s"


def check_leakage(factory: PolicyFactory, axis: str, cell: Cell | str, programs: Sequence[Program], *,
                  seed: int | None = None, cuts: Sequence[float] = (0.25, 0.5, 0.75), rng_seed: int = 0,
                  view_hook: Any = None, simulate_fn: Any = None) -> LeakReport:
    """Run the counterfactual test; `cuts` are fractions of the baseline's decision span
    (each moved to just after the first of the axis's decisions at or after it).

    `view_hook` (tests only) is passed to the simulator to build deliberately leaky views
    for the positive control.
    """
    if simulate_fn is None:
        from simcore.sim import simulate as simulate_fn
    cell = exercising_cell(get_cell(cell) if isinstance(cell, str) else cell, axis)
    seed = cell.seed if seed is None else seed
    arrivals = poisson_arrivals(len(programs), cell.rate_jps, seed)

    def run(progs: Sequence[Program]) -> tuple[list, Any]:
        log: list = []
        policy = factory(progs)
        try:
            kw = {axis: policy}
            if view_hook is not None:
                kw["view_hook"] = view_hook
            res = simulate_fn(cell, programs=list(progs), seed=seed, decision_log=log,
                              arrivals=arrivals, **kw)
            flush = getattr(policy, "flush", None)
            if callable(flush):
                flush()  # sandboxed policies: a posted call's failure must not go unread
        finally:
            close = getattr(policy, "close", None)
            if callable(close):
                close()
        return log, res

    base_log, base_res = run(programs)
    mine = [e for e in base_log if e[1] == axis]
    if not mine:
        return LeakReport(True, f"the policy made no {axis} decisions on this workload", 1, 0, 0)
    # A policy that decides differently on the *same* input would be reported as leaking;
    # say what it really is (its fitness would not be reproducible either).
    again, _ = run(programs)
    for i, (x, y) in enumerate(zip(base_log, again)):
        if x != y:
            return LeakReport(False, "nondeterministic decisions: %s was %r in one run and %r in an identical "
                              "run" % (_describe(x), x[5], y[5]) if x[:5] == y[:5] else
                              "nondeterministic decisions: decision #%d differs between identical runs" % i,
                              2, i, 0)
    if len(base_log) != len(again):
        return LeakReport(False, "nondeterministic decisions: identical runs made different numbers of decisions",
                          2, 0, 0)
    rel, fin = _reveal_times(base_res)
    t0, t1 = mine[0][0], mine[-1][0]
    times = sorted({e[0] for e in mine})
    rng = np.random.default_rng([rng_seed, 0x1EA4])
    compared = perturbed = 0
    runs = 2
    for frac in cuts:
        # Cut right after one of the axis's decisions: the values that decision may not see
        # (its call's output length, its tool's duration, the next prompt) are then still
        # hidden and get perturbed. A cut at an arbitrary instant often falls where no
        # program of a small cell has a tool running, and an oracle reading the running
        # tool's duration would go unseen.
        cut = math.nextafter(times[min(bisect.bisect_left(times, t0 + frac * (t1 - t0)), len(times) - 1)], math.inf)
        progs2, n, reveals = perturb_future(programs, rel, fin, cut, cell.kv_pool_tokens, rng)
        if n == 0:
            continue
        log2, res2 = run(progs2)
        runs += 1
        rel2, fin2 = _reveal_times(res2)
        # both runs are identical until the first perturbed value shows in either of them
        horizon = min(cut, _first_reveal(reveals, rel, fin), _first_reveal(reveals, rel2, fin2))
        a = [e for e in base_log if e[0] < horizon]
        b = [e for e in log2 if e[0] < horizon]
        perturbed += n
        compared += len(a)
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                if x[:5] == y[:5]:
                    what = "%s was %r, became %r" % (_describe(x), x[5], y[5])
                else:
                    what = "decision #%d changed from %s to %s" % (i, _describe(x), _describe(y))
                return LeakReport(False, "leaks future information: %s when only values revealed after "
                                  "t=%.3fs were perturbed" % (what, horizon), runs, compared, perturbed)
        if len(a) != len(b):
            return LeakReport(False, "leaks future information: %d decisions before t=%.3fs in the baseline, "
                              "%d with a perturbed future" % (len(a), horizon, len(b)), runs, compared, perturbed)
    return LeakReport(True, f"no leak: {compared} decisions identical across {runs - 2} perturbed futures "
                      f"({perturbed} hidden values changed)", runs, compared, perturbed)


# --------------------------------------------------------------------------- static part
def check_observed_fields(source: str) -> None:
    """The cheap static part, before anything runs: every attribute the source reads off a
    parameter named `pcb`, off `self.signals` and off an instance view (`inflight` items in
    `select`) must be an observable field or member (simcore.pcb); reading `pcb.program`
    is refused here with a reason instead of failing later with an AttributeError.

    Raises SandboxViolation("leak: ..."). A field read under another name (or built at run
    time) is caught by the worker, which is sent only the observable fields the source names.
    """
    import ast

    from simcore.pcb import OBSERVABLE_PCB_FIELDS, OBSERVABLE_SIGNAL_FIELDS, observation_schema

    from .errors import SandboxViolation
    schema = observation_schema()
    pcb_ok = OBSERVABLE_PCB_FIELDS | set(schema["ProgramView"]["members"])
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return  # the gate reports it
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id == "pcb":
            if node.attr not in pcb_ok:
                raise SandboxViolation(f"line {node.lineno}: pcb.{node.attr} is not an observable field "
                                       f"(see simcore.pcb.ProgramView)")
        elif (isinstance(base, ast.Attribute) and base.attr == "signals"
              and isinstance(base.value, ast.Name) and base.value.id == "self"):
            if node.attr not in OBSERVABLE_SIGNAL_FIELDS:
                raise SandboxViolation(f"line {node.lineno}: self.signals.{node.attr} is not an observable "
                                       "signal (see simcore.pcb.Signals)")
