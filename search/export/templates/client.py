"""Send an agent's calls to an OpenAI-compatible vLLM server with the policy's priority.

Each request carries, in the JSON body, `priority` (vLLM runs smaller first when started
with `--scheduling-policy priority`), `session_id` = the program id (for routers and the
retention scheduler) and `vllm_xargs.session_id` (reaches the engine's scheduler as
`request.sampling_params.extra_args`), plus the `X-Session-ID` header for HTTP routers.

With the `openai` SDK, use `request_options(call)` as `**kwargs` of `create(...)`.
"""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from .runtime import load_policy
from .tracker import Call, ProgramTracker

POLICY_FILE = Path(__file__).with_name("policy.py")


def request_options(c: Call) -> dict[str, Any]:
    """`extra_body` / `extra_headers` for the openai SDK."""
    body: dict[str, Any] = {"session_id": c.program_id, "vllm_xargs": {"session_id": c.program_id}}
    if c.priority is not None:
        body["priority"] = c.priority
    return {"extra_body": body, "extra_headers": {"X-Session-ID": c.program_id}}


class TrackedClient:
    """Minimal chat client (stdlib only) that tracks programs and sets priorities."""

    def __init__(self, base_url: str, model: str, tracker: ProgramTracker | None = None,
                 api_key: str = "EMPTY", timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tracker = tracker or ProgramTracker(_scheduling_policy())
        self.api_key = api_key
        self.timeout_s = timeout_s

    def chat(self, program_id: str, messages: list[dict[str, Any]], context_tokens: int | None = None,
             **params: Any) -> dict[str, Any]:
        """One call of program `program_id`; returns the server's JSON response."""
        c = self.tracker.begin_call(program_id, context_tokens)
        opts = request_options(c)
        body = {"model": self.model, "messages": messages, **params, **opts["extra_body"]}
        req = urllib.request.Request(f"{self.base_url}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.api_key}",
                                              **opts["extra_headers"]})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 - user's URL
                out = json.loads(resp.read())
        except BaseException:
            # a failed call still ends: the program may retry, and its state must stay consistent
            self.tracker.end_call(c, context_tokens or 0, 0)
            raise
        usage = out.get("usage") or {}
        tool = None
        for choice in out.get("choices") or []:
            for tc in (choice.get("message") or {}).get("tool_calls") or []:
                tool = (tc.get("function") or {}).get("name") or tool
        self.tracker.end_call(c, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                              tool_name=tool)
        return out


def _scheduling_policy() -> Any:
    from . import METADATA
    return load_policy(POLICY_FILE, "scheduling") if METADATA["axis"] == "scheduling" else None
