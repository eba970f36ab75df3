"""Instance engine: one vLLM v1 serving instance (scheduler + KV manager + step timing).

`Instance.step` makes exactly the decisions of vLLM 0.32's `Scheduler.schedule`
(vllm/v1/core/sched/scheduler.py; proven step by step against it by tests/parity/):

* Running requests first, in admission order; each takes min(remaining tokens,
  `long_prefill_token_threshold` if set and more than one request is in the system,
  budget left). A running request that cannot get KV blocks preempts by recompute -- the
  victim is the waiting queue's call (`RequestQueue.preemption_victim`); its blocks go
  back with their prefix hashes, including blocks hashed for tokens scheduled earlier in
  this step; it returns to the waiting queue with nothing computed.
* No waiting request is admitted in a step that preempted; admission stops at the first
  request that does not fit, at `max_num_seqs` running, or when the budget is spent.
* A waiting request is admitted only if its *whole* sequence fits in the free blocks
  (`scheduler_reserve_full_isl`, KVCacheManager.allocate_slots(full_sequence_must_fit)),
  counting its prefix-hit blocks that sit in the free queue and, when something is already
  running, `watermark` x num_blocks blocks of headroom.

Speed: cost grows with scheduling events, not decode tokens. When a step is decode-only
and nothing can change the batch, the engine advances all the steps up to the next event
(a call finishing, blocks running out, the next global event) in one go, timing them with
`PerfModel.decode_steps_time`.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

from .config import EngineArgs
from .kv import KVManager
from .policies.base import RetentionKind
from .request import Request
from .request_queue import create_request_queue


class StepTimer(Protocol):
    """A performance model. It may also define `wake_time(idle_s) -> float`, the extra time of the
    first step after the engine sat idle (measured profiles only, simcore/perf_measured.py)."""

    def step_time(self, prefills: Sequence[tuple[int, int]], n_decode: int, decode_kv_sum: int) -> float: ...
    def decode_steps_time(self, n_decode: int, decode_kv_sum: int, steps: int) -> float: ...
    def kv_transfer_time(self, tokens: int) -> float: ...


class StepObserver(Protocol):
    """Hooks an instance calls (metrics, the vLLM parity harness)."""

    def on_step(self, inst: "Instance", now: float, dt: float, steps: int, scheduled: Sequence[list],
                admitted: Sequence[Request], preempted: Sequence[Request], prefill_tokens: int) -> None:
        """A step (or a decode window of `steps` identical steps) starting at `now` was
        scheduled: `scheduled` lists [request, tokens] in vLLM's order."""

    def on_finish(self, inst: "Instance", req: Request, now: float) -> None:
        """`req` produced its last token at `now` and left the running set."""


