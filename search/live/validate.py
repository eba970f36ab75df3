"""`evolve validate`: the paper's sim-vs-real table for a cell on the user's own server.

The cell's workload and arrival schedule (same seed, same Poisson draw) are replayed
against the server and simulated with the cell's performance model (its measured profile
when it names one), under the same policies. Each row is a figure of the paper's
validation (§5.1, Appendix B and D): mean and p99 JCT, per-program JCT MAPE, TTFT, TPOT,
queueing delay, preemptions, prefix-hit rate; the error is sim relative to real. With
`--noise-floor` the replay runs twice and the second column shows how far two real runs
of the same replay lie apart, so simulator error can be told from measurement noise.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simcore.metrics import SimResult, frame_summary
from simcore.workload import Call, Program

# (key, label, unit scale, unit) of the table rows taken from the summaries
ROWS = (("mean_jct_s", "mean JCT", 1.0, "s"), ("p99_jct_s", "p99 JCT", 1.0, "s"),
        ("mape", "per-program JCT MAPE", 100.0, "%"),
        ("mean_ttft_s", "mean TTFT", 1e3, "ms"), ("mean_tpot_s", "mean TPOT", 1e3, "ms"),
        ("mean_queueing_s", "mean queueing delay", 1e3, "ms"), ("preemptions", "preemptions", 1.0, ""),
        ("prefix_hit_rate", "prefix-hit rate", 100.0, "%"), ("makespan_s", "makespan", 1.0, "s"),
        ("throughput_tok_s", "output throughput", 1.0, "tok/s"))


def with_api_latency(programs: list[Program], latency_s: float) -> list[Program]:
    """The workload as the engine sees it when every request spends `latency_s` between the client
    and the engine (HTTP, IPC, streaming; measured by `evolve profile`): each call reaches the
    engine that much later after the previous one's completion, so every tool gap grows by it."""
    out = []
    for p in programs:
        calls = tuple(c if k == len(p.calls) - 1 else
                      Call(c.prompt_tokens, c.output_tokens, c.tool_name, c.tool_duration_s + latency_s,
                           c.shared_prefix_tokens) for k, c in enumerate(p.calls))
        out.append(Program(p.program_id, calls, p.meta))
    return out


def client_view(sim: SimResult, latency_s: float) -> SimResult:
    """A simulation of the engine, seen from the client: each call's TTFT and end-to-end latency
    and each program's JCT gain the API latency (in on the first call, out on the last)."""
    if not latency_s:
        return sim
    programs, calls = sim.programs.copy(), sim.calls.copy()
    programs["finish_s"] += latency_s
    programs["jct_s"] += latency_s
    calls["ttft_s"] += latency_s
    calls["e2e_s"] += latency_s
    summary = {**sim.summary, **frame_summary(programs, calls), "api_latency_s": latency_s}
    return SimResult(sim.cell, sim.policies, sim.seed, programs, calls, sim.kv_timeline, summary)


def per_program_mape(a: pd.DataFrame, ref: pd.DataFrame) -> float | None:
    """Mean over programs finished on both sides of |JCT_a - JCT_ref| / JCT_ref."""
    m = a[["program_id", "jct_s"]].merge(ref[["program_id", "jct_s"]], on="program_id", suffixes=("", "_ref"))
    if m.empty:
        return None
    return float(((m["jct_s"] - m["jct_s_ref"]).abs() / m["jct_s_ref"]).mean())


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def rel_error(value: float | None, ref: float | None) -> float | None:
    """(value - ref) / ref; None where undefined (missing, or ref 0 with value != 0)."""
    if value is None or ref is None:
        return None
    if ref == 0:
        return 0.0 if value == 0 else None
    return value / ref - 1.0


@dataclass
class Comparison:
    rows: list[dict[str, Any]]
    mape: float | None
    noise_mape: float | None

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "per_program_mape": self.mape, "noise_per_program_mape": self.noise_mape}


