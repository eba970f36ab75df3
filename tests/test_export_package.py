"""`evolve export RUN --to vllm`: package contents, the round trip through `evolve simulate`,
the shim's agreement with the simulator's interfaces, and the package's own tests."""
from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.export_helpers import BUILDS_WHEELS, can_import, load_exported, vllm_python
from tests.runs_fixture import CELL, ROUTING_CELL, make_run
from simcore import pcb as sim_pcb
from search.cli import main
from simcore.policies import base as sim_base

SCHED = f"scheduling-{CELL}-fixture"
RET = f"retention-{CELL}-fixture"
ROUTE = f"routing-{ROUTING_CELL}-fixture"


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    make_run(root, "scheduling")
    make_run(root, "retention", started_at="2026-11-30T02:00:00+00:00")
    make_run(root, "routing", started_at="2026-11-30T03:00:00+00:00")
    return root


@pytest.fixture(scope="module")
def exported(runs_dir, tmp_path_factory):
    out = {}
    for run_id, cand in ((SCHED, "it0003-cccc"), (RET, "it0001-aaaa"), (ROUTE, "it0001-aaaa")):
        d = tmp_path_factory.mktemp("export") / "pkg"
        assert main(["export", run_id, "--candidate", cand, "--to", "vllm", "--out", str(d),
                     "--runs-dir", str(runs_dir)]) == 0
        out[run_id] = d
    return out


def test_package_contents(runs_dir, exported):
    d = exported[SCHED]
    src = (runs_dir / SCHED / "candidates" / "it0003-cccc" / "program.py").read_bytes()
    assert (d / "policy.py").read_bytes() == src
    meta = json.loads((d / "metadata.json").read_text())
    res = json.loads((runs_dir / SCHED / "candidates" / "it0003-cccc" / "result.json").read_text())
    assert meta["run_id"] == SCHED and meta["cell"] == CELL and meta["fitness"] == res["fitness"]
    assert meta["engine_args"] == {"scheduling_policy": "priority"}
    assert 'vllm = ["vllm==0.32.0"]' in (d / "pyproject.toml").read_text()
    assert "--scheduling-policy priority" in (d / "README.md").read_text()
    assert not (d / "scheduler.py").exists()
    r = exported[RET]
    pkg = json.loads((r / "metadata.json").read_text())["package"]
    assert f"--scheduler-cls {pkg}.scheduler.RetentionAsyncScheduler" in (r / "README.md").read_text()
    assert (r / "scheduler.py").is_file()
    q = exported[ROUTE]
    pkg = json.loads((q / "metadata.json").read_text())["package"]
    assert f"python -m {pkg}.router" in (q / "README.md").read_text() and (q / "router.py").is_file()


