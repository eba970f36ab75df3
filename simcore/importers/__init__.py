"""Importers from public agent-trace formats to the project's JSONL program format.

`import_trace(fmt, src, ...)` reads a source file with the importer registered for `fmt`
and applies the arrival mode:
  recorded  keep the source's arrival times (program meta `arrival_s`); an error for a
            format that has none
  poisson   replace them by seeded Poisson arrivals at `rate` programs per second
            (simcore.workload.poisson_arrivals, the same schedule the cells use)
  None      recorded where the source has them, else none (the cell's rate applies)
Every problem with a source file is a one-line WorkloadError naming the file and line.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from simcore.importers import bfcl, lmcache, mooncake, tracelab
from simcore.workload import Program, WorkloadError, poisson_arrivals

Importer = Callable[..., list[Program]]

IMPORTERS: dict[str, Importer] = {
    "tracelab": tracelab.load,
    "lmcache": lmcache.load,
    "bfcl": bfcl.load,
    "mooncake": mooncake.load,
}
ARRIVAL_MODES = ("recorded", "poisson")


def known_formats() -> tuple[str, ...]:
    return tuple(IMPORTERS)


def import_trace(fmt: str, src: str | Path, *, arrivals: str | None = None, rate: float | None = None,
                 seed: int = 0, **options: Any) -> list[Program]:
    """Programs of trace `src` in format `fmt`; options go to the importer (e.g. answers=)."""
    if fmt not in IMPORTERS:
        raise WorkloadError(f"unknown trace format '{fmt}'; known formats: {', '.join(IMPORTERS)}")
    if arrivals not in (None, *ARRIVAL_MODES):
        raise WorkloadError(f"unknown arrival mode '{arrivals}'; use one of: {', '.join(ARRIVAL_MODES)}")
    if rate is not None and not rate > 0:
        raise WorkloadError(f"--rate must be > 0, got {rate}")
    src = Path(src)
    programs = IMPORTERS[fmt](src, **options)
    recorded = all("arrival_s" in p.meta for p in programs)
    if arrivals == "recorded" and not recorded:
        raise WorkloadError(f"{src}: format '{fmt}' records no arrival times; "
                            "use --arrivals poisson --rate R")
    if arrivals == "poisson" or (arrivals is None and rate is not None and not recorded):
        if rate is None:
            raise WorkloadError("--arrivals poisson needs --rate (programs per second)")
        times = poisson_arrivals(len(programs), rate, seed)
        programs = [Program(p.program_id, p.calls, dict(p.meta, arrival_s=round(t, 6)))
                    for p, t in zip(programs, times)]
    return programs
