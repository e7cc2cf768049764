"""CPU emulation of the v2 chunked GDN prefill with its state / output passes' dot operands rounded to tf32 (the
default) or fp16 (`$MODELD_GDN_PASS_PRECISION=fp16`: W and the chunk-start states stored fp16 too), the prep at
tf32x3 in both, each against an fp64 chunked loop: is fp16 measurably worse than tf32?
(KNOWLEDGE/findings/gdn-fp16-passes-h200-s23.md)

    PYTHONPATH=src:. python3 bench/gdn_pass_precision.py [--seeds 0,1,2] [--t 1024]    # ~1 min per seed, no GPU
"""
import argparse
import sys

import torch
sys.path[:0] = ["src", "."]
from bench.gdn_inverse_precision import matmul as mm, product, to_tf32
import torch.nn.functional as F
C = 64
def f16(x): return x.half().float()
def mmP(a, b, P):
    if P == "fp16": return f16(a) @ f16(b)
    if P == "fp64": return (a.double() @ b.double()).float()
    return mm(a, b, P)
def run(q, k, v, a, b, A_log, dt_bias, state, P, prepP):
    T, Hk, Dk = q.shape; Hv, Dv = v.shape[1], v.shape[2]; ratio = Hv // Hk
    dt = torch.float64 if P == "fp64" else torch.float32
    o = torch.empty(T, Hv, Dv, dtype=torch.float64); S_all = state.clone().to(dt)
    for h in range(Hv):
        S = S_all[h].clone()
        kk = k[:, h // ratio].double(); qq = q[:, h // ratio].double()
        kk = kk * torch.rsqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
        qq = qq * torch.rsqrt((qq * qq).sum(-1, keepdim=True) + 1e-6) * Dk**-0.5
        beta = torch.sigmoid(b[:, h].double())
        g = -torch.exp(A_log[h].double()) * F.softplus(a[:, h].double() + dt_bias[h].double())
        kk, qq, beta, g = kk.to(dt), qq.to(dt), beta.to(dt), g.to(dt)
        for c0 in range(0, T, C):
            sl = slice(c0, min(c0 + C, T)); n = sl.stop - c0
            K = torch.zeros(C, Dk, dtype=dt); K[:n] = kk[sl]; Q = torch.zeros(C, Dk, dtype=dt); Q[:n] = qq[sl]
            V = torch.zeros(C, Dv, dtype=dt); V[:n] = v[sl, h].to(dt)
            be = torch.zeros(C, dtype=dt); be[:n] = beta[sl]; gg = torch.zeros(C, dtype=dt); gg[:n] = g[sl]
            gam = torch.cumsum(gg, 0)
            r, s = torch.arange(C)[:, None], torch.arange(C)[None, :]
            decay = torch.exp(torch.clamp(gam[:, None] - gam[None, :], max=0))
            if P == "fp64":
                L = torch.where(r > s, be[:, None] * (K @ K.T) * decay, 0.0)
                X = torch.linalg.inv(torch.eye(C, dtype=dt) + L)
                U = X @ (be[:, None] * V); W = X @ ((be * torch.exp(gam))[:, None] * K)
                Vn = U - W @ S
                Dm = torch.where(r >= s, decay, 0.0)
                O = (Q * torch.exp(gam)[:, None]) @ S + ((Q @ K.T) * Dm) @ Vn
                gC = gam[n - 1]; S = torch.exp(gC) * S + (K * torch.exp(gC - gam)[:, None]).T @ Vn
            else:
                L = torch.where(r > s, be[:, None] * mm(K, K.T, prepP) * decay, 0.0)
                X = product(L.double(), "tf32x3", prepP).float()
                U = mm(X, be[:, None] * V, prepP); W = mm(X, (be * torch.exp(gam))[:, None] * K, prepP)
                if P == "fp16": W = f16(W)
                Vn = U - mmP(W, S, P)
                Dm = torch.where(r >= s, decay, 0.0)
                if P == "fp16":
                    O = torch.exp(gam)[:, None] * mmP(Q, S, P) + mmP(mmP(Q, K.T, P) * Dm, Vn, P)
                else:
                    O = mmP(Q * torch.exp(gam)[:, None], S, P) + mmP(mmP(Q, K.T, P) * Dm, Vn, P)
                gC = gam[n - 1]
                S = torch.exp(gC) * S + mmP((K * torch.exp(gC - gam)[:, None]).T, Vn, P)
                if P == "fp16": S = f16(S)
            o[sl, h] = O[:n].double()
        S_all[h] = S
    return o, S_all.double()
def one_seed(seed: int, T: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    Hk, Hv, Dk, Dv = 1, 3, 128, 128
    mixed = torch.randn(T, 2 * Hk * Dk + Hv * Dv, generator=gen).bfloat16()
    q = mixed[:, :Hk * Dk].view(T, Hk, Dk); v = mixed[:, 2 * Hk * Dk:].view(T, Hv, Dv)
    a = (torch.randn(T, Hv, generator=gen) * 2).bfloat16()
    A_log = torch.log(torch.rand(Hv, generator=gen) * 0.03 + 0.002)
    dt_bias = (torch.randn(Hv, generator=gen) * 0.5).bfloat16()
    state = torch.randn(Hv, Dk, Dv, generator=gen) * 0.3
    for keys in ("random", "corr"):
        if keys == "random":
            k = mixed[:, Hk * Dk:2 * Hk * Dk].view(T, Hk, Dk); b = (torch.randn(T, Hv, generator=gen) * 2).bfloat16()
        else:
            base = torch.randn(1, Hk, Dk, generator=gen)
            k = (base + 0.05 * torch.randn(T, Hk, Dk, generator=gen)).bfloat16()
            b = (torch.rand(T, Hv, generator=gen) * 2 + 4).bfloat16()
        o64, s64 = run(q, k, v, a, b, A_log, dt_bias, state, "fp64", None)
        for P in ("tf32", "fp16", "ieee"):
            o, s = run(q, k, v, a, b, A_log, dt_bias, state, P, "tf32" if P != "ieee" else "ieee")
            ro = ((o - o64).norm() / o64.norm()).item(); rs = ((s - s64).norm() / s64.norm()).item()
            mo = ((o - o64).abs().max() / o64.abs().max()).item()
            print(f"seed {seed} keys {keys:6s} passes {P:5s}: out rel-fro {ro:.2e} max/maxref {mo:.2e}  "
                  f"state rel-fro {rs:.2e}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    ap.add_argument("--t", type=int, default=1024, help="tokens (default 1024)")
    args = ap.parse_args()
    for sd in args.seeds.split(","):
        one_seed(int(sd), args.t)
