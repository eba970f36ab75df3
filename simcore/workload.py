"""Workload model: agent programs as ordered LLM calls separated by tool gaps.

The on-disk format is JSONL, one program per line (README, "Workload format"):

    {"program_id": "swe-0007", "meta": {...},
     "calls": [{"prompt_tokens": 5120, "output_tokens": 143,
                "tool": {"name": "bash", "duration_s": 0.41}}, ...]}

`prompt_tokens` is the whole context of a call. Unless `shared_prefix_tokens` says
otherwise, call k+1 shares call k's prompt + output as its prefix (the KV reuse that
retention policies fight over).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from .textio import json_problem, lines, write_text_atomic


class WorkloadError(ValueError):
    """A workload file or object that cannot be simulated; the message is one line."""


@dataclass(frozen=True, slots=True)
class Call:
    prompt_tokens: int
    output_tokens: int
    tool_name: str | None = None
    tool_duration_s: float = 0.0
    # Tokens of this call's prompt shared with the previous call's prompt+output;
    # None means the default (all of the predecessor's prompt + output).
    shared_prefix_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Program:
    program_id: str
    calls: tuple[Call, ...]
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def shared_prefix(self, k: int) -> int:
        """Prefix tokens call k shares with call k-1's prompt + output."""
        if k == 0:
            return 0
        c = self.calls[k]
        prev = self.calls[k - 1]
        default = prev.prompt_tokens + prev.output_tokens
        s = default if c.shared_prefix_tokens is None else c.shared_prefix_tokens
        return max(0, min(s, c.prompt_tokens, default))


def _req_int(obj: dict, key: str, where: str, minimum: int) -> int:
    if key not in obj:
        raise WorkloadError(f"{where}: missing field '{key}'")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v):
        raise WorkloadError(f"{where}: field '{key}' must be an integer, got {v!r}")
    if v < minimum:
        raise WorkloadError(f"{where}: field '{key}' must be >= {minimum}, got {v!r}")
    return int(v)


def call_from_dict(obj: Any, where: str) -> Call:
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: a call must be an object, got {type(obj).__name__}")
    prompt = _req_int(obj, "prompt_tokens", where, 1)
    output = _req_int(obj, "output_tokens", where, 1)
    tool = obj.get("tool")
    name, dur = None, 0.0
    if tool is not None:
        if not isinstance(tool, dict):
            raise WorkloadError(f"{where}: field 'tool' must be an object or null")
        name = tool.get("name")
        if name is not None and not isinstance(name, str):
            raise WorkloadError(f"{where}: field 'tool.name' must be a string")
        d = tool.get("duration_s", 0.0)
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d < 0:
            raise WorkloadError(f"{where}: field 'tool.duration_s' must be a finite number >= 0, got {d!r}")
        dur = float(d)
    shared = obj.get("shared_prefix_tokens")
    if shared is not None:
        shared = _req_int(obj, "shared_prefix_tokens", where, 0)
    return Call(prompt, output, name, dur, shared)


def program_from_dict(obj: Any, where: str) -> Program:
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: a program must be a JSON object")
    pid = obj.get("program_id")
    if not isinstance(pid, (str, int)) or isinstance(pid, bool) or str(pid) == "":
        raise WorkloadError(f"{where}: missing or invalid field 'program_id'")
    calls = obj.get("calls")
    if not isinstance(calls, list) or not calls:
        raise WorkloadError(f"{where}: field 'calls' must be a non-empty list")
    parsed = tuple(call_from_dict(c, f"{where}: calls[{i}]") for i, c in enumerate(calls))
    meta = obj.get("meta") or {}
    if not isinstance(meta, dict):
        raise WorkloadError(f"{where}: field 'meta' must be an object")
    return Program(str(pid), parsed, meta)


def program_to_dict(p: Program) -> dict[str, Any]:
    calls = []
    for c in p.calls:
        d: dict[str, Any] = {"prompt_tokens": c.prompt_tokens, "output_tokens": c.output_tokens,
                             "tool": None if c.tool_name is None and c.tool_duration_s == 0 else
                             {"name": c.tool_name, "duration_s": round(c.tool_duration_s, 6)}}
        if c.shared_prefix_tokens is not None:
            d["shared_prefix_tokens"] = c.shared_prefix_tokens
        calls.append(d)
    return {"program_id": p.program_id, "meta": p.meta, "calls": calls}


def load_programs(path: str | Path) -> list[Program]:
    """Read a JSONL workload; every problem is reported as `file:line: ...`."""
    path = Path(path)
    programs: list[Program] = []
    seen: set[str] = set()
    for lineno, line in lines(path, WorkloadError, "workload file"):
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{where}: {json_problem(e)}") from None
        p = program_from_dict(obj, where)
        if p.program_id in seen:
            raise WorkloadError(f"{where}: duplicate program_id '{p.program_id}'")
        seen.add(p.program_id)
        programs.append(p)
    if not programs:
        raise WorkloadError(f"{path}: workload has no programs")
    return programs


def save_programs(programs: Iterable[Program], path: str | Path) -> None:
    """Write JSONL atomically (tmp file + rename) so a crash never leaves half a file."""
    text = "".join(json.dumps(program_to_dict(p), separators=(",", ":")) + "\n" for p in programs)
    write_text_atomic(path, text, WorkloadError)


def poisson_arrivals(n: int, rate_jps: float, seed: int) -> list[float]:
    """Program arrival times (s) of a Poisson process; the first program arrives at 0.

    Drawn from their own generator so that every policy, and every workload of the same
    size, sees the same schedule (common random numbers).
    """
    if rate_jps <= 0:
        raise WorkloadError(f"arrival rate must be > 0, got {rate_jps}")
    rng = np.random.default_rng([seed, 0xA441])
    gaps = rng.exponential(1.0 / rate_jps, size=n)
    gaps[0] = 0.0
    return [float(x) for x in np.cumsum(gaps)]
