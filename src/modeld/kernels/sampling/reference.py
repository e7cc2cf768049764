"""Sampling reference (the spec). Shape letters: kernels/README.md.

Per row b of logits [B, V] (all parameters are per-row device tensors, so the host never waits):

1. x = logits[b] in fp32. If temperature[b] == 0: return argmax(x) (lowest index on ties).
2. z = x / temperature[b].
3. top-k (top_k[b] > 0): keep the top_k[b] largest z (by rank; rank ties go to the lower index).
4. top-p (top_p[b] < 1): p = softmax of the z kept by step 3; walking down the ranks, keep rank r
   while the probability mass of the ranks above it is < top_p[b] (rank 0 is always kept).
5. thr = the smallest kept z; the kept set is {v : z[v] ≥ thr} (ties at the threshold stay in).
6. Draw: return argmax over the kept set of z[v] + gumbel(seed[b], step[b], v) — by the Gumbel-max
   property this is a sample from softmax(z) restricted to the kept set.

`sample_unfiltered` is `sample` with top-k and top-p off in every row (thr = −inf): the host knows
when no request in the batch filters and can skip the threshold's vocabulary sort.
`sample_top_k` is `sample` for batches whose sampled rows all have 1 ≤ top_k ≤ k_max, or have both filters
off: steps 3–5 need only the k_max largest z, so the threshold comes from a top-k selection instead of a sort
of all V (the host knows every request's top_k and picks k_max).

Noise: u = ((h >> 8) + 0.5) · 2⁻²⁴ with h = mix(key ^ mix(v + 0x632BE5AB)),
key = mix(seed_lo ^ mix(seed_hi ^ mix(step_lo + 0x9E3779B9))), mix = "lowbias32" integer hash on
32 bits; gumbel = −log(−log(u)). A row's draw depends only on its own (seed, step), never on its
batch position. The caller advances `step` once per generated token (on the device).
"""

from __future__ import annotations

import torch

from modeld.kernels._checks import check_tensor, same_device
from modeld.kernels.errors import KernelShapeError, KernelValueError

__all__ = ["sample", "sample_unfiltered", "sample_top_k"]

LOGIT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MASK32 = 0xFFFFFFFF


def check_draw_inputs(logits, temperature, seed, step) -> None:
    """logits [B, V] contiguous float; temperature [B] fp32; seed, step [B] int64.
    Raises KernelInputError subclasses."""
    check_tensor("logits", logits, dtypes=LOGIT_DTYPES)
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise KernelShapeError(f"logits must be [B, V] with V > 0, got {list(logits.shape)}")
    B = logits.shape[0]
    check_tensor("temperature", temperature, dtypes=(torch.float32,), shape=[B])
    check_tensor("seed", seed, dtypes=(torch.int64,), shape=[B])
    check_tensor("step", step, dtypes=(torch.int64,), shape=[B])


def check_sample_inputs(logits, temperature, top_k, top_p, seed, step) -> None:
    """`check_draw_inputs` plus top_k [B] int32/int64 and top_p [B] fp32."""
    check_draw_inputs(logits, temperature, seed, step)
    B = logits.shape[0]
    check_tensor("top_k", top_k, dtypes=(torch.int32, torch.int64), shape=[B])
    check_tensor("top_p", top_p, dtypes=(torch.float32,), shape=[B])


def check_sample_values(temperature, top_k, top_p) -> None:
    """temperature >= 0, 0 < top_p <= 1 and top_k >= 0 in every row (host reads: reference only).
    Raises KernelValueError."""
    if bool((temperature < 0).any()) or bool(((top_p <= 0) | (top_p > 1)).any()) or bool((top_k < 0).any()):
        raise KernelValueError("need temperature >= 0, 0 < top_p <= 1 and top_k >= 0 in every row")


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding 32-bit values (products wrap; low 32 bits kept)."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def gumbel_noise(seed: torch.Tensor, step: torch.Tensor, V: int) -> torch.Tensor:
    """gumbel [B, V] fp32 for per-row seed, step (int64 [B]); see the module docstring."""
    key = mix32((seed & MASK32) ^ mix32(((seed >> 32) & MASK32) ^ mix32((step & MASK32) + 0x9E3779B9)))
    v = torch.arange(V, dtype=torch.int64, device=seed.device)
    h = mix32(key[:, None] ^ mix32(v + 0x632BE5AB)[None, :])
    u = ((h >> 8).float() + 0.5) * (2.0**-24)
    return -torch.log(-torch.log(u))


