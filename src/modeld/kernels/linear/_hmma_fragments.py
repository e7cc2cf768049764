"""The register fragments of the int4 mma.sync decode GEMV (`gemv_hmma`): the inline PTX that loads x in the
B-fragment layout (`_x_load`, `_x_pairs`) and decodes a thread's int4 words into the A fragment of
`mma.sync.m16n8k16.bf16` (`_chunk`), each beside the plain-Triton computation of the same tensors that the CPU
interpreter runs (ASM=False; it runs no inline asm). The lane / fragment mapping is in `gemv_hmma`'s docstring.
Inline-asm sites: KNOWLEDGE/asm-inventory.md.
"""

from __future__ import annotations

import triton
import triton.language as tl


_XLOAD_WORD = """
    mov.b32 ${o0}, 0;
    mov.b32 ${o1}, 0;
    mov.b32 ${o2}, 0;
    mov.b32 ${o3}, 0;
    setp.ne.b32 p, ${pred}, 0;
    @p ld.global.nc.v4.b32 {{${o0}, ${o1}, ${o2}, ${o3}}}, [${ptr}];
"""
# pack=4 (the thread's 4 words w): $0-$15 = X01[w], X23[w], X45[w], X67[w]; $16-$19 pointers, $20-$23 predicates.
_XLOAD_ASM = tl.constexpr("{\n.reg .pred p;\n" + "".join(
    _XLOAD_WORD.format(pred=20 + w, ptr=16 + w, o0=w, o1=4 + w, o2=8 + w, o3=12 + w) for w in range(4)) + "}")
# The same loads without .nc (ASM == X_PLAIN): plain ld.global, which ptxas keeps after griddepcontrol.wait.
_XLOAD_ASM_PLAIN = tl.constexpr(_XLOAD_ASM.value.replace("ld.global.nc.", "ld.global."))
X_PLAIN = 2  # the ASM constexpr that selects _XLOAD_ASM_PLAIN (the default; True: the .nc loads, MODELD_HMMA_X_LOAD=nc)


@triton.jit
def _x_load(xp, on, ASM: tl.constexpr):
    """xp [4 (t), 8 (g), 1, 4 (w)] int32 pointers to the 16 bytes of x of each word (the bf16 pairs
    (x[8w + 2c], x[8w + 2c + 1]), c = 0..3); on [1, 8, 1, 1]: the lanes that load (elsewhere 0).
    Returns the four pairs X01, X23, X45, X67, each [4, 8, 1, 4] int32. Inline PTX: one 16-byte load
    per word, so each thread's x stays in the mma fragment layout of its words. The load is ld.global.nc,
    with ASM == 2 (`X_PLAIN`, the default) is a plain ld.global, which ptxas keeps after griddepcontrol.wait.
    With ASM True (MODELD_HMMA_X_LOAD=nc) it is ld.global.nc, which ptxas moves above a preceding wait: under PDL
    nothing but the wait may then come before the first `_x_load`
    (KNOWLEDGE/pitfalls/ld-global-nc-hoisted-above-griddepcontrol-wait.md)."""
    if ASM == 2:
        return tl.inline_asm_elementwise(
            asm=_XLOAD_ASM_PLAIN, constraints="=r," * 16 + "l,l,l,l,r,r,r,r",
            args=[xp, on.to(tl.int32)], dtype=(tl.int32,) * 4, is_pure=True, pack=4)
    elif ASM:
        return tl.inline_asm_elementwise(
            asm=_XLOAD_ASM, constraints="=r," * 16 + "l,l,l,l,r,r,r,r",
            args=[xp, on.to(tl.int32)], dtype=(tl.int32,) * 4, is_pure=True, pack=4)
    else:
        return (tl.load(xp, mask=on, other=0), tl.load(xp + 1, mask=on, other=0), tl.load(xp + 2, mask=on, other=0),
                tl.load(xp + 3, mask=on, other=0))


@triton.jit
def _x_pairs(x01, x23, x45, x67, ASM: tl.constexpr):
    """The B-fragment pairs in the words' nibble order: P0 = (x0, x2), P1 = (x4, x6), P2 = (x1, x3),
    P3 = (x5, x7) (low half first), from the natural pairs X01 = (x0, x1) ... of `_x_load`."""
    if ASM:
        return tl.inline_asm_elementwise(
            asm="""
            prmt.b32 $0, $4, $5, 0x5410;
            prmt.b32 $1, $6, $7, 0x5410;
            prmt.b32 $2, $4, $5, 0x7632;
            prmt.b32 $3, $6, $7, 0x7632;
            """,
            constraints="=r,=r,=r,=r,r,r,r,r", args=[x01, x23, x45, x67], dtype=(tl.int32,) * 4, is_pure=True,
            pack=1)
    else:
        lo16 = 0xFFFF
        hi16 = -65536  # 0xFFFF0000 as int32
        return ((x01 & lo16) | (x23 << 16), (x45 & lo16) | (x67 << 16),
                ((x01 >> 16) & lo16) | (x23 & hi16), ((x45 >> 16) & lo16) | (x67 & hi16))


