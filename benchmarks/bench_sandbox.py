"""Sandbox overhead: one simulation with the policy sandboxed vs the same policy in-process.

    python benchmarks/bench_sandbox.py [--cell rtx70b_swe_0.1] [--repeats 5] [--json]

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

from sandbox.client import load_sandboxed_policy
from simcore.policies.registry import policy_class_from_source
from simcore.sim import simulate

POLICIES = {
    "scheduling/plas-seed": ("scheduling", '''
class EvolvedScheduling(SchedulingPolicy):
    engine_args = {"scheduling_policy": "priority"}

    def priority(self, pcb, now):
        return int(round(pcb.attained_service_s * 1000.0))
'''),
    "scheduling/evolved": ("scheduling", '''
class EvolvedScheduling(SchedulingPolicy):
    engine_args = {"scheduling_policy": "priority"}
    PREFILL_MS_PER_TOKEN = 0.03
    RESIDENT_MS_PER_TOKEN = 0.10

    def priority(self, pcb, now):
        base = math.sqrt(max(0.0, pcb.attained_service_s)) * 1000.0
        size_term = pcb.context_tokens * self.PREFILL_MS_PER_TOKEN
        kv_bonus = (pcb.context_tokens * self.RESIDENT_MS_PER_TOKEN
                    if pcb.kv_protected else 0.0)
        return int(round(base + size_term - kv_bonus))
'''),
    "retention/evolved": ("retention", '''
class EvolvedRetention(RetentionPolicy):
    TAU_S = 2.0

    def __init__(self):
        self.gap_ema = {}

    def on_turn_complete(self, pcb, request_id, now):
        est = self.gap_ema.get(pcb.tool_name, self.TAU_S)
        scale = max(0.5, pcb.context_tokens / 20000.0)
        tau = est * scale
        u = self.signals.kv_utilization
        if u is not None:
            tau *= max(0.3, 1.0 - u)
        return ("protect", now + tau)

    def on_turn_arrival(self, pcb, now):
        g = pcb.gap_elapsed_s(now)
        if g is not None and pcb.tool_name is not None:
            p = self.gap_ema.get(pcb.tool_name)
            self.gap_ema[pcb.tool_name] = g if p is None else 0.8 * p + 0.2 * g
        return "release"
'''),
}


_ECHO = "import os\nwhile True:\n    d = os.read(0, 65536)\n    if not d:\n        break\n    os.write(1, d)\n"


def ipc_floor_us(calls: int = 2000, work_us: float = 100.0) -> float:
    """Round trip of a bare pipe echo to a child process, with `work_us` of parent work between
    calls (as the simulator does between hooks): what any process isolation costs per call on
    this machine, before the sandbox does anything of its own."""
    import os
    import subprocess
    p = subprocess.Popen([sys.executable, "-S", "-c", _ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    o, i = p.stdin.fileno(), p.stdout.fileno()
    pc = time.perf_counter
    total = 0.0
    try:
        for _ in range(calls):
            end = pc() + work_us / 1e6
            while pc() < end:
                pass
            t = pc()
            os.write(o, b"x" * 200)
            os.read(i, 65536)
            total += pc() - t
    finally:
        p.kill()
        p.wait()
    return total / calls * 1e6


def _run(cell: str, axis: str, policy) -> tuple[float, list]:
    log: list = []
    t = time.perf_counter()
    simulate(cell, decision_log=log, **{axis: policy})
    return time.perf_counter() - t, log


def bench(cell: str, repeats: int) -> list[dict]:
    rows = []
    for label, (axis, src) in POLICIES.items():
        cls = policy_class_from_source(src, axis, label)
        inproc_t, sand_t, worker_cpu = [], [], []
        calls = 0
        base_log = None
        for i in range(repeats + 1):
            t_in, log_in = _run(cell, axis, cls())
            pol = load_sandboxed_policy(src, axis)
            try:
                cpu0 = pol._worker.cpu_seconds() or 0.0
                t_sb, log_sb = _run(cell, axis, pol)
                calls = pol._worker.calls
                cpu = (pol._worker.cpu_seconds() or 0.0) - cpu0
            finally:
                pol.close()
            if log_in != log_sb:
                raise SystemExit(f"{label}: sandboxed decisions differ from in-process ones")
            base_log = log_in
            if i == 0:
                continue  # warm-up
            inproc_t.append(t_in)
            sand_t.append(t_sb)
            worker_cpu.append(cpu)
        a, b = statistics.median(inproc_t), statistics.median(sand_t)
        rows.append({"policy": label, "cell": cell, "hook_calls": calls, "decisions": len(base_log or []),
                     "inprocess_s": round(a, 4), "sandboxed_s": round(b, 4), "ratio": round(b / a, 3),
                     "overhead_us_per_call": round((b - a) / max(1, calls) * 1e6, 1),
                     # the worker's own CPU (decode, policy, encode, its syscalls); the rest of
                     # the overhead is the parent's encoding and waiting for a CPU to switch to
                     "worker_cpu_us_per_call": round(statistics.median(worker_cpu) / max(1, calls) * 1e6, 1),
                     "repeats": repeats})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", default="rtx70b_swe_0.1")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = bench(args.cell, args.repeats)
    floor = round(ipc_floor_us(), 1)
    if args.json:
        print(json.dumps({"rows": rows, "ipc_floor_us": floor}, indent=2))
    else:
        print(f"bare pipe round trip on this machine (100 us of work between calls): {floor:.0f} us")
        for r in rows:
            print(f"{r['policy']:22s} {r['cell']}: in-process {r['inprocess_s']:.3f}s  sandboxed "
                  f"{r['sandboxed_s']:.3f}s  ratio {r['ratio']:.2f}x  ({r['hook_calls']} hook calls, "
                  f"{r['overhead_us_per_call']:.0f} us overhead per call, of which the worker's CPU "
                  f"{r['worker_cpu_us_per_call']:.0f} us)")
    return 0 if all(r["ratio"] <= 1.5 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
