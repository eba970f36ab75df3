"""A fake OpenAI-compatible streaming server on 127.0.0.1 for the live commands' tests.

It speaks the parts of vLLM's API the replay uses: GET /v1/models (with max_model_len),
POST /v1/completions with token-id prompts, `stream` + `stream_options.include_usage` +
`return_token_ids` (Server-Sent Events, one chunk per token, a usage chunk with
`prompt_tokens_details.cached_tokens` and per-request `metrics.queue_time_ms`), vLLM's
error bodies, and GET /metrics in Prometheus text format with vLLM's metric names.

Two timing modes:
  independent  every request on its own: first token `ttft_s + prefill_s_per_token * new
               tokens` after it arrives, then one token every `tpot_s` (exact per-token
               delays, for checking the replay's timing and Eq. 2 release rule);
  engine       one continuous-batching loop (FCFS, or priority when `priority=True`):
               each step admits waiting requests (whole prompt in one step, at most
               `max_num_seqs` running), lasts `step_time(prefills, n_decode, kv_sum)`
               seconds and emits one token per running request; the prefix cache keeps
               every finished request's full blocks. The step's history costs what a CPU
               host's caches cost a real engine: the first step after the loop sat idle
               for more than `wake_after_s` takes `wake_s` longer. `api_in_s` / `api_out_s`
               delay every request on its way to the engine and its stream's close (an API
               server's HTTP, input processing, IPC).
Switches make it a broken server: `token_prompts=False` (rejects token-id prompts),
`streaming=False` (answers JSON even when asked to stream), `token_ids=False` (no
`token_ids` in chunks), `metrics=False` (no /metrics).
It runs its own event loop in a daemon thread: `with FakeServer(...) as url: ...`.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

StepTime = Callable[[list[tuple[int, int]], int, int], float]


@dataclass
class Recorded:
    body: dict[str, Any]
    headers: dict[str, str]
    received: float                 # time.monotonic() at arrival
    first_token: float = 0.0
    done: float = 0.0
    output_ids: list[int] = field(default_factory=list)
    cached: int = 0


@dataclass(eq=False)
class _Req:
    rec: Recorded
    prompt: list[int]
    max_tokens: int
    priority: int
    seq: int
    queue: asyncio.Queue
    cached: int = 0
    generated: int = 0
    scheduled: float = 0.0
    queued: float = 0.0


class FakeServer:
    def __init__(self, *, model: str = "fake-model", max_model_len: int = 4096, mode: str = "independent",
                 ttft_s: float = 0.02, tpot_s: float = 0.01, prefill_s_per_token: float = 0.0,
                 step_time: StepTime | None = None, max_num_seqs: int = 64, priority: bool = False,
                 block_size: int = 16, kv_pool_tokens: int = 1 << 20, vocab: int = 1000,
                 token_prompts: bool = True, streaming: bool = True, token_ids: bool = True,
                 metrics: bool = True, wake_s: float = 0.0, wake_after_s: float = 0.005,
                 api_in_s: float = 0.0, api_out_s: float = 0.0) -> None:
        self.model, self.max_model_len, self.mode = model, max_model_len, mode
        self.ttft_s, self.tpot_s, self.prefill_s_per_token = ttft_s, tpot_s, prefill_s_per_token
        self.step_time = step_time or (lambda prefills, n, kv: 0.005)
        self.max_num_seqs, self.priority = max_num_seqs, priority
        self.block_size, self.kv_pool_tokens, self.vocab = block_size, kv_pool_tokens, vocab
        self.token_prompts, self.streaming, self.token_ids, self.metrics = token_prompts, streaming, token_ids, metrics
        self.wake_s, self.wake_after_s = wake_s, wake_after_s
        self.api_in_s, self.api_out_s = api_in_s, api_out_s
        self.requests: list[Recorded] = []
        self.counters = {"queries": 0, "hits": 0, "prompt": 0, "generation": 0, "success": 0, "queue_sum": 0.0}
        self._blocks: set[int] = set()
        self._seq = itertools.count()
        self._waiting: list[tuple[Any, ...]] = []
        self._running: list[_Req] = []
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> str:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._wake = asyncio.Event()
            server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=4096))
            self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            if self.mode == "engine":
                loop.create_task(self._engine())
            ready.set()
            loop.run_forever()
            server.close()
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self.url

    def stop(self) -> None:
        if self._loop is not None:
            loop = self._loop

            def halt() -> None:
                for t in asyncio.all_tasks(loop):
                    t.cancel()
                loop.stop()
            loop.call_soon_threadsafe(halt)
        if self._thread is not None:
            self._thread.join(5)

    # ------------------------------------------------------------------ HTTP
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            if not line:
                return
            method, path, _ = line.decode("latin-1").split(" ", 2)
            headers: dict[str, str] = {}
            while True:
                h = await reader.readline()
                if h in (b"\r\n", b"\n", b""):
                    break
                k, _, v = h.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
            if method == "GET" and path.startswith("/v1/models"):
                await self._json(writer, 200, {"object": "list", "data": [
                    {"id": self.model, "object": "model", "owned_by": "fake", "max_model_len": self.max_model_len}]})
            elif method == "GET" and path.startswith("/metrics") and self.metrics:
                await self._send(writer, 200, "text/plain; version=0.0.4", self._prometheus().encode())
            elif method == "GET" and path.startswith("/version"):
                await self._json(writer, 200, {"version": "fake-0.1"})
            elif method == "POST" and path.startswith("/v1/completions"):
                await self._completions(writer, json.loads(body or b"{}"), headers)
            else:
                await self._json(writer, 404, {"error": {"message": "Not Found", "type": "NotFoundError", "code": 404}})
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            raise
        finally:
            try:
                writer.close()
            except RuntimeError:
                pass

    async def _send(self, writer: asyncio.StreamWriter, status: int, ctype: str, data: bytes) -> None:
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
                     "Connection: close\r\n\r\n".encode() + data)
        await writer.drain()

    async def _json(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
        await self._send(writer, status, "application/json", json.dumps(obj).encode())

    async def _error(self, writer: asyncio.StreamWriter, status: int, message: str, kind: str = "BadRequestError") -> None:
        await self._json(writer, status, {"error": {"message": message, "type": kind, "param": None, "code": status}})

    async def _completions(self, writer: asyncio.StreamWriter, body: dict[str, Any], headers: dict[str, str]) -> None:
        rec = Recorded(body, headers, time.monotonic())
        self.requests.append(rec)
        if body.get("model") != self.model:
            return await self._error(writer, 404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        prompt = body.get("prompt")
        if isinstance(prompt, str) or not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            return await self._error(writer, 400, "prompt must be a list of token ids")
        if not self.token_prompts:
            return await self._error(writer, 400, "1 validation error: prompt: Input should be a valid string")
        if any(t < 0 or t >= self.vocab for t in prompt):
            return await self._error(writer, 400, f"Token id {max(prompt)} is out of vocabulary")
        max_tokens = int(body.get("max_tokens") or 16)
        if len(prompt) + max_tokens > self.max_model_len:
            return await self._error(writer, 400, f"This model's maximum context length is {self.max_model_len} tokens. "
                                                  f"However, you requested {len(prompt) + max_tokens} tokens.")
        prio = int(body.get("priority") or 0)
        if prio != 0 and not self.priority:
            return await self._error(writer, 400, "Got priority 5 but Priority scheduling is not enabled.")
        if not self.streaming or not body.get("stream"):
            out = [self._token(len(self.requests), j) for j in range(max_tokens)]
            return await self._json(writer, 200, {"choices": [{"index": 0, "text": "x" * max_tokens,
                                                               "finish_reason": "length"}],
                                                  "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out)}})
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nConnection: close\r\n\r\n")
        await writer.drain()
        queue: asyncio.Queue = asyncio.Queue()
        if self.api_in_s:
            await asyncio.sleep(self.api_in_s)
        req = _Req(rec, list(prompt), max_tokens, prio, next(self._seq), queue, queued=time.monotonic())
        if self.mode == "engine":
            heapq.heappush(self._waiting, ((prio, rec.received, req.seq) if self.priority else (req.seq,)) + (req,))
            assert self._wake is not None
            self._wake.set()
        else:
            asyncio.get_running_loop().create_task(self._independent(req))
        first, pending = True, []
        interval = int(body.get("stream_interval") or 1)   # vLLM: first and last chunk at once
        while True:
            item = await queue.get()
            if item is None:
                break
            pending.append(item[0])
            if not (first or item[1] is not None or len(pending) >= interval):
                continue
            choice: dict[str, Any] = {"index": 0, "text": "", "logprobs": None, "finish_reason": item[1],
                                      "stop_reason": None}
            if self.token_ids:
                choice["prompt_token_ids"] = list(prompt) if first else None
                choice["token_ids"] = pending
            else:
                choice["text"] = "x" * len(pending)
            first, pending = False, []
            writer.write(f"data: {json.dumps({'id': 'cmpl-x', 'object': 'text_completion', 'model': self.model, 'choices': [choice]})}\n\n".encode())
            await writer.drain()
        usage = {"prompt_tokens": len(prompt), "completion_tokens": req.generated,
                 "total_tokens": len(prompt) + req.generated, "prompt_tokens_details": {"cached_tokens": req.cached}}
        metrics = {"queue_time_ms": (req.scheduled - req.queued) * 1000.0,
                   "time_to_first_token_ms": (rec.first_token - req.scheduled) * 1000.0,
                   "generation_time_ms": (rec.done - rec.first_token) * 1000.0}
        if self.api_out_s:
            await asyncio.sleep(self.api_out_s)
        if (body.get("stream_options") or {}).get("include_usage"):
            writer.write(f"data: {json.dumps({'id': 'cmpl-x', 'choices': [], 'usage': usage, 'metrics': metrics})}\n\n".encode())
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()

    # ------------------------------------------------------------------ token generation
    def _token(self, rid: int, j: int) -> int:
        return 1 + (rid * 7919 + j * 104729) % (self.vocab - 1)

    def _block_hashes(self, tokens: list[int], limit: int) -> list[int]:
        """Chained hashes of the full blocks of tokens[:limit] (vLLM's block hash: parent + block)."""
        bs, out, h = self.block_size, [], 0
        for end in range(bs, limit + 1, bs):
            h = hash((h, tuple(tokens[end - bs:end])))
            out.append(h)
        return out

    def _prefix_hit(self, prompt: list[int]) -> int:
        hit = 0
        for h in self._block_hashes(prompt, len(prompt) - 1):
            if h not in self._blocks:
                break
            hit += self.block_size
        return hit

    def _remember(self, tokens: list[int]) -> None:
        self._blocks.update(self._block_hashes(tokens, len(tokens)))

    def _emit(self, req: _Req, now: float) -> bool:
        """One token for `req`; True when it has finished."""
        tok = self._token(req.seq, req.generated)
        req.rec.output_ids.append(tok)
        req.generated += 1
        if req.generated == 1:
            req.rec.first_token = now
        done = req.generated >= req.max_tokens
        req.queue.put_nowait((tok, "length" if done else None))
        if done:
            req.rec.done = now
            self._remember(req.prompt + req.rec.output_ids[:-1])
            self.counters["generation"] += req.generated
            self.counters["success"] += 1
            req.queue.put_nowait(None)
        return done

    def _admit(self, req: _Req, now: float) -> None:
        req.scheduled = now
        req.cached = self._prefix_hit(req.prompt)
        req.rec.cached = req.cached
        self.counters["queries"] += len(req.prompt)
        self.counters["hits"] += req.cached
        self.counters["prompt"] += len(req.prompt)
        self.counters["queue_sum"] += now - req.rec.received

    async def _independent(self, req: _Req) -> None:
        self._admit(req, time.monotonic())
        self._running.append(req)
        await asyncio.sleep(self.ttft_s + self.prefill_s_per_token * (len(req.prompt) - req.cached))
        while not self._emit(req, time.monotonic()):
            await asyncio.sleep(self.tpot_s)
        self._running.remove(req)

    async def _engine(self) -> None:
        assert self._wake is not None
        last_end = -1e9
        while True:
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            now = time.monotonic()
            prefills: list[tuple[int, int]] = []
            new: list[_Req] = []
            while self._waiting and len(self._running) + len(new) < self.max_num_seqs:
                req = heapq.heappop(self._waiting)[-1]
                self._admit(req, now)
                prefills.append((len(req.prompt) - req.cached, req.cached))
                new.append(req)
            decoding = list(self._running)
            kv = sum(len(r.prompt) + r.generated for r in decoding)
            dt = self.step_time(prefills, len(decoding), kv)
            if now - last_end > self.wake_after_s:
                dt += self.wake_s
            await asyncio.sleep(dt)
            end = last_end = time.monotonic()
            self._running.extend(new)
            for req in decoding + new:
                if self._emit(req, end):
                    self._running.remove(req)

    # ------------------------------------------------------------------ metrics
    def _prometheus(self) -> str:
        c, lab = self.counters, f'engine="0",model_name="{self.model}"'
        used = sum(len(r.prompt) + r.generated for r in self._running)
        lines = [
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} {len(self._running)}",
            "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{lab}}} {len(self._waiting)}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{lab}}} {min(1.0, used / self.kv_pool_tokens)}",
            "# TYPE vllm:prefix_cache_queries counter", f"vllm:prefix_cache_queries_total{{{lab}}} {c['queries']}",
            "# TYPE vllm:prefix_cache_hits counter", f"vllm:prefix_cache_hits_total{{{lab}}} {c['hits']}",
            "# TYPE vllm:num_preemptions counter", f"vllm:num_preemptions_total{{{lab}}} 0.0",
            "# TYPE vllm:prompt_tokens counter", f"vllm:prompt_tokens_total{{{lab}}} {c['prompt']}",
            "# TYPE vllm:generation_tokens counter", f"vllm:generation_tokens_total{{{lab}}} {c['generation']}",
            "# TYPE vllm:request_queue_time_seconds histogram",
            f"vllm:request_queue_time_seconds_sum{{{lab}}} {c['queue_sum']}",
            f"vllm:request_queue_time_seconds_count{{{lab}}} {c['success']}",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{self.block_size}",engine="0",enable_prefix_caching="True",'
            f'kv_cache_size_tokens="{self.kv_pool_tokens}",num_gpu_blocks="{self.kv_pool_tokens // self.block_size}"}} 1.0',
        ]
        return "\n".join(lines) + "\n"