def test_round_trip_simulate_gives_the_runs_metrics(runs_dir, exported, capsys):
    for run_id, d in exported.items():
        meta = json.loads((d / "metadata.json").read_text())
        capsys.readouterr()
        assert main(["simulate", "--cell", meta["cell"], f"--{meta['axis']}", str(d / "policy.py"),
                     "--seed", str(meta["workload_seeds"][0]), "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        for k in ("mean_jct_s", "p99_jct_s", "p50_jct_s", "makespan_s", "prefix_hit_rate", "preemptions"):
            assert got[k] == pytest.approx(meta["metrics"][k], rel=1e-12), (run_id, k)


def _fields(cls: type) -> list[tuple[str, str]]:
    return [(f.name, str(f.type)) for f in dataclasses.fields(cls)]


def test_shim_matches_the_simulator_interfaces(exported):
    """The view classes are generated (tests/test_export_schema.py); the bases are the shim's own."""
    rt = importlib.import_module(load_exported(exported[RET]).__name__ + ".runtime")
    assert _fields(rt.ProgramView) == _fields(sim_pcb.ProgramView)
    for axis, base in rt.BASES.items():
        sim = {"retention": sim_base.RetentionPolicy, "scheduling": sim_base.SchedulingPolicy,
               "routing": sim_base.RoutingPolicy}[axis]
        assert sorted(n for n in vars(base) if not n.startswith("_")) == \
            sorted(n for n in vars(sim) if not n.startswith("_"))


DECISIONS = [None, "none", "release", "evict", "offload", ("protect", 5.0), ("protect", 5, 2.0),
             ("protect", 5.0, None, "offload"), ["protect", 7.5, 1.0, "release"], ("release",),
             "keep", ("protect",), ("protect", float("nan")), ("protect", 1.0, 2.0, "drop"), 3, True]


@pytest.mark.parametrize("d", DECISIONS, ids=repr)
def test_shim_parses_decisions_like_the_simulator(exported, d):
    rt = importlib.import_module(load_exported(exported[RET]).__name__ + ".runtime")
    try:
        want = dataclasses.astuple(sim_base.parse_retention(d))
    except sim_base.PolicyError:
        with pytest.raises(rt.PolicyError):
            rt.parse_retention(d)
        return
    assert dataclasses.astuple(rt.parse_retention(d)) == want


@pytest.mark.parametrize("p", [0, 7, -3, 2.4, 2.6, 2**70, -(2**70), float("inf"), "1", None, False])
def test_shim_parses_priorities_like_the_simulator(exported, p):
    rt = importlib.import_module(load_exported(exported[SCHED]).__name__ + ".runtime")
    try:
        want = sim_base.parse_priority(p)
    except sim_base.PolicyError:
        with pytest.raises(rt.PolicyError):
            rt.parse_priority(p)
        return
    assert rt.parse_priority(p) == want


@pytest.mark.parametrize("run_id", [SCHED, RET, ROUTE])
def test_the_packages_own_tests_pass(exported, run_id):
    """Without vllm here its vLLM tests skip; tests/test_export_vllm.py runs them with vllm."""
    d = exported[run_id]
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=d,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert " passed" in p.stdout


def test_package_installs_with_pip(exported, tmp_path):
    """Offline install (no build isolation) with whichever local interpreter can build wheels."""
    python = next((p for p in (sys.executable, vllm_python()) if p and can_import(p, BUILDS_WHEELS)), None)
    if python is None:
        pytest.skip("no local interpreter with setuptools>=70.1 or wheel (install `wheel` to run this)")
    d = exported[SCHED]
    p = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(tmp_path / "site"), str(d)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    pkg = json.loads((d / "metadata.json").read_text())["package"]
    code = f"import {pkg} as m; print(m.METADATA['candidate_id'], type(m.policy()).__name__)"
    q = subprocess.run([python, "-c", code], env={"PYTHONPATH": str(tmp_path / "site")},
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert q.returncode == 0, q.stderr
    assert q.stdout.split() == ["it0003-cccc", "EvolvedScheduling"]


def test_export_refuses_to_overwrite_and_bad_names(runs_dir, exported, capsys):
    assert main(["export", SCHED, "--out", str(exported[SCHED]), "--runs-dir", str(runs_dir)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["export", SCHED, "--out", str(Path(exported[SCHED]).parent / "n"), "--name", "1bad-name",
                 "--runs-dir", str(runs_dir)]) == 2
    assert "not a valid Python package name" in capsys.readouterr().err


def test_export_of_a_run_with_fixed_axes_states_them_and_reproduces(tmp_path, capsys):
    """`--with retention=ttl` held retention fixed: the package records it, its README says to
    deploy it alongside, and the README's reproduce command (which passes it) gives the metrics."""
    run_id = make_run(tmp_path / "runs", "scheduling", fixed={"retention": {"name": "ttl"}}).name
    out = tmp_path / "pkg"
    assert main(["export", run_id, "--candidate", "it0001-aaaa", "--to", "vllm", "--out", str(out),
                 "--runs-dir", str(tmp_path / "runs")]) == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["evaluated_with"] == {"retention": {"name": "ttl"}}
    readme = (out / "README.md").read_text()
    assert "The search held retention = `ttl` fixed (`--with`)" in readme
    cmds = [ln for ln in readme.splitlines() if ln.startswith("evolve simulate ")]
    assert cmds and all("--retention ttl" in c for c in cmds)
    first = cmds[0].split()[2:]
    capsys.readouterr()
    assert main(["simulate", *[a.replace("pkg/", f"{out}/") for a in first], "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["policies"]["retention"] == "ttl"
    for k in ("mean_jct_s", "p99_jct_s", "preemptions"):
        assert got[k] == pytest.approx(meta["metrics"][k], rel=1e-12), k
