"""T1 execution, reusable by every model package: arena, state specs, kernel binding sets,
CUDA-graph capture, sampler glue, tokenizer wrapper.

Importing this package is light (no torch import here); import the submodule you need.
"""
