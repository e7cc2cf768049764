"""Token embedding: gather rows of the [V, D] table. `reference` is the spec; `triton` the same API."""
