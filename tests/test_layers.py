"""Layers point down (pyproject.toml [tool.importlinter]): simcore imports nothing from sandbox,
evaluator or search; sandbox nothing from evaluator or search; evaluator nothing from search;
the sandbox worker nothing of the simulator. Lazy imports inside functions count too."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _lint(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    return subprocess.run([exe, "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_the_projects_layers_hold():
    p = _lint(ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 broken" in p.stdout and "layers: search > evaluator > sandbox > simcore KEPT" in p.stdout


def test_a_reaching_up_import_is_caught(tmp_path):
    """Positive control: the same kind of contract breaks on a lower layer that imports a
    higher one from inside a function (the shape the old simcore/cli.py had)."""
    for name, body in (("upper", "import lower\n"), ("lower", "def f():\n    import upper\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(body)
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_packages =\n    upper\n    lower\n\n"
        "[importlinter:contract:1]\nname = layers\ntype = layers\nlayers =\n    upper\n    lower\n")
    p = _lint(tmp_path, {"PYTHONPATH": str(tmp_path)})
    assert p.returncode != 0 and "BROKEN" in p.stdout, p.stdout + p.stderr
