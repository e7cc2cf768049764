"""One switch for the decode-sized norm kernels (RMSNorm, gated RMSNorm, q/k-norm RoPE): issue every global load
before any math (MODELD_LOADS_FIRST, on by default).

At batch 1 a norm kernel is one to three programs whose time is memory latency, not bandwidth. ptxas sinks
a load to its first use, so RMSNorm's weight load (and gated RMSNorm's gate load) was issued only after the
row's reduction had waited for x: two memory round trips where one suffices (offline sm_90 SASS: the weight
LDGs after the reduction's BAR.SYNC). Volatile loads keep their program order (the trick of the GDN decode
kernel, `gdn/_recurrent_kernels.py`: 3.8 -> 3.6 us at B1), so with the switch on all loads of a program are
in flight before the first wait. The results are bit-identical (only the load order and the L1 policy
change). Read on every launch; applies to launches of at most LOADS_FIRST_MAX_ROWS rows. On by default since
session 7 (MODELD_LOADS_FIRST=0 turns it off): the engine A/B measured int4 decode +1.0 % alone, +3.3 % with PDL
(certs/engine-ab-pdl-modes-loads-first-qwen3_5-27b-h200.json).
"""

from __future__ import annotations

import os

from modeld.kernels.errors import KernelValueError

__all__ = ["LOADS_FIRST_ENV", "LOADS_FIRST_MAX_ROWS", "loads_first"]

LOADS_FIRST_ENV = "MODELD_LOADS_FIRST"
LOADS_FIRST_MAX_ROWS = 64


def loads_first(rows: int) -> bool:
    """MODELD_LOADS_FIRST on (unset, empty or 1; 0 turns it off) and a decode-sized launch (rows <=
    LOADS_FIRST_MAX_ROWS). Raises KernelValueError for any other value."""
    v = os.environ.get(LOADS_FIRST_ENV) or "1"
    if v not in ("0", "1"):
        raise KernelValueError(f"{LOADS_FIRST_ENV}={v!r}: expected 0 or 1")
    return v == "1" and rows <= LOADS_FIRST_MAX_ROWS
