"""Hardware, model and cell configuration (configs/*.yaml), validated with pydantic.

A cell is one point of the design space: hardware x model x workload x arrival rate,
plus engine args and the default policy on each axis.
"""
from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import UserError
from .packaged import configs_dir
from .textio import read_text


class ConfigError(UserError, ValueError):
    """Broken or unknown configuration; the message is one line naming file/field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HardwareSpec(_Strict):
    key: str
    name: str
    peak_bf16_tflops: float = Field(gt=0)
    mem_bw_tbs: float = Field(gt=0)
    mem_gib: float = Field(gt=0)
    allreduce_gbs: float = Field(gt=0)
    host_link_gbs: float = Field(gt=0)
    host_kv_gib: float = Field(ge=0)
    power_idle_w: float = Field(ge=0)
    power_max_w: float = Field(gt=0)
    profile: str | None = None


class ModelSpec(_Strict):
    key: str
    hf_name: str
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate: int = Field(gt=0)
    vocab: int = Field(gt=0)
    params_b: float = Field(gt=0)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * 2


class EngineArgs(_Strict):
    """vLLM v1 scheduler and cache knobs, with vLLM 0.32's names and defaults
    (vllm/config/scheduler.py, vllm/config/cache.py); the engine follows each one exactly
    (tests/parity/ checks them against vLLM's own scheduler)."""
    block_size: int = Field(16, gt=0)
    max_num_seqs: int = Field(128, gt=0)
    max_num_batched_tokens: int = Field(16384, gt=0)
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    # Admit a waiting request only if its whole sequence fits, not just its first chunk.
    scheduler_reserve_full_isl: bool = True
    enable_prefix_caching: bool = True
    # Cap on one request's tokens per step when more than one request is in the system (0: off).
    long_prefill_token_threshold: int = Field(0, ge=0)
    # ... floored at max_num_batched_tokens / (running + waiting).
    long_prefill_token_threshold_adaptive: bool = False
    # Share of KV blocks kept free when admitting a request while others run.
    watermark: float = Field(0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _check(self) -> "EngineArgs":
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({self.max_num_seqs}), as vLLM requires")
        return self


class WorkloadSpec(_Strict):
    kind: Literal["swe", "swe-tracelab", "bfcl", "file"]
    programs: int | None = Field(None, gt=0)
    path: str | None = None
    # "recorded": use each program's meta.arrival_s (imported traces); else Poisson at the rate
    arrivals: Literal["poisson", "recorded"] = "poisson"

    @model_validator(mode="after")
    def _check(self) -> "WorkloadSpec":
        if self.kind == "file" and not self.path:
            raise ValueError("workload kind 'file' needs 'path'")
        if self.kind != "file" and not self.programs:
            raise ValueError(f"workload kind '{self.kind}' needs 'programs'")
        return self


class PolicyNames(_Strict):
    retention: str = "cache-lru"
    scheduling: str = "fcfs"
    routing: str = "round-robin"


class Cell(_Strict):
    name: str
    description: str = ""
    hardware: HardwareSpec
    model: ModelSpec
    tp: int = Field(1, gt=0)
    instances: int = Field(1, gt=0)
    kv_pool_tokens: int = Field(gt=0)
    rate_jps: float = Field(gt=0)
    workload: WorkloadSpec
    engine: EngineArgs = EngineArgs()
    policies: PolicyNames = PolicyNames()
    seed: int = 0
    # A measured profile directory (`evolve profile`); when set, it times the engine's steps.
    profile: str | None = None


def _data_root() -> Path:
    """configs/ as installed (package data), or the folder named by AGENTSERVESIM_CONFIGS
    (a user's own hardware.yaml / models.yaml / cells.yaml; profiles stay the shipped ones)."""
    own = os.environ.get("AGENTSERVESIM_CONFIGS")
    return Path(own) if own else configs_dir()


def load_yaml(path: Path, error: type[Exception] = ConfigError) -> Any:
    """Parse a YAML file; a missing file or bad YAML raises `error` with `path:line: ...`."""
    text = read_text(path, error)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise error(f"{path}{line}: invalid YAML ({getattr(e, 'problem', e)})") from None


def _mapping(path: Path, value: Any, where: str, empty_ok: bool = True) -> dict:
    """`value` as a mapping (None = empty), or a one-line ConfigError naming file and field."""
    if value is None and empty_ok:
        return {}
    if not isinstance(value, dict):
        got = "nothing" if value is None else type(value).__name__
        raise ConfigError(f"{path}: {where}: expected a mapping, got {got}")
    return value


def _pydantic_msg(path: Path, key: str, e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "(root)"
    return f"{path}: {key}.{loc}: {err['msg']}"


@functools.lru_cache(maxsize=None)
def hardware_catalog(root: str | None = None) -> dict[str, HardwareSpec]:
    path = Path(root or _data_root()) / "hardware.yaml"
    raw = _mapping(path, load_yaml(path), "(top level)", empty_ok=False)
    out = {}
    for key, body in raw.items():
        try:
            out[key] = HardwareSpec(key=key, **_mapping(path, body, str(key)))
        except ValidationError as e:
            raise ConfigError(_pydantic_msg(path, key, e)) from None
    return out


@functools.lru_cache(maxsize=None)
def model_catalog(root: str | None = None) -> dict[str, ModelSpec]:
    path = Path(root or _data_root()) / "models.yaml"
    raw = _mapping(path, load_yaml(path), "(top level)", empty_ok=False)
    out = {}
    for key, body in raw.items():
        try:
            out[key] = ModelSpec(key=key, **_mapping(path, body, str(key)))
        except ValidationError as e:
            raise ConfigError(_pydantic_msg(path, key, e)) from None
    return out


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "workload":
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def default_kv_pool_tokens(hw: HardwareSpec, model: ModelSpec, tp: int, util: float) -> int:
    """vLLM's sizing, roughly: utilisation share of memory minus weights minus a 5 % reserve."""
    total = hw.mem_gib * 2**30 * tp * util
    free = total - model.weight_bytes - 0.05 * hw.mem_gib * 2**30 * tp
    return max(0, int(free // model.kv_bytes_per_token))


def _rate_label(rate: float) -> str:
    return f"{rate:g}"


@functools.lru_cache(maxsize=None)
def cell_catalog(root: str | None = None) -> dict[str, Cell]:
    base = Path(root or _data_root())
    path = base / "cells.yaml"
    raw = _mapping(path, load_yaml(path), "(top level)", empty_ok=False)
    hws, models = hardware_catalog(root), model_catalog(root)
    defaults = _mapping(path, raw.get("defaults"), "defaults")
    families = _mapping(path, raw.get("families"), "families")
    if not families:
        raise ConfigError(f"{path}: families: no cell families defined")
    cells: dict[str, Cell] = {}
    for fam, body in families.items():
        body = _merge({k: v for k, v in defaults.items() if k != "gpu_memory_utilization"},
                      _mapping(path, body, f"families.{fam}"))
        util = float(defaults.get("gpu_memory_utilization", 0.9))
        rates = body.pop("rates", None)
        per_rate = body.pop("per_rate", {}) or {}
        if not rates:
            raise ConfigError(f"{path}: families.{fam}.rates: at least one rate is required")
        for rate in rates:
            spec = _merge(body, per_rate.get(_rate_label(rate), {}) or per_rate.get(str(rate), {}) or {})
            name = f"{fam}_{_rate_label(rate)}"
            hw_key, model_key = spec.pop("hardware", None), spec.pop("model", None)
            if hw_key not in hws:
                raise ConfigError(f"{path}: families.{fam}.hardware: unknown '{hw_key}' (known: {', '.join(hws)})")
            if model_key not in models:
                raise ConfigError(f"{path}: families.{fam}.model: unknown '{model_key}' (known: {', '.join(models)})")
            hw, model = hws[hw_key], models[model_key]
            tp = int(spec.get("tp", 1))
            if spec.get("profile"):   # a measured profile: relative to this file; its KV pool by default
                spec["profile"] = _measured_profile(path, fam, base, str(spec["profile"]), spec)
            spec.setdefault("kv_pool_tokens", default_kv_pool_tokens(hw, model, tp, util))
            wl = spec.get("workload") or {}
            if isinstance(wl, dict) and wl.get("kind") == "file" and wl.get("path"):
                p = Path(wl["path"])
                if not p.is_absolute():
                    wl = dict(wl, path=str((base / p).resolve()))
                    spec["workload"] = wl
            try:
                cells[name] = Cell(name=name, hardware=hw, model=model, rate_jps=float(rate), **spec)
            except ValidationError as e:
                raise ConfigError(_pydantic_msg(path, f"families.{fam}", e)) from None
    return cells


def _measured_profile(path: Path, fam: str, base: Path, folder: str, spec: dict) -> str:
    from .perf_measured import MeasuredProfileError, read_meta
    p = Path(folder).expanduser()
    p = (p if p.is_absolute() else base / p).resolve()
    try:
        meta = read_meta(p)
    except MeasuredProfileError as e:
        raise ConfigError(f"{path}: families.{fam}.profile: {e}") from None
    if "kv_pool_tokens" not in spec and isinstance(meta.get("kv_pool_tokens"), int) and meta["kv_pool_tokens"] > 0:
        spec["kv_pool_tokens"] = meta["kv_pool_tokens"]
    return str(p)


def get_cell(name: str) -> Cell:
    cells = cell_catalog()
    if name not in cells:
        raise ConfigError(f"unknown cell '{name}'; valid cells: {', '.join(sorted(cells))}")
    return cells[name]


def profiles_root() -> Path:
    own = _data_root() / "profiles"
    return own if own.is_dir() else configs_dir() / "profiles"
