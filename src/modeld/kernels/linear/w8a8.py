"""fp8 x fp8 (w8a8) prefill GEMM in Triton: the same functions as `linear.w8a8_reference` (the spec).

Opt-in sibling of `linear.triton.linear_fp8` / `swiglu_linear_fp8` for the fp8 weight profile: the
activations are quantised per row to e4m3 (one fp32 scale per token) by `_quant_rows_kernel`, then
`_w8a8_kernel` multiplies two e4m3 tiles with `tl.dot` (fp32 accumulate), which on sm_90 is wgmma
with fp8 operands (QGMMA in SASS: twice the bf16 HGMMA rate) instead of widening W to bf16. The
per-row and per-channel scales factor out of the K sum and are applied once in the epilogue.

Two launches per call: the quantiser (memory bound: reads x once for the amax, again from L2 for
the codes) and the GEMM. `_w8a8_tma_kernel` is the same GEMM with tiles moved by TMA (host tensor
descriptors), opted into by a config with `tma=True` (a sweep candidate; no default uses it). Tiles come from `CONFIGS` (data keyed by the M bucket and SwiGLU, never
autotuned); `_launch(..., config=...)` lets bench/kernels_w8a8.py time other candidates.
Accumulation: `promote_k` > 0 passes `max_num_imprecise_acc` to tl.dot, so Triton adds the tensor
core's partial sum to a separate fp32 accumulator every promote_k K-elements (the DeepSeek-V3 /
CUTLASS "promotion"); 0 keeps the tensor core's own fp8 accumulator over all K (Triton's sm_90
default, "fast accumulation"), whose adder keeps fewer bits than fp32.

Interpreter (TRITON_INTERPRET=1): the fp8 tiles are widened to fp32 before the dot (DOT_F32; the
values are the same e4m3 values, so the CPU tests check the math), and the fp32 -> e4m3 rounding is
done by `_e4m3_rne` in integer arithmetic, because the interpreter's own fp8 cast truncates
(1.0625 -> 1.125, 464 -> NaN, 1e-3 -> 0). On the GPU the cast is the hardware
`cvt.rn.satfinite.e4m3x2.f32` (RNE, saturating), which matches torch after the explicit clamp.
Routing: `linear.triton` sends fp8 GEMMs with M >= W8A8_MIN_M here only when FP8_PREFILL is "w8a8"
(env MODELD_FP8_PREFILL). Measured on the H200: 1.6-2.0x cuBLAS bf16 with the default tiles (the
sweep was not run yet), 27B 8k TTFT 938 -> 584 ms in an fp8 engine, but the logits move past the
fp8 cell's rung-6 limit, so it is not certified (KNOWLEDGE/optimizations/fp8-w8a8-qgmma-prefill.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import check_same_device, check_tensor, interpreting
from modeld.kernels._tl import grouped_tile
from modeld.kernels.errors import KernelShapeError, KernelStrideError, KernelValueError
from modeld.kernels.linear.quant import FP8_MAX
from modeld.kernels.linear.w8a8_reference import AMAX_FLOOR, Fp8Rows

__all__ = ["W8A8Config", "CONFIGS", "SWEEP", "pick_config", "quantize_rows_fp8", "linear_fp8_w8a8",
           "swiglu_linear_fp8_w8a8"]


@dataclass(frozen=True)
class W8A8Config:
    """Tile of one `_w8a8_kernel` launch. promote_k: 0 = fp8 tensor-core accumulation over all of K;
    > 0 (a multiple of 32, <= block_k) = add partial sums of promote_k K-elements to an fp32
    accumulator (Triton's max_num_imprecise_acc)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    promote_k: int = 0
    tma: bool = False  # x / W tiles through host TMA descriptors (`_w8a8_tma_kernel`); needs K % 16 == 0
    source: str = "default (offline SASS, not yet measured on the GPU)"


# (swiglu, bucket) -> config; bucket "small" = M <= 64 (one 64-row wgmma tile), else "gemm".
# block_k 128: one 128-byte fp8 row per tile row (the 128B smem swizzle), 4 QGMMA k-steps of 32.
# Shared memory per stage = (block_m + block_n * (2 if swiglu else 1)) * block_k bytes.
# Registers: fp32 accumulators block_m * block_n * (2 if swiglu else 1) / (32 * num_warps) each.
CONFIGS: dict[tuple[bool, str], W8A8Config] = {
    (False, "gemm"): W8A8Config(128, 256, 128, 8, 3),  # 48 KB/stage, 128 acc regs/thread
    (True, "gemm"): W8A8Config(128, 128, 128, 8, 3),  # gate + up tiles: 48 KB/stage, 2 x 64 acc regs
    (False, "small"): W8A8Config(64, 128, 128, 4, 4),
    (True, "small"): W8A8Config(64, 64, 128, 4, 4),
}
# Candidates the bench times at M = 4096 (rows tagged [sweep], not run on the H200 yet); the winner
# goes into CONFIGS.
SWEEP: dict[bool, tuple[W8A8Config, ...]] = {
    False: (W8A8Config(128, 256, 128, 8, 3), W8A8Config(128, 256, 128, 8, 4), W8A8Config(128, 128, 128, 8, 4),
            W8A8Config(256, 128, 128, 8, 3), W8A8Config(128, 128, 128, 8, 4, promote_k=128),
            W8A8Config(128, 256, 128, 8, 3, tma=True)),
    True: (W8A8Config(128, 128, 128, 8, 3), W8A8Config(128, 128, 128, 8, 4), W8A8Config(128, 64, 128, 8, 4),
           W8A8Config(256, 64, 128, 8, 3), W8A8Config(128, 128, 128, 8, 3, promote_k=128),
           W8A8Config(128, 128, 128, 8, 3, tma=True)),
}
# Small tiles for the CPU interpreter (cost per tile op; boundary tiles at test sizes).
INTERPRETER_CONFIG = W8A8Config(16, 32, 32, 4, 1, group_m=4, source="interpreter")
QUANT_BLOCK_K = 1024  # quantiser chunk along K (one row per program, 4 warps: 8 elements per thread)


def pick_config(swiglu: bool, m: int, n: int, k: int, interpreting: bool) -> W8A8Config:
    """The tile config for one launch (interpreter tiles, else the CONFIGS entry of M's bucket)."""
    if interpreting:
        return INTERPRETER_CONFIG
    return CONFIGS[(swiglu, "small" if m <= 64 else "gemm")]


# ----------------------------------------------------------------------------- activation quantiser
@triton.jit
def _e4m3_rne(v):
    """fp32 v with |v| <= 448 -> float8e4nv, round to nearest even, in integer ops (interpreter path).

    Normal codes (|v| >= 2^-6): RNE of the fp32 mantissa to 3 bits (carry may bump the exponent),
    code = (exp - 120) << 3 | mantissa. Subnormal codes (|v| < 2^-6, step 2^-9): (|v| + 2^14) - 2^14
    rounds |v| to a multiple of 2^-9 in fp32 (RNE), code = that * 2^9 (8 -> 2^-6, the first normal).
    """
    bits = v.to(tl.uint32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = tl.abs(v)
    ab = a.to(tl.uint32, bitcast=True)
    r = ab + 0x7FFFF + ((ab >> 20) & 1)
    normal = (((r >> 23) - 120) << 3) | ((r >> 20) & 7)
    sub = ((((a + 16384.0) - 16384.0) * 512.0).to(tl.int32)).to(tl.uint32)
    code = tl.where(a < 0.015625, sub, normal) | sign
    return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, amax_floor, fp8_max,
                       BLOCK_K: tl.constexpr, EXACT_CVT: tl.constexpr):
    # One program per row m: scale[m] = max(amax, floor) / 448; q[m, :] = e4m3(clamp(x / scale)).
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        v = tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)  # widen first (interpreter bf16)
        amax = tl.maximum(amax, tl.abs(v))
    scale = tl.math.div_rn(tl.maximum(tl.max(amax, axis=0), amax_floor), fp8_max)  # IEEE, like torch
    tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK_K):  # second read of the row: from L2 (<= 35 KB per row at 27B)
        ks = k0 + tl.arange(0, BLOCK_K)
        v = tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.math.div_rn(v, scale), -fp8_max), fp8_max)
        if EXACT_CVT:
            q8 = _e4m3_rne(q)
        else:
            q8 = q.to(tl.float8e4nv)  # cvt.rn.satfinite.e4m3x2.f32
        tl.store(q_ptr + row * stride_qm + ks, q8, mask=ks < K)


