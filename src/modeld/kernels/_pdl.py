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
  programs then cannot hold SM slots during the GEMV's own last wave. `MODELD_PDL_LATE=<families>` does that for
  the listed GEMV families only (`gemv_pdl_mode`), e.g. `hmma` (the int4 M == 1 GEMV), `fp8` (v2 fp8).
  The wait returns when the previous kernel has completed and its memory is visible; that kernel, if it
  was launched with PDL, itself waited for its predecessor before completing, so every earlier write is
  visible too.
* "light" kernels are the trigger kernels above. Launched normally, each still waits for its predecessor to
  finish before its programs even start (a launch latency per kernel, about 400 of them per 27B decode step).
  With `MODELD_PDL_LIGHT=1` (the default since session 8; read on every launch; needs PDL on) they are launched
  with `launch_pdl=True` and run `griddepcontrol.wait` FIRST, before they trigger or load anything: their
  programs become resident while the predecessor runs and start the moment it completes. Triggering after the
  wait keeps the chain as deep as before (the next kernel still launches only once this one runs).
  `MODELD_PDL_LIGHT=0` launches them normally (trigger first thing, the session-7 SASS).
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

__all__ = ["PDL_ENV", "PDL_DEFAULT", "LATE_ENV", "GEMV_FAMILIES", "LIGHT_ENV", "LIGHT_DEFAULT", "pdl_mode", "pdl_on",
           "gemv_pdl_mode", "light_pdl", "light_launch", "light_kwargs", "launch_options"]
# device helpers: pdl_trigger, pdl_wait, light_prologue

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


LATE_ENV = "MODELD_PDL_LATE"
# The decode-GEMV families a launch names in `gemv_pdl_mode`: v2 by format, the M == 1 int4 mma.sync GEMV, the batched
# mma.sync GEMVs and the fp8 TMA ring (which also has its own MODELD_RING_PDL).
GEMV_FAMILIES = ("int4", "fp8", "bf16", "hmma", "hmma-batch", "fp8-batch", "ring")


def gemv_pdl_mode(family: str) -> int:
    """`pdl_mode` for a decode-GEMV launch of `family` (one of GEMV_FAMILIES): 2 (trigger after the K loop) where
    PDL is on and MODELD_PDL_LATE (comma-separated families; unset or empty: none) lists it, else `pdl_mode`. Session
    17: the fp8 ring triggering first kept +1.9 % of PDL's gain, triggering late won 1.038x in the engine; this lets
    the other families be A/B'd the same way, one at a time. Read per launch. Raises KernelValueError for an unknown
    family in MODELD_PDL_LATE (or passed here)."""
    listed = {f.strip() for f in (os.environ.get(LATE_ENV) or "").split(",") if f.strip()}
    unknown = sorted((listed | {family}) - set(GEMV_FAMILIES))
    if unknown:
        raise KernelValueError(f"{LATE_ENV}: unknown GEMV famil{'y' if len(unknown) == 1 else 'ies'} "
                               f"{', '.join(unknown)} (expected some of {', '.join(GEMV_FAMILIES)})")
    mode = pdl_mode()
    return 2 if mode == 1 and family in listed else mode


def pdl_on() -> bool:
    """PDL is on (`pdl_mode` > 0): trigger-only kernels trigger first thing."""
    return pdl_mode() > 0


LIGHT_ENV = "MODELD_PDL_LIGHT"
# On by default since session 8: the same-process engine A/B (certs/engine-ab-pdl-light-qwen3_5-27b-h200.json)
# measured int4 / fp8 / bf16 decode +1.9 / +2.7 / +0.7 % (best p50 of two builds), logits bit-identical
# (KNOWLEDGE/optimizations/decode-pdl-light-kernels-wait-first.md).
LIGHT_DEFAULT = "1"
LIGHT_WAIT = 2  # the light kernels' PDL constexpr when they wait first (True / False otherwise: with those two
# values their SASS is byte-identical to session 7's)


def light_pdl() -> bool | int:
    """The PDL constexpr of a light (trigger) kernel: False (PDL off), True (MODELD_PDL_LIGHT=0: trigger first
    thing) or LIGHT_WAIT (MODELD_PDL_LIGHT=1, the default when unset or empty: wait first, then trigger; launch with
    `light_launch` / `light_kwargs`). Raises KernelValueError for a MODELD_PDL_LIGHT other than unset, empty, 0 or 1."""
    v = os.environ.get(LIGHT_ENV) or LIGHT_DEFAULT
    if v not in ("0", "1"):
        raise KernelValueError(f"{LIGHT_ENV}={v!r}: expected 0 or 1")
    if not pdl_on():
        return False
    return LIGHT_WAIT if v == "1" else True


def light_launch(pdl: bool | int) -> dict:
    """Launch kwargs of a light kernel compiled with PDL constexpr `pdl` (from `light_pdl`)."""
    return launch_options(pdl == LIGHT_WAIT)  # True == 1: never equal


def light_kwargs() -> dict:
    """Everything a light kernel's launch takes from the switches: its PDL constexpr and launch options."""
    pdl = light_pdl()
    return {"PDL": pdl, **light_launch(pdl)}


def launch_options(waits: bool) -> dict:
    """Extra launch kwargs of a kernel that waits (`pdl_wait`) when PDL is on: launch_pdl=True."""
    return {"launch_pdl": True} if waits else {}


@triton.jit
def pdl_trigger(PDL: tl.constexpr):
    """Let the next kernel (if launched with PDL) start its programs; a no-op unless PDL."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def light_prologue(PDL: tl.constexpr):
    """First thing in a light kernel: with PDL == LIGHT_WAIT wait for the predecessor, then (PDL on) trigger."""
    if PDL == 2:
        gdc_wait()
    if PDL:
        gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait until the previous kernel has completed and its writes are visible; a no-op unless PDL (the
    kernel must then have been launched with launch_pdl=True)."""
    if PDL:
        gdc_wait()
