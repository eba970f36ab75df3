"""Which CPU a sandboxed simulation (its thread and its worker) may keep to itself.

A run pins the simulating thread and its worker to one CPU (client.WorkerProcess.session).
Two runs pinned to the same CPU would share it while another CPU idles, and the kernel
could not fix that, so CPUs are claimed with an flock on one lock file per CPU in the
temp directory: exclusive across threads and processes of this machine (Ray workers
included), and released by the kernel when a process dies. With no free CPU, the run is
not pinned (the kernel balances it).
"""
from __future__ import annotations

import fcntl
import os
import tempfile
from dataclasses import dataclass
from typing import Callable


@dataclass
class Claim:
    cpu: int
    _fd: int

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # drops the flock
            self._fd = -1


def _lock_path(cpu: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"agentservesim-cpu{cpu}.lock")


def claim(mask: set[int], here: int | None, lock_path: Callable[[int], str] | None = None) -> Claim | None:
    """Claim a free CPU of `mask`, trying `here` (the CPU this thread runs on) first."""
    lock_path = lock_path or _lock_path
    for cpu in sorted(mask, key=lambda c: (c != here, c)):
        try:
            # read-only is enough for flock, so a lock file another user created still works
            fd = os.open(lock_path(cpu), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError:
            return None  # no writable temp dir: do not pin
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return Claim(cpu, fd)
    return None
