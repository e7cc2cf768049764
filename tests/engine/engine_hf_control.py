"""The HF transformers control for engine parity tests: `Qwen3_5ForCausalLM` on CPU, loaded from a
synthetic checkpoint directory, with hooks that capture (and optionally replace) mixer outputs
and decoder-layer outputs.

Run without flash-linear-attention / causal-conv1d installed (KNOWLEDGE/pitfalls/
hf-control-needs-fla-absent.md): HF then uses its own PyTorch GDN paths.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def load_hf(ckpt: Path, dtype: torch.dtype):
    """Qwen3_5ForCausalLM in `dtype` with the checkpoint's text weights (strict: no missing keys)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    raw = json.loads((ckpt / "config.json").read_text())
    text = dict(raw.get("text_config", raw))
    text.pop("model_type", None)
    cfg = Qwen3_5TextConfig(**text)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(cfg)
    sd = {}
    for shard in sorted(ckpt.glob("*.safetensors")):
        for k, v in load_file(str(shard)).items():
            if k.startswith("model.language_model."):
                sd["model." + k[len("model.language_model."):]] = v
            elif k == "lm_head.weight":
                sd[k] = v
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert not missing, missing
    return model.to(dtype).eval()


class Hooks:
    """Capture mixer outputs (`mixer[i]`) and layer outputs (`layer[i]`), per forward call.

    `replace[i]` (if set) substitutes layer i's mixer output (injection)."""

    def __init__(self, model) -> None:
        self.mixer: dict[int, list[torch.Tensor]] = {}
        self.layer: dict[int, list[torch.Tensor]] = {}
        self.replace: dict[int, torch.Tensor] = {}
        self.handles = []
        for i, layer in enumerate(model.model.layers):
            mixer = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn
            self.handles.append(mixer.register_forward_hook(self._mixer_hook(i)))
            self.handles.append(layer.register_forward_hook(self._layer_hook(i)))

    def _mixer_hook(self, i):
        def hook(_mod, _inp, out):
            t = out[0] if isinstance(out, tuple) else out
            self.mixer.setdefault(i, []).append(t.detach()[0].clone())
            if i in self.replace:
                new = self.replace[i].to(t.dtype)[None]
                return (new,) + tuple(out[1:]) if isinstance(out, tuple) else new
            return None
        return hook

    def _layer_hook(self, i):
        def hook(_mod, _inp, out):
            t = out[0] if isinstance(out, tuple) else out
            self.layer.setdefault(i, []).append(t.detach()[0].clone())
        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


@torch.no_grad()
def greedy(model, prompt: list[int], n_new: int) -> tuple[list[int], list[torch.Tensor]]:
    """HF greedy decode with its cache (prefill once, then one token per call): tokens and the
    fp32 logits of every step [V]."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt])
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    logits = [out.logits[0, -1].float()]
    toks = []
    for _ in range(n_new):
        t = int(logits[-1].argmax())
        toks.append(t)
        out = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True)
        logits.append(out.logits[0, -1].float())
    return toks, logits


@torch.no_grad()
def forced(model, prompt: list[int], tokens: list[int]) -> list[torch.Tensor]:
    """HF logits (fp32 [V]) after the prompt and after each of `tokens` fed one decode step at a
    time (teacher forcing with HF's cache): len(tokens) + 1 rows."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
    logits = [out.logits[0, -1].float()]
    for t in tokens:
        out = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True)
        logits.append(out.logits[0, -1].float())
    return logits