# One (16-row block, chunk) of a thread: words 4t..4t+3 of rows g and g + 8 -> 8 HMMA into its 4
# accumulators. $0-$3 out (c0..c3); in: $4-$7 words of row g, $8-$11 of row g + 8, $12-$27 the x pairs
# P0[w0..3], P1[..], P2[..], P3[..], $28-$31 accumulators. The A quad {a0, a1, a2, a3} = rows (g, g + 8) x
# k slots (2t, 2t + 1) then (2t + 8, 2t + 9) = nibbles (0, 2), (4, 6) of each word (odd nibbles next).
_HMMA_WORD = """
    and.b32 lg, ${wg}, 0x0F0F0F0F;
    shr.u32 hg, ${wg}, 4;
    and.b32 hg, hg, 0x0F0F0F0F;
    and.b32 lh, ${wh}, 0x0F0F0F0F;
    shr.u32 hh, ${wh}, 4;
    and.b32 hh, hh, 0x0F0F0F0F;
    prmt.b32 a0, lg, mg, 0x4140;
    prmt.b32 a1, lh, mg, 0x4140;
    prmt.b32 a2, lg, mg, 0x4342;
    prmt.b32 a3, lh, mg, 0x4342;
    mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{d0, d1, d2, d3}}, {{a0, a1, a2, a3}}, {{${p0}, ${p1}}}, {{d0, d1, d2, d3}};
    prmt.b32 a0, hg, mg, 0x4140;
    prmt.b32 a1, hh, mg, 0x4140;
    prmt.b32 a2, hg, mg, 0x4342;
    prmt.b32 a3, hh, mg, 0x4342;
    mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{d0, d1, d2, d3}}, {{a0, a1, a2, a3}}, {{${p2}, ${p3}}}, {{d0, d1, d2, d3}};
"""
_HMMA_ASM = tl.constexpr(
    "{\n.reg .b32 lg, hg, lh, hh, a0, a1, a2, a3, mg;\n.reg .f32 d0, d1, d2, d3;\nmov.b32 mg, 0x43434343;\n"
    + "".join(f"mov.f32 d{i}, ${28 + i};\n" for i in range(4))
    + "".join(_HMMA_WORD.format(wg=4 + w, wh=8 + w, p0=12 + w, p1=16 + w, p2=20 + w, p3=24 + w) for w in range(4))
    + "".join(f"mov.f32 ${i}, d{i};\n" for i in range(4)) + "}")


@triton.jit
def _bf16_lo(p):
    return (p << 16).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_hi(p):
    return (p & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _word_dot(words, x0, x1, x2, x3, x4, x5, x6, x7):
    """sum_i (128 + nibble i) x_i of each word (fp32)."""
    return ((((words >> 0) & 15) + 128).to(tl.float32) * x0 + (((words >> 4) & 15) + 128).to(tl.float32) * x1
            + (((words >> 8) & 15) + 128).to(tl.float32) * x2 + (((words >> 12) & 15) + 128).to(tl.float32) * x3
            + (((words >> 16) & 15) + 128).to(tl.float32) * x4 + (((words >> 20) & 15) + 128).to(tl.float32) * x5
            + (((words >> 24) & 15) + 128).to(tl.float32) * x6 + (((words >> 28) & 15) + 128).to(tl.float32) * x7)


@triton.jit
def _hmma_emulated(wg, wh, p0, p1, p2, p3, acc, j, NB: tl.constexpr):
    """What `_HMMA_ASM` computes, in plain Triton ops (interpreter). x sits in the p* of the lanes g == j % 8
    only, so sums over the g axis give every lane's x. Dims [t, g, b, w]."""
    x0 = tl.sum(_bf16_lo(p0), axis=1, keep_dims=True)
    x2 = tl.sum(_bf16_hi(p0), axis=1, keep_dims=True)
    x4 = tl.sum(_bf16_lo(p1), axis=1, keep_dims=True)
    x6 = tl.sum(_bf16_hi(p1), axis=1, keep_dims=True)
    x1 = tl.sum(_bf16_lo(p2), axis=1, keep_dims=True)
    x3 = tl.sum(_bf16_hi(p2), axis=1, keep_dims=True)
    x5 = tl.sum(_bf16_lo(p3), axis=1, keep_dims=True)
    x7 = tl.sum(_bf16_hi(p3), axis=1, keep_dims=True)  # [4, 1, 1, 4]
    rg = tl.sum(tl.sum(_word_dot(wg, x0, x1, x2, x3, x4, x5, x6, x7), axis=3), axis=0)  # [8, NB]: row 16 b + g
    rh = tl.sum(tl.sum(_word_dot(wh, x0, x1, x2, x3, x4, x5, x6, x7), axis=3), axis=0)  # row 16 b + 8 + g
    r = tl.join(rg, rh)  # [8, NB, 2 (h)]
    r = tl.reshape(tl.join(r, r), [1, 8, NB, 4])  # [., g, b, w = 2 h + l] = C[row 16 b + 8 h + g][chunk column]
    col = 2 * tl.arange(0, 4)[:, None, None, None] + (tl.arange(0, 4) % 2)[None, None, None, :]  # 2 t + l
    return acc + tl.where(col == j % 8, r, 0.0)


@triton.jit
def _chunk(wg, wh, p0, p1, p2, p3, acc, j, ASM: tl.constexpr, NB: tl.constexpr):
    """acc [4, 8, NB, 4] after chunk j (its x in mma column j % 8): wg / wh the words of rows g / g + 8."""
    if ASM:
        return tl.inline_asm_elementwise(asm=_HMMA_ASM, constraints="=f,=f,=f,=f," + "r," * 24 + "f,f,f,f",
                                         args=[wg, wh, p0, p1, p2, p3, acc], dtype=tl.float32, is_pure=True, pack=4)
    else:
        return _hmma_emulated(wg, wh, p0, p1, p2, p3, acc, j, NB)
