"""T0 kernels: one folder per op with `reference.py` (PyTorch, the spec) and `triton.py`.

Importing this package is light: it imports neither Triton nor any op. Callers import the
implementation they bind explicitly, e.g. `from modeld.kernels.rmsnorm import triton as rmsnorm_tt`.
Errors live in `modeld.kernels.errors`; the shape-letter table is in README.md beside this file.
"""

OPS = ("rmsnorm", "gated_rmsnorm", "rope", "conv1d", "gdn", "embedding", "sampling", "linear", "attention", "logits")
