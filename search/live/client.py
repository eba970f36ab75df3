"""Async client for an OpenAI-compatible server (vLLM's `/v1/completions`), on httpx.

One `ServerClient` holds one connection pool for any number of concurrent streams (no
threads). It sends prompts as token ids with EOS ignored, streams the answer with
vLLM's `return_token_ids` (so the next prompt can extend what was really generated) and
`stream_options.include_usage` (prompt/cached tokens and vLLM's per-request metrics), and
times every chunk on the event loop's monotonic clock. `check()` probes the server once
and turns each way it can be unusable into a one-line `LiveError`.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import resource
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import EllipsisType
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from simcore.errors import UserError


class LiveError(UserError, RuntimeError):
    """A server or input the live commands cannot use; the message is one line."""


@dataclass
class StreamResult:
    """One streamed completion, timed on the client's clock (seconds)."""
    sent_s: float
    first_token_s: float
    last_token_s: float
    end_s: float                       # the stream closed ([DONE]): the response is complete
    output_ids: list[int]
    chunk_times: list[float]           # arrival of each chunk that carried tokens
    chunk_tokens: list[int]
    prompt_tokens: int | None = None   # as the server counted them (usage)
    cached_tokens: int | None = None   # prefix-cache hit (vLLM --enable-prompt-tokens-details)
    queue_s: float | None = None       # vLLM --enable-per-request-metrics: queued -> scheduled
    server_ttft_s: float | None = None  # same: scheduled -> first token
    server_decode_s: float | None = None  # same: first -> last token (engine clock)
    finish_reason: str | None = None


