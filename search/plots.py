"""PNG figures of a run: island progress, JCT CDF and KV utilisation of best vs seed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never open a window (CI, ssh)
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402,F401
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .runs import Run, fitness_progress  # noqa: E402


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_islands(run: Run, out: Path) -> Path:
    """Best candidate so far per island (ranked by the interval's lower bound): its fitness as
    a step line and its 95% interval as a band."""
    df = fitness_progress(run)
    fig, ax = plt.subplots(figsize=(7, 4))
    # distinct line styles and markers: islands often share values (all start from the seed)
    styles = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]
    for k, (isl, g) in enumerate(df.groupby("island")):
        ls, mk = styles[k % len(styles)]
        line = ax.step(g["iteration"], g["best_fitness"], where="post", ls=ls, marker=mk, ms=5, mfc="none",
                       lw=1.5, label=f"island {isl}")[0]
        ax.fill_between(g["iteration"], g["best_lo"], g["best_hi"], step="post", color=line.get_color(),
                        alpha=0.15, lw=0, label=f"island {isl}: 95% interval")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--", label="seed parity")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter(useOffset=False))  # 1.00006, not 1e-5+1
    ax.set(xlabel="iteration", ylabel="fitness of the best so far (seed JCT / candidate JCT)",
           title=f"{run.run_id}: best per island (by lower bound)")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out / "fitness_islands.png")


def axis_is_shipped(axis: str, spec: str) -> bool:
    from simcore.policies.registry import policy_names
    return spec in policy_names(axis)


def simulate_pair(run: Run, best_path: Path) -> dict[str, Any]:
    """Re-simulate seed and best on the run's cell and first workload draw (deterministic),
    with the other axes fixed as in the run (`--with`). Every policy file of the run (seed,
    best, a fixed axis given as a file) runs in a sandboxed worker, never in this process."""
    from sandbox.client import load_sandboxed_policy
    from simcore.sim import simulate

    def sandboxed(path: Path, axis: str) -> Any:
        return load_sandboxed_policy(path.read_text(encoding="utf-8"), axis,
                                     allow_weak_sandbox=run.allow_weak_sandbox)

    seed = run.workload_seeds[0]
    out = {}
    for label, path in (("seed", run.root / "seed.py"), ("best", best_path)):
        pols = {axis: (spec if axis_is_shipped(axis, spec) else sandboxed(Path(spec), axis))
                for axis, spec in run.fixed_policies.items()}
        pols[run.axis] = sandboxed(path, run.axis)
        try:
            out[label] = simulate(run.cell, seed=seed, **pols)
        finally:
            for p in pols.values():
                if not isinstance(p, str):
                    p.close()
    return out


def plot_jct_cdf(run: Run, results: dict[str, Any], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    for (label, res), ls in zip(results.items(), ("-", "--")):
        jct = np.sort(res.programs["jct_s"].to_numpy())
        ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", ls=ls,
                label=f"{label} (mean {jct.mean():,.0f} s)")
    ax.set(xlabel="job completion time (s)", ylabel="fraction of programs",
           title=f"{run.cell}: JCT CDF, best vs seed")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    return _save(fig, out / "jct_cdf.png")


def binned_utilisation(tl: pd.DataFrame, bins: int = 300, fine: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Time-average of the step function kv_utilization(t) over `bins` equal bins.

    The raw timeline changes at every engine step; plotted as is it is a solid band.
    """
    t = tl["t_s"].to_numpy(dtype=float)
    u = tl["kv_utilization"].to_numpy(dtype=float)
    if len(t) < 2:
        return t, u
    grid = np.linspace(t[0], t[-1], bins * fine)
    held = u[np.clip(np.searchsorted(t, grid, side="right") - 1, 0, len(u) - 1)]
    return grid.reshape(bins, fine).mean(axis=1), held.reshape(bins, fine).mean(axis=1)


def plot_kv(run: Run, results: dict[str, Any], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    styles = (("tab:blue", "-"), ("tab:orange", "--"))
    for (label, res), (color, ls) in zip(results.items(), styles):
        for i, tl in enumerate(res.kv_timeline):
            x, y = binned_utilisation(pd.DataFrame(tl))
            ax.plot(x, y * 100.0, color=color, ls=ls, lw=1.2,
                    label=f"{label} (mean {res.summary['mean_kv_utilization']:.0%})" if i == 0 else None)
    ax.set(xlabel="simulated time (s)", ylabel="KV cache utilisation (%, binned mean)", ylim=(0, 105),
           title=f"{run.cell}: KV utilisation, best vs seed")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, out / "kv_utilization.png")


def plot_run(run: Run, best_path: Path, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    results = simulate_pair(run, best_path)
    return [plot_islands(run, out), plot_jct_cdf(run, results, out), plot_kv(run, results, out)]
