"""The isolated worker and its client: schema, fidelity, isolation layers, lifecycle."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sandbox import SandboxViolation
from sandbox import worker as W
from sandbox.client import ViewEncoder, WorkerProcess, load_sandboxed_policy
from simcore.pcb import (OBSERVABLE_INSTANCE_FIELDS, OBSERVABLE_PCB_FIELDS, OBSERVABLE_SIGNAL_FIELDS, InstanceView,
                         ProgramView, Signals)
from simcore.policies import base as B
from simcore.policies.registry import policy_class_from_source
from tests.test_sandbox_gate import LISTING_2, LISTING_4

# The deployable observation schema (DESIGN §2, "Causal observation boundary"). Adding a
# field to ProgramView must be a conscious decision: it has to be added here too.
EXPECTED_PCB_FIELDS = {
    "program_id", "arrival_s", "turn_index", "turns_completed", "attained_service_s", "context_tokens",
    "last_instance", "kv_resident", "kv_resident_tokens", "kv_protected", "protect_until", "kv_tier",
    "tool_name", "gap_started_s", "release_s", "returned_tool_durations", "returned_tool_names",
    "completed_output_tokens", "completed_prompt_tokens",
}
HIDDEN = {"output_tokens", "tool_duration_s", "calls", "program", "remaining_calls", "prompt_tokens",
          "shared_prefix_tokens", "finished_s", "meta"}

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


# --------------------------------------------------------------------------- schema
def test_observation_schema_is_exactly_the_allow_list():
    assert OBSERVABLE_PCB_FIELDS == EXPECTED_PCB_FIELDS
    assert set(W.VIEW_FIELDS) == OBSERVABLE_PCB_FIELDS and len(W.VIEW_FIELDS) == len(OBSERVABLE_PCB_FIELDS)
    assert set(W.INSTANCE_FIELDS) == OBSERVABLE_INSTANCE_FIELDS
    assert set(W.SIGNAL_FIELDS) == OBSERVABLE_SIGNAL_FIELDS
    assert not (HIDDEN & (OBSERVABLE_PCB_FIELDS | OBSERVABLE_INSTANCE_FIELDS | OBSERVABLE_SIGNAL_FIELDS))


def test_view_rebuilt_in_worker_equals_the_original():
    wp = ViewEncoder()
    W._HISTORY.clear()
    for v in (pview(k=1), pview(k=3), pview(k=2, returned_tool_durations=(9.0, 9.5))):  # last: not an append
        row = wp.view(v)
        got = W.make_view(row)
        for f in W.VIEW_FIELDS:
            assert getattr(got, f) == getattr(v, f), f
            assert type(getattr(got, f)) is type(getattr(v, f)), f
        assert got.gap_elapsed_s(9.5) == v.gap_elapsed_s(9.5)
        with pytest.raises(AttributeError):
            got.context_tokens = 1  # type: ignore[misc]
    s = W.make_signals([1.0, 0.5, [list(x) for x in [(0, 2, 1, 0.5, 1000, True)]]])
    assert s.instances[0].inflight == 3 and s.kv_utilization == 0.5


def test_worker_base_classes_mirror_simcore():
    v = pview()
    for wb, sb, calls in ((W.RetentionPolicy, B.RetentionPolicy, [("on_turn_complete", (v, "r", 1.0)),
                                                                   ("on_turn_arrival", (v, 1.0))]),
                          (W.SchedulingPolicy, B.SchedulingPolicy, [("priority", (v, 1.0))]),
                          (W.RoutingPolicy, B.RoutingPolicy, [("select", (v, (), 1.0))])):
        assert wb.axis == sb.axis and wb.engine_args == sb.engine_args
        for name, args in calls:
            assert getattr(wb(), name)(*args) == getattr(sb(), name)(*args)


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
    assert log_a == log_b and len(log_a) > 500
    assert ra.summary["mean_jct_s"] == rb.summary["mean_jct_s"]


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
            try:
                raise ValueError("x")
            except ValueError as e:
                f = e.__traceback__.tb_frame
            while "sys" not in f.f_globals:
                f = f.f_back
            names = list(f.f_globals["sys"].modules)
            bad = [n for n in names if n.split(".")[0] in ("simcore", "sandbox", "numpy", "pandas", "configs")]
            return len(bad) * 1000 + min(len(names), 999)
    ''')
    pol = load_sandboxed_policy(src, "scheduling", gate=False)
    try:
        pol.bind(sig())
        v = pol.priority(pview(), 8.0)
    finally:
        pol.close()
    assert v < 1000, "simulator/trace modules are loaded in the worker"


# --------------------------------------------------------------------------- isolation
def test_isolation_layers_reported():
    pol = load_sandboxed_policy(LISTING_4, "scheduling")
    try:
        layers = pol.sandbox_layers
    finally:
        pol.close()
    assert set(layers) >= {"drop_root", "netns", "rlimits", "pdeathsig", "seccomp", "audit_tripwire"}
    assert all(v == "on" or v.startswith("off") for v in layers.values())
    assert layers["rlimits"] == "on" and layers["pdeathsig"] == "on" and layers["audit_tripwire"] == "on"
    if sys.platform == "linux" and os.uname().machine in ("x86_64", "aarch64"):
        assert layers["seccomp"] == "on"


def test_violation_stops_the_worker_for_good():
    src = "class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n        return 1 / 0\n"
    pol = load_sandboxed_policy(src, "scheduling")
    try:
        pol.bind(sig())
        with pytest.raises(SandboxViolation, match="priority raised ZeroDivisionError"):
            pol.priority(pview(), 8.0)
        with pytest.raises(SandboxViolation, match="stopped"):
            pol.priority(pview(), 8.0)
        assert pol._worker.proc.wait(timeout=5) is not None
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
        assert pol._worker.proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        pol.close()


def test_worker_dies_with_its_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f'''
        import sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from sandbox.client import load_sandboxed_policy
        pol = load_sandboxed_policy({LISTING_4!r}, "scheduling")
        print(pol._worker.proc.pid, flush=True)
        time.sleep(60)
    '''))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        os.kill(pid, 0)  # alive
        parent.kill()    # SIGKILL: no atexit, no finalizers; only PDEATHSIG can stop the worker
        parent.wait(timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    state = fh.read().rsplit(")", 1)[1].split()[0]
                if state == "Z":
                    break
            except FileNotFoundError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the worker outlived its parent")
    finally:
        parent.kill()


def test_close_and_garbage_collection_kill_the_worker():
    import gc
    pol = load_sandboxed_policy(LISTING_4, "scheduling")
    proc = pol._worker.proc
    del pol
    gc.collect()
    assert proc.wait(timeout=5) is not None


def test_constant_hooks_skip_the_round_trip_but_not_the_rules():
    from simcore.sim import simulate
    from tests.test_sandbox_gate import LISTING_1
    cls = policy_class_from_source(LISTING_1, "retention")
    log_a: list = []
    simulate("rtx70b_swe10_0.1", decision_log=log_a, retention=cls())
    pol = load_sandboxed_policy(LISTING_1, "retention")
    try:
        log_b: list = []
        simulate("rtx70b_swe10_0.1", decision_log=log_b, retention=pol)
        assert log_a == log_b
        assert pol._worker.calls == sum(1 for e in log_a if e[2] == "on_turn_complete")
    finally:
        pol.close()
    bad = "class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n        return 'soon'\n"
    pol = load_sandboxed_policy(bad, "scheduling")
    try:
        with pytest.raises(SandboxViolation, match="priority must be an int"):
            pol.priority(pview(), 1.0)
    finally:
        pol.close()


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


# --------------------------------------------------------------------------- each kernel layer
# With the gate skipped and the audit tripwire off, a subclass walk reaches the worker's
# own `os`; these probes show which layer stops what, one layer removed at a time.
_OS = '''
def _os():
    for c in ().__class__.__base__.__subclasses__():
        if c.__name__ == "_wrap_close":
            return c.__init__.__globals__
'''


def probe(body: str, **kw) -> int:
    src = _OS + "\n\nclass P(SchedulingPolicy):\n    def priority(self, pcb, now):\n        os = _os()\n" + \
        textwrap.indent(textwrap.dedent(body), " " * 8)
    pol = load_sandboxed_policy(src, "scheduling", gate=False, audit=False, **kw)
    try:
        pol.bind(sig())
        return pol.priority(pview(), 8.0)
    finally:
        pol.close()


needs_linux = pytest.mark.skipif(sys.platform != "linux", reason="Linux kernel layers")


@needs_linux
def test_seccomp_is_what_refuses_open():
    body = '''
    try:
        os["close"](os["open"]("/proc/self/stat", os["O_RDONLY"]))
        return 1
    except Exception as e:
        return 100 + e.errno
    '''
    assert probe(body) == 101             # EPERM from the seccomp filter
    assert probe(body, seccomp=False) == 1


@needs_linux
def test_rlimits_refuse_processes_and_file_writes():
    fork = '''
    try:
        pid = os["fork"]()
        if pid == 0:
            os["_exit"](0)
        return 1
    except Exception as e:
        return 100 + e.errno
    '''
    assert probe(fork, seccomp=False) == 111  # EAGAIN: RLIMIT_NPROC=0 alone stops fork
    assert probe(fork) == 101                 # EPERM: and seccomp before it
    import shutil
    import tempfile
    from pathlib import Path
    d = Path(tempfile.mkdtemp(dir="/tmp"))  # reachable by the worker's user (nobody)
    d.chmod(0o777)
    write = f'''
    fd = os["open"]("{d}/f", os["O_WRONLY"] | os["O_CREAT"], 0o666)
    os["write"](fd, b"data")
    return 1
    '''
    try:
        # RLIMIT_FSIZE=0 (Python ignores SIGXFSZ, so the write fails with EFBIG)
        with pytest.raises(SandboxViolation, match="File too large"):
            probe(write, seccomp=False)
        assert all(p.stat().st_size == 0 for p in d.iterdir())
    finally:
        shutil.rmtree(d, ignore_errors=True)


@needs_linux
def test_network_namespace_has_no_network():
    """The worker's network namespace has no interface but a loopback that is down."""
    body = '''
    fd = os["open"]("/proc/self/net/dev", os["O_RDONLY"])
    text = os["read"](fd, 65536).decode()
    names = [line.split(":")[0].strip() for line in text.splitlines()[2:]]
    return len([n for n in names if n != "lo"])
    '''
    pol = load_sandboxed_policy(LISTING_4, "scheduling")
    netns = pol.sandbox_layers["netns"]
    pol.close()
    if netns != "on":
        pytest.skip(f"network namespace not available here: {netns}")
    assert probe(body, seccomp=False) == 0   # (seccomp off only so that the probe may open the file)


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
    # reference: the same source in-process (dont_inherit: this test module's
    # `from __future__ import annotations` must not turn the dataclass annotations into strings)
    import math
    import types
    mod = types.ModuleType("reference_policy")
    mod.__dict__.update(SchedulingPolicy=B.SchedulingPolicy, math=math)
    exec(compile(src, "<reference>", "exec", dont_inherit=True), mod.__dict__)  # noqa: S102 - test source
    ref = mod.P()
    ref.bind(sig())
    assert got == [ref.priority(pview(k=k), 8.0) for k in (1, 2, 3)]


