"""bench/prefill_launches.py on CPU: it counts the Triton launches and ATen glue of one prefill, and those counts
depend on the schedule, not on the prompt length within one M bucket of the linears (the docstring's claim, which
lets tiny stand for the 27B; a bucket can pick other kernels: 17..64 rows take the swapped tile for bf16)."""

from __future__ import annotations

import json

from test_cert_dryrun import BENCH, _run


def test_prefill_launch_counts_do_not_depend_on_prompt_length(tmp_path):
    docs = []
    # 40 and 60: on one side of every conv T-block size the split could cut at (SPLIT_FIRST_BLOCK launches T-blocks
    # 1.. separately, so 20 vs 40 tokens at BLOCK_T 32 counted 1 vs 2 conv launches; session 27)
    for tokens in (40, 60):
        out = tmp_path / str(tokens)
        r = _run([str(BENCH / "prefill_launches.py"), "--out", str(out), "--tokens", str(tokens)], 300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        docs.append(json.loads((out / "prefill_launches.json").read_text()))
    a, b = docs
    assert a["triton_by_kernel"] == b["triton_by_kernel"] and a["aten_glue_ops"] == b["aten_glue_ops"]
    gdn = a["layer_types"].count("linear_attention")
    # every GDN layer runs its chunked prep / state / output kernels once; the embedding gather once per prefill
    for kernel in ("_chunk_prep_product_kernel", "_chunk_state_kernel", "_chunk_output_kernel"):
        assert a["triton_by_kernel"][kernel] == gdn
    assert a["triton_by_kernel"]["_embedding_kernel"] == 1
    assert a["triton_launches"] == sum(a["triton_by_kernel"].values()) > 4 * a["layers"]


def test_prefill_launches_refuses_a_bad_length(tmp_path):
    r = _run([str(BENCH / "prefill_launches.py"), "--out", str(tmp_path), "--tokens", "0"], 60)
    assert r.returncode != 0 and "--tokens" in r.stderr
