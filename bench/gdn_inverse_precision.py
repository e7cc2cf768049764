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

    python3 bench/gdn_inverse_precision.py [--out /tmp/prec.json] [--seeds 4]

Shares no code with the engine (plain torch on the CPU); prints a table and writes JSON with --out.
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
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
