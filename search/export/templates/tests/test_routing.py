"""The routing proxy picks an instance with the policy and forwards to it."""
from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from {{PACKAGE}}.router import Router, make_handler, parse_metrics


def backend(name: str, running: int):
    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            text = (f'vllm:num_requests_running{{model_name="m"}} {running}\n'
                    'vllm:num_requests_waiting{model_name="m"} 0\nvllm:kv_cache_usage_perc{model_name="m"} 0.1\n')
            self._send(text.encode())

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self._send(json.dumps({"served_by": name}).encode())

        def _send(self, data):
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_metrics_parse():
    m = parse_metrics('vllm:num_requests_running{a="b"} 3.0\nvllm:kv_cache_usage_perc{a="b"} 0.25\n')
    assert m == {"num_requests_running": 3.0, "kv_cache_usage_perc": 0.25}


def test_proxy_forwards_to_the_selected_instance():
    b = [backend("b0", 9), backend("b1", 0)]
    router = Router([f"http://127.0.0.1:{s.server_address[1]}" for s in b])
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(router))
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{proxy.server_address[1]}/v1/chat/completions",
                                     data=json.dumps({"session_id": "p1", "messages": []}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            served = json.loads(r.read())["served_by"]
        assert served == f"b{router.tracker.programs['p1'].last_instance}"
    finally:
        proxy.shutdown()
        for s in b:
            s.shutdown()
