"""Find policies by name (shipped) or load a policy file (in-process, trusted code).

Untrusted candidate files go through `sandbox/` instead; this loader is for the
shipped policies, seeds and files a user wrote and chooses to run directly.
"""
from __future__ import annotations

import math
import types
from pathlib import Path
from typing import Any

from . import retention, routing, scheduling
from .base import AXES, AXIS_BASES, PolicyError, RetentionPolicy, RoutingPolicy, SchedulingPolicy

__all__ = ["AXES", "BASES", "SHIPPED", "CANDIDATE_MODULE", "policy_names", "policy_namespace",
           "policy_class_from_source", "load_policy"]

BASES: dict[str, type] = AXIS_BASES
# The module name a policy file executes as (in-process here, and in the sandbox worker).
CANDIDATE_MODULE = "agentservesim_policy"
SHIPPED: dict[str, dict[str, type]] = {"retention": retention.SHIPPED, "scheduling": scheduling.SHIPPED,
                                       "routing": routing.SHIPPED}


def policy_names(axis: str) -> list[str]:
    return sorted(SHIPPED[axis])


def policy_namespace() -> dict[str, Any]:
    """Globals a policy file sees: the base classes (the paper's listings use them unimported)."""
    return {"RetentionPolicy": RetentionPolicy, "SchedulingPolicy": SchedulingPolicy,
            "RoutingPolicy": RoutingPolicy, "math": math}


def policy_class_from_source(source: str, axis: str, filename: str = "<policy>") -> type:
    """Execute policy source in a fresh module and return its one policy class for `axis`."""
    base = BASES[axis]
    mod = types.ModuleType(CANDIDATE_MODULE)
    mod.__dict__.update(policy_namespace())
    try:
        code = compile(source, filename, "exec", dont_inherit=True)  # not this module's __future__ flags
        exec(code, mod.__dict__)  # noqa: S102 - trusted path; candidates use sandbox/
    except SyntaxError as e:
        raise PolicyError(f"{filename}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # noqa: BLE001 - report any import-time failure in one line
        raise PolicyError(f"{filename}: failed to load: {type(e).__name__}: {e}") from None
    found = [v for v in mod.__dict__.values()
             if isinstance(v, type) and issubclass(v, base) and v is not base]
    if not found:
        raise PolicyError(f"{filename}: defines no subclass of {base.__name__} (axis '{axis}')")
    # the most derived class defined in the file
    own = [c for c in found if c.__module__ == mod.__name__] or found
    return own[-1]


def load_policy(axis: str, spec: Any) -> Any:
    """A policy instance from a shipped name, a path to a policy file, or an instance."""
    if axis not in AXES:
        raise PolicyError(f"unknown policy axis '{axis}' (known: {', '.join(AXES)})")
    if spec is None:
        raise PolicyError(f"no {axis} policy given")
    if isinstance(spec, BASES[axis]):
        return spec
    if isinstance(spec, type) and issubclass(spec, BASES[axis]):
        return spec()
    if isinstance(spec, str):
        if spec in SHIPPED[axis]:
            return SHIPPED[axis][spec]()
        p = Path(spec)
        if p.suffix == ".py" or p.exists():
            if not p.is_file():
                raise PolicyError(f"{p}: policy file not found")
            try:
                text = p.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise PolicyError(f"{p}: not UTF-8 text (byte {e.start}: {e.reason})") from None
            except OSError as e:
                raise PolicyError(f"{p}: cannot read: {e.strerror}") from None
            cls = policy_class_from_source(text, axis, str(p))
            try:
                return cls()
            except Exception as e:  # noqa: BLE001
                raise PolicyError(f"{p}: {cls.__name__}() failed: {type(e).__name__}: {e}") from None
        raise PolicyError(f"unknown {axis} policy '{spec}'; shipped: {', '.join(policy_names(axis))} "
                          "(or a path to a policy .py file)")
    raise PolicyError(f"cannot use {type(spec).__name__} as a {axis} policy")
