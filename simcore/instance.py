"""Instance engine: one vLLM v1 serving instance (scheduler + KV manager + step timing).

Scheduler rules follow vLLM `v1/core/sched/scheduler.py` (DESIGN §2): running requests
first, each taking min(remaining, budget left) tokens; a running request that cannot get
blocks preempts by recompute (priority policy: the running request with the largest
(priority, arrival); FCFS: the last one); no waiting request is admitted in a step that
preempted; admission stops at the first allocation failure; waiting requests are ordered
by (priority, arrival, id) under the priority policy and FIFO (preempted first) under FCFS.

Speed: cost grows with scheduling events, not decode tokens. When a step is decode-only
and nothing can change the batch, the engine advances all the steps up to the next event
(a call finishing, blocks running out, the next global event) in one go, timing them with
`PerfModel.decode_steps_time`.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Protocol, Sequence

from .kv import FREE, PROTECTED, KVManager
from .request import Request


class StepTimer(Protocol):
    def step_time(self, prefills: Sequence[tuple[int, int]], n_decode: int, decode_kv_sum: int) -> float: ...
    def decode_steps_time(self, n_decode: int, decode_kv_sum: int, steps: int) -> float: ...
    def kv_transfer_time(self, tokens: int) -> float: ...


def _no_pending() -> None:
    raise RuntimeError("a request has no priority and no Dispatch Plane can collect it")


class Instance:
    def __init__(self, index: int, kv: KVManager, perf: StepTimer, *, max_num_seqs: int,
                 max_num_batched_tokens: int, scheduling_policy: str) -> None:
        self.index = index
        self.kv = kv
        self.perf = perf
        self.block_size = kv.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.priority_mode = scheduling_policy == "priority"
        self.running: list[Request] = []
        self._heap: list[tuple[int, float, int, Request]] = []  # priority mode
        self._fifo: deque[Request] = deque()                      # fcfs mode
        self._unranked: list[Request] = []                        # priority mode, priority pending
        self.resolve_priorities: Callable[[], None] = _no_pending  # set by the Dispatch Plane
        self.stepping = False
        self.busy_s = 0.0
        self.steps = 0
        self.preemptions = 0
        self.prefill_tokens = 0
        self.hit_tokens = 0
        self.usage_t: list[float] = []
        self.usage_u: list[float] = []
        self.inflight_n: list[int] = []   # running + waiting at each step start

    # ------------------------------------------------------------------ queue
    # Under the priority policy a request may be queued before its priority is known (a
    # policy that answers priorities in batches, see policies/base.py): it waits unranked
    # until an order is needed -- two or more waiting, or a preemption victim to choose --
    # and then every pending priority is collected at once (resolve_priorities). Ranking
    # only when an order is needed gives exactly the eager order.
    @property
    def num_waiting(self) -> int:
        return len(self._heap) + len(self._unranked) if self.priority_mode else len(self._fifo)

    def busy(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    def add(self, req: Request) -> None:
        if not self.priority_mode:
            self._fifo.append(req)
        elif req.priority is None:
            self._unranked.append(req)
        else:
            heapq.heappush(self._heap, (req.priority, req.arrival, req.seq, req))

    def rank_pending(self) -> None:
        """Move the waiting requests whose priority has just been collected into the queue."""
        for req in self._unranked:
            heapq.heappush(self._heap, (req.priority, req.arrival, req.seq, req))
        self._unranked.clear()

    def _peek(self) -> Request:
        if not self.priority_mode:
            return self._fifo[0]
        if self._unranked:
            if not self._heap and len(self._unranked) == 1:
                return self._unranked[0]  # alone in the queue: first whatever its priority
            self.resolve_priorities()
        return self._heap[0][3]

    def _pop(self) -> None:
        if not self.priority_mode:
            self._fifo.popleft()
        elif self._unranked:  # only ever the lone unranked request _peek returned
            self._unranked.pop()
        else:
            heapq.heappop(self._heap)

    def _requeue(self, req: Request) -> None:
        if self.priority_mode:
            heapq.heappush(self._heap, (req.priority, req.arrival, req.seq, req))
        else:
            self._fifo.appendleft(req)  # vLLM prepends preempted requests under FCFS

    # ------------------------------------------------------------------ scheduling
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _preempt(self, victim: Request, now: float) -> None:
        self.running.remove(victim)
        full = victim.num_computed // self.block_size
        # vLLM frees a preempted request's blocks with their hashes: its prefix stays hittable.
        self.kv.store(victim.pid, full, victim.held, now, "release")
        victim.held = 0
        victim.num_computed = 0
        victim.shared = victim.num_tokens
        victim.preemptions += 1
        self.preemptions += 1
        self._requeue(victim)

    def _victim(self) -> Request:
        if self.priority_mode:
            if any(r.priority is None for r in self.running):
                self.resolve_priorities()
            return max(self.running, key=lambda r: (r.priority, r.arrival))
        return self.running[-1]

    def step(self, now: float, horizon: float) -> tuple[float, list[Request]]:
        """Schedule and execute one step (or a stable decode window) starting at `now`.

        Returns the end time and the requests that finish then. Token state is applied
        at once; completions are handed to the caller to process at the end time.
        """
        kv, bs = self.kv, self.block_size
        kv.expire(now)
        budget = self.max_num_batched_tokens
        sched: list[list] = []          # [req, new_tokens]
        preempted = False
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            new = min(req.num_tokens - req.num_computed, budget)
            need = self._blocks_for(req.num_computed + new) - req.held
            ok = True
            while need > 0 and not kv.can_allocate(need):
                victim = self._victim()
                vi = running.index(victim)
                self._preempt(victim, now)
                preempted = True
                if victim is req:
                    ok = False
                    break
                for j, s in enumerate(sched):
                    if s[0] is victim:
                        budget += s[1]
                        del sched[j]
                        break
                if vi < i:
                    i -= 1
            if not ok:
                break
            if need > 0:
                kv.allocate(need)
                req.held += need
            sched.append([req, new])
            budget -= new
            i += 1

        transfer = 0
        if not preempted:
            while self.num_waiting and budget > 0 and len(running) < self.max_num_seqs:
                req = self._peek()
                dev, host = kv.hittable(req.pid, req.shared, req.num_tokens)
                hit_tok = (dev + host) * bs
                new = min(req.num_tokens - hit_tok, budget)
                need = self._blocks_for(hit_tok + new) - dev
                e = kv.entries.get(req.pid)
                reserved = dev if e is not None and e.state in (FREE, PROTECTED) else 0
                if not kv.can_allocate(need, reserved):
                    break
                self._pop()
                kv.touch(req.pid, dev, now)
                kv.allocate(need)
                req.held = dev + need
                req.num_computed = hit_tok
                req.hit_tokens += dev * bs
                req.host_hit_tokens += host * bs
                self.hit_tokens += hit_tok
                transfer += host * bs
                if req.first_sched is None:
                    req.first_sched = now
                running.append(req)
                sched.append([req, new])
                budget -= new

        # ---- timing
        prefills = []
        n_dec = kv_dec = 0
        for req, new in sched:
            if new == 1 and req.generated > 0 and req.num_computed == req.num_tokens - 1:
                n_dec += 1
                kv_dec += req.num_computed + 1
            else:
                prefills.append((new, req.num_computed))
                self.prefill_tokens += new
        window = 1
        if not prefills and not preempted and n_dec == len(running) and n_dec > 0:
            window = self._decode_window(now, horizon, kv_dec)
        if window > 1:
            dt = self.perf.decode_steps_time(n_dec, kv_dec, window)
        else:
            dt = self.perf.step_time(prefills, n_dec, kv_dec)
        if transfer:
            dt += self.perf.kv_transfer_time(transfer)
        end = now + dt
        self.busy_s += dt
        self.steps += window
        self.usage_t.append(now)
        self.usage_u.append(kv.usage())
        self.inflight_n.append(len(running) + self.num_waiting)

        # ---- apply tokens
        finished = []
        if window > 1:
            extra = 0
            for req in running:
                extra += self._blocks_for(req.num_computed + window) - req.held
            if extra > 0:
                kv.allocate(extra)
            for req in running:
                req.held = self._blocks_for(req.num_computed + window)
                req.num_computed += window
                req.num_tokens += window
                req.generated += window
                if req.generated >= req.output:
                    req.finished = end
                    finished.append(req)
        else:
            for req, new in sched:
                req.num_computed += new
                if req.num_computed == req.num_tokens:
                    req.generated += 1
                    req.num_tokens += 1
                    if req.generated == 1:
                        req.first_token = end
                    if req.generated >= req.output:
                        req.finished = end
                        finished.append(req)
        return end, finished

    def _decode_window(self, now: float, horizon: float, kv_dec: int) -> int:
        """Largest number of decode-only steps that no event can interrupt."""
        running = self.running
        n = len(running)
        k = min(r.output - r.generated for r in running)
        if k <= 1:
            return 1
        # Blocks: steps 2..k must allocate without preemption.
        avail = self.kv.num_free + self.kv.num_protected
        bs = self.block_size

        def extra_blocks(steps: int) -> int:
            return sum(max(0, -(-(r.num_computed + steps) // bs) - r.held) for r in running)

        if extra_blocks(k) > avail:
            lo, hi = 1, k  # extra_blocks(1) == 0 (step 1 already allocated)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if extra_blocks(mid) <= avail:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        if k <= 1:
            return 1
        if extra_blocks(k) > 0:  # a protection expiring mid-window would reorder reclamation
            horizon = min(horizon, self.kv.next_deadline())
        # Time: end at the first step boundary at or after the next global event.
        left = horizon - now
        dst = self.perf.decode_steps_time
        if dst(n, kv_dec, k - 1) >= left:
            lo, hi = 1, k - 1
            while lo < hi:
                mid = (lo + hi) // 2
                if dst(n, kv_dec, mid) >= left:
                    hi = mid
                else:
                    lo = mid + 1
            k = lo
        return k
