"""Arrival-counter workspaces for last-arriver merges (fused decode attention, fused split-K GEMV finish).

A kernel that merges partials in its LAST arriving program needs int32 counters that are zero before
each launch: every program bumps one (`tl.atomic_add(sem="acq_rel", scope="gpu")` after a
`tl.debug_barrier()`), and the program that sees the count complete merges and stores 0 back, so the
next launch (or CUDA-graph replay) starts from zero again.

Buffers are keyed by (name, device, stream): kernels on one stream never overlap, so callers on
different streams never share a counter, and different users (`name`: "attention-decode",
"gemv-split") never share a buffer. A captured graph keeps the address of its capture stream's buffer,
so buffers are never freed (outgrown ones move to _RETIRED) and never allocated during a capture: a
capture claims a spare zeroed while not capturing (every eager allocation leaves one per (name,
device)), else raises the caller's ArrivalWorkspaceError subclass. StepGraph warms up on a side
stream and captures on another one; the warm-up leaves the spare that the capture takes.
KNOWLEDGE/optimizations/decode-attention-fused-launch.md, gemv-split-k-fused-finish.md.
"""

from __future__ import annotations

import contextlib

import torch

from modeld.kernels.errors import KernelError

__all__ = ["ArrivalWorkspaceError", "reserve", "counter_buffer"]


class ArrivalWorkspaceError(KernelError):
    """A last-arriver kernel needs a larger arrival-counter buffer while a CUDA graph is being captured."""


# (name, device, stream) -> the stream's counters; (name, device) -> zeroed spares for captures.
_COUNTERS: dict[tuple[str, str, int], torch.Tensor] = {}
_SPARES: dict[tuple[str, str], list[torch.Tensor]] = {}
_RETIRED: list[torch.Tensor] = []
_MIN_COUNTERS = 1024


def _stream_key(device: torch.device, stream=None) -> tuple[str, int]:
    if device.type != "cuda":
        return (str(device), 0)
    if device.index is None:  # "cuda" and "cuda:0" must name one buffer (tensors report cuda:N)
        device = torch.device("cuda", torch.cuda.current_device())
    return (str(device), (stream or torch.cuda.current_stream(device)).cuda_stream)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def reserve(name: str, device: torch.device, n: int, stream=None, error: type[ArrivalWorkspaceError] =
            ArrivalWorkspaceError, hint: str = "") -> torch.Tensor:
    """Make the `name` counter buffer of (device, stream) (default: current stream) hold >= n zeroed
    counters, plus a spare of the same size for a later capture on another stream; return the buffer.

    MUTATES the module's counter tables. During a capture it never allocates: it hands the stream a
    reserved spare, or raises `error` (message + `hint`) when no spare is large enough.
    """
    dev, sid = _stream_key(device, stream)
    key = (name, dev, sid)
    buf = _COUNTERS.get(key)
    if buf is not None and buf.numel() >= n:
        return buf
    spares = _SPARES.setdefault((name, dev), [])
    fit = [t for t in spares if t.numel() >= n]
    if _capturing(device):
        if not fit:
            raise error(f"{name} needs {n} arrival counters on {dev} but none are reserved for this capture: "
                        f"{hint or 'run one eager call of the same shape before capturing'}")
        spares.remove(fit[0])
        new = fit[0]
    else:
        size = max(_MIN_COUNTERS, 1 << (n - 1).bit_length())
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            new = torch.zeros(size, dtype=torch.int32, device=device)
            if not fit:
                spares.append(torch.zeros(size, dtype=torch.int32, device=device))
    if buf is not None:
        _RETIRED.append(buf)  # a captured graph may still address it
    _COUNTERS[key] = new
    return new


def counter_buffer(name: str, device: torch.device, stream=None) -> torch.Tensor | None:
    """The `name` counter buffer of (device, stream) if one exists (tests check it is all zero)."""
    dev, sid = _stream_key(device, stream)
    return _COUNTERS.get((name, dev, sid))
