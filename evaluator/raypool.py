"""Starting or joining Ray for candidate evaluation.

Local runs start a private Ray on this machine sized by --workers; `--ray-address` or
RAY_ADDRESS joins an existing cluster instead. Either way only the driver (the search
process, never a forked child of it: a forked Ray driver hangs) talks to Ray.
"""
from __future__ import annotations

import logging
import os
import sys


_started_here = False


class RayUnavailable(RuntimeError):
    """Ray could not be started or joined; the message is one line."""


def connect(address: str | None, workers: int) -> str:
    """Start (address None) or join Ray; returns a short description for the progress display."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("ray is not installed: pip install 'agentservesim[search]'") from None
    global _started_here
    if ray.is_initialized():
        return "ray (already connected)"
    address = address or os.environ.get("RAY_ADDRESS") or None
    try:
        if address:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            _started_here = True
            cpus = int(ray.cluster_resources().get("CPU", 0))
            return f"ray cluster {address} ({cpus} CPUs)"
        # A private local cluster: token auth is pointless on a loopback-only cluster and
        # would otherwise need a token file.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        # Workers must import what the driver imports (e.g. a simulator given as a module
        # of the working tree), so they get the driver's import path.
        path = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p and os.path.isdir(p))
        ray.init(num_cpus=max(1, workers), include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
        _started_here = True
        return f"local ray ({workers} workers)"
    except Exception as e:  # noqa: BLE001 - one line for the user, not a Ray traceback
        where = address or "a local cluster"
        raise RayUnavailable(f"cannot start/join Ray at {where}: {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:300]}") from None


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
