"""The isolated worker and its client: one schema, fidelity, layers, lifecycle, deferral.

The kernel layers one syscall at a time are in tests/test_sandbox_kernel.py; the hostile
corpus in tests/test_sandbox_hostile.py.
"""
from __future__ import annotations

import builtins
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sandbox import SandboxUnavailable, SandboxViolation
from sandbox.client import load_sandboxed_policy
from sandbox.process import REQUIRED_LAYERS, worker_config
from sandbox.wire import ViewEncoder, select_fields
from sandbox.worker import serve as S
from sandbox.worker import views as W
from simcore.pcb import (
    OBSERVABLE_INSTANCE_FIELDS,
    OBSERVABLE_PCB_FIELDS,
    OBSERVABLE_SIGNAL_FIELDS,
    InstanceView,
    ProgramView,
    Signals,
    observation_schema,
)
from simcore.policies import base as B
from simcore.policies.registry import policy_class_from_source
from tests.helpers import EXPECTED_PCB_FIELDS
from tests.test_sandbox_gate import LISTING_1, LISTING_2, LISTING_4

HIDDEN = {"output_tokens", "tool_duration_s", "calls", "program", "remaining_calls", "prompt_tokens",
          "shared_prefix_tokens", "finished_s", "meta"}
WORKER_DIR = Path(__file__).resolve().parent.parent / "sandbox" / "worker"

COUNTER = '''
class Counter(SchedulingPolicy):
    def __init__(self):
        self.n = 0

    def priority(self, pcb, now):
        self.n += 1
        return self.n * 10 + len(pcb.returned_tool_durations)
'''


def pview(pid: str = "swe-0001", k: int = 2, **kw) -> ProgramView:
    d = dict(program_id=pid, arrival_s=1.0, turn_index=k, turns_completed=k, attained_service_s=2.5,
             context_tokens=5000, last_instance=0, kv_resident=True, kv_resident_tokens=4096,
             kv_protected=True, protect_until=9.0, kv_tier="device", tool_name="bash", gap_started_s=7.0,
             release_s=8.0, returned_tool_durations=tuple(0.5 + i for i in range(k)),
             returned_tool_names=("bash",) * k, completed_output_tokens=(100,) * k,
             completed_prompt_tokens=(4000,) * k)
    d.update(kw)
    return ProgramView(**d)


def sig(now: float = 8.0) -> Signals:
    return Signals(now, 0.5, (InstanceView(0, 2, 1, 0.5, 1000, True), InstanceView(1, 0, 0, 0.1, 9000, False)))


class Died(Exception):
    """What the worker's die() does (write a reason and exit), raised instead in this process."""


def _die(reason: str) -> None:
    raise Died(reason)


def worker_views(wire: dict | None = None):
    """sandbox/worker/views.py in this process, prepared as the worker prepares it."""
    W.prepare(observation_schema(), vars(builtins), _die)
    W.configure(wire or select_fields())
    return W


# --------------------------------------------------------------------------- one schema
def test_observation_schema_is_exactly_the_allow_list():
    schema = observation_schema()
    assert OBSERVABLE_PCB_FIELDS == EXPECTED_PCB_FIELDS == set(schema["ProgramView"]["fields"])
    assert set(schema["InstanceView"]["fields"]) == OBSERVABLE_INSTANCE_FIELDS
    assert set(schema["Signals"]["fields"]) == OBSERVABLE_SIGNAL_FIELDS
    assert not (HIDDEN & (OBSERVABLE_PCB_FIELDS | OBSERVABLE_INSTANCE_FIELDS | OBSERVABLE_SIGNAL_FIELDS))
    assert schema["ProgramView"]["members"]["gap_elapsed_s"]["reads"] == ["gap_started_s"]
    assert schema["InstanceView"]["members"]["inflight"]["reads"] == ["running", "waiting"]


def test_the_worker_keeps_no_copy_of_the_schema_or_the_lists():
    """Field names, the allow-lists and the base classes reach the worker at start-up only."""
    text = "\n".join(p.read_text() for p in WORKER_DIR.glob("*.py"))
    for name in EXPECTED_PCB_FIELDS | {"kv_utilization", "holds_program_kv", "heapq", "statistics",
                                       "SchedulingPolicy", "on_turn_complete"} - {"release_s"}:
        assert f'"{name}"' not in text and f"'{name}'" not in text, name


