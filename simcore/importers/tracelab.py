"""TraceLab (uw-syfi/TraceLab) coding-agent traces -> programs.

Two forms are read, told apart by the file: a `.csv` is a replay CSV, anything else a
round trace (JSONL).

Round trace (derived or sanitized `round_trace.jsonl`, one row per LLM round):
  program   = session_id, calls ordered by round_index
  prompt    = input_tokens_total (= prefix_tokens + newly_append_tokens)
  output    = output_tokens (at least 1)
  prefix    = the whole previous prompt + output, as the conversation is append-only;
              where the context shrank (compaction), the provider's cached prefix
              (prefix_tokens) is taken as what survived
  tool gap  = time the next round's input was complete (its last user_message /
              tool_result event) minus this round's last assistant event, >= 0; rounds
              without timing events fall back to the longest tool_wall_latency_ms
  tool name = the round's tool with the longest wall latency; "user" when the round
              called no tool (the gap is then the user's think time)
  arrival   = the session's first event time, relative to the file's earliest

Replay CSV (session_id, [arrival_time], round_idx, prefix_len, input_len, output_len,
tool_wait_after_ms):
  prompt = prefix_len + input_len; shared prefix = prefix_len; output = output_len;
  gap = tool_wait_after_ms / 1000; arrival = arrival_time in milliseconds (TraceLab's
  replay runner reads it as `arrival_time_ms`).
"""
from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path
from typing import Any

from simcore.importers._common import check_file, fail, parse_time, read_jsonl, req, req_count
from simcore.textio import read_text
from simcore.workload import Call, Program, WorkloadError

_INPUT_EVENTS = {"user_message", "tool_result"}
_CSV_COLUMNS = ("session_id", "round_idx", "prefix_len", "input_len", "output_len", "tool_wait_after_ms")


def load(path: Path, **_: Any) -> list[Program]:
    if path.suffix.lower() == ".csv":
        return _load_csv(path)
    return _load_rounds(path)


def _event_times(row: dict, path: Path, line: int) -> tuple[float | None, float | None]:
    """(last assistant event, last input event) of one round, POSIX seconds."""
    events = row.get("timing_events") or []
    if not isinstance(events, list):
        raise fail(path, line, "field 'timing_events' must be a list")
    last_out = last_in = None
    for ev in events:
        if not isinstance(ev, dict) or "timestamp" not in ev:
            raise fail(path, line, "timing_events entries need 'event_type' and 'timestamp'")
        t = parse_time(ev["timestamp"], path, line, "timing_events.timestamp")
        if ev.get("event_type") in _INPUT_EVENTS:
            last_in = t if last_in is None else max(last_in, t)
        else:
            last_out = t if last_out is None else max(last_out, t)
    return last_out, last_in


def _load_rounds(path: Path) -> list[Program]:
    sessions: dict[str, list[tuple[int, int, dict]]] = defaultdict(list)
    for line, row in read_jsonl(path):
        sid = str(req(row, "session_id", (str, int), path, line))
        idx = req_count(row, "round_index", path, line)
        sessions[sid].append((idx, line, row))
    if not sessions:
        raise fail(path, None, "no rounds in the trace")
    programs, starts = [], {}
    for sid, rows in sessions.items():
        rows.sort(key=lambda r: r[0])
        for (a, la, _), (b, lb, _) in zip(rows, rows[1:]):
            if a == b:
                raise fail(path, lb, f"session '{sid}' repeats round_index {b} (first at line {la})")
        parsed = []
        for idx, line, row in rows:
            prompt = req_count(row, "input_tokens_total", path, line, 1)
            out = max(1, req_count(row, "output_tokens", path, line))
            prefix = row.get("prefix_tokens")
            prefix = req_count(row, "prefix_tokens", path, line) if prefix is not None else None
            tools = row.get("tools") or []
            if not isinstance(tools, list):
                raise fail(path, line, "field 'tools' must be a list")
            lat = []
            for t in tools:
                if not isinstance(t, dict):
                    raise fail(path, line, "tools entries must be objects")
                ms = t.get("tool_wall_latency_ms")
                ms = float(ms) if isinstance(ms, (int, float)) and not isinstance(ms, bool) else 0.0
                lat.append((ms, str(t.get("tool_name") or "tool")))
            out_t, in_t = _event_times(row, path, line)
            parsed.append((line, prompt, out, prefix, lat, out_t, in_t))
        calls = []
        for k, (line, prompt, out, prefix, lat, out_t, _) in enumerate(parsed):
            shared = None
            if k > 0:
                prev_prompt = parsed[k - 1][1]
                if prompt < prev_prompt and prefix is not None:
                    shared = min(prefix, prompt)
            if k == len(parsed) - 1:
                calls.append(Call(prompt, out, None, 0.0, shared))
                break
            next_in = parsed[k + 1][6]
            if out_t is not None and next_in is not None:
                gap = max(0.0, next_in - out_t)
            else:
                gap = max((ms for ms, _ in lat), default=0.0) / 1000.0
            name = max(lat)[1] if lat else "user"
            calls.append(Call(prompt, out, name, gap, shared))
        first = [t for t in (parsed[0][6], parsed[0][5]) if t is not None]
        if first:
            starts[sid] = min(first)
        programs.append(Program(sid, tuple(calls), {"source": "tracelab", "rounds": len(calls)}))
    if len(starts) == len(programs):
        t0 = min(starts.values())
        programs = [Program(p.program_id, p.calls, dict(p.meta, arrival_s=round(starts[p.program_id] - t0, 6)))
                    for p in programs]
        programs.sort(key=lambda p: p.meta["arrival_s"])
    return programs


