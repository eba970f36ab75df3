"""One LLM call in flight on an instance (vLLM's `Request`, reduced to what timing needs)."""
from __future__ import annotations


class Request:
    __slots__ = ("rid", "pid", "turn", "prompt", "output", "shared", "priority", "arrival",
                 "num_tokens", "num_computed", "generated", "held", "hit_tokens", "host_hit_tokens",
                 "first_sched", "first_token", "finished", "preemptions", "seq", "instance")

    def __init__(self, rid: int, pid: int, turn: int, prompt: int, output: int, shared: int,
                 priority: int | None, arrival: float, instance: int) -> None:
        self.rid = rid
        self.pid = pid
        self.turn = turn
        self.prompt = prompt
        self.output = output            # true output length: engine-side knowledge only
        self.shared = shared            # prefix tokens shared with the program's last stream
        self.priority = priority      # None until a deferred priority is collected
        self.arrival = arrival          # release time r_{p,k}
        self.num_tokens = prompt        # prompt + generated so far
        self.num_computed = 0
        self.generated = 0
        self.held = 0                   # KV blocks held
        self.hit_tokens = 0
        self.host_hit_tokens = 0
        self.first_sched: float | None = None
        self.first_token: float | None = None
        self.finished: float | None = None
        self.preemptions = 0
        self.seq = rid
        self.instance = instance

    @property
    def is_decoding(self) -> bool:
        return self.num_computed == self.num_tokens - 1 and self.generated > 0
