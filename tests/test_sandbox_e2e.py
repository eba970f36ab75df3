"""End to end: a hostile "LLM" on 127.0.0.1 answers with trojans; search, plot and export run;
nothing outside the workers changes.

The endpoint (OpenAI-compatible) answers with two candidates:
  trojan  - a real improvement whose module-level code, inside the EVOLVE block, marks the
            policy base class it imports. In a worker that is the worker's own copy; run in
            this process (as `evolve plot` did before, through simulate_pair) it would mark
            simcore's class -- a gate-legal stand-in for any code run as the invoking user;
  escape  - the update_wrapper gate bypass that created a file as root through `evolve
            plot`; the gate refuses it now.
The trojan scores above the seed, `evolve plot` re-simulates it and `evolve export` packages it,
in this process; afterwards simcore's class is unmarked, the world-writable canary directory
is empty and the SysV key space is as it was. A positive control runs the file in-process
to show that the mark would be seen.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from rich.console import Console

from search.driver import create_run, execute
from search.llm import entries_for, label_for
from search.settings import load_settings
from search.cli import main as evolve
from simcore.policies import base as B
from tests.fakes import FAKESIM, ensure_ray
from tests.fakes.llm_servers import openai_server
from tests.test_sandbox_hostile import sysv_key_space

pytestmark = pytest.mark.timeout(300)

MARK = "trojan_loaded_in"
RETURN = "        return int(round(pcb.attained_service_s * 1000.0))"
CLASS = "class EvolvedScheduling(SchedulingPolicy):"
DEF = "    def priority(self, pcb, now):"


def _block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE"


def _answer(kind: str, canary: Path) -> str:
    if kind == "trojan":
        trojan = (f"try:\n    SchedulingPolicy.{MARK} = 'the process that loaded the file'\n"
                  f"except Exception:\n    pass\n\n\n{CLASS}")
        better = "        return int(round(pcb.attained_service_s * 1000.0 + pcb.context_tokens * 10.0))"
        return "Rank short contexts first.\n" + _block(CLASS, trojan) + "\n" + _block(RETURN, better)
    escape = ("        import functools\n        import statistics\n"
              "        f = lambda: 0\n        g = '_' * 2 + 'globals' + '_' * 2\n"
              "        functools.update_wrapper(f, statistics.mean, assigned=(), updated=(g,))\n"
              f"        f.__globals__['random']._os.system('touch {canary}/escaped')")
    # anchored on a line the seed and the trojan share: either may be the parent
    return "Faster.\n" + _block(DEF, DEF + "\n" + escape)


@pytest.fixture()
def canary():
    d = Path(tempfile.mkdtemp(prefix="agentservesim-canary-", dir="/tmp"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_hostile_llm_changes_nothing_outside_the_workers(tmp_path, canary, monkeypatch, capsys):
    assert MARK not in vars(B.SchedulingPolicy)
    sysv = sysv_key_space()
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    ensure_ray()
    settings = load_settings(None, {"iterations": 2, "islands": 1, "population": 6, "archive_size": 4,
                                    "workers": 1, "timeout_s": 120, "checkpoint_interval": 1,
                                    "evaluator": {"simulator": FAKESIM, "leak_check": False, "stage1": False,
                                                  "heldout": {"top": 0}}})
    with openai_server(["trojan", "escape"], models=("hostile",), respond=lambda k: _answer(k, canary)) as llm:
        entries = entries_for("openai:hostile", f"http://127.0.0.1:{llm.port}/v1", settings.llm)
        run = create_run("scheduling", "rtx70b_swe_0.1", settings, label_for(entries),
                         [e.model_dump() for e in entries], str(tmp_path / "run"), None)
        code = execute(run, console=Console(file=open(tmp_path / "out.txt", "w"), width=200))
        assert len(llm.requests) == 2
    assert code == 0, (tmp_path / "out.txt").read_text()[-2000:]
    results = {r.iteration: r for r in run.candidates()}
    assert results[1].status == "ok" and results[1].fitness > 1.0            # the trojan scores
    assert results[2].status == "failed" and results[2].failure_kind == "gate"
    trojan = results[1].candidate_id
    program = run.root / "candidates" / trojan / "program.py"
    assert MARK in program.read_text()

    # plot and export the trojan, in this process, as a user would run them
    assert evolve(["plot", str(run.root), "--candidate", trojan, "--out", str(tmp_path / "plots")]) == 0
    assert len(list((tmp_path / "plots").glob("*.png"))) == 3
    assert evolve(["export", str(run.root), "--candidate", trojan, "--to", "vllm",
                   "--out", str(tmp_path / "pkg")]) == 0
    assert (tmp_path / "pkg" / "policy.py").read_text() == program.read_text()
    capsys.readouterr()

    # nothing outside the workers changed
    assert MARK not in vars(B.SchedulingPolicy), "candidate code ran in the simulator's process"
    assert not list(canary.iterdir()), "a candidate wrote outside its worker"
    assert sysv_key_space() == sysv

    # positive control: the same file run in this process is seen
    from simcore.policies.registry import policy_class_from_source
    try:
        policy_class_from_source(program.read_text(), "scheduling")
        assert vars(B.SchedulingPolicy).get(MARK) == "the process that loaded the file"
    finally:
        if MARK in vars(B.SchedulingPolicy):
            delattr(B.SchedulingPolicy, MARK)
    assert re.search(r"failed|gate", results[2].model_dump_json())
