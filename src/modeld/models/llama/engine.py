"""`LlamaEngine`: weights + KV arena + bound kernels + the fixed schedule, for `slots` sequences.

Schedule (fixed at load): prefill runs the forward over chunks of at most `prefill_chunk` tokens
of one slot; decode runs one token for every slot through one captured step (a CUDA graph on
CUDA devices, eager elsewhere). Per-step inputs live in small static buffers (`_ids`, `_lens`,
`_pos`) so replays never allocate inputs. Llama has no recurrent state: `truncate` is exact and
free (the length drops; stale KV past it is never read and is overwritten by the next write).

Mutation: `prefill`/`decode`/`truncate`/`load_slot`/`reset_slot` mutate the named slots' KV and
`lengths`; everything else is read-only. Errors: StateCapacityError (too many positions),
StateFormatError (bad state bytes), GraphCaptureError (use_graph=True and capture failed).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from modeld.execution.arena import Arena
from modeld.execution.bindings import KernelSet, default_kernels
from modeld.execution.errors import ExecutionError, GraphCaptureError, StateCapacityError
from modeld.execution.graphs import StepGraph
from modeld.execution.sources import TensorSource
from modeld.models.llama.config import LlamaConfig
from modeld.models.llama.forward import LlamaForward, Probe, StepContext
from modeld.models.llama.state import LlamaStateSpec
from modeld.models.llama.weights import LlamaWeights, LoadReport

_STATE_MAGIC = b"LLMSTATE"
_STATE_VERSION = 1
_STATE_HEAD = struct.Struct("<8sII32s")  # magic, version, n_tokens, layout digest


class StateFormatError(ExecutionError):
    """Slot-state bytes are truncated, of another layout, or describe more positions than fit."""


@dataclass(frozen=True)
class EngineOptions:
    slots: int = 1
    capacity: int = 4096          # positions per slot (KV cache length S)
    prefill_chunk: int = 512      # tokens per forward call during prefill
    use_graph: bool | None = None  # None: capture on CUDA, eager elsewhere; True: capture or raise


class LlamaEngine:
    """Plans and loads the weights from `source`, sizes the KV arena, binds kernels, captures decode."""

    def __init__(self, config: LlamaConfig, source: TensorSource, device: torch.device | str = "cpu",
                 kernels: KernelSet | None = None, options: EngineOptions = EngineOptions(),
                 progress=None) -> None:
        self.config, self.options = config, options
        self.device = torch.device(device)
        self.kernels = kernels or default_kernels(self.device)
        self.weights = LlamaWeights(config, source, self.device)
        self.load_report: LoadReport = self.weights.load(progress)
        self.spec = LlamaStateSpec(config, options.slots, options.capacity)
        self.state = Arena.from_specs(self.spec.specs(), self.device)
        self.forward = LlamaForward(config, self.weights, self.state, self.kernels)
        self.lengths = [0] * options.slots
        B, dev = options.slots, self.device
        self.logits = torch.zeros(B, config.vocab, dtype=torch.float32, device=dev)  # last logits per slot
        self._ids = torch.zeros(B, dtype=torch.int64, device=dev)
        self._lens = torch.zeros(B, dtype=torch.int32, device=dev)
        self._pos = torch.zeros(B, dtype=torch.int64, device=dev)
        self.graph = StepGraph(self._decode_step, dev)
        self.graph_error: str | None = None
        want_graph = options.use_graph if options.use_graph is not None else dev.type == "cuda"
        if want_graph:
            try:
                self.graph.capture()  # warm-up + capture write into the (empty) KV: zeroed below
            except GraphCaptureError as exc:
                if options.use_graph:
                    raise
                self.graph_error = str(exc)
            self.state.zero_()
            self.logits.zero_()

    @property
    def layout_digest(self) -> bytes:
        """sha256 over the state layout and config: state bytes carry it."""
        desc = repr([(p.spec.name, p.spec.shape[1:], str(p.spec.dtype)) for p in self.state.layout])
        return hashlib.sha256((desc + repr(self.config)).encode()).digest()

    # ---------------------------------------------------------------- prefill / decode
    def prefill(self, slot: int, tokens: Sequence[int], probe: Probe | None = None,
                all_logits: bool = False) -> torch.Tensor:
        """Evaluate `tokens` at positions lengths[slot].. of `slot`. Returns the last token's
        logits [V] fp32 (a view of `self.logits[slot]`), or with `all_logits` a new [T, V] fp32
        tensor of every position (scoring). Raises StateCapacityError before any work."""
        if not len(tokens):
            raise StateCapacityError("prefill needs at least one token")
        start = self.lengths[slot]
        end = start + len(tokens)
        self.spec.check_fits(end)
        ids_all = torch.tensor(list(tokens), dtype=torch.int64, device=self.device)
        outs, pos = [], start
        while pos < end:
            stop = min(end, pos + self.options.prefill_chunk)
            positions = torch.arange(pos, stop, dtype=torch.int64, device=self.device)
            ctx = StepContext(decode=False, positions=positions, slot=slot, start=pos)
            out = self.forward(ids_all[pos - start : stop - start], ctx, last_only=not all_logits, probe=probe)
            self.logits[slot].copy_(out[-1])
            if all_logits:
                outs.append(out)
            pos = stop
            self.lengths[slot] = pos
        return torch.cat(outs) if all_logits else self.logits[slot]

    def _decode_step(self) -> torch.Tensor:
        self._pos.copy_(self._lens)
        ctx = StepContext(decode=True, positions=self._pos, cache_lens=self._lens)
        self.logits.copy_(self.forward(self._ids, ctx))
        return self.logits

    def decode(self, tokens: Sequence[int]) -> torch.Tensor:
        """One token for every slot (len(tokens) == slots) at positions lengths[b]; returns logits
        [B, V] fp32 (the static `self.logits`). Raises StateCapacityError."""
        if len(tokens) != self.options.slots:
            raise StateCapacityError(f"decode takes one token per slot ({self.options.slots}), got {len(tokens)}")
        for n in self.lengths:
            self.spec.check_fits(n + 1)
        self._ids.copy_(torch.tensor(list(tokens), dtype=torch.int64))
        self._lens.copy_(torch.tensor(self.lengths, dtype=torch.int32))
        out = self.graph()
        for b in range(self.options.slots):
            self.lengths[b] += 1
        return out

    # ---------------------------------------------------------------- state management
    def reset_slot(self, slot: int) -> None:
        """Forget the slot's sequence (KV past length 0 is never read, so nothing is zeroed)."""
        self.lengths[slot] = 0
        self.logits[slot].zero_()

    def truncate(self, slot: int, n: int) -> None:
        """Keep exactly the first n positions of the slot (exact: KV only). Logits become stale."""
        if n < self.lengths[slot]:
            self.lengths[slot] = max(0, n)

    def save_slot(self, slot: int) -> bytes:
        """The slot's state as bytes: header, KV of its positions, last logits."""
        n = self.lengths[slot]
        parts = [_STATE_HEAD.pack(_STATE_MAGIC, _STATE_VERSION, n, self.layout_digest)]
        parts += [_bytes(self.state[name][slot, :n]) for name in self.spec.kv_names()]
        parts.append(_bytes(self.logits[slot]))
        return b"".join(parts)

    def load_slot(self, slot: int, payload: bytes) -> int:
        """Replace the slot's state by `save_slot` bytes; returns the position count. Validates
        everything before writing anything. Raises StateFormatError."""
        if len(payload) < _STATE_HEAD.size:
            raise StateFormatError("state bytes are shorter than their header")
        magic, version, n, digest = _STATE_HEAD.unpack_from(payload, 0)
        if magic != _STATE_MAGIC or version != _STATE_VERSION:
            raise StateFormatError("not llama engine state bytes (bad magic or version)")
        if digest != self.layout_digest:
            raise StateFormatError("state bytes were written by an engine of another layout or config")
        if n > self.options.capacity:
            raise StateFormatError(f"state holds {n} positions, capacity is {self.options.capacity}")
        views = [self.state[m][slot, :n] for m in self.spec.kv_names()] + [self.logits[slot]]
        need = _STATE_HEAD.size + sum(v.numel() * v.element_size() for v in views)
        if len(payload) != need:
            raise StateFormatError(f"state bytes are {len(payload)} long, the layout needs {need}")
        off = _STATE_HEAD.size
        for v in views:
            nb = v.numel() * v.element_size()
            if nb:
                v.copy_(torch.frombuffer(bytearray(payload[off : off + nb]), dtype=torch.uint8).view(v.dtype).view(v.shape))
            off += nb
        self.lengths[slot] = n
        return n


def _bytes(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous().to("cpu")
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
