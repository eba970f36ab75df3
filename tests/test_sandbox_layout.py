"""sandbox/layout.py (opt-in): the worker maps the interpreter where the parent does, and nothing else changes."""
from __future__ import annotations

import resource
import threading

import pytest

from sandbox import layout
from sandbox.client import load_sandboxed_policy
from tests.test_sandbox_gate import LISTING_2

PLAN = layout.plan()
MIRROR = {"mirror_layout": True}
needs_mirror = pytest.mark.skipif(PLAN.stack is None, reason=f"layout not mirrored here: {PLAN.why_not}")


def _maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as fh:
        return fh.read()


def _stack_limit(pid: int) -> str:
    with open(f"/proc/{pid}/limits") as fh:
        return next(line.split()[3] for line in fh if line.startswith("Max stack size"))


def _soft() -> str:
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)


def test_lib_base_reads_the_lowest_mapping_of_exactly_that_path():
    maps = ("7f0000200000-7f0000300000 r-xp 00001000 08:01 42  /usr/lib/libpython3.11.so.1.0\n"
            "7f0000100000-7f0000200000 r--p 00000000 08:01 42  /usr/lib/libpython3.11.so.1.0\n"
            "7e0000000000-7e0000001000 r--p 00000000 08:01 43  /usr/lib/libpython3.11.so.1.0.bak\n"
            "7d0000000000-7d0000001000 r--p 00000000 08:01 44  /opt/my lib/libpython3.11.so.1.0\n"
            "7c0000000000-7c0000001000 rw-p 00000000 00:00 0 \n")
    assert layout.lib_base("/usr/lib/libpython3.11.so.1.0", maps) == 0x7f0000100000
    assert layout.lib_base("/opt/my lib/libpython3.11.so.1.0", maps) == 0x7d0000000000
    assert layout.lib_base("/usr/lib/libc.so.6", maps) is None


@pytest.fixture()
def fresh_plans():
    """Each test that changes the plan probes afresh, and leaves a fresh probe behind."""
    layout.forget_plans()
    yield
    layout.forget_plans()


@needs_mirror
def test_worker_maps_the_interpreter_where_the_parent_does():
    path, base, _ = layout.interpreter_lib()
    pol = load_sandboxed_policy(LISTING_2, "retention", **MIRROR)
    try:
        w = pol.sandbox
        assert w.layout == "mirrored"
        assert layout.lib_base(path, _maps(w.pid)) == base
        # and the candidate runs with the parent's stack limit, not the one used to place it
        assert _stack_limit(w.pid) == _soft()
    finally:
        pol.close()


def test_mirroring_is_off_by_default():
    """It hands the parent's library addresses to untrusted code: opt-in only."""
    pol = load_sandboxed_policy(LISTING_2, "retention")
    try:
        assert pol.sandbox.layout == "off: not requested (mirror_layout=False, the default)"
        assert _stack_limit(pol.sandbox.pid) == _soft()
        path, base, _ = layout.interpreter_lib()
        if path is not None:
            assert layout.lib_base(path, _maps(pol.sandbox.pid)) != base  # its own randomised address
    finally:
        pol.close()


def test_parent_stack_limit_and_personality_are_restored():
    before = resource.getrlimit(resource.RLIMIT_STACK)
    persona = layout.personality(layout.QUERY) if layout.personality else None
    pol = load_sandboxed_policy(LISTING_2, "retention", **MIRROR)
    pol.close()
    assert resource.getrlimit(resource.RLIMIT_STACK) == before
    if persona is not None:
        assert layout.personality(layout.QUERY) == persona


@needs_mirror
def test_concurrent_spawns_from_threads_all_land_and_restore():
    before = resource.getrlimit(resource.RLIMIT_STACK)
    out: list = []

    def load() -> None:
        pol = load_sandboxed_policy(LISTING_2, "retention", **MIRROR)
        out.append((pol.sandbox.layout, _stack_limit(pol.sandbox.pid)))
        pol.close()

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [("mirrored", _soft())] * 4
    assert resource.getrlimit(resource.RLIMIT_STACK) == before


def test_a_refused_personality_falls_back_with_the_reason(monkeypatch, fresh_plans):
    monkeypatch.setattr(layout, "personality", lambda persona: -1)
    from simcore.sim import simulate
    pol = load_sandboxed_policy(LISTING_2, "retention", **MIRROR)
    try:
        assert pol.sandbox.layout.startswith("off: personality(ADDR_NO_RANDOMIZE) refused")
        log: list = []
        simulate("rtx70b_swe10_0.1", decision_log=log, retention=pol)  # and the worker still serves
        assert len(log) > 400 and pol.sandbox.dead is None
    finally:
        pol.close()


@needs_mirror
def test_decisions_do_not_depend_on_the_layout():
    from simcore.sim import simulate
    logs = []
    for mirror in (True, False):
        pol = load_sandboxed_policy(LISTING_2, "retention", mirror_layout=mirror)
        try:
            log: list = []
            simulate("rtx70b_swe10_0.1", decision_log=log, retention=pol)
            logs.append(log)
        finally:
            pol.close()
    assert logs[0] == logs[1] and len(logs[0]) > 400


@needs_mirror
def test_a_worker_that_lands_elsewhere_turns_mirroring_off_for_the_next(fresh_plans):
    real = layout.plan()
    layout.set_plan(layout.Plan(real.lib, real.base, real.stack + (64 << 20)))  # 64 MiB too deep
    first = load_sandboxed_policy(LISTING_2, "retention", **MIRROR)
    second = load_sandboxed_policy(LISTING_2, "retention", **MIRROR)
    try:
        assert first.sandbox.layout == f"off: the library landed at {real.base - (64 << 20):#x}, not {real.base:#x}"
        assert second.sandbox.layout.startswith("off: an earlier worker did not land where planned")
        assert _stack_limit(first.sandbox.pid) == _soft()
    finally:
        first.close()
        second.close()
