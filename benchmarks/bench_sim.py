"""Simulator speed: wall seconds per cell, events/s and peak RSS (issue 2 targets:
rtx70b_swe_0.1 <= 3 s, rtx70b_swe_0.02 <= 10 s on one core, peak RSS <= 500 MB).

    python benchmarks/bench_sim.py [--repeat 3]

The figures are printed, not asserted: machines are shared and noisy. The ratio column
compares each cell with the first one measured in the same run.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

from simcore.sim import simulate

CELLS = [("rtx70b_swe_0.1", 3.0), ("rtx70b_swe_0.02", 10.0), ("b200_8b_swe_0.04", None),
         ("b200_8b_bfcl_0.1", None), ("b200x4_8b_swe_0.1", None)]
POLICIES = [("cache-lru", "fcfs"), ("ttl", "plas")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    simulate("rtx70b_swe10_0.1")  # warm imports and table loading out of the timings
    base = None
    print(f"{'cell':22} {'policies':18} {'wall_s(median)':>14} {'target':>7} {'ratio':>6} "
          f"{'events':>7} {'steps':>7} {'events/s':>9} {'calls/s':>8}")
    for cell, target in CELLS:
        for ret, sch in POLICIES:
            walls, res = [], None
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                res = simulate(cell, retention=ret, scheduling=sch)
                walls.append(time.perf_counter() - t0)
            w = statistics.median(walls)
            base = base or w
            s = res.summary
            print(f"{cell:22} {ret + '+' + sch:18} {w:14.3f} {target or '-':>7} {w / base:6.2f} "
                  f"{s['events']:7d} {s['engine_steps']:7d} {s['events'] / w:9.0f} {s['calls'] / w:8.0f}")
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {rss_mb:.0f} MB (target <= 500 MB)")


if __name__ == "__main__":
    main()
