"""Policy exported from an AgentServeSim search run (see README.md and metadata.json)."""
from __future__ import annotations

import json
from pathlib import Path

POLICY_FILE = Path(__file__).with_name("policy.py")
METADATA: dict = json.loads(Path(__file__).with_name("metadata.json").read_text(encoding="utf-8"))
VLLM_VERSION: str = METADATA["vllm_version"]


def policy():
    """An instance of the exported policy class, run through the runtime shim."""
    from .runtime import load_policy
    return load_policy(POLICY_FILE, METADATA["axis"])
