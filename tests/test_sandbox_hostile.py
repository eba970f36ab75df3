"""The hostile corpus (tests/hostile/*.py): every escape is refused by the gate AND contained
by the worker when the gate is skipped (defence in depth), with a one-line reason.

Files 59-69 are one per class of attack found against the earlier design (issue 12):
gate bypass through allowed modules (59, 60, 61, 69), switching the tripwire off (62), raw
syscalls (63), cross-evaluation memory (64), a trojan run by whoever loads the file (65), a
class changed after its body (66), deep engine_args and escape codes in reasons (67, 68).

Each corpus file starts with a header:
    # hostile: what it tries          # axis: retention|scheduling|routing
    # gate: reject <substring> | pass # worker: violation <substring> | ok | any
    # worker-noaudit: contained | violation | any   # limits: decision_timeout_s=.. cpu_budget_s=.. calls=..
`worker` is the outcome with the gate skipped and every layer on; `worker-noaudit` repeats
the run without the audit-hook tripwire, to show the kernel layers (seccomp, rlimits,
namespaces) contain it on their own.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from sandbox import SandboxViolation
from sandbox.client import load_sandboxed_policy
from sandbox.gate import check_source
from simcore.pcb import InstanceView, ProgramView, Signals

CORPUS = sorted((Path(__file__).parent / "hostile").glob("*.py"))
# The corpus writes to this path; each test run substitutes its own directory, so that
# concurrent test runs on one machine cannot see each other's canaries.
CANARY_IN_CORPUS = "/tmp/agentservesim-canary"


def header(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("# ") or ":" not in line:
            break
        k, v = line[2:].split(":", 1)
        out[k.strip()] = v.strip()
    return out


def view(k: int = 1) -> ProgramView:
    return ProgramView("swe-0001", 0.0, k, k, 1.5 * k, 4000 + 100 * k, 0, True, 4000, False, None, "device",
                       "bash", 10.0 * k, 10.0 * k + 0.5, (0.5,) * k, ("bash",) * k, (50,) * k, (4000,) * k)


def signals(now: float) -> Signals:
    return Signals(now, 0.4, (InstanceView(0, 3, 1, 0.4, 50_000, True), InstanceView(1, 1, 0, 0.1, 90_000, False)))


def drive(policy, axis: str, calls: int) -> list:
    out = []
    for k in range(1, calls + 1):
        now = 10.0 * k + 1.0
        policy.bind(signals(now))
        if axis == "scheduling":
            out.append(policy.priority(view(k), now))
        elif axis == "routing":
            out.append(policy.select(view(k), signals(now).instances, now))
        else:
            out.append(policy.on_turn_arrival(view(k), now))
            out.append(policy.on_turn_complete(view(k), f"req-{k}", now + 1.0))
    return out


def run_ungated(path: Path, audit: bool, canary: Path) -> tuple[str, str]:
    h = header(path)
    limits = dict(kv.split("=") for kv in h.get("limits", "").split())
    calls = int(limits.pop("calls", 3))
    kw = {"decision_timeout_s": 1.0, "cpu_budget_s": 10.0, "load_timeout_s": 5.0}
    kw.update({k: float(v) for k, v in limits.items()})
    policy = None
    try:
        src = path.read_text(encoding="utf-8").replace(CANARY_IN_CORPUS, str(canary))
        policy = load_sandboxed_policy(src, h["axis"], gate=False, audit=audit, **kw)
        values = drive(policy, h["axis"], calls)
        return "ok", repr(values)[:200]
    except SandboxViolation as e:
        return "violation", str(e)
    finally:
        if policy is not None:
            pid = policy.sandbox.keeper_pid
            policy.close()
            assert not _group_alive(pid), f"{path.name}: processes of the worker's group survived"


def _group_alive(pgid: int) -> bool:
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def sysv_key_space() -> dict[str, str]:
    """Every SysV message queue, shared memory segment and semaphore set of this IPC namespace."""
    out = {}
    for kind in ("msg", "shm", "sem"):
        try:
            out[kind] = Path(f"/proc/sysvipc/{kind}").read_text()
        except OSError:
            out[kind] = ""
    return out


def xattrs(p: Path) -> list[str]:
    try:
        return sorted(os.listxattr(p))
    except OSError:
        return []


@pytest.fixture()
def canary():
    """A world-writable directory (so only the sandbox stops a write) and the SysV key space:
    both must be unchanged after each candidate."""
    d = Path(tempfile.mkdtemp(prefix="agentservesim-canary-", dir="/tmp"))
    os.chmod(d, 0o1777)
    before = sysv_key_space()
    yield d
    left = sorted(p.name for p in d.iterdir())
    attrs = xattrs(d)
    shutil.rmtree(d, ignore_errors=True)
    assert not left, f"a hostile candidate wrote {left}"
    assert not attrs, f"a hostile candidate set the extended attributes {attrs}"
    assert sysv_key_space() == before, "a hostile candidate changed the SysV key space"


def test_corpus_is_big_enough():
    assert len(CORPUS) >= 69
    for p in CORPUS:
        h = header(p)
        assert {"hostile", "axis", "gate", "worker"} <= set(h), p.name


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_gate_verdict(path: Path):
    h = header(path)
    src = path.read_text(encoding="utf-8")
    verdict, _, expect = h["gate"].partition(" ")
    if verdict == "pass":
        check_source(src, h["axis"])
        return
    with pytest.raises(SandboxViolation) as ei:
        check_source(src, h["axis"])
    msg = str(ei.value)
    assert "\n" not in msg
    assert expect.strip("'") in msg or not expect, f"{path.name}: {msg}"


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_worker_contains_without_gate(path: Path, canary):
    h = header(path)
    outcome, detail = run_ungated(path, audit=True, canary=canary)
    want, _, expect = h["worker"].partition(" ")
    assert "\n" not in detail and all(" " <= c and c != "\x7f" for c in detail), detail  # one line, inert
    if want != "any":
        assert outcome == want, f"{path.name}: {outcome}: {detail}"
        assert expect in detail, f"{path.name}: {detail}"


@pytest.mark.parametrize("path", [p for p in CORPUS if header(p).get("worker-noaudit") != "any"],
                         ids=lambda p: p.stem)
def test_kernel_layers_contain_without_tripwire(path: Path, canary):
    """Without the audit hook, seccomp/rlimits/namespaces alone still stop the escape."""
    h = header(path)
    outcome, detail = run_ungated(path, audit=False, canary=canary)
    # side effects (files, processes) are checked by the fixtures; here the verdict:
    # failures the tripwire does not cause must still fail, and so must escapes marked so
    w = h["worker"]
    noaudit, _, expect = h.get("worker-noaudit", "").partition(" ")
    if (w.startswith("violation") and "blocked operation" not in w) or noaudit == "violation":
        assert outcome == "violation", f"{path.name}: escaped the kernel layers: {detail}"
        assert expect in detail, f"{path.name}: {detail}"