def _load_csv(path: Path) -> list[Program]:
    check_file(path)
    sessions: dict[str, list[tuple[int, int, dict]]] = defaultdict(list)
    arrivals: dict[str, float] = {}
    with io.StringIO(read_text(path, WorkloadError), newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        missing = [c for c in _CSV_COLUMNS if c not in header]
        if missing:
            raise fail(path, 1, f"replay CSV lacks column(s) {', '.join(missing)} "
                                f"(expected {', '.join(_CSV_COLUMNS)}[, arrival_time])")
        has_arrival = "arrival_time" in header
        for row in reader:
            line = reader.line_num
            if None in row or any(row.get(c) in (None, "") for c in _CSV_COLUMNS):
                raise fail(path, line, "truncated or malformed row (wrong number of fields)")
            try:
                vals = {c: float(row[c]) for c in _CSV_COLUMNS[1:]}
                if has_arrival:
                    vals["arrival_time"] = float(row["arrival_time"])
            except ValueError:
                raise fail(path, line, "non-numeric value in a numeric column") from None
            for c in ("round_idx", "prefix_len", "input_len", "output_len"):
                if vals[c] != int(vals[c]) or vals[c] < 0:
                    raise fail(path, line, f"field '{c}' must be an integer >= 0, got {row[c]!r}")
            if vals["tool_wait_after_ms"] < 0 or vals["prefix_len"] + vals["input_len"] < 1:
                raise fail(path, line, "negative tool wait or empty prompt")
            sid = row["session_id"]
            sessions[sid].append((int(vals["round_idx"]), line, vals))
            if has_arrival:
                arrivals.setdefault(sid, vals["arrival_time"] / 1000.0)
    if not sessions:
        raise fail(path, None, "no rows in the replay CSV")
    programs = []
    for sid, rows in sessions.items():
        rows.sort(key=lambda r: r[0])
        for (a, la, _), (b, lb, _) in zip(rows, rows[1:]):
            if a == b:
                raise fail(path, lb, f"session '{sid}' repeats round_idx {b} (first at line {la})")
        calls = []
        for k, (_, _, v) in enumerate(rows):
            prompt = int(v["prefix_len"] + v["input_len"])
            out = max(1, int(v["output_len"]))
            shared = int(v["prefix_len"]) if k > 0 else None
            if k == len(rows) - 1:
                calls.append(Call(prompt, out, None, 0.0, shared))
            else:
                calls.append(Call(prompt, out, "tool", v["tool_wait_after_ms"] / 1000.0, shared))
        meta: dict[str, Any] = {"source": "tracelab-replay"}
        if arrivals:
            meta["arrival_s"] = arrivals[sid]
        programs.append(Program(f"tracelab-{sid}", tuple(calls), meta))
    if arrivals:
        t0 = min(arrivals.values())
        programs = [Program(p.program_id, p.calls, dict(p.meta, arrival_s=round(p.meta["arrival_s"] - t0, 6)))
                    for p in programs]
        programs.sort(key=lambda p: p.meta["arrival_s"])
    return programs
