"""Internal validation of the performance model against step_overhead.csv.

    .venv/bin/python benchmarks/validate_perf.py

For every profiled folder: the all-reduce fit (TP > 1), and per step_overhead row the
table-derived kernel sum against kernel_us and the model's step time against wall_us, at
kv_prefill 0 and decode context 16 (the rows do not record their contexts). A second
kernel column assumes what the rows' pattern suggests: chunks of one 16,384-token prompt
(mean over the chunk positions). See simcore/perf.py and tests/test_perf.py.
"""
from __future__ import annotations

import numpy as np

from simcore.config import hardware_catalog, model_catalog
from simcore.perf import PerfModel, fit_allreduce, profile_folder

FOLDERS = [("B200", "Llama-3.1-8B", 1), ("B200", "Llama-3.1-70B", 1), ("RTXPRO6000", "Llama-3.1-70B", 2),
           ("RTXPRO6000", "Llama-3.1-8B", 1)]


def main() -> None:
    hws, models = hardware_catalog(), model_catalog()
    for hw, m, tp in FOLDERS:
        folder = profile_folder(hws[hw], models[m], tp)
        donor = None
        if not (folder / "attention.csv").exists() and hw == "B200":
            donor = (profile_folder(hws[hw], models["Llama-3.1-8B"], 1) / "attention.csv", models["Llama-3.1-8B"])
        pm = PerfModel(hws[hw], models[m], tp, folder, donor)
        print(f"== {hw} {m} TP{tp}  parts={pm.parts}")
        if tp > 1:
            gbs, icept = fit_allreduce(pm.overhead.rows, models[m])
            print(f"   all-reduce fit: {gbs:.2f} GB/s effective, intercept {icept:.3f} us per all-reduce")
        print("    chunk    n   kernel_err  kernel_err(16k prompt chunked)  wall_err")
        kerr, werr = [], []
        for r in pm.overhead.rows.itertuples():
            c, n = int(r.prefill_chunk), int(r.n_decode)
            pf = [(c, 0)] if c else []
            k = pm.kernel_us(pf, n, 16 * n) / r.kernel_us - 1
            kc = np.mean([pm.kernel_us([(c, j)], n, 16 * n) for j in range(0, 16384 - c + 1, c)]) / r.kernel_us - 1 \
                if c else k
            w = pm.step_time(pf, n, 16 * n) * 1e6 / r.wall_us - 1
            kerr.append(k), werr.append(w)
            print(f"   {c:6d} {n:4d}   {k:+8.1%}     {kc:+8.1%}                      {w:+8.1%}")
        ka, wa = np.abs(kerr), np.abs(werr)
        print(f"   |kernel err| median {np.median(ka):.1%} p90 {np.percentile(ka, 90):.1%};"
              f" |wall err| median {np.median(wa):.1%} p90 {np.percentile(wa, 90):.1%}")


if __name__ == "__main__":
    main()
