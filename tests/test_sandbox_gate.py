"""Static gate and EVOLVE-block marker check."""
from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import SandboxViolation
from sandbox.gate import MAX_NODES, MAX_SOURCE_CHARS, check_source
from sandbox.markers import check_markers
from simcore.packaged import SEED_FILES, seed_source

# Paper Appendix F, Listings 1-4, as policy files (shared with the simulator's tests).
_LISTING_DIR = Path(__file__).resolve().parent / "data" / "listings"
LISTINGS = {"listing1": ("retention", (_LISTING_DIR / "retention_ttl_seed.py").read_text()),
            "listing2": ("retention", (_LISTING_DIR / "retention_evolved.py").read_text()),
            "listing3": ("scheduling", (_LISTING_DIR / "scheduling_plas_seed.py").read_text()),
            "listing4": ("scheduling", (_LISTING_DIR / "scheduling_evolved.py").read_text())}
LISTING_1, LISTING_2, LISTING_3, LISTING_4 = (LISTINGS[f"listing{i}"][1] for i in range(1, 5))


def reject(src: str, axis: str = "scheduling") -> str:
    with pytest.raises(SandboxViolation) as ei:
        check_source(src, axis)
    msg = str(ei.value)
    assert "\n" not in msg and msg
    return msg


@pytest.mark.parametrize("name", sorted(LISTINGS))
def test_paper_listings_pass(name: str):
    axis, src = LISTINGS[name]
    r = check_source(src, axis)
    assert r.axis == axis and r.class_name.startswith("Evolved")


@pytest.mark.parametrize("axis", sorted(SEED_FILES))
def test_shipped_seeds_pass(axis: str):
    check_source(seed_source(axis), axis)


def test_ordinary_python_passes():
    src = '''
from __future__ import annotations
import heapq
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Optional
from simcore.policies import SchedulingPolicy


@dataclass
class Stats:
    gaps: list = field(default_factory=list)


def helper(x: float) -> float:
    """Docstrings may mention __init__ but nothing else dunder."""
    return max(0.0, x)


class Smart(SchedulingPolicy):
    def __init__(self):
        super().__init__()
        self.seen = defaultdict(int)
        self.recent = deque(maxlen=8)

    def priority(self, pcb, now) -> int:
        self.seen[pcb.program_id] += 1
        try:
            w = 1.0 / pcb.context_tokens
        except ZeroDivisionError:
            w = 0.0
        hist = [d for d in pcb.returned_tool_durations if d > 0]
        best = heapq.nsmallest(1, hist) or [0.0]
        return int(helper(pcb.attained_service_s) * 1000 + w + best[0] + f"{now:.1f}".count("."))
'''
    check_source(src, "scheduling")


@pytest.mark.parametrize("src,expect", [
    ("import os\nclass P(SchedulingPolicy):\n    pass\n", "import of 'os'"),
    ("from os import path\nclass P(SchedulingPolicy):\n    pass\n", "import from 'os'"),
    ("import typing\nclass P(SchedulingPolicy):\n    pass\n", "import of 'typing'"),
    ("from typing import get_type_hints\nclass P(SchedulingPolicy):\n    pass\n", "get_type_hints"),
    ("from .base import X\nclass P(SchedulingPolicy):\n    pass\n", "relative imports"),
    ("from math import *\nclass P(SchedulingPolicy):\n    pass\n", "import *"),
    ("from __future__ import braces\nclass P(SchedulingPolicy):\n    pass\n", "__future__"),
    ("class P(SchedulingPolicy):\n    def __lt__(self, o):\n        return True\n", "dunder"),
    ("class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n        return pcb.__class__\n", "dunder"),
    ("class P(SchedulingPolicy):\n    x = 'a__b'\n", "'__'"),
    ("class P(SchedulingPolicy):\n    x = b'__'\n", "'__'"),
    ("class P(SchedulingPolicy):\n    x = '{}'.format(1)\n", ".format"),
    ("class P(SchedulingPolicy):\n    x = format(1, 'd')\n", "'format'"),
    ("class P(SchedulingPolicy):\n    x = vars()\n", "'vars'"),
    ("class P(SchedulingPolicy):\n    x = dir()\n", "'dir'"),
    ("class P(SchedulingPolicy):\n    x = locals()\n", "'locals'"),
    ("class P(SchedulingPolicy):\n    x = setattr\n", "'setattr'"),
    ("class P(SchedulingPolicy):\n    async def priority(self, pcb, now):\n        return 0\n", "AsyncFunctionDef"),
    ("class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n        with x:\n            return 0\n", "With"),
    ("class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n        try:\n            return 0\n"
     "        except (ValueError, KeyboardInterrupt):\n            return 1\n", "KeyboardInterrupt"),
    ("class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n        try:\n            return 0\n"
     "        except* ValueError:\n            return 1\n", "TryStar"),
    ("class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n        return (lambda: 0).f_back\n", "f_back"),
    ("import statistics\nclass P(SchedulingPolicy):\n    x = statistics._sum\n", "statistics._sum"),
    ("class P(RoutingPolicy):\n    pass\n", "axis is 'scheduling'"),
    ("class Helper:\n    pass\n", "no policy class"),
    ("class P(SchedulingPolicy:\n    pass\n", "syntax error at line 1"),
])
def test_rejections_are_one_line_and_specific(src: str, expect: str):
    assert expect in reject(src)


