"""`evolve replay` against the fake streaming server: Eq. 2 releases, prompts, timing, files, Ctrl-C."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.fakes.openai_stream import FakeServer
from search.live.client import ServerClient
from search.live.replay import replay
from search.cli import main
from simcore.metrics import add_call_latencies, frame_summary
from simcore.sim import simulate
from simcore.workload import Call, Program, save_programs

ROOT = Path(__file__).resolve().parent.parent
GAPS = (0.08, 0.03, 0.05)


def programs(n: int = 3) -> list[Program]:
    out = []
    for i in range(n):
        out.append(Program(f"p{i}", (Call(120 + 16 * i, 6, "bash", GAPS[0]), Call(200 + 16 * i, 4, "view", GAPS[1]),
                                     Call(260 + 16 * i, 5, "edit", GAPS[2]), Call(300 + 16 * i, 3))))
    return out


def run(url: str, progs: list[Program], arrivals: list[float], **kw):
    async def go():
        async with ServerClient(url, stream_interval="whole") as c:   # the CLI's default
            return await replay(c, progs, arrivals, **kw)
    return asyncio.run(go())


def by_program(srv: FakeServer) -> dict[int, list]:
    """The server's recorded completions per program (told apart by their first prompt ids)."""
    reqs = [r for r in srv.requests if len(r.body.get("prompt", [])) > 16 and r.body.get("max_tokens") != 2]
    groups: dict[tuple, list] = {}
    for r in sorted(reqs, key=lambda r: r.received):
        groups.setdefault(tuple(r.body["prompt"][:8]), []).append(r)
    return dict(enumerate(groups.values()))


def test_release_rule_eq2_and_per_token_timing():
    ttft, tpot = 0.03, 0.01
    progs = programs()
    fake = FakeServer(ttft_s=ttft, tpot_s=tpot)
    url = fake.start()
    try:
        out = run(url, progs, [0.0, 0.02, 0.04])
    finally:
        fake.stop()
    calls = out.result.calls
    assert len(calls) == 12 and out.error is None and not out.interrupted
    for pid, g in calls.groupby("program_id"):
        g = g.sort_values("turn")
        prog = next(p for p in progs if p.program_id == pid)
        for k in range(len(g) - 1):
            gap = prog.calls[k].tool_duration_s
            early = g["release_s"].iloc[k + 1] - (g["response_end_s"].iloc[k] + gap)
            assert early >= 0.0, f"{pid} call {k + 1} sent {-early:.4f} s before Eq. 2 allows"
            assert early < 0.05, f"{pid} call {k + 1} sent {early:.4f} s late"
        assert (g["output_tokens"].to_numpy() == [c.output_tokens for c in prog.calls]).all()
        assert (g["prompt_tokens"].to_numpy() == [c.prompt_tokens for c in prog.calls]).all()
    # the server's clock: each successor arrives no earlier than predecessor's last token + gap
    groups = by_program(fake)
    assert len(groups) == 3
    for reqs in groups.values():
        assert len(reqs) == 4
        for k in range(3):
            assert reqs[k + 1].received - reqs[k].done >= GAPS[k] - 1e-3
    # per-token delays are measured: TTFT >= the server's delay, TPOT >= its token interval
    assert (calls["ttft_s"] >= ttft).all() and calls["ttft_s"].median() < ttft + 0.03
    # (a chunk the client reads late shortens one call's TPOT a little; the median holds)
    assert calls["tpot_s"].median() >= tpot and calls["tpot_s"].median() < tpot + 0.01
    s = out.result.summary
    assert s["preemptions"] == 0 and s["prefix_hit_source"].startswith("usage")
    jct = out.result.programs.set_index("program_id")["jct_s"]
    fin = calls.groupby("program_id")["finish_s"].max()
    arr = out.result.programs.set_index("program_id")["arrival_s"]
    assert ((fin - arr - jct).abs() < 1e-9).all()


