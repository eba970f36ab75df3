"""Token-id prompts with the workload's shared-prefix structure.

The simulator assumes call k+1's prompt starts with call k's prompt and output (or the
`shared_prefix_tokens` the workload records), and that programs share nothing with each
other. The replay builds prompts with exactly that structure so that the server's prefix
cache sees what the simulator assumes:

    prompt_0     = fresh ids, prompt_tokens_0 long
    prompt_{k+1} = (prompt_k + the ids the server generated for call k)[:shared] + fresh ids

Ids are drawn from a generator per program inside [lo, hi) (away from the special tokens
at the start of most vocabularies), seeded by the workload seed, the program and a salt:
the fresh ids of one program never repeat another program's prefix, and a second replay
with another salt has the same structure but none of the first one's prompts, which a
server's prefix cache would otherwise still hold.
"""
from __future__ import annotations

import zlib

import numpy as np

from simcore.workload import Program


class PromptBuilder:
    def __init__(self, program: Program, index: int, seed: int, token_range: tuple[int, int] = (100, 1000),
                 salt: int = 0) -> None:
        lo, hi = token_range
        if not 0 <= lo < hi:
            raise ValueError(f"token range {lo}:{hi} is empty")
        self.program = program
        self.lo, self.hi = lo, hi
        tag = zlib.crc32(program.program_id.encode("utf-8"))
        self.rng = np.random.default_rng([seed, index, tag, salt, 0x11FE])
        self.stream: list[int] = []     # the previous call's prompt + what the server generated

    def _fresh(self, n: int) -> list[int]:
        return self.rng.integers(self.lo, self.hi, size=n).tolist() if n > 0 else []

    def prompt(self, k: int) -> list[int]:
        """Token ids of call k's prompt (call k-1 must have been recorded with `generated`)."""
        n = self.program.calls[k].prompt_tokens
        if k == 0:
            return self._fresh(n)
        shared = min(self.program.shared_prefix(k), len(self.stream), n)
        return self.stream[:shared] + self._fresh(n - shared)

    def generated(self, prompt: list[int], output_ids: list[int]) -> None:
        """Record what the server generated for the call whose prompt was `prompt`."""
        self.stream = prompt + list(output_ids)