# ----------------------------------------------------------------------------- GEMM
@triton.jit
def _w8a8_kernel(xq_ptr, sx_ptr, w_ptr, sw_ptr, y_ptr, M, N, K, stride_xm, stride_w, stride_ym, up_offset,
                 SWIGLU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr, PROMOTE_K: tl.constexpr, DOT_F32: tl.constexpr):
    # y[m, n] = (sum_k q[m, k] W[n, k]) * sx[m] * sw[n]   (SWIGLU: silu(. rows n) * (. rows n + up_offset))
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)

    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = ms < M
    g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        xt = tl.load(xq_ptr + ms[:, None] * stride_xm + ks[None, :], mask=m_mask[:, None] & k_mask[None, :],
                     other=0.0)  # [BM, BK] e4m3
        wg = tl.load(w_ptr + rows[:, None] * stride_w + ks[None, :], mask=row_mask[:, None] & k_mask[None, :],
                     other=0.0)  # [BN, BK] e4m3
        if DOT_F32:
            g = tl.dot(xt.to(tl.float32), tl.trans(wg.to(tl.float32)), g)
        elif PROMOTE_K > 0:
            g = tl.dot(xt, tl.trans(wg), g, max_num_imprecise_acc=PROMOTE_K)
        else:
            g = tl.dot(xt, tl.trans(wg), g)
        if SWIGLU:
            wu = tl.load(w_ptr + (rows + up_offset)[:, None] * stride_w + ks[None, :],
                         mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            if DOT_F32:
                u = tl.dot(xt.to(tl.float32), tl.trans(wu.to(tl.float32)), u)
            elif PROMOTE_K > 0:
                u = tl.dot(xt, tl.trans(wu), u, max_num_imprecise_acc=PROMOTE_K)
            else:
                u = tl.dot(xt, tl.trans(wu), u)
    _epilogue(g, u, sx_ptr, sw_ptr, y_ptr, ms, rows, M, N, stride_ym, up_offset, SWIGLU)


@triton.jit
def _epilogue(g, u, sx_ptr, sw_ptr, y_ptr, ms, rows, M, N, stride_ym, up_offset, SWIGLU: tl.constexpr):
    """y[ms, rows] = g * sx * sw (SWIGLU: silu(that) * (u * sx * sw_up)), stored with masks."""
    m_mask = ms < M
    row_mask = rows < N
    sx = tl.load(sx_ptr + ms, mask=m_mask, other=0.0)[:, None]  # [BM, 1]
    g = g * sx * tl.load(sw_ptr + rows, mask=row_mask, other=0.0)[None, :]
    if SWIGLU:
        u = u * sx * tl.load(sw_ptr + rows + up_offset, mask=row_mask, other=0.0)[None, :]
        out = g * tl.sigmoid(g) * u
    else:
        out = g
    tl.store(y_ptr + ms[:, None] * stride_ym + rows[None, :], out.to(y_ptr.dtype.element_ty),
             mask=m_mask[:, None] & row_mask[None, :])


@triton.jit
def _w8a8_tma_kernel(x_desc, w_desc, sx_ptr, sw_ptr, y_ptr, M, N, K, stride_ym, up_offset,
                     SWIGLU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, PROMOTE_K: tl.constexpr, DOT_F32: tl.constexpr):
    # `_w8a8_kernel` with the x / W tiles moved by the TMA engine (host descriptors; out-of-bounds
    # rows/columns arrive as zeros). For SWIGLU the W descriptor spans all 2F rows: up rows n + F.
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        xt = x_desc.load([pid_m * BLOCK_M, k0])  # [BM, BK] e4m3
        wg = w_desc.load([pid_n * BLOCK_N, k0])  # [BN, BK] e4m3
        if DOT_F32:
            g = tl.dot(xt.to(tl.float32), tl.trans(wg.to(tl.float32)), g)
        elif PROMOTE_K > 0:
            g = tl.dot(xt, tl.trans(wg), g, max_num_imprecise_acc=PROMOTE_K)
        else:
            g = tl.dot(xt, tl.trans(wg), g)
        if SWIGLU:
            wu = w_desc.load([pid_n * BLOCK_N + up_offset, k0])
            if DOT_F32:
                u = tl.dot(xt.to(tl.float32), tl.trans(wu.to(tl.float32)), u)
            elif PROMOTE_K > 0:
                u = tl.dot(xt, tl.trans(wu), u, max_num_imprecise_acc=PROMOTE_K)
            else:
                u = tl.dot(xt, tl.trans(wu), u)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    _epilogue(g, u, sx_ptr, sw_ptr, y_ptr, ms, rows, M, N, stride_ym, up_offset, SWIGLU)


# ----------------------------------------------------------------------------- wrappers
def _quantize(x: torch.Tensor) -> Fp8Rows:
    """Launch the quantiser on a checked x [M, K] bf16 (K >= 1)."""
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m:
        _quant_rows_kernel[(m,)](x, q, scale, k, x.stride(0), q.stride(0), AMAX_FLOOR, FP8_MAX,
                                 BLOCK_K=QUANT_BLOCK_K if not interpreting() else 64, EXACT_CVT=interpreting(),
                                 num_warps=4)
    return Fp8Rows(q, scale)


def _check_x(x: torch.Tensor) -> None:
    check_tensor("x", x, dtypes=(torch.bfloat16,), shape=(None, None))
    if x.shape[1] == 0:
        raise KernelShapeError("x has K = 0 input features")


def _check(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, out_dtype: torch.dtype) -> None:
    _check_x(x)
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise KernelValueError(f"out_dtype must be bfloat16 or float32, got {out_dtype}")
    check_tensor("weight", weight, dtypes=(torch.float8_e4m3fn,), shape=(None, x.shape[1]))
    check_tensor("weight_scale", weight_scale, dtypes=(torch.float32,), shape=(weight.shape[0],))


def _launch(x, weight, weight_scale, swiglu: bool, out_dtype: torch.dtype,
            config: W8A8Config | None = None) -> torch.Tensor:
    """Quantise x, allocate y, launch the GEMM. Inputs were checked by the public wrapper; raises
    KernelShapeError for an odd SwiGLU weight, KernelValueError / KernelStrideError for an unusable
    forced config (promote_k; a TMA config on unaligned rows)."""
    device = check_same_device(x=x, weight=weight, weight_scale=weight_scale)
    m, k = x.shape
    n_rows = weight.shape[0]
    if swiglu and n_rows % 2:
        raise KernelShapeError(f"a gate/up weight must have an even number of rows (2F), got {n_rows}")
    n = n_rows // 2 if swiglu else n_rows
    y = torch.empty((m, n), dtype=out_dtype, device=device)
    if m == 0 or n == 0:
        return y
    cfg = config or pick_config(swiglu, m, n, k, interpreting())
    if cfg.promote_k and (cfg.promote_k % 32 or cfg.promote_k > cfg.block_k):
        raise KernelValueError(f"promote_k={cfg.promote_k} must be a multiple of 32 and <= block_k={cfg.block_k}")
    if cfg.tma and (k % 16 or weight.data_ptr() % 16):
        raise KernelStrideError(f"a TMA config needs 16-byte aligned rows (K % 16 == 0, got K={k}) and weight base")
    rows = _quantize(x)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    consts = dict(SWIGLU=swiglu, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                  PROMOTE_K=cfg.promote_k, DOT_F32=interpreting(), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        x_desc = TensorDescriptor.from_tensor(rows.q, [cfg.block_m, cfg.block_k])
        w_desc = TensorDescriptor.from_tensor(weight, [cfg.block_n, cfg.block_k])
        _w8a8_tma_kernel[grid](x_desc, w_desc, rows.scale, weight_scale, y, m, n, k, y.stride(0), n, **consts)
    else:
        _w8a8_kernel[grid](rows.q, rows.scale, weight, weight_scale, y, m, n, k, rows.q.stride(0), weight.stride(0),
                           y.stride(0), n, **consts)
    return y


def quantize_rows_fp8(x: torch.Tensor) -> Fp8Rows:
    """x [M, K] bf16 -> Fp8Rows(q e4m3 [M, K], scale fp32 [M]), bit-identical to the reference.
    Raises KernelInputError subclasses for a bad x; allocates the outputs, mutates nothing."""
    _check_x(x)
    check_same_device(x=x)
    return _quantize(x)


def linear_fp8_w8a8(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """w8a8: x [M, K] bf16 (quantised per row), weight e4m3 [N, K], weight_scale fp32 [N] -> y [M, N].
    Raises KernelInputError subclasses for bad inputs (never coerces)."""
    _check(x, weight, weight_scale, out_dtype)
    return _launch(x, weight, weight_scale, False, out_dtype)


def swiglu_linear_fp8_w8a8(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """w8a8 SwiGLU: weight e4m3 [2F, K] (gate rows, then up rows), weight_scale fp32 [2F] -> [M, F].
    Raises KernelInputError subclasses for bad inputs (never coerces)."""
    _check(x, weight, weight_scale, out_dtype)
    return _launch(x, weight, weight_scale, True, out_dtype)
