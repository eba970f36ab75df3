"""LLM backends: the offline mutator, any OpenAI-compatible server, Anthropic; weighted ensembles.

`build_models` turns settings into (weight, client) pairs after a preflight check, so a
missing key or an unreachable server is one clear error before the run starts rather than
fifty failed iterations. Clients implement OpenEvolve's `LLMInterface`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from openevolve.config import LLMModelConfig
from openevolve.llm.base import LLMInterface

from .offline import OfflineMutator
from .settings import LLMSettings, ModelEntry


class LLMSetupError(RuntimeError):
    """The configured LLM cannot be used; one line for the user."""


@dataclass
class Backend:
    spec: str          # as configured, e.g. "openai:gpt-4o-mini"
    weight: float
    client: LLMInterface


def parse_spec(spec: str) -> tuple[str, str | None]:
    kind, _, model = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "offline" and not model:
        return "offline", None
    if kind in ("openai", "anthropic") and model.strip():
        return kind, model.strip()
    raise LLMSetupError(f"--llm '{spec}': expected offline, openai:MODEL or anthropic:MODEL")


class AnthropicLLM(LLMInterface):
    """Claude through the `anthropic` package (Messages API)."""

    def __init__(self, model: str, api_key: str, base_url: str | None, settings: LLMSettings) -> None:
        import anthropic
        self.model = model
        self.settings = settings
        self.client = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url,
                                               timeout=settings.timeout_s, max_retries=settings.retries)
        self.last_usage: dict[str, Any] | None = None
        # Some SDK releases dropped the sampling-temperature argument; send it only where accepted.
        import inspect
        self._takes_temperature = "temperature" in inspect.signature(self.client.messages.create).parameters

    async def generate(self, prompt: str, **kwargs: Any) -> str:
        return await self.generate_with_context("", [{"role": "user", "content": prompt}], **kwargs)

    async def generate_with_context(self, system_message: str, messages: list[dict[str, str]],
                                    **kwargs: Any) -> str:
        extra: dict[str, Any] = {"system": system_message} if system_message else {}
        if self._takes_temperature:
            extra["temperature"] = float(kwargs.get("temperature", self.settings.temperature))
        resp = await self.client.messages.create(
            model=self.model, **extra,
            messages=[{"role": m["role"], "content": m["content"]} for m in messages],
            max_tokens=int(kwargs.get("max_tokens", self.settings.max_tokens)))
        u = getattr(resp, "usage", None)
        if u is not None:
            self.last_usage = {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens,
                               "total_tokens": u.input_tokens + u.output_tokens}
        return "".join(getattr(b, "text", "") for b in resp.content)


def _openai_client(model: str, api_base: str | None, settings: LLMSettings, seed: int) -> LLMInterface:
    from openevolve.llm.openai import OpenAILLM
    key = os.environ.get("OPENAI_API_KEY")
    if not key:
        raise LLMSetupError(f"openai:{model}: OPENAI_API_KEY is not set (any non-empty value works "
                            "for a local server that ignores keys)")
    cfg = LLMModelConfig(name=model, api_base=api_base or os.environ.get("OPENAI_BASE_URL")
                         or "https://api.openai.com/v1", api_key=key,
                         temperature=settings.temperature, max_tokens=settings.max_tokens,
                         timeout=int(settings.timeout_s), retries=settings.retries, retry_delay=2,
                         random_seed=seed)
    cfg.system_message = None
    return OpenAILLM(cfg)


def _preflight_openai(model: str, client: Any) -> None:
    import openai
    try:
        client.client.with_options(timeout=15, max_retries=0).models.list()
    except openai.APIConnectionError as e:
        raise LLMSetupError(f"openai:{model}: cannot reach {client.api_base}: "
                            f"{' '.join(str(e).split())[:200]}") from None
    except openai.AuthenticationError:
        raise LLMSetupError(f"openai:{model}: {client.api_base} rejected OPENAI_API_KEY") from None
    except openai.APIStatusError:
        pass   # the server answered; some OpenAI-compatible servers do not list models


def _preflight_anthropic(model: str, base_url: str | None, key: str) -> None:
    import anthropic
    try:
        anthropic.Anthropic(api_key=key, base_url=base_url, timeout=15, max_retries=0).models.list()
    except anthropic.APIConnectionError as e:
        raise LLMSetupError(f"anthropic:{model}: cannot reach {base_url or 'api.anthropic.com'}: "
                            f"{' '.join(str(e).split())[:200]}") from None
    except anthropic.AuthenticationError:
        raise LLMSetupError(f"anthropic:{model}: the server rejected ANTHROPIC_API_KEY") from None
    except anthropic.APIStatusError:
        pass


def entries_for(llm_flag: str | None, api_base: str | None, settings: LLMSettings) -> list[ModelEntry]:
    """Which models to use: --llm beats the config file's ensemble; the default is offline."""
    if llm_flag:
        return [ModelEntry(backend=llm_flag, weight=1.0, api_base=api_base)]
    if settings.models:
        return list(settings.models)
    return [ModelEntry(backend="offline", weight=1.0)]


def build_models(entries: list[ModelEntry], settings: LLMSettings, seed: int,
                 preflight: bool = True) -> list[Backend]:
    out: list[Backend] = []
    for e in entries:
        kind, model = parse_spec(e.backend)
        if kind == "offline":
            client: LLMInterface = OfflineMutator(seed=seed)
        elif kind == "openai":
            client = _openai_client(model, e.api_base, settings, seed)
            if preflight:
                _preflight_openai(model, client)
        else:
            key = os.environ.get("ANTHROPIC_API_KEY")
            if not key:
                raise LLMSetupError(f"anthropic:{model}: ANTHROPIC_API_KEY is not set")
            base = e.api_base or os.environ.get("ANTHROPIC_BASE_URL")
            if preflight:
                _preflight_anthropic(model, base, key)
            client = AnthropicLLM(model, key, base, settings)
        out.append(Backend(e.backend, e.weight, client))
    return out


def label_for(entries: list[ModelEntry]) -> str:
    """How run.json names the LLM: one backend, or the ensemble with its weights."""
    if len(entries) == 1:
        return entries[0].backend
    return " + ".join(f"{e.backend}@{e.weight:g}" for e in entries)
