"""Program Orchestrator (paper §3.2): PCBs, the release rule, and the causal view.

r_{p,1} = a_p and r_{p,k+1} = c_{p,k} + g_{p,k} (Eq. 2): a successor is released only
when its predecessor has completed in simulation and its tool has returned.
"""
from __future__ import annotations

import itertools
from typing import Callable, Sequence

from .dispatch import DispatchPlane
from .instance import Instance
from .pcb import PCB, ProgramView
from .request import Request
from .retention import RetentionPlane
from .workload import Program

ViewHook = Callable[[PCB, ProgramView], object]


class Orchestrator:
    def __init__(self, programs: Sequence[Program], arrivals: Sequence[float], instances: Sequence[Instance],
                 dispatch: DispatchPlane, retention: RetentionPlane, view_hook: ViewHook | None = None) -> None:
        self.pcbs = [PCB(program=p, arrival_s=a, pid=i) for i, (p, a) in enumerate(zip(programs, arrivals))]
        self.instances = instances
        self.dispatch = dispatch
        self.retention = retention
        self.view_hook = view_hook   # tests only: lets a positive control see hidden data
        self._rid = itertools.count()

    def view(self, pcb: PCB, now: float, in_use_tokens: int | None = None) -> ProgramView:
        """The causal view; `in_use_tokens` marks KV still held by a just-finished call."""
        home = pcb.last_instance
        if in_use_tokens is not None:
            resident, until, tier = in_use_tokens, None, "device"
        elif home is None:
            resident, until, tier = 0, None, None
        else:
            resident, until, tier = self.instances[home].kv.residency(pcb.pid)
        v = pcb.view(resident, until, tier, now)
        return self.view_hook(pcb, v) if self.view_hook is not None else v  # type: ignore[return-value]

    def release(self, pcb: PCB, now: float) -> Instance:
        """Release the program's next call at `now`; returns the instance it was queued on."""
        k = pcb.turns_completed
        call = pcb.program.calls[k]
        pcb.turn = k
        pcb.release_s = now
        pcb.context_tokens = call.prompt_tokens
        if k > 0:  # the tool of call k-1 has returned: its duration is now observable
            pcb.returned_tool_durations.append(now - pcb.gap_started_s)  # type: ignore[operator]
            pcb.returned_tool_names.append(pcb.program.calls[k - 1].tool_name)
        view = self.view(pcb, now)
        idx, prio = self.dispatch.dispatch(view, pcb.pid, now)
        if k > 0:
            self.retention.on_arrival(view, pcb.pid, now)
        inst = self.instances[idx]
        req = Request(rid=next(self._rid), pid=pcb.pid, turn=k, prompt=call.prompt_tokens,
                      output=call.output_tokens, shared=pcb.program.shared_prefix(k) if k > 0 else 0,
                      priority=prio, arrival=now, instance=idx)
        if prio is None:
            self.dispatch.defer(req)
        pcb.last_instance = idx
        inst.add(req)
        return inst

    def complete(self, req: Request, now: float) -> float | None:
        """Call finished at `now`. Returns the release time of the successor, if any."""
        pcb = self.pcbs[req.pid]
        call = pcb.program.calls[req.turn]
        pcb.turns_completed = req.turn + 1
        # A_p (Eq. 3): first admission to completion, preemption intervals included.
        pcb.attained_service_s += now - (req.first_sched if req.first_sched is not None else now)
        pcb.completed_output_tokens.append(req.output)
        pcb.completed_prompt_tokens.append(req.prompt)
        pcb.preemptions += req.preemptions
        pcb.gap_started_s = now
        pcb.release_s = None
        # The finished call's blocks are still held: resident on its instance.
        view = self.view(pcb, now, in_use_tokens=req.num_computed)
        self.retention.on_complete(view, req, self.instances[req.instance], now)
        if pcb.turns_completed == len(pcb.program.calls):
            pcb.finished_s = now
            return None
        return now + call.tool_duration_s
