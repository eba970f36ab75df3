"""Import an exported package from its directory (no pip install) for tests."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType


def load_exported(out: Path) -> ModuleType:
    """The package in `out` under its own name, with its submodules importable."""
    name = json.loads((out / "metadata.json").read_text())["package"]
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]   # a previous export under the same name
    spec = importlib.util.spec_from_file_location(name, out / "__init__.py", submodule_search_locations=[str(out)])
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


ROOT = Path(__file__).resolve().parent.parent


def vllm_python() -> str | None:
    """The interpreter of the separate vLLM environment ($AGENTSERVESIM_VLLM_PYTHON or .venv-vllm)."""
    import os
    cand = os.environ.get("AGENTSERVESIM_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    return cand if Path(cand).is_file() else None


def can_import(python: str, code: str) -> bool:
    import subprocess
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# setuptools builds wheels by itself from 70.1; before that it needs the `wheel` package.
BUILDS_WHEELS = ("import setuptools, importlib.util as u; v = tuple(int(x) for x in setuptools.__version__.split('.')[:2]);"
                 " raise SystemExit(0 if v >= (70, 1) or u.find_spec('wheel') else 1)")
