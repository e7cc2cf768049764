"""The llama family (SmolLM2-135M-Instruct and kin) in NumPy: the executable spec.

Reads a Hugging Face `LlamaForCausalLM` safetensors checkpoint (`model.*`, `lm_head.weight` or
tied embeddings). Reference: transformers 5.17 `models/llama/modeling_llama.py`. Same API as
oracle.qwen3_5: `load(dir) -> Model` with `forward(ids, state, capture, inject)`, `generate`.

Precision modes as in oracle.qwen3_5 (float32, float64, float32 + emulate_bf16). Llama's RMSNorm
differs from qwen3_5's: it multiplies the weight AFTER casting the normalised value back to the
activation dtype (`w * n.to(bf16)`), and the weight is w, not 1 + w.

Shape letters: T tokens of this call, P tokens already in the state, D hidden, V vocab,
H/Hkv/Dh attention heads / KV heads / head dim, I intermediate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from oracle._common import (CheckpointError, OracleError, index_checkpoint, load_tensor,
                            read_config, rms_normalize, rope_cos_sin, rotate_half, round_bf16,
                            silu, softmax)


# =============================================================================================
# Config
# =============================================================================================

@dataclass(frozen=True)
class Config:
    hidden: int
    intermediate: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    rope_theta: float

    @staticmethod
    def from_hf(t: dict) -> "Config":
        rope = t.get("rope_parameters") or t.get("rope_scaling") or {}
        if rope.get("rope_type", "default") != "default":
            raise OracleError(f"rope_type {rope.get('rope_type')!r} is not supported")
        if t.get("attention_bias") or t.get("mlp_bias"):
            raise OracleError("attention/MLP biases are not supported")
        theta = rope.get("rope_theta", t.get("rope_theta"))
        if theta is None:
            raise CheckpointError("config has no rope_theta")
        heads = t["num_attention_heads"]
        return Config(hidden=t["hidden_size"], intermediate=t["intermediate_size"],
                      layers=t["num_hidden_layers"], vocab=t["vocab_size"], heads=heads,
                      kv_heads=t.get("num_key_value_heads", heads),
                      head_dim=t.get("head_dim") or t["hidden_size"] // heads,
                      eps=float(t["rms_norm_eps"]), rope_theta=float(theta))


@dataclass
class State:
    """Per-sequence KV cache. `Model.forward(..., state=s)` appends to it (mutates it)."""

    pos: int = 0                                                          # P
    kv: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # [P,Hkv,Dh] x2


# =============================================================================================
# The model
# =============================================================================================

class Model:
    """A loaded llama model. Stateless between calls except through an explicit `State`."""

    def __init__(self, config: Config, weights: dict[str, np.ndarray], dtype: type,
                 emulate_bf16: bool):
        self.config, self.w, self.dtype, self.emulate_bf16 = config, weights, dtype, emulate_bf16

    def _r(self, x):
        """Round to bf16 where HF's bf16 model holds a bf16 tensor; identity otherwise."""
        return round_bf16(x) if self.emulate_bf16 else x

    def _linear(self, x, name):                                           # [T, in] -> [T, out]
        return self._r(x @ self.w[name].T)

    def _norm(self, x, name):
        """Llama RMSNorm: w * (x32 * rsqrt(mean(x32^2) + eps)).to(activation dtype)."""
        return self._r(self.w[name] * self._r(rms_normalize(x, self.config.eps)))

    def _attention(self, x, i, state):                                    # [T, D] -> [T, D]
        cfg, p, r = self.config, f"model.layers.{i}.self_attn.", self._r
        T, H, Hkv, Dh = x.shape[0], cfg.heads, cfg.kv_heads, cfg.head_dim
        q = self._linear(x, p + "q_proj.weight").reshape(T, H, Dh)
        k = self._linear(x, p + "k_proj.weight").reshape(T, Hkv, Dh)
        v = self._linear(x, p + "v_proj.weight").reshape(T, Hkv, Dh)
        # Full-width half-split RoPE (dim i pairs with i + Dh/2); cos/sin in f32, cast, products rounded.
        cos, sin = rope_cos_sin(np.arange(state.pos, state.pos + T), Dh, cfg.rope_theta,
                                np.float64 if self.dtype == np.float64 else np.float32)
        cos, sin = r(cos.astype(self.dtype))[:, None, :], r(sin.astype(self.dtype))[:, None, :]
        q = r(r(q * cos) + r(rotate_half(q) * sin))
        k = r(r(k * cos) + r(rotate_half(k) * sin))
        if i in state.kv:
            k = np.concatenate([state.kv[i][0], k], axis=0)               # [P+T, Hkv, Dh]
            v = np.concatenate([state.kv[i][1], v], axis=0)
        state.kv[i] = (k, v)
        rep = H // Hkv                                                    # head h reads KV h // rep
        kh = np.repeat(k, rep, axis=1).transpose(1, 0, 2)                 # [H, P+T, Dh]
        vh = np.repeat(v, rep, axis=1).transpose(1, 0, 2)
        scores = r(r(q.transpose(1, 0, 2) @ kh.transpose(0, 2, 1)) * (Dh ** -0.5))  # [H, T, P+T]
        P = state.pos
        causal = np.arange(P + T)[None, :] <= (P + np.arange(T))[:, None]
        probs = r(softmax(np.where(causal[None], scores, -np.inf)))       # softmax in f32
        o = r(probs @ vh).transpose(1, 0, 2).reshape(T, H * Dh)
        return self._linear(o, p + "o_proj.weight")

    def _mlp(self, x, p):
        gate = self._linear(x, p + "mlp.gate_proj.weight")                # [T, I]
        up = self._linear(x, p + "mlp.up_proj.weight")
        return self._linear(self._r(self._r(silu(gate)) * up), p + "mlp.down_proj.weight")

    def layer(self, i: int, h: np.ndarray, state: State, cap: dict) -> np.ndarray:
        """Decoder layer i on residual input h [T, D] -> [T, D]; appends to `state`'s KV cache,
        records "layers.{i}.*" in `cap`. Does not advance state.pos."""
        lp, p = f"layers.{i}.", f"model.layers.{i}."
        cap[lp + "in"] = h
        x = cap[lp + "input_layernorm"] = self._norm(h, p + "input_layernorm.weight")
        mix = cap[lp + "mixer"] = self._attention(x, i, state)
        h = cap[lp + "mid"] = self._r(h + mix)                           # residual after mixer
        x = cap[lp + "post_attention_layernorm"] = self._norm(h, p + "post_attention_layernorm.weight")
        m = cap[lp + "mlp"] = self._mlp(x, p)
        h = cap[lp + "out"] = self._r(h + m)
        return h

    def new_state(self) -> State:
        return State()

    def forward(self, token_ids, state: State | None = None, capture: dict | None = None,
                inject: dict[int, np.ndarray] | None = None) -> np.ndarray:
        """Run T tokens; return logits [T, V]. Same contract as oracle.qwen3_5.Model.forward
        (capture keys "embed", "layers.{i}.{in,input_layernorm,mixer,mid,
        post_attention_layernorm,mlp,out}", "norm", "logits"; inject {i: [T, D]} replaces the
        input of layer i)."""
        cfg = self.config
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if ids.size == 0 or ids.min() < 0 or ids.max() >= cfg.vocab:
            raise OracleError(f"token ids must be a non-empty list in [0, {cfg.vocab})")
        state = State() if state is None else state
        cap = capture if capture is not None else {}
        h = cap["embed"] = self.w["model.embed_tokens.weight"][ids]       # [T, D]
        for i in range(cfg.layers):
            if inject and i in inject:
                h = np.asarray(inject[i], dtype=self.dtype)
                if h.shape != (ids.size, cfg.hidden):
                    raise OracleError(f"inject[{i}] has shape {h.shape}, want {(ids.size, cfg.hidden)}")
            h = self.layer(i, h, state, cap)
        state.pos += ids.size
        h = cap["norm"] = self._norm(h, "model.norm.weight")
        logits = cap["logits"] = self._r(h @ self.w["lm_head.weight"].T)  # [T, V]
        return logits

    def generate(self, prompt_ids, max_new_tokens: int, eos_id: int | None = None) -> list[int]:
        """Greedy decode through the KV cache; returns the new tokens (ties -> lowest id)."""
        state = State()
        logits = self.forward(prompt_ids, state)
        out: list[int] = []
        for _ in range(max_new_tokens):
            nxt = int(np.argmax(logits[-1]))
            out.append(nxt)
            if eos_id is not None and nxt == eos_id:
                break
            logits = self.forward([nxt], state)
        return out


