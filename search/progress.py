"""Live progress of a search: iterations, LLM calls pending and their age, evaluations in
flight, best per island, failures.

On a terminal it is a rich Live panel; otherwise (CI, pipes) one plain line per event.
Updates come from job threads and the main thread, so state changes take a lock. Every
string that a user, an LLM or a candidate wrote is shown as plain text (rich.text.Text,
control characters replaced), never parsed as markup.
"""
from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import Any, Callable

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .display import strip_control


class Progress:
    def __init__(self, title: str, planned: int, in_flight: Callable[[], int] = lambda: 0,
                 console: Console | None = None) -> None:
        self.title, self.planned = title, planned
        self.console = console or Console(highlight=False, soft_wrap=True)
        self._in_flight = in_flight
        self._lock = threading.Lock()
        self.done_iterations: set[int] = set()
        self.scored = self.replayed = 0
        self.failures: Counter[str] = Counter()
        self.iteration_errors = 0
        self.best_by_island: dict[int, tuple[float, float, str]] = {}
        self.events: deque[str] = deque(maxlen=6)
        self.llm_pending: dict[int, tuple[str, float]] = {}
        self.t0 = time.monotonic()
        self._live: Live | None = None

    # ------------------------------------------------------------------ updates
    def _event(self, line: str) -> None:
        line = strip_control(line)
        self.events.append(line)
        if self._live is None:
            self.console.print(line, markup=False, highlight=False)

    def note(self, line: str) -> None:
        with self._lock:
            self._event(line)

    def submitted(self, iteration: int) -> None:
        pass

    def llm_started(self, iteration: int, model: str) -> None:
        with self._lock:
            self.llm_pending[iteration] = (model, time.monotonic())

    def llm_finished(self, iteration: int) -> None:
        with self._lock:
            self.llm_pending.pop(iteration, None)

    def record(self, result: Any, replayed: bool = False) -> None:
        """A scored candidate (a CandidateResult)."""
        with self._lock:
            it = int(result.iteration)
            if it > 0:
                self.done_iterations.add(it)
            self.scored += 1
            self.replayed += int(replayed)
            tag = " (replayed)" if replayed else ""
            if result.status != "ok":
                self.failures[str(result.failure_kind or "failed")] += 1
                self._event(f"iter {it:>3} {result.candidate_id}  FAILED {result.failure_kind}: "
                            f"{(result.reason or '')[:110]}{tag}")
                return
            lo, hi = result.fitness_ci
            isl = int(result.island or 0)
            key = (lo, result.fitness, result.candidate_id)
            if isl not in self.best_by_island or key[:2] > self.best_by_island[isl][:2]:
                self.best_by_island[isl] = key
            self._event(f"iter {it:>3} {result.candidate_id}  fitness {result.fitness:.4f} [{lo:.4f}, {hi:.4f}]"
                        f"  island {isl}{tag}")

    def iteration_error(self, iteration: int, msg: str) -> None:
        with self._lock:
            self.done_iterations.add(iteration)
            self.iteration_errors += 1
            self._event(f"iter {iteration:>3} {msg[:160]}")

    @property
    def iterations_done(self) -> int:
        with self._lock:
            return len(self.done_iterations)

    # ------------------------------------------------------------------ display
    def _render(self) -> Panel:
        with self._lock:
            now = time.monotonic()
            t = Table.grid(padding=(0, 2))
            t.add_row("iterations", f"{len(self.done_iterations)}/{self.planned}",
                      "evaluations in flight", str(self._in_flight()),
                      "elapsed", f"{now - self.t0:,.0f} s")
            isl = "  ".join(f"island {i}: {f:.4f} [lo {lo:.4f}] ({cid})"
                            for i, (lo, f, cid) in sorted(self.best_by_island.items()))
            fails = ", ".join(f"{k} {v}" for k, v in sorted(self.failures.items())) or "none"
            pending = "  ".join(f"iter {it} {model} {now - t0:,.0f} s"
                                for it, (model, t0) in sorted(self.llm_pending.items())) or "none"
            body = Group(t, Text(f"LLM calls pending  {pending}"),
                         Text(f"best  {isl or '-'}"),
                         Text(f"failed candidates  {fails};  iterations without a candidate: {self.iteration_errors}"),
                         Text("\n".join(self.events), style="dim"))
        return Panel(body, title=Text(strip_control(self.title)))

    def __enter__(self) -> "Progress":
        if self.console.is_terminal:
            self._live = Live(get_renderable=self._render, console=self.console, refresh_per_second=2,
                              transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None
