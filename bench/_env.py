"""Per-call switches set for a block of bench code: the engine's kernels read $MODELD_* on every call, so one process
can time both sides of a switch."""

from __future__ import annotations

import os
from contextlib import contextmanager


@contextmanager
def env_set(name: str, value: str | None):
    """$name = value inside the block (None: leave it as it is); the old value, or its absence, put back after."""
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def with_env(name: str, value: str | None, thunk):
    """thunk() under `env_set(name, value)` (for lambdas, which cannot hold a `with`)."""
    with env_set(name, value):
        return thunk()
