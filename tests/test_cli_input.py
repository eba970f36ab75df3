"""No input reaches a user as a traceback: every command fed non-UTF-8, empty, truncated and
read-only cases answers with one `error:` line naming the file, field or flag; and `evolve`
run from a folder full of decoys (search.py, sandbox.py, simcore.py, evaluator.py, configs/,
seeds/) still runs its own commands."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from search.cli import main
from simcore.packaged import configs_dir, seed_source
from simcore.workload import Call, Program, save_programs
from tests.runs_fixture import make_run

EVOLVE = str(Path(sys.executable).parent / "evolve")
GOOD_LINE = '{"program_id": "a", "calls": [{"prompt_tokens": 10, "output_tokens": 2, "tool": null}]}\n'
BAD = {  # name -> (suffix-less content, what the error line must say)
    "nonutf8": (GOOD_LINE.encode() + b'{"program_id": "b\xff"}\n', ":2: not UTF-8 text (byte 0xff)"),
    "empty": (b"", ""),
    "truncated": (b'{"program_id": "a", "calls": [{"prompt_tok', ":1: malformed or truncated JSON"),
}


def one_error_line(err: str, *needles: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln]
    assert len(errors) == 1, err
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


def run_main(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    out = {}
    for name, (data, _) in BAD.items():
        (d / f"{name}.jsonl").write_bytes(data)
        out[name] = d / f"{name}.jsonl"
    return out


# ------------------------------------------------------------------------- workload files
@pytest.mark.parametrize("kind", sorted(BAD))
@pytest.mark.parametrize("argv", [
    ["simulate", "--cell", "rtx70b_swe10_0.1", "--workload", "{f}"],
    ["workload", "stats", "{f}"],
    ["workload", "import", "--format", "tracelab", "{f}", "-o", "{out}"],
    ["workload", "import", "--format", "lmcache", "{f}", "-o", "{out}"],
    ["workload", "import", "--format", "mooncake", "{f}", "-o", "{out}"],
    ["replay", "{f}", "--server", "http://127.0.0.1:9", "--rate", "1"],
], ids=["simulate", "stats", "tracelab", "lmcache", "mooncake", "replay"])
def test_bad_workload_files(capsys, tmp_path, bad_files, kind, argv):
    f = bad_files[kind]
    code, err = run_main(capsys, [a.replace("{f}", str(f)).replace("{out}", str(tmp_path / "o.jsonl"))
                                  for a in argv])
    assert code == 2
    one_error_line(err, f.name, BAD[kind][1])


# ------------------------------------------------------------------------- policy files
POLICIES = {"nonutf8": (b"import math\n# \xff\n", "p.py:2: not UTF-8 text"),
            "empty": (b"", "no policy class"),
            "truncated": (b"class X(SchedulingPolicy):\n    def priority(self, pcb, n", "syntax error at line 2")}


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_bad_policy_files(capsys, tmp_path, kind):
    data, said = POLICIES[kind]
    p = tmp_path / "p.py"
    p.write_bytes(data)
    code, err = run_main(capsys, ["simulate", "--cell", "rtx70b_swe10_0.1", "--scheduling", str(p)])
    assert code == 2
    one_error_line(err, "--scheduling", "p.py", said)
    code = main(["check", str(p), "--axis", "scheduling"])
    cap = capsys.readouterr()
    if kind == "nonutf8":       # not a policy at all: a usage error
        assert code == 2
        one_error_line(cap.err, said)
    else:                       # a policy the gate rejects, with its reason
        assert code == 1 and f"verdict: REJECTED (gate: " in cap.out and said in cap.out


# ------------------------------------------------------------------------- configs
CONFIGS = {"nonutf8": (b"cells: \xff\n", "cells.yaml:1: not UTF-8 text"),
           "empty": (b"", "cells.yaml: (top level): expected a mapping, got nothing"),
           "truncated": (b"families:\n  x: [1,", "cells.yaml:2: invalid YAML"),
           "list": (b"- a\n", "cells.yaml: (top level): expected a mapping, got list")}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_bad_cells_yaml(capsys, tmp_path, monkeypatch, kind):
    from simcore import config
    for f in ("hardware.yaml", "models.yaml"):
        shutil.copy(configs_dir() / f, tmp_path / f)
    (tmp_path / "cells.yaml").write_bytes(CONFIGS[kind][0])
    monkeypatch.setenv("AGENTSERVESIM_CONFIGS", str(tmp_path))
    for fn in (config.cell_catalog, config.hardware_catalog, config.model_catalog):
        fn.cache_clear()
    try:
        code, err = run_main(capsys, ["cells"])
    finally:
        for fn in (config.cell_catalog, config.hardware_catalog, config.model_catalog):
            fn.cache_clear()
    assert code == 2
    one_error_line(err, CONFIGS[kind][1])


@pytest.mark.parametrize("kind,said", [("nonutf8", "not UTF-8 text"), ("truncated", "not valid YAML"),
                                       ("list", "search.yaml")])
def test_bad_search_config(capsys, tmp_path, kind, said):
    p = tmp_path / "search.yaml"
    p.write_bytes({"nonutf8": b"iterations: \xff\n", "truncated": b"iterations: [\n", "list": b"- 1\n"}[kind])
    code, err = run_main(capsys, ["--axis", "scheduling", "--cell", "rtx70b_swe10_0.1", "--config", str(p),
                                  "--run-dir", str(tmp_path / "run")])
    assert code == 2
    one_error_line(err, str(p.name), said)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv,flag", [
    (["--axis", "scheduling", "--cell", "rtx70b_swe10_0.1", "--iterations", "-1"], "--iterations -1"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe10_0.1", "--iterations", "0"], "--iterations 0"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe10_0.1", "--workers", "0"], "--workers 0"),
    (["--axis", "scheduling", "--cell", "rtx70b_swe10_0.1", "--timeout", "-5"], "--timeout -5"),
])
def test_flag_values_are_judged_as_flags(capsys, argv, flag):
    code, err = run_main(capsys, argv)
    assert code == 2
    assert "search.yaml" not in one_error_line(err, flag)


def test_argparse_flag_types_name_the_flag():
    p = subprocess.run([EVOLVE, "sweep", "--cell", "rtx70b_swe10_0.1", "--jobs", "0"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    one_error_line(p.stderr, "--jobs", "must be a positive integer, got 0")


# ------------------------------------------------------------------------- run directories
@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("runs")
    make_run(base, "scheduling", run_id="good")
    for kind, data in (("nonutf8", b"\xff"), ("empty", b""), ("truncated", b'{"run_id": "x", "ax')):
        d = base / kind
        shutil.copytree(base / "good", d)
        (d / "run.json").write_bytes(data)
    return base


@pytest.mark.parametrize("kind", ["nonutf8", "empty", "truncated"])
@pytest.mark.parametrize("cmd", [["resume", "{run}"], ["leaderboard", "{id}"], ["show", "{id}"], ["plot", "{id}"],
                                 ["export", "{id}", "--to", "vllm", "--out", "{tmp}/pkg"]],
                         ids=["resume", "leaderboard", "show", "plot", "export"])
def test_damaged_run_json(capsys, tmp_path, runs, kind, cmd):
    argv = [a.replace("{run}", str(runs / kind)).replace("{id}", kind).replace("{tmp}", str(tmp_path)) for a in cmd]
    if cmd[0] != "resume":
        argv += ["--runs-dir", str(runs)]
    code, err = run_main(capsys, argv)
    assert code == 2
    one_error_line(err, f"{kind}/run.json")


def test_runs_lists_a_damaged_run_beside_the_others(capsys, runs):
    assert main(["runs", "--runs-dir", str(runs), "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["good"]["status"] == "finished"
    for kind in ("nonutf8", "empty", "truncated"):
        assert rows[kind]["status"] == "unreadable" and f"{kind}/run.json" in rows[kind]["error"]


# ------------------------------------------------------------------------- read-only places
def _read_only(cmd: list[str], ro: Path, cwd: Path) -> subprocess.CompletedProcess:
    """Run `cmd` where `ro` is read-only: a read-only bind mount in a private mount namespace
    when we are root (root writes through mode bits), else mode 0555."""
    if os.geteuid() == 0:
        if not shutil.which("unshare"):
            pytest.skip("root without unshare: no way to make a folder read-only for root")
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               f'mount --bind "{ro}" "{ro}" && mount -o remount,bind,ro "{ro}" && exec "$@"', "sh", *cmd]
    else:
        ro.chmod(0o555)
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize("cmd", [
    ["simulate", "--cell", "rtx70b_swe10_0.1", "--out", "{ro}/result"],
    ["workload", "generate", "--kind", "swe", "-n", "2", "--seed", "0", "-o", "{ro}/w.jsonl"],
    ["--axis", "scheduling", "--cell", "rtx70b_swe10_0.1", "--iterations", "1", "--run-dir", "{ro}/run"],
    ["export", "good", "--runs-dir", "{runs}", "--to", "vllm", "--out", "{ro}/pkg"],
    ["plot", "good", "--runs-dir", "{runs}", "--out", "{ro}/plots"],
], ids=["simulate", "workload-generate", "search", "export", "plot"])
def test_read_only_destinations(tmp_path, runs, cmd):
    ro = tmp_path / "ro"
    ro.mkdir()
    argv = [a.replace("{ro}", str(ro)).replace("{runs}", str(runs)) for a in cmd]
    p = _read_only([EVOLVE, *argv], ro, tmp_path)
    if "unshare: " in p.stderr:
        pytest.skip(f"no mount namespace here: {p.stderr.strip()}")
    assert p.returncode == 2, p.stdout[-1000:] + p.stderr[-1000:]
    one_error_line(p.stderr, str(ro))
    assert not any(ro.iterdir())


# ------------------------------------------------------------------------- shadowing
@pytest.fixture(scope="module")
def decoys(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("decoys")
    for name in ("search", "sandbox", "simcore", "evaluator"):
        (d / f"{name}.py").write_text("print('SHADOWED by a user module')\nraise SystemExit(0)\n")
    for name in ("configs", "seeds"):
        (d / name).mkdir()
        (d / name / "__init__.py").write_text("raise SystemExit('SHADOWED by a user package')\n")
    (d / "configs" / "cells.yaml").write_text("families: {}\n")
    (d / "seeds" / "scheduling_plas.py").write_text("raise SystemExit('SHADOWED seed')\n")
    return d


@pytest.mark.parametrize("argv,expect", [
    (["cells", "--json"], "rtx70b_swe_0.1"),
    (["policies", "--json"], "pressure-ttl"),
    (["simulate", "--cell", "rtx70b_swe10_0.1", "--json"], "mean_jct_s"),
    (["check", "plas", "--axis", "scheduling"], "verdict: ADMISSIBLE"),
    (["check", "{seed}", "--axis", "scheduling"], "verdict: ADMISSIBLE"),
], ids=["cells", "policies", "simulate", "check-shipped", "check-file"])
def test_evolve_runs_its_own_commands_among_decoys(decoys, tmp_path, argv, expect):
    seed = tmp_path / "seed.py"
    seed.write_text(seed_source("scheduling"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AGENTSERVESIM_CONFIGS")}
    p = subprocess.run([EVOLVE, *[a.replace("{seed}", str(seed)) for a in argv]], cwd=decoys, env=env,
                       capture_output=True, text=True, timeout=300)
    assert "SHADOWED" not in p.stdout + p.stderr
    assert p.returncode == 0, p.stderr[-1500:]
    assert expect in p.stdout


def test_saved_workloads_and_policies_are_still_read(tmp_path, capsys):
    """Control for the cases above: the same commands succeed on good files."""
    wl = tmp_path / "w.jsonl"
    save_programs([Program("a", (Call(100, 5, "bash", 0.5), Call(120, 5)))], wl)
    assert main(["simulate", "--cell", "rtx70b_swe10_0.1", "--workload", str(wl), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["programs"] == 1
