"""LLM backends: the offline mutator, any OpenAI-compatible server, Anthropic; weighted ensembles.

Each backend answers one prompt with `complete()`, within a total time budget per call
(`llm.timeout_s`): transient errors (connection refused, 429, 5xx) are retried while the
budget lasts, at most `llm.retries` times; a call that gets no answer in time is not
retried (a retry would only pile more work on a slow server). A failure is one line:
what failed, at which endpoint, after how long.

`build_backends` checks every backend before the run starts (key present, server
reachable, key accepted, base URL right, model served), so a wrong setting is one clear
error rather than fifty failed iterations.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .offline import OfflineMutator
from .settings import LLMSettings, ModelEntry

_TRANSIENT = {408, 409, 425, 429}


class LLMSetupError(RuntimeError):
    """The configured LLM cannot be used; one line for the user."""


class LLMCallError(RuntimeError):
    """One LLM call failed (after its retries); the message is one line."""


@dataclass
class Completion:
    text: str
    seconds: float
    attempts: int = 1
    usage: dict[str, Any] | None = None


def _line(text: Any, n: int = 200) -> str:
    return " ".join(str(text).split())[:n]


def parse_spec(spec: str) -> tuple[str, str | None]:
    kind, _, model = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "offline" and not model:
        return "offline", None
    if kind in ("openai", "anthropic") and model.strip():
        return kind, model.strip()
    raise LLMSetupError(f"--llm '{spec}': expected offline, openai:MODEL or anthropic:MODEL")


def parse_llm_flag(flag: str, api_base: str | None = None) -> list[ModelEntry]:
    """`--llm SPEC[@WEIGHT][,SPEC[@WEIGHT]...]`, e.g. `openai:A@0.7,anthropic:B@0.3`.

    `--api-base` applies to every openai entry (per-entry bases go in a config file).
    """
    entries = []
    for part in (p.strip() for p in flag.split(",")):
        if not part:
            raise LLMSetupError(f"--llm '{flag}': empty entry (expected SPEC[@WEIGHT],...)")
        spec, at, w = part.rpartition("@")
        weight = 1.0
        if at:
            try:
                weight = float(w)
            except ValueError:
                spec = part          # an '@' that is part of the model name
            else:
                if not weight > 0:
                    raise LLMSetupError(f"--llm '{part}': the weight must be a positive number")
        else:
            spec = part
        kind, _ = parse_spec(spec)
        entries.append(ModelEntry(backend=spec, weight=weight, api_base=api_base if kind == "openai" else None))
    return entries


def entries_for(llm_flag: str | None, api_base: str | None, settings: LLMSettings) -> list[ModelEntry]:
    """Which models to use: --llm beats the config file's ensemble; the default is offline."""
    if llm_flag:
        return parse_llm_flag(llm_flag, api_base)
    if settings.models:
        return list(settings.models)
    return [ModelEntry(backend="offline", weight=1.0)]


def label_for(entries: list[ModelEntry]) -> str:
    """How run.json names the LLM: one backend, or the ensemble with its weights."""
    if len(entries) == 1:
        return entries[0].backend
    return " + ".join(f"{e.backend}@{e.weight:g}" for e in entries)


def request_seed(run_seed: int, iteration: int) -> int:
    """A per-request sampling seed that differs from iteration to iteration (same prompt
    and seed would otherwise give the same answer on servers that honour it)."""
    return int.from_bytes(hashlib.sha256(f"{run_seed}:llm:{iteration}".encode()).digest()[:4], "big") % (2 ** 31)


@dataclass
class Backend:
    """One model of the ensemble."""
    spec: str                      # as configured, e.g. "openai:gpt-4o-mini"
    weight: float
    endpoint: str                  # where calls go, for messages
    _call: Callable[[str, str, int, dict[str, Any]], Completion] = field(repr=False)

    def complete(self, system: str, user: str, iteration: int, **context: Any) -> Completion:
        return self._call(system, user, iteration, context)