def test_view_rebuilt_in_worker_equals_the_original():
    w = worker_views()
    enc = ViewEncoder()
    for v in (pview(k=1), pview(k=3), pview(k=2, returned_tool_durations=(9.0, 9.5))):  # last: not an append
        got = w.make_view(enc.view(v))
        for f in EXPECTED_PCB_FIELDS:
            assert getattr(got, f) == getattr(v, f), f
            assert type(getattr(got, f)) is type(getattr(v, f)), f
        assert got.gap_elapsed_s(9.5) == v.gap_elapsed_s(9.5)
        assert repr(got) == repr(v) and hash(got) == hash(v) and got == w.make_view(enc.view(v))
    s = w.make_signals(enc.signals(sig(), 8.0))
    assert s.instances[0].inflight == 3 and s.kv_utilization == 0.5 and repr(s) == repr(sig())


def test_views_behave_like_the_in_process_dataclasses():
    """Everything a policy can do with a view gives what simcore's frozen dataclass gives."""
    import dataclasses
    w = worker_views()
    v = pview()
    got = w.make_view(ViewEncoder().view(v))
    for op in (lambda x: x[0], lambda x: list(x), lambda x: len(x), lambda x: 1 in x, lambda x: x < x,
               lambda x: x + x, lambda x: x * 2, lambda x: 2 * x, lambda x: (1,) + x, lambda x: (1,) < x,
               lambda x: x >= ("swe-0001",)):
        for obj in (v, got):
            with pytest.raises(TypeError):
                op(obj)
    for obj in (v, got):
        with pytest.raises(dataclasses.FrozenInstanceError):
            obj.context_tokens = 1
        with pytest.raises(AttributeError):
            obj.count  # noqa: B018 - a tuple method the dataclass does not have
        assert bool(obj) and obj != tuple(dataclasses.astuple(v))
        assert dataclasses.is_dataclass(obj)
        assert [f.name for f in dataclasses.fields(obj)] == [f.name for f in dataclasses.fields(v)]
    assert dataclasses.asdict(got) == dataclasses.asdict(v)
    assert dataclasses.replace(got, turn_index=7).turn_index == 7 == dataclasses.replace(v, turn_index=7).turn_index
    inst = w.make_instances([[0, 2, 1, 0.5, 1000, True]])[0]
    assert repr(inst) == repr(InstanceView(0, 2, 1, 0.5, 1000, True)) and inst.index == 0


def test_a_field_the_source_never_names_ends_the_worker_instead_of_differing():
    """Only named fields are sent; reading another one, or using a partial view whole, is a
    reason -- never a silently different value (so the fitness stays the file's)."""
    import dataclasses
    wire = select_fields(frozenset({"context_tokens", "completed_output_tokens"}))
    w = worker_views(wire)
    try:
        got = w.make_view(ViewEncoder(wire).view(pview(k=3)))
        assert got.context_tokens == 5000 and got.completed_output_tokens == (100, 100, 100)
        for use in (lambda x: x.attained_service_s, repr, hash, lambda x: x == x, dataclasses.asdict,
                    lambda x: x.gap_elapsed_s(1.0)):
            with pytest.raises(Died, match=r"field ProgramView\.|whole ProgramView"):
                use(got)
        empty = w.empty_signals()  # a source that never reads signals still gets an object
        assert empty is not None
        with pytest.raises(Died, match="Signals.now"):
            empty.now  # noqa: B018
    finally:
        worker_views()


def test_worker_base_classes_are_simcores_own_source():
    cfg = worker_config()
    bases = S.policy_bases(cfg, vars(builtins))
    v = pview()
    for axis, cls in B.AXIS_BASES.items():
        wb = bases[cls.__name__]
        assert wb.axis == cls.axis and wb.engine_args == cls.engine_args and wb.__module__ == cls.__module__
        for hook in B.AXIS_HOOKS[axis]:
            args = {"on_turn_complete": (v, "r", 1.0), "on_turn_arrival": (v, 1.0), "priority": (v, 1.0),
                    "select": (v, (), 1.0)}[hook]
            assert getattr(wb(), hook)(*args) == getattr(cls(), hook)(*args)