def compare(real: SimResult, sim: SimResult, real2: SimResult | None = None) -> Comparison:
    mape = per_program_mape(sim.programs, real.programs)
    noise = per_program_mape(real2.programs, real.programs) if real2 is not None else None
    rows = []
    for key, label, scale, unit in ROWS:
        if key == "mape":
            rows.append({"key": key, "label": label, "unit": unit, "real": None, "sim": None,
                         "error": mape, "real2": None, "noise": noise})
            continue
        r, s = _num(real.summary.get(key)), _num(sim.summary.get(key))
        r2 = _num(real2.summary.get(key)) if real2 is not None else None
        rows.append({"key": key, "label": label, "unit": unit,
                     "real": None if r is None else r * scale, "sim": None if s is None else s * scale,
                     "error": rel_error(s, r), "real2": None if r2 is None else r2 * scale,
                     "noise": rel_error(r2, r)})
    return Comparison(rows, mape, noise)


def markdown(c: Comparison, title: str, noise: bool) -> str:
    def f(v: float | None, digits: int = 3) -> str:
        if v is None:
            return "n/a"
        return f"{v:,.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v * 100:+.1f} %"

    head = "| metric | real | sim | error (sim vs real) |" + (" real, 2nd replay | noise floor (2nd vs 1st) |" if noise else "")
    sep = "|---|---:|---:|---:|" + ("---:|---:|" if noise else "")
    lines = [f"**{title}**", "", head, sep]
    for r in c.rows:
        unit = f" ({r['unit']})" if r["unit"] else ""
        if r["key"] == "mape":
            err = "n/a" if r["error"] is None else f"{r['error'] * 100:.1f} %"
            row = f"| {r['label']} | | | {err} |"
            if noise:
                row += " | " + ("n/a" if r["noise"] is None else f"{r['noise'] * 100:.1f} %") + " |"
        else:
            row = f"| {r['label']}{unit} | {f(r['real'])} | {f(r['sim'])} | {pct(r['error'])} |"
            if noise:
                row += f" {f(r['real2'])} | {pct(r['noise'])} |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def plots(out: Path, real: SimResult, sim: SimResult, real2: SimResult | None, title: str) -> list[Path]:
    """jct_cdf.png (JCT CDF, sim vs real) and jct_per_program.png (sim JCT against real JCT)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(6, 4))
    series = [("real", real, "C0", "-"), ("sim", sim, "C1", "--")]
    if real2 is not None:
        series.append(("real, 2nd replay", real2, "C2", ":"))
    for name, res, color, style in series:
        j = np.sort(res.programs["jct_s"].to_numpy(float))
        if len(j):
            ax.step(j, np.arange(1, len(j) + 1) / len(j), where="post", label=name, color=color, linestyle=style)
    ax.set_xlabel("JCT (s)")
    ax.set_ylabel("fraction of programs")
    ax.set_title(f"{title}: JCT CDF", fontsize=9)
    written.append(_save(fig, ax, out / "jct_cdf.png"))

    m = real.programs[["program_id", "jct_s"]].merge(sim.programs[["program_id", "jct_s"]], on="program_id",
                                                     suffixes=("_real", "_sim"))
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(m["jct_s_real"], m["jct_s_sim"], s=18, label="sim")
    if real2 is not None:
        m2 = real.programs[["program_id", "jct_s"]].merge(real2.programs[["program_id", "jct_s"]], on="program_id",
                                                          suffixes=("_real", "_real2"))
        ax.scatter(m2["jct_s_real"], m2["jct_s_real2"], s=14, marker="x", label="real, 2nd replay")
    hi = float(max(m["jct_s_real"].max(), m["jct_s_sim"].max())) * 1.05 if len(m) else 1.0
    ax.plot([0, hi], [0, hi], color="grey", linewidth=0.8)
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("real JCT (s)")
    ax.set_ylabel("JCT (s)")
    ax.set_title(f"{title}: per program", fontsize=9)
    written.append(_save(fig, ax, out / "jct_per_program.png"))
    return written


def _save(fig: Any, ax: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(out: Path, c: Comparison, title: str, extra: dict[str, Any], noise: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("validation.json", json.dumps({"title": title, **c.to_json(), **extra}, indent=2) + "\n"),
                       ("validation.md", markdown(c, title, noise))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)