class _Remote:
    """Shared retry/budget logic of the HTTP backends."""

    def __init__(self, spec: str, endpoint: str, settings: LLMSettings, run_seed: int,
                 sdk: Any, stop: threading.Event | None) -> None:
        self.spec, self.endpoint, self.settings, self.run_seed = spec, endpoint, settings, run_seed
        self.sdk = sdk
        self.stop = stop or threading.Event()

    def _request(self, system: str, user: str, iteration: int, timeout: float) -> tuple[str, dict | None]:
        raise NotImplementedError

    def __call__(self, system: str, user: str, iteration: int, context: dict[str, Any]) -> Completion:
        t0 = time.monotonic()
        budget = self.settings.timeout_s
        attempt = 0
        while True:
            attempt += 1
            left = budget - (time.monotonic() - t0)
            try:
                text, usage = self._request(system, user, iteration, max(1.0, left))
            except self.sdk.APITimeoutError:
                raise LLMCallError(f"{self.spec} at {self.endpoint}: no answer within "
                                   f"{time.monotonic() - t0:.0f} s (llm.timeout_s = {budget:g} s)") from None
            except (self.sdk.APIConnectionError, self.sdk.APIStatusError) as e:
                status = getattr(e, "status_code", None)
                what = f"HTTP {status}: {_line(getattr(e, 'message', e))}" if status else \
                    f"connection failed: {_line(e)}"
                transient = status is None or status in _TRANSIENT or status >= 500
                elapsed = time.monotonic() - t0
                backoff = min(2.0 ** (attempt - 1), 8.0)
                if transient and attempt <= self.settings.retries and elapsed + backoff < budget \
                        and not self.stop.wait(backoff):
                    continue
                tries = f" ({attempt} attempts)" if attempt > 1 else ""
                raise LLMCallError(f"{self.spec} at {self.endpoint}: {what}, after {elapsed:.1f} s{tries}") from None
            if not text or not text.strip():
                raise LLMCallError(f"{self.spec} at {self.endpoint}: empty answer after "
                                   f"{time.monotonic() - t0:.1f} s")
            return Completion(text, time.monotonic() - t0, attempt, usage)


class _OpenAI(_Remote):
    def __init__(self, model: str, base: str, key: str, settings: LLMSettings, run_seed: int,
                 stop: threading.Event | None) -> None:
        import openai
        super().__init__(f"openai:{model}", base.rstrip("/") + "/chat/completions", settings, run_seed, openai, stop)
        self.model, self.base = model, base
        self.client = openai.OpenAI(api_key=key, base_url=base, max_retries=0, timeout=settings.timeout_s)

    def _request(self, system: str, user: str, iteration: int, timeout: float) -> tuple[str, dict | None]:
        resp = self.client.with_options(timeout=timeout).chat.completions.create(
            model=self.model, messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            temperature=self.settings.temperature, max_tokens=self.settings.max_tokens,
            seed=request_seed(self.run_seed, iteration))
        u = getattr(resp, "usage", None)
        usage = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens} if u else None
        return (resp.choices[0].message.content or "") if resp.choices else "", usage

    def preflight(self) -> None:
        import openai
        fast = self.client.with_options(timeout=15, max_retries=0)
        try:
            served = [m.id for m in fast.models.list()]
        except openai.APIConnectionError as e:
            raise LLMSetupError(f"{self.spec}: cannot reach {self.base}: {_line(e)}") from None
        except openai.AuthenticationError:
            raise LLMSetupError(f"{self.spec}: {self.base} rejected OPENAI_API_KEY") from None
        except openai.APIStatusError:
            served = None   # no model list here: check with a one-token request instead
        if served:
            if self.model not in served:
                raise LLMSetupError(f"{self.spec}: {self.base} does not serve model '{self.model}' "
                                    f"(it serves: {', '.join(served[:8])})")
            return
        try:
            fast.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "ping"}],
                                         max_tokens=1)
        except openai.APIConnectionError as e:
            raise LLMSetupError(f"{self.spec}: cannot reach {self.base}: {_line(e)}") from None
        except openai.AuthenticationError:
            raise LLMSetupError(f"{self.spec}: {self.base} rejected OPENAI_API_KEY") from None
        except openai.NotFoundError as e:
            raise LLMSetupError(f"{self.spec}: {self.endpoint} answered 404 ({_line(e.message, 120)}): is the "
                                f"base URL right (OpenAI-compatible servers usually end in /v1) and the model "
                                f"name served?") from None
        except openai.APIStatusError as e:
            raise LLMSetupError(f"{self.spec}: a test request to {self.endpoint} failed: HTTP {e.status_code}: "
                                f"{_line(e.message)}") from None