# --------------------------------------------------------------------------- fidelity
@pytest.mark.parametrize("axis,src", [("retention", LISTING_2), ("scheduling", LISTING_4)])
def test_sandboxed_simulation_makes_the_same_decisions(axis: str, src: str):
    from simcore.sim import simulate
    cls = policy_class_from_source(src, axis)
    log_a: list = []
    ra = simulate("rtx70b_swe10_0.1", decision_log=log_a, **{axis: cls()})
    pol = load_sandboxed_policy(src, axis)
    try:
        log_b: list = []
        rb = simulate("rtx70b_swe10_0.1", decision_log=log_b, **{axis: pol})
    finally:
        pol.close()
    assert [tuple(e) for e in log_a] == [tuple(e) for e in log_b] and len(log_a) > 500
    assert ra.summary["mean_jct_s"] == rb.summary["mean_jct_s"]


def test_every_hook_is_answered_by_the_worker():
    """Nothing is answered on the candidate's behalf: even a hook whose text is `return
    "release"` (Listing 1's on_turn_arrival) runs in the worker, once per decision."""
    from simcore.sim import simulate
    for src in (LISTING_1, LISTING_2):
        pol = load_sandboxed_policy(src, "retention")
        try:
            log: list = []
            simulate("rtx70b_swe10_0.1", decision_log=log, retention=pol)
            assert pol.sandbox.calls == sum(1 for e in log if e[1] == "retention") > 400
        finally:
            pol.close()


# the hostile corpus's class 6: the method is replaced after the class body ran, under a name built
# at run time (a parent predicting answers from the text would score another policy)
CLASS_CHANGED_AFTER_BODY = (Path(__file__).parent / "hostile" / "66_class_swap_after_body.py").read_text()


def test_a_class_changed_after_its_body_scores_what_trusted_scores():
    """Evaluated = defined: the sandbox runs what the file does, not what its text suggests."""
    from simcore.sim import simulate
    cls = policy_class_from_source(CLASS_CHANGED_AFTER_BODY, "scheduling")
    trusted = simulate("rtx70b_swe_0.1", scheduling=cls())
    fcfs_like = simulate("rtx70b_swe_0.1", scheduling="fcfs")
    pol = load_sandboxed_policy(CLASS_CHANGED_AFTER_BODY, "scheduling", gate=False)  # dunders: gate off
    try:
        boxed = simulate("rtx70b_swe_0.1", scheduling=pol)
    finally:
        pol.close()
    assert boxed.summary["mean_jct_s"] == trusted.summary["mean_jct_s"]
    assert trusted.summary["mean_jct_s"] != fcfs_like.summary["mean_jct_s"]


def test_routing_proxy_and_engine_args():
    src = "class R(RoutingPolicy):\n    def select(self, pcb, inflight, now):\n" \
          "        return min(inflight, key=lambda v: v.inflight).index\n"
    pol = load_sandboxed_policy(src, "routing")
    try:
        assert isinstance(pol, B.RoutingPolicy) and pol.engine_args == {}
        pol.bind(sig())
        assert pol.select(pview(), sig().instances, 8.0) == 1
    finally:
        pol.close()
    pol = load_sandboxed_policy(LISTING_4, "scheduling")
    try:
        assert isinstance(pol, B.SchedulingPolicy) and pol.engine_args == {"scheduling_policy": "priority"}
        assert pol.name == "EvolvedScheduling"
    finally:
        pol.close()


def test_state_persists_and_history_deltas_are_exact():
    pol = load_sandboxed_policy(COUNTER, "scheduling")
    try:
        got = []
        for k in (1, 2, 3, 1):  # the last view is shorter: the encoder must resend in full
            pol.bind(sig())
            got.append(pol.priority(pview(k=k), 8.0))
        assert got == [11, 22, 33, 41]
        pol.bind(None)  # type: ignore[arg-type]
        assert pol.priority(pview(pid="other", k=0), 8.0) == 50
    finally:
        pol.close()


