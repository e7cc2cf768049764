"""CUDA-graph capture of a fixed step (decode): static inputs, one capture, replay.

The step function must read only its static input buffers and the arena, and write its result
into static outputs (it may allocate temporaries: they come from the graph's private pool and
stay valid across replays). On a non-CUDA device `StepGraph` simply calls the function: the same
engine code runs eagerly on CPU with reference kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from modeld.execution.errors import GraphCaptureError


class StepGraph:
    """Wraps `fn()` (no arguments; reads/writes static buffers, returns a tensor).

    `capture()` warms up on a side stream and records one CUDA graph (CUDA only; raises
    GraphCaptureError elsewhere or if recording fails). Graphs given one `pool` share their temporaries' memory:
    only for graphs that never run concurrently and whose output is consumed before another of them replays
    (a later replay may reuse an earlier graph's output memory for its temporaries). `__call__` replays the graph when captured
    and calls `fn` eagerly otherwise; it returns the (static) output tensor. Mutates whatever fn
    mutates — warm-up runs also do, so capture before the state holds anything that matters, or
    save and restore it around the capture.
    """

    def __init__(self, fn: Callable[[], torch.Tensor], device: torch.device, name: str = "decode",
                 pool: object | None = None) -> None:
        self.fn = fn
        self.device = device
        self.name = name
        self.pool = pool  # a `torch.cuda.graph_pool_handle()` shared with other graphs, or None: a private pool
        self.graph = None
        self.output: torch.Tensor | None = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def capture(self, warmup: int = 2) -> None:
        if self.device.type != "cuda":
            raise GraphCaptureError(f"CUDA graphs need a CUDA device, not {self.device}")
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    self.fn()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.output = self.fn()
        except Exception as exc:  # torch raises RuntimeError subclasses for capture faults
            raise GraphCaptureError(f"{self.name} graph capture failed: {exc}") from exc
        self.graph = graph

    def __call__(self) -> torch.Tensor:
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.output


def reserved_after_empty_cache(device: torch.device) -> int:
    """Bytes the CUDA caching allocator holds on `device` once its free cached blocks are released (0 off CUDA).

    What a capture keeps is the difference of this before and after it, not of plain `memory_reserved`:
    `torch.cuda.graph` empties the cache when it starts a capture, so the warm-up's freed temporaries leave the count
    just as the graph's pool adds the same sizes back, and a plain difference can come out 0 for a pool of megabytes
    (H200 session 27; KNOWLEDGE/pitfalls/graph-capture-empties-the-cache.md)."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved(device)
