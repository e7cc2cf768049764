"""The fixed weight layout of the qwen3_5 engine and its strict loader.

Every weight lives in one `Arena` (one device allocation, fixed offsets decided by `names.weight_map`
before a byte is read). Loading is strict (STYLE.md habit 8): a missing tensor, a leftover tensor
(other than the skipped MTP/vision prefixes), a shape or dtype mismatch each raise their own named
error before anything is used. `verify_parity` re-reads the artifact and checks every slot byte
for byte (for cast slots: against the artifact value cast the documented way).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from modeld.execution.arena import Arena, BufferSpec
from modeld.execution.errors import (
    MissingTensorError,
    TensorDtypeMismatch,
    TensorShapeMismatch,
    UnexpectedTensorError,
    WeightLoadError,
    WeightParityError,
)
from modeld.execution.sources import TensorSource
from modeld.models.qwen3_5.config import Qwen35Config
from modeld.models.qwen3_5.names import (
    PROFILES,
    SKIPPED_PREFIXES,
    profile_detector,
    detect_text_prefix,
    resolve_name,
    weight_map,
)


@dataclass(frozen=True)
class LoadReport:
    """What `load_weights` did: bytes copied, artifact tensors consumed and skipped by prefix."""

    arena_bytes: int
    consumed: int
    skipped: tuple[str, ...]
    casts: tuple[str, ...]   # slots filled from an artifact tensor of another dtype


class Qwen35Weights:
    """The weight arena plus the slot map; `w[name]` is a slot view (read-only by contract)."""

    def __init__(self, config: Qwen35Config, device: torch.device | str, profile_of=None) -> None:
        self.config = config
        self.maps, self.slot_profiles = weight_map(config, profile_of)
        for slot, (prof, group) in self.slot_profiles.items():
            if prof not in PROFILES or (prof == "int4" and (group < 2 or group % 2)):
                raise WeightLoadError(f"{slot}: unsupported weight profile {prof!r} (group {group})")
        # the lm_head's (profile, group) apart from the layer linears' (profile_summary counts those only)
        self.head_profile = self.slot_profiles.pop("lm_head")
        # zeroed so alignment padding is deterministic (arena bytes can be compared or hashed whole)
        self.arena = Arena.from_specs((BufferSpec(m.slot, m.shape, m.dtype) for m in self.maps), device)

    @classmethod
    def for_source(cls, config: Qwen35Config, source: TensorSource, device: torch.device | str) -> Qwen35Weights:
        """An empty layout whose linear slots are stored the way the artifact stores them."""
        names = source.names()
        prefix = detect_text_prefix(names)
        if prefix is None:
            raise MissingTensorError("artifact has no embed_tokens.weight under a known text prefix")
        return cls(config, device, profile_detector(names, source.meta, prefix))

    @property
    def profile(self) -> str:
        """The weight profile of the MLP slots (the bulk of the bytes), e.g. "fp8"."""
        return self.slot_profiles["L0.mlp.down"][0]

    def profile_summary(self) -> dict[str, int]:
        """profile -> number of layer linear slots stored that way (the lm_head: `head_profile`)."""
        out: dict[str, int] = {}
        for prof, _ in self.slot_profiles.values():
            out[prof] = out.get(prof, 0) + 1
        return out

    def __getitem__(self, slot: str) -> torch.Tensor:
        return self.arena[slot]

    @property
    def nbytes(self) -> int:
        return self.arena.nbytes

    # ------------------------------------------------------------------ loading
    def _plan(self, source: TensorSource) -> tuple[str, list[str]]:
        names = source.names()
        prefix = detect_text_prefix(names)
        if prefix is None:
            raise MissingTensorError("artifact has no embed_tokens.weight under a known text prefix")
        wanted = {resolve_name(p, prefix) for m in self.maps for p in m.parts}
        skipped = [n for n in names if n.startswith(SKIPPED_PREFIXES) and n not in wanted]
        leftover = sorted(set(names) - wanted - set(skipped))
        if leftover:
            more = f" (+{len(leftover) - 5} more)" if len(leftover) > 5 else ""
            raise UnexpectedTensorError(f"artifact tensors not used by the qwen3_5 layout: {leftover[:5]}{more}")
        missing = sorted(wanted - set(names))
        if missing:
            raise MissingTensorError(f"artifact lacks {len(missing)} tensors, e.g. {missing[:5]}")
        for m in self.maps:
            for part in m.parts:
                name = resolve_name(part, prefix)
                dtype, shape = source.meta(name)
                if tuple(shape) != part.shape:
                    raise TensorShapeMismatch(f"{name}: artifact shape {list(shape)}, layout expects {list(part.shape)}")
                if dtype not in m.accept:
                    raise TensorDtypeMismatch(f"{name}: artifact dtype {dtype}, layout accepts {m.accept}")
        return prefix, skipped

    def load(self, source: TensorSource, progress=None) -> LoadReport:
        """Copy every slot from `source` into the arena (mutates the arena only).

        Raises MissingTensorError / UnexpectedTensorError / TensorShapeMismatch / TensorDtypeMismatch
        before copying anything. `progress(slot)` is called after each slot when given.
        """
        prefix, skipped = self._plan(source)
        casts = []
        consumed = 0
        release = getattr(source, "release", None)  # drop each artifact tensor's pages once copied
        for m in self.maps:
            dst = self.arena[m.slot]
            row = 0
            for part in m.parts:
                name = resolve_name(part, prefix)
                src = source.tensor(name)
                rows = part.shape[0]
                if src.dtype != m.dtype:
                    casts.append(m.slot)
                dst[row : row + rows].copy_(src.reshape(rows, *m.shape[1:]).to(m.dtype))
                del src
                if release is not None:  # copy_ from pageable host memory has read src when it returns
                    release(name)
                row += rows
                consumed += 1
            if progress is not None:
                progress(m.slot)
        return LoadReport(self.arena.nbytes, consumed, tuple(skipped), tuple(casts))

    def verify_parity(self, source: TensorSource) -> int:
        """Check every slot against the artifact: byte-identical, or equal to the cast value for
        cast slots. Returns the number of artifact tensors checked. Raises WeightParityError."""
        prefix = detect_text_prefix(source.names())
        checked = 0
        for m in self.maps:
            dst = self.arena[m.slot]
            row = 0
            for part in m.parts:
                name = resolve_name(part, prefix)
                src = source.tensor(name)
                rows = part.shape[0]
                want = src.reshape(rows, *m.shape[1:]).to(m.dtype)
                got = dst[row : row + rows].to("cpu")
                if not torch.equal(got.view(torch.uint8) if got.dtype.itemsize == 1 else got.view(_INT[got.dtype.itemsize]),
                                   want.view(torch.uint8) if want.dtype.itemsize == 1 else want.view(_INT[want.dtype.itemsize])):
                    raise WeightParityError(f"slot {m.slot} rows {row}..{row + rows} differ from {name}")
                row += rows
                checked += 1
        return checked


_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}
