"""The snapshot segments of one GDN prefill piece, pipelined over two CUDA streams (`gdn_prefill_segments` under
$MODELD_GDN_OVERLAP=1, session 30).

Why: an engine prefills a long piece in snapshot segments (2048 tokens: the recurrent state is checkpointed after
each), and each segment runs prep → state pass → output pass back to back. The state pass is a serial chain over
64-token chunks on ~192 programs (1-2 per SM, latency-bound), while the next segment's prep reads only that
segment's inputs. Issuing segment i + 1's inputs (the caller's conv) and its prep before segment i's state pass,
with the prep on a side stream, lets the prep fill the SMs the state pass leaves idle. The arithmetic is the
sequential loop's launch for launch: the bits are the same.

Stream safety: the side stream waits for an event recorded on the main stream after the caller produced the
segment's inputs; the main stream waits for the prep's event before the state pass; the prep's scratch, allocated
on the side stream, is marked as used by the main stream (`record_stream`), so the caching allocator does not hand
its memory out again before the main stream's state and output passes are done with it. Off CUDA the same schedule
runs in order on the one device (the CPU tests exercise it that way).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


def pipelined(segments: Iterable[tuple], prep: Callable[[tuple], dict | None],
              scan: Callable[[tuple, dict | None], None],
              after_segment: Callable[[int], None] | None = None) -> None:
    """For each segment, in order: prep(segment) → scratch, then scan(segment, scratch), then after_segment(i).
    Segment i + 1 is drawn from `segments` (running whatever code produces it) and its prep issued before segment
    i's scan; on CUDA the preps run on a side stream. A segment's first element must be a tensor (its device picks
    the streams); a scratch is a dict (its tensor values are the prep's outputs) or None."""
    it = iter(segments)
    seg = next(it, None)
    if seg is None:
        return
    device = seg[0].device
    cuda = device.type == "cuda"
    main = torch.cuda.current_stream(device) if cuda else None
    side = torch.cuda.Stream(device) if cuda else None

    def launch(segment: tuple) -> tuple[tuple, dict | None, torch.cuda.Event | None]:
        if not cuda:
            return segment, prep(segment), None
        produced = torch.cuda.Event()
        produced.record(main)
        with torch.cuda.stream(side):
            side.wait_event(produced)
            scratch = prep(segment)
            ready = torch.cuda.Event()
            ready.record(side)
        for t in (scratch or {}).values():
            if isinstance(t, torch.Tensor):
                t.record_stream(main)
        return segment, scratch, ready

    current, i = launch(seg), 0
    while current is not None:
        following = next(it, None)   # the caller's code for segment i + 1 (e.g. its conv) runs here, on main
        upcoming = launch(following) if following is not None else None
        segment, scratch, ready = current
        if ready is not None:
            main.wait_event(ready)
        scan(segment, scratch)
        if after_segment is not None:
            after_segment(i)
        current, i = upcoming, i + 1

