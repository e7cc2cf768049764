"""Host probe: works with no GPU (this machine), reads NVML correctly when it is there (a fake
pynvml module simulating an H200 box), tolerates every NVML/torch failure."""

from __future__ import annotations

import sys
import types

import pytest

from modeld.host import HostFacts, probe_host
from modeld.host.gpu_sources import probe_nvml


def test_probe_without_gpu_sources_is_valid_and_fast() -> None:
    facts = probe_host(sources=())
    assert facts.cpu_cores >= 1 and facts.ram_total_bytes > 0
    assert facts.gpus == () and facts.interconnect == "none" and facts.sources == ("proc",)
    assert HostFacts.from_json(facts.to_json()) == facts


def test_probe_on_this_machine_tolerates_missing_gpu() -> None:
    facts = probe_host()  # both sources; on a GPU-less CI machine NVML fails and is noted
    assert HostFacts.from_json(facts.to_json()) == facts
    if not facts.gpus:
        assert facts.driver_version is None and facts.notes  # says why there is no GPU


def test_unknown_probe_source_is_refused() -> None:
    with pytest.raises(ValueError, match="cuda"):
        probe_host(sources=("cuda",))


# --------------------------------------------------------------------------- fake NVML


class _NVMLError(Exception):
    pass


def fake_pynvml(*, gpus: int = 2, nvlink: bool = True, init_error: bool = False,
                broken_gpu: int | None = None) -> types.ModuleType:
    """A stand-in for pynvml with the calls probe_nvml makes, describing H200s."""
    nv = types.ModuleType("pynvml")
    nv.NVML_NVLINK_MAX_LINKS = 18
    nv.calls = []

    def init():
        nv.calls.append("init")
        if init_error:
            raise _NVMLError("NVML Shared Library Not Found")

    def handle(index):
        if index == broken_gpu:
            raise _NVMLError("GPU is lost")
        return index

    def link_state(h, link):
        if not nvlink:
            raise _NVMLError("Not Supported")
        return 1

    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: nv.calls.append("shutdown")
    nv.nvmlSystemGetDriverVersion = lambda: b"560.35.03"  # older pynvml returns bytes
    nv.nvmlSystemGetCudaDriverVersion = lambda: 12060
    nv.nvmlDeviceGetCount = lambda: gpus
    nv.nvmlDeviceGetHandleByIndex = handle
    nv.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    nv.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=150_754_820_096, free=150_000_000_000 - h, used=0)
    nv.nvmlDeviceGetNvLinkState = link_state
    return nv


@pytest.mark.parametrize("kwargs, interconnect, count", [
    (dict(gpus=1), "none", 1),
    (dict(gpus=2), "nvlink", 2),
    (dict(gpus=8, nvlink=False), "pcie", 8),
    (dict(gpus=2, broken_gpu=1), "none", 1),
], ids=["one-h200", "two-h200-nvlink", "eight-pcie", "one-gpu-lost"])
def test_nvml_host(monkeypatch: pytest.MonkeyPatch, kwargs: dict, interconnect: str,
                   count: int) -> None:
    nv = fake_pynvml(**kwargs)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    facts = probe_host(sources=("nvml",))
    assert facts.gpu_count == count and facts.interconnect == interconnect
    gpu = facts.gpus[0]
    assert (gpu.name, gpu.arch, gpu.total_memory_bytes) == ("NVIDIA H200", "sm_90", 150_754_820_096)
    assert gpu.free_memory_bytes == 150_000_000_000
    assert facts.driver_version == "560.35.03" and facts.cuda_driver_version == "12.6"
    assert facts.sources == ("proc", "nvml")
    assert nv.calls == ["init", "shutdown"]
    assert HostFacts.from_json(facts.to_json()) == facts


def test_nvml_init_failure_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=True))
    report = probe_nvml()
    assert not report.answered and report.gpus == []
    assert "NVML Shared Library Not Found" in report.notes[0]


def test_missing_pynvml_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    facts = probe_host(sources=("nvml",))
    assert facts.gpus == () and any("pynvml not importable" in n for n in facts.notes)


def test_torch_fills_the_runtime_version(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch = types.ModuleType("torch")
    fake_torch.version = types.SimpleNamespace(cuda="12.8")
    fake_torch.cuda = types.SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus=1))
    facts = probe_host()
    assert facts.cuda_runtime_version == "12.8" and facts.gpu_count == 1
    assert facts.sources == ("proc", "nvml", "torch")


def test_torch_lists_gpus_when_nvml_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    props = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=150 << 30)
    fake_torch = types.ModuleType("torch")
    fake_torch.version = types.SimpleNamespace(cuda="12.8")
    fake_torch.cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 2,
                                            get_device_properties=lambda i: props)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=True))
    facts = probe_host()
    assert facts.gpu_count == 2 and facts.gpus[1].arch == "sm_90"
    assert facts.gpus[0].free_memory_bytes is None  # not read: it would create a CUDA context
    assert facts.interconnect == "unknown" and facts.driver_version is None


@pytest.mark.gpu
def test_probe_on_a_gpu_host_reads_nvml() -> None:
    """On the H200 machine: NVML answers with the arch, memory and driver the resolver needs."""
    facts = probe_host()
    assert "nvml" in facts.sources, facts.notes
    assert facts.gpus and all(g.arch.startswith("sm_") for g in facts.gpus)
    assert all(g.free_memory_bytes is not None and 0 < g.free_memory_bytes <= g.total_memory_bytes
               for g in facts.gpus)
    assert facts.driver_version and facts.cuda_driver_version and facts.cuda_runtime_version
    assert HostFacts.from_json(facts.to_json()) == facts
