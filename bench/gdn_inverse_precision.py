"""How precise is each way of building a GDN chunk's (I + L)⁻¹ when the GPU multiplies in tf32? A CPU emulation.

The chunk prep needs X = (I + L)⁻¹ for the strictly lower 64×64 L = β (K̂K̂ᵀ) ⊙ decay. Two kernels build it:
* "blocked" (`_chunk_prep_v2.py`): each 16×16 diagonal block by fp32 substitution, the blocks below the diagonal
  by X_ij = −X_ii Σ L_im X_mj products (tf32 on the GPU);
* "product" (`_chunk_prep_product.py`): D = (I + Ld)⁻¹ as (I − Ld)(I + Ld²)(I + Ld⁴)(I + Ld⁸) over the diagonal
  blocks, then X = (I − M)(I + M²) D with M = D Lo, every step a whole-tile product.
This script rounds every product's operands the way the tensor cores do (tf32: 10 mantissa bits, nearest;
tf32x3: the hi/lo split with three tf32 products, as Triton's input_precision="tf32x3") and compares X and U = X βV
with the float64 inverse, for random keys (the unit tests' inputs) and for keys close to one direction, where
L's entries approach 1 and the series' powers grow (Ld⁸ up to ~1e3) although X stays bounded.

    PYTHONPATH=src:. python3 bench/gdn_inverse_precision.py [--out /tmp/prec.json] [--seeds 4]

Then the whole v2 chunked prefill (prep, state pass, output pass) with every product tf32-rounded the same way, on
27B heads (Dk = Dv = 128, 500 tokens, slow decay, one key head and three value heads), against the fp32 reference
recurrence (`gdn.reference.gdn_prefill`, the spec; nothing else of the engine is used): the error as a fraction of
the tolerance rows the GPU tests hold it to (output: bf16 row; state: tf32 row). Above 1 a GPU test would fail.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

C, SUB, DK, DV = 64, 16, 128, 128
SCHEMES = {  # name -> (precision of the diagonal-block series, precision of everything else)
    "blocked (fp32 substitution, tf32 products)": ("fp32-substitution", "tf32"),
    "product, all tf32": ("tf32", "tf32"),
    "product, series tf32x3, rest tf32 (the kernel)": ("tf32x3", "tf32"),
    "product, all tf32x3": ("tf32x3", "tf32x3"),
}
KEYS = {"random": None, "correlated (spread 0.3)": 0.3, "near-parallel (spread 0.05)": 0.05}


def to_tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> the nearest tf32 (low 13 mantissa bits cleared), as fp32."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def matmul(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    if precision == "tf32":
        return to_tf32(a) @ to_tf32(b)
    if precision == "tf32x3":
        a_hi, b_hi = to_tf32(a), to_tf32(b)
        return a_hi @ b_hi + (a_hi @ to_tf32(b - b_hi) + to_tf32(a - a_hi) @ b_hi)
    return a.float() @ b.float()


def chunk(keys: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(L float64, β) of one chunk: unit keys, slow decay; correlated keys get β ≈ 1."""
    spread = KEYS[keys]
    if spread is None:
        k = torch.randn(C, DK, generator=gen, dtype=torch.float64)
        beta = torch.sigmoid(torch.randn(C, generator=gen, dtype=torch.float64) * 2)
    else:
        k = torch.randn(1, DK, generator=gen, dtype=torch.float64) + spread * torch.randn(C, DK, generator=gen,
                                                                                         dtype=torch.float64)
        beta = torch.sigmoid(torch.randn(C, generator=gen, dtype=torch.float64) * 2 + 3)
    k = k / k.norm(dim=1, keepdim=True)
    gam = torch.cumsum(-torch.rand(C, generator=gen, dtype=torch.float64) * 0.01, 0)
    r, s = torch.arange(C)[:, None], torch.arange(C)[None, :]
    decay = torch.exp(torch.clamp(gam[:, None] - gam[None, :], max=0))
    return torch.where(r > s, beta[:, None] * (k @ k.T) * decay, 0.0), beta


