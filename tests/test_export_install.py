"""`pip install DIR` builds from a temporary copy: no build/ or *.egg-info left in the export."""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.export_helpers import BUILDS_WHEELS, can_import, vllm_python
from tests.runs_fixture import exported_package


@pytest.fixture(scope="module")
def python():
    """A local interpreter that builds wheels offline (no build isolation, no network)."""
    py = next((p for p in (sys.executable, vllm_python()) if p and can_import(p, BUILDS_WHEELS)), None)
    if py is None:
        pytest.skip("no local interpreter with setuptools>=70.1 or wheel (install `wheel` to run this)")
    return py


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = exported_package(tmp_path_factory, "retention")
    return out


def tree(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if "__pycache__" not in p.parts)


def pip(python: str, *args: str) -> None:
    p = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", *args],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr


def run_import(python: str, code: str, pkg: str, site_dir: Path, cwd: Path) -> str:
    prog = f"import site; site.addsitedir({str(site_dir)!r}); import {pkg} as m; {code}"
    q = subprocess.run([python, "-c", prog], capture_output=True, text=True, timeout=60, cwd=cwd)
    assert q.returncode == 0, q.stderr
    return q.stdout.strip()


def test_wheel_and_editable_installs_leave_no_litter(python, exported, tmp_path):
    before = tree(exported)
    pkg = json.loads((exported / "metadata.json").read_text())["package"]
    pip(python, "--target", str(tmp_path / "site"), str(exported))
    assert tree(exported) == before
    assert run_import(python, "print(m.METADATA['axis'])", pkg, tmp_path / "site", tmp_path) == "retention"
    installed = tree(tmp_path / "site" / pkg)
    assert "policy.py" in installed and "tiny_model.py" in installed and "cpu_quickstart.py" in installed
    assert not any(p.startswith(("_build", "tests", "build")) for p in installed)

    prefix = tmp_path / "editable"
    pip(python, "--prefix", str(prefix), "-e", str(exported))
    assert tree(exported) == before
    site_dir = next(prefix.glob("lib/python*/site-packages"))
    assert run_import(python, "print(m.POLICY_FILE)", pkg, site_dir, tmp_path) == str(exported / "policy.py")


def test_sdist_carries_its_backend_and_builds_again(python, exported, tmp_path):
    before = tree(exported)
    code = ("import sys; sys.path.insert(0, '_build'); import asim_build_backend as b; "
            f"print(b.build_sdist({str(tmp_path)!r}))")
    p = subprocess.run([python, "-c", code], cwd=exported, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    sdist = tmp_path / p.stdout.strip().splitlines()[-1]
    names = tarfile.open(sdist).getnames()
    top = names[0].split("/")[0]
    for want in ("_build/asim_build_backend.py", "policy.py", "metadata.json", "tests/test_retention.py"):
        assert f"{top}/{want}" in names, want
    assert tree(exported) == before
    pkg = json.loads((exported / "metadata.json").read_text())["package"]
    pip(python, "--target", str(tmp_path / "site"), str(sdist))
    assert run_import(python, "print(m.METADATA['package'])", pkg, tmp_path / "site", tmp_path) == pkg