def test_prompts_extend_prompt_and_generated_tokens_and_ask_for_recorded_output():
    progs = programs(2)
    progs.append(Program("override", (Call(160, 5, "bash", 0.0), Call(240, 4, None, 0.0, shared_prefix_tokens=100))))
    srv = FakeServer(ttft_s=0.005, tpot_s=0.002)
    url = srv.start()
    try:
        run(url, progs, [0.0, 0.0, 0.0])
    finally:
        srv.stop()
    groups = list(by_program(srv).values())
    assert len(groups) == 3
    firsts = set()
    for reqs in groups:
        prog = next(p for p in progs if len(p.calls) == len(reqs) and p.calls[0].prompt_tokens == len(reqs[0].body["prompt"]))
        firsts.add(tuple(reqs[0].body["prompt"][:16]))
        for k, r in enumerate(reqs):
            b = r.body
            assert b["max_tokens"] == prog.calls[k].output_tokens and b["ignore_eos"] is True
            assert b["stream_interval"] == b["max_tokens"]   # default: first token, then the rest at once
            assert b["stream"] is True and b["stream_options"] == {"include_usage": True} and b["return_token_ids"]
            assert len(b["prompt"]) == prog.calls[k].prompt_tokens
            fresh = b["prompt"][prog.shared_prefix(k):]
            assert all(100 <= t < 1000 for t in fresh)   # ids the replay drew, inside --token-range
            if k:
                prev = reqs[k - 1]
                stream = prev.body["prompt"] + prev.output_ids
                shared = prog.shared_prefix(k)
                assert b["prompt"][:shared] == stream[:shared]
                if prog.program_id == "override":
                    assert shared == 100 and b["prompt"][100] != stream[100]
    assert len(firsts) == 3   # programs share no first block


def test_stream_interval_zero_leaves_streaming_to_the_server(tmp_path):
    wl = tmp_path / "wl.jsonl"
    save_programs(programs(1), wl)
    srv = FakeServer(ttft_s=0.005, tpot_s=0.002)
    url = srv.start()
    try:
        assert main(["replay", str(wl), "--server", url, "--rate", "5", "--out", str(tmp_path / "o"), "--quiet",
                     "--stream-interval", "0"]) == 0
    finally:
        srv.stop()
    assert all("stream_interval" not in r.body for r in srv.requests)
    calls = pd.read_csv(tmp_path / "o" / "calls.csv")
    assert (calls["output_tokens"] == [c.output_tokens for c in programs(1)[0].calls]).all()


def test_replay_writes_the_files_evolve_simulate_writes(tmp_path, capsys):
    wl = tmp_path / "wl.jsonl"
    save_programs(programs(3), wl)
    with FakeServer(ttft_s=0.005, tpot_s=0.002) as url:
        assert main(["replay", str(wl), "--server", url, "--rate", "20", "--out", str(tmp_path / "real"),
                     "--quiet"]) == 0
    assert main(["simulate", "--cell", "rtx70b_swe10_0.1", "--workload", str(wl), "--out", str(tmp_path / "sim")]) == 0
    for name in ("programs.csv", "calls.csv", "kv_timeline.csv"):
        real = pd.read_csv(tmp_path / "real" / name)
        sim = pd.read_csv(tmp_path / "sim" / name)
        assert list(real.columns[: len(sim.columns)]) == list(sim.columns), name
    rs = json.loads((tmp_path / "real" / "summary.json").read_text())
    ss = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert set(ss) <= set(rs)
    assert rs["programs"] == 3 and rs["calls"] == 12 and rs["interrupted"] is False
    sm = json.loads((tmp_path / "real" / "server_metrics.json").read_text())
    assert sm["available"] and sm["delta"]["vllm:num_preemptions_total"] == 0
    assert sm["delta"]["vllm:prompt_tokens_total"] == sum(c.prompt_tokens for p in programs(3) for c in p.calls)
    assert "results written to" in capsys.readouterr().err


def test_the_written_frames_give_back_the_summary(tmp_path):
    """What `evolve replay` relies on: programs.csv / calls.csv as written (without the derived
    latency columns) give back the simulator's calls frame and summary figures."""
    res = simulate("rtx70b_swe10_0.1", seed=0)
    res.write(tmp_path)
    programs = pd.read_csv(tmp_path / "programs.csv")
    raw = pd.read_csv(tmp_path / "calls.csv")
    again = add_call_latencies(raw[[c for c in raw.columns if c not in ("queueing_s", "ttft_s", "e2e_s", "tpot_s")]])
    for c in ("queueing_s", "ttft_s", "e2e_s", "tpot_s"):
        np.testing.assert_allclose(again[c], res.calls[c], rtol=1e-9, equal_nan=True)
    fs = frame_summary(programs, again)
    for k, v in fs.items():
        assert v == pytest.approx(res.summary[k], rel=1e-9, nan_ok=True), k


