"""Token sampling on the device: greedy, temperature, top-k, top-p, seeded Gumbel-max.

`reference` is the spec (PyTorch); `triton` has the identical function. Both draw the same
counter-based noise, so for the same (seed, step) they pick the same token up to float ties.
"""
