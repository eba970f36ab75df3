"""`evolve export RUN --to vllm --out DIR`: a winning policy as an installable vLLM package.

DIR is itself the Python package (pyproject maps the package name to "."), so the policy
file sits at DIR/policy.py, unchanged, and `evolve simulate --cell C --AXIS DIR/policy.py`
reproduces the run's metrics. The runtime files come from templates/ (see docs/export.md).
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

from ..runs import Run, RunsError, candidate, require_ok

VLLM_VERSION = "0.32.0"   # the version the exported scheduler was tested against (DESIGN §6)
COMMON = ("__init__.py", "runtime.py", "tracker.py", "client.py")
BY_AXIS = {"scheduling": (), "retention": ("scheduler.py",), "routing": ("router.py",)}


@dataclass(frozen=True)
class ExportedPackage:
    out: Path
    package: str
    candidate_id: str
    axis: str


def package_name(axis: str, cid: str) -> str:
    return "asim_" + re.sub(r"[^0-9a-zA-Z_]", "_", f"{axis}_{cid}").lower()


def _template(name: str) -> str:
    return resources.files("search.export").joinpath("templates", name).read_text(encoding="utf-8")


def engine_args(axis: str, pkg: str) -> dict[str, object]:
    if axis == "scheduling":
        return {"scheduling_policy": "priority"}
    if axis == "retention":
        return {"enable_prefix_caching": True, "scheduler_cls": f"{pkg}.scheduler.RetentionAsyncScheduler",
                "scheduler_cls_sync": f"{pkg}.scheduler.RetentionScheduler"}
    return {}


def _fill(text: str, values: dict[str, str]) -> str:
    for k, v in values.items():
        text = text.replace("{{" + k + "}}", v)
    return text


def export_run(run: Run, cid: str | None, to: str, out: Path | None, name: str | None = None,
               force: bool = False) -> ExportedPackage:
    if to != "vllm":
        raise RunsError(f"unknown export target '{to}' (supported: vllm)")
    if out is None:
        raise RunsError("export needs --out DIR")
    run.require_finished("export")
    source, result = candidate(run, cid)
    require_ok(run, result)
    cid = str(result["candidate_id"])
    pkg = name or package_name(run.axis, cid)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", pkg):
        raise RunsError(f"--name '{pkg}' is not a valid Python package name")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise RunsError(f"{out}: exists and is not empty (pass --force to overwrite)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"package": pkg, "run_id": run.run_id, "candidate_id": cid, "axis": run.axis, "cell": run.cell,
            "workload_seeds": run.workload_seeds, "fitness": result.get("fitness"),
            "fitness_ci": result.get("fitness_ci"), "metrics": result.get("metrics") or {},
            "parent_id": result.get("parent_id"), "vllm_version": VLLM_VERSION,
            "engine_args": engine_args(run.axis, pkg),
            "policy_sha256": hashlib.sha256(source.encode("utf-8")).hexdigest(),
            "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    (out / "policy.py").write_text(source, encoding="utf-8")   # byte-for-byte the candidate
    (out / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    for f in COMMON + BY_AXIS[run.axis]:
        (out / f).write_text(_template(f), encoding="utf-8")
    values = {"PACKAGE": pkg, "VLLM_VERSION": VLLM_VERSION, "AXIS": run.axis, "RUN_ID": run.run_id,
              "CANDIDATE": cid, "CELL": run.cell, "FITNESS": f"{float(result.get('fitness') or 0):.4f}",
              "SEEDS": " ".join(str(s) for s in run.workload_seeds),
              "MEAN_JCT": f"{(result.get('metrics') or {}).get('mean_jct_s', float('nan')):.1f}"}
    (out / "pyproject.toml").write_text(_fill(_template("pyproject.toml.in"), values), encoding="utf-8")
    (out / "README.md").write_text(_fill(_template(f"README.{run.axis}.md"), values), encoding="utf-8")
    tests = out / "tests"
    tests.mkdir()
    extra = ("engine_e2e.py",) if run.axis == "retention" else ()
    for f in ("conftest.py", "vllm_harness.py", "test_policy.py", f"test_{run.axis}.py", *extra):
        (tests / f).write_text(_fill(_template(f"tests/{f}"), values), encoding="utf-8")
    return ExportedPackage(out, pkg, cid, run.axis)
