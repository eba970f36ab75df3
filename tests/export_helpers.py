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


def importable(out: Path, where: Path) -> Path:
    """A directory to put on PYTHONPATH so that the export in `out` imports under its package
    name in a subprocess (the vLLM server's engine core included), without pip install."""
    name = json.loads((out / "metadata.json").read_text())["package"]
    where.mkdir(parents=True, exist_ok=True)
    link = where / name
    if not link.exists():
        link.symlink_to(out.resolve(), target_is_directory=True)
    return where


def readme_python(readme: str, section: str) -> str:
    """The first ```python block after the heading `section` of an exported README."""
    import re
    after = readme.split(section, 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", after, re.S)
    assert blocks, f"no python block after {section!r}"
    return blocks[0]


def readme_bash(readme: str) -> list[str]:
    """Every command line of the README's ```bash blocks (comments and blank lines dropped)."""
    import re
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", readme, re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                lines.append(line)
    return lines
