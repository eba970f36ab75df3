"""Where a replay's time went, step by step, against the measured profile the simulation used.

    python scripts/vllm_trace/analyze.py TRACE_DIR VALIDATE_DIR [--replay real|real2]

TRACE_DIR holds the step trace of the server (scripts/vllm_trace/sitecustomize.py, TRACE=1 in
scripts/validate_vllm_cpu.sh); VALIDATE_DIR is an `evolve validate --out` directory. Prints
markdown: the engine's steps during the replay against the profile's model of the same steps
(by kind), the extra time of the decode steps after a prefill step, and the per-call API path
against the profile's API latency. Diagnostic only: the simulator never reads a trace.
"""
from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

import numpy as np
import pandas as pd

from simcore.perf_measured import load_measured


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace_dir")
    ap.add_argument("validate_dir")
    ap.add_argument("--replay", default="real")
    a = ap.parse_args()
    vdir = Path(a.validate_dir)
    v = json.loads((vdir / "validation.json").read_text())
    s = json.loads((vdir / a.replay / "summary.json").read_text())
    t0 = s["clock_origin_monotonic_s"]
    lo, hi = t0, t0 + s["wall_s"]
    perf = load_measured(v["profile"], 1024)
    recs = []
    for f in glob.glob(str(Path(a.trace_dir) / "steps-*.jsonl")):
        with open(f) as fh:
            recs += [json.loads(line) for line in fh if '"step"' in line]
    steps = sorted((r for r in recs if r["k"] == "step"), key=lambda r: r["t0"])
    idx = [i for i, r in enumerate(steps) if lo <= r["t0"] <= hi]
    rows = []
    since_prefill = 99
    for i in range(idx[0] if idx else 0, (idx[-1] + 1) if idx else 0):
        r = steps[i]
        idle = r["t0"] - steps[i - 1]["t1"] if i else 1.0
        pre = [tuple(x) for x in r["pre"]]
        model = perf.step_time(pre, r["ndec"], r["kv"])
        busy_before = idle < 0.003
        if not busy_before:
            model += perf.wake_time(idle)
        if pre:
            kind = "mixed (prefill + decodes)" if r["ndec"] else "prefill only"
            since_prefill = 0
        else:
            since_prefill += 1
            kind = ("decode, 1-5 steps after a prefill step" if since_prefill <= 5 and busy_before
                    else "decode, steady")
        rows.append({"kind": kind, "real": r["t1"] - r["t0"], "model": model, "after": since_prefill,
                     "prefill_tokens": sum(n for n, _ in pre), "idle": not busy_before})
    df = pd.DataFrame(rows)
    print(f"**Engine steps during `{a.replay}` ({len(df)} steps) against the profile's model of the same steps**\n")
    print("| steps | n | real (s) | model (s) | real / model |\n|---|---:|---:|---:|---:|")
    for kind in ("decode, steady", "decode, 1-5 steps after a prefill step", "mixed (prefill + decodes)", "prefill only"):
        d = df[df["kind"] == kind]
        if len(d):
            print(f"| {kind} | {len(d)} | {d['real'].sum():.3f} | {d['model'].sum():.3f} | {d['real'].sum() / d['model'].sum():.3f} |")
    print(f"| all | {len(df)} | {df['real'].sum():.3f} | {df['model'].sum():.3f} | {df['real'].sum() / df['model'].sum():.3f} |\n")
    # the decode steps after each prefill step: their extra time over the model, per prefill step
    ex, tok = [], []
    for i in range(len(df) - 5):
        if df["prefill_tokens"].iloc[i] and (df["after"].iloc[i + 1:i + 6].to_numpy() == np.arange(1, 6)).all():
            d = df.iloc[i + 1:i + 6]
            ex.append(float((d["real"] - d["model"]).sum()))
            tok.append(int(df["prefill_tokens"].iloc[i]))
    if ex:
        ex_a, tok_a = np.array(ex), np.array(tok, float)
        per_tok = float((ex_a * tok_a).sum() / (tok_a * tok_a).sum())
        print(f"Decode steps after a prefill step: the 5 that follow {len(ex)} prefill steps took "
              f"{np.mean(ex_a) * 1e3:.2f} ms more than the model in all (median {np.median(ex_a) * 1e3:.2f}); "
              f"through the origin {per_tok * 1e9:.0f} ns per prefill token.\n")
    c = pd.read_csv(vdir / a.replay / "calls.csv")
    if {"server_ttft_s", "server_decode_s"} <= set(c.columns):
        path = (c["response_end_s"] - c["release_s"]) - (c["queueing_s"] + c["server_ttft_s"] + c["server_decode_s"])
        print(f"Per call, client send -> stream closed minus the engine's queued -> last token: median "
              f"{path.median() * 1e3:.2f} ms, mean {path.mean() * 1e3:.2f} ms, p90 {path.quantile(0.9) * 1e3:.2f} ms; "
              f"the simulation added {v['api_latency_s'] * 1e3:.2f} ms (the profile's API latency). "
              f"The client's release lag: mean {c['release_lag_s'].mean() * 1e3:.2f} ms.\n")


if __name__ == "__main__":
    main()
