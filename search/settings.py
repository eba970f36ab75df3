"""Search settings: configs/search.yaml, then `--config FILE`, then command-line flags."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simcore.errors import UserError
from simcore.packaged import configs_dir


class SettingsError(UserError, ValueError):
    """Bad search settings; the message is one line naming the file/field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelEntry(_Strict):
    backend: str                      # offline | openai:MODEL | anthropic:MODEL
    weight: float = Field(1.0, gt=0)
    api_base: str | None = None


class LLMSettings(_Strict):
    models: list[ModelEntry] = []
    temperature: float = Field(1.0, ge=0)
    max_tokens: int = Field(4096, gt=0)
    timeout_s: float = Field(120, gt=0)       # total time budget of one LLM call, retries included
    retries: int = Field(2, ge=0)             # retries of transient errors (connection, 429, 5xx) within the budget
    max_consecutive_failures: int = Field(5, gt=0)   # then the run stops with status failed


class HeldOutSettings(_Strict):
    draws: list[int] = Field(default_factory=lambda: [100, 101, 102, 103, 104])
    top: int = Field(3, ge=0)                 # candidates re-scored on the held-out draws (0 = off)


class EvaluatorSettings(_Strict):
    extra_cells: list[str] = []
    workload_seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    stage1: bool = True                       # the target cell on the first draw first
    stage1_threshold: float = Field(0.98, ge=0)
    leak_cell: str | None = "auto"            # counterfactual leakage test here; auto = the family's short cell
    simulator: str = "simcore.sim:simulate"
    leak_check: bool = True
    allow_weak_sandbox: bool = False   # --allow-weak-sandbox: run where an isolation layer is missing
    heldout: HeldOutSettings = HeldOutSettings()

    @model_validator(mode="after")
    def _disjoint(self) -> "EvaluatorSettings":
        if len(set(self.workload_seeds)) != len(self.workload_seeds):
            raise ValueError("workload_seeds has repeated draws")
        both = sorted(set(self.workload_seeds) & set(self.heldout.draws))
        if both:
            raise ValueError(f"heldout.draws must not repeat in-sample workload_seeds (both: {both})")
        return self


class SearchSettings(_Strict):
    iterations: int = Field(50, gt=0)
    seed: int = 42
    islands: int = Field(2, gt=0)
    population: int = Field(40, gt=1)
    archive_size: int = Field(20, gt=0)
    migration_interval: int = Field(10, gt=0)
    migration_rate: float = Field(0.1, ge=0, le=1)
    elite_ratio: float = Field(0.2, ge=0, le=1)
    exploration: float = Field(0.3, ge=0, le=1)
    exploitation: float = Field(0.6, ge=0, le=1)
    diff_based: bool = True
    num_top_programs: int = Field(3, ge=0)
    num_diverse_programs: int = Field(2, ge=0)
    checkpoint_interval: int = Field(5, gt=0)
    max_code_length: int = Field(20000, gt=0)
    workers: int | None = Field(None, gt=0)
    timeout_s: float = Field(900, gt=0)
    llm: LLMSettings = LLMSettings()
    evaluator: EvaluatorSettings = EvaluatorSettings()

    @model_validator(mode="after")
    def _ratios(self) -> "SearchSettings":
        if self.exploration + self.exploitation > 1.0 + 1e-9:
            raise ValueError("exploration + exploitation must not exceed 1")
        return self

    def effective_workers(self) -> int:
        return self.workers or max(1, os.cpu_count() or 1)


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_yaml(path: Path | str, text: str | None = None) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text if text is not None else Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise SettingsError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise SettingsError(f"{path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise SettingsError(f"{path}: not valid YAML: {' '.join(str(e).split())[:200]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping of settings at the top level")
    return data


def default_settings_dict() -> dict[str, Any]:
    ref = configs_dir() / "search.yaml"
    return _read_yaml("configs/search.yaml", ref.read_text(encoding="utf-8"))


# settings that have a command-line flag: an invalid value is blamed on the flag
FLAGS = {"iterations": "--iterations", "islands": "--islands", "population": "--population", "seed": "--seed",
         "workers": "--workers", "timeout_s": "--timeout"}


def load_settings(config_file: str | None = None, overrides: dict[str, Any] | None = None,
                  base: dict[str, Any] | None = None) -> SearchSettings:
    """Defaults (or `base`, e.g. a run's saved config) <- config file <- flag overrides."""
    data = base if base is not None else default_settings_dict()
    where = "configs/search.yaml"
    if config_file:
        data = _deep_merge(data, _read_yaml(config_file))
        where = config_file
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    data = _deep_merge(data, given)
    try:
        return SearchSettings.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        key = str(err["loc"][0]) if err["loc"] else ""
        if key in given and key in FLAGS:
            raise SettingsError(f"{FLAGS[key]} {given[key]}: {err['msg']}") from None
        raise SettingsError(f"{where}: {loc}: {err['msg']}") from None
