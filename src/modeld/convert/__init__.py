"""Offline checkpoint work: synthetic checkpoints, HF/GGUF -> .mspec conversion (no heavy imports here)."""
