"""One rich progress bar for long offline work (synth, convert, verify).

The bar goes to stderr and disables itself when stderr is not a terminal (CI logs stay clean)
unless `MODELD_PROGRESS=1` forces it. rich is imported lazily so `import modeld.convert` stays light.
"""

from __future__ import annotations

import os
import sys
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


@contextmanager
def byte_progress(title: str, total_bytes: int) -> Iterator[Progress]:
    """Yield a progress sink counting bytes toward `total_bytes` (rate, ETA, current item)."""
    forced = os.environ.get("MODELD_PROGRESS") == "1"
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
