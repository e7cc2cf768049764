"""HostFacts JSON: round trip, and a named error for every malformed document."""

from __future__ import annotations

import dataclasses
import json

import pytest

from modeld.host import GpuFacts, HostFacts, InvalidHostFacts

H200 = GpuFacts(index=0, name="NVIDIA H200", arch="sm_90", total_memory_bytes=150_754_820_096,
                free_memory_bytes=149_000_000_000, nvlink_active_links=18)
FACTS = HostFacts(os="Linux", os_release="6.8", machine="x86_64", python="3.12.3",
                  cpu_model="Intel Xeon Platinum 8480+", cpu_cores=16,
                  ram_total_bytes=128 << 30, ram_available_bytes=100 << 30,
                  gpus=(H200, dataclasses.replace(H200, index=1)),
                  driver_version="560.35.03", cuda_driver_version="12.6",
                  cuda_runtime_version="12.8", interconnect="nvlink",
                  sources=("proc", "nvml", "torch"), notes=("a note",))


def test_round_trip() -> None:
    assert HostFacts.from_json(FACTS.to_json()) == FACTS
    assert HostFacts.from_dict(json.loads(FACTS.to_json())).gpus[1].index == 1
    assert FACTS.gpu_count == 2


def _doc(**changes) -> dict:
    doc = json.loads(FACTS.to_json())
    for key, value in changes.items():
        if value is _DROP:
            doc.pop(key)
        else:
            doc[key] = value
    return doc


_DROP = object()
GPU0 = json.loads(FACTS.to_json())["gpus"][0]

INVALID = [
    ("wrong-schema", _doc(schema="other/v9"), "schema"),
    ("no-schema", _doc(schema=_DROP), "schema"),
    ("unknown-key", _doc(gpu_model="x"), "gpu_model"),
    ("missing-key", _doc(cpu_cores=_DROP), "cpu_cores"),
    ("string-cores", _doc(cpu_cores="16"), "cpu_cores"),
    ("bool-ram", _doc(ram_total_bytes=True), "ram_total_bytes"),
    ("zero-cores", _doc(cpu_cores=0), "cpu_cores"),
    ("negative-ram", _doc(ram_total_bytes=-1), "memory"),
    ("bad-interconnect", _doc(interconnect="infiniband"), "interconnect"),
    ("bad-driver", _doc(driver_version="r560"), "driver_version"),
    ("gpus-not-list", _doc(gpus={}), "gpus"),
    ("gpu-bad-arch", _doc(gpus=[{**GPU0, "arch": "hopper"}]), "arch"),
    ("gpu-free-over-total", _doc(gpus=[{**GPU0, "free_memory_bytes": 10**15}]), "free"),
    ("gpu-unknown-key", _doc(gpus=[{**GPU0, "uuid": "x"}]), "uuid"),
    ("gpu-index-gap", _doc(gpus=[{**GPU0, "index": 3}]), "index"),
    ("sources-not-strings", _doc(sources=[1]), "sources"),
    ("not-object", [], "object"),
]


@pytest.mark.parametrize("doc, fragment", [(d, f) for _, d, f in INVALID],
                         ids=[name for name, _, _ in INVALID])
def test_invalid_documents(doc, fragment: str) -> None:
    with pytest.raises(InvalidHostFacts, match=fragment):
        HostFacts.from_dict(doc)


@pytest.mark.parametrize("text", ["{", '{"cpu_cores": NaN}', ""], ids=["truncated", "nan", "empty"])
def test_invalid_json_text(text: str) -> None:
    with pytest.raises(InvalidHostFacts):
        HostFacts.from_json(text)


def test_frozen() -> None:
    with pytest.raises(AttributeError):
        FACTS.cpu_cores = 2  # type: ignore[misc]
