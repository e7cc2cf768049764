"""`SlotEngine`: the model-independent half of a slot-based engine (decode plumbing + slot bytes).

A model package's engine subclasses it and supplies `config`, `options`, `device`, `spec`,
`state` and `forward` before calling `_init_slots(vocab)`; it keeps prefill, truncate and
reset (which depend on the model's state: llama's KV cuts exactly, qwen3_5's GDN state needs
checkpoints). What lives here is identical for every family:

* static decode buffers `_ids`/`_lens`/`_pos` [B] and `logits` [B, V] fp32, so a captured decode
  replays without allocating inputs (on CUDA filled by asynchronous copies from pinned staging buffers),
  and the capture policy (`options.use_graph`: None = capture on CUDA, eager elsewhere; True = capture
  or raise GraphCaptureError);
* `decode`: one token for every slot through the captured step;
* slot state bytes: header (magic, version, n, layout digest), the slot's per-position buffers
  [:n], its fixed buffers, its last logits. `load_slot` validates everything before writing.

Mutation: `decode`/`load_slot` mutate the named slots' state and `lengths`. Errors:
StateCapacityError, StateFormatError, GraphCaptureError.
"""

from __future__ import annotations

import hashlib
import struct
import warnings
from collections.abc import Sequence

import torch

from modeld.execution.errors import GraphCaptureError, StateCapacityError, StateFormatError
from modeld.execution.graphs import StepGraph
from modeld.execution.step import StepContext

STATE_VERSION = 1
STATE_HEAD = struct.Struct("<8sII32s")  # magic, version, n_tokens, layout digest


class SlotEngine:
    """Base class: subclasses set `STATE_MAGIC` (8 bytes) and `STATE_LABEL` (for error text) and
    may override `_decoded(slot)` / `_loaded(slot)` (hooks after a decode step / a slot load)."""

    STATE_MAGIC: bytes = b""
    STATE_LABEL: str = ""

    def _init_slots(self, vocab: int) -> None:
        """Allocate lengths, logits and the static decode inputs; capture decode per the options
        (warm-up + capture write into the empty state, which is zeroed afterwards)."""
        options = self.options
        self.lengths = [0] * options.slots
        B, dev = options.slots, self.device
        self.logits = torch.zeros(B, vocab, dtype=torch.float32, device=dev)  # last logits per slot
        self._ids = torch.zeros(B, dtype=torch.int64, device=dev)
        self._lens = torch.zeros(B, dtype=torch.int32, device=dev)
        self._pos = torch.zeros(B, dtype=torch.int64, device=dev)
        # Host staging of decode's inputs: pinned on CUDA, so the two copies per step are asynchronous (a copy
        # from pageable memory first synchronises the stream and stages through a driver buffer); the event
        # keeps a step from overwriting them before the previous step's copies have read them.
        pin = dev.type == "cuda"
        self._ids_host = torch.zeros(B, dtype=torch.int64, pin_memory=pin)
        self._lens_host = torch.zeros(B, dtype=torch.int32, pin_memory=pin)
        self._inputs_read = torch.cuda.Event() if pin else None
        self.graph = StepGraph(self._decode_step, dev)
        self.graph_error: str | None = None
        want_graph = options.use_graph if options.use_graph is not None else dev.type == "cuda"
        if want_graph:
            try:
                self.graph.capture()
            except GraphCaptureError as exc:
                if options.use_graph:
                    raise
                self.graph_error = str(exc)
            self.state.zero_()
            self.logits.zero_()

    @property
    def layout_digest(self) -> bytes:
        """sha256 over the state layout (names, shapes, dtypes) and config: state bytes carry it."""
        desc = repr([(p.spec.name, p.spec.shape[1:], str(p.spec.dtype)) for p in self.state.layout])
        return hashlib.sha256((desc + repr(self.config)).encode()).digest()

    # ---------------------------------------------------------------- decode
    def _decode_step(self) -> torch.Tensor:
        self._pos.copy_(self._lens)
        ctx = StepContext(decode=True, positions=self._pos, cache_lens=self._lens)
        self.logits.copy_(self.forward(self._ids, ctx))
        return self.logits

    def _decoded(self, slot: int) -> None:
        """Hook: called for every slot right after its length grew by one in `decode`."""

    def decode(self, tokens: Sequence[int]) -> torch.Tensor:
        """One token for every slot (len(tokens) == slots) at positions lengths[b]; returns logits
        [B, V] fp32 (the static `self.logits`). Raises StateCapacityError."""
        if len(tokens) != self.options.slots:
            raise StateCapacityError(f"decode takes one token per slot ({self.options.slots}), got {len(tokens)}")
        for n in self.lengths:
            self.spec.check_fits(n + 1)
        ids = torch.tensor(list(tokens), dtype=torch.int64)
        if self._inputs_read is not None:
            self._inputs_read.synchronize()  # the previous step's copies are done with the staging buffers
        self._ids_host.copy_(ids)
        self._lens_host.copy_(torch.tensor(self.lengths, dtype=torch.int32))
        self._ids.copy_(self._ids_host, non_blocking=True)
        self._lens.copy_(self._lens_host, non_blocking=True)
        if self._inputs_read is not None:
            self._inputs_read.record()
        out = self.graph()
        for b in range(self.options.slots):
            self.lengths[b] += 1
            self._decoded(b)
        return out

    # ---------------------------------------------------------------- slot bytes
    def _slot_views(self, slot: int, n: int) -> list[torch.Tensor]:
        """The slot's saved tensors, in byte order: per-position buffers [:n], fixed buffers, logits."""
        views = [self.state[m][slot, :n] for m in self.spec.kv_names()]
        views += [self.state[m][slot] for m in self.spec.fixed_names()]
        return views + [self.logits[slot]]

    def _loaded(self, slot: int) -> None:
        """Hook: called after `load_slot` wrote a slot's state, before its length is set."""

    def save_slot(self, slot: int) -> bytearray:
        """The slot's state as bytes: header, KV of its positions, fixed state, last logits."""
        n = self.lengths[slot]
        return views_to_bytes(STATE_HEAD.pack(self.STATE_MAGIC, STATE_VERSION, n, self.layout_digest),
                              self._slot_views(slot, n))

    def load_slot(self, slot: int, payload: bytes) -> int:
        """Replace the slot's state by `save_slot` bytes; returns the position count. Validates
        everything before writing anything. Raises StateFormatError."""
        if len(payload) < STATE_HEAD.size:
            raise StateFormatError("state bytes are shorter than their header")
        magic, version, n, digest = STATE_HEAD.unpack_from(payload, 0)
        if magic != self.STATE_MAGIC or version != STATE_VERSION:
            raise StateFormatError(f"not {self.STATE_LABEL} engine state bytes (bad magic or version)")
        if digest != self.layout_digest:
            raise StateFormatError("state bytes were written by an engine of another layout or config")
        if n > self.options.capacity:
            raise StateFormatError(f"state holds {n} positions, capacity is {self.options.capacity}")
        views = self._slot_views(slot, n)
        need = STATE_HEAD.size + sum(v.numel() * v.element_size() for v in views)
        if len(payload) != need:
            raise StateFormatError(f"state bytes are {len(payload)} long, the layout needs {need}")
        bytes_into_views(payload, STATE_HEAD.size, views)
        self._loaded(slot)
        self.lengths[slot] = n
        return n


