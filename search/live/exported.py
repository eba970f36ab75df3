"""An exported policy package (`evolve export`) driving the replay, as its deployment would.

The package is the user's own deployment code: its `ProgramTracker` keeps each program's
state and computes the scheduling policy's priority, and its `request_options` puts the
priority and session id on every request. The replay runs them in this process, after
checking that policy.py is byte-for-byte the file the export recorded (metadata.json's
policy_sha256).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from .client import LiveError


def _import_package(folder: Path, name: str) -> ModuleType:
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py", submodule_search_locations=[str(folder)])
    if spec is None or spec.loader is None:
        raise LiveError(f"{folder}: not an importable exported package")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001 - user code: one line
        del sys.modules[name]
        raise LiveError(f"{folder}/__init__.py failed to import: {type(e).__name__}: {e}") from None
    return mod


class ExportedPolicy:
    """The export's tracker and request options, on the replay's clock."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).resolve()
        meta_path, policy_path = self.folder / "metadata.json", self.folder / "policy.py"
        if not self.folder.is_dir():
            raise LiveError(f"{self.folder}: no such export directory")
        try:
            self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise LiveError(f"{meta_path}: not found; --policy takes a directory made by `evolve export`") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise LiveError(f"{meta_path}: invalid JSON ({e})") from None
        try:
            source = policy_path.read_bytes()
        except FileNotFoundError:
            raise LiveError(f"{policy_path}: not found in the export") from None
        self.sha256 = hashlib.sha256(source).hexdigest()
        want = self.meta.get("policy_sha256")
        if not want:
            raise LiveError(f"{meta_path}: has no policy_sha256 to check policy.py against")
        if want != self.sha256:
            raise LiveError(f"{policy_path}: sha256 {self.sha256[:12]}... differs from the export's metadata.json "
                            f"({str(want)[:12]}...): the policy was edited after export; re-export it")
        self.axis = str(self.meta.get("axis", ""))
        self.package = str(self.meta.get("package") or "")
        if self.axis not in ("scheduling", "retention", "routing") or not self.package.isidentifier():
            raise LiveError(f"{meta_path}: needs 'axis' (scheduling|retention|routing) and a 'package' name")
        _import_package(self.folder, self.package)
        try:
            tracker_mod = importlib.import_module(f"{self.package}.tracker")
            client_mod = importlib.import_module(f"{self.package}.client")
            runtime = importlib.import_module(f"{self.package}.runtime")
        except Exception as e:  # noqa: BLE001
            raise LiveError(f"{self.folder}: the export's tracker/client/runtime modules fail to import: "
                            f"{type(e).__name__}: {e}") from None
        for mod, attr in ((tracker_mod, "ProgramTracker"), (client_mod, "request_options"), (runtime, "load_policy")):
            if not hasattr(mod, attr):
                raise LiveError(f"{self.folder}: {mod.__name__} has no {attr}: made by an `evolve export` this "
                                "replay does not know")
        self.policy_error = getattr(runtime, "PolicyError", ValueError)
        policy = None
        if self.axis == "scheduling":
            try:
                policy = runtime.load_policy(self.folder / "policy.py", "scheduling")
            except Exception as e:  # noqa: BLE001
                raise LiveError(f"{policy_path}: {type(e).__name__}: {e}") from None
        self.policy = policy
        self.tracker = tracker_mod.ProgramTracker(policy, clock=lambda: 0.0)
        self._options = client_mod.request_options

    def describe(self) -> str:
        cid = self.meta.get("candidate_id", "?")
        return (f"exported {self.axis} policy {self.package} (candidate {cid}, policy.py sha256 {self.sha256[:12]}, "
                f"checked) runs in this process: its ProgramTracker sets each call's "
                f"{'priority and ' if self.policy is not None else ''}session id, as in deployment")

    def begin(self, program_id: str, context_tokens: int, now: float) -> tuple[Any, dict[str, Any], dict[str, str]]:
        """(call handle, extra request body, extra headers) for the call released at `now`."""
        try:
            call = self.tracker.begin_call(program_id, context_tokens=context_tokens, now=now)
            opts = self._options(call)
        except self.policy_error as e:
            raise LiveError(f"exported policy failed for program '{program_id}': {e}") from None
        except TypeError as e:
            raise LiveError(f"{self.folder}: the export's tracker has an interface this replay does not know ({e})") from None
        return call, dict(opts.get("extra_body") or {}), {str(k): str(v) for k, v in (opts.get("extra_headers") or {}).items()}

    def end(self, call: Any, prompt_tokens: int, output_tokens: int, tool_name: str | None, now: float,
            first_scheduled_s: float | None) -> None:
        try:
            self.tracker.end_call(call, prompt_tokens=prompt_tokens, output_tokens=output_tokens, tool_name=tool_name,
                                  now=now, first_scheduled_s=first_scheduled_s)
        except TypeError as e:
            raise LiveError(f"{self.folder}: the export's tracker has an interface this replay does not know ({e})") from None

    def finish(self, program_id: str) -> None:
        fin = getattr(self.tracker, "finish", None)
        if callable(fin):
            fin(program_id)
