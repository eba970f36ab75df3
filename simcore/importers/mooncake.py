"""Mooncake request-level traces (kvcache-ai/Mooncake, FAST'25) -> single-call programs.

One JSON line per request: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`
(512-token blocks). Each request becomes a program of one call with no tool, so the
program layer has nothing to do (paper Appendix C):
  prompt = input_length; output = output_length (at least 1); arrival = timestamp / 1000
  relative to the earliest. Prefix sharing *between* requests (common hash_ids) has no
  place in the program format, whose reuse is within a program; it is not represented.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from simcore.importers._common import fail, read_jsonl, req, req_count
from simcore.workload import Call, Program


def load(path: Path, **_: Any) -> list[Program]:
    rows = []
    for line, row in read_jsonl(path):
        ts = req(row, "timestamp", (int, float), path, line)
        if ts < 0:
            raise fail(path, line, f"field 'timestamp' must be >= 0, got {ts!r}")
        prompt = req_count(row, "input_length", path, line, 1)
        out = max(1, req_count(row, "output_length", path, line))
        rows.append((float(ts), line, prompt, out))
    if not rows:
        raise fail(path, None, "no requests in the trace")
    t0 = min(r[0] for r in rows)
    rows.sort(key=lambda r: (r[0], r[1]))
    return [Program(f"mooncake-{line}", (Call(prompt, out),),
                    {"source": "mooncake", "arrival_s": round((ts - t0) / 1000.0, 6)})
            for ts, line, prompt, out in rows]
