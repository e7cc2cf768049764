"""The correctness ladder measurements (rungs 2-5), shared by test_parity.py and the table in
KNOWLEDGE/findings/qwen3_5-correctness-ladder.md. Run `python tests/engine/engine_ladder.py` (from the
repo root, with the venv) to print the table.

Every function compares the engine on CPU reference kernels with the HF transformers control
(`engine_hf_control.py`) on the same synthetic checkpoint and returns plain numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_hf_control import Hooks, greedy
from modeld.models.qwen3_5.forward import Probe, StepContext


@dataclass(frozen=True)
class LayerErr:
    layer: int
    kind: str
    mixer_err: float     # max |engine - HF| of the mixer output [T, D]
    layer_err: float     # max |engine - HF| of the layer output hidden state [T, D]
    ref_scale: float     # max |HF layer output|


def per_layer(engine, hf, prompt: list[int], inject_gdn: bool = False) -> list[LayerErr]:
    """Prefill `prompt` in both; per-layer errors. inject_gdn: the engine's GDN mixer outputs are
    replaced by HF's (rung 3: attention layers checked on identical GDN contributions)."""
    hooks = Hooks(hf)
    try:
        with torch.no_grad():
            hf(input_ids=torch.tensor([prompt]))
    finally:
        hooks.close()
    c = engine.config
    mix, lay = {}, {}

    def on_mixer(i, m):
        mix[i] = m.clone()
        if inject_gdn and c.layer_types[i] == "linear_attention":
            return hooks.mixer[i][0].to(m.dtype)
        return m

    probe = Probe(mixer=on_mixer, layer=lambda i, h: lay.__setitem__(i, h.clone()))
    engine.reset_slot(0)
    ctx = StepContext(decode=False, positions=torch.arange(len(prompt)), slot=0, start=0)
    engine.forward(torch.tensor(prompt), ctx, last_only=False, probe=probe)
    out = []
    for i, kind in enumerate(c.layer_types):
        ref_m, ref_h = hooks.mixer[i][0].float(), hooks.layer[i][0].float()
        out.append(LayerErr(i, kind, float((mix[i].float() - ref_m).abs().max()),
                            float((lay[i].float() - ref_h).abs().max()), float(ref_h.abs().max())))
    return out


def gdn_state_errors(engine, hf, prompt: list[int]) -> dict[int, tuple[float, float]]:
    """Prefill both with a cache; per GDN layer (conv state max err, recurrent state max err)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=hf.config)
    with torch.no_grad():
        hf(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
    engine.reset_slot(0)
    engine.prefill(0, prompt)
    out = {}
    for i in engine.config.gdn_layers:
        hf_conv = cache.layers[i].conv_states[0][0]  # [C, W] (oldest column never used)
        mine_conv = engine.state[f"gdn.{i}.conv"][0].t()  # [C, W-1]
        conv_err = float((mine_conv.float() - hf_conv[:, 1:].float()).abs().max())
        rec_err = float((engine.state[f"gdn.{i}.rec"][0] - cache.layers[i].recurrent_states[0][0].float()).abs().max())
        out[i] = (conv_err, rec_err)
    return out


@dataclass(frozen=True)
class GreedyResult:
    steps: int
    hf_tokens: list[int]
    agree: int            # steps where the engine's argmax equals HF's
    near_ties: int        # disagreeing steps explained by rounding: HF(top) - HF(engine's pick)
                          # <= tie_tol + that step's max |engine - HF| logit error
    max_logit_err: float  # max over steps of max |engine - HF| logits
    first_step_err: float


def greedy_parity(engine, hf, prompt: list[int], n_new: int, tie_tol: float, round_bf16: bool = False) -> GreedyResult:
    """HF greedy-decodes with its cache; the engine prefills the prompt, then is fed HF's tokens
    one decode step at a time (teacher forcing, so one near-tie cannot derail later steps)."""
    toks, hf_logits = greedy(hf, prompt, n_new)
    engine.reset_slot(0)
    mine = [engine.prefill(0, prompt).clone()]
    for t in toks:
        mine.append(engine.decode([t])[0].clone())
    agree = ties = 0
    errs = []
    for ref, got in zip(hf_logits, mine):
        errs.append(float((ref - got).abs().max()))
        pick = int(got.to(torch.bfloat16).argmax()) if round_bf16 else int(got.argmax())
        if pick == int(ref.argmax()):
            agree += 1
        else:
            gap = float(ref.max() - ref[pick])
            ties += int(gap <= tie_tol + errs[-1])
    return GreedyResult(len(hf_logits), toks, agree, ties, max(errs), errs[0])


if __name__ == "__main__":  # print the ladder table
    import sys
    from pathlib import Path
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    from engine_support import make_engine, random_prompt
    from engine_hf_control import load_hf
    from engine_hf_rounding import hf_rounding
    from modeld.convert.qwen3_5_spec import preset
    from modeld.convert.synth import write_synthetic
    from modeld.execution.bindings import reference_kernels

    for name in sys.argv[1:] or ["tiny", "small", "odd"]:
        d = Path(tempfile.mkdtemp()) / name
        write_synthetic(preset(name), 0, d, workers=2)
        hf = load_hf(d, torch.bfloat16)
        hf32 = load_hf(d, torch.float32)
        for label, ks in (("reference", reference_kernels()), ("hf-rounding", hf_rounding(reference_kernels()))):
            eng = make_engine(d, kernels=ks)
            prompt = random_prompt(eng.config.vocab, 80, 1)
            for inj in (False, True):
                errs = per_layer(eng, hf, prompt, inject_gdn=inj)
                print(name, label, "inject" if inj else "plain",
                      " ".join(f"L{e.layer}{e.kind[0]}:{e.mixer_err:.3g}/{e.layer_err:.3g}" for e in errs))
            st = gdn_state_errors(eng, hf, prompt)
            print(name, label, "state", " ".join(f"L{i}:{a:.3g}/{b:.3g}" for i, (a, b) in st.items()))
            r = greedy_parity(eng, hf, prompt, 24, tie_tol=0.125, round_bf16=(label != "reference"))
            print(name, label, "greedy", f"{r.agree}/{r.steps} agree, {r.near_ties} near-ties, "
                  f"max logit err {r.max_logit_err:.3f} (first {r.first_step_err:.3f})")
            r = greedy_parity(eng, hf32, prompt, 24, tie_tol=0.125)
            print(name, label, "vs-fp32", f"{r.agree}/{r.steps} agree, {r.near_ties} near-ties, "
                  f"max logit err {r.max_logit_err:.3f} (first {r.first_step_err:.3f})")
            if label == "reference":  # the bf16 floor: HF bf16 itself vs HF fp32, same tokens
                from engine_hf_control import forced
                l32 = forced(hf32, prompt, r.hf_tokens)
                l16 = forced(hf, prompt, r.hf_tokens)
                agree = sum(int(a.argmax()) == int(b.argmax()) for a, b in zip(l16, l32))
                err = max(float((a - b).abs().max()) for a, b in zip(l16, l32))
                print(name, "hf-bf16", "vs-fp32", f"{agree}/{len(l32)} agree, max logit err {err:.3f}")
