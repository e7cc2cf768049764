"""Human output for the T3 commands: rich tables for resolutions, cells, hosts and models.

Writes to the given rich Console only; the commands' `--json` output does not come through here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from modeld.distribution.checks import gib
from modeld.host.facts import HostFacts

if TYPE_CHECKING:
    from modeld.distribution.artifacts import Artifact
    from modeld.distribution.manifests import CellManifest
    from modeld.distribution.resolver import Resolution

PROGRESS_MIN_BYTES = 256 << 20  # show a hashing progress bar only for files this large


def _artifact_line(artifact: Artifact | None) -> str:
    if artifact is None:
        return "none installed"
    state = "" if artifact.present else " [red](missing)[/red]"
    ident = artifact.weights_id or "weights id unknown"
    return (f"{artifact.path}{state}\n  format {artifact.format}, family "
            f"{artifact.family or '?'}, model_id {artifact.model_id or '?'}, {ident}")


def print_resolution(console: Console, res: Resolution, manifests: Sequence[CellManifest]) -> None:
    console.print(f"[bold]request[/bold]  {res.request}")
    console.print(f"[bold]artifact[/bold] {_artifact_line(res.artifact)}")
    if res.artifact is not None and res.artifact.problem:
        console.print(f"  [yellow]note[/yellow]: {res.artifact.problem}")
    table = Table(title="cells considered", show_lines=True)
    for column in ("cell", "backend", "rank", "verdict", "reasons"):
        table.add_column(column, overflow="fold")
    for cell in manifests:
        chosen = res.cell is not None and res.cell.id == cell.id
        verdict = ("[green]SELECTED[/green]" + (" (fall-through)" if res.fell_through else "")
                   if chosen else "[red]rejected[/red]")
        reasons = "\n".join(f"{r.reason.value}: {r.detail}" for r in res.rejections_for(cell.id))
        table.add_row(cell.id, cell.backend.value, str(cell.rank), verdict, reasons or "-")
    console.print(table)
    if res.cell is None:
        console.print("[red bold]no cell can serve this request[/red bold]")


def _requirements(cell: CellManifest) -> str:
    req = cell.requirements
    if req.gpu_count == 0:
        return "none (CPU ok)"
    parts = [f"{req.gpu_count}x GPU"]
    if req.gpu_archs:
        parts.append("/".join(req.gpu_archs))
    if req.min_driver:
        parts.append(f"driver>={req.min_driver}")
    if req.cuda_runtime_major:
        parts.append(f"CUDA {req.cuda_runtime_major}.x")
    if req.min_total_memory_bytes:
        parts.append(f"total>={gib(req.min_total_memory_bytes)}")
    if req.min_free_memory_bytes:
        parts.append(f"free>={gib(req.min_free_memory_bytes)}")
    if req.interconnect.value != "any":
        parts.append(req.interconnect.value)
    return ", ".join(parts)


def _served_models(cell: CellManifest) -> str:
    """One line per model id; a model served in several artifacts (e.g. fp8 with and without the quantized head)
    says how many."""
    counts = Counter(s.model_id for s in cell.serves)
    return "\n".join(m if n == 1 else f"{m} ({n} artifacts)" for m, n in counts.items())


def print_cells(console: Console, manifests: Sequence[CellManifest]) -> None:
    table = Table(title="cell manifests")
    for column in ("id", "version", "backend", "rank", "serves", "formats", "family",
                   "requirements", "profiles"):
        table.add_column(column, overflow="fold")
    for cell in manifests:
        serves = "any" if cell.serves_any else _served_models(cell)
        table.add_row(cell.id, cell.version, cell.backend.value, str(cell.rank), serves,
                      "/".join(cell.artifact_formats), cell.family or "any", _requirements(cell),
                      f"w:{cell.weight_profile} kv:{cell.kv_profile}")
    console.print(table)


def print_host(console: Console, host: HostFacts) -> None:
    table = Table(title="host", show_header=False)
    table.add_column("fact")
    table.add_column("value", overflow="fold")
    avail = "?" if host.ram_available_bytes is None else gib(host.ram_available_bytes)
    rows = [
        ("os", f"{host.os} {host.os_release} ({host.machine}), Python {host.python}"),
        ("cpu", f"{host.cpu_model}, {host.cpu_cores} cores"),
        ("ram", f"{gib(host.ram_total_bytes)} total, {avail} available"),
        ("driver", host.driver_version or "none"),
        ("CUDA", f"driver supports {host.cuda_driver_version or 'none'}, "
                 f"runtime {host.cuda_runtime_version or 'none'}"),
        ("gpus", str(host.gpu_count) + (f", interconnect {host.interconnect}"
                                         if host.gpu_count > 1 else "")),
    ]
    for gpu in host.gpus:
        free = "?" if gpu.free_memory_bytes is None else gib(gpu.free_memory_bytes)
        rows.append((f"gpu {gpu.index}", f"{gpu.name} {gpu.arch}, "
                     f"{gib(gpu.total_memory_bytes)} total, {free} free, "
                     f"{gpu.nvlink_active_links} NVLink links"))
    rows.append(("sources", ", ".join(host.sources)))
    for note in host.notes:
        rows.append(("note", note))
    for fact, value in rows:
        table.add_row(fact, value)
    console.print(table)


def print_models(console: Console, artifacts: Sequence[Artifact]) -> None:
    table = Table(title="models on this host", show_lines=True)
    for column in ("names", "format", "family", "size", "model_id / weights_id", "path"):
        table.add_column(column, overflow="fold")
    for art in artifacts:
        size = "missing" if not art.present else gib(art.size_bytes or 0)
        ident = f"{art.model_id or '?'}\n{art.weights_id or '?'}"
        if art.problem:
            ident += f"\n[yellow]{art.problem}[/yellow]"
        table.add_row("\n".join(art.names), art.format, art.family or "?", size, ident, art.path)
    console.print(table)


@contextmanager
def hashing_progress(console: Console) -> Iterator[Callable[[int, int], None]]:
    """A progress callback for `gguf_weights_id`; shows a rich bar only for large files."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    state: dict = {}
    progress = Progress("hashing weights", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                        console=console, transient=True)

    def update(done: int, total: int) -> None:
        if total < PROGRESS_MIN_BYTES:
            return
        if "task" not in state or state["total"] != total or done < state["done"]:
            if "task" not in state:
                progress.start()
            else:
                progress.remove_task(state["task"])
            state["task"] = progress.add_task("hash", total=total)
            state["total"] = total
        state["done"] = done
        progress.update(state["task"], completed=done)

    try:
        yield update
    finally:
        if "task" in state:
            progress.stop()
