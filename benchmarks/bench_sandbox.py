"""Sandbox overhead: one simulation with the policy sandboxed (every layer on) vs in-process.

    python benchmarks/bench_sandbox.py [--cell rtx70b_swe_0.1] [--repeats 5] [--layers]
                                       [--startup N] [--unpinned] [--mirrored] [--deferral-bound]
                                       [--eager] [--json]

Both variants run the same policy source (the paper's Appendix F listings: the PLAS seed
and the evolved scheduling policy, the evolved retention policy), on the same cell and
seed; the decision logs must be identical (the sandbox must not change a single decision).
Reported: median wall time of each, their ratio (target <= 2.0 with every layer on), the
median of the ratios of runs made back to back (drifts of a shared machine cancel; the
exit status follows it) and the ratio of the best runs, the number of hook calls and of
round trips (scheduling policies defer their priorities, see simcore/policies/base.py;
--eager adds a run without), and the overhead per round trip. --layers adds one run per
layer turned off (seccomp, the audit tripwire, Landlock, the namespaces and empty root),
so that the difference to "every layer" is what that layer costs; --mirrored adds the
opt-in layout mirroring (sandbox/layout.py); --startup N times N worker starts per
configuration (the cost a layer adds once per evaluation). Runs alternate, in alternating
order, so that machine noise hits every variant alike; one warm-up run of each is discarded.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import sandbox.process as sandbox_process
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
    _getcpu = sandbox_process.getcpu
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


def _cpu_s(pid: int) -> float | None:
    """A process's CPU time in ns precision (/proc/PID/schedstat), else tick-precise."""
    try:
        with open(f"/proc/{pid}/schedstat") as fh:
            return int(fh.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


NAMESPACES = ("userns", "pidns", "ipcns", "utsns", "netns", "mntns", "fs_root")
# variant -> keyword arguments of load_sandboxed_policy (every layer on unless named)
VARIANTS = {
    "sandboxed": {},
    "no seccomp": {"seccomp": False},
    "no tripwire": {"audit": False},
    "no landlock": {"simulate_unavailable": ("landlock",), "allow_weak_sandbox": True},
    "no namespaces or empty root": {"simulate_unavailable": NAMESPACES, "allow_weak_sandbox": True},
    "mirrored layout": {"mirror_layout": True},
    "eager": {"defer": False},
}


def _sandboxed(cell: str, axis: str, src: str, pin: bool, **kw) -> tuple[float, list, int, int, float, str]:
    """One sandboxed run: (wall s, decision log, hook calls, round trips, worker CPU s, layout)."""
    saved = sandbox_process.getcpu
    if not pin:
        sandbox_process.getcpu = None  # the client then leaves the worker's affinity alone
    try:
        pol = load_sandboxed_policy(src, axis, **kw)
        w = pol.sandbox

        def cpu() -> float:
            return _cpu_s(w.pid) or w.cpu_seconds() or 0.0

        try:
            cpu0 = cpu()
            t, log = _run(cell, axis, pol)
            return t, log, w.calls, w.frames, cpu() - cpu0, w.layout
        finally:
            pol.close()
    finally:
        sandbox_process.getcpu = saved


def startup_ms(src: str, axis: str, n: int, variants: list[str]) -> dict[str, float]:
    """Median milliseconds from load_sandboxed_policy() to a loaded policy, per variant."""
    out: dict[str, list[float]] = {v: [] for v in variants}
    for i in range(n + 1):
        for v in (variants if i % 2 else list(reversed(variants))):
            t = time.perf_counter()
            pol = load_sandboxed_policy(src, axis, **VARIANTS[v])
            dt = time.perf_counter() - t
            pol.close()
            if i:
                out[v].append(dt * 1e3)
    return {v: round(statistics.median(x), 1) for v, x in out.items()}


def bench(cell: str, repeats: int, unpinned: bool = False, bound: bool = False, eager: bool = False,
          mirrored: bool = False, layers: bool = False) -> list[dict]:
    rows = []
    for label, (axis, src) in POLICIES.items():
        cls = policy_class_from_source(src, axis, label)
        names = ["sandboxed"]
        if layers:
            names += ["no seccomp", "no tripwire", "no landlock", "no namespaces or empty root"]
        if mirrored:
            names.append("mirrored layout")
        if eager and axis == "scheduling":
            names.append("eager")
        inproc_t: list[float] = []
        times: dict[str, list[float]] = {v: [] for v in names}
        cpus: dict[str, list[float]] = {v: [] for v in names}  # worker CPU per run: steadier than wall time
        worker_cpu: list[float] = []
        free_t: list[float] = []
        calls = frames = 0
        eager_frames = 0
        base_log = None
        layout = ""
        for i in range(repeats + 1):
            # alternate the order, so that drifts of the machine hit every variant alike
            order = ["in", *names]
            if i % 2:
                order.reverse()
            for v in order:
                if v == "in":
                    t_in, log_in = _run(cell, axis, cls())
                    if i:
                        inproc_t.append(t_in)
                    base_log = base_log or log_in
                    continue
                t_sb, log_sb, n_calls, n_frames, cpu, where = _sandboxed(cell, axis, src, pin=True, **VARIANTS[v])
                if v == "sandboxed":
                    calls, frames, layout = n_calls, n_frames, where
                    if i:
                        worker_cpu.append(cpu)
                elif v == "eager":
                    eager_frames = n_frames
                if i:
                    times[v].append(t_sb)
                    cpus[v].append(cpu / max(1, n_calls) * 1e6)
                ref = base_log if base_log is not None else log_sb
                if log_sb != ref:
                    raise SystemExit(f"{label} ({v}): sandboxed decisions differ from in-process ones")
            if unpinned:
                t_free, log_free, *_ = _sandboxed(cell, axis, src, pin=False)
                if log_free != base_log:
                    raise SystemExit(f"{label}: sandboxed decisions (worker not pinned) differ from in-process ones")
                if i:
                    free_t.append(t_free)
        a, b = statistics.median(inproc_t), statistics.median(times["sandboxed"])
        extra: dict = {}
        if unpinned:
            extra["unpinned_ratio"] = round(statistics.median(free_t) / a, 3)
        extra["variants"] = {v: {"ratio": round(statistics.median(times[v]) / a, 3),
                                 "ratio_paired": round(statistics.median(x / y for x, y in zip(times[v], inproc_t)), 3),
                                 "worker_cpu_us_per_call": round(statistics.median(cpus[v]), 2)}
                             for v in names if v != "sandboxed"}
        if "eager" in times:
            extra["eager_round_trips"] = eager_frames
        if bound:
            extra["deferral_bound"] = deferral_bound(cell, axis, cls())
        rows.append({"policy": label, "cell": cell, "hook_calls": calls, "round_trips": frames,
                     "decisions": len(base_log or []),
                     "inprocess_s": round(a, 4), "sandboxed_s": round(b, 4), "ratio": round(b / a, 3),
                     # best of the runs: the least disturbed ones (the machine is shared)
                     "ratio_best": round(min(times["sandboxed"]) / min(inproc_t), 3),
                     # median of the ratios of runs made back to back: slow drifts cancel
                     "ratio_paired": round(statistics.median(
                         x / y for x, y in zip(times["sandboxed"], inproc_t)), 3),
                     "overhead_us_per_call": round((b - a) / max(1, calls) * 1e6, 1),
                     "overhead_us_per_round_trip": round((b - a) / max(1, frames) * 1e6, 1),
                     # the worker's own CPU (decode, policy, encode, its syscalls); the rest of
                     # the overhead is the parent's encoding and waiting for a CPU to switch to
                     "worker_cpu_us_per_call": round(statistics.median(worker_cpu) / max(1, calls) * 1e6, 2),
                     "layout": layout, "repeats": repeats, **extra})
    return rows


TARGET = 2.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", default="rtx70b_swe_0.1")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", action="store_true",
                    help="also run with one layer off at a time: what each layer costs per simulation")
    ap.add_argument("--startup", type=int, default=0, metavar="N",
                    help="also time N worker starts per configuration (what each layer costs per worker)")
    ap.add_argument("--unpinned", action="store_true",
                    help="also run the sandbox without pinning the worker to the parent's CPU")
    ap.add_argument("--deferral-bound", action="store_true",
                    help="also measure how much latency deferring decisions to the step that needs them could hide")
    ap.add_argument("--mirrored", action="store_true",
                    help="also run with the opt-in layout mirroring (sandbox/layout.py)")
    ap.add_argument("--eager", action="store_true",
                    help="also run the scheduling policies with one round trip per priority (no deferral)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = bench(args.cell, args.repeats, args.unpinned, args.deferral_bound, args.eager, args.mirrored, args.layers)
    floor = round(ipc_floor_us(), 1)
    floor_free = round(ipc_floor_us(pin=False), 1)
    starts = {}
    if args.startup:
        names = ["sandboxed", "no seccomp", "no tripwire", "no landlock", "no namespaces or empty root"]
        axis, src = POLICIES["scheduling/evolved"]
        starts = startup_ms(src, axis, args.startup, names)
    if args.json:
        print(json.dumps({"rows": rows, "ipc_floor_us": floor, "ipc_floor_unpinned_us": floor_free,
                          "startup_ms": starts, "target": TARGET}, indent=2))
    else:
        print(f"bare pipe round trip on this machine (100 us of work between calls): {floor:.0f} us with the "
              f"child on the parent's CPU, {floor_free:.0f} us unpinned")
        for r in rows:
            print(f"{r['policy']:22s} {r['cell']}: in-process {r['inprocess_s']:.3f}s  sandboxed (every layer) "
                  f"{r['sandboxed_s']:.3f}s  ratio {r['ratio']:.2f}x (paired {r['ratio_paired']:.2f}x, best runs "
                  f"{r['ratio_best']:.2f}x; target <= {TARGET:g}x)  "
                  f"({r['hook_calls']} hook calls in {r['round_trips']} round trips, "
                  f"{r['overhead_us_per_round_trip']:.0f} us overhead per round trip, worker CPU "
                  f"{r['worker_cpu_us_per_call']:.0f} us per call)")
            for v, x in r["variants"].items():
                more = f" ({r['eager_round_trips']} round trips)" if v == "eager" else ""
                print(f"{'':22s} {v}{more}: ratio {x['ratio']:.2f}x (paired {x['ratio_paired']:.2f}x), "
                      f"worker CPU {x['worker_cpu_us_per_call']:.1f} us per call")
            if "unpinned_ratio" in r:
                print(f"{'':22s} worker not pinned to the parent's CPU: ratio {r['unpinned_ratio']:.2f}x")
            d = r.get("deferral_bound")
            if d:
                print(f"{'':22s} deferral bound: {d['decisions']} decisions, parent wall time from decision to "
                      f"first use: median {d['median_gap_us']:.0f} us, p90 {d['p90_gap_us']:.0f} us, total "
                      f"{d['sum_gaps_s'] * 1e3:.1f} ms of a {d['run_s'] * 1e3:.0f} ms run")
        if starts:
            print("worker start, median ms: " + ", ".join(f"{k} {v:.0f}" for k, v in starts.items()))
    return 0 if all(r["ratio_paired"] <= TARGET for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
