"""Micro-benchmark of the performance model's hot path.

    .venv/bin/python benchmarks/bench_perf.py [cell ...]

Prints microseconds per step_time call (decode-only, one prefill with decodes, three
prefills) and per decode_steps_time call (1,000 steps), on random batch shapes typical of
the SWE cells (contexts 1k-100k, up to 128 sequences).
"""
from __future__ import annotations

import random
import sys
import time

from simcore.config import get_cell
from simcore.perf import build_perf_model


def _per_call_us(fn, args: list[tuple]) -> float:
    t = time.perf_counter()
    for a in args:
        fn(*a)
    return (time.perf_counter() - t) / len(args) * 1e6


def main(cells: list[str]) -> None:
    rng = random.Random(0)
    n = 20000
    for name in cells:
        t = time.perf_counter()
        pm = build_perf_model(get_cell(name))
        build_ms = (time.perf_counter() - t) * 1e3
        dec = [((), k, k * rng.randint(1000, 100000)) for k in (rng.randint(1, 128) for _ in range(n))]
        mix = [([(rng.randint(16, 8192), rng.randint(0, 60000))], k, k * rng.randint(1000, 60000))
               for k in (rng.randint(0, 64) for _ in range(n))]
        three = [([(rng.randint(16, 4096), rng.randint(0, 60000)) for _ in range(3)], k, k * 20000)
                 for k in (rng.randint(1, 64) for _ in range(n))]
        runs = [(k, rng.randint(1000, 60000) * k, 1000) for k in (rng.randint(1, 128) for _ in range(n // 10))]
        print(f"{name} ({pm.source}; build {build_ms:.0f} ms)")
        print(f"  step_time decode-only     {_per_call_us(pm.step_time, dec):6.2f} us/call")
        print(f"  step_time 1 prefill+dec   {_per_call_us(pm.step_time, mix):6.2f} us/call")
        print(f"  step_time 3 prefills+dec  {_per_call_us(pm.step_time, three):6.2f} us/call")
        print(f"  decode_steps_time x1000   {_per_call_us(pm.decode_steps_time, runs):6.2f} us/call")


if __name__ == "__main__":
    main(sys.argv[1:] or ["rtx70b_swe_0.1", "b200_8b_swe_0.04", "h100x2_8b_swe_0.1"])
