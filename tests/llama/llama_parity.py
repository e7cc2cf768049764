"""Per-layer parity of the engine against the NumPy oracle (oracle/llama.py), both scopes.

isolated: every engine layer i is fed the oracle's input to layer i (teacher forcing through
`Probe.layer_in`), so each row measures that layer's error alone. end-to-end: the engine runs on
its own from the token ids. Errors are max|engine - oracle| / max|oracle| per layer output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from modeld.models.llama.forward import Probe


@dataclass(frozen=True)
class LayerError:
    layer: int
    rel: float          # max abs error / max |oracle|
    max_abs: float
    ref_max: float


def oracle_capture(model, ids: list[int]) -> dict[str, np.ndarray]:
    cap: dict = {}
    model.forward(ids, capture=cap)
    return cap


def engine_layers(eng, ids: list[int], inject: dict[str, np.ndarray] | None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Run ids through slot 0 from empty; return (layer outputs fp32, logits [T, V])."""
    outs: list[torch.Tensor] = []

    def layer_in(i, h):
        if inject is None:
            return h
        return torch.from_numpy(np.ascontiguousarray(inject[f"layers.{i}.in"])).to(torch.bfloat16)

    probe = Probe(layer_in=layer_in, layer=lambda i, h: outs.append(h.float().clone()))
    eng.reset_slot(0)
    logits = eng.prefill(0, ids, probe=probe, all_logits=True)
    eng.reset_slot(0)
    return outs, logits


def layer_errors(outs: list[torch.Tensor], cap: dict[str, np.ndarray]) -> list[LayerError]:
    errs = []
    for i, got in enumerate(outs):
        ref = torch.from_numpy(np.asarray(cap[f"layers.{i}.out"], dtype=np.float32))
        d = float((got - ref).abs().max())
        m = float(ref.abs().max())
        errs.append(LayerError(i, d / m if m else d, d, m))
    return errs