def test_size_and_node_limits():
    assert "limit" in reject("x = 1\n" + "#" * MAX_SOURCE_CHARS)
    body = "x = [" + ", ".join("1" for _ in range(MAX_NODES)) + "]\n"
    assert "syntax nodes" in reject(body + "class P(SchedulingPolicy):\n    pass\n")


def test_unknown_axis_and_non_text():
    assert "unknown policy axis" in reject(LISTING_3, "memory")
    with pytest.raises(SandboxViolation):
        check_source(b"class P: pass", "scheduling")  # type: ignore[arg-type]


def test_first_offence_in_source_order():
    msg = reject("class P(SchedulingPolicy):\n    def priority(self, pcb, now):\n"
                 "        x = eval('1')\n        return pcb.__class__\n")
    assert "line 3" in msg and "'eval'" in msg


# --------------------------------------------------------------------------- markers
SEED = '''"""doc"""
import math

# EVOLVE-BLOCK-START
class EvolvedScheduling(SchedulingPolicy):
    def priority(self, pcb, now):
        return 0
# EVOLVE-BLOCK-END

X = 1
'''


def test_markers_accept_changes_inside_block():
    cand = SEED.replace("return 0", "return int(pcb.attained_service_s)\n        # more")
    check_markers(cand, SEED)
    check_markers(cand.replace("\n", "   \n") + "\n\n", SEED)  # trailing whitespace is ignored


@pytest.mark.parametrize("mutate,expect", [
    (lambda s: s.replace("import math", "import math, heapq"), "before the first EVOLVE block"),
    (lambda s: s.replace("X = 1", "X = 2"), "after the last EVOLVE block"),
    (lambda s: s.replace("# EVOLVE-BLOCK-END\n", ""), "never closed"),
    (lambda s: s.replace("# EVOLVE-BLOCK-START\n", ""), "without"),
    (lambda s: s + "# EVOLVE-BLOCK-START\nY = 2\n# EVOLVE-BLOCK-END\n", "EVOLVE blocks"),
    (lambda s: s.replace("# EVOLVE-BLOCK-START", "# EVOLVE-BLOCK-START\n# EVOLVE-BLOCK-START"), "nested"),
])
def test_markers_reject_changes_outside(mutate, expect: str):
    with pytest.raises(SandboxViolation) as ei:
        check_markers(mutate(SEED), SEED)
    assert expect in str(ei.value) and "\n" not in str(ei.value)


def test_markers_need_a_seed_with_a_block():
    with pytest.raises(SandboxViolation, match="seed has no"):
        check_markers(SEED, "class P(SchedulingPolicy):\n    pass\n")


# --------------------------------------------------------------------------- run-time names
@pytest.mark.parametrize("src,expect", [
    ("import functools\nX = functools.update_wrapper\n", "'functools.update_wrapper' is not available"),
    ("from functools import wraps\n", "'wraps' cannot be imported from 'functools'"),
    ("from functools import singledispatch\n", "'singledispatch' cannot be imported"),
    ("import dataclasses as dc\nX = dc.make_dataclass\n", "'dataclasses.make_dataclass' is not available"),
    ("import enum\nX = enum.global_enum\n", "'enum.global_enum' is not available"),
    ("import statistics\nX = statistics.random\n", "'statistics.random' is not available"),
])
def test_functions_taking_names_at_run_time_are_refused(src: str, expect: str):
    """update_wrapper & co. are a getattr/setattr whose name the gate never sees as text."""
    assert expect in reject(src + "class P(SchedulingPolicy):\n    pass\n")


def test_gate_and_worker_share_one_allow_list():
    from sandbox import policy_api
    from sandbox.gate import _api
    assert set(_api()) == set(policy_api.MODULES)
    for m in policy_api.MODULES:
        assert set(_api()[m]) == set(policy_api.module_names(m))
        assert "update_wrapper" not in _api()[m] and "make_dataclass" not in _api()[m]
    wire = policy_api.as_wire()  # what the worker builds its namespace from
    assert {m: set(v) for m, v in wire["modules"].items()} == {m: set(v) for m, v in _api().items()}
