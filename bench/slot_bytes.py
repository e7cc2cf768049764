"""Cost of parking a qwen3_5 slot as bytes (`SlotEngine.save_slot` / `load_slot`), the old way beside the new.

A session that is not resident is parked as bytes; a snapshot is the same bytes. For the 27B one slot holds
~0.2 GB of fixed state (GDN recurrent + conv, fp32 logits) plus its positions' KV. This bench allocates a real
state arena of the preset (`Qwen35StateSpec`, no weights), fills it with noise, and times per mode, best of --runs:

  save  old: per view `.to("cpu")`, `.numpy().tobytes()`, then `b"".join` (the code up to session 18)
        new: `views_to_bytes` (one buffer, each view copied once into its place)
  load  old: per view `bytearray(payload[a:b])` then `frombuffer(...).copy_` into the arena
        new: `bytes_into_views` (`bytes_view`: a tensor over the payload, no copy, then `.copy_`)

It also records the process's peak RSS growth during each mode (VmHWM, reset through /proc/self/clear_refs) and
checks that both modes produce identical bytes and load back identical state.

    PYTHONPATH=src:. python3 bench/slot_bytes.py --out $OUT/sb                    # H200 (cuda), ~20 s
    PYTHONPATH=src:. python3 bench/slot_bytes.py --out /tmp/sb --device cpu --config small --positions 64
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _hwm_mib() -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss_mib() -> float | None:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def old_save(head: bytes, views) -> bytes:
    parts = [head]
    for v in views:
        t = v.detach().contiguous().to("cpu")
        parts.append(t.view(__import__("torch").uint8).numpy().tobytes() if t.numel() else b"")
    return b"".join(parts)


def old_load(payload, off: int, views) -> None:
    import torch

    for v in views:
        nb = v.numel() * v.element_size()
        if nb:
            v.copy_(torch.frombuffer(bytearray(payload[off: off + nb]), dtype=torch.uint8).view(v.dtype).view(v.shape))
        off += nb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--config", default="27b", help="synth preset (default 27b)")
    ap.add_argument("--positions", type=int, default=4096, help="positions held by the slot (default 4096)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per mode, best reported (default 5)")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if a.positions < 1 or a.runs < 1:
        ap.error("--positions and --runs must be >= 1")
    import torch

    import _qwen_common as C
    from modeld.convert.qwen3_5_spec import hf_config, preset
    from modeld.execution.arena import Arena
    from modeld.execution.slot_engine import STATE_HEAD, bytes_into_views, views_to_bytes
    from modeld.models.qwen3_5.config import Qwen35Config
    from modeld.models.qwen3_5.state import Qwen35StateSpec

    os.makedirs(a.out, exist_ok=True)
    dev = torch.device(a.device)
    cfg = Qwen35Config.from_hf(hf_config(preset(a.config)))
    spec = Qwen35StateSpec(cfg, 1, a.positions)
    state = Arena.from_specs(spec.specs(), dev)
    logits = torch.randn(cfg.vocab, device=dev)
    views = [state[m][0, : a.positions] for m in spec.kv_names()] + [state[m][0] for m in spec.fixed_names()]
    views.append(logits)
    g = torch.Generator(device=dev).manual_seed(0)
    for v in views:
        if v.is_floating_point():
            v.copy_(torch.randn(v.shape, generator=g, device=dev).to(v.dtype))
    head = STATE_HEAD.pack(b"Q35STATE", 1, a.positions, bytes(32))
    total = STATE_HEAD.size + sum(v.numel() * v.element_size() for v in views)
    saved = [v.clone() for v in views]
    res = {"bench": "slot_bytes", "argv": sys.argv[1:] if argv is None else argv, "versions": C.versions(dev),
           "config": a.config, "positions": a.positions, "state_bytes": total, "modes": {}}

    def timed(fn):
        C.sync()
        t0 = time.perf_counter()
        out = fn()
        C.sync()
        return time.perf_counter() - t0, out

    payloads = {}
    for mode, save, load in (("old", old_save, lambda p: old_load(p, STATE_HEAD.size, views)),
                             ("new", views_to_bytes, lambda p: bytes_into_views(p, STATE_HEAD.size, views))):
        base = _rss_mib()
        hwm_ok = _reset_hwm()
        save_t, payload = [], None
        for _ in range(a.runs):
            payload = None  # one payload alive at a time
            t, payload = timed(lambda: save(head, views))
            save_t.append(t)
        peak_save = (_hwm_mib() - base) if hwm_ok else None
        hwm_ok = _reset_hwm()
        load_t = [timed(lambda: load(payload))[0] for _ in range(a.runs)]
        peak_load = (_hwm_mib() - base) if hwm_ok else None
        payloads[mode] = payload
        same = all(torch.equal(v, s) for v, s in zip(views, saved))
        res["modes"][mode] = {"save_best_s": min(save_t), "load_best_s": min(load_t), "save_gb_per_s":
                              total / min(save_t) / 1e9, "load_gb_per_s": total / min(load_t) / 1e9,
                              "peak_rss_growth_mib_save": peak_save, "peak_rss_growth_mib_load": peak_load,
                              "state_unchanged_after_load": same}
        del payload
        print(f"SUMMARY {mode}: {total / 2**20:.0f} MiB state: save {min(save_t) * 1e3:.1f} ms, load "
              f"{min(load_t) * 1e3:.1f} ms, peak RSS growth save {peak_save} / load {peak_load} MiB, "
              f"state unchanged: {same}", flush=True)
    res["bytes_identical"] = bytes(payloads["old"]) == bytes(payloads["new"])
    print(f"SUMMARY bytes identical: {res['bytes_identical']}")
    with open(os.path.join(a.out, "slot_bytes.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0 if res["bytes_identical"] and all(m["state_unchanged_after_load"] for m in res["modes"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