class Instance:
    def __init__(self, index: int, kv: KVManager, perf: StepTimer, args: EngineArgs, *,
                 resolve_priorities: Callable[[], None] | None = None,
                 observers: Sequence[StepObserver] = ()) -> None:
        self.index = index
        self.kv = kv
        self.perf = perf
        self.block_size = kv.block_size
        self.max_num_seqs = args.max_num_seqs
        self.max_num_batched_tokens = args.max_num_batched_tokens
        self.long_prefill_token_threshold = args.long_prefill_token_threshold
        self.long_prefill_adaptive = args.long_prefill_token_threshold_adaptive
        self.reserve_full_isl = args.scheduler_reserve_full_isl
        self.watermark_blocks = int(args.watermark * kv.num_blocks)
        self.waiting = create_request_queue(args.scheduling_policy, resolve_priorities)
        self.running: list[Request] = []
        self.observers = tuple(observers)
        self.stepping = False
        self._finishing: list[Request] = []
        # A measured profile's wake-up cost of the first step after the engine sat idle (perf_measured).
        self._wake = getattr(perf, "wake_time", None)
        self._last_end = -float("inf")

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def finishing(self) -> bool:
        """Some request produces its last token in the step under way."""
        return bool(self._finishing)

    def busy(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def add(self, req: Request) -> None:
        self.waiting.add_request(req)

    # ------------------------------------------------------------------ scheduling
    def _preempt(self, victim: Request, scheduled: int, now: float) -> None:
        """Recompute preemption. vLLM hashed the victim's blocks when it scheduled them, so
        tokens scheduled for it earlier in this step count as cached (and are lost)."""
        full = min(victim.num_computed + scheduled, victim.num_tokens) // self.block_size
        self.kv.release(victim.pid, full, victim.held, now, RetentionKind.RELEASE)
        victim.held = 0
        victim.num_computed = 0
        victim.shared = victim.num_tokens
        victim.preemptions += 1
        self.waiting.prepend_request(victim)

    def step(self, now: float, horizon: float) -> float:
        """Schedule and execute one step (or a stable decode window) starting at `now`.

        Returns the end time. Token state is applied at once; the requests that finish are
        retired by `finish_step` at the end time.
        """
        kv, bs = self.kv, self.block_size
        kv.expire(now)
        budget = self.max_num_batched_tokens
        running, waiting = self.running, self.waiting
        sched: list[list] = []          # [req, new_tokens], vLLM's num_scheduled_tokens order
        preempted: list[Request] = []
        threshold = self.long_prefill_token_threshold
        if threshold:
            eligible = len(running) + len(waiting)
            if eligible <= 1:
                threshold = 0  # nobody to starve
            elif self.long_prefill_adaptive:
                threshold = max(threshold, self.max_num_batched_tokens // eligible)
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            new = req.num_tokens - req.num_computed
            if 0 < threshold < new:
                new = threshold
            if new > budget:
                new = budget
            need = -(-(req.num_computed + new) // bs) - req.held
            while need > 0 and not kv.can_allocate(need):
                victim = waiting.preemption_victim(running)
                vi = running.index(victim)
                del running[vi]
                if vi < i:
                    i -= 1
                done = 0
                for j, s in enumerate(sched):
                    if s[0] is victim:
                        done = s[1]
                        budget += done
                        del sched[j]
                        break
                self._preempt(victim, done, now)
                preempted.append(victim)
                if victim is req:
                    break
            else:
                if need > 0:
                    kv.allocate(need)
                    req.held += need
                sched.append([req, new])
                budget -= new
                i += 1
                continue
            break  # the request preempted itself: nothing more runs this step

        transfer = 0
        admitted: list[Request] = []
        if not preempted:
            while budget > 0 and waiting and len(running) < self.max_num_seqs:
                req = waiting.peek_request()
                dev, host = kv.lookup(req.pid, req.shared, req.num_tokens)
                hit_tok = (dev + host) * bs
                new = req.num_tokens - hit_tok
                if 0 < threshold < new:
                    new = threshold
                if new > budget:
                    new = budget
                # Hit blocks in the free queue count against the free blocks (they leave it).
                need = -(-(req.num_tokens if self.reserve_full_isl else hit_tok + new) // bs)
                if need + (self.watermark_blocks if running else 0) > kv.available():
                    break
                waiting.pop_request()
                kv.admit(req.pid, dev, now)
                new_blocks = -(-(hit_tok + new) // bs) - dev
                kv.allocate(new_blocks)
                req.held = dev + new_blocks
                req.num_computed = hit_tok
                req.hit_tokens += dev * bs
                req.host_hit_tokens += host * bs
                transfer += host * bs
                if req.first_sched is None:
                    req.first_sched = now
                running.append(req)
                admitted.append(req)
                sched.append([req, new])
                budget -= new

        # ---- timing
        prefills = []
        n_dec = kv_dec = prefill_tokens = 0
        for req, new in sched:
            if new == 1 and req.generated > 0 and req.num_computed == req.num_tokens - 1:
                n_dec += 1
                kv_dec += req.num_computed + 1
            else:
                prefills.append((new, req.num_computed))
                prefill_tokens += new
        window = 1
        if not prefills and not preempted and n_dec == len(running) and n_dec > 0:
            window = self._decode_window(now, horizon, kv_dec)
        if window > 1:
            dt = self.perf.decode_steps_time(n_dec, kv_dec, window)
        else:
            dt = self.perf.step_time(prefills, n_dec, kv_dec)
        if transfer:
            dt += self.perf.kv_transfer_time(transfer)
        if self._wake is not None and now > self._last_end:
            dt += self._wake(now - self._last_end)
        end = now + dt
        self._last_end = end
        for obs in self.observers:
            obs.on_step(self, now, dt, window, sched, admitted, preempted, prefill_tokens)

        # ---- apply tokens (vLLM advances num_computed_tokens when it schedules)
        finished = self._finishing
        if window > 1:
            extra = 0
            for req in running:
                extra += -(-(req.num_computed + window) // bs) - req.held
            if extra > 0:
                kv.allocate(extra)
            for req in running:
                req.held = -(-(req.num_computed + window) // bs)
                req.num_computed += window
                req.num_tokens += window
                req.generated += window
                if req.generated >= req.output:
                    finished.append(req)
        else:
            for req, new in sched:
                req.num_computed += new
                if req.num_computed == req.num_tokens:  # prefill complete: the step samples a token
                    req.generated += 1
                    req.num_tokens += 1
                    if req.generated == 1:
                        req.first_token = end
                    if req.generated >= req.output:
                        finished.append(req)
        self.stepping = True
        return end

    def finish_step(self, now: float) -> list[Request]:
        """The step ended at `now`: retire the requests that produced their last token."""
        self.stepping = False
        finished = self._finishing
        if not finished:
            return finished
        self._finishing = []
        gone = set(map(id, finished))
        self.running = [r for r in self.running if id(r) not in gone]
        for req in finished:
            req.finished = now
            for obs in self.observers:
                obs.on_finish(self, req, now)
        return finished

    def _decode_window(self, now: float, horizon: float, kv_dec: int) -> int:
        """Largest number of decode-only steps that no event can interrupt."""
        running = self.running
        n = len(running)
        k = min(r.output - r.generated for r in running)
        if k <= 1:
            return 1
        # Blocks: steps 2..k must allocate without preemption. Nothing frees blocks in the
        # window, so a waiting request that did not fit now does not fit later either.
        avail = self.kv.available()
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
