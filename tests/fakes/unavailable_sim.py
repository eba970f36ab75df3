"""A simulator spec for one search test: importing it (which the evaluation task does right
before it loads the policy) makes the next sandboxed load in that Ray worker see a machine
without network namespaces, through the sandbox's own test seam (`simulate_unavailable`).
The patch undoes itself on its first use, so the Ray worker, which later tests reuse, keeps
the real loader."""
from __future__ import annotations

from typing import Any

from evaluator import admission

_real = getattr(admission.load_sandboxed_policy, "real", admission.load_sandboxed_policy)


def _without_netns(*a: Any, **k: Any) -> Any:
    admission.load_sandboxed_policy = _real
    return _real(*a, simulate_unavailable=("netns",), **k)


_without_netns.real = _real   # type: ignore[attr-defined]
admission.load_sandboxed_policy = _without_netns


def simulate(*a: Any, **k: Any) -> Any:
    raise AssertionError("not reached: the policy cannot load on this 'machine'")
