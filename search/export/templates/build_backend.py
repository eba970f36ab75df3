"""PEP 517 build backend of this package: setuptools, run on a temporary copy.

This directory is itself the Python package (policy.py stays where `evolve simulate` reads
it), and setuptools builds in the source tree: `pip install DIR` would leave build/ and
*.egg-info inside the package, and fail on a read-only copy. So every hook copies the
package's files (the regular files at the top of the directory: the package has no
subpackages; plus this backend and tests/, for sdists) to a temporary directory and lets setuptools build there. Editable installs
must point at this directory, so they build in place and remove what they created.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from setuptools import build_meta as _setuptools

BACKEND_DIR = "_build"   # this file's folder: an sdist carries it (MANIFEST.in) to build again


@contextlib.contextmanager
def _in_copy() -> Iterator[None]:
    src = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="asim-build-") as tmp:
        dst = Path(tmp) / src.name
        dst.mkdir()
        for f in src.iterdir():
            if f.is_file():
                shutil.copy2(f, dst / f.name)
        for d in (BACKEND_DIR, "tests"):
            if (src / d).is_dir():
                shutil.copytree(src / d, dst / d, ignore=shutil.ignore_patterns("__pycache__"))
        os.chdir(dst)
        try:
            yield
        finally:
            os.chdir(src)


@contextlib.contextmanager
def _in_place() -> Iterator[None]:
    here = Path.cwd()
    before = {p.name for p in here.iterdir()}
    try:
        yield
    finally:
        for p in here.iterdir():
            if p.name not in before and (p.name == "build" or p.name.endswith(".egg-info")) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)


def _abs(p: str | None) -> str | None:
    return None if p is None else os.path.abspath(p)


def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    with _in_copy():
        return _setuptools.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings: Any = None) -> list[str]:
    with _in_copy():
        return _setuptools.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Any = None) -> str:
    d = _abs(metadata_directory)
    with _in_copy():
        return _setuptools.prepare_metadata_for_build_wheel(d, config_settings)


def build_wheel(wheel_directory: str, config_settings: Any = None, metadata_directory: str | None = None) -> str:
    w, m = _abs(wheel_directory), _abs(metadata_directory)
    with _in_copy():
        return _setuptools.build_wheel(w, config_settings, m)


def build_sdist(sdist_directory: str, config_settings: Any = None) -> str:
    d = _abs(sdist_directory)
    with _in_copy():
        return _setuptools.build_sdist(d, config_settings)


def get_requires_for_build_editable(config_settings: Any = None) -> list[str]:
    with _in_place():
        return _setuptools.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: Any = None) -> str:
    d = _abs(metadata_directory)
    with _in_place():
        return _setuptools.prepare_metadata_for_build_editable(d, config_settings)


def build_editable(wheel_directory: str, config_settings: Any = None, metadata_directory: str | None = None) -> str:
    w, m = _abs(wheel_directory), _abs(metadata_directory)
    with _in_place():
        return _setuptools.build_editable(w, config_settings, m)
