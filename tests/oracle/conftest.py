"""The oracle tests use the session checkpoints of tests/conftest.py (hf_qwen_ckpt, synth_ckpt)."""