def test_extra_view_attributes_never_reach_the_worker():
    class LeakyView:
        def __init__(self, v: ProgramView) -> None:
            self._v = v
            self.remaining_output_tokens = 123

        def __getattr__(self, name: str):
            return getattr(self._v, name)

    src = "class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n        return pcb.remaining_output_tokens\n"
    pol = load_sandboxed_policy(src, "scheduling")
    try:
        pol.bind(sig())
        with pytest.raises(SandboxViolation, match="AttributeError"):
            pol.priority(LeakyView(pview()), 8.0)
    finally:
        pol.close()


def test_worker_holds_no_simulator_modules():
    src = textwrap.dedent('''
    class P(SchedulingPolicy):
        def priority(self, pcb, now):
            g = min.__self__.__dict__["__import__"]("sys")
            names = list(g.modules)
            bad = [n for n in names if n.split(".")[0] in ("simcore", "sandbox", "numpy", "pandas", "configs")]
            return len(bad) * 1000 + min(len(names), 999)
    ''')
    pol = load_sandboxed_policy(src, "scheduling", gate=False, audit=False)  # the tripwire would stop the import
    try:
        pol.bind(sig())
        v = pol.priority(pview(), 8.0)
    finally:
        pol.close()
    assert v < 1000, "simulator/trace modules are loaded in the worker"


# --------------------------------------------------------------------------- layers
def test_every_layer_is_on_here_and_reported_before_the_candidate_runs():
    pol = load_sandboxed_policy(LISTING_4, "scheduling")
    try:
        layers = pol.sandbox_layers
    finally:
        pol.close()
    assert set(layers) == set(REQUIRED_LAYERS)
    if sys.platform == "linux" and os.uname().machine in ("x86_64", "aarch64"):
        assert all(v.startswith("on") for v in layers.values()), layers


def test_a_forged_layer_report_is_caught_from_outside(monkeypatch):
    """The parent checks what /proc shows; a layer reported on but absent is off."""
    from sandbox import process
    real = process.verify_layers

    def claim_more(pid, layers):
        out = real(pid, layers)
        assert all(v.startswith("on") for v in out.values())  # the honest report holds up
        with open(f"/proc/{pid}/status") as fh:
            assert "Seccomp:\t2" in fh.read()
        return out
    monkeypatch.setattr(process, "verify_layers", claim_more)
    load_sandboxed_policy(LISTING_4, "scheduling").close()
    me = os.getpid()  # this process has no seccomp filter and all its namespaces: every check fails
    got = real(me, {k: "on" for k in REQUIRED_LAYERS})
    for k in ("seccomp", "no_new_privs", "pidns", "netns", "ipcns", "mntns", "utsns", "userns", "fs_root",
              "rlimits"):
        assert got[k].startswith("off: reported on, but"), (k, got[k])


@pytest.mark.parametrize("layer", ["userns", "netns", "pidns", "landlock", "seccomp", "fs_root"])
def test_a_missing_layer_refuses_to_start_unless_weak_sandboxes_are_allowed(layer: str):
    """No silent degradation: a layer made unavailable on purpose stops the worker before the
    source is sent; --allow-weak-sandbox runs it, and the report says what is off."""
    with pytest.raises(SandboxUnavailable, match=rf"{layer} \(unavailable \(simulated.*--allow-weak-sandbox"):
        load_sandboxed_policy(LISTING_4, "scheduling", simulate_unavailable=(layer,))
    pol = load_sandboxed_policy(LISTING_4, "scheduling", simulate_unavailable=(layer,), allow_weak_sandbox=True)
    try:
        assert pol.sandbox_layers[layer].startswith("off: unavailable")
        pol.bind(sig())
        assert isinstance(pol.priority(pview(), 8.0), int)
    finally:
        pol.close()


def test_without_a_user_namespace_none_of_the_namespaces_exist():
    pol = load_sandboxed_policy(LISTING_4, "scheduling", simulate_unavailable=("userns",), allow_weak_sandbox=True)
    try:
        off = {k for k, v in pol.sandbox_layers.items() if not v.startswith("on")}
    finally:
        pol.close()
    if os.geteuid() == 0:  # nobody cannot unshare the others without a user namespace
        assert {"userns", "pidns", "ipcns", "utsns", "netns", "mntns", "fs_root"} <= off
    assert "seccomp" not in off and "landlock" not in off