# --------------------------------------------------------------------------- posted calls
def test_pipelined_arrivals_keep_decisions_and_catch_failures():
    from simcore.sim import simulate
    pol = load_sandboxed_policy(LISTING_2, "retention")
    try:
        assert pol._post == {"on_turn_arrival": "release"}
        log: list = []
        simulate("rtx70b_swe10_0.1", decision_log=log, retention=pol)
        pol.flush()
        assert not pol._worker._outbox
        assert pol._worker.calls == sum(1 for e in log if e[1] == "retention")  # all ran in the worker
    finally:
        pol.close()
    # an error inside a posted hook surfaces at the next call, with its own reason
    src = textwrap.dedent('''
    class P(RetentionPolicy):
        def __init__(self):
            self.n = 0

        def on_turn_complete(self, pcb, request_id, now):
            return ("protect", now + 1.0)

        def on_turn_arrival(self, pcb, now):
            self.n += 1
            if self.n == 2:
                raise ValueError("second arrival")
            return "release"
    ''')
    pol = load_sandboxed_policy(src, "retention")
    try:
        pol.bind(sig())
        # the proxy hands back the parsed decision (parse_retention passes it through)
        assert pol.on_turn_arrival(pview(), 1.0) == B.parse_retention("release")
        assert pol.on_turn_arrival(pview(), 2.0).kind == "release"   # answered before it ran
        with pytest.raises(SandboxViolation, match="on_turn_arrival raised ValueError: second arrival"):
            pol.on_turn_complete(pview(), "r", 3.0)
    finally:
        pol.close()
    # a worker answering something else than its code can return is caught too
    pol = load_sandboxed_policy(LISTING_2, "retention")
    try:
        pol._post = {"on_turn_arrival": "evict"}
        pol.bind(sig())
        pol.on_turn_arrival(pview(), 1.0)
        with pytest.raises(SandboxViolation, match="can only return 'evict'"):
            pol.flush()
    finally:
        pol.close()


