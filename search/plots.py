"""PNG figures of a run: island progress, JCT CDF and KV utilisation of best vs seed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never open a window (CI, ssh)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .runs import Run, island_progress  # noqa: E402


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_islands(run: Run, out: Path) -> Path:
    df = island_progress(run)
    fig, ax = plt.subplots(figsize=(7, 4))
    for isl, g in df.groupby("island"):
        ax.step(g["iteration"], g["best_fitness"], where="post", marker="o", ms=3, label=f"island {isl}")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--", label="seed parity")
    ax.set(xlabel="iteration", ylabel="best fitness so far (seed JCT / candidate JCT)",
           title=f"{run.run_id}: best fitness per island")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, out / "fitness_islands.png")


def simulate_pair(run: Run, best_path: Path) -> dict[str, Any]:
    """Re-simulate seed and best on the run's cell and first workload seed (deterministic)."""
    from simcore.sim import simulate
    seed = run.workload_seeds[0]
    return {label: simulate(run.cell, seed=seed, **{run.axis: str(path)})
            for label, path in (("seed", run.root / "seed.py"), ("best", best_path))}


def plot_jct_cdf(run: Run, results: dict[str, Any], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, res in results.items():
        jct = np.sort(res.programs["jct_s"].to_numpy())
        ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post",
                label=f"{label} (mean {jct.mean():,.0f} s)")
    ax.set(xlabel="job completion time (s)", ylabel="fraction of programs",
           title=f"{run.cell}: JCT CDF, best vs seed")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    return _save(fig, out / "jct_cdf.png")


def plot_kv(run: Run, results: dict[str, Any], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    for (label, res), color in zip(results.items(), ("tab:blue", "tab:orange")):
        for i, tl in enumerate(res.kv_timeline):
            df = pd.DataFrame(tl)
            ax.plot(df["t_s"], df["kv_utilization"] * 100.0, color=color, lw=0.8, alpha=0.8,
                    label=label if i == 0 else None)
    ax.set(xlabel="simulated time (s)", ylabel="KV cache utilisation (%)", ylim=(0, 105),
           title=f"{run.cell}: KV utilisation, best vs seed")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, out / "kv_utilization.png")


def plot_run(run: Run, best_path: Path, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    results = simulate_pair(run, best_path)
    return [plot_islands(run, out), plot_jct_cdf(run, results, out), plot_kv(run, results, out)]
