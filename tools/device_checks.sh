#!/usr/bin/env bash
# The H200 checks of the session's candidates against the defaults, one device call per step (each fits the tool's
# 600 s limit). Run from the repo root on the device machine, with .whl/ (tools/device_wheels.sh) and
# .scratch/COMMIT (`git rev-parse HEAD > .scratch/COMMIT` here) carried; results go under $OUT/<step>.
#
#   tools/device_checks.sh tests     # pytest -m gpu over tests/kernels, tests/engine, tests/llama, tests/cells (xdist)
#   tools/device_checks.sh tests-new # the last sessions' new / changed GPU tests (s33: the rounding probe with the
#                                    # decode-path launches, the stacked tile as the default; s32: every GDN GPU test
#                                    # with the correlated-keys tail; the fp16 prep's head-dim map; random shapes at
#                                    # 6 seeds)
#   tools/device_checks.sh attn-gluon  # the Gluon prefill attention: GPU test under a watchdog, kernel rows (~3 min;
#                                    # ROWS_ONLY=1: the rows alone);
#                                    # then TTFT_AB=MODELD_ATTN_PREFILL=gluon,MODELD_ATTN_PREFILL=gluon-pingpong ttft
#   tools/device_checks.sh rounding  # s29: round_to's GPU convert vs the bit trick ($MODELD_ROUND_BITS=1, one process
#                                    # per side): the bit-for-bit GPU test, then norm / conv / rope rows alternated
#   tools/device_checks.sh rounding-ttft  # then the cold 32k once per side, its logits compared bit for bit
#   tools/device_checks.sh kernels   # conv prefill tiles / split / rows kernel; norms (gated-norm tiles); GDN v2 rows
#                                    # (GDN_ROWS=product-bd: only the default and those rows)
#   tools/device_checks.sh gdn-snapshots  # s31: a layer-piece's checkpoints in the state pass vs in segments
#   tools/device_checks.sh attn      # prefill attention: tile sweep (T 8192 from 0 / 24576), key loops, tile GPU tests
#   tools/device_checks.sh gemm      # bf16 prefill GEMM tiles at M 8192 (incl. the persistent tiles) + GPU tests
#   tools/device_checks.sh gemm-variants  # tuned / persistent / ws / gluon-ws tiles, one child process per variant
#                                    # under a watchdog (session 24: the ws tile never finished on the H200); ~2-5 min
#   tools/device_checks.sh ttft      # 27B long-context TTFT (defaults), cold-prefill variants ($TTFT_AB) in one process
#   tools/device_checks.sh cert      # the 27B certification at the defaults (every gate; ≈ 6 min)
#   tools/device_checks.sh cert-at   # the same bench from $CERT_TREE (tools/tree_at.sh COMMIT: an older commit's code),
#                                    # $CERT_PROFILES (default bf16,fp8: ≈ 5 min), to bisect a moved gate
#   tools/device_checks.sh bisect    # bench/bisect_engine_logits.py over $BISECT_TREES ('TREE|VAR=VALUE+…' specs; trees by
#                                    # tools/tree_at.sh): the certification's fp8 cases' digests and rung-6 flips per tree
#   tools/device_checks.sh engine-trace  # bench/trace_engine_ops.py: every kernel call of a short prefill + decode per
#                                    # side ($TRACE_SIDES, default the trick vs the convert; $TRACE_PROFILES fp8,bf16):
#                                    # the first call that differs (s33: which kernel the convert changes)
#   tools/device_checks.sh qhead     # quantized lm_head: GPU tests, logits rows, fp8 / int4 decode with each head
#   tools/device_checks.sh cert-qhead  # the certification of the fp8+qhead / int4+qhead artifacts
#   tools/device_checks.sh w8a8      # the certification's long set (8 new prompts) with fp8+w8a8 beside fp8
#   tools/device_checks.sh llamacpp  # llama.cpp built with CUDA (tools/llama_cpp_sdist.sh), the 27B control (bf16)
#   tools/device_checks.sh llamacpp-q  # then (machine warm) llama.cpp's q8_0 / q4_k_m beside our fp8 / int4
#
# What each result decides (session 23 on): configs.PREFILL[256] -> a sweep tile that beats (128, 64, 8, 2) at both
# starts and in the cold 32k A/B (attention/triton.py PREFILL_TILE_ENV); linear/configs.py TUNED / the gemm default
# -> the warp-specialized / persistent tiles where they beat the TMA tiles in the sweep and their
# $MODELD_GEMM_VARIANT wins the A/B; V2_PASS_PRECISION -> "fp16" only after a
# certification with it alone passes every gate (`MODELD_GDN_PASS_PRECISION=fp16 tools/device_checks.sh cert`; the
# run's env is recorded; findings/gdn-fp16-passes-h200-s23.md); the llama.cpp ratios of
# findings/llama-cpp-control-qwen3_5-27b-h200.md; KNOWLEDGE/optimizations/fp8-w8a8-qgmma-prefill.md (w8a8).
set -uo pipefail
usage="tests|tests-new|rounding|rounding-ttft|attn-gluon|kernels|gdn-snapshots|attn|gemm|gemm-variants|ttft|cert|qhead"
usage+="|cert-at|cert-qhead|bisect|engine-trace"
usage+="|w8a8|llamacpp|llamacpp-q"
step=${1:?usage: tools/device_checks.sh $usage}
# Output goes through `grep --line-buffered`, never `| tail`: when the device tool's own limit kills a command, a
# tail still waiting for its end prints nothing (session 24 lost two calls' output that way; the tool keeps the
# last 12,000 characters anyway). Give each call a device limit ABOVE the step's inner timeout
# (KNOWLEDGE/pitfalls/device-call-limit-below-inner-timeout.md).
: "${OUT:?OUT must name the output folder (the device tool sets it)}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=src:.:/tmp/site PYTHONUNBUFFERED=1
MODELD_COMMIT=$(cat .scratch/COMMIT 2>/dev/null || echo unknown)
export MODELD_COMMIT
mkdir -p "$OUT/$step"
case "$step" in
  tests)
    xdist=()
    python3 -c "import xdist" 2>/dev/null && xdist=(-n 12)
    # 785 of 791 tests took 405 s on 12 workers in session 24: 540 s leaves room under the 600 s call limit; session 30
    # reached 902 of 906 in 540 s, so $TESTS_PATHS splits the suite over two calls when needed (e.g.
    # "tests/kernels/test_gdn*.py tests/kernels/test_attention*.py", then the rest by -k / paths)
    # shellcheck disable=SC2206  # split on spaces and expand the globs on purpose
    paths=(${TESTS_PATHS:-tests/kernels tests/engine tests/llama tests/cells})
    timeout -s INT -k 20 540 python3 -m pytest -m gpu -q -p no:cacheprovider "${xdist[@]}" "${paths[@]}" \
      --junitxml="$OUT/$step/pytest.xml" 2>&1 | grep --line-buffered -v -i warning
    ;;
  tests-new)
    # the new / changed GPU tests of the last sessions (s33: test_rounding's probe with the decode-path launches; the
    # stacked SwiGLU tile against the TMA tile it replaced; s32: every GDN GPU test, check_correlated's counted tail; the
    # engine's GDN candidates; the stacked SwiGLU tile and the GEMM variants) over xdist workers; then the fp16 prep's
    # head-dim map, one process per id (s30: an illegal memory
    # access at the tiny preset's Dk = Dv = 32 poisons the CUDA context of its process), and
    # test_gpu_random_shapes at 6 fresh seeds at once (one process each)
    xdist=()
    python3 -c "import xdist" 2>/dev/null && xdist=(-n 12)
    timeout -s INT -k 20 300 python3 -m pytest -m gpu -q -p no:cacheprovider "${xdist[@]}" \
      tests/kernels/test_gdn*.py tests/kernels/test_rounding.py tests/engine/test_engine_triton_binding.py \
      tests/kernels/test_linear.py::test_gpu_persistent_swiglu_stacked \
      tests/kernels/test_linear.py::test_gpu_persistent_tma_gemm \
      -k "not head_dims and not random_shapes" \
      --junitxml="$OUT/$step/pytest-new.xml" 2>&1 | grep --line-buffered -v -i warning
    for dims in Dk32-Dv32 Dk32-Dv64 Dk64-Dv32 Dk64-Dv64 Dk32-Dv128 Dk128-Dv32 Dk16-Dv16 Dk128-Dv64; do
      timeout -s INT -k 20 200 python3 -m pytest -m gpu -q -p no:cacheprovider \
        "tests/kernels/test_gdn_prep_precision.py::test_gpu_fp16_prep_head_dims[$dims]" > "$OUT/$step/dims-$dims.log" \
        2>&1 &
    done
    wait
    for f in "$OUT/$step"/dims-*.log; do
      echo "$(basename "$f" .log): $(grep -h -o -E "[0-9]+ (passed|failed)|illegal memory access" "$f" | tr '\n' ' ')"
    done
    for i in 1 2 3 4 5 6; do
      MODELD_GDN_PREP_PRECISION=${RANDOM_PREP_PRECISION:-tf32} timeout -s INT -k 20 200 python3 -m pytest -m gpu -q \
        -p no:cacheprovider tests/kernels/test_gdn.py -k "random_shapes" \
        --junitxml="$OUT/$step/pytest-random-$i.xml" > "$OUT/$step/random-$i.log" 2>&1 &
    done
    wait
    grep -h -E " passed| failed|AssertionError: gdn|MODELD_TEST_SEED" "$OUT/$step"/random-*.log
    ;;
  rounding)
    # KNOWLEDGE/optimizations/round-to-native-convert-on-gpu.md: the same bits from every kernel family either way,
    # then each side's rows twice, alternated (ratios within one call; the side is fixed per process at import)
    timeout 180 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_rounding.py 2>&1 \
      | grep --line-buffered -E " passed| failed|Error|assert"
    for r in 1 2; do
      for bits in 1 0; do
        # the default conv rows only (--conv-rows none): 4 processes x ~1 min fit the call beside the test
        MODELD_ROUND_BITS=$bits timeout 90 python3 bench/kernels_recurrent.py --out "$OUT/$step/rows-b$bits-r$r" \
          --only norms --only conv --only rope --conv-rows none --reps 20 2>&1 \
          | grep --line-buffered -E "rms_norm|conv1d_prefill\(strided\)|rope" | sed -u "s/^/bits=$bits r$r /"
      done
    done
    ;;
  rounding-ttft)
    # the cold 32k (bf16) per side in its own process; logits saved and compared (expected: bit for bit); each side
    # also A/Bs its $TTFT_AB_B1 / $TTFT_AB_B0 variants (--cold-ab) in the same process
    for bits in 1 0; do
      ab_var=TTFT_AB_B$bits
      MODELD_ROUND_BITS=$bits timeout 270 python3 bench/ttft_long.py --out "$OUT/$step/tl-b$bits" --no-hf \
        --runs "${TTFT_RUNS:-2}" --profiles bf16 --cold-ab "${!ab_var:-}" \
        --save-cold-logits "$OUT/$step/cold-b$bits" 2>&1 | grep --line-buffered -E "SUMMARY|Error|cold-ab round"
    done
    python3 -c "import torch; a, b = (torch.load('$OUT/$step/cold-b%s.bf16.pt' % s) for s in '01'); \
print('cold 32k logits, convert vs trick: max|d|', float((a - b).abs().max()), 'bit for bit', torch.equal(a, b))"
    ;;
  attn-gluon)
    # the Gluon warp-specialized prefill attention (never run on a GPU before session 26): its GPU test (a child under
    # a 300 s watchdog), kernel rows beside the Triton kernel, then the cold 32k with it
    # (ROWS_ONLY=1: the rows alone, after tests-new ran the tests in the same call)
    [ "${ROWS_ONLY:-0}" = 1 ] || timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/kernels/test_attention_gluon.py 2>&1 | grep --line-buffered -E " passed| failed|error|Error"
    timeout 150 python3 bench/kernels.py --out "$OUT/$step/k" --sections prefill-gluon --no-recurrent 2>&1 \
      | grep --line-buffered -E "attention prefill"
    ;;
  kernels)
    # the conv prefill's tiles / first-block split (s26 candidates, conv1d/triton.py) and the s29 rows kernel
    # (conv1d_prefill(strided,rows...)), then the GDN v2 rows (incl. the s26 product-bd prep at every length)
    timeout 120 python3 bench/kernels_recurrent.py --out "$OUT/$step/conv" --only conv --reps 20 2>&1 \
      | grep --line-buffered -E "conv1d_prefill\(strided"
    # the norms, incl. the gated norm as the model calls it with the $MODELD_GATED_NORM_TILE tiles (s28)
    timeout 120 python3 bench/kernels_recurrent.py --out "$OUT/$step/norms" --only norms --reps 20 2>&1 \
      | grep --line-buffered -E "^  .*(rms_norm)"
    # GDN_ROWS (e.g. product-bd, which also matches s27's product-bd-split rows): only the default v2 row and those
    # variants (bench --gdn-rows), for a short call
    timeout 420 python3 bench/kernels_recurrent.py --out "$OUT/$step/kr" --only gdn --reps 10 \
      --gdn-rows "${GDN_ROWS:-}" 2>&1 | grep --line-buffered -E "gdn_prefill\(chunked,v2"
    ;;
  gdn-snapshots)
    # s31: one 27B layer-piece (8192 tokens, checkpoints every 2048) with its snapshots in the state pass vs in
    # segments vs none (bench/gdn_snapshots.py), at the defaults and with the fp16 prep
    for env in "" "MODELD_GDN_PREP_PRECISION=fp16"; do
      tag=$(echo "${env:-default}" | tr ' =' '_-')
      env $env timeout 150 python3 bench/gdn_snapshots.py --out "$OUT/$step/$tag" --reps 20 2>&1 \
        | grep --line-buffered -E "gdn_snapshots|Error" | sed -u "s/^/[$tag] /"
    done
    ;;
  attn)
    # the one-pass prefill attention's tiles at T 8192 from 0 and from 24576 (bench/kernels_sweeps.sweep_attention)
    # and the key loops; then the GPU tests of the tile candidates
    timeout 420 python3 bench/kernels.py --out "$OUT/$step/k" --sections prefill-loops,sweep-attention \
      --no-recurrent 2>&1 | grep --line-buffered -E "attention prefill"
    timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_attention.py -k tile_candidates \
      2>&1 | grep --line-buffered -E " passed| failed|error"
    ;;
  gemm)
    # the bf16 prefill GEMM tiles at M 8192 beside cuBLAS, incl. the warp-specialized and persistent TMA tiles; their
    # GPU tests
    timeout 420 python3 bench/kernels.py --out "$OUT/$step/k" --sections sweep-gemm --no-recurrent 2>&1 \
      | grep --line-buffered -E "^linear"
    timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_linear.py -k warp_specialized \
      2>&1 | grep --line-buffered -E " passed| failed|error"
    ;;
  gemm-variants)
    # the Gluon tiles first, Triton's warp-specialized tile (never finished in session 24) last
    gv=${GV_VARIANTS:-tuned,tma-plain,persistent,gluon-ws,gluon-pingpong,ws}
    timeout 500 python3 bench/gemm_variants.py --out "$OUT/$step/gv" --child-timeout 120 --variants "$gv" 2>&1 \
      | grep --line-buffered -E "^(gemm_variants|SUMMARY)|Error|Traceback"
    ;;
  ttft)
    # cold 32k A/B in one process ($TTFT_AB: --cold-ab's list, variants split on ',', '+' joins switches, ':' inside a
    # value; a GEMM variant only after `gemm-variants` shows it finishing: Triton's ws tile hangs). Session 25 (one
    # profile, 3 variants: 126 s) A/B'd the persistent plain GEMM tile, + the GDN fp16 passes, attention 64:64:4:1
    # (1.058x slower: dead end). Session 25 made the persistent plain GEMM tile and the GDN fp16 passes the
    # defaults (cold 32k 0.918x, every certification gate PASS; findings/qwen3_5-27b-recertification-s25-h200.md).
    # Session 32 made the in-pass snapshots (0.998x) and one 32k piece (16k 0.989x against 8k, 32k 0.993x against
    # 16k; same bits) the defaults: cold 32k 2.996 / 3.004 s. Default candidates: the pieces around it (the ≤ 3 s
    # target sits in the noise), as a control; session 33 made the stacked SwiGLU tile the gate + up default (cold 32k
    # 0.983x, same bits): the TMA tile it replaced ($MODELD_GEMM_VARIANT=tma-swiglu) as the control
    cands="MODELD_GEMM_VARIANT=tma-swiglu,chunk=16384"
    ab=${TTFT_AB:-$cands}
    timeout 570 python3 bench/ttft_long.py --out "$OUT/$step/tl" --no-hf --runs 2 \
      --profiles "${TTFT_PROFILES:-bf16}" \
      --kernel-table "${TTFT_TABLE:-0}" --cold-ab "$ab" 2>&1 \
      | grep --line-buffered -E "SUMMARY|FAILED|SKIP|Error|cold-ab"
    ;;
  cert-at)
    tree=${CERT_TREE:?CERT_TREE must name a tree made by tools/tree_at.sh (carried under .scratch)}
    (cd "$tree" && MODELD_COMMIT=$(cat COMMIT) timeout 570 python3 bench/cert_qwen3_5_27b.py --out "$OUT/$step" \
      --no-profiler --budget-s 450 --profiles "${CERT_PROFILES:-bf16,fp8}" 2>&1 \
      | grep --line-buffered -E "SUMMARY|FAILED|SKIP|Error|GATES")
    ;;
  bisect)
    timeout 570 python3 bench/bisect_engine_logits.py --out "$OUT/$step" --profile "${BISECT_PROFILE:-fp8}" \
      --trees "${BISECT_TREES:?BISECT_TREES: comma-separated TREE|VAR=VALUE specs}" --budget-s 480 2>&1 \
      | grep --line-buffered -E "SUMMARY|TREE|Error|Traceback"
    ;;
  engine-trace)
    for p in $(echo "${TRACE_PROFILES:-fp8,bf16}" | tr ',' ' '); do
      timeout 270 python3 bench/trace_engine_ops.py --out "$OUT/$step/$p" --profile "$p" \
        --sides "${TRACE_SIDES:-.|MODELD_ROUND_BITS=1,.|MODELD_ROUND_BITS=0}" 2>&1 \
        | grep --line-buffered -E "SIDE|Error|Traceback" | sed -u "s/^/[$p] /"
    done
    ;;
  qhead)
    # the quantized lm_head (converter --lm-head; findings/quantized-lm-head-recipe-option.md): its GPU tests, the
    # logits rows (bf16 / fp8 / int4 heads in one run), then our fp8 / int4 engines' decode with each head
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_logits.py \
      tests/engine/test_engine_quantized.py 2>&1 | grep --line-buffered -E " passed| failed|error"
    timeout 120 python3 bench/kernels.py --out "$OUT/$step/k" --sections logits --no-recurrent 2>&1 \
      | grep --line-buffered -E "^logits"
    for p in fp8 int4; do
      for head in bf16 $p; do
        timeout 150 python3 bench/engine_qwen3_5.py --out "$OUT/$step/engine-$p-head-$head" --profile $p \
          --lm-head $head --ttft 128 2>&1 | grep --line-buffered -E "^(decode|load) |Error|Traceback"
      done
    done
    ;;
  cert-qhead)
    # the certification of the quantized-head artifacts (bf16 first: the rung-6 noise reference). Session 26:
    # fp8+qhead PASS (served), int4+qhead FAIL by one flip; next: int4 with an fp8 head
    timeout 570 python3 bench/cert_qwen3_5_27b.py --out "$OUT/$step" --no-profiler --budget-s 500 \
      --profiles "${QHEAD_PROFILES:-bf16,int4+fp8head}" 2>&1 | grep --line-buffered -E "SUMMARY|FAILED|SKIP|Error|GATES"
    ;;
  cert)
    # $CERT_PROFILES: e.g. bf16,fp8 (~5 min) to bisect the fp8 rung-6 count
    # (KNOWLEDGE/findings/fp8-rung6-flips-rose-between-s28-and-s31.md)
    timeout 570 python3 bench/cert_qwen3_5_27b.py --out "$OUT/$step" --no-profiler --budget-s 450 \
      --profiles "${CERT_PROFILES:-bf16,fp8,int4}" 2>&1 \
      | grep --line-buffered -E "SUMMARY|FAILED|SKIP|Error|GATES"
    ;;
  w8a8)
    timeout 520 python3 bench/cert_qwen3_5_27b.py --out "$OUT/$step" --no-profiler --budget-s 400 \
      --profiles bf16,fp8,fp8+w8a8 --batch-slots 0 --ttft-chunks '' --long-cases 8 --long-seed 20261202 2>&1 \
      | grep --line-buffered -E "SUMMARY|FAILED|SKIP|Error|GATES"
    ;;
  llamacpp|llamacpp-q)
    # TARGETS.md's second control: llama.cpp built here with CUDA (sm_90) from tools/llama_cpp_sdist.sh's source
    # (carry .whl-src too), in the background under setsid so a build longer than one call goes on while the
    # machine is held (call this step again within the idle release); then the 27B GGUF exported to /dev/shm
    # (--synth: no checkpoint on disk) and bench/llama_cpp_control.py, the same prompts as our engine's benches
    site=/tmp/llamacuda log=/tmp/llamacuda.log
    if ! PYTHONPATH=$site python3 -c "import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_gpu_offload())" \
        2>/dev/null; then
      if ! pgrep -f "pip install.*llama_cpp_python" >/dev/null; then
        setsid bash -c "CMAKE_ARGS='-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=off -DLLAVA_BUILD=off' \
          CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps --no-cache-dir \
          --target $site .whl-src/llama_cpp_python-*-trimmed.tar.gz > $log 2>&1; echo rc=\$? >> $log" &
      fi
      for _ in $(seq 1 50); do   # up to ~8 min in this call
        grep -q '^rc=' $log 2>/dev/null && break
        sleep 10
      done
      tail -5 $log
      grep -q '^rc=0' $log || { echo "llama.cpp CUDA build not finished (or failed): call this step again"; exit 3; }
    fi
    # the export (torch, numpy) in its own process: a CUDA llama.cpp segfaults loading a model in a process that
    # imported numpy first (KNOWLEDGE/pitfalls/llama-cpp-cuda-segfaults-after-numpy-import.md; the bench imports
    # llama_cpp first). Session 23: the build took 213 s, the 27B bf16 export ~60 s, each control run < 40 s.
    # `llamacpp`: the bf16 GGUF and our bf16 engine; `llamacpp-q` (the next call, machine still warm): llama.cpp's
    # own q8_0 / q4_k_m of it (lm_head and embeddings kept bf16, like our recipes) beside our fp8 / int4 engines.
    gguf=/dev/shm/synth-27b-seed0-bf16.gguf
    [ -f $gguf ] || timeout 300 python3 -m modeld export-gguf --synth 27b --seed 0 -o $gguf 2>&1 | tail -2
    control() {   # control OUTDIR ARGS...: llama_cpp_control.py with the CUDA build on the path
      local out=$1; shift
      PYTHONPATH=src:.:/tmp/site:$site timeout 300 python3 bench/llama_cpp_control.py --out "$out" --gguf $gguf "$@" \
        2>&1 | grep --line-buffered -E "SUMMARY|Error|Traceback"
    }
    engine() {    # engine PROFILE: our engine's decode / TTFT rows in the same call
      timeout 200 python3 bench/engine_qwen3_5.py --out "$OUT/$step/engine-$1" --profile "$1" --ttft 128,8192 2>&1 \
        | grep --line-buffered -E "^(decode|ttft|load) |Error|Traceback"
    }
    if [ "$step" = llamacpp ]; then
      control "$OUT/$step/bf16"
      control "$OUT/$step/bf16-long" --context 8192 --ttft 128,32768 --ctx 33000 --steps 48
      engine bf16
    else
      for q in q8_0 q4_k_m; do control "$OUT/$step/$q" --quantize $q --threads 16; done
      engine fp8
      engine int4
    fi
    ;;
  *)
    echo "unknown step $step: expected one of $usage" >&2
    exit 2
    ;;
esac
