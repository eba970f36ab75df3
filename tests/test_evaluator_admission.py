"""Admission of candidate source: markers, gate, observation allow-list; seeds pass."""

import pytest

from evaluator.admission import Rejected, admit, check_leakage_static, load_policy
from evaluator.task import run_policy
from simcore.packaged import SEED_FILES, seed_source



def seed(axis: str) -> str:
    return seed_source(axis)


@pytest.mark.parametrize("axis", sorted(SEED_FILES))
def test_seeds_pass_admission_and_load(axis):
    src = seed(axis)
    admit(src, axis, src)
    pol = load_policy(src, axis)
    try:
        assert pol.axis == axis
    finally:
        getattr(pol, "close", lambda: None)()


def test_seeds_have_one_evolve_block_around_the_class():
    for axis in SEED_FILES:
        src = seed(axis)
        assert src.count("# EVOLVE-BLOCK-START") == 1 and src.count("# EVOLVE-BLOCK-END") == 1
        block = src.split("# EVOLVE-BLOCK-START")[1].split("# EVOLVE-BLOCK-END")[0]
        assert "class Evolved" in block


def test_edit_outside_the_block_is_rejected_with_a_reason():
    src = seed("scheduling")
    bad = src.replace("import math  # noqa", "import math as m  # noqa")
    with pytest.raises(Rejected) as e:
        admit(bad, "scheduling", src)
    assert e.value.kind == "markers" and e.value.reason


def test_gate_rejects_forbidden_import_inside_the_block():
    src = seed("scheduling")
    bad = src.replace("    def priority(self, pcb, now):",
                      "    def priority(self, pcb, now):\n        import os")
    with pytest.raises(Rejected) as e:
        admit(bad, "scheduling", src)
    assert e.value.kind == "gate"


def test_reading_a_hidden_field_is_a_leak():
    src = seed("scheduling")
    bad = src.replace("    def priority(self, pcb, now):",
                      "    def priority(self, pcb, now):\n        n = pcb.program")
    with pytest.raises(Rejected) as e:
        check_leakage_static(bad)
    assert e.value.kind == "leak" and "pcb.program" in e.value.reason


def test_observable_fields_are_not_a_leak():
    check_leakage_static("def f(pcb, now):\n    return pcb.context_tokens + pcb.gap_elapsed_s(now)\n")


def test_task_reports_crashes_as_data_not_exceptions():
    src = seed("scheduling")
    bad = src.replace("return int(round(pcb.attained_service_s * 1000.0))", "return 1 // 0")
    out = run_policy(bad, "scheduling", src, ["rtx70b_swe10_0.1"], [0])
    assert out["ok"] is False and out["kind"] == "crash" and "ZeroDivisionError" in out["reason"]


def test_admission_calls_only_the_sandbox_and_has_no_fallbacks():
    """One implementation of each check: the sandbox's. No copy of the gate, the markers or
    the loader lives here (the copies were weaker, and the loader ran candidates in-process)."""
    import inspect

    import evaluator.admission as A
    import sandbox.gate
    import sandbox.leakage
    import sandbox.markers
    src = inspect.getsource(A)
    for gone in ("_fallback", "backend(", "policy_class_from_source", "exec(", "import ast", "EVOLVE-BLOCK",
                 "heapq"):
        assert gone not in src, gone
    assert A.check_source is sandbox.gate.check_source
    assert A._check_markers is sandbox.markers.check_markers
    assert A._counterfactual is sandbox.leakage.check_leakage


def test_load_failures_and_reasons_are_inert_text():
    bad = "class P(SchedulingPolicy):\n    engine_args = {'block_size': '\\x1b[31m[red]x'}\n"
    with pytest.raises(Rejected) as e:
        load_policy(bad, "scheduling")
    assert e.value.kind == "load" and "\x1b" not in e.value.reason and "[red]" not in e.value.reason


def test_a_missing_layer_is_not_a_rejection(monkeypatch):
    """A machine without a layer stops the search (SandboxUnavailable), not the candidate."""
    from sandbox import SandboxUnavailable, client
    real = client.load_sandboxed_policy
    monkeypatch.setattr("evaluator.admission.load_sandboxed_policy",
                        lambda *a, **k: real(*a, simulate_unavailable=("ipcns",), **k))
    with pytest.raises(SandboxUnavailable, match="ipcns"):
        load_policy(seed("scheduling"), "scheduling")
    pol = load_policy(seed("scheduling"), "scheduling", allow_weak_sandbox=True)
    try:
        assert pol.sandbox_layers["ipcns"].startswith("off")
    finally:
        pol.close()
