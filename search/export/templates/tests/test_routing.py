"""The routing proxy picks an instance with the policy, forwards to it and reads the answer."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from {{PACKAGE}}.router import Router, make_handler, parse_metrics

REPLY = {"choices": [{"message": {"role": "assistant", "content": "ok", "tool_calls": [
    {"type": "function", "function": {"name": "grep", "arguments": "{}"}}]}}],
         "usage": {"prompt_tokens": 120, "completion_tokens": 7},
         "metrics": {"time_to_first_token_ms": 100.0, "generation_time_ms": 150.0, "queue_time_ms": 9.0}}
SSE = [{"choices": [{"delta": {"role": "assistant"}}]},
       {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "sed", "arguments": ""}}]}}]},
       {"choices": [{"delta": {"content": "x"}, "finish_reason": "tool_calls"}]},
       {"choices": [], "usage": {"prompt_tokens": 90, "completion_tokens": 3},
        "metrics": {"time_to_first_token_ms": 20.0, "generation_time_ms": 30.0}}]


def backend(name: str, running: int):
    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            text = (f'vllm:num_requests_running{{model_name="m"}} {running}\n'
                    'vllm:num_requests_waiting{model_name="m"} 0\nvllm:kv_cache_usage_perc{model_name="m"} 0.1\n')
            self._send(200, text.encode(), "text/plain")

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body.get("bad"):
                self._send(400, json.dumps({"error": {"message": "too long"}}).encode(), "application/json")
            elif body.get("stream"):
                data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in SSE) + b"data: [DONE]\n\n"
                self._send(200, data, "text/event-stream")
            else:
                self._send(200, json.dumps({**REPLY, "served_by": name}).encode(), "application/json")

        def _send(self, code, data, ctype):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def proxy():
    b = [backend("b0", 9), backend("b1", 0)]
    router = Router([f"http://127.0.0.1:{s.server_address[1]}" for s in b])
    srv = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(router))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield router, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    for s in b:
        s.shutdown()


def post(url, body):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read()


def test_metrics_parse():
    m = parse_metrics('vllm:num_requests_running{a="b"} 3.0\nvllm:kv_cache_usage_perc{a="b"} 0.25\n')
    assert m == {"num_requests_running": 3.0, "kv_cache_usage_perc": 0.25}


def test_proxy_forwards_to_the_selected_instance_and_reads_the_answer(proxy):
    router, url = proxy
    served = json.loads(post(url, {"session_id": "p1", "messages": []}))["served_by"]
    assert served == f"b{router.tracker.programs['p1'].last_instance}"
    v = router.tracker.view("p1", router.tracker.clock())
    assert v.completed_prompt_tokens == (120,) and v.completed_output_tokens == (7,) and v.tool_name == "grep"
    assert v.attained_service_s == pytest.approx(0.25)          # vLLM's timing, not the proxy's clock


def test_streamed_answers_are_relayed_and_read(proxy):
    router, url = proxy
    raw = post(url, {"session_id": "p2", "messages": [], "stream": True})
    assert raw.count(b"data: ") == len(SSE) + 1 and raw.endswith(b"data: [DONE]\n\n")
    v = router.tracker.view("p2", router.tracker.clock())
    assert v.completed_prompt_tokens == (90,) and v.tool_name == "sed"
    assert v.attained_service_s == pytest.approx(0.05)


def test_backend_errors_are_relayed_and_the_call_still_ends(proxy):
    router, url = proxy
    with pytest.raises(urllib.error.HTTPError) as e:
        post(url, {"session_id": "p3", "messages": [], "bad": True})
    assert e.value.code == 400 and json.loads(e.value.read())["error"]["message"] == "too long"
    assert router.tracker.programs["p3"].turns_completed == 1 and router.tracker.programs["p3"].release_s is None