def blocked(L: torch.Tensor, precision: str) -> torch.Tensor:
    X = torch.zeros(C, C)
    blk = [slice(i * SUB, (i + 1) * SUB) for i in range(C // SUB)]
    eye = torch.eye(SUB)
    for b in blk:
        Xi = eye.clone()
        for row in range(1, SUB):
            Xi[row] = eye[row] - L[b, b][row] @ Xi
        X[b, b] = Xi
    for d in range(1, len(blk)):
        for i in range(d, len(blk)):
            j = i - d
            acc = sum(matmul(L[blk[i], blk[m]], X[blk[m], blk[j]], precision) for m in range(j, i))
            X[blk[i], blk[j]] = -matmul(X[blk[i], blk[i]], acc, precision)
    return X


def product(L: torch.Tensor, series: str, rest: str) -> torch.Tensor:
    r, s = torch.arange(C)[:, None], torch.arange(C)[None, :]
    Ld = torch.where((r // SUB) == (s // SUB), L, 0.0)
    Lo = L - Ld
    D = torch.eye(C) - Ld
    P = matmul(Ld, Ld, series)
    for _ in range(3):
        D = D + matmul(D, P, series)
        P = matmul(P, P, series)
    M = matmul(D, Lo, rest)
    Y = D + matmul(matmul(M, M, rest), D, rest)
    return Y - matmul(M, Y, rest)


def chunked_prefill(q, k, v, a, b, A_log, dt_bias, state, inverse):
    """The v2 chunked algebra per value head with tf32-rounded products; `inverse(L)` builds (I + L)⁻¹."""
    T, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    o, states = torch.empty(T, hv, dv), state.clone()
    r, s = torch.arange(C)[:, None], torch.arange(C)[None, :]
    for h in range(hv):
        S = states[h].clone()
        kh, qh = k[:, h // (hv // hk)].float(), q[:, h // (hv // hk)].float()
        kh = kh * torch.rsqrt((kh * kh).sum(-1, keepdim=True) + 1e-6)
        qh = qh * torch.rsqrt((qh * qh).sum(-1, keepdim=True) + 1e-6) * dk**-0.5
        beta = torch.sigmoid(b[:, h].float()).bfloat16().float()
        g = -torch.exp(A_log[h].float()) * torch.nn.functional.softplus(a[:, h].float() + dt_bias[h].float())
        for c0 in range(0, T, C):
            n = min(C, T - c0)
            K, Q, V, be, gg = torch.zeros(C, dk), torch.zeros(C, dk), torch.zeros(C, dv), torch.zeros(C), torch.zeros(C)
            K[:n], Q[:n], V[:n], be[:n], gg[:n] = kh[c0:c0 + n], qh[c0:c0 + n], v[c0:c0 + n, h].float(), \
                beta[c0:c0 + n], g[c0:c0 + n]
            gam = torch.cumsum(gg, 0)
            decay = torch.exp(torch.clamp(gam[:, None] - gam[None, :], max=0))
            X = inverse(torch.where(r > s, be[:, None] * matmul(K, K.T, "tf32") * decay, 0.0))
            U = matmul(X, be[:, None] * V, "tf32")
            W = matmul(X, (be * torch.exp(gam))[:, None] * K, "tf32")
            Vn = U - matmul(W, S, "tf32")
            O = matmul(Q * torch.exp(gam)[:, None], S, "tf32") + matmul(
                matmul(Q, K.T, "tf32") * torch.where(r >= s, decay, 0.0), Vn, "tf32")
            o[c0:c0 + n, h] = O[:n]
            S = torch.exp(gam[n - 1]) * S + matmul((K * torch.exp(gam[n - 1] - gam)[:, None]).T, Vn, "tf32")
        states[h] = S
    return o.bfloat16(), states


def pipeline_rows() -> list[dict]:
    """The whole chunked prefill per scheme against the reference recurrence, as fractions of the GPU tests' rows."""
    from modeld.kernels.gdn import reference as ref

    gen = torch.Generator().manual_seed(0)
    T, hk, hv = 500, 1, 3
    mixed = torch.randn(T, 2 * hk * DK + hv * DV, generator=gen).bfloat16()
    q, v = mixed[:, :hk * DK].view(T, hk, DK), mixed[:, 2 * hk * DK:].view(T, hv, DV)
    a = (torch.randn(T, hv, generator=gen) * 2).bfloat16()
    A_log = torch.log(torch.rand(hv, generator=gen) * 0.03 + 0.002)  # slow decay, as the tests' slow_decay
    dt_bias = (torch.randn(hv, generator=gen) * 0.5).bfloat16()
    state = torch.randn(hv, DK, DV, generator=gen) * 0.3
    schemes = {"blocked": lambda L: blocked(L.float(), "tf32"),
               "product, series tf32x3 (the kernel)": lambda L: product(L.float(), "tf32x3", "tf32"),
               "product, all tf32": lambda L: product(L.float(), "tf32", "tf32")}
    rows = []
    for keys in ("random", "near-parallel (spread 0.05)"):
        k = mixed[:, hk * DK:2 * hk * DK].view(T, hk, DK)
        b = (torch.randn(T, hv, generator=gen) * 2).bfloat16()
        if keys != "random":  # as tests/kernels/test_gdn.py's _correlated
            k = (torch.randn(1, hk, DK, generator=gen) + 0.05 * torch.randn(T, hk, DK, generator=gen)).bfloat16()
            b = (torch.rand(T, hv, generator=gen) * 2 + 4).bfloat16()
        s_ref = state.clone()
        o_ref = ref.gdn_prefill(q, k, v, a, b, A_log, dt_bias, s_ref).double()
        for name, inverse in schemes.items():
            o, s = chunked_prefill(q, k, v, a, b, A_log, dt_bias, state, inverse)
            out = ((o.double() - o_ref).abs() / (1.6e-2 + 1.6e-2 * o_ref.abs())).max().item()
            st = ((s.double() - s_ref).abs() / (5e-3 + 5e-3 * s_ref.double().abs())).max().item()
            rows.append({"keys": keys, "scheme": name, "output_err_over_bf16_tol": out, "state_err_over_tf32_tol": st})
    return rows


def run(seeds: int) -> list[dict]:
    rows = []
    for keys in KEYS:
        worst = {name: [0.0, 0.0] for name in SCHEMES}
        peak_power = 0.0
        for seed in range(seeds):
            gen = torch.Generator().manual_seed(seed)
            L64, beta = chunk(keys, gen)
            X64 = torch.linalg.inv(torch.eye(C, dtype=torch.float64) + L64)
            v = torch.randn(C, DV, generator=gen, dtype=torch.float64)
            U64 = X64 @ (beta[:, None] * v)
            L = L64.float()
            r, s = torch.arange(C)[:, None], torch.arange(C)[None, :]
            Ld = torch.where((r // SUB) == (s // SUB), L64, 0.0)
            peak_power = max(peak_power, torch.linalg.matrix_power(Ld, 8).abs().max().item())
            for name, (series, rest) in SCHEMES.items():
                X = blocked(L, rest) if series == "fp32-substitution" else product(L, series, rest)
                U = matmul(X, (beta[:, None] * v).float(), "tf32").double()
                worst[name][0] = max(worst[name][0], (X.double() - X64).abs().max().item())
                worst[name][1] = max(worst[name][1], ((U - U64).abs().max() / U64.abs().max()).item())
        for name, (x_err, u_err) in worst.items():
            rows.append({"keys": keys, "scheme": name, "max_abs_err_X": x_err, "max_rel_err_U": u_err,
                         "max_abs_Ld8": peak_power, "seeds": seeds})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--seeds", type=int, default=4, help="chunks per key kind (default 4); the worst is reported")
    a = ap.parse_args(argv)
    if a.seeds < 1:
        ap.error("--seeds must be >= 1")
    rows = run(a.seeds)
    print(f"{'keys':<28} {'scheme':<48} {'max|ΔX|':>9} {'max|ΔU|/max|U|':>15} {'max|Ld⁸|':>9}")
    for row in rows:
        print(f"{row['keys']:<28} {row['scheme']:<48} {row['max_abs_err_X']:9.1e} {row['max_rel_err_U']:15.1e} "
              f"{row['max_abs_Ld8']:9.1e}")
    pipeline = pipeline_rows()
    print("\nwhole chunked prefill, 27B heads, T = 500: error / tolerance (> 1 fails a GPU test)")
    print(f"{'keys':<28} {'scheme':<48} {'output':>7} {'state':>7}")
    for row in pipeline:
        print(f"{row['keys']:<28} {row['scheme']:<48} {row['output_err_over_bf16_tol']:7.2f} "
              f"{row['state_err_over_tf32_tol']:7.2f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows, "pipeline": pipeline}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
