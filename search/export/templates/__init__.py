"""Policy exported from an AgentServeSim search run (see README.md and metadata.json).

`policy()` runs policy.py in this process, with full Python rights: in the client
(scheduling), the router (routing) or vLLM's engine core (retention). AgentServeSim
admitted the file in its sandbox before export (metadata.json: "admission"); deploying
it is your decision, so read policy.py first.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

POLICY_FILE = Path(__file__).with_name("policy.py")
METADATA: dict = json.loads(Path(__file__).with_name("metadata.json").read_text(encoding="utf-8"))
VLLM_VERSION: str = METADATA["vllm_version"]


def policy() -> Any:
    """An instance of the exported policy class, run through the runtime shim."""
    from .runtime import load_policy
    return load_policy(POLICY_FILE, METADATA["axis"], sha256=METADATA["policy_sha256"])