def scaled(x: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Step 2: z = x / temperature per row (greedy rows, temperature 0, keep x)."""
    return x / torch.where(temperature == 0, torch.ones_like(temperature), temperature)[:, None]


def _threshold_of_sorted(zs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Steps 3–5 on zs [B, W], each row's W largest z in descending order (W = V, or a top-k bound): the smallest
    z kept by top-k (top_k 0: all W) then top-p."""
    W = zs.shape[1]
    rank = torch.arange(W, device=zs.device)[None, :]
    k = torch.where(top_k > 0, top_k.long(), torch.full_like(top_k.long(), W))[:, None]
    keep = rank < k
    p = torch.softmax(zs.masked_fill(~keep, float("-inf")), dim=1)
    mass_above = torch.cumsum(p, dim=1) - p
    keep &= (mass_above < top_p[:, None]) | (rank == 0)
    n_keep = keep.sum(dim=1)  # >= 1
    return zs.gather(1, (n_keep - 1)[:, None])[:, 0]


def keep_threshold(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """thr [B] fp32: the smallest z kept by top-k then top-p (steps 3–5); all device ops."""
    zs, _ = torch.sort(z, dim=1, descending=True, stable=True)  # [B, V]
    return _threshold_of_sorted(zs, top_k, top_p)


def sample(logits, temperature, top_k, top_p, seed, step) -> torch.Tensor:
    """Pick one token per row; see the module docstring. Returns ids [B] int64 (new); mutates nothing.

    The reference also checks values on the host (temperature ≥ 0, 0 < top_p ≤ 1, top_k ≥ 0) and
    raises KernelValueError; the Triton path cannot without a host sync and leaves them undefined.
    """
    check_sample_inputs(logits, temperature, top_k, top_p, seed, step)
    same_device(logits=logits, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, step=step)
    check_sample_values(temperature, top_k, top_p)
    x = logits.float()
    z = scaled(x, temperature)
    return _draw(x, z, temperature, keep_threshold(z, top_k, top_p), seed, step)


def keep_threshold_top(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, k_max: int) -> torch.Tensor:
    """`keep_threshold` for rows with 1 <= top_k <= k_max, from the k_max largest z; −inf for rows with
    top_k == 0 (the caller guarantees their top_p is 1). All device ops, no sort of V."""
    vals = torch.topk(z, k_max, dim=1, largest=True, sorted=True).values  # [B, k_max], descending
    thr = _threshold_of_sorted(vals, top_k, top_p)
    return torch.where(top_k > 0, thr, torch.full_like(thr, float("-inf")))


def check_k_max(logits, k_max) -> None:
    """1 <= k_max <= V (no device reads). Raises KernelValueError."""
    V = logits.shape[1]
    if not 1 <= int(k_max) <= V:
        raise KernelValueError(f"k_max must be in [1, V = {V}], got {k_max}")


def check_top_k_bound(logits, temperature, top_k, top_p, k_max) -> None:
    """The contract of `sample_top_k` that needs values: 1 <= k_max <= V, and every row with temperature > 0
    has 1 <= top_k <= k_max or both filters off (top_k 0, top_p 1). Host reads: reference only."""
    check_k_max(logits, k_max)
    sampled = temperature > 0
    bounded = (top_k >= 1) & (top_k <= int(k_max))
    off = (top_k == 0) & (top_p == 1)
    if bool((sampled & ~bounded & ~off).any()):
        raise KernelValueError(f"sample_top_k: every sampled row needs 1 <= top_k <= k_max ({k_max}) "
                               "or top_k 0 with top_p 1; use sample for the others")


def sample_top_k(logits, temperature, top_k, top_p, seed, step, k_max: int) -> torch.Tensor:
    """`sample` for rows whose top_k is in [1, k_max] (or whose filters are off; greedy rows are free): the
    same tokens, up to float ties of the top-p mass, from the k_max largest z instead of a sort of V.
    Returns ids [B] int64 (new); mutates nothing. Raises KernelValueError where a row breaks that contract."""
    check_sample_inputs(logits, temperature, top_k, top_p, seed, step)
    same_device(logits=logits, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, step=step)
    check_sample_values(temperature, top_k, top_p)
    check_top_k_bound(logits, temperature, top_k, top_p, k_max)
    x = logits.float()
    z = scaled(x, temperature)
    return _draw(x, z, temperature, keep_threshold_top(z, top_k, top_p, k_max), seed, step)


def _draw(x, z, temperature, thr, seed, step):
    score = torch.where(z >= thr[:, None], z + gumbel_noise(seed, step, x.shape[1]), float("-inf"))
    return torch.where(temperature == 0, x.argmax(dim=1), score.argmax(dim=1))


def sample_unfiltered(logits, temperature, seed, step) -> torch.Tensor:
    """`sample` with top_k = 0 and top_p = 1 in every row (no vocabulary sort). Returns ids [B]
    int64 (new); mutates nothing. The reference checks temperature ≥ 0 on the host."""
    check_draw_inputs(logits, temperature, seed, step)
    B = logits.shape[0]
    same_device(logits=logits, temperature=temperature, seed=seed, step=step)
    if bool((temperature < 0).any()):
        raise KernelValueError("need temperature >= 0 in every row")
    x = logits.float()
    z = scaled(x, temperature)
    thr = torch.full((B,), float("-inf"), device=x.device)
    return _draw(x, z, temperature, thr, seed, step)