class _Anthropic(_Remote):
    def __init__(self, model: str, base: str | None, key: str, settings: LLMSettings, run_seed: int,
                 stop: threading.Event | None) -> None:
        import anthropic
        shown = (base or "https://api.anthropic.com").rstrip("/")
        super().__init__(f"anthropic:{model}", shown + "/v1/messages", settings, run_seed, anthropic, stop)
        self.model, self.base = model, shown
        self.client = anthropic.Anthropic(api_key=key, base_url=base, max_retries=0, timeout=settings.timeout_s)

    def _request(self, system: str, user: str, iteration: int, timeout: float) -> tuple[str, dict | None]:
        # Recent SDK releases dropped `temperature` from create()'s signature; the Messages API
        # still takes it, so it goes in the request body.
        resp = self.client.with_options(timeout=timeout).messages.create(
            model=self.model, system=system, messages=[{"role": "user", "content": user}],
            max_tokens=self.settings.max_tokens, extra_body={"temperature": self.settings.temperature})
        u = getattr(resp, "usage", None)
        usage = {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens} if u else None
        return "".join(getattr(b, "text", "") for b in resp.content), usage

    def preflight(self) -> None:
        import anthropic
        fast = self.client.with_options(timeout=15, max_retries=0)
        try:
            fast.models.list(limit=1)
        except anthropic.APIConnectionError as e:
            raise LLMSetupError(f"{self.spec}: cannot reach {self.base}: {_line(e)}") from None
        except anthropic.AuthenticationError:
            raise LLMSetupError(f"{self.spec}: {self.base} rejected ANTHROPIC_API_KEY") from None
        except anthropic.NotFoundError:
            raise LLMSetupError(f"{self.spec}: {self.base}/v1/models answered 404: is the base URL right "
                                f"(without /v1; the SDK adds it)?") from None
        except anthropic.APIStatusError as e:
            raise LLMSetupError(f"{self.spec}: {self.base} answered HTTP {e.status_code}: {_line(e.message)}") from None
        try:
            fast.models.retrieve(self.model)
        except anthropic.NotFoundError:
            raise LLMSetupError(f"{self.spec}: {self.base} does not know model '{self.model}'") from None
        except anthropic.APIStatusError as e:
            raise LLMSetupError(f"{self.spec}: checking model '{self.model}' failed: HTTP {e.status_code}: "
                                f"{_line(e.message)}") from None


def _offline(seed: int) -> Callable[[str, str, int, dict[str, Any]], Completion]:
    mutator = OfflineMutator(seed=seed)

    def call(system: str, user: str, iteration: int, context: dict[str, Any]) -> Completion:
        t0 = time.monotonic()
        text = asyncio.run(mutator.generate_with_context(
            system, [{"role": "user", "content": user}], parent_code=context.get("parent_code"),
            iteration=iteration))
        return Completion(text, time.monotonic() - t0)
    return call


def build_backends(entries: list[ModelEntry], settings: LLMSettings, seed: int, preflight: bool = True,
                   stop: threading.Event | None = None) -> list[Backend]:
    out: list[Backend] = []
    for e in entries:
        kind, model = parse_spec(e.backend)
        if kind == "offline":
            out.append(Backend(e.backend, e.weight, "embedded offline mutator", _offline(seed)))
            continue
        if kind == "openai":
            key = os.environ.get("OPENAI_API_KEY")
            if not key:
                raise LLMSetupError(f"openai:{model}: OPENAI_API_KEY is not set (any non-empty value works "
                                    "for a local server that ignores keys)")
            base = e.api_base or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
            client: _Remote = _OpenAI(model, base, key, settings, seed, stop)
        else:
            key = os.environ.get("ANTHROPIC_API_KEY")
            if not key:
                raise LLMSetupError(f"anthropic:{model}: ANTHROPIC_API_KEY is not set")
            client = _Anthropic(model, e.api_base or os.environ.get("ANTHROPIC_BASE_URL"), key, settings, seed, stop)
        if preflight:
            client.preflight()
        out.append(Backend(e.backend, e.weight, client.endpoint, client))
    return out