def test_violation_stops_the_worker_for_good():
    src = "class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n        return 1 / 0\n"
    pol = load_sandboxed_policy(src, "scheduling")
    try:
        pol.bind(sig())
        with pytest.raises(SandboxViolation, match="priority raised ZeroDivisionError"):
            pol.priority(pview(), 8.0)
        with pytest.raises(SandboxViolation, match="stopped"):
            pol.priority(pview(), 8.0)
        assert pol.sandbox.proc.wait(timeout=5) is not None
    finally:
        pol.close()


def test_deadline_kills_the_process_group_quickly():
    src = "class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n        while True:\n            pass\n"
    pol = load_sandboxed_policy(src, "scheduling", decision_timeout_s=0.3)
    try:
        pol.bind(sig())
        t = time.monotonic()
        with pytest.raises(SandboxViolation, match="deadline of 0.3 s exceeded while priority"):
            pol.priority(pview(), 8.0)
        assert time.monotonic() - t < 3.0
        assert pol.sandbox.proc.wait(timeout=5) == -signal.SIGKILL
        assert not pol.sandbox.alive
    finally:
        pol.close()


def test_cpu_budget_is_enforced_by_the_kernel():
    src = "class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n        while True:\n            pass\n"
    pol = load_sandboxed_policy(src, "scheduling", decision_timeout_s=30.0, cpu_budget_s=1.0)
    try:
        pol.bind(sig())
        with pytest.raises(SandboxViolation, match="exceeded its CPU budget of 1 s while priority"):
            pol.priority(pview(), 8.0)
    finally:
        pol.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_worker_dies_with_its_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f'''
        import sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from sandbox.client import load_sandboxed_policy
        pol = load_sandboxed_policy({LISTING_4!r}, "scheduling")
        print(pol.sandbox.pid, pol.sandbox.keeper_pid, flush=True)
        time.sleep(60)
    '''))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in parent.stdout.readline().split()]
        assert all(_alive(p) for p in pids)
        parent.kill()    # SIGKILL: no atexit, no finalizers; only PDEATHSIG can stop the worker
        parent.wait(timeout=10)
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids):
            if time.monotonic() > deadline:
                pytest.fail("the worker outlived its parent")
            time.sleep(0.05)
    finally:
        parent.kill()


def test_close_and_garbage_collection_kill_the_worker():
    import gc
    pol = load_sandboxed_policy(LISTING_4, "scheduling")
    worker, proc = pol.sandbox.pid, pol.sandbox.proc
    del pol
    gc.collect()
    assert proc.wait(timeout=5) is not None
    deadline = time.monotonic() + 5
    while _alive(worker):
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_decisions_are_deterministic_across_workers():
    """String hashing is seeded identically in every worker, so set order cannot differ."""
    src = textwrap.dedent('''
    class P(SchedulingPolicy):
        def priority(self, pcb, now):
            names = {"bash", "edit", "search", "python", "grep", "ls", "cat", "find", pcb.program_id}
            return sum((i + 1) * len(n) * (7 ** i) for i, n in enumerate(names)) % 1000003
    ''')
    got = set()
    for _ in range(3):
        pol = load_sandboxed_policy(src, "scheduling")
        try:
            got.add(pol.priority(pview(), 1.0))
        finally:
            pol.close()
    assert len(got) == 1


def test_numpy_scalars_arrive_as_plain_numbers():
    """marshal would write numpy scalars as raw bytes; the client normalises them."""
    import numpy as np
    src = textwrap.dedent('''
    class P(SchedulingPolicy):
        def priority(self, pcb, now):
            ok = (isinstance(pcb.attained_service_s, float) and isinstance(pcb.context_tokens, int)
                  and isinstance(self.signals.kv_utilization, float)
                  and all(isinstance(d, float) for d in pcb.returned_tool_durations))
            return pcb.context_tokens + (1 if ok else 0)
    ''')
    pol = load_sandboxed_policy(src, "scheduling")
    try:
        v = pview(attained_service_s=np.float64(2.5), context_tokens=np.int64(5000),
                  returned_tool_durations=(np.float64(0.5), 1.5))
        pol.bind(Signals(np.float64(8.0), np.float64(0.5), (InstanceView(0, np.int64(2), 1, 0.5, 1000, np.bool_(True)),)))
        assert pol.priority(v, np.float64(8.0)) == 5001
    finally:
        pol.close()


