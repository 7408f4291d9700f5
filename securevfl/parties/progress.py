"""Progress display for long runs: a rich bar on a terminal, one line per epoch
otherwise (logs, CI)."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress


class Progress:
    def __init__(self, label: str, total_steps: int, *, enabled: bool):
        self.label = label
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self._bar: Any = None
        self._task: Any = None
        self._t0 = time.perf_counter()
        if self.tty:
            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} steps"),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(label, total=total_steps, info="")

    def note(self, text: str) -> None:
        """A message the user must see even with progress off (e.g. a budget stop)."""
        if self._bar is not None:
            self._bar.console.print(f"[{self.label}] {text}")
        else:
            print(f"[{self.label}] {text}", file=sys.stderr, flush=True)

    def step(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def epoch(self, epoch: int, epochs: int, info: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, info=f"epoch {epoch}/{epochs} {info}")
        elif self.enabled:
            dt = time.perf_counter() - self._t0
            print(
                f"[{self.label}] epoch {epoch}/{epochs} {info} ({dt:.1f} s)",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
