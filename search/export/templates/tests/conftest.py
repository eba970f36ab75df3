"""Make the package importable as `{{PACKAGE}}` whether or not it is pip-installed."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGE = "{{PACKAGE}}"
ROOT = Path(__file__).resolve().parents[1]

if PACKAGE not in sys.modules and importlib.util.find_spec(PACKAGE) is None:
    spec = importlib.util.spec_from_file_location(PACKAGE, ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = mod
    spec.loader.exec_module(mod)
sys.path.insert(0, str(Path(__file__).resolve().parent))