def test_allowed_modules_work_inside_hooks():
    """The tripwire must not fire on ordinary use of the allow-listed modules."""
    src = textwrap.dedent('''
    import bisect
    import enum
    import functools
    import heapq
    import itertools
    import statistics
    from collections import Counter, OrderedDict, defaultdict, deque, namedtuple
    from dataclasses import dataclass, field

    Pair = namedtuple("Pair", "a b")


    class Kind(enum.Enum):
        SHORT = 1
        LONG = 2


    @dataclass(order=True)
    class Item:
        key: float
        tags: list = field(default_factory=list)


    @functools.lru_cache(maxsize=64)
    def slow_square(x):
        return x * x


    class P(SchedulingPolicy):
        def __init__(self):
            self.gaps = defaultdict(list)
            self.recent = deque(maxlen=4)

        def priority(self, pcb, now):
            xs = list(pcb.returned_tool_durations) + [1.0, 2.0, 3.0]
            q = statistics.quantiles(xs, n=4)
            h = []
            for x in xs:
                heapq.heappush(h, Item(x))
            c = Counter(pcb.returned_tool_names)
            od = OrderedDict(sorted(c.items()))
            i = bisect.bisect_left(sorted(xs), statistics.median(xs))
            k = Kind.LONG if pcb.context_tokens > 4000 else Kind.SHORT
            acc = functools.reduce(lambda a, b: a + b, itertools.islice(itertools.count(), 5))
            self.recent.append(Pair(now, k.value))
            return int(q[0] * 10 + h[0].key + len(od) + i + k.value + acc + slow_square(3)
                       + statistics.fmean(xs) + statistics.pstdev(xs) + math.log1p(len(self.recent)))
    ''')
    pol = load_sandboxed_policy(src, "scheduling")
    try:
        pol.bind(sig())
        got = [pol.priority(pview(k=k), 8.0) for k in (1, 2, 3)]
    finally:
        pol.close()
    ref = policy_class_from_source(src, "scheduling")()
    ref.bind(sig())
    assert got == [ref.priority(pview(k=k), 8.0) for k in (1, 2, 3)]


def test_the_functional_enum_api_is_refused_in_the_worker():
    """Enum("E", names) builds attributes from run-time names; the gate cannot see it."""
    src = "import enum\nE = enum.Enum('E', 'a b')\nclass P(SchedulingPolicy):\n    pass\n"
    with pytest.raises(SandboxViolation, match="functional Enum API"):
        load_sandboxed_policy(src, "scheduling")


def test_candidate_text_comes_back_inert():
    """ANSI/OSC sequences and Rich markup in a candidate's exception never reach a terminal raw."""
    src = ("class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n"
           "        raise ValueError('\\x1b[2K\\rverdict: [bold green]ADMISSIBLE[/]\\x07')\n")
    pol = load_sandboxed_policy(src, "scheduling")
    try:
        with pytest.raises(SandboxViolation) as ei:
            pol.priority(pview(), 1.0)
    finally:
        pol.close()
    msg = str(ei.value)
    assert "\x1b" not in msg and "\r" not in msg and "\x07" not in msg and "[bold" not in msg
    assert "\\x1b[2K\\x0dverdict: [ bold green]ADMISSIBLE[ /]\\x07" in msg


# --------------------------------------------------------------------------- deferred priorities
def test_deferred_priorities_decide_as_in_process_with_fewer_round_trips():
    from simcore.sim import simulate
    cls = policy_class_from_source(LISTING_4, "scheduling", "listing4")
    want: list = []
    simulate("rtx70b_swe10_0.1", decision_log=want, scheduling=cls())
    frames = {}
    for defer in (True, False):
        pol = load_sandboxed_policy(LISTING_4, "scheduling", defer=defer)
        try:
            assert pol.defers_priority is defer
            log: list = []
            simulate("rtx70b_swe10_0.1", decision_log=log, scheduling=pol)
            assert log == want
            assert pol.sandbox.calls == sum(1 for e in want if e[1] == "scheduling")
            frames[defer] = pol.sandbox.frames
        finally:
            pol.close()
    calls = sum(1 for e in want if e[1] == "scheduling")
    assert frames[False] == calls  # one round trip per call
    assert frames[True] < 0.8 * calls


