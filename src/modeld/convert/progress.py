"""One rich progress bar for long offline work (synth, convert, verify).

The bar goes to stderr and disables itself when stderr is not a terminal (CI logs stay clean)
unless `MODELD_PROGRESS=1` forces it. `MODELD_PROGRESS=lines` prints one plain line every
`MODELD_PROGRESS_EVERY` seconds (default 30) instead: for long runs logged to a file.
rich is imported lazily so `import modeld.convert` stays light.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator, Protocol


class Progress(Protocol):
    def advance(self, nbytes: int, label: str | None = None) -> None: ...


class _Null:
    def advance(self, nbytes: int, label: str | None = None) -> None:
        return None


class _Rich:
    def __init__(self, bar, task) -> None:
        self._bar, self._task = bar, task

    def advance(self, nbytes: int, label: str | None = None) -> None:
        if label is not None:
            self._bar.update(self._task, advance=nbytes, description=label[-60:])
        else:
            self._bar.update(self._task, advance=nbytes)


class _Lines:
    """Plain progress lines on stderr, at most one per `every` seconds, plus a final one."""

    def __init__(self, title: str, total: int, every: float) -> None:
        self.title, self.total, self.every = title, max(total, 1), every
        self.done, self.start = 0, time.monotonic()
        self.last = self.start

    def advance(self, nbytes: int, label: str | None = None) -> None:
        self.done += nbytes
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self.line(label)

    def line(self, label: str | None = None) -> None:
        elapsed = time.monotonic() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        print(f"{self.title}: {self.done / 1e9:.2f}/{self.total / 1e9:.2f} GB ({100 * self.done / self.total:.1f}%) "
              f"{rate / 1e6:.1f} MB/s elapsed {elapsed:.0f} s eta {eta:.0f} s {label or ''}",
              file=sys.stderr, flush=True)


@contextmanager
def byte_progress(title: str, total_bytes: int) -> Iterator[Progress]:
    """Yield a progress sink counting bytes toward `total_bytes` (rate, ETA, current item)."""
    mode = os.environ.get("MODELD_PROGRESS")
    if mode == "lines":
        sink = _Lines(title, total_bytes, float(os.environ.get("MODELD_PROGRESS_EVERY", "30")))
        yield sink
        sink.line("done")
        return
    forced = mode == "1"
    if not (forced or sys.stderr.isatty()):
        yield _Null()
        return
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress as RichProgress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn, TransferSpeedColumn)

    columns = (TextColumn(f"[bold]{title}[/] {{task.description}}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with RichProgress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task("", total=total_bytes)
        yield _Rich(bar, task)
