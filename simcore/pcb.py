"""Program Control Block (paper §3.2) and the causal view handed to policies.

`PCB` is the simulator's live record of a program; it holds a reference to the logical
program (the trace), which policies must never see. `ProgramView` is a frozen copy of
only the deployable fields (DESIGN §2, "Causal observation boundary"); it is built fresh
for every decision, so a policy cannot reach simulator objects through it.

The observation schema is defined here once: the three dataclasses below. Everything else
derives from them: the allow-lists (OBSERVABLE_*), and `observation_schema()`, the plain
data from which the sandbox worker builds its views at start-up (and the export its copy).
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any

from .workload import Program


@dataclass(frozen=True, slots=True)
class ProgramView:
    """What a policy may observe about one program at one instant."""
    program_id: str
    arrival_s: float
    turn_index: int                 # index of the call just released / just completed
    turns_completed: int
    attained_service_s: float       # A_p(t), paper Eq. 3
    context_tokens: int             # prompt tokens of the released (or last) call
    last_instance: int | None
    kv_resident: bool               # some of its KV is cached on a device
    kv_resident_tokens: int
    kv_protected: bool              # protected and unexpired at this instant
    protect_until: float | None
    kv_tier: str | None             # "device", "host" or None
    tool_name: str | None           # the pending (or just returned) tool
    gap_started_s: float | None     # completion time of the last call
    release_s: float | None         # release time of the current call
    returned_tool_durations: tuple[float, ...]
    returned_tool_names: tuple[str | None, ...]
    completed_output_tokens: tuple[int, ...]
    completed_prompt_tokens: tuple[int, ...]

    def gap_elapsed_s(self, now: float) -> float | None:
        """Seconds since the last call completed (the tool gap so far), if any."""
        if self.gap_started_s is None:
            return None
        return max(0.0, now - self.gap_started_s)


#: The observation schema, an allow-list checked by tests and by the sandbox.
OBSERVABLE_PCB_FIELDS: frozenset[str] = frozenset(f.name for f in fields(ProgramView))


@dataclass(frozen=True, slots=True)
class InstanceView:
    """Deployable per-instance signals (vLLM exposes all of these as metrics)."""
    index: int
    running: int
    waiting: int
    kv_utilization: float
    free_tokens: int
    holds_program_kv: bool  # this program's prefix is cached here (router-visible residency)

    @property
    def inflight(self) -> int:
        return self.running + self.waiting


@dataclass(frozen=True, slots=True)
class Signals:
    """System signals s(t) attached to a policy as `self.signals` before each call."""
    now: float
    kv_utilization: float | None          # of the instance the decision concerns
    instances: tuple[InstanceView, ...] = ()


OBSERVABLE_SIGNAL_FIELDS: frozenset[str] = frozenset(f.name for f in fields(Signals))
OBSERVABLE_INSTANCE_FIELDS: frozenset[str] = frozenset(f.name for f in fields(InstanceView))
OBSERVATION_CLASSES: tuple[type, ...] = (ProgramView, InstanceView, Signals)


def _self_reads(source: str) -> list[str]:
    """Attributes a member reads off `self`: the fields it needs sent."""
    return sorted({n.attr for n in ast.walk(ast.parse(source))
                   if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"})


@lru_cache(maxsize=1)
def observation_schema() -> dict[str, Any]:
    """The observation classes as plain data (JSON-able), for code that cannot import simcore.

    {class name: {"fields": [names in order], "types": {name: annotation}, "history":
    [ProgramView's tuple fields, which only grow over a program's life], "members": {name:
    {"source": the member's source, "reads": [fields it reads]}}, "module": "simcore.pcb"}}.
    Members are the public methods and properties (ProgramView.gap_elapsed_s,
    InstanceView.inflight); their source is compiled where the views are rebuilt.
    """
    out: dict[str, Any] = {}
    for cls in OBSERVATION_CLASSES:
        names = [f.name for f in fields(cls)]
        types = {f.name: str(f.type) for f in fields(cls)}
        members = {}
        for name, obj in vars(cls).items():
            if name.startswith("_") or name in names:
                continue
            fn = obj.fget if isinstance(obj, property) else obj
            if not inspect.isfunction(fn):
                continue
            src = textwrap.dedent(inspect.getsource(obj.fget if isinstance(obj, property) else obj))
            members[name] = {"source": src, "reads": _self_reads(src)}
        out[cls.__name__] = {"fields": names, "types": types, "members": members, "module": cls.__module__,
                             "history": [n for n in names if cls is ProgramView and types[n].startswith("tuple[")]}
    return out


@dataclass(slots=True)
class PCB:
    """Live per-program state owned by the Orchestrator (not visible to policies)."""
    program: Program                # hidden: the whole logical program
    arrival_s: float
    pid: int                        # dense index, used by the engine
    turn: int = 0                   # index of the current call
    turns_completed: int = 0
    attained_service_s: float = 0.0
    context_tokens: int = 0
    last_instance: int | None = None
    release_s: float | None = None
    gap_started_s: float | None = None
    finished_s: float | None = None
    preemptions: int = 0
    returned_tool_durations: list[float] = field(default_factory=list)
    returned_tool_names: list[str | None] = field(default_factory=list)
    completed_output_tokens: list[int] = field(default_factory=list)
    completed_prompt_tokens: list[int] = field(default_factory=list)

    @property
    def program_id(self) -> str:
        return self.program.program_id

    def pending_tool_name(self) -> str | None:
        """Tool name of the last completed call: known once the call has produced it."""
        if self.turns_completed == 0:
            return None
        return self.program.calls[self.turns_completed - 1].tool_name

    def view(self, kv_resident_tokens: int, protect_until: float | None, kv_tier: str | None,
             now: float) -> ProgramView:
        return ProgramView(
            program_id=self.program.program_id,
            arrival_s=self.arrival_s,
            turn_index=self.turn,
            turns_completed=self.turns_completed,
            attained_service_s=self.attained_service_s,
            context_tokens=self.context_tokens,
            last_instance=self.last_instance,
            kv_resident=kv_resident_tokens > 0,
            kv_resident_tokens=kv_resident_tokens,
            kv_protected=protect_until is not None and now < protect_until,
            protect_until=protect_until,
            kv_tier=kv_tier,
            tool_name=self.pending_tool_name(),
            gap_started_s=self.gap_started_s,
            release_s=self.release_s,
            returned_tool_durations=tuple(self.returned_tool_durations),
            returned_tool_names=tuple(self.returned_tool_names),
            completed_output_tokens=tuple(self.completed_output_tokens),
            completed_prompt_tokens=tuple(self.completed_prompt_tokens),
        )
