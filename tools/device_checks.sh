#!/usr/bin/env bash
# The H200 checks of the kernel and engine candidates against the defaults (session 21 flipped the winners), one device call per step
# (each fits the tool's 600 s limit). Run from the repo root on the device machine, with .whl/ (tools/device_wheels.sh)
# and .scratch/COMMIT (`git rev-parse HEAD > .scratch/COMMIT` here) carried; results go under $OUT/<step>.
#
#   tools/device_checks.sh tests     # pytest -m gpu: the new key loops, GDN preps, swapped GEMMs, suffix-bucket graph
#   tools/device_checks.sh kernels   # kernel sweeps: key loops, TMA SwiGLU, swapped tiles (M 100 / 32 / 64 / 2048), GDN preps
#   tools/device_checks.sh ttft      # 27B long-context TTFT with the suffix bucket, cold-prefill variants A/B'd in one process
#
# What each result decides: KNOWLEDGE/findings/attention-prefill-unmasked-key-loop-sass.md,
# KNOWLEDGE/ah-ha/gdn-chunk-inverse-as-tile-products-needs-tf32x3.md,
# KNOWLEDGE/findings/fp8-weight-tile-round-trips-shared-memory.md, KNOWLEDGE/optimizations/prefill-gemm-tma-descriptors.md
# and the suffix bucket (KNOWLEDGE/ah-ha/padded-rows-are-no-ops-for-a-gated-delta-net.md).
set -uo pipefail
step=${1:?usage: tools/device_checks.sh tests|kernels|ttft}
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
      tests/kernels/test_attention.py tests/kernels/test_gdn.py tests/engine/test_engine_triton_binding.py \
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
    timeout 570 python3 bench/ttft_long.py --out "$OUT/$step/tl" --no-hf --runs 2 --profiles bf16,int4 \
      --suffix-bucket 128 --kernel-table 12 \
      --cold-ab MODELD_GDN_PREP=blocked,MODELD_ATTN_CAUSAL_LOOP=masked,MODELD_ATTN_CAUSAL_LOOP=split-lazy,chunk=8192 \
      2>&1 | grep -E "SUMMARY|FAILED|SKIP|Error" | tail -20
    ;;
  *)
    echo "unknown step $step: expected tests, kernels or ttft" >&2
    exit 2
    ;;
esac
