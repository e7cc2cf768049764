"""Programmatic dependent launch (PDL, sm_90+) across the decode step: one switch for every kernel.

Without PDL a kernel starts only after the previous kernel on the stream has finished, and then pays its
launch and the first DRAM round trip with the GPU idle. With PDL (`MODELD_PDL=1`, the default; read on every launch, so
a CUDA graph keeps what was set when it was captured):
* "trigger" kernels (norms, RoPE, conv1d, attention, the split-K finish) call `griddepcontrol.launch_dependents`
  first thing: the next kernel, if it was launched with PDL, may start its programs as soon as every program
  of this one is running.
* "waiting" kernels (the decode GEMVs) are launched with `launch_pdl=True`, also trigger first thing, issue
  the loads that no earlier kernel writes (their first weight tile: weights are constant), and then run
  `griddepcontrol.wait` before touching anything an earlier kernel produced (x, partials, counters, y).
  `MODELD_PDL=late` makes them trigger after their K loop instead (`pdl_mode` 2): their successor's
  programs then cannot hold SM slots during the GEMV's own last wave.
  The wait returns when the previous kernel has completed and its memory is visible; that kernel, if it
  was launched with PDL, itself waited for its predecessor before completing, so every earlier write is
  visible too.
A kernel launched without PDL waits for its predecessor as usual, whatever that one triggered. The CPU
interpreter runs no inline asm: there PDL is always off.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from modeld.kernels._checks import interpreting
from modeld.kernels.errors import KernelValueError

__all__ = ["PDL_ENV", "PDL_DEFAULT", "pdl_mode", "pdl_on", "launch_options"]
# device helpers: pdl_trigger, pdl_wait

PDL_ENV = "MODELD_PDL"
# On by default since session 7: the same-process engine A/B (certs/engine-ab-gemv-stages-qwen3_5-27b-h200.json)
# measured int4 / bf16 / fp8 decode +3.6 / +3.7 / +4.7 % with MODELD_LOADS_FIRST, logits bit-identical, and the
# full re-certification passed with both on (KNOWLEDGE/optimizations/decode-pdl.md). "late" lost at bf16.
PDL_DEFAULT = "1"


def pdl_mode() -> int:
    """0 off (MODELD_PDL=0, or the CPU interpreter), 1 on with the waiting kernels triggering first thing
    (MODELD_PDL=1, the default when unset or empty), 2 on with them triggering after their main loop
    (MODELD_PDL=late). Raises KernelValueError for any other value."""
    v = os.environ.get(PDL_ENV) or PDL_DEFAULT
    modes = {"0": 0, "1": 1, "late": 2}
    if v not in modes:
        raise KernelValueError(f"{PDL_ENV}={v!r}: expected 0, 1 or late")
    return 0 if interpreting() else modes[v]


def pdl_on() -> bool:
    """PDL is on (`pdl_mode` > 0): trigger-only kernels trigger first thing."""
    return pdl_mode() > 0


def launch_options(waits: bool) -> dict:
    """Extra launch kwargs of a kernel that waits (`pdl_wait`) when PDL is on: launch_pdl=True."""
    return {"launch_pdl": True} if waits else {}


@triton.jit
def pdl_trigger(PDL: tl.constexpr):
    """Let the next kernel (if launched with PDL) start its programs; a no-op unless PDL."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait until the previous kernel has completed and its writes are visible; a no-op unless PDL (the
    kernel must then have been launched with launch_pdl=True)."""
    if PDL:
        gdc_wait()