def test_pipelined_hook_still_has_a_deadline():
    src = textwrap.dedent('''
    class P(RetentionPolicy):
        def on_turn_complete(self, pcb, request_id, now):
            return "release" if now > 0 else "evict"

        def on_turn_arrival(self, pcb, now):
            while now > 0:
                now += 1
            return "release"
    ''')
    pol = load_sandboxed_policy(src, "retention", decision_timeout_s=0.3)
    try:
        pol.bind(sig())
        pol.on_turn_arrival(pview(), 1.0)
        t = time.monotonic()
        with pytest.raises(SandboxViolation, match="deadline"):
            pol.on_turn_complete(pview(), "r", 2.0)
        assert time.monotonic() - t < 3.0
    finally:
        pol.close()


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
            assert pol._worker.calls == sum(1 for e in want if e[1] == "scheduling")
            frames[defer] = pol._worker.frames
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


def test_views_behave_like_the_in_process_dataclasses():
    """A view must not offer what simcore's ProgramView lacks (indexing, iteration, len)."""
    W._HISTORY.clear()
    wp = ViewEncoder()
    v = pview()
    got = W.make_view(wp.view(v))
    for op in (lambda x: x[0], lambda x: list(x), lambda x: len(x)):
        with pytest.raises(TypeError):
            op(v)
        with pytest.raises(TypeError):
            op(got)
    assert repr(got) == repr(v)
    inst = W.make_instances([[0, 2, 1, 0.5, 1000, True]])[0]
    assert repr(inst) == repr(InstanceView(0, 2, 1, 0.5, 1000, True))


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
    w = pol._worker
    try:
        fcntl.fcntl(w._out, 1031, 4096)  # F_SETPIPE_SZ
    except OSError:
        pol.close()
        pytest.skip("cannot resize pipes here")
    sent = []
    real_send = w._send
    w._send = lambda msg, *a: (sent.append(len(msg)), real_send(msg, *a))[1]
    try:
        log: list = []
        simulate("rtx70b_swe_0.1", decision_log=log, scheduling=pol)
        assert log == want
        assert w.frames <= 8  # 1,705 calls in batches of at most 256
        assert sent  # frames larger than the pipe: finished by _send after a partial write
    finally:
        pol.close()
