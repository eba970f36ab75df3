"""`evolve export RUN --to vllm --out DIR`: a winning policy as an installable vLLM package.

DIR is itself the Python package (pyproject maps the package name to "."), so the policy
file sits at DIR/policy.py, unchanged, and `evolve simulate --cell C --AXIS DIR/policy.py`
reproduces the run's metrics. The runtime files come from templates/ (see docs/export.md).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

from ..runs import Run, RunsError, candidate, require_ok

from . import schema
from .admission import admission_verdict

VLLM_VERSION = "0.32.0"   # the version the exported scheduler was tested against (DESIGN §6)
COMMON = ("__init__.py", "tracker.py", "client.py", "tiny_model.py", "cpu_quickstart.py")
BY_AXIS = {"scheduling": (), "retention": ("scheduler.py",), "routing": ("router.py",)}
BACKEND = ("_build", "asim_build_backend.py")   # where templates/build_backend.py goes
# Where the policy runs once exported: the user's process, not AgentServeSim's sandbox.
RUNS_IN = {"scheduling": "your client process (ProgramTracker / TrackedClient compute each call's priority)",
           "retention": "vLLM's engine-core process (the --scheduler-cls subclass calls it)",
           "routing": "the routing proxy's process (python -m PACKAGE.router)"}


@dataclass(frozen=True)
class ExportedPackage:
    out: Path
    package: str
    candidate_id: str
    axis: str
    admission: dict
    policy_sha256: str

    def summary(self) -> list[str]:
        """What `evolve export` tells the user (one item per line)."""
        a = self.admission
        verdict = "ADMISSIBLE" if a["admissible"] else f"NOT ADMISSIBLE ({a['reason']})"
        lines = [f"admission at export: {verdict} by {a['checked_by']} on cell {a['cell']}; "
                 f"policy.py sha256 {self.policy_sha256}"]
        if a.get("forced"):
            lines.append("WARNING: exported anyway because of --force-inadmissible (recorded in metadata.json)")
        lines.append("the exported policy runs in-process, with full Python rights, in "
                     + RUNS_IN[self.axis].replace("PACKAGE", self.package)
                     + ": that is your deployment, outside AgentServeSim's sandbox. Read policy.py before you deploy it.")
        return lines


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
    return {"enable_prefix_caching": True}


def _fill(text: str, values: dict[str, str]) -> str:
    for k, v in values.items():
        text = text.replace("{{" + k + "}}", v)
    return text


def _candidate_bytes(run: Run, cid: str | None) -> tuple[bytes, dict]:
    try:
        _, result = candidate(run, cid)
    except UnicodeDecodeError as e:
        raise RunsError(f"run '{run.run_id}': the candidate's program.py is not UTF-8 ({e.reason} at byte {e.start})") \
            from None
    path = run.root / "candidates" / str(result["candidate_id"]) / "program.py"
    try:
        return path.read_bytes(), result
    except OSError as e:
        raise RunsError(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None


def _seed(run: Run) -> str | None:
    try:
        return run.seed_source()
    except (RunsError, OSError, UnicodeDecodeError):
        return None   # the markers stage is then skipped, which the verdict records


def _fixed_args(run: Run) -> list[tuple[str, str]]:
    """(axis, shipped name or policy file) of the axes the search held fixed (`--with`)."""
    return sorted((axis, spec.get("name") or spec.get("origin") or spec.get("file", "?"))
                  for axis, spec in run.meta.fixed_policies.items())


def _evaluated_with(run: Run) -> str:
    fixed = _fixed_args(run)
    if not fixed:
        return "The other axes were the cell's defaults during the search."
    return ("The search held " + ", ".join(f"{a} = `{p}`" for a, p in fixed)
            + " fixed (`--with`): the fitness holds for that combination, so deploy it alongside.")


def _reproduce(run: Run, dirname: str) -> str:
    """One `evolve simulate` per workload draw the fitness pooled, with the fixed axes."""
    fixed = "".join(f" --{a} {p}" for a, p in _fixed_args(run))
    return "\n".join(f"evolve simulate --cell {run.cell} --{run.axis} {dirname}/policy.py{fixed} --seed {s}"
                     for s in run.workload_seeds)


def export_run(run: Run, cid: str | None, to: str, out: Path | None, name: str | None = None,
               force: bool = False, force_inadmissible: bool = False) -> ExportedPackage:
    if to != "vllm":
        raise RunsError(f"unknown export target '{to}' (supported: vllm)")
    if out is None:
        raise RunsError("export needs --out DIR")
    run.require_finished("export")
    data, result = _candidate_bytes(run, cid)
    require_ok(run, result)
    cid = str(result["candidate_id"])
    pkg = name or package_name(run.axis, cid)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", pkg):
        raise RunsError(f"--name '{pkg}' is not a valid Python package name")
    try:
        occupied = out.exists() and (not out.is_dir() or any(out.iterdir()))
    except OSError as e:
        raise RunsError(f"{out}: cannot read ({e.strerror or type(e).__name__})") from None
    if occupied and not force:
        raise RunsError(f"{out}: exists and is not empty (pass --force to overwrite)")
    runtime = schema.fill(_template("runtime.py"))
    sha = hashlib.sha256(data).hexdigest()
    verdict = admission_verdict(data.decode("utf-8"), run.axis, run.cell, _seed(run), label=f"{run.run_id}/{cid}")
    if not verdict["admissible"] and not force_inadmissible:
        raise RunsError(f"candidate '{cid}' is not admissible now ({verdict['reason']}); nothing exported "
                        "(--force-inadmissible exports it anyway and records that)")
    verdict["forced"] = not verdict["admissible"]
    meta = {"package": pkg, "run_id": run.run_id, "candidate_id": cid, "axis": run.axis, "cell": run.cell,
            "workload_seeds": run.workload_seeds, "fitness": result.get("fitness"),
            "fitness_ci": result.get("fitness_ci"), "metrics": result.get("metrics") or {},
            "parent_id": result.get("parent_id"), "vllm_version": VLLM_VERSION,
            "evaluated_with": run.meta.fixed_policies,
            "engine_args": engine_args(run.axis, pkg), "policy_sha256": sha, "admission": verdict,
            "runs_in": RUNS_IN[run.axis].replace("PACKAGE", pkg),
            "program_view_fields": [f.name for f in dataclasses.fields(schema.view_classes()[0][0])],
            "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    values = {"PACKAGE": pkg, "VLLM_VERSION": VLLM_VERSION, "AXIS": run.axis, "RUN_ID": run.run_id,
              "CANDIDATE": cid, "CELL": run.cell, "FITNESS": f"{float(result.get('fitness') or 0):.4f}",
              "SHA256": sha,
              "ADMISSION": _admission_line(verdict), "RUNS_IN": meta["runs_in"], "DIRNAME": out.name,
              "MEAN_JCT": f"{(result.get('metrics') or {}).get('mean_jct_s', float('nan')):.1f}",
              "EVALUATED_WITH": _evaluated_with(run), "REPRODUCE": _reproduce(run, out.name)}
    files = {"policy.py": data,   # byte for byte the candidate
             "metadata.json": (json.dumps(meta, indent=2) + "\n").encode(),
             "runtime.py": runtime.encode(),
             "pyproject.toml": _fill(_template("pyproject.toml.in"), values).encode(),
             "MANIFEST.in": _template("MANIFEST.in").encode(),
             "README.md": _fill(_template(f"README.{run.axis}.md"), values).encode(),
             "/".join(BACKEND): _template("build_backend.py").encode()}
    for f in COMMON + BY_AXIS[run.axis]:
        files[f] = _template(f).encode()
    extra = ("engine_e2e.py",) if run.axis == "retention" else ()
    for f in ("conftest.py", "vllm_harness.py", "test_policy.py", "test_vllm_harness.py", f"test_{run.axis}.py",
              *extra):
        files[f"tests/{f}"] = _fill(_template(f"tests/{f}"), values).encode()
    try:
        if out.exists() and force:
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        for rel, content in files.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes(content)
    except OSError as e:
        raise RunsError(f"{e.filename or out}: cannot write the export ({e.strerror or type(e).__name__})") from None
    return ExportedPackage(out, pkg, cid, run.axis, verdict, sha)


def _admission_line(v: dict) -> str:
    if v["admissible"]:
        return f"admissible (`{v['checked_by']}` at export, cell `{v['cell']}`)"
    return (f"**NOT admissible** at export ({v['reason']}); exported anyway with `--force-inadmissible`")
