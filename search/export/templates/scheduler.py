"""vLLM v1 scheduler that applies the exported retention policy (`--scheduler-cls`).

When a request finishes, vLLM frees its KV blocks; full blocks keep their prefix hashes
and stay hittable until the LRU free queue hands them out again. This scheduler asks the
policy first (`on_turn_complete`) and acts on its decision:
  protect(until[, value])  pin the request's cached blocks (`block_pool.touch`, ref +1),
                           so they never enter the free queue, until the deadline, the
                           program's next call (`on_turn_arrival` -> "release"), or memory
                           pressure (waiting work that cannot fit: pins are released lowest
                           value first, as in the simulator's Eq. 5 reclamation)
  release / none           vLLM's own behaviour (LRU)
  evict                    drop the blocks' prefix hashes now
  offload                  treated as release (no host tier without a KV connector)
A program is identified by the request's `session_id` (OpenAI body field or X-Session-ID
header, vLLM >= 0.32), else `vllm_xargs.session_id`; requests without one are untouched.
The engine must outlive a bad policy: a decision that raises or breaks the schema is
logged and replaced by vLLM's own behaviour (release), and counted in `stats["errors"]`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from . import METADATA, policy
from .runtime import PolicyError, RetentionDecision, Signals, call, parse_retention
from .tracker import Call, KVState, ProgramTracker

log = logging.getLogger(__name__)


@dataclass
class Pin:
    blocks: list[Any]          # KVCacheBlock, in allocation order
    until: float
    value: float


def session_of(request: Any) -> str | None:
    sid = getattr(request, "session_id", None)
    if not sid and request.sampling_params is not None:
        sid = (request.sampling_params.extra_args or {}).get("session_id")
    return str(sid) if sid else None


class RetentionMixin:
    """Mixed into vLLM's Scheduler / AsyncScheduler (same hooks in both)."""

    clock = staticmethod(time.monotonic)   # tests may replace it
    IDLE_FORGET_S = 3600.0                 # forget programs idle this long (bounded memory)

    def _retention_init(self) -> None:
        self.retention = policy()
        self.programs = ProgramTracker(None, clock=self.clock)
        self.pins: dict[str, Pin] = {}
        self.calls: dict[str, Call] = {}          # request id -> its tracked call
        self.first_sched: dict[str, float] = {}   # request id -> first scheduling time
        self.stats = {"protect": 0, "release": 0, "evict": 0, "offload": 0, "none": 0,
                      "expired": 0, "pressure": 0, "errors": 0}
        self._swept = 0.0

    # ---------------------------------------------------------------- helpers
    @property
    def _pool(self) -> Any:
        return self.kv_cache_manager.block_pool  # type: ignore[attr-defined]

    def _kv(self, pid: str, now: float) -> KVState:
        pin = self.pins.get(pid)
        if pin is None:
            return KVState(0, None, None)
        return KVState(len(pin.blocks) * self.block_size, pin.until, "device")  # type: ignore[attr-defined]

    def _decide(self, hook: str, *args: Any) -> Any:
        self.retention.bind(Signals(now=args[-1], kv_utilization=self.kv_cache_manager.usage))  # type: ignore[attr-defined]
        try:
            d = parse_retention(call(getattr(self.retention, hook), *args))
        except PolicyError as e:
            self.stats["errors"] += 1
            log.warning("retention policy %s failed, using vLLM's default (release): %s", hook, e)
            d = RetentionDecision("release")
        self.stats[d.kind] = self.stats.get(d.kind, 0) + 1
        return d

    def _unpin(self, pid: str, evict: bool = False) -> None:
        pin = self.pins.pop(pid, None)
        if pin is None:
            return
        self._pool.free_blocks(reversed(pin.blocks))   # tail first, as vLLM frees
        if evict:
            self._pool.evict_blocks({b.block_id for b in pin.blocks if b.ref_cnt == 0})

    # ---------------------------------------------------------------- hooks
    def add_request(self, request: Any) -> None:
        pid = session_of(request)
        if pid is not None and request.request_id not in self.requests:  # type: ignore[attr-defined]
            now = self.clock()
            known = pid in self.programs.programs
            try:
                c = self.programs.begin_call(pid, request.num_prompt_tokens, now=now, kv=self._kv(pid, now))
            except ValueError:   # the session already has a call in flight: leave this one alone
                return super().add_request(request)  # type: ignore[misc]
            self.calls[request.request_id] = c
            if known:
                d = self._decide("on_turn_arrival", self.programs.view(pid, now, self._kv(pid, now)), now)
                self._apply(pid, d, now)
        super().add_request(request)  # type: ignore[misc]

    def _apply(self, pid: str, d: Any, now: float) -> None:
        if d.kind in ("release", "offload"):
            self._unpin(pid)
        elif d.kind == "evict":
            self._unpin(pid, evict=True)
        elif d.kind == "protect" and pid in self.pins:
            if d.until is None or d.until <= now:
                self._unpin(pid)
            else:
                self.pins[pid].until = d.until
                self.pins[pid].value = d.value if d.value is not None else d.until

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        now = self.clock()
        for pid in [p for p, pin in self.pins.items() if pin.until <= now]:
            self.stats["expired"] += 1
            self._unpin(pid)
        if now - self._swept > 60.0:
            self._forget_idle(now)
        self._relieve_pressure()
        out = super().schedule(*args, **kwargs)  # type: ignore[misc]
        for new in out.scheduled_new_reqs:
            self.first_sched.setdefault(new.req_id, now)
        return out

    def _forget_idle(self, now: float) -> None:
        self._swept = now
        for pid, p in list(self.programs.programs.items()):
            if p.release_s is None and pid not in self.pins and now - (p.gap_started_s or now) > self.IDLE_FORGET_S:
                self.programs.finish(pid)

    def _relieve_pressure(self) -> None:
        """Release pins (lowest value first) while the head waiting request cannot fit."""
        waiting = self.waiting  # type: ignore[attr-defined]
        if not self.pins or not len(waiting):
            return
        head = waiting.peek_request()
        need = -(-head.num_tokens // self.block_size)  # type: ignore[attr-defined]
        while self.pins and self._pool.get_num_free_blocks() < need:
            pid = min(self.pins, key=lambda p: (self.pins[p].value, p))
            self.stats["pressure"] += 1
            self._unpin(pid)

    def _free_blocks(self, request: Any) -> None:
        c = self.calls.pop(request.request_id, None)
        if c is None:
            super()._free_blocks(request)  # type: ignore[misc]
            return
        now = self.clock()
        pid = c.program_id
        self.programs.end_call(c, request.num_prompt_tokens, request.num_output_tokens, now=now,
                               first_scheduled_s=self.first_sched.pop(request.request_id, None))
        view = self.programs.view(pid, now, KVState(request.num_computed_tokens, None, "device"))
        d = self._decide("on_turn_complete", view, request.request_id, now)
        if d.kind == "protect" and d.until is not None and d.until > now:
            self._unpin(pid)  # a program holds at most one pinned run: its latest context
            blocks = [b for b in self.kv_cache_manager.get_blocks(request.request_id).blocks[0]  # type: ignore[attr-defined]
                      if b.block_hash is not None and not b.is_null]
            self._pool.touch(blocks)
            self.pins[pid] = Pin(blocks, d.until, d.value if d.value is not None else d.until)
            super()._free_blocks(request)  # type: ignore[misc]
            return
        evict_ids = set()
        if d.kind == "evict":
            evict_ids = {b.block_id for b in self.kv_cache_manager.get_blocks(request.request_id).blocks[0]}  # type: ignore[attr-defined]
        super()._free_blocks(request)  # type: ignore[misc]
        if evict_ids:
            self._pool.evict_blocks({i for i in evict_ids if self._pool.blocks[i].ref_cnt == 0})


class RetentionScheduler(RetentionMixin, Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._retention_init()
        log.info("retention policy %s from run %s active", METADATA["candidate_id"], METADATA["run_id"])


class RetentionAsyncScheduler(RetentionMixin, AsyncScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._retention_init()
        log.info("retention policy %s from run %s active (async scheduling)", METADATA["candidate_id"],
                 METADATA["run_id"])