def views_to_bytes(head: bytes, views: Sequence[torch.Tensor]) -> bytearray:
    """`head`, then each view's raw bytes, in ONE host buffer: every view is copied once, straight into its place
    (a device view by one device-to-host copy). Joining per-view bytes made three copies (host tensor, its
    bytes, the join), so a 27B slot (~0.2 GB of GDN state) peaked at three times its size on the host."""
    sizes = [v.numel() * v.element_size() for v in views]
    buf = bytearray(len(head) + sum(sizes))
    buf[: len(head)] = head
    off = len(head)
    for v, nb in zip(views, sizes):
        if nb:
            dst = torch.frombuffer(buf, dtype=torch.uint8, count=nb, offset=off)
            dst.copy_(v.detach().contiguous().view(torch.uint8).reshape(-1))
        off += nb
    return buf


def bytes_into_views(payload, offset: int, views: Sequence[torch.Tensor]) -> None:
    """The inverse of `views_to_bytes` after its head: each view filled from its raw bytes at `offset` on, read in
    place (`bytes_view`, no host copy). MUTATES the views."""
    for v in views:
        nb = v.numel() * v.element_size()
        if nb:
            v.copy_(bytes_view(payload, offset, nb).view(v.dtype).view(v.shape))
        offset += nb


def bytes_view(payload, offset: int, nbytes: int) -> torch.Tensor:
    """uint8 tensor over payload[offset : offset + nbytes] WITHOUT copying it (any buffer: bytes, bytearray,
    memoryview). Read-only by contract: torch warns that an immutable buffer is not writable, which is why the
    warning is silenced here, and nothing writes through the result."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(payload, dtype=torch.uint8, count=nbytes, offset=offset)
