#!/usr/bin/env bash
# The H200 checks of the kernel and engine candidates against the defaults (session 21 flipped the winners), one
# device call per step
# (each fits the tool's 600 s limit). Run from the repo root on the device machine, with .whl/ (tools/device_wheels.sh)
# and .scratch/COMMIT (`git rev-parse HEAD > .scratch/COMMIT` here) carried; results go under $OUT/<step>.
#
#   tools/device_checks.sh tests     # pytest -m gpu: key loops, GDN preps, swapped GEMMs, suffix-bucket graph, pieces
#   tools/device_checks.sh kernels   # kernel sweeps: key loops, TMA SwiGLU, swapped tiles (M 100 / 32 / 64 / 2048), GDN preps
#   tools/device_checks.sh ttft      # 27B long-context TTFT (defaults), cold-prefill variants A/B'd in one process
#   tools/device_checks.sh cert      # the 27B certification at the defaults (every gate; ≈ 6 min)
#   tools/device_checks.sh w8a8      # the certification of bf16 + fp8 with MODELD_FP8_PREFILL=w8a8 (its gates decide)
#
# What each result decides: KNOWLEDGE/findings/attention-prefill-unmasked-key-loop-sass.md,
# KNOWLEDGE/ah-ha/gdn-chunk-inverse-as-tile-products-needs-tf32x3.md,
# KNOWLEDGE/findings/fp8-weight-tile-round-trips-shared-memory.md, KNOWLEDGE/optimizations/prefill-gemm-tma-descriptors.md
# and the suffix bucket (KNOWLEDGE/ah-ha/padded-rows-are-no-ops-for-a-gated-delta-net.md).
set -uo pipefail
step=${1:?usage: tools/device_checks.sh tests|kernels|ttft|cert|w8a8}
: "${OUT:?OUT must name the output folder (the device tool sets it)}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=src:.:/tmp/site PYTHONUNBUFFERED=1
MODELD_COMMIT=$(cat .scratch/COMMIT 2>/dev/null || echo unknown)
export MODELD_COMMIT
mkdir -p "$OUT/$step"
case "$step" in
  tests)
    # with pytest-xdist the whole linear file fits the call; without it, the tiled paths this work touched
    xdist=() linear=(-k "swap or tma or suffix or gemm")
    python3 -c "import xdist" 2>/dev/null && xdist=(-n 6) linear=()
    timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider "${xdist[@]}" \
      tests/kernels/test_attention.py tests/kernels/test_gdn.py tests/kernels/test_gated_rmsnorm.py \
      tests/engine/test_engine_triton_binding.py \
      --junitxml="$OUT/$step/pytest.xml" 2>&1 | tail -15
    timeout 230 python3 -m pytest -m gpu -q -p no:cacheprovider "${xdist[@]}" tests/kernels/test_linear.py \
      "${linear[@]}" --junitxml="$OUT/$step/pytest-linear.xml" 2>&1 | tail -15
    ;;
  kernels)
    timeout 380 python3 bench/kernels.py --out "$OUT/$step/k" --no-recurrent --reps 10 \
      --sections prefill-loops,sweep-gemm,sweep-suffix-gemm,sweep-mid-swap 2>&1 | grep -v "^\s*$" | tail -60
    timeout 180 python3 bench/kernels_recurrent.py --out "$OUT/$step/kr" --only gdn --reps 10 2>&1 | grep -i prefill
    ;;
  ttft)
    # chunk=2048: the session-20 schedule, now with checkpoints inside 8192-token pieces as the default;
    # chunk=256: what served sessions ran before session 21 (pitfalls/serving-sessions-prefilled-in-256-token-calls.md)
    timeout 570 python3 bench/ttft_long.py --out "$OUT/$step/tl" --no-hf --runs 2 --profiles bf16,fp8,int4 \
      --kernel-table 12 --cold-ab chunk=2048,chunk=256,MODELD_ATTN_CAUSAL_LOOP=split-lazy \
      2>&1 | grep -E "SUMMARY|FAILED|SKIP|Error" | tail -20
    ;;
  cert)
    timeout 570 python3 bench/cert_qwen3_5_27b.py --out "$OUT/$step" --no-profiler --budget-s 450 2>&1 \
      | grep -E "SUMMARY|FAILED|SKIP|Error|GATES" | tail -20
    ;;
  w8a8)
    MODELD_FP8_PREFILL=w8a8 timeout 570 python3 bench/cert_qwen3_5_27b.py --out "$OUT/$step" --no-profiler \
      --profiles bf16,fp8 --budget-s 450 2>&1 | grep -E "SUMMARY|FAILED|SKIP|Error|GATES" | tail -20
    ;;
  *)
    echo "unknown step $step: expected tests, kernels, ttft, cert or w8a8" >&2
    exit 2
    ;;
esac
