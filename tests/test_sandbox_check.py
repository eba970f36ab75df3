"""`evolve check`: the whole admission pipeline, through its CLI entry points."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from search.cli import main
from simcore.packaged import seeds_dir
from simcore.policies.registry import SHIPPED
from tests.test_sandbox_gate import LISTINGS

HOSTILE = Path(__file__).parent / "hostile"


def seed_path(tmp_path: Path, name: str) -> Path:
    p = tmp_path / name
    p.write_text((seeds_dir() / name).read_text(encoding="utf-8"))
    return p


@pytest.mark.parametrize("seed,axis", [("retention_ttl.py", "retention"), ("scheduling_plas.py", "scheduling"),
                                       ("routing_affinity.py", "routing")])
def test_seeds_are_admissible(tmp_path, capsys, seed: str, axis: str):
    p = seed_path(tmp_path, seed)
    assert main(["check", str(p), "--axis", axis, "--seed-file", str(p)]) == 0
    out = capsys.readouterr().out
    assert "verdict: ADMISSIBLE" in out and "leakage  ok" in out and "markers  ok" in out


@pytest.mark.parametrize("name", sorted(LISTINGS))
def test_paper_listings_are_admissible(tmp_path, capsys, name: str):
    axis, src = LISTINGS[name]
    p = tmp_path / f"{name}.py"
    p.write_text(src)
    assert main(["check", str(p), "--axis", axis, "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["admissible"] is True and [s["stage"] for s in v["stages"]] == ["gate", "markers", "smoke", "leakage"]
    assert v["stages"][1]["ok"] is None  # markers skipped without a seed
    assert v["layout"] == "mirrored" or v["layout"].startswith("off: ")  # sandbox/layout.py, said either way


def test_evolved_candidate_against_its_seed(tmp_path, capsys):
    seed = seed_path(tmp_path, "scheduling_plas.py")
    text = seed.read_text()
    body = LISTINGS["listing4"][1].strip("\n")
    start = text.index("# EVOLVE-BLOCK-START") + len("# EVOLVE-BLOCK-START\n")
    end = text.index("# EVOLVE-BLOCK-END")
    cand = tmp_path / "cand.py"
    cand.write_text(text[:start] + body + "\n" + text[end:])
    assert main(["check", str(cand), "--axis", "scheduling", "--seed-file", str(seed)]) == 0
    # the same body with the header changed outside the block is refused
    cand.write_text(cand.read_text().replace("import math", "import heapq"))
    assert main(["check", str(cand), "--axis", "scheduling", "--seed-file", str(seed)]) == 1
    assert "outside the EVOLVE blocks" in capsys.readouterr().out


@pytest.mark.parametrize("name,stage", [("03_import_os", "gate"), ("29_nan_priority", "smoke"),
                                        ("24_infinite_loop", "smoke"), ("50_read_hidden_field", "smoke")])
def test_hostile_candidates_are_rejected_with_a_reason(capsys, name: str, stage: str):
    path = HOSTILE / f"{name}.py"
    axis = next(line.split(":", 1)[1].strip() for line in path.read_text().splitlines() if line.startswith("# axis:"))
    rc = main(["check", str(path), "--axis", axis, "--decision-timeout", "0.5", "--json"])
    v = json.loads(capsys.readouterr().out)
    assert rc == 1 and v["admissible"] is False
    assert v["reason"].startswith(f"{stage}: ") and "\n" not in v["reason"]


@pytest.mark.parametrize("axis,name", [(a, n) for a in ("retention", "scheduling", "routing") for n in SHIPPED[a]])
def test_every_shipped_policy_is_admissible(capsys, axis: str, name: str):
    assert main(["check", name, "--axis", axis]) == 0
    out = capsys.readouterr().out
    assert "trusted code" in out and "verdict: ADMISSIBLE" in out


@pytest.mark.parametrize("argv,msg", [
    (["check", "/nonexistent/p.py", "--axis", "scheduling"], "no such policy file"),
    (["check", "{nonutf8}", "--axis", "scheduling"], "p.py:2: not UTF-8 text (byte 0xff)"),
    (["check", "{seed}", "--axis", "scheduling", "--cell", "no_such_cell"], "no_such_cell"),
    (["check", "{seed}", "--axis", "scheduling", "--seed-file", "/nonexistent/s.py"], "no such seed file"),
    (["check", "{seed}", "--axis", "scheduling", "--cpu-budget", "0"], "must be positive"),
])
def test_usage_errors_exit_2_with_one_line(tmp_path, capsys, argv, msg):
    seed = seed_path(tmp_path, "scheduling_plas.py")
    bad = tmp_path / "p.py"
    bad.write_bytes(b"import math\n# \xff\n")
    argv = [a.replace("{seed}", str(seed)).replace("{nonutf8}", str(bad)) for a in argv]
    assert main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert msg in err and len(err.splitlines()) == 1 and not cap.out


def test_the_isolation_lines_name_every_layer_and_claim_none_that_is_off(tmp_path, capsys):
    p = seed_path(tmp_path, "scheduling_plas.py")
    assert main(["check", str(p), "--axis", "scheduling"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("isolation: on: "))
    for layer in ("userns", "pidns", "netns", "fs_root", "landlock", "seccomp", "caps", "audit_tripwire"):
        assert layer in line
    assert "OFF" not in out


def test_a_missing_layer_is_refused_then_shown_when_allowed(tmp_path, capsys, monkeypatch):
    """--allow-weak-sandbox runs the check and prints what was off; without it, exit 2."""
    from sandbox import client
    real = client.load_sandboxed_policy
    monkeypatch.setattr(client, "load_sandboxed_policy",
                        lambda *a, **k: real(*a, simulate_unavailable=("netns",), **k))
    monkeypatch.setattr("sandbox.check.load_sandboxed_policy", client.load_sandboxed_policy)
    p = seed_path(tmp_path, "scheduling_plas.py")
    assert main(["check", str(p), "--axis", "scheduling"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "netns" in err and "--allow-weak-sandbox" in err
    assert main(["check", str(p), "--axis", "scheduling", "--allow-weak-sandbox", "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["allow_weak_sandbox"] is True and v["layers"]["netns"].startswith("off: unavailable")
    assert main(["check", str(p), "--axis", "scheduling", "--allow-weak-sandbox"]) == 0
    out = capsys.readouterr().out
    assert "isolation: OFF: netns (unavailable" in out and "accepted by --allow-weak-sandbox" in out
    assert "netns" not in next(x for x in out.splitlines() if x.startswith("isolation: on: "))


@pytest.mark.parametrize("name", ["67_deep_engine_args", "68_ansi_in_exception"])
def test_bad_answers_give_one_inert_line(capsys, name: str):
    """engine_args nested 1,000 deep and escape codes in a candidate's exception: one line,
    no traceback, nothing a terminal would act on."""
    rc = main(["check", str(HOSTILE / f"{name}.py"), "--axis", "scheduling"])
    out = capsys.readouterr().out
    assert rc == 1 and "Traceback" not in out and "\x1b" not in out and "\r" not in out and "\x07" not in out
    verdict = [x for x in out.splitlines() if x.startswith("verdict:")]
    assert len(verdict) == 1 and verdict[0].startswith("verdict: REJECTED")
    assert "[bold" not in out


def test_simulate_gives_the_same_one_line_errors(capsys):
    from search.cli import main as evolve
    for name in ("67_deep_engine_args", "68_ansi_in_exception"):
        rc = evolve(["simulate", "--cell", "rtx70b_swe10_0.1", "--scheduling", str(HOSTILE / f"{name}.py")])
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err and "\x1b" not in err
        assert len([x for x in err.splitlines() if x.strip()]) <= 2  # one message (wrapped at most once)


def test_simulate_never_runs_a_file_in_process_when_the_sandbox_fails(monkeypatch, capsys, tmp_path):
    """No fail-open path: simcore's `simulate` command can load a policy file only through the
    loader the console script hands it (the sandbox); when that fails, nothing runs here.
    Only --trusted runs a file in this process."""
    from search import cli
    from simcore.policies.base import PolicyError
    p = tmp_path / "marked.py"
    p.write_text(seed_path(tmp_path, "scheduling_plas.py").read_text()
                 + "\nSchedulingPolicy.loaded_in_simulator = True\n")

    def broken(path, axis, allow_weak):
        raise PolicyError("the sandbox cannot start here")
    monkeypatch.setattr(cli, "_load_policy_file", broken)
    from simcore.policies.base import SchedulingPolicy
    assert cli.main(["simulate", "--cell", "rtx70b_swe10_0.1", "--scheduling", str(p)]) == 2
    assert "the sandbox cannot start here" in capsys.readouterr().err
    assert not hasattr(SchedulingPolicy, "loaded_in_simulator")
    try:
        assert cli.main(["simulate", "--cell", "rtx70b_swe10_0.1", "--scheduling", str(p), "--trusted", "--json"]) == 0
        assert SchedulingPolicy.loaded_in_simulator is True      # positive control: --trusted is in-process
    finally:
        if hasattr(SchedulingPolicy, "loaded_in_simulator"):
            del SchedulingPolicy.loaded_in_simulator


def test_simulate_refuses_a_weak_sandbox_unless_allowed(monkeypatch, capsys, tmp_path):
    from sandbox import client
    from search.cli import main as evolve
    real = client.load_sandboxed_policy
    monkeypatch.setattr(client, "load_sandboxed_policy",
                        lambda *a, **k: real(*a, simulate_unavailable=("pidns",), **k))
    p = seed_path(tmp_path, "scheduling_plas.py")
    assert evolve(["simulate", "--cell", "rtx70b_swe10_0.1", "--scheduling", str(p)]) == 2
    assert "pidns" in capsys.readouterr().err
    assert evolve(["simulate", "--cell", "rtx70b_swe10_0.1", "--scheduling", str(p), "--allow-weak-sandbox",
                   "--json"]) == 0
