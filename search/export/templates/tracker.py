"""Per-program state, measured outside the simulator, as the policy's `ProgramView`.

One `ProgramTracker` follows every program (agent session) it is told about:

    call = tracker.begin_call("prog-7", context_tokens=1200)   # before sending the request
    ... send the request with call.priority ...
    tracker.end_call(call, prompt_tokens=1200, output_tokens=85, tool_name="bash")

Field definitions (same as the simulator's PCB):
  arrival_s            time of the program's first begin_call (tracker clock, seconds)
  turn_index           index of the call being released (0-based)
  turns_completed      calls that have completed
  attained_service_s   sum over completed calls of (completion - first scheduling); the
                       simulator measures it inside the engine. Client side, end_call takes
                       the server's own measure when it has one: `service_s` (vLLM started
                       with --enable-per-request-metrics reports it; client.end_call reads
                       it), or `first_scheduled_s`, or `queued_s`; otherwise the tracker uses
                       the request start, which also counts the queueing delay (and transfer
                       times). `timing` counts the calls measured each way.
  context_tokens       prompt tokens of the released call (pass it; default: the previous
                       call's prompt + output tokens, a lower bound for an agent transcript)
  gap_started_s        completion time of the last call; the next begin_call records the
                       tool's duration (begin - gap start) and the pending tool name
  kv_*                 KV residency is known to the engine, not the client: pass `kv=` to
                       begin_call if you have it (the retention scheduler does); otherwise
                       the program's last context is assumed resident and unprotected.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .runtime import ProgramView, Signals, call, parse_priority


@dataclass
class KVState:
    resident_tokens: int = 0
    protect_until: float | None = None
    tier: str | None = None


@dataclass
class _Program:
    arrival_s: float
    turn: int = 0
    turns_completed: int = 0
    attained_service_s: float = 0.0
    context_tokens: int = 0
    last_instance: int | None = None
    release_s: float | None = None
    gap_started_s: float | None = None
    pending_tool: str | None = None
    returned_tool_durations: list[float] = field(default_factory=list)
    returned_tool_names: list[str | None] = field(default_factory=list)
    completed_output_tokens: list[int] = field(default_factory=list)
    completed_prompt_tokens: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Call:
    program_id: str
    turn: int
    release_s: float
    priority: int | None


class ProgramTracker:
    def __init__(self, scheduling: Any = None, clock: Callable[[], float] | None = None) -> None:
        self.scheduling = scheduling
        t0 = time.monotonic()
        self.clock = clock or (lambda: time.monotonic() - t0)
        self.programs: dict[str, _Program] = {}
        # completed calls whose service time was given (server timing) / taken from the request start
        self.timing = {"given": 0, "from_request_start": 0}
        self._lock = threading.Lock()   # agents call from many threads

    def view(self, pid: str, now: float, kv: KVState | None = None) -> ProgramView:
        p = self.programs[pid]
        if kv is None:  # client side: assume the last context is cached, unprotected
            last = (p.completed_prompt_tokens[-1] + p.completed_output_tokens[-1]) if p.turns_completed else 0
            kv = KVState(last, None, "device" if last else None)
        return ProgramView(
            program_id=pid, arrival_s=p.arrival_s, turn_index=p.turn, turns_completed=p.turns_completed,
            attained_service_s=p.attained_service_s, context_tokens=p.context_tokens,
            last_instance=p.last_instance, kv_resident=kv.resident_tokens > 0,
            kv_resident_tokens=kv.resident_tokens,
            kv_protected=kv.protect_until is not None and now < kv.protect_until,
            protect_until=kv.protect_until, kv_tier=kv.tier,
            tool_name=p.pending_tool if p.turns_completed else None,
            gap_started_s=p.gap_started_s, release_s=p.release_s,
            returned_tool_durations=tuple(p.returned_tool_durations),
            returned_tool_names=tuple(p.returned_tool_names),
            completed_output_tokens=tuple(p.completed_output_tokens),
            completed_prompt_tokens=tuple(p.completed_prompt_tokens))

    def begin_call(self, program_id: str, context_tokens: int | None = None, now: float | None = None,
                   kv: KVState | None = None, kv_utilization: float | None = None,
                   instance: int | None = None) -> Call:
        """Release the program's next call; returns it with the scheduling policy's priority."""
        with self._lock:
            now = self.clock() if now is None else now
            p = self.programs.get(program_id)
            if p is None:
                p = self.programs[program_id] = _Program(arrival_s=now)
            elif p.release_s is not None:
                raise ValueError(f"program '{program_id}': call {p.turn} has not ended yet")
            if p.turns_completed > 0:
                p.returned_tool_durations.append(max(0.0, now - (p.gap_started_s or now)))
                p.returned_tool_names.append(p.pending_tool)
            p.turn = p.turns_completed
            p.release_s = now
            if context_tokens is None:
                context_tokens = (p.completed_prompt_tokens[-1] + p.completed_output_tokens[-1]) \
                    if p.turns_completed else 0
            p.context_tokens = int(context_tokens)
            prio = None
            if self.scheduling is not None:
                v = self.view(program_id, now, kv)
                self.scheduling.bind(Signals(now=now, kv_utilization=kv_utilization))
                prio = parse_priority(call(self.scheduling.priority, v, now))
            if instance is not None:
                p.last_instance = instance
            return Call(program_id, p.turn, now, prio)

    def end_call(self, c: Call, prompt_tokens: int, output_tokens: int, tool_name: str | None = None,
                 now: float | None = None, first_scheduled_s: float | None = None,
                 queued_s: float | None = None, service_s: float | None = None) -> None:
        """The call completed (response fully received); `tool_name` = the tool it asked for.

        Service time, best first: `service_s` (server-measured, first scheduling -> last
        token), `first_scheduled_s` (tracker clock), `queued_s` (server-measured wait);
        without any, request start -> now (includes queueing)."""
        with self._lock:
            now = self.clock() if now is None else now
            p = self.programs[c.program_id]
            if service_s is not None:
                served = service_s
            else:
                start = first_scheduled_s if first_scheduled_s is not None else c.release_s + (queued_s or 0.0)
                served = now - start
            given = service_s is not None or first_scheduled_s is not None or queued_s is not None
            self.timing["given" if given else "from_request_start"] += 1
            p.attained_service_s += max(0.0, served)
            p.turns_completed = c.turn + 1
            p.completed_prompt_tokens.append(int(prompt_tokens))
            p.completed_output_tokens.append(int(output_tokens))
            p.gap_started_s = now
            p.release_s = None
            p.pending_tool = tool_name

    def finish(self, program_id: str) -> None:
        """Forget a finished program (bounded memory for long-lived clients)."""
        with self._lock:
            self.programs.pop(program_id, None)
