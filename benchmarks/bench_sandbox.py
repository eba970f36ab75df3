"""Sandbox overhead: one simulation with the policy sandboxed vs the same policy in-process.

    python benchmarks/bench_sandbox.py [--cell rtx70b_swe_0.1] [--repeats 5] [--unpinned]
                                       [--deferral-bound] [--json]

Both variants run the same policy source (the paper's Appendix F listings: the PLAS seed
and the evolved scheduling policy, the TTL seed and the evolved retention policy), on the
same cell and seed; the decision logs must be identical (the sandbox must not change a
single decision). Reported: median wall time of each, their ratio (target <= 1.5), the
number of hook calls and the per-call overhead. Runs alternate so that machine noise hits
both variants alike; one warm-up run of each is discarded.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import sandbox.client as sandbox_client
from sandbox.client import load_sandboxed_policy
from simcore.policies.registry import policy_class_from_source
from simcore.sim import simulate

_LISTINGS = Path(__file__).resolve().parent.parent / "tests" / "data" / "listings"
# Paper Appendix F listings, read from the same files the simulator's tests run.
POLICIES = {
    "scheduling/plas-seed": ("scheduling", (_LISTINGS / "scheduling_plas_seed.py").read_text()),
    "scheduling/evolved": ("scheduling", (_LISTINGS / "scheduling_evolved.py").read_text()),
    "retention/evolved": ("retention", (_LISTINGS / "retention_evolved.py").read_text()),
}


_ECHO = "import os\nwhile True:\n    d = os.read(0, 65536)\n    if not d:\n        break\n    os.write(1, d)\n"


def ipc_floor_us(calls: int = 2000, work_us: float = 100.0, pin: bool = True) -> float:
    """Round trip of a bare pipe echo to a child process, with `work_us` of parent work between
    calls that walks ~1 MB of objects (as the simulator does between hooks, evicting the
    child's caches): what any process isolation costs per call on this machine, before the
    sandbox does anything of its own. pin=True keeps the child on the parent's CPU, as
    sandbox.client does."""
    import os
    import subprocess
    from sandbox.client import _getcpu
    p = subprocess.Popen([sys.executable, "-S", "-c", _ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    o, i = p.stdin.fileno(), p.stdout.fileno()
    pc = time.perf_counter
    junk = [list(range(1000)) for _ in range(30)]
    total, cpu = 0.0, -1
    try:
        for _ in range(calls):
            end = pc() + work_us / 1e6
            while pc() < end:
                for row in junk[::3]:
                    sum(row)
            if pin and _getcpu is not None and _getcpu() != cpu:
                cpu = _getcpu()
                os.sched_setaffinity(p.pid, (cpu,))
            t = pc()
            os.write(o, b"x" * 230)
            os.read(i, 65536)
            total += pc() - t
    finally:
        p.kill()
        p.wait()
    return total / calls * 1e6


def deferral_bound(cell: str, axis: str, policy) -> dict:
    """How much latency deferring decisions could hide: the parent's wall time between each
    decision and the moment the engine first needs it (a priority: the start of the next step
    of the instance it was queued on; an on_turn_complete decision: the next step of the
    instance holding the blocks), measured in-process. Deferral can save at most this sum."""
    import simcore.instance as si
    import simcore.orchestrator as so
    pending: dict[int, list[float]] = {}
    gaps: list[float] = []
    pc = time.perf_counter
    step, release, complete = si.Instance.step, so.Orchestrator.release, so.Orchestrator.complete

    def rel(self, pcb, now):
        inst = release(self, pcb, now)
        pending.setdefault(inst.index, []).append(pc())
        return inst

    def comp(self, req, now):
        t = complete(self, req, now)
        pending.setdefault(req.instance, []).append(pc())
        return t

    def stp(self, now, horizon):
        waiting = pending.pop(self.index, None)
        if waiting:
            t = pc()
            gaps.extend(t - x for x in waiting)
        return step(self, now, horizon)

    hooks = {"scheduling": ("release", rel), "retention": ("complete", comp)}
    if axis not in hooks:
        return {}
    name, fn = hooks[axis]
    setattr(so.Orchestrator, name, fn)
    si.Instance.step = stp
    try:
        t = _run(cell, axis, policy)[0]
    finally:
        si.Instance.step, so.Orchestrator.release, so.Orchestrator.complete = step, release, complete
    gaps.sort()
    n = len(gaps)
    return {"decisions": n, "median_gap_us": round(gaps[n // 2] * 1e6, 1),
            "p90_gap_us": round(gaps[int(n * 0.9)] * 1e6, 1), "sum_gaps_s": round(sum(gaps), 4),
            "run_s": round(t, 4)}


def _run(cell: str, axis: str, policy) -> tuple[float, list]:
    log: list = []
    t = time.perf_counter()
    simulate(cell, decision_log=log, **{axis: policy})
    return time.perf_counter() - t, log


def _sandboxed(cell: str, axis: str, src: str, pin: bool) -> tuple[float, list, int, float]:
    """One sandboxed run: (wall s, decision log, hook calls, worker CPU s)."""
    saved = sandbox_client._getcpu
    if not pin:
        sandbox_client._getcpu = None  # the client then leaves the worker's affinity alone
    try:
        pol = load_sandboxed_policy(src, axis)
        try:
            cpu0 = pol._worker.cpu_seconds() or 0.0
            t, log = _run(cell, axis, pol)
            return t, log, pol._worker.calls, (pol._worker.cpu_seconds() or 0.0) - cpu0
        finally:
            pol.close()
    finally:
        sandbox_client._getcpu = saved


def bench(cell: str, repeats: int, unpinned: bool = False, bound: bool = False) -> list[dict]:
    rows = []
    for label, (axis, src) in POLICIES.items():
        cls = policy_class_from_source(src, axis, label)
        inproc_t, sand_t, worker_cpu, free_t = [], [], [], []
        calls = 0
        base_log = None
        for i in range(repeats + 1):
            t_in, log_in = _run(cell, axis, cls())
            t_sb, log_sb, calls, cpu = _sandboxed(cell, axis, src, pin=True)
            if log_in != log_sb:
                raise SystemExit(f"{label}: sandboxed decisions differ from in-process ones")
            if unpinned:
                t_free, log_free, _, _ = _sandboxed(cell, axis, src, pin=False)
                if log_free != log_in:
                    raise SystemExit(f"{label}: sandboxed decisions (worker not pinned) differ from in-process ones")
            base_log = log_in
            if i == 0:
                continue  # warm-up
            inproc_t.append(t_in)
            sand_t.append(t_sb)
            worker_cpu.append(cpu)
            if unpinned:
                free_t.append(t_free)
        a, b = statistics.median(inproc_t), statistics.median(sand_t)
        extra = {}
        if unpinned:
            extra["unpinned_ratio"] = round(statistics.median(free_t) / a, 3)
        if bound:
            extra["deferral_bound"] = deferral_bound(cell, axis, cls())
        rows.append({"policy": label, "cell": cell, "hook_calls": calls, "decisions": len(base_log or []),
                     "inprocess_s": round(a, 4), "sandboxed_s": round(b, 4), "ratio": round(b / a, 3),
                     "overhead_us_per_call": round((b - a) / max(1, calls) * 1e6, 1),
                     # the worker's own CPU (decode, policy, encode, its syscalls); the rest of
                     # the overhead is the parent's encoding and waiting for a CPU to switch to
                     "worker_cpu_us_per_call": round(statistics.median(worker_cpu) / max(1, calls) * 1e6, 1),
                     "repeats": repeats, **extra})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", default="rtx70b_swe_0.1")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--unpinned", action="store_true",
                    help="also run the sandbox without pinning the worker to the parent's CPU")
    ap.add_argument("--deferral-bound", action="store_true",
                    help="also measure how much latency deferring decisions to the step that needs them could hide")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = bench(args.cell, args.repeats, args.unpinned, args.deferral_bound)
    floor = round(ipc_floor_us(), 1)
    floor_free = round(ipc_floor_us(pin=False), 1)
    if args.json:
        print(json.dumps({"rows": rows, "ipc_floor_us": floor, "ipc_floor_unpinned_us": floor_free}, indent=2))
    else:
        print(f"bare pipe round trip on this machine (100 us of work between calls): {floor:.0f} us with the "
              f"child on the parent's CPU, {floor_free:.0f} us unpinned")
        for r in rows:
            print(f"{r['policy']:22s} {r['cell']}: in-process {r['inprocess_s']:.3f}s  sandboxed "
                  f"{r['sandboxed_s']:.3f}s  ratio {r['ratio']:.2f}x  ({r['hook_calls']} hook calls, "
                  f"{r['overhead_us_per_call']:.0f} us overhead per call, of which the worker's CPU "
                  f"{r['worker_cpu_us_per_call']:.0f} us)")
            if "unpinned_ratio" in r:
                print(f"{'':22s} worker not pinned to the parent's CPU: ratio {r['unpinned_ratio']:.2f}x")
            d = r.get("deferral_bound")
            if d:
                print(f"{'':22s} deferral bound: {d['decisions']} decisions, parent wall time from decision to "
                      f"first use: median {d['median_gap_us']:.0f} us, p90 {d['p90_gap_us']:.0f} us, total "
                      f"{d['sum_gaps_s'] * 1e3:.1f} ms of a {d['run_s'] * 1e3:.0f} ms run")
    return 0 if all(r["ratio"] <= 1.5 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
