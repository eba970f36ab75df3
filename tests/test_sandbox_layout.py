"""sandbox/layout.py: the worker maps the interpreter where the parent does, and nothing else changes."""
from __future__ import annotations

import resource
import threading

import pytest

from sandbox import layout
from sandbox.client import load_sandboxed_policy
from tests.test_sandbox_gate import LISTING_2

PLAN = layout.plan()
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


@needs_mirror
def test_worker_maps_the_interpreter_where_the_parent_does():
    path, base, _ = layout.interpreter_lib()
    pol = load_sandboxed_policy(LISTING_2, "retention")
    try:
        w = pol._worker
        assert w.layout == "mirrored"
        assert layout.lib_base(path, _maps(w.proc.pid)) == base
        # and the candidate runs with the parent's stack limit, not the one used to place it
        assert _stack_limit(w.proc.pid) == _soft()
    finally:
        pol.close()


def test_mirror_off_leaves_the_layout_to_aslr():
    pol = load_sandboxed_policy(LISTING_2, "retention", mirror_layout=False)
    try:
        assert pol._worker.layout == "off: turned off (mirror_layout=False)"
        assert _stack_limit(pol._worker.proc.pid) == _soft()
    finally:
        pol.close()


def test_parent_stack_limit_and_personality_are_restored():
    before = resource.getrlimit(resource.RLIMIT_STACK)
    persona = layout._persona(layout._QUERY) if layout._persona else None
    pol = load_sandboxed_policy(LISTING_2, "retention")
    pol.close()
    assert resource.getrlimit(resource.RLIMIT_STACK) == before
    if persona is not None:
        assert layout._persona(layout._QUERY) == persona


@needs_mirror
def test_concurrent_spawns_from_threads_all_land_and_restore():
    before = resource.getrlimit(resource.RLIMIT_STACK)
    out: list = []

    def load() -> None:
        pol = load_sandboxed_policy(LISTING_2, "retention")
        out.append((pol._worker.layout, _stack_limit(pol._worker.proc.pid)))
        pol.close()

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [("mirrored", _soft())] * 4
    assert resource.getrlimit(resource.RLIMIT_STACK) == before


def test_a_refused_personality_falls_back_with_the_reason(monkeypatch):
    monkeypatch.setattr(layout, "_persona", lambda persona: -1)
    monkeypatch.setattr(layout, "_PLANS", {})
    from simcore.sim import simulate
    pol = load_sandboxed_policy(LISTING_2, "retention")
    try:
        assert pol._worker.layout.startswith("off: personality(ADDR_NO_RANDOMIZE) refused")
        log: list = []
        simulate("rtx70b_swe10_0.1", decision_log=log, retention=pol)  # and the worker still serves
        assert len(log) > 500 and pol._worker.dead is None
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
    assert logs[0] == logs[1] and len(logs[0]) > 500


@needs_mirror
def test_a_worker_that_lands_elsewhere_turns_mirroring_off_for_the_next(monkeypatch):
    monkeypatch.setattr(layout, "_PLANS", {})
    real = layout.plan()
    monkeypatch.setitem(layout._PLANS, layout.sys.executable,
                        layout.Plan(real.lib, real.base, real.stack + (64 << 20)))  # 64 MiB too deep
    first = load_sandboxed_policy(LISTING_2, "retention")
    second = load_sandboxed_policy(LISTING_2, "retention")
    try:
        assert first._worker.layout == f"off: the library landed at {real.base - (64 << 20):#x}, not {real.base:#x}"
        assert second._worker.layout.startswith("off: an earlier worker did not land where planned")
        assert _stack_limit(first._worker.proc.pid) == _soft()
    finally:
        first.close()
        second.close()
