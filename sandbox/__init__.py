"""Run untrusted, LLM-written policy code safely, and check it sees no future.

Layers (docs/sandbox.md): a static AST gate (`gate`), the EVOLVE-block marker check
(`markers`), an isolated worker process (`worker`, driven by `client`) and the
counterfactual leakage checker (`leakage`); `check` chains them for `evolve check`.
"""
from .errors import SandboxViolation

__all__ = ["SandboxViolation", "load_sandboxed_policy", "check_source", "check_markers"]


def __getattr__(name: str):
    # Lazy, so that importing `sandbox.errors` from simcore never drags in the client.
    if name == "load_sandboxed_policy":
        from .client import load_sandboxed_policy
        return load_sandboxed_policy
    if name == "check_source":
        from .gate import check_source
        return check_source
    if name == "check_markers":
        from .markers import check_markers
        return check_markers
    raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
