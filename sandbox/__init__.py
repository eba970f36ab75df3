"""Run untrusted, LLM-written policy code safely, and check it sees no future.

Layers (docs/sandbox.md): a static AST gate (`gate`), the EVOLVE-block marker check
(`markers`), an isolated worker process on a kernel boundary (`worker/`, driven by
`process`, `proxies` and `client`) and the counterfactual leakage checker (`leakage`);
`check` chains them for `evolve check`. `text.safe_text` makes candidate-provided text safe
to print, store and prompt with.
"""
from .errors import SandboxUnavailable, SandboxViolation
from .text import safe_text

__all__ = ["SandboxViolation", "SandboxUnavailable", "safe_text", "load_sandboxed_policy", "check_source",
           "check_markers"]


def __getattr__(name: str):
    # Lazy, so that importing `sandbox.errors` never drags in the client.
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
