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

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from modeld.execution.arena import Arena
from modeld.execution.bindings import KernelSet, default_kernels
from modeld.execution.errors import StateCapacityError, StateFormatError
from modeld.execution.slot_engine import SlotEngine
from modeld.execution.sources import TensorSource
from modeld.models.llama.config import LlamaConfig
from modeld.models.llama.forward import LlamaForward, Probe, StepContext
from modeld.models.llama.state import LlamaStateSpec
from modeld.models.llama.weights import LlamaWeights, LoadReport

__all__ = ["EngineOptions", "LlamaEngine", "StateFormatError"]


@dataclass(frozen=True)
class EngineOptions:
    slots: int = 1
    capacity: int = 4096          # positions per slot (KV cache length S)
    prefill_chunk: int = 512      # tokens per forward call during prefill
    use_graph: bool | None = None  # None: capture on CUDA, eager elsewhere; True: capture or raise


class LlamaEngine(SlotEngine):
    """Plans and loads the weights from `source`, sizes the KV arena, binds kernels, captures decode.
    Decode, layout digest and slot bytes come from `SlotEngine`."""

    STATE_MAGIC = b"LLMSTATE"
    STATE_LABEL = "llama"

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
        self._init_slots(config.vocab)

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

    # ---------------------------------------------------------------- state management
    def reset_slot(self, slot: int) -> None:
        """Forget the slot's sequence (KV past length 0 is never read, so nothing is zeroed)."""
        self.lengths[slot] = 0
        self.logits[slot].zero_()

    def truncate(self, slot: int, n: int) -> None:
        """Keep exactly the first n positions of the slot (exact: KV only). Logits become stale."""
        if n < self.lengths[slot]:
            self.lengths[slot] = max(0, n)
