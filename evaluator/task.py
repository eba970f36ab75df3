"""The unit of work a Ray worker runs: one policy source on some cells and workload draws.

Everything crossing the process boundary is plain data (source text, names, numbers), so
the same task runs on a remote node that shares nothing with the driver but the installed
package. Candidate errors come back as data (`ok: False` with a kind and a reason); only a
dead or cancelled worker surfaces as a Ray exception.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Literal, get_args

from sandbox.errors import SandboxUnavailable

from . import admission

DEFAULT_SIMULATOR = "simcore.sim:simulate"

# Why a candidate failed. Each kind is set where the failure is caught, never read back
# out of a message.
FailureKind = Literal[
    "markers",   # edited outside the EVOLVE block
    "gate",      # the static gate refused the source
    "leak",      # read beyond the causal observation boundary
    "load",      # the policy could not be built
    "crash",     # raised, or returned a malformed decision
    "sandbox",   # the sandbox stopped it for a limit (set where the sandbox says so: SandboxViolation.kind)
    "timeout",   # the evaluation overran the hard per-stage limit and was killed
    "worker",    # the evaluation's worker process died twice
    "stage1",    # clearly worse than the seed on the cascade's first stage
    "unavailable",  # not the candidate: this machine lacks an isolation layer (the evaluator stops the search)
]
FAILURE_KINDS: tuple[str, ...] = get_args(FailureKind)

# A fixed policy of another axis (`--with AXIS=POLICY`): a shipped name, or a policy file's source.
Fixed = dict[str, dict[str, str]]   # axis -> {"name": ...} | {"source": ...}


@lru_cache(maxsize=8)
def resolve_simulator(spec: str) -> Callable[..., Any]:
    """'package.module:function' or '/path/file.py:function' -> the simulate callable."""
    mod_name, sep, fn = spec.rpartition(":")
    if not sep or not mod_name or not fn:
        raise ValueError(f"simulator '{spec}' must look like 'module:function' or 'file.py:function'")
    if mod_name.endswith(".py"):
        path = Path(mod_name)
        loader_spec = importlib.util.spec_from_file_location(f"_agentservesim_sim_{abs(hash(spec))}", path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"simulator file {path} cannot be loaded")
        mod = importlib.util.module_from_spec(loader_spec)
        sys.modules[loader_spec.name] = mod     # dataclasses in the file look their module up
        loader_spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(mod_name)
    func = getattr(mod, fn, None)
    if not callable(func):
        raise ValueError(f"simulator '{spec}': {fn} is not a function of {mod_name}")
    return func


def _clean_summary(summary: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in summary.items():
        if isinstance(v, bool) or isinstance(v, (int, str)) or v is None:
            out[k] = v
        elif isinstance(v, float):
            out[k] = v if math.isfinite(v) else None
    return out


def _close(policy: Any) -> None:
    close = getattr(policy, "close", None)   # sandboxed policies own a worker process
    if callable(close):
        close()


def _fixed_policies(fixed: Fixed | None, allow_weak_sandbox: bool = False) -> tuple[dict[str, Any], list[Any]]:
    """Policy arguments for the fixed axes; file policies are loaded through the sandbox."""
    kw: dict[str, Any] = {}
    opened: list[Any] = []
    for axis, spec in (fixed or {}).items():
        if "source" in spec:
            pol = admission.load_policy(spec["source"], axis, allow_weak_sandbox)
            opened.append(pol)
            kw[axis] = pol
        else:
            kw[axis] = spec["name"]
    return kw, opened


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:600]


def _sandbox_kind(e: BaseException) -> FailureKind | None:
    """The kind the sandbox gave its stop, where it gives one (`SandboxViolation.kind`).
    Without one, a failure inside the sandbox is the candidate's `crash` (raised, overran
    a deadline or budget, made a forbidden call): its reason says which."""
    kind = getattr(e, "kind", None)
    return kind if isinstance(kind, str) and kind in FAILURE_KINDS else None


def run_policy(source: str, axis: str, seed_source: str, cells: list[str], seeds: list[int],
               simulator: str = DEFAULT_SIMULATOR, check: bool = True,
               leak_check: str | None = None, fixed: Fixed | None = None,
               allow_weak_sandbox: bool = False) -> dict[str, Any]:
    """Admit `source` (when `check`), optionally run the counterfactual leakage test on the
    cell `leak_check`, then simulate it on every (cell, seed) with the fixed policies of
    the other axes.

    Returns {"ok": True, "runs": {cell: {seed: {"jct_s": [...], "summary": {...}}}}, "wall_s"}
    or {"ok": False, "kind": FailureKind, "reason": "..."}.
    """
    t0 = time.perf_counter()
    try:
        if check:
            admission.admit(source, axis, seed_source)
        if leak_check:
            admission.check_leakage(source, axis, leak_check, seeds[0], allow_weak_sandbox=allow_weak_sandbox)
        simulate = resolve_simulator(simulator)
        runs: dict[str, dict[str, Any]] = {}
        for cell in cells:
            runs[cell] = {}
            for seed in seeds:
                # Fresh objects per run: evolved policies keep state (e.g. gap estimates).
                policy = admission.load_policy(source, axis, allow_weak_sandbox)
                others, opened = _fixed_policies(fixed, allow_weak_sandbox)
                try:
                    res = simulate(cell, seed=seed, **others, **{axis: policy})
                finally:
                    for p in (policy, *opened):
                        _close(p)
                jct = [float(x) for x in res.jct_s]
                if not jct or not all(math.isfinite(x) and x >= 0 for x in jct):
                    return {"ok": False, "kind": "crash",
                            "reason": f"{cell} draw {seed}: simulation produced no valid JCTs"}
                runs[cell][str(seed)] = {"jct_s": jct, "summary": _clean_summary(dict(res.summary))}
        return {"ok": True, "runs": runs, "wall_s": time.perf_counter() - t0}
    except admission.Rejected as e:
        kind = e.kind if e.kind in FAILURE_KINDS else "crash"
        return {"ok": False, "kind": kind, "reason": e.reason}
    except SandboxUnavailable as e:
        return {"ok": False, "kind": "unavailable", "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - a crashing candidate is feedback, not a driver error
        return {"ok": False, "kind": _sandbox_kind(e) or "crash", "reason": _one_line(e)}
