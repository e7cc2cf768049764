"""One certification record per engine profile, from a bench/cert_qwen3_5_27b.py run document.

The record keeps the keys of the earlier engine records in certs/ (bench, date_utc, argv,
versions, load, fixture, parity_triton, decode, ttft, peak_gpu_mem) so old and new records read
alike, and adds what only a one-process certification has: the HF control measured in the same
run, teacher-forced parity against HF's logits at every position, rung 6 (quantized engine vs the
dequantized reference) with its gate, quality vs bf16, and the artifact identity (`weights_id`)
when the run computed it. Pure: reads the document, returns a dict (None when the profile's
engine stage did not run).
"""

from __future__ import annotations


def cert_record(doc: dict, profile: str, seed: int, convert: str | None = None) -> dict | None:
    """The record for `profile` from run document `doc` (see module doc). `convert`: the `modeld convert`
    flags of the artifact (default `--profile PROFILE`; e.g. `--profile fp8 --lm-head fp8` for "fp8+qhead")."""
    stages = doc.get("stages", {})
    eng = stages.get(f"engine_{profile}")
    if eng is None:
        return None
    hf = stages.get("hf_control", {})
    ident = stages.get("weights_id", {}).get("profiles", {}).get(profile) or {}
    r6 = stages.get(f"rung6_{profile}")
    config = doc.get("config")
    recipe = f"modeld synth --family qwen3_5 --config {config} --seed {seed}"
    if profile != "bf16":
        recipe += f", then modeld convert {convert or '--profile ' + profile}"
    ttft_hf = list(hf.get("ttft") or [])
    long_stage = stages.get("hf_ttft_long")
    if long_stage:
        ttft_hf.append({**long_stage["ttft"], "weights": long_stage.get("weights")})
    return {
        "bench": doc.get("bench"), "kind": "engine-certification", "date_utc": doc.get("date_utc"),
        "argv": doc.get("argv"), "env": doc.get("env", {}),
        "command": " ".join(f"{k}={v}" for k, v in sorted(doc.get("env", {}).items()))
                   + (" " if doc.get("env") else "")
                   + "PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/cert_qwen3_5_27b.py " + " ".join(doc.get("argv", [])),
        "model_id": doc.get("model_id"), "profile": profile, "versions": doc.get("versions"),
        "weights": {
            "recipe": recipe,
            "delivery": "synth values streamed once into HF on the device; engine built from HF's parameters"
                        + ("" if profile == "bf16" else f", quantized there with modeld.convert.quantize ({profile})"),
            "weight_fingerprint_sha256": stages.get("hf_load", {}).get("weight_fingerprint_sha256"),
            "weights_id": ident.get("weights_id"),
            "identity": ident or None,
        },
        "load": eng.get("load"), "fixture": doc.get("fixture"),
        "parity_triton": eng.get("vs_fixture"), "teacher_forced_vs_hf": eng.get("vs_hf"),
        "decode": eng.get("decode"), "ttft": eng.get("ttft"),
        "hf_control_same_run": {"decode": hf.get("decode"), "ttft": ttft_hf,
                                "greedy_vs_fixture": hf.get("greedy_vs_fixture")},
        "quality_vs_bf16": eng.get("quality_vs_bf16"),
        "rung6": None if r6 is None else {k: r6[k] for k in ("vs_dequantized_hf", "gate", "restore") if k in r6},
        "gate": eng.get("gate") if profile == "bf16" else (r6 or {}).get("gate"),
        "peak_gpu_mem": eng.get("peak_gpu_mem"),
        "run_errors": sorted(doc.get("errors", {})), "run_skipped": doc.get("skipped", {}),
    }