# =============================================================================================
# Loading
# =============================================================================================

def load(checkpoint_dir: str, dtype: type = np.float32, emulate_bf16: bool = False) -> Model:
    """Load a llama checkpoint directory strictly (missing / unexpected / misshapen -> CheckpointError)."""
    if dtype not in (np.float32, np.float64):
        raise OracleError(f"dtype must be np.float32 or np.float64, got {dtype}")
    if emulate_bf16 and dtype != np.float32:
        raise OracleError("emulate_bf16 requires dtype=np.float32")
    cfg = Config.from_hf(read_config(checkpoint_dir))
    index = index_checkpoint(checkpoint_dir)
    D, I, Dh = cfg.hidden, cfg.intermediate, cfg.head_dim
    want = {"model.embed_tokens.weight": (cfg.vocab, D), "model.norm.weight": (D,)}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        want[p + "input_layernorm.weight"] = want[p + "post_attention_layernorm.weight"] = (D,)
        want[p + "self_attn.q_proj.weight"] = (cfg.heads * Dh, D)
        want[p + "self_attn.k_proj.weight"] = want[p + "self_attn.v_proj.weight"] = (cfg.kv_heads * Dh, D)
        want[p + "self_attn.o_proj.weight"] = (D, cfg.heads * Dh)
        want[p + "mlp.gate_proj.weight"] = want[p + "mlp.up_proj.weight"] = (I, D)
        want[p + "mlp.down_proj.weight"] = (D, I)
    if "lm_head.weight" in index:
        want["lm_head.weight"] = (cfg.vocab, D)
    weights = {}
    for name, shape in want.items():
        if name not in index:
            raise CheckpointError(f"{checkpoint_dir}: missing tensor {name}")
        if index[name].shape != shape:
            raise CheckpointError(f"{name}: shape {index[name].shape}, expected {shape}")
        arr = load_tensor(index[name], dtype)
        weights[name] = round_bf16(arr) if emulate_bf16 else arr
    weights.setdefault("lm_head.weight", weights["model.embed_tokens.weight"])   # tied
    extra = sorted(set(index) - set(want))
    if extra:
        raise CheckpointError(f"{checkpoint_dir}: unexpected tensors {extra[:5]}")
    return Model(cfg, weights, dtype, emulate_bf16)
