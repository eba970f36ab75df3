"""Routing proxy: sends each call to the vLLM instance the exported routing policy selects.

    python -m PACKAGE.router --listen 127.0.0.1:8000 --backend http://gpu0:8001 --backend http://gpu1:8001

Instance signals come from each backend's Prometheus `/metrics` (running and waiting
requests, KV-cache usage; refreshed at most every `--metrics-interval` seconds); the
program is the request's `session_id` / `X-Session-ID`, and `holds_program_kv` means the
instance served that program's previous call. Responses (streamed or not) are relayed
as they arrive, and read on the way for the program's state (tokens, the tool asked for,
vLLM's per-request timing); a backend's error answer is relayed as is. stdlib only.
"""
from __future__ import annotations

import argparse
import json
import re
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import policy
from .client import end_call
from .runtime import InstanceView, Signals, call, parse_instance
from .tracker import ProgramTracker

_METRIC = re.compile(r"^vllm:(num_requests_running|num_requests_waiting|kv_cache_usage_perc)\{[^}]*\}\s+(\S+)",
                     re.M)


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in _METRIC.findall(text):
        out[name] = out.get(name, 0.0) + float(value)
    return out


class Router:
    def __init__(self, backends: list[str], metrics_interval_s: float = 0.5) -> None:
        self.backends = [b.rstrip("/") for b in backends]
        self.policy = policy()
        self.tracker = ProgramTracker(None)
        self.interval = metrics_interval_s
        self._metrics: list[dict[str, float]] = [{} for _ in backends]
        self._fetched = 0.0
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        if time.monotonic() - self._fetched < self.interval:
            return
        for i, b in enumerate(self.backends):
            try:
                with urllib.request.urlopen(f"{b}/metrics", timeout=2) as r:  # noqa: S310
                    self._metrics[i] = parse_metrics(r.read().decode())
            except OSError:
                self._metrics[i] = {"num_requests_waiting": 1e9}  # unreachable: looks saturated
        self._fetched = time.monotonic()

    def select(self, pid: str, now: float) -> tuple[int, Any]:
        """The instance for this program's next call, and the tracked call."""
        with self._lock:
            self._refresh()
            last = self.tracker.programs[pid].last_instance if pid in self.tracker.programs else None
            views = tuple(InstanceView(i, int(m.get("num_requests_running", 0)), int(m.get("num_requests_waiting", 0)),
                                       float(m.get("kv_cache_usage_perc", 0.0)), 0, last == i)
                          for i, m in enumerate(self._metrics))
        try:
            c = self.tracker.begin_call(pid, now=now)
        except ValueError:  # the program already has a call in flight: route it, don't track it
            c = None
        self.policy.bind(Signals(now=now, kv_utilization=None, instances=views))
        idx = parse_instance(call(self.policy.select, self.tracker.view(pid, now), views, now), len(views))
        self.tracker.programs[pid].last_instance = idx
        return idx, c


class Watch:
    """What a relayed answer says about its call: the JSON body of a plain response, or the
    `data:` events of a streamed one (usage and vLLM's `metrics` come in the last events,
    tool names in the deltas)."""

    LIMIT = 16 << 20   # a bigger plain body is relayed but not read

    def __init__(self, content_type: str) -> None:
        self.sse = "event-stream" in content_type
        self.json = "json" in content_type
        self.buf = b""
        self.seen: dict[str, Any] = {}
        self.tool: str | None = None

    def feed(self, chunk: bytes) -> None:
        if self.json and len(self.buf) <= self.LIMIT:
            self.buf += chunk
        elif self.sse:
            self.buf += chunk
            *lines, self.buf = self.buf.split(b"\n")
            for line in lines:
                if line.startswith(b"data: {"):
                    self._event(line[6:])

    def _event(self, data: bytes) -> None:
        try:
            d = json.loads(data)
        except ValueError:
            return
        for key in ("usage", "metrics"):
            if d.get(key):
                self.seen[key] = d[key]
        for choice in d.get("choices") or []:
            for tc in (choice.get("delta") or {}).get("tool_calls") or []:
                self.tool = (tc.get("function") or {}).get("name") or self.tool

    def answer(self) -> dict[str, Any] | None:
        if self.json and len(self.buf) <= self.LIMIT:
            try:
                d = json.loads(self.buf)
            except ValueError:
                return None
            return d if isinstance(d, dict) else None
        if self.sse and self.seen:
            calls = [{"function": {"name": self.tool}}] if self.tool else []
            return {**self.seen, "choices": [{"message": {"tool_calls": calls}}]}
        return None


def make_handler(router: Router) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server API
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                pid = json.loads(body or b"{}").get("session_id") or self.headers.get("X-Session-ID")
            except json.JSONDecodeError:
                pid = self.headers.get("X-Session-ID")
            if pid:
                idx, c = router.select(str(pid), router.tracker.clock())
            else:
                idx, c = 0, None
            req = urllib.request.Request(router.backends[idx] + self.path, data=body or None, method=self.command,
                                         headers={k: v for k, v in self.headers.items()
                                                  if k.lower() not in ("host", "content-length")})
            answer = None
            try:
                try:
                    resp = urllib.request.urlopen(req, timeout=3600)  # noqa: S310 - the configured backend
                except urllib.error.HTTPError as e:   # the backend's own error answer: relay it as is
                    resp = e
                except OSError as e:
                    self.send_error(502, f"backend {router.backends[idx]} unreachable ({type(e).__name__})")
                    return
                with resp:
                    watch = Watch(resp.headers.get("Content-Type") or "")
                    self.send_response(resp.status)
                    for k, v in resp.headers.items():
                        if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(k, v)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    while chunk := resp.read1(65536):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        watch.feed(chunk)
                    answer = watch.answer() if resp.status == 200 else None
            finally:
                if c is not None:
                    if answer is not None:
                        end_call(router.tracker, c, answer)   # tokens, tool, server-measured service
                    else:
                        router.tracker.end_call(c, 0, 0)

        do_GET = do_POST  # /v1/models etc. go to instance 0 (no session)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="127.0.0.1:8000")
    ap.add_argument("--backend", action="append", required=True, help="vLLM base URL (repeat)")
    ap.add_argument("--metrics-interval", type=float, default=0.5)
    a = ap.parse_args(argv)
    host, port = a.listen.rsplit(":", 1)
    ThreadingHTTPServer((host, int(port)), make_handler(Router(a.backend, a.metrics_interval))).serve_forever()


if __name__ == "__main__":
    main()
