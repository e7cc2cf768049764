"""`Qwen35Engine`: weights + state arena + bound kernels + the fixed schedule, for `slots` sequences.

Schedule (fixed at load): prefill runs the forward over pieces of at most `prefill_chunk` tokens
of one slot; the GDN state at every multiple of `checkpoint_every` is checkpointed, inside a piece
through the forward's snapshots (StepContext); decode runs one token for every slot through one captured step
(a CUDA graph on CUDA devices, eager elsewhere). All state lives in the state arena; per-step
inputs live in small static buffers (`_ids`, `_lens`, `_pos`) so replays never allocate inputs.

Mutation: `prefill`/`decode`/`truncate`/`load_slot`/`reset_slot` mutate the named slots' state
and `lengths`; everything else is read-only. Errors: StateCapacityError (too many positions),
StateFormatError (bad state bytes), GraphCaptureError (use_graph=True and capture failed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import functools

import torch

from modeld.execution.arena import Arena
from modeld.execution.bindings import KernelSet, default_kernels
from modeld.execution.checkpoints import StateCheckpoints
from modeld.execution.errors import GraphCaptureError, StateCapacityError, StateFormatError
from modeld.execution.graphs import StepGraph, reserved_after_empty_cache
from modeld.execution.slot_engine import SlotEngine
from modeld.execution.sources import TensorSource
from modeld.models.qwen3_5.config import Qwen35Config
from modeld.models.qwen3_5.forward import Probe, Qwen35Forward, StepContext
from modeld.models.qwen3_5.state import Qwen35StateSpec
from modeld.models.qwen3_5.weights import LoadReport, Qwen35Weights

__all__ = ["EngineOptions", "Qwen35Engine", "StateFormatError", "SUFFIX_BUCKET_CUDA", "default_suffix_bucket"]


@dataclass(frozen=True)
class EngineOptions:
    slots: int = 1
    capacity: int = 4096          # positions per slot (KV cache length S)
    # Tokens per forward call during prefill, and the GDN-state checkpoint interval (positions). They are
    # independent: a piece longer than the interval checkpoints inside itself (the forward's snapshots), so a
    # trim still re-evaluates at most checkpoint_every - 1 tokens. 8192: 27B / H200 cold 32k prefill (session 21,
    # both at 8192 against both at 2048, logits bit-identical) bf16 0.981x, fp8 0.926x, int4 0.935x; fp8 / int4
    # dequantise each weight once per piece (findings/prefill-chunk-bound-by-checkpoint-interval.md). 32768 since
    # session 32 (with the GDN checkpoints stored by the state pass): cold 32k bf16 0.989x the 8192 pieces with 16k
    # pieces, one 32k piece 0.993x the 16k ones (2.996 / 3.004 s), logits equal bit for bit
    # (findings/gdn-snapshots-between-loops-h200-s32.md). 2048: the trim bound of
    # findings/qwen3_5-27b-certification-same-run-h200.md.
    prefill_chunk: int = 32768
    checkpoint_every: int = 2048
    checkpoints: int = 4          # checkpoint entries per slot (0 disables prefix trimming reuse)
    use_graph: bool | None = None  # None: capture on CUDA, eager elsewhere; True: capture or raise
    # > 0: the LAST piece of a prefill, when it has at most this many tokens and start + suffix_bucket fits the
    # capacity, runs as one captured step padded to this many rows (pad rows leave the state alone: StepContext
    # `valid`): an agent turn's suffix or a short prompt costs its kernels, not ~50 ms of launches
    # (KNOWLEDGE/findings/warm-prefix-hit-is-device-bound-h200.md). 0: off (eager pieces only).
    suffix_bucket: int = 0


# The padded suffix step that serving turns on for CUDA engines (Qwen35Cell, the benches' build_engine): on the H200
# (27B synthetic weights, session 21, bench/ttft_long.py) a warm prefix hit of 32768 + 100 tokens went bf16 57.4 ->
# 33.9 ms and int4 69.2 -> 51.2 ms, its logits bit-identical to a cold prefill of the same tokens
# (KNOWLEDGE/optimizations/captured-suffix-step.md). Off elsewhere: without a CUDA graph the pad rows are only cost.
SUFFIX_BUCKET_CUDA = 128


def default_suffix_bucket(device: torch.device | str, capacity: int) -> int:
    """EngineOptions.suffix_bucket for an engine on `device` with `capacity` positions per slot."""
    return min(SUFFIX_BUCKET_CUDA, capacity) if torch.device(device).type == "cuda" else 0


class Qwen35Engine(SlotEngine):
    """Loads weights from `source` into a weight arena, sizes the state arena, binds kernels.
    Decode, layout digest and slot bytes (KV, then GDN conv + recurrent state, then logits) come
    from `SlotEngine`; the hooks below keep the GDN checkpoints in step."""

    STATE_MAGIC = b"Q35STATE"
    STATE_LABEL = "qwen3_5"

    def __init__(self, config: Qwen35Config, source: TensorSource, device: torch.device | str = "cpu",
                 kernels: KernelSet | None = None, options: EngineOptions = EngineOptions(),
                 progress=None) -> None:
        self.config, self.options = config, options
        self.device = torch.device(device)
        self.kernels = kernels or default_kernels(self.device)
        self.weights = Qwen35Weights.for_source(config, source, self.device)
        self.load_report: LoadReport = self.weights.load(source, progress)
        self.spec = Qwen35StateSpec(config, options.slots, options.capacity)
        self.state = Arena.from_specs(self.spec.specs(), self.device)
        self.forward = Qwen35Forward(config, self.weights, self.state, self.kernels)
        self.ckpts = [StateCheckpoints(self.state, self.spec.fixed_names(), options.checkpoints)
                      for _ in range(options.slots)]
        self._init_slots(config.vocab)
        self._buckets: list[StepGraph] = []
        self.bucket_graph_bytes = 0
        if options.suffix_bucket:
            self._init_buckets(options.suffix_bucket)

    def _init_buckets(self, n: int) -> None:
        """Static inputs of the padded suffix step and one step per slot, captured like decode (into the empty
        state, zeroed afterwards) when decode was captured."""
        if not 1 <= n <= self.options.capacity:
            raise StateCapacityError(f"suffix_bucket={n} must be in [1, capacity={self.options.capacity}]")
        dev = self.device
        self._bucket_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self._bucket_start = torch.zeros(1, dtype=torch.int64, device=dev)
        self._bucket_valid = torch.ones(1, dtype=torch.int64, device=dev)
        # one memory pool for all slots' steps: they run one at a time and `prefill` copies each output out at once
        pool = torch.cuda.graph_pool_handle() if dev.type == "cuda" else None
        self._buckets = [StepGraph(functools.partial(self._bucket_step, slot), dev, f"suffix step (slot {slot})",
                                   pool=pool) for slot in range(self.options.slots)]
        reserved = reserved_after_empty_cache(dev)
        if self.graph.captured:
            try:
                for g in self._buckets:
                    g.capture()
            except GraphCaptureError as exc:
                if self.options.use_graph:
                    raise
                self.graph_error = str(exc)
            self.state.zero_()
            self.logits.zero_()
        # what the captures kept (their shared memory pool): reported by bench/ttft_long.py
        self.bucket_graph_bytes = reserved_after_empty_cache(dev) - reserved

    def _bucket_step(self, slot: int) -> torch.Tensor:
        rows = torch.arange(self._bucket_ids.shape[0], device=self.device)
        ctx = StepContext(decode=False, positions=self._bucket_start + rows, slot=slot, valid=self._bucket_valid,
                          pad_rows=rows >= self._bucket_valid)
        return self.forward(self._bucket_ids, ctx)  # [1, V] fp32: the last real row's logits

    # ---------------------------------------------------------------- prefill / decode
    def prefill(self, slot: int, tokens: Sequence[int], probe: Probe | None = None) -> torch.Tensor:
        """Evaluate `tokens` at positions lengths[slot].. of `slot`; returns logits [V] fp32 of the
        last token (a view of `self.logits[slot]`). Raises StateCapacityError before any work."""
        if not len(tokens):
            raise StateCapacityError("prefill needs at least one token")
        start = self.lengths[slot]
        end = start + len(tokens)
        self.spec.check_fits(end)
        ids_all = torch.tensor(list(tokens), dtype=torch.int64, device=self.device)
        every, chunk = self.options.checkpoint_every, self.options.prefill_chunk
        pos = start
        while pos < end:
            stop = min(end, pos + chunk)
            ids = ids_all[pos - start : stop - start]
            bucket = self.options.suffix_bucket
            # checkpoints strictly inside the piece come from the forward's snapshots (its end is saved below); the
            # captured suffix step takes none: a turn's last <= bucket tokens that cross a multiple of
            # checkpoint_every keep the step's speed and lose that one checkpoint (the end's is saved)
            inside = list(range((pos // every + 1) * every, stop, every))
            if (self._buckets and probe is None and stop == end and stop - pos <= bucket
                    and pos + bucket <= self.options.capacity):
                self._bucket_ids[: stop - pos].copy_(ids)
                self._bucket_start.fill_(pos)
                self._bucket_valid.fill_(stop - pos)
                self.logits[slot].copy_(self._buckets[slot]()[0])
            else:
                self._prefill_piece(slot, ids, pos, inside, probe)
            pos = stop
            self.lengths[slot] = pos
            if pos % every == 0 or pos == end:
                self.ckpts[slot].save(slot, pos)
        return self.logits[slot]

    def _prefill_piece(self, slot: int, ids: torch.Tensor, pos: int, inside: list[int], probe: Probe | None) -> None:
        """One eager forward over ids at positions pos..; the GDN state at each position of `inside` goes into a
        checkpoint entry as the layers pass it, committed once the whole piece has run."""
        ckpts = self.ckpts[slot]
        entries = ckpts.reserve(inside)
        positions = torch.arange(pos, pos + ids.shape[0], dtype=torch.int64, device=self.device)
        offsets = {p - pos: j for p, j in entries.items()}
        ctx = StepContext(decode=False, positions=positions, slot=slot, start=pos, snapshots=tuple(sorted(offsets)),
                          snapshot=lambda r, name, value: ckpts.write(offsets[r], name, value))
        self.logits[slot].copy_(self.forward(ids, ctx, probe=probe)[0])
        for p, j in entries.items():
            ckpts.commit(j, p)

    def _decoded(self, slot: int) -> None:
        if self.lengths[slot] % self.options.checkpoint_every == 0:
            self.ckpts[slot].save(slot, self.lengths[slot])

    def _loaded(self, slot: int) -> None:
        self.ckpts[slot].clear()

    # ---------------------------------------------------------------- state management
    def reset_slot(self, slot: int) -> None:
        """Forget the slot's sequence: zero its GDN state (KV past length 0 is never read)."""
        for n in self.spec.fixed_names():
            self.state[n][slot].zero_()
        self.ckpts[slot].clear()
        self.lengths[slot] = 0
        self.logits[slot].zero_()

    def truncate(self, slot: int, n: int, tokens: Sequence[int]) -> int:
        """Make the slot hold exactly the first n positions. `tokens` are the slot's tokens (at
        least n). Restores the newest GDN checkpoint <= n and re-evaluates the rest; returns the
        number of tokens re-evaluated. The slot's logits are stale afterwards."""
        if n >= self.lengths[slot]:
            return 0
        base = self.ckpts[slot].restore_at_most(slot, n)
        self.lengths[slot] = base
        if n > base:
            self.prefill(slot, tokens[base:n])
        return n - base