def test_thousand_concurrent_programs_on_one_event_loop():
    n = 1000
    progs = [Program(f"q{i}", (Call(40, 3, "bash", 0.05), Call(60, 2))) for i in range(n)]
    srv = FakeServer(ttft_s=0.3, tpot_s=0.05)
    url = srv.start()
    try:
        t0 = time.perf_counter()
        out = run(url, progs, [0.0] * n)
        wall = time.perf_counter() - t0
    finally:
        srv.stop()
    assert out.result.summary["programs"] == n and out.error is None
    # all programs overlapped: at some instant most first calls were in flight together
    calls = out.result.calls[out.result.calls["turn"] == 0]
    t_mid = calls["first_token_s"].min()
    inflight = ((calls["release_s"] <= t_mid) & (calls["finish_s"] >= t_mid)).sum()
    assert inflight > 0.9 * n, inflight
    assert wall < 60


def test_ctrl_c_keeps_what_finished(tmp_path):
    slow = [Program(f"s{i}", (Call(50, 2, "bash", 30.0), Call(60, 2, "bash", 0.0), Call(70, 2))) for i in range(3)]
    fast = [Program(f"f{i}", (Call(50, 2),)) for i in range(2)]
    wl = tmp_path / "wl.jsonl"
    save_programs(fast + slow, wl)
    script = ("from tests.fakes.openai_stream import FakeServer; import time\n"
              "s = FakeServer(ttft_s=0.01, tpot_s=0.01); print(s.start(), flush=True); time.sleep(120)\n")
    server = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        out = tmp_path / "real"
        p = subprocess.Popen([sys.executable, "-m", "search", "replay", str(wl), "--server", url, "--rate", "1000",
                              "--out", str(out), "--quiet"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.time() + 60
        time.sleep(3.0)   # the fast programs finish, the slow ones sit in their 30 s tool gap
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=max(5, deadline - time.time()))
    finally:
        server.kill()
        server.wait()
    assert p.returncode == 130, stderr
    assert "interrupted: kept 2 finished programs" in stderr and "Traceback" not in stderr
    progs = pd.read_csv(out / "programs.csv")
    assert sorted(progs["program_id"]) == ["f0", "f1"]
    calls = pd.read_csv(out / "calls.csv")
    assert len(calls) == 5   # 2 fast calls + the first call of each slow program
    s = json.loads((out / "summary.json").read_text())
    assert s["interrupted"] is True and s["programs_total"] == 5 and sorted(s["programs_unfinished"]) == ["s0", "s1", "s2"]


def test_calls_carry_the_engines_own_times_and_the_api_path(tmp_path):
    """calls.csv splits each call between the engine (vLLM's per-request metrics: queued ->
    scheduled -> first token -> last token) and the API path around it; the summary gives the
    clock origin so a server-side trace can be lined up with the calls."""
    progs = programs(2)
    fake = FakeServer(mode="engine", step_time=lambda pre, n, kv: 0.004, api_in_s=0.003, api_out_s=0.002)
    url = fake.start()
    try:
        t_before = time.monotonic()
        out = run(url, progs, [0.0, 0.01])
    finally:
        fake.stop()
    c = out.result.calls
    assert {"server_ttft_s", "server_decode_s", "api_overhead_s"} <= set(c.columns)
    # one 4 ms step to the first token, one per further token
    assert c["server_ttft_s"].to_numpy() == pytest.approx(0.004, abs=0.003)
    assert (c["server_decode_s"] / (c["output_tokens"] - 1)).to_numpy() == pytest.approx(0.004, abs=0.003)
    # the 3 ms on the way in are the client's TTFT less the engine's queue and TTFT (plus HTTP)
    assert (c["api_overhead_s"] >= 0.003).all() and (c["api_overhead_s"] < 0.02).all()
    origin = out.result.summary["clock_origin_monotonic_s"]
    assert t_before <= origin <= time.monotonic()


def test_gauges_are_read_by_a_line_scan_of_the_metrics_page():
    from search.live.client import gauge_values, metric_value, parse_metrics
    page = "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="a"} 2.0',
        'vllm:num_requests_running{engine="1",model_name="a"} 3.0',
        'vllm:num_requests_running{engine="0",model_name="b"} 7.0',
        'vllm:num_requests_running_other{engine="0",model_name="a"} 9.0',
        "vllm:num_requests_waiting 1",
        'vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.25',
    ]) + "\n"
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
             "vllm:num_preemptions_total")
    g = gauge_values(page, names, "a")
    assert g == {"vllm:num_requests_running": 5.0, "vllm:num_requests_waiting": 1.0,
                 "vllm:kv_cache_usage_perc": 0.25, "vllm:num_preemptions_total": None}
    full = parse_metrics(page)   # the same figures as the full parser
    assert [metric_value(full, n, "a") for n in names] == list(g.values())
