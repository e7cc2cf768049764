"""Whole-weight dequantisation to bf16 (Triton), for the int4 / fp8 prefill GEMM route.

At large M the prefill GEMM is compute bound (2 M N K flops against N K weight bytes), so instead of
dequantising inside every [BLOCK_N, BLOCK_K] tile (which `_matmul_kernel` re-does for every row
block of x: the in-tile path ran at 0.54 (int4) / 0.68 (fp8) of cuBLAS bf16 on the H200), the
weight is expanded ONCE per call into a bf16 [N, K] scratch and the bf16 tile path multiplies it
(`linear.triton._launch` routes M >= DEQUANT_GEMM_MIN_M there). Memory-bound elementwise kernels:

* `int4_to_bf16`: W[n, k] = round_to_bf16(q[n, k] * scales[n, k // G] + mins[n, k // G]) in fp32,
  the expression of `_load_weight_tile` (FORMAT 2) in linear/weight_tile.py, nibble decode included, so
  the routed GEMM multiplies exactly the bf16 tile the in-tile path feeds its tensor-core dot (q * s
  is exact in fp32 (4-bit times 11-bit significand), so an FMA and a multiply-then-add agree).
  Rounded to nearest even: the native cast on the GPU (what the GEMM's `.to(tl.bfloat16)` does),
  `_tl.round_to` in the interpreter (whose casts truncate).
* `fp8_to_bf16`: the raw e4m3 value as bf16 (exact: e4m3 fits bf16), scale NOT applied; the GEMM
  runs FORMAT 1 on the copy so the per-channel scale stays in the epilogue as in the in-tile path.

Both treat the (contiguous) weight as one flat array, so a program's tile is a contiguous run of
bytes: int4 programs cover whole groups (flat group index = flat element index // G, because the
scales are [N, K/G] row-major and G divides K). Pointers advance by an int64 program base; offsets
inside a program are int32 (weights past 2^31 elements are fine).

The reference twin is `linear/dequant_reference.py` (same signatures).

Scratch (`scratch`): one growing bf16 buffer per (device, stream), held by this module for the life
of the process (growing reallocates; the old block goes back to torch's caching allocator, which
reuses it only in that stream's order). Ordering assumption: every user of a buffer launches on
that buffer's stream, so the dequantise kernel of call i+1 runs after the GEMM of call i has read
the buffer (stream order); a per-buffer lock keeps two host threads sharing one stream from
interleaving their dequantise/GEMM launch pairs. A buffer is never allocated (nor used) while the
stream is capturing a CUDA graph: a graph would bake in a pointer that a later growth frees, so
`route_available` is False during capture and the caller keeps the in-tile path.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import check_same_device, check_tensor, interpreting
from modeld.kernels._tl import round_to
from modeld.kernels.errors import KernelDeviceError, KernelShapeError

__all__ = ["int4_to_bf16", "fp8_to_bf16", "scratch", "route_available", "scratch_nbytes",
           "INT4_BYTES_PER_PROGRAM", "FP8_ELEMS_PER_PROGRAM", "NUM_WARPS"]

# Tile sizes: on the H200 int4 -> bf16 ran at 0.87-0.91 and fp8 -> bf16 at 0.92-0.94 of the copy
# ceiling at 27B shapes; the bench's sweep (4-32 KB per program, 4/8 warps) found nothing faster
# (bench/kernels_prefill_quant.py, KNOWLEDGE/optimizations/int4-fp8-prefill-dequant-to-bf16.md). Offline sm_90 SASS: int4 8 KB packed -> 32 KB bf16 per program at 8 warps = per
# thread 8 x 32-bit loads, 8 x STG.128, 62 registers; fp8 8192 elements = 4 x LDG.64 + 4 x STG.128;
# neither touches shared memory (KNOWLEDGE/optimizations/int4-fp8-prefill-dequant-to-bf16.md).
INT4_BYTES_PER_PROGRAM = 8192
FP8_ELEMS_PER_PROGRAM = 8192
NUM_WARPS = 8


# ----------------------------------------------------------------------------- kernels
@triton.jit
def _int4_to_bf16_kernel(q_ptr, s_ptr, m_ptr, out_ptr, NROWS,
                         BPR: tl.constexpr, RPG: tl.constexpr, BLOCK_R: tl.constexpr, ROUND_BITS: tl.constexpr):
    # Flat view of the packed weight as rows of BPR bytes (BPR = min(4, G/2)); row r holds bytes
    # [r*BPR, (r+1)*BPR) -> outputs [r*2BPR, (r+1)*2BPR) and lies in group r // RPG (RPG = G/2/BPR
    # rows per group). Why rows of 4 bytes: a thread then stores 8 bf16 = one 16-byte vector, the
    # width Triton gives a bf16 store; wider loads (16 B = 32 outputs per thread) make Triton convert
    # the layout through shared memory (STS/LDS + barriers) before the 16-byte stores.
    # Pointers advance by an int64 scalar (weights past 2^31 bytes are fine); per-element offsets and
    # the mask bound stay int32 (an int64 vector doubles the address arithmetic).
    r0 = tl.program_id(0).to(tl.int64) * BLOCK_R  # first row of this program
    q_ptr += r0 * BPR
    out_ptr += r0 * (2 * BPR)
    s_ptr += r0 // RPG  # r0 is a multiple of RPG (BLOCK_R is)
    m_ptr += r0 // RPG
    rows_left = tl.minimum(NROWS - r0, BLOCK_R).to(tl.int32)
    rl = tl.arange(0, BLOCK_R)  # local row
    rmask = rl < rows_left
    p = tl.load(q_ptr + rl[:, None] * BPR + tl.arange(0, BPR)[None, :], mask=rmask[:, None], other=0)  # [BR, BPR] u8
    s = tl.load(s_ptr + rl // RPG, mask=rmask, other=0.0).to(tl.float32)[:, None]  # [BR, 1]
    m = tl.load(m_ptr + rl // RPG, mask=rmask, other=0.0).to(tl.float32)[:, None]
    # Same decode and expression as `_load_weight_tile` FORMAT 2 (linear/weight_tile.py): nibble -> exact
    # fp32 via ((q | 0x4B000000) as fp32) - 2^23, then q * s + m in fp32.
    lo = ((p & 0xF).to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0  # q[2j]
    hi = ((p >> 4).to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0  # q[2j+1]
    q = tl.reshape(tl.join(lo, hi), [BLOCK_R, 2 * BPR])  # k order: lo0 hi0 lo1 hi1 ...
    w = q * s + m  # [BR, 2BPR] fp32
    offs = rl[:, None] * (2 * BPR) + tl.arange(0, 2 * BPR)[None, :]
    if ROUND_BITS:  # interpreter: its fp32 -> bf16 cast truncates; the integer RTNE matches the GPU's
        wb = round_to(w, tl.bfloat16)
    else:  # GPU: the native cast is RTNE (F2FP.BF16.F32.PACK_AB), what `.to(tl.bfloat16)` in the GEMM does
        wb = w.to(tl.bfloat16)
    tl.store(out_ptr + offs, wb, mask=rmask[:, None])


@triton.jit
def _fp8_to_bf16_kernel(w_ptr, out_ptr, NUMEL, BLOCK_R: tl.constexpr, VIA_F32: tl.constexpr):
    # Flat view as rows of 8 elements: a thread loads 8 fp8 (8 B) and stores 8 bf16 (one 16-byte
    # vector) in the same layout; 16-byte loads would force a shared-memory layout conversion. The
    # element mask stays constant over 8 when NUMEL % 16 == 0 (the JIT specialises that), so the
    # accesses still vectorise; any other NUMEL is masked per element (correct, narrower accesses).
    base = tl.program_id(0).to(tl.int64) * (BLOCK_R * 8)  # int64 scalar, int32 offsets (see above)
    w_ptr += base
    out_ptr += base
    left = tl.minimum(NUMEL - base, BLOCK_R * 8).to(tl.int32)
    offs = tl.arange(0, BLOCK_R)[:, None] * 8 + tl.arange(0, 8)[None, :]  # [BR, 8]
    mask = offs < left
    v = tl.load(w_ptr + offs, mask=mask, other=0.0)
    if VIA_F32:  # interpreter: bf16 is uint16 storage there; go through fp32 (exact either way)
        b = v.to(tl.float32).to(tl.bfloat16)
    else:
        b = v.to(tl.bfloat16)
    tl.store(out_ptr + offs, b, mask=mask)


# ----------------------------------------------------------------------------- launchers
def _launch_int4(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, out: torch.Tensor,
                 bytes_per_program: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """Launch on checked, contiguous inputs; `out` bf16 [N, K] (contiguous) is written."""
    nbytes = qweight.numel()
    if nbytes == 0:
        return out
    hg = qweight.shape[1] // scales.shape[1]  # packed bytes per group = G / 2 (a power of two)
    bpr = min(4, hg)
    block_r = max(hg // bpr, (bytes_per_program or INT4_BYTES_PER_PROGRAM) // bpr)  # whole groups
    nrows = nbytes // bpr
    _int4_to_bf16_kernel[(triton.cdiv(nrows, block_r),)](qweight, scales, mins, out, nrows, BPR=bpr, RPG=hg // bpr,
                                                         BLOCK_R=block_r, ROUND_BITS=interpreting(),
                                                         num_warps=num_warps or NUM_WARPS)
    return out


def _launch_fp8(weight: torch.Tensor, out: torch.Tensor, elems_per_program: int | None = None,
                num_warps: int | None = None) -> torch.Tensor:
    """Launch on a checked, contiguous weight; `out` bf16 (same shape, contiguous) is written."""
    numel = weight.numel()
    if numel == 0:
        return out
    block = max(8, elems_per_program or FP8_ELEMS_PER_PROGRAM)
    _fp8_to_bf16_kernel[(triton.cdiv(numel, block),)](weight, out, numel, BLOCK_R=block // 8, VIA_F32=interpreting(),
                                                      num_warps=num_warps or NUM_WARPS)
    return out


def _check_out(out: torch.Tensor | None, shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=torch.bfloat16, device=device)
    check_tensor("out", out, dtypes=(torch.bfloat16,), shape=shape)
    if out.device != device:
        raise KernelDeviceError(f"out is on {out.device}, the weight on {device}")
    return out


def int4_to_bf16(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """qweight u8 [N, K/2] (lo nibble = even k), scales/mins fp16 [N, K/G] -> bf16 [N, K].

    Writes `out` (bf16 [N, K], contiguous; a new tensor when None) and returns it; mutates nothing
    else. Raises KernelDtypeError / KernelShapeError / KernelStrideError / KernelDeviceError.
    """
    check_tensor("qweight", qweight, dtypes=(torch.uint8,), shape=(None, None))
    n, half_k = qweight.shape
    check_tensor("scales", scales, dtypes=(torch.float16,), shape=(n, None))
    check_tensor("mins", mins, dtypes=(torch.float16,), shape=tuple(scales.shape))
    device = check_same_device(qweight=qweight, scales=scales, mins=mins)
    n_groups = scales.shape[1]
    k = 2 * half_k
    group = k // n_groups if n_groups else 0
    if n_groups == 0 or k % n_groups or group < 2 or group & (group - 1):
        raise KernelShapeError(f"scales has {n_groups} groups for K={k}: the group size must be a power of two >= 2")
    out = _check_out(out, (n, k), device)
    return _launch_int4(qweight, scales, mins, out)


def fp8_to_bf16(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """weight float8_e4m3fn [N, K] -> bf16 [N, K], the raw values (no scale applied; exact).

    Writes `out` (bf16 [N, K], contiguous; a new tensor when None) and returns it. Raises
    KernelDtypeError / KernelShapeError / KernelStrideError / KernelDeviceError.
    """
    check_tensor("weight", weight, dtypes=(torch.float8_e4m3fn,), shape=(None, None))
    device = check_same_device(weight=weight)
    out = _check_out(out, tuple(weight.shape), device)
    return _launch_fp8(weight, out)


# ----------------------------------------------------------------------------- scratch
_SCRATCH: dict[tuple, torch.Tensor] = {}  # (device type, index, stream) -> flat bf16 buffer
_LOCKS: dict[tuple, threading.Lock] = {}
_REGISTRY_LOCK = threading.Lock()


def _key(device: torch.device) -> tuple:
    if device.type == "cuda":
        return ("cuda", device.index, torch.cuda.current_stream(device).cuda_stream)
    return (device.type, device.index, 0)


def route_available(device: torch.device) -> bool:
    """True when the dequantise-then-bf16-GEMM route may run for tensors on `device` now: a CUDA
    device whose current stream is not capturing a graph, or CPU tensors under the interpreter."""
    if device.type == "cuda":
        return not torch.cuda.is_current_stream_capturing()
    return device.type == "cpu" and interpreting()


@contextmanager
def scratch(device: torch.device, n_rows: int, k: int) -> Iterator[torch.Tensor]:
    """Yield a bf16 [n_rows, k] view of this (device, current stream)'s scratch, holding its lock.

    Grows (reallocates, no slack) the buffer when it is too small; never frees it. Contents are
    undefined on entry. Launch every kernel that touches the view inside the `with`, on the current
    stream. Must not be entered while the stream captures a graph (see `route_available`).
    """
    key = _key(device)
    with _REGISTRY_LOCK:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        need = n_rows * k
        buf = _SCRATCH.get(key)
        if buf is None or buf.numel() < need:
            _SCRATCH.pop(key, None)  # drop the old block before taking the larger one
            buf = torch.empty(need, dtype=torch.bfloat16, device=device)
            _SCRATCH[key] = buf
        yield buf[:need].view(n_rows, k)


def scratch_nbytes() -> dict[tuple, int]:
    """Bytes held per (device type, index, stream) scratch buffer (diagnostics)."""
    return {key: buf.numel() * buf.element_size() for key, buf in _SCRATCH.items()}
