"""bench/attention_prefill_sass.py: the loop finder that splits a SASS listing into per-iteration bodies."""

from __future__ import annotations

from bench.attention_prefill_sass import loops

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   ISETP.GE.AND P0, PT, R2, R3, PT ;
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0030*/                   FSEL R4, R4, -INF , P0 ;
        /*0040*/               @P0 BRA 0x20 ;
        /*0050*/                   FMUL R5, R5, R6 ;
        /*0060*/                   BRA 0x70 ;
        /*0070*/                   EXIT ;
"""


def test_loops_counts_the_body_of_each_backward_branch_only():
    (body,) = loops(SASS)  # the forward BRA 0x70 is not a loop
    assert (body["from"], body["to"], body["instructions"]) == ("0x20", "0x40", 3)
    assert body["ops"]["HGMMA"] == 1 and body["ops"]["FSEL"] == 1 and body["ops"]["FMUL"] == 0
    assert body["skippable"] == []


def test_loops_report_the_blocks_a_forward_branch_skips():
    sass = SASS.replace("/*0010*/                   ISETP.GE.AND P0, PT, R2, R3, PT ;",
                        "/*0010*/                   ISETP.GE.AND P0, PT, R2, R3, PT ;").replace(
        "/*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;",
        "/*0020*/               @P1 BRA 0x40 ;")
    (body,) = loops(sass)
    assert body["skippable"] == [1]  # the FSEL at 0x30
