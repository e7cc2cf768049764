"""Kernel tests: run Triton kernels in the CPU interpreter when no CUDA device exists.

TRITON_INTERPRET must be set before `triton` is first imported, so this runs at conftest import
(pytest imports conftest before the test modules of this folder).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from modeld.kernels import _testing  # noqa: E402


@pytest.fixture
def device() -> torch.device:
    """CUDA when present, else CPU under the Triton interpreter."""
    return _testing.test_device()


@pytest.fixture
def gen(request, device) -> torch.Generator:
    """A CPU generator with a fresh seed per test (MODELD_TEST_SEED reproduces a run)."""
    return _testing.seeded_generator(request.node.nodeid)


@pytest.fixture
def simulated_streams(monkeypatch) -> dict:
    """Empty arrival-counter tables and a fake stream / capture state ({"now": stream id, "capturing": bool},
    mutable by the test) in place of torch's, so the capture logic of kernels/_arrival.py runs on CPU."""
    from modeld.kernels import _arrival as ar

    monkeypatch.setattr(ar, "_COUNTERS", {})
    monkeypatch.setattr(ar, "_SPARES", {})
    stream = {"now": 1, "capturing": False}
    monkeypatch.setattr(ar, "_stream_key", lambda device, s=None: (str(device), stream["now"]))
    monkeypatch.setattr(ar, "_capturing", lambda device: stream["capturing"])
    return stream


def pytest_report_header(config):
    interp = _testing.interpreting()
    return (
        f"modeld kernels: cuda={torch.cuda.is_available()} TRITON_INTERPRET={int(interp)} "
        f"seed MODELD_TEST_SEED={os.environ.get('MODELD_TEST_SEED', _testing._PROCESS_SEED)}"
    )


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every torch.empty during the test returns poison (NaN / int min), so an element a kernel fails
    to write fails the comparison."""
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: _testing.poison(real_empty(*a, **k)))


@pytest.fixture(autouse=True)
def _skip_gpu_without_cuda(request):
    if request.node.get_closest_marker("gpu") and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.fixture(autouse=True)
def _poison_cuda_allocator():
    """On CUDA, hand the caching allocator NaN-filled blocks before each test, so a kernel output
    (`torch.empty`) that the kernel fails to write reads back as NaN instead of stale valid data."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        for size in (1 << 30, 1 << 24, 1 << 20):
            torch.full((size // 4,), float("nan"), device="cuda")  # freed at once, cached NaN-filled
    yield
