"""Qualification: the oracle-vs-HF parity harness, greedy golden fixtures, real-text quality, and
helpers that build the control's checkpoints (hf_synthetic, smollm2, synth_stream).

Import-light on purpose: every module imports torch/transformers only inside the functions that
need them (they are test-extra dependencies).
"""
