"""Admission of candidate source: the one place the evaluator talks to `sandbox/`.

Checks run before a candidate is simulated, each raising `Rejected` with a one-line reason
(inert text: sandbox.text.safe_text) that is stored with the candidate and fed back to the
LLM. Each is the sandbox's own implementation; there is no fallback:
  markers  - the text outside the EVOLVE blocks must equal the seed's (sandbox.markers);
  gate     - the static AST gate (sandbox.gate);
  leak     - the source reads only observable fields (sandbox.leakage.check_observed_fields),
             and, in the evaluation task, the counterfactual test (sandbox.leakage).
`load_policy` starts the candidate in an isolated worker (sandbox.client); candidate code
never runs in this process. A machine that lacks an isolation layer raises
`sandbox.SandboxUnavailable` (not a rejection: the search stops on it) unless
`allow_weak_sandbox` is true.
"""
from __future__ import annotations

from typing import Any

from sandbox.client import load_sandboxed_policy
from sandbox.errors import SandboxUnavailable, SandboxViolation
from sandbox.gate import check_source
from sandbox.leakage import check_leakage as _counterfactual
from sandbox.leakage import check_observed_fields
from sandbox.markers import check_markers as _check_markers
from sandbox.text import safe_text

__all__ = ["Rejected", "check_markers", "gate", "check_leakage_static", "check_leakage", "load_policy", "admit",
           "SandboxUnavailable"]


class Rejected(Exception):
    """A candidate failed an admission check; `kind` is markers|gate|leak|load|crash."""

    def __init__(self, kind: str, reason: str) -> None:
        self.kind = kind
        self.reason = safe_text(reason)
        super().__init__(f"{kind}: {self.reason}")


def check_markers(source: str, seed_source: str) -> None:
    """Reject a candidate whose text outside the EVOLVE blocks differs from the seed's."""
    try:
        _check_markers(source, seed_source)
    except SandboxViolation as e:
        raise Rejected("markers", str(e)) from None


def gate(source: str, axis: str) -> None:
    """Static gate: reject dangerous source before anything runs."""
    try:
        check_source(source, axis)
    except SandboxViolation as e:
        raise Rejected("gate", str(e)) from None


def check_leakage_static(source: str) -> None:
    """Cheap static part: attributes read off `pcb` and `self.signals` must be observable."""
    try:
        check_observed_fields(source)
    except SandboxViolation as e:
        raise Rejected("leak", str(e)) from None


def load_policy(source: str, axis: str, allow_weak_sandbox: bool = False) -> Any:
    """A sandboxed policy object for `axis` from admitted source."""
    try:
        return load_sandboxed_policy(source, axis, allow_weak_sandbox=allow_weak_sandbox)
    except SandboxUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 - load failures are candidate feedback
        raise Rejected("load", str(e) if isinstance(e, SandboxViolation) else f"{type(e).__name__}: {e}") from None


def check_leakage(source: str, axis: str, cell: str, seed: int, simulate_fn: Any = None,
                  allow_weak_sandbox: bool = False) -> None:
    """Counterfactual leakage test (sandbox.leakage): decisions must not change when only
    not-yet-revealed future values of the trace are perturbed. Every run gets a fresh
    worker, so nothing a run leaves behind can reach the next."""
    check_leakage_static(source)
    from simcore.config import get_cell
    from simcore.sim import cell_programs
    c = get_cell(cell)
    try:
        report = _counterfactual(lambda _progs: load_policy(source, axis, allow_weak_sandbox), axis, c,
                                 cell_programs(c, seed), seed=seed, simulate_fn=simulate_fn)
    except (Rejected, SandboxUnavailable):
        raise
    except Exception as e:  # noqa: BLE001 - a crash during the test is the candidate's fault
        raise Rejected("crash", f"during the leakage test: {type(e).__name__}: {e}") from None
    if not report.ok:
        raise Rejected("leak", report.reason)


def admit(source: str, axis: str, seed_source: str) -> None:
    """All static admission checks, cheapest first (the counterfactual leak test runs later,
    in the evaluation task, because it simulates)."""
    check_markers(source, seed_source)
    gate(source, axis)
    check_leakage_static(source)
