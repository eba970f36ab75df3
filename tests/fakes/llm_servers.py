"""Fake OpenAI-compatible and Anthropic HTTP servers on 127.0.0.1 for search tests.

Each answers with edits built from the *current program in the prompt*, so the edit
always applies; `script` picks the kind of answer per request, in order (the last entry
repeats):
  good     - adds a context-length term (a real improvement on tests/fakes/fakesim.py)
  tweak    - scales the seed's service constant
  outside  - edits the import line outside the EVOLVE block
  leak     - reads a field that is not observable (pcb.program)
  hang     - loops forever inside priority()
  nodiff   - prose without any SEARCH/REPLACE block
  nomatch  - a SEARCH block that is not in the program
  rewrite  - the whole program in one ```python block, with a changed priority
  fail500  - HTTP 500
  silent   - never answers (holds the connection for `silent_s` seconds)
`models` is what GET /v1/models lists (None: the endpoint answers 404).
"""
from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Callable
from typing import Any

ANCHOR = "    def priority(self, pcb, now):"


def _edit(kind: str, program: str) -> str:
    def block(search: str, replace: str) -> str:
        return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE"
    if kind == "nodiff":
        return "I would not change anything."
    if kind == "nomatch":
        return "Edit.\n" + block("    return 42  # not in the program", "    return 41")
    if kind == "rewrite":
        new = re.sub(r"(?m)^        return int\(round\((.+)\)\)$",
                     lambda m: f"        return int(round({m.group(1)} + pcb.context_tokens * 7.0))", program, count=1)
        return f"Here is the whole program.\n```python\n{new}\n```\n"
    if kind == "outside":
        line = next(l for l in program.split("\n") if l.startswith("import math"))
        return "Use os.\n" + block(line, "import os")
    if kind == "tweak":
        m = re.search(r"^.*\* 1000\.0.*$", program, re.MULTILINE)
        if m:
            return "Scale.\n" + block(m.group(0), m.group(0).replace("1000.0", "1500.0"))
    body = {"good": "        bonus = pcb.context_tokens * 10.0",
            "leak": "        hidden = pcb.program",
            "hang": "        while True:\n            pass"}.get(kind, "        bonus = 0.0")
    ret = re.search(r"^        return int\(round\((.+)\)\)$", program, re.MULTILINE)
    if kind == "good" and ret and "bonus" not in program:
        return ("Favour short contexts.\n" + block(ANCHOR, ANCHOR + "\n" + body) + "\n"
                + block(ret.group(0), f"        return int(round({ret.group(1)} + bonus))"))
    return f"Edit ({kind}).\n" + block(ANCHOR, ANCHOR + "\n" + body)


def _current_program(text: str) -> str:
    m = re.search(r"# Current program\n```\w*\n(.*?)\n```", text, re.DOTALL)
    return m.group(1) if m else ""


class _Server:
    def __init__(self, script: list[str], kind: str, models: list[str] | None = ("fake-model", "claude-test"),
                 silent_s: float = 30.0, respond: Callable[[str], str] | None = None) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.gets: list[str] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, obj: Any, status: int = 200) -> None:
                data = json.dumps(obj).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0].rstrip("/")
                with outer.lock:
                    outer.gets.append(path)
                if models is None or not path.startswith("/v1/models"):
                    self._send({"error": {"message": "not found"}}, 404)
                    return
                entry = lambda m: {"id": m, "object": "model", "type": "model", "display_name": m,  # noqa: E731
                                   "created_at": "2025-01-01T00:00:00Z", "owned_by": "test", "created": 0}
                if path == "/v1/models":
                    self._send({"object": "list", "data": [entry(m) for m in models], "has_more": False,
                                "first_id": models[0] if models else None, "last_id": models[-1] if models else None})
                elif path.rsplit("/", 1)[-1] in models:
                    self._send(entry(path.rsplit("/", 1)[-1]))
                else:
                    self._send({"type": "error", "error": {"type": "not_found_error", "message": "no such model"}},
                               404)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path.split("?")[0] not in ("/v1/chat/completions", "/v1/messages"):
                    self._send({"error": {"message": f"no route {self.path}"}}, 404)
                    return
                with outer.lock:
                    outer.requests.append(body)
                    k = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                if k == "fail500":
                    self._send({"error": {"message": "internal failure for testing"}}, 500)
                    return
                if k == "silent":
                    outer.stopping.wait(silent_s)
                    return
                last = body["messages"][-1]["content"]
                text = respond(k) if respond is not None else \
                    _edit(k, _current_program(last if isinstance(last, str) else last[0]["text"]))
                if kind == "openai" and self.path.endswith("/chat/completions"):
                    self._send({"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                                "model": body.get("model"),
                                "choices": [{"index": 0, "finish_reason": "stop",
                                             "message": {"role": "assistant", "content": text}}],
                                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}})
                elif kind == "anthropic" and self.path.endswith("/messages"):
                    self._send({"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model"),
                                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                                "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 10}})
                else:
                    self._send({"error": {"message": "unknown endpoint"}}, 404)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def posts(self) -> int:
        with self.lock:
            return len(self.requests)

    def __enter__(self) -> "_Server":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def openai_server(script: list[str], models: list[str] | None = ("fake-model",), silent_s: float = 30.0,
                  respond: Callable[[str], str] | None = None) -> _Server:
    """Base URL: f"http://127.0.0.1:{port}/v1". `respond(step)` replaces the scripted edits of the
    current program with a text of its own (a hostile model's answers)."""
    return _Server(script, "openai", list(models) if models is not None else None, silent_s, respond)


def anthropic_server(script: list[str], models: list[str] | None = ("claude-test",), silent_s: float = 30.0) -> _Server:
    """Base URL: f"http://127.0.0.1:{port}" (the SDK appends /v1/messages)."""
    return _Server(script, "anthropic", list(models) if models is not None else None, silent_s)


if __name__ == "__main__":   # a server for subprocess tests: prints its port, serves until killed
    import sys
    srv = openai_server(sys.argv[1].split(","), silent_s=3600.0)
    srv.thread.start()
    print(srv.port, flush=True)
    while True:
        time.sleep(3600)
