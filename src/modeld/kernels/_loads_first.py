"""One switch for the decode-sized norm kernels (RMSNorm, gated RMSNorm, q/k-norm RoPE): issue every global load
before any math (MODELD_LOADS_FIRST=1).

At batch 1 a norm kernel is one to three programs whose time is memory latency, not bandwidth. ptxas sinks
a load to its first use, so RMSNorm's weight load (and gated RMSNorm's gate load) was issued only after the
row's reduction had waited for x: two memory round trips where one suffices (offline sm_90 SASS: the weight
LDGs after the reduction's BAR.SYNC). Volatile loads keep their program order (the trick of the GDN decode
kernel, `gdn/_recurrent_kernels.py`: 3.8 -> 3.6 us at B1), so with the switch on all loads of a program are
in flight before the first wait. The results are bit-identical (only the load order and the L1 policy
change). Read on every launch; applies to launches of at most LOADS_FIRST_MAX_ROWS rows. Off by default until
an engine A/B (bench/engine_ab.py) measures it.
"""

from __future__ import annotations

import os

__all__ = ["LOADS_FIRST_ENV", "LOADS_FIRST_MAX_ROWS", "loads_first"]

LOADS_FIRST_ENV = "MODELD_LOADS_FIRST"
LOADS_FIRST_MAX_ROWS = 64


def loads_first(rows: int) -> bool:
    """MODELD_LOADS_FIRST=1 and a decode-sized launch (rows <= LOADS_FIRST_MAX_ROWS)."""
    return os.environ.get(LOADS_FIRST_ENV, "0") == "1" and rows <= LOADS_FIRST_MAX_ROWS
