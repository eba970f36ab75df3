"""Send an agent's calls to an OpenAI-compatible vLLM server with the policy's priority.

Each request carries, in the JSON body, `priority` (vLLM runs smaller first, but only when
started with `--scheduling-policy priority`: otherwise it accepts and ignores it),
`session_id` = the program id (for routers and the retention scheduler) and
`vllm_xargs.session_id` (reaches the engine as `request.sampling_params.extra_args`), plus
the `X-Session-ID` header for HTTP routers.

With the `openai` SDK (the policy runs here, in your process):

    import PACKAGE
    from PACKAGE.client import check_priority_mode, end_call, request_options
    from PACKAGE.tracker import ProgramTracker

    tracker = ProgramTracker(PACKAGE.policy())          # one per process; thread-safe
    check_priority_mode("http://127.0.0.1:8000")        # warns if the server says it is not in priority mode
    c = tracker.begin_call("program-17")                # before each call of the program
    resp = oai.chat.completions.create(model=..., messages=..., **request_options(c, extra_body={"top_k": 20}))
    end_call(tracker, c, resp)                          # tokens, tool asked for, server-measured service time

`TrackedClient` does all of this with the standard library only.
"""
from __future__ import annotations

import json
import urllib.request
import warnings
from dataclasses import dataclass
from typing import Any

from .tracker import Call, ProgramTracker

PRIORITY_FLAG = "--scheduling-policy priority"


def request_options(c: Call, extra_body: dict[str, Any] | None = None,
                    extra_headers: dict[str, str] | None = None) -> dict[str, Any]:
    """`extra_body` / `extra_headers` kwargs for the openai SDK's `create(...)`, merged with yours.

    Your keys are kept; `priority` and `session_id` are the call's (the policy decides them),
    and `vllm_xargs` gets `session_id` added to your own entries.
    """
    body: dict[str, Any] = dict(extra_body or {})
    xargs = dict(body.get("vllm_xargs") or {})
    xargs["session_id"] = c.program_id
    body.update({"session_id": c.program_id, "vllm_xargs": xargs})
    if c.priority is not None:
        body["priority"] = c.priority
    headers = dict(extra_headers or {})
    headers["X-Session-ID"] = c.program_id
    return {"extra_body": body, "extra_headers": headers}


@dataclass(frozen=True)
class Observed:
    """What a response tells the tracker about its call."""
    prompt_tokens: int
    output_tokens: int
    tool_name: str | None
    service_s: float | None   # server-measured first scheduling -> last token; None if not reported
    queued_s: float | None    # server-measured wait before first scheduling; None if not reported


def _as_dict(response: Any) -> dict[str, Any]:
    if isinstance(response, dict):
        return response
    dump = getattr(response, "model_dump", None)   # openai SDK objects (pydantic, extra fields kept)
    if callable(dump):
        return dump()
    raise TypeError(f"expected a chat completion (dict or openai object), got {type(response).__name__}")


def observe(response: Any) -> Observed:
    """Tokens, the tool asked for and vLLM's per-request timing (if the server reports it:
    `--enable-per-request-metrics` adds `metrics` to each non-streamed response)."""
    out = _as_dict(response)
    usage = out.get("usage") or {}
    tool = None
    for choice in out.get("choices") or []:
        for tc in (choice.get("message") or {}).get("tool_calls") or []:
            tool = (tc.get("function") or {}).get("name") or tool
    m = out.get("metrics") or {}
    ttft, gen, queue = m.get("time_to_first_token_ms"), m.get("generation_time_ms"), m.get("queue_time_ms")
    # vLLM: ttft = first token - first scheduling, generation = last token - first token
    service = (ttft + (gen or 0.0)) / 1000.0 if isinstance(ttft, (int, float)) else None
    queued = queue / 1000.0 if isinstance(queue, (int, float)) else None
    return Observed(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), tool,
                    service, queued)


def end_call(tracker: ProgramTracker, c: Call, response: Any, now: float | None = None) -> Observed:
    """End call `c` from its response. Without server timing, warns (once per tracker): the
    program's attained service then counts queueing too, unlike the simulator's."""
    o = observe(response)
    if o.service_s is None and o.queued_s is None and tracker.timing["from_request_start"] == 0:
        warnings.warn("the server reports no per-request timing (start vLLM with --enable-per-request-metrics): "
                      "attained service is measured from the request start, so it includes queueing",
                      RuntimeWarning, stacklevel=2)
    tracker.end_call(c, o.prompt_tokens, o.output_tokens, tool_name=o.tool_name, now=now, service_s=o.service_s,
                     queued_s=o.queued_s if o.service_s is None else None)
    return o


def _root(base_url: str) -> str:
    url = base_url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def server_scheduling_policy(base_url: str, timeout_s: float = 5.0) -> str | None:
    """The server's scheduling policy ("priority", "fcfs"), or None when it does not say.

    vLLM 0.32 exposes its configuration only at /server_info, a development endpoint that
    exists when the server runs with VLLM_SERVER_DEV_MODE=1; nothing else (metrics, models,
    responses) tells a client whether priorities are honoured.
    """
    try:
        with urllib.request.urlopen(f"{_root(base_url)}/server_info?config_format=json",  # noqa: S310 - user's URL
                                    timeout=timeout_s) as r:
            info = json.loads(r.read())
    except (OSError, ValueError):
        return None
    policy = (((info.get("vllm_config") or {}) if isinstance(info, dict) else {}).get("scheduler_config") or {}) \
        .get("policy")
    return str(policy) if policy else None


def check_priority_mode(base_url: str) -> bool | None:
    """True / False when the server says whether it schedules by priority (False also
    warns: vLLM then accepts every priority and ignores it); None when it does not say."""
    policy = server_scheduling_policy(base_url)
    if policy is None:
        return None
    if policy != "priority":
        warnings.warn(f"{_root(base_url)} schedules '{policy}', not by priority: the policy's priorities are "
                      f"accepted and ignored. Start vLLM with {PRIORITY_FLAG}.", RuntimeWarning, stacklevel=2)
        return False
    return True


class TrackedClient:
    """Minimal chat client (stdlib only) that tracks programs and sets priorities."""

    def __init__(self, base_url: str, model: str, tracker: ProgramTracker | None = None,
                 api_key: str = "EMPTY", timeout_s: float = 600.0) -> None:
        self.base_url = _root(base_url)
        self.model = model
        self.tracker = tracker or ProgramTracker(_scheduling_policy())
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.priority_mode: bool | None = None   # what the server said (None: it does not say)
        self._checked = False

    def chat(self, program_id: str, messages: list[dict[str, Any]], context_tokens: int | None = None,
             extra_body: dict[str, Any] | None = None, extra_headers: dict[str, str] | None = None,
             **params: Any) -> dict[str, Any]:
        """One call of program `program_id`; returns the server's JSON response (not streamed)."""
        if params.get("stream"):
            raise ValueError("TrackedClient.chat does not stream: use the openai SDK with request_options/end_call")
        if not self._checked and self.tracker.scheduling is not None:
            self._checked = True
            self.priority_mode = check_priority_mode(self.base_url)
        c = self.tracker.begin_call(program_id, context_tokens)
        opts = request_options(c, extra_body, extra_headers)
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
        end_call(self.tracker, c, out)
        return out


def _scheduling_policy() -> Any:
    from . import METADATA, policy
    return policy() if METADATA["axis"] == "scheduling" else None