def dead_url() -> str:
    """A 127.0.0.1 URL nothing listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def linear_step(c0: float, per_prefill_token: float, per_sequence: float, per_kv_token: float) -> StepTime:
    """step = c0 + per_prefill_token x new tokens + per_sequence x decodes + per_kv_token x their KV."""
    def step(prefills: list[tuple[int, int]], n_decode: int, kv_sum: int) -> float:
        return c0 + per_prefill_token * sum(n for n, _ in prefills) + per_sequence * n_decode + per_kv_token * kv_sum
    return step


class Spawned:
    """The fake server in a child process (its own interpreter: no GIL shared with the client).
    `step` = linear_step's four numbers for engine mode."""

    def __init__(self, step: tuple[float, float, float, float] | None = None, **kwargs: Any) -> None:
        self.spec = {"step": step, **kwargs}
        self.proc: Any = None

    def __enter__(self) -> str:
        import subprocess
        import sys
        from pathlib import Path
        tests = str(Path(__file__).resolve().parent.parent)
        self.proc = subprocess.Popen([sys.executable, "-m", "fakes.openai_stream", json.dumps(self.spec)], cwd=tests,
                                     stdout=subprocess.PIPE, text=True)
        return self.proc.stdout.readline().strip()

    def __exit__(self, *exc: Any) -> None:
        self.proc.kill()
        self.proc.wait()


if __name__ == "__main__":
    import sys
    spec = json.loads(sys.argv[1])
    step = spec.pop("step", None)
    srv = FakeServer(step_time=linear_step(*step) if step else None, **spec)
    print(srv.start(), flush=True)
    while True:
        time.sleep(3600)