def test_deferred_priority_failures_and_deadlines_name_the_hook():
    from simcore.sim import simulate
    src = textwrap.dedent('''
    class P(SchedulingPolicy):
        engine_args = {"scheduling_policy": "fcfs"}

        def __init__(self):
            self.n = 0

        def priority(self, pcb, now):
            self.n += 1
            if self.n == 7:
                raise ValueError("seventh")
            while self.n == 10:
                now += 1
            return self.n
    ''')
    # FCFS never needs an order: every call waits for one batch, whose 7th call raises
    pol = load_sandboxed_policy(src, "scheduling")
    try:
        with pytest.raises(SandboxViolation, match="priority raised ValueError: seventh"):
            simulate("rtx70b_swe10_0.1", scheduling=pol)
    finally:
        pol.close()
    # a call stuck inside a long batch is stopped by its own deadline, not the batch's
    pol = load_sandboxed_policy(src.replace("self.n == 7", "self.n == -1"), "scheduling", decision_timeout_s=0.3)
    try:
        t = time.monotonic()
        with pytest.raises(SandboxViolation, match=r"decision deadline of 0.3 s exceeded while priority \(one of"):
            simulate("rtx70b_swe10_0.1", scheduling=pol)
        assert time.monotonic() - t < 5.0
    finally:
        pol.close()


def test_large_deferred_batches_cross_the_pipe_whole():
    """FCFS defers every priority, so frames carry up to 256 calls with every field (the
    policy prints whole views); with the pipe shrunk to one page, writes and reads come in
    pieces and the slow path must still deliver every call and answer in order."""
    fcntl = pytest.importorskip("fcntl")
    from simcore.sim import simulate
    src = textwrap.dedent('''
    class P(SchedulingPolicy):
        engine_args = {"scheduling_policy": "fcfs"}

        def priority(self, pcb, now):
            return len(repr(pcb)) + len(pcb.completed_output_tokens)
    ''')
    cls = policy_class_from_source(src, "scheduling", "P")
    want: list = []
    simulate("rtx70b_swe_0.1", decision_log=want, scheduling=cls())
    pol = load_sandboxed_policy(src, "scheduling")
    w = pol.sandbox
    try:
        fd = w.proc.stdin.fileno()
        try:
            fcntl.fcntl(fd, 1031, 4096)  # F_SETPIPE_SZ
        except OSError:
            pytest.skip("cannot resize pipes here")
        assert fcntl.fcntl(fd, 1032) == 4096  # F_GETPIPE_SZ
        log: list = []
        simulate("rtx70b_swe_0.1", decision_log=log, scheduling=pol)
        assert log == want
        assert w.frames <= 8  # 1,705 calls in batches of at most 256
        assert w.calls / w.frames > 20  # > 20 calls of > 200 bytes each: every frame outgrew the pipe
    finally:
        pol.close()


# --------------------------------------------------------------------------- deadlines under load
def test_a_starved_worker_is_not_stopped_for_the_machines_load():
    """The decision deadline counts the worker's CPU, not the wall clock: a worker that gets
    no CPU (stopped here with SIGSTOP, as a loaded machine would starve it) still answers."""
    import threading
    pol = load_sandboxed_policy(COUNTER, "scheduling", decision_timeout_s=0.3)
    try:
        pid = pol.sandbox.pid
        os.kill(pid, signal.SIGSTOP)
        threading.Timer(1.0, os.kill, (pid, signal.SIGCONT)).start()  # 3x the deadline, no CPU used
        t = time.monotonic()
        assert pol.priority(pview(k=1), 1.0) == 11
        assert time.monotonic() - t >= 0.9
    finally:
        pol.close()


def test_a_worker_that_neither_computes_nor_answers_is_stopped_at_the_wall_cap():
    pol = load_sandboxed_policy(COUNTER, "scheduling", decision_timeout_s=0.2)
    try:
        os.kill(pol.sandbox.pid, signal.SIGSTOP)
        t = time.monotonic()
        with pytest.raises(SandboxViolation, match="decision deadline of 0.2 s exceeded while priority"):
            pol.priority(pview(), 1.0)
        assert 2.0 <= time.monotonic() - t < 6.0  # the cap: 10x the deadline, at least 2 s more
    finally:
        pol.close()
