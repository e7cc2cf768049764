"""The `qwen3_5` text path (Qwen3.5 / 3.6 / 3.8 hybrid: Gated DeltaNet + gated attention) in NumPy.

This file is the executable spec. It reads like llama2.c's run.c: config, weights, state, the two
mixers, the layer, the model; every buffer's shape is written beside it. Reference for every
detail: transformers 5.17 `models/qwen3_5/modeling_qwen3_5.py` (verified line by line; where
/work/shared/design/MODEL-qwen3_5.md and HF disagree HF wins, see KNOWLEDGE/findings/
qwen3_5-oracle-vs-hf-reading.md).

Precision modes (chosen at `load`):
  * dtype float32 (default) or float64: every op in that dtype, weights widened exactly.
  * emulate_bf16=True (float32 only): round to bf16 exactly where HF, running a bf16 model, holds a
    bf16 tensor (projection outputs, norm outputs, residual adds, conv, RoPE products, ...), and keep
    float32 where HF upcasts (norm statistics, softmax, l2norm, decay, the delta-rule state). The
    only remaining differences are matmul accumulation order, so parity with HF bf16 is tight.

Shape letters: T tokens of this call, P tokens already in the state, D hidden, V vocab,
H/Hkv/Dh attention heads/KV heads/head dim, Hk/Hv/dk/dv GDN key heads/value heads/key dim/value
dim, C = 2*Hk*dk + Hv*dv conv channels, K conv width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from oracle._common import (CheckpointError, OracleError, index_checkpoint, load_tensor,
                            read_config, rms_normalize, rope_cos_sin, rotate_half, round_bf16,
                            sigmoid, silu, softmax, softplus)

CHUNK = 64                       # HF's chunk size for the chunked delta rule
_LAYOUTS = ("model.language_model.", "model.")   # released form, then save_pretrained(ForCausalLM)
_IGNORED = ("mtp.", "model.visual.")             # not on the text path


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
    lin_k_heads: int
    lin_v_heads: int
    lin_k_dim: int
    lin_v_dim: int
    conv_kernel: int
    eps: float
    rope_theta: float
    rotary_dim: int
    layer_types: tuple[str, ...]

    @staticmethod
    def from_hf(cfg: dict) -> "Config":
        """Read a config.json dict (composite `qwen3_5` or text-only `qwen3_5_text`)."""
        t = cfg.get("text_config", cfg)
        rope = t.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise OracleError(f"rope_type {rope.get('rope_type')!r} is not supported")
        theta = rope.get("rope_theta", t.get("rope_theta"))
        if theta is None:
            raise CheckpointError("config has no rope_theta")
        n = t["num_hidden_layers"]
        types = t.get("layer_types") or [
            "full_attention" if (i + 1) % t.get("full_attention_interval", 4) == 0
            else "linear_attention" for i in range(n)]
        return Config(
            hidden=t["hidden_size"], intermediate=t["intermediate_size"], layers=n,
            vocab=t["vocab_size"], heads=t["num_attention_heads"], kv_heads=t["num_key_value_heads"],
            head_dim=t["head_dim"], lin_k_heads=t["linear_num_key_heads"],
            lin_v_heads=t["linear_num_value_heads"], lin_k_dim=t["linear_key_head_dim"],
            lin_v_dim=t["linear_value_head_dim"], conv_kernel=t["linear_conv_kernel_dim"],
            eps=float(t["rms_norm_eps"]), rope_theta=float(theta),
            rotary_dim=int(t["head_dim"] * rope.get("partial_rotary_factor", 0.25)),
            layer_types=tuple(types))


# =============================================================================================
# State (one sequence): KV cache for attention layers, conv + recurrent state for GDN layers
# =============================================================================================

@dataclass
class State:
    """Per-sequence decode state. `Model.forward(..., state=s)` appends to it (mutates it)."""

    pos: int = 0                                               # P: tokens consumed so far
    kv: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # [P,Hkv,Dh] x2
    conv: dict[int, np.ndarray] = field(default_factory=dict)  # [K-1, C] last pre-conv inputs
    rec: dict[int, np.ndarray] = field(default_factory=dict)   # [Hv, dk, dv] delta-rule state


# =============================================================================================
# Gated DeltaNet core: the delta rule, recurrent (token by token) and chunked (64 at a time)
# =============================================================================================

def delta_rule_recurrent(q, k, v, beta, g, state):
    """Gated delta rule, one token at a time (the definition).

    q, k [Hv, T, dk] (already l2-normalised, q scaled by dk^-1/2), v [Hv, T, dv], beta, g [Hv, T],
    state [Hv, dk, dv]. Returns (o [Hv, T, dv], new state). Does not mutate its inputs.
        S <- e^g S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q   (read after update)
    """
    S = state.copy()
    o = np.empty_like(v)
    for t in range(q.shape[1]):
        S = S * np.exp(g[:, t])[:, None, None]
        kv_mem = np.einsum("hkv,hk->hv", S, k[:, t])                      # [Hv, dv]
        delta = (v[:, t] - kv_mem) * beta[:, t, None]                     # [Hv, dv]
        S = S + k[:, t, :, None] * delta[:, None, :]
        o[:, t] = np.einsum("hkv,hk->hv", S, q[:, t])
    return o, S


def delta_rule_chunked(q, k, v, beta, g, state, chunk=CHUNK):
    """The same map, computed `chunk` tokens at a time with the UT transform (prefill form).

    Per chunk, gamma = in-chunk cumsum of g, Dm[r,s] = e^(gamma_r - gamma_s) for s <= r else 0:
        L  = strict_lower(diag(beta) K K^T * Dm)
        U  = (I+L)^-1 diag(beta) V;   W = (I+L)^-1 diag(beta e^gamma) K
        Vn = U - W S;   O = (Q e^gamma) S + (Q K^T * Dm) Vn;   S <- e^gamma_C S + (K e^(gamma_C-gamma))^T Vn
    The last chunk may be short (no padding needed). Shapes as delta_rule_recurrent.
    """
    S = state.copy()
    hv, T, _ = q.shape
    o = np.empty_like(v)
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(c0 + chunk, T))
        Q, Kc, Vc, b = q[:, sl], k[:, sl], v[:, sl], beta[:, sl]          # [Hv,c,dk] .. [Hv,c]
        c = Q.shape[1]
        gam = np.cumsum(g[:, sl], axis=1)                                 # [Hv, c]
        lower = np.tril(np.ones((c, c), dtype=bool))
        diff = np.where(lower, gam[:, :, None] - gam[:, None, :], -np.inf)
        Dm = np.exp(diff)                                                 # [Hv, c, c]
        L = np.tril(b[:, :, None] * (Kc @ Kc.transpose(0, 2, 1)) * Dm, k=-1)
        A = np.eye(c, dtype=q.dtype)[None] + L                            # unit lower-triangular
        U = np.linalg.solve(A, b[:, :, None] * Vc)                        # [Hv, c, dv]
        W = np.linalg.solve(A, (b * np.exp(gam))[:, :, None] * Kc)        # [Hv, c, dk]
        Vn = U - W @ S
        o[:, sl] = (Q * np.exp(gam)[:, :, None]) @ S + ((Q @ Kc.transpose(0, 2, 1)) * Dm) @ Vn
        gC = gam[:, -1]                                                   # [Hv]
        S = (np.exp(gC)[:, None, None] * S
             + (Kc * np.exp(gC[:, None] - gam)[:, :, None]).transpose(0, 2, 1) @ Vn)
    return o, S


def l2norm(x, eps=1e-6):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


# =============================================================================================
# The model
# =============================================================================================

class Model:
    """A loaded qwen3_5 text model. Stateless between calls except through an explicit `State`."""

    def __init__(self, config: Config, weights: dict[str, np.ndarray], prefix: str,
                 dtype: type, emulate_bf16: bool, gdn_form: str):
        if gdn_form not in ("auto", "chunked", "recurrent"):
            raise OracleError(f"gdn_form must be auto, chunked or recurrent, got {gdn_form!r}")
        self.config, self.w, self.prefix = config, weights, prefix
        self.dtype, self.emulate_bf16, self.gdn_form = dtype, emulate_bf16, gdn_form

    # ---- precision helpers ------------------------------------------------------------------
    def _r(self, x):
        """Round to bf16 where HF's bf16 model holds a bf16 tensor; identity otherwise."""
        return round_bf16(x) if self.emulate_bf16 else x

    def _p(self, name):
        return self.w[self.prefix + name]

    def _linear(self, x, name):                                           # x [T, in] -> [T, out]
        return self._r(x @ self._p(name).T)

    def _norm(self, x, name):
        """Zero-centred RMSNorm: x32 * rsqrt(mean(x32^2) + eps) * (1 + w32), rounded once."""
        return self._r(rms_normalize(x, self.config.eps) * (1.0 + self._p(name)))

    def _mlp(self, x, p):                                                 # [T, D] -> [T, D]
        gate = self._linear(x, p + "mlp.gate_proj.weight")                # [T, I]
        up = self._linear(x, p + "mlp.up_proj.weight")                    # [T, I]
        return self._linear(self._r(self._r(silu(gate)) * up), p + "mlp.down_proj.weight")

    # ---- gated attention --------------------------------------------------------------------
    def _attention(self, x, i, state):                                    # x [T, D] -> [T, D]
        cfg, p, r = self.config, f"layers.{i}.self_attn.", self._r
        T, H, Hkv, Dh = x.shape[0], cfg.heads, cfg.kv_heads, cfg.head_dim
        qg = self._linear(x, p + "q_proj.weight").reshape(T, H, 2 * Dh)   # per head [query|gate]
        q, gate = qg[..., :Dh], qg[..., Dh:].reshape(T, H * Dh)
        q = self._norm(q, p + "q_norm.weight")                            # [T, H, Dh]
        k = self._norm(self._linear(x, p + "k_proj.weight").reshape(T, Hkv, Dh), p + "k_norm.weight")
        v = self._linear(x, p + "v_proj.weight").reshape(T, Hkv, Dh)
        # Partial RoPE: the first rotary_dim dims of each head rotate (half-split pairing); cos/sin
        # are computed in float32 and cast to the activation dtype, each product rounded (HF).
        rd = cfg.rotary_dim
        cos, sin = rope_cos_sin(np.arange(state.pos, state.pos + T), rd, cfg.rope_theta,
                                np.float64 if self.dtype == np.float64 else np.float32)
        cos, sin = r(cos.astype(self.dtype))[:, None, :], r(sin.astype(self.dtype))[:, None, :]
        q = np.concatenate([r(r(q[..., :rd] * cos) + r(rotate_half(q[..., :rd]) * sin)), q[..., rd:]], -1)
        k = np.concatenate([r(r(k[..., :rd] * cos) + r(rotate_half(k[..., :rd]) * sin)), k[..., rd:]], -1)
        if i in state.kv:                                                 # append to the KV cache
            k = np.concatenate([state.kv[i][0], k], axis=0)               # [P+T, Hkv, Dh]
            v = np.concatenate([state.kv[i][1], v], axis=0)
        state.kv[i] = (k, v)
        # GQA: query head h reads KV head h // (H/Hkv). Scale Dh^-1/2, softmax in float32 (eager).
        rep = H // Hkv
        kh = np.repeat(k, rep, axis=1).transpose(1, 0, 2)                 # [H, P+T, Dh]
        vh = np.repeat(v, rep, axis=1).transpose(1, 0, 2)
        scores = r(r(q.transpose(1, 0, 2) @ kh.transpose(0, 2, 1)) * (Dh ** -0.5))  # [H, T, P+T]
        P = state.pos
        causal = np.arange(P + T)[None, :] <= (P + np.arange(T))[:, None]  # [T, P+T]
        probs = r(softmax(np.where(causal[None], scores, -np.inf)))
        o = r(probs @ vh).transpose(1, 0, 2).reshape(T, H * Dh)           # [T, H*Dh]
        o = r(o * r(sigmoid(gate)))                                       # output gate
        return self._linear(o, p + "o_proj.weight")

    # ---- Gated DeltaNet ---------------------------------------------------------------------
    def _gdn(self, x, i, state):                                          # x [T, D] -> [T, D]
        cfg, p, r = self.config, f"layers.{i}.linear_attn.", self._r
        T, Hk, Hv, dk, dv, K = x.shape[0], cfg.lin_k_heads, cfg.lin_v_heads, cfg.lin_k_dim, \
            cfg.lin_v_dim, cfg.conv_kernel
        qkv = self._linear(x, p + "in_proj_qkv.weight")                   # [T, C] rows q|k|v
        z = self._linear(x, p + "in_proj_z.weight").reshape(T, Hv, dv)
        b = self._linear(x, p + "in_proj_b.weight")                       # [T, Hv]
        a = self._linear(x, p + "in_proj_a.weight")                       # [T, Hv]
        # Causal depthwise conv of width K over time, then SiLU: y[t,c] = sum_j W[c,0,j] x[t-K+1+j,c]
        # (W[c,0,K-1] multiplies the current token). The state holds the last K-1 inputs.
        prev = state.conv.get(i, np.zeros((K - 1, qkv.shape[1]), dtype=self.dtype))
        ext = np.concatenate([prev, qkv], axis=0)                         # [K-1+T, C]
        state.conv[i] = ext[-(K - 1):].copy()
        wc = self._p(p + "conv1d.weight")[:, 0, :]                        # [C, K]
        conv = sum(ext[j:j + T] * wc[:, j] for j in range(K))             # [T, C]
        qkv = r(silu(r(conv)))
        kd = Hk * dk
        q = qkv[:, :kd].reshape(T, Hk, dk)
        k = qkv[:, kd:2 * kd].reshape(T, Hk, dk)
        v = qkv[:, 2 * kd:].reshape(T, Hv, dv)
        beta = r(sigmoid(b))                                              # [T, Hv]
        g = -np.exp(self._p(p + "A_log")) * softplus(a + self._p(p + "dt_bias"))  # [T, Hv] <= 0
        # Value head j reads q/k head j // (Hv/Hk). l2norm and the 1/sqrt(dk) scale in float32.
        q = np.repeat(q, Hv // Hk, axis=1)
        k = np.repeat(k, Hv // Hk, axis=1)
        q = (l2norm(q) * (dk ** -0.5)).transpose(1, 0, 2)                 # [Hv, T, dk]
        k = l2norm(k).transpose(1, 0, 2)
        S0 = state.rec.get(i, np.zeros((Hv, dk, dv), dtype=self.dtype))
        form = self.gdn_form
        if form == "auto":                                                # HF's choice
            form = "recurrent" if (T == 1 and state.pos > 0) else "chunked"
        rule = delta_rule_recurrent if form == "recurrent" else delta_rule_chunked
        o, state.rec[i] = rule(q, k, v.transpose(1, 0, 2), beta.T, g.T, S0)
        o = r(o.transpose(1, 0, 2))                                       # [T, Hv, dv]
        # Gated RMSNorm per value head, NOT zero-centred: w * round(norm(o)), then * silu(z) in f32.
        y = r(self._p(p + "norm.weight") * r(rms_normalize(o, cfg.eps)))
        y = r(y * silu(z)).reshape(T, Hv * dv)
        return self._linear(y, p + "out_proj.weight")

    # ---- one decoder layer, then the whole stack ---------------------------------------------
    def layer(self, i: int, h: np.ndarray, state: State, cap: dict) -> np.ndarray:
        """Decoder layer i on residual input h [T, D] -> [T, D]; appends to `state` (positions
        state.pos ..), records "layers.{i}.*" in `cap`. Does not advance state.pos."""
        lp = f"layers.{i}."
        cap[lp + "in"] = h
        x = cap[lp + "input_layernorm"] = self._norm(h, lp + "input_layernorm.weight")
        if self.config.layer_types[i] == "full_attention":
            mix = self._attention(x, i, state)
        else:
            mix = self._gdn(x, i, state)
        cap[lp + "mixer"] = mix
        h = cap[lp + "mid"] = self._r(h + mix)                           # residual after mixer
        x = cap[lp + "post_attention_layernorm"] = self._norm(h, lp + "post_attention_layernorm.weight")
        m = cap[lp + "mlp"] = self._mlp(x, lp)
        h = cap[lp + "out"] = self._r(h + m)
        return h

    def new_state(self) -> State:
        return State()

    def forward(self, token_ids, state: State | None = None, capture: dict | None = None,
                inject: dict[int, np.ndarray] | None = None) -> np.ndarray:
        """Run T tokens; return logits [T, V] in the model dtype.

        state:   continue from (and append to) this State; None = a fresh sequence.
        capture: if a dict, filled with activations [T, ...] keyed "embed",
                 "layers.{i}.{in,input_layernorm,mixer,mid,post_attention_layernorm,mlp,out}",
                 "norm", "logits" (names follow HF's modules).
        inject:  {i: array [T, D]} replaces the input of layer i (the residual stream).
        Raises OracleError for out-of-range token ids or a wrongly shaped injection.
        """
        cfg = self.config
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if ids.size == 0 or ids.min() < 0 or ids.max() >= cfg.vocab:
            raise OracleError(f"token ids must be a non-empty list in [0, {cfg.vocab})")
        state = State() if state is None else state
        cap = capture if capture is not None else {}
        h = self._p("embed_tokens.weight")[ids]                           # [T, D]
        cap["embed"] = h
        for i in range(cfg.layers):
            if inject and i in inject:
                h = np.asarray(inject[i], dtype=self.dtype)
                if h.shape != (ids.size, cfg.hidden):
                    raise OracleError(f"inject[{i}] has shape {h.shape}, want {(ids.size, cfg.hidden)}")
            h = self.layer(i, h, state, cap)
        state.pos += ids.size
        h = cap["norm"] = self._norm(h, "norm.weight")
        logits = cap["logits"] = self._r(h @ self.w["lm_head.weight"].T)  # [T, V]
        return logits

    def generate(self, prompt_ids, max_new_tokens: int, eos_id: int | None = None) -> list[int]:
        """Greedy decode: prefill the prompt, then one token per step through the State.

        Returns only the new tokens (stops after eos_id if given). Ties go to the lowest id.
        """
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

def load(checkpoint_dir: str, dtype: type = np.float32, emulate_bf16: bool = False,
         gdn_form: str = "auto") -> Model:
    """Load a qwen3_5 checkpoint directory (config.json + *.safetensors) strictly.

    Accepts the released layout (`model.language_model.*` + top-level `lm_head`) and the
    `Qwen3_5ForCausalLM.save_pretrained` layout (`model.*`). `mtp.*` and `model.visual.*` tensors
    are ignored; any other unused tensor, or a missing one, raises CheckpointError.
    emulate_bf16 rounds every weight to bf16 (as HF loading with dtype=bfloat16 does) and the
    activations where HF's bf16 model rounds; it requires dtype float32.
    """
    if dtype not in (np.float32, np.float64):
        raise OracleError(f"dtype must be np.float32 or np.float64, got {dtype}")
    if emulate_bf16 and dtype != np.float32:
        raise OracleError("emulate_bf16 requires dtype=np.float32")
    cfg = Config.from_hf(read_config(checkpoint_dir))
    index = index_checkpoint(checkpoint_dir)
    prefix = next((p for p in _LAYOUTS if p + "embed_tokens.weight" in index), None)
    if prefix is None:
        raise CheckpointError(f"{checkpoint_dir}: no embed_tokens.weight under {_LAYOUTS}")
    wanted = _expected_shapes(cfg)
    weights: dict[str, np.ndarray] = {}
    for name, shape in wanted.items():
        full = prefix + name
        if full not in index:
            raise CheckpointError(f"{checkpoint_dir}: missing tensor {full}")
        if index[full].shape != shape:
            raise CheckpointError(f"{full}: shape {index[full].shape}, expected {shape}")
        arr = load_tensor(index[full], dtype)
        weights[full] = round_bf16(arr) if emulate_bf16 else arr
    if "lm_head.weight" in index:                                         # untied (27B: untied)
        if index["lm_head.weight"].shape != (cfg.vocab, cfg.hidden):
            raise CheckpointError(f"lm_head.weight: shape {index['lm_head.weight'].shape}")
        arr = load_tensor(index["lm_head.weight"], dtype)
        weights["lm_head.weight"] = round_bf16(arr) if emulate_bf16 else arr
    else:                                                                 # tied embeddings
        weights["lm_head.weight"] = weights[prefix + "embed_tokens.weight"]
    used = set(weights)
    extra = [n for n in index if n not in used and not n.startswith(_IGNORED)]
    if extra:
        raise CheckpointError(f"{checkpoint_dir}: unexpected tensors {sorted(extra)[:5]}")
    return Model(cfg, weights, prefix, dtype, emulate_bf16, gdn_form)


def _expected_shapes(c: Config) -> dict[str, tuple[int, ...]]:
    """Every text tensor the oracle reads (names without the layout prefix, except lm_head)."""
    s = {"embed_tokens.weight": (c.vocab, c.hidden), "norm.weight": (c.hidden,)}
    kd, vd = c.lin_k_heads * c.lin_k_dim, c.lin_v_heads * c.lin_v_dim
    for i, kind in enumerate(c.layer_types):
        p = f"layers.{i}."
        s[p + "input_layernorm.weight"] = s[p + "post_attention_layernorm.weight"] = (c.hidden,)
        s[p + "mlp.gate_proj.weight"] = s[p + "mlp.up_proj.weight"] = (c.intermediate, c.hidden)
        s[p + "mlp.down_proj.weight"] = (c.hidden, c.intermediate)
        if kind == "full_attention":
            a = p + "self_attn."
            s[a + "q_proj.weight"] = (2 * c.heads * c.head_dim, c.hidden)
            s[a + "k_proj.weight"] = s[a + "v_proj.weight"] = (c.kv_heads * c.head_dim, c.hidden)
            s[a + "o_proj.weight"] = (c.hidden, c.heads * c.head_dim)
            s[a + "q_norm.weight"] = s[a + "k_norm.weight"] = (c.head_dim,)
        elif kind == "linear_attention":
            g = p + "linear_attn."
            s[g + "in_proj_qkv.weight"] = (2 * kd + vd, c.hidden)
            s[g + "in_proj_z.weight"] = (vd, c.hidden)
            s[g + "in_proj_b.weight"] = s[g + "in_proj_a.weight"] = (c.lin_v_heads, c.hidden)
            s[g + "conv1d.weight"] = (2 * kd + vd, 1, c.conv_kernel)
            s[g + "dt_bias"] = s[g + "A_log"] = (c.lin_v_heads,)
            s[g + "norm.weight"] = (c.lin_v_dim,)
            s[g + "out_proj.weight"] = (c.hidden, vd)
        else:
            raise CheckpointError(f"layer {i}: unknown layer type {kind!r}")
    return s
