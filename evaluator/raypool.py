"""Starting or joining Ray for candidate evaluation.

Local runs start a private Ray on this machine sized by --workers; `--ray-address` or
RAY_ADDRESS joins an existing cluster instead. Either way only the driver (the search
process, never a forked child of it: a forked Ray driver hangs) talks to Ray.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from typing import Any, Iterator


_started_here = False


class RayUnavailable(RuntimeError):
    """Ray could not be started or joined; the message is one line."""


def connect(address: str | None, workers: int, shared: bool = False) -> str:
    """Start (address None) or join Ray; returns a short description for the progress display.

    `shared=True` leaves the cluster running at `shutdown()` (a test session's Ray, used by
    several searches in one process)."""
    global _started_here
    try:
        import ray
    except ImportError:
        raise RayUnavailable("ray is not installed: pip install 'agentservesim[search]'") from None
    if ray.is_initialized():
        return "ray (already connected)"
    address = address or os.environ.get("RAY_ADDRESS") or None
    try:
        with _neutral_cwd():
            where = _init(ray, address, workers)
    except Exception as e:  # noqa: BLE001 - one line for the user, not a Ray traceback
        where = address or "a local cluster"
        raise RayUnavailable(f"cannot start/join Ray at {where}: {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:300]}") from None
    _started_here = not shared
    return where


@contextlib.contextmanager
def _neutral_cwd() -> Iterator[None]:
    """ray.init puts the driver's current directory on every worker's sys.path, where a
    user's search.py, evaluator.py or simcore.py would stand in for this package. Ray is
    therefore started from an empty directory of its own."""
    here = os.getcwd()
    neutral = os.path.join(tempfile.gettempdir(), f"agentservesim-ray-{os.getuid()}")
    os.makedirs(neutral, exist_ok=True)
    os.chdir(neutral)
    try:
        yield
    finally:
        os.chdir(here)


def _init(ray: Any, address: str | None, workers: int) -> str:
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        cpus = int(ray.cluster_resources().get("CPU", 0))
        return f"ray cluster {address} ({cpus} CPUs)"
    # A private local cluster: token auth is pointless on a loopback-only cluster and
    # would otherwise need a token file.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Workers must import what the driver imports, so they get the driver's import path,
    # and only that: not the current directory, where a user's search.py or evaluator.py
    # would stand in for this package (the driver runs with -P for the same reason).
    path = os.pathsep.join(p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p))
    ray.init(num_cpus=max(1, workers), include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    return f"local ray ({workers} workers)"


def shutdown() -> None:
    """Stop Ray if this process started or joined it here (a caller's own Ray is left alone)."""
    global _started_here
    try:
        import ray
        if _started_here and ray.is_initialized():
            ray.shutdown()
        _started_here = False
    except Exception:  # noqa: BLE001 - best effort at exit
        pass
