"""The sandbox's admission verdict on the file being exported, taken at export time.

An export hands candidate code to the user's deployment, where it runs in-process with
full rights (client, router or vLLM's engine core). So `evolve export` asks the sandbox
again, on the exact bytes it writes, whether the file is admissible (the search admitted
it under the sandbox of its day), and records the answer in metadata.json.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

CHECKED_BY = "sandbox.check.check_policy"   # what `admission_verdict` calls (recorded in metadata)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def clean(text: object) -> str:
    """Candidate-provided text, safe to print and store on one line: control characters escaped."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def admission_verdict(source: str, axis: str, cell: str, seed_source: str | None, label: str) -> dict[str, Any]:
    """The sandbox's verdict on `source` as a JSON-ready dict (`admissible` is the answer).

    The one call into the sandbox. A check that cannot run counts as not admissible.
    """
    at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        from sandbox.check import check_policy
        v = check_policy(source, axis, label=label, seed_source=seed_source, cell=cell)
    except Exception as e:  # noqa: BLE001 - fail closed, with the reason on one line
        return {"admissible": False, "reason": clean(f"the admission check could not run: {type(e).__name__}: {e}"),
                "checked_by": CHECKED_BY, "checked_at": at, "cell": cell, "stages": [], "isolation": {}}
    return {"admissible": bool(v.admissible), "reason": clean(v.reason), "checked_by": CHECKED_BY,
            "checked_at": at, "cell": v.cell,
            "stages": [{"stage": s.stage, "ok": s.ok, "detail": clean(s.detail)} for s in v.stages],
            "isolation": {clean(k): clean(val) for k, val in (v.layers or {}).items()}}
