"""Fake OpenAI-compatible and Anthropic HTTP servers on 127.0.0.1 for search tests.

Each answers with SEARCH/REPLACE edits built from the *current program in the prompt*, so
the edit always applies; `script` picks the kind of candidate per request, in order
(the last entry repeats):
  good     - adds a context-length term (a real improvement on tests/fakes/fakesim.py)
  tweak    - scales the seed's service constant
  outside  - edits the import line outside the EVOLVE block
  leak     - reads a field that is not observable (pcb.program)
  hang     - loops forever inside priority()
  nodiff   - prose without any SEARCH/REPLACE block
"""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANCHOR = "    def priority(self, pcb, now):"


def _edit(kind: str, program: str) -> str:
    def block(search: str, replace: str) -> str:
        return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE"
    if kind == "nodiff":
        return "I would not change anything."
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
    m = re.search(r"# Current Program\n```\w*\n(.*?)\n```", text, re.DOTALL)
    return m.group(1) if m else ""


class _Server:
    def __init__(self, script: list[str], kind: str) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, obj: Any, status: int = 200) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send({"object": "list", "data": [{"id": "fake-model", "object": "model",
                                                            "type": "model", "display_name": "fake",
                                                            "created_at": "2025-01-01T00:00:00Z"}],
                                "has_more": False, "first_id": "fake-model", "last_id": "fake-model"})
                else:
                    self._send({"error": "not found"}, 404)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with outer.lock:
                    outer.requests.append(body)
                    k = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                text = _edit(k, _current_program(body["messages"][-1]["content"]
                                                 if isinstance(body["messages"][-1]["content"], str)
                                                 else body["messages"][-1]["content"][0]["text"]))
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
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "_Server":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def openai_server(script: list[str]) -> _Server:
    """Base URL: f"http://127.0.0.1:{port}/v1"."""
    return _Server(script, "openai")


def anthropic_server(script: list[str]) -> _Server:
    """Base URL: f"http://127.0.0.1:{port}" (the SDK appends /v1/messages)."""
    return _Server(script, "anthropic")