@dataclass
class ServerInfo:
    url: str
    model: str
    max_model_len: int | None
    served: list[str]
    usage: bool = False                # streams end with a usage chunk
    cached_tokens: bool = False        # usage reports prompt_tokens_details.cached_tokens
    queue_metrics: bool = False        # usage carries per-request metrics (queue_time_ms)
    metrics: bool = False              # Prometheus /metrics answers
    block_size: int | None = None      # from vllm:cache_config_info
    kv_pool_tokens: int | None = None
    version: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def raise_fd_limit() -> int:
    """Thousands of concurrent streams need as many sockets: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft


def _error_message(resp_text: str) -> str:
    try:
        obj = json.loads(resp_text)
    except (json.JSONDecodeError, ValueError):
        return " ".join(resp_text.split())[:300]
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        msg = err.get("message") or err.get("detail") or json.dumps(err)
    else:
        msg = str(err)
    return " ".join(str(msg).split())[:300]


async def _sse_lines(r: httpx.Response):  # noqa: ANN202 - async generator of str
    """Server-Sent Event lines, split on newlines only. (httpx's aiter_lines also splits on
    U+0085, U+2028 and other breaks that JSON leaves unescaped inside generated text.)"""
    buf = b""
    async for chunk in r.aiter_bytes():
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if buf:
        yield buf.rstrip(b"\r").decode("utf-8", "replace")


def _strip_prompt_ids(payload: str) -> str:
    """Drop the echoed prompt ids (vLLM sends them in the first chunk with return_token_ids)
    before parsing: a long agent context would cost the client milliseconds of JSON per call."""
    i = payload.find('"prompt_token_ids":[')
    if i < 0:
        return payload
    j = payload.find("]", i)
    return payload[:i] + '"prompt_token_ids":null' + payload[j + 1:] if j > 0 else payload


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text format -> {sample name: [(labels, value), ...]}."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except ValueError as e:
        raise LiveError(f"/metrics is not in Prometheus text format ({e})") from None
    return out


def metric_value(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str, model: str | None = None,
                 **where: str) -> float | None:
    """Sum of a sample over its label sets (engines), restricted to one model where labelled
    and to the label values in `where`."""
    rows = metrics.get(name)
    if not rows:
        return None
    vals = [v for lab, v in rows if (model is None or lab.get("model_name", model) == model)
            and all(lab.get(k) == w for k, w in where.items())]
    return float(sum(vals)) if vals else None


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def gauge_values(text: str, names: Sequence[str], model: str | None = None) -> dict[str, float | None]:
    """A few samples of /metrics, summed over their label sets (engines) and restricted to one
    model where labelled, found by a line scan: the replay polls the server's gauges several
    times a second, and a full Prometheus parse of vLLM's ~60 kB page costs the client's event
    loop milliseconds each time (time it takes from the calls it is timing)."""
    out: dict[str, float | None] = {n: None for n in names}
    want = tuple(names)
    for line in text.splitlines():
        if not line.startswith(want):
            continue
        m = _SAMPLE.match(line)
        if m is None or m.group(1) not in out:
            continue
        labels = m.group(2) or ""
        if model is not None and "model_name=" in labels and f'model_name="{model}"' not in labels:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = (out[m.group(1)] or 0.0) + v
    return out


class ServerClient:
    def __init__(self, url: str, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = 600.0, connect_timeout_s: float = 10.0, stream_interval: int | str | None = None) -> None:
        """`stream_interval`: tokens per streamed chunk asked of the server (vLLM's `stream_interval`;
        the first and last chunk always come at once): None = the server's default (every token),
        "whole" = the call's max_tokens (a first chunk and a last one, so streaming costs the
        server and the client almost nothing per token and TTFT/TPOT stay exact), or a number."""
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            url = "http://" + url
        self.url = url[:-3] if url.endswith("/v1") else url
        self.model = model
        self.stream_interval = stream_interval
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        raise_fd_limit()
        self.http = httpx.AsyncClient(
            base_url=self.url, headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        self.info: ServerInfo | None = None

    async def close(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> "ServerClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # ------------------------------------------------------------------ probing
    @contextlib.contextmanager
    def _transport_errors(self, timed_out: str, what: str) -> Iterator[None]:
        """httpx's transport failures as one-line LiveErrors (the server's own HTTP errors are
        read where the response is)."""
        try:
            yield
        except httpx.ConnectError as e:
            raise LiveError(f"cannot reach the server at {self.url} ({e or 'connection refused'})") from None
        except httpx.TimeoutException:
            raise LiveError(f"the server at {self.url} {timed_out}") from None
        except httpx.HTTPError as e:
            raise LiveError(f"{what} failed: {type(e).__name__}: {e}") from None

    async def _get(self, path: str) -> httpx.Response:
        with self._transport_errors(f"did not answer GET {path} in time", f"GET {self.url}{path}"):
            return await self.http.get(path)

    async def models(self) -> tuple[list[str], dict[str, int | None]]:
        r = await self._get("/v1/models")
        if r.status_code != 200:
            raise LiveError(f"{self.url}/v1/models answered HTTP {r.status_code}: not an OpenAI-compatible server "
                            f"({_error_message(r.text)})")
        try:
            data = r.json()["data"]
            ids = [str(m["id"]) for m in data]
            lens = {str(m["id"]): (int(m["max_model_len"]) if m.get("max_model_len") else None) for m in data}
        except (ValueError, KeyError, TypeError):
            raise LiveError(f"{self.url}/v1/models: answer is not an OpenAI model list") from None
        if not ids:
            raise LiveError(f"{self.url} serves no model")
        return ids, lens

    async def _metrics_page(self) -> str | None:
        """The text of /metrics, or None if the server has none (the counters are optional)."""
        try:
            r = await self.http.get("/metrics")
        except httpx.HTTPError:
            return None
        return r.text if r.status_code == 200 else None

    async def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]] | None:
        """The server's Prometheus metrics, or None if it has no /metrics."""
        text = await self._metrics_page()
        try:
            return None if text is None else parse_metrics(text)
        except LiveError:
            return None

    async def gauges(self, names: Sequence[str]) -> dict[str, float | None] | None:
        """A few gauges from /metrics (cheap: no full parse), or None if it has no /metrics."""
        text = await self._metrics_page()
        return None if text is None else gauge_values(text, names, self.model)

    async def check(self, token_range: tuple[int, int] = (100, 1000)) -> ServerInfo:
        """Probe the server: model served, token-id prompts, SSE streaming with token ids.
        The probe request also warms the server up (first-request costs stay out of the run)."""
        served, lens = await self.models()
        if self.model is None:
            if len(served) > 1:
                raise LiveError(f"{self.url} serves {len(served)} models ({', '.join(served)}): pick one with --model")
            self.model = served[0]
        elif self.model not in served:
            raise LiveError(f"model '{self.model}' is not served by {self.url} (it serves: {', '.join(served)})")
        info = ServerInfo(self.url, self.model, lens.get(self.model), served)
        lo, hi = token_range
        probe = [hi - 1] + [lo + i % max(1, hi - lo) for i in range(15)]
        try:
            res = await self.stream_completion(probe, 2)
        except LiveError as e:
            raise LiveError(f"probe request failed: {e}") from None
        if len(res.output_ids) != 2:
            raise LiveError(f"asked for 2 tokens with ignore_eos, got {len(res.output_ids)}: the server does not "
                            "honour max_tokens/ignore_eos, so output lengths cannot be replayed")
        info.usage = res.prompt_tokens is not None
        if res.prompt_tokens is not None and res.prompt_tokens != len(probe):
            raise LiveError(f"the server counted {res.prompt_tokens} prompt tokens for a {len(probe)}-token-id prompt "
                            "(it re-tokenises or adds tokens): token-id prompts are not taken as given")
        info.cached_tokens = res.cached_tokens is not None
        info.queue_metrics = res.queue_s is not None
        m = await self.metrics()
        if m is not None:
            info.metrics = True
            for labels, _ in m.get("vllm:cache_config_info", []):
                try:
                    info.block_size = int(labels["block_size"])
                    if labels.get("kv_cache_size_tokens", "None") not in ("None", ""):
                        info.kv_pool_tokens = int(labels["kv_cache_size_tokens"])
                    elif labels.get("num_gpu_blocks", "None") not in ("None", ""):
                        info.kv_pool_tokens = int(labels["num_gpu_blocks"]) * info.block_size
                except (KeyError, ValueError):
                    pass
        try:
            r = await self.http.get("/version")
            if r.status_code == 200:
                info.version = str(r.json().get("version"))
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        self.info = info
        return info

    # ------------------------------------------------------------------ requests
    async def stream_completion(self, prompt_ids: list[int], max_tokens: int, extra_body: dict[str, Any] | None = None,
                                headers: dict[str, str] | None = None,
                                stream_interval: int | str | None | EllipsisType = ...) -> StreamResult:
        """Send one streamed completion and time it. Any failure is a one-line LiveError.
        `stream_interval` overrides the client's for this request (same meaning as in __init__)."""
        body: dict[str, Any] = {"model": self.model, "prompt": prompt_ids, "max_tokens": int(max_tokens),
                                "min_tokens": int(max_tokens), "ignore_eos": True, "temperature": 0.0,
                                "stream": True, "stream_options": {"include_usage": True},
                                "return_token_ids": True}
        si = self.stream_interval if stream_interval is ... else stream_interval
        if si == "whole":
            body["stream_interval"] = max(1, int(max_tokens))
        elif isinstance(si, int) and si > 0:
            body["stream_interval"] = si
        if extra_body:
            body.update(extra_body)
        loop = asyncio.get_running_loop()
        sent = loop.time()
        out: list[int] = []
        times: list[float] = []
        counts: list[int] = []
        res = StreamResult(sent, math.nan, math.nan, math.nan, out, times, counts)
        with self._transport_errors(f"timed out on a {len(prompt_ids)}-token request", f"request to {self.url}"):
            async with self.http.stream("POST", "/v1/completions", json=body, headers=headers) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode("utf-8", "replace")
                    raise LiveError(self._http_error(r.status_code, text, len(prompt_ids), max_tokens))
                ctype = r.headers.get("content-type", "")
                if "text/event-stream" not in ctype:
                    raise LiveError(f"the server answered a streaming request with '{ctype or 'no content type'}', "
                                    "not Server-Sent Events: replay needs streaming to time tokens")
                async for line in _sse_lines(r):
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    now = loop.time()
                    try:
                        chunk = json.loads(_strip_prompt_ids(payload))
                    except json.JSONDecodeError:
                        raise LiveError(f"malformed stream chunk from the server: {payload[:120]!r}") from None
                    if "error" in chunk:
                        raise LiveError(f"the server failed mid-stream: {_error_message(payload)}")
                    for ch in chunk.get("choices") or []:
                        ids = ch.get("token_ids")
                        if ids is None:
                            if ch.get("text") or ch.get("finish_reason") is None:
                                raise LiveError("the server streams no generated token ids (vLLM's "
                                                "return_token_ids): replay needs them to extend the next prompt")
                            ids = []
                        if ids:
                            out.extend(int(t) for t in ids)
                            times.append(now)
                            counts.append(len(ids))
                        if ch.get("finish_reason"):
                            res.finish_reason = ch["finish_reason"]
                    usage = chunk.get("usage")
                    if usage:
                        res.prompt_tokens = usage.get("prompt_tokens")
                        det = usage.get("prompt_tokens_details") or {}
                        if det.get("cached_tokens") is not None:
                            res.cached_tokens = int(det["cached_tokens"])
                        met = chunk.get("metrics") or {}
                        if met.get("queue_time_ms") is not None:
                            res.queue_s = float(met["queue_time_ms"]) / 1000.0
                        if met.get("time_to_first_token_ms") is not None:
                            res.server_ttft_s = float(met["time_to_first_token_ms"]) / 1000.0
                        if met.get("generation_time_ms") is not None:
                            res.server_decode_s = float(met["generation_time_ms"]) / 1000.0
        res.end_s = loop.time()
        if not out:
            raise LiveError(f"the server streamed no tokens for a {len(prompt_ids)}-token prompt "
                            f"(finish_reason {res.finish_reason!r})")
        res.first_token_s, res.last_token_s = times[0], times[-1]
        return res

    def _http_error(self, status: int, text: str, n_prompt: int, max_tokens: int) -> str:
        msg = _error_message(text)
        low = msg.lower()
        if status == 404 and "model" in low:
            return f"model '{self.model}' is not served by {self.url} ({msg})"
        if "maximum context length" in low or "max_model_len" in low or "context length" in low:
            return (f"a prompt of {n_prompt} tokens + {max_tokens} output tokens exceeds the server's max model "
                    f"length ({msg})")
        if "out of vocabulary" in low:
            return f"a token id is outside the served model's vocabulary: pass --token-range LO:HI within it ({msg})"
        if "stream_interval" in low:
            return f"the server does not take vLLM's stream_interval: pass --stream-interval 0 ({msg})"
        if "priority" in low:
            return (f"the server refuses request priorities: start vLLM with --scheduling-policy priority for a "
                    f"priority policy ({msg})")
        if status in (400, 422) and ("prompt" in low or "input" in low or "validation" in low or "type" in low):
            return f"the server does not accept token-id prompts on /v1/completions (HTTP {status}: {msg})"
        return f"HTTP {status} from {self.url}/v1/completions: {msg}"
