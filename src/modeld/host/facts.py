"""HostFacts: what the resolver knows about a machine, as plain frozen data.

JSON-serialisable both ways (`to_dict`/`from_dict`, `to_json`/`from_json`) so that tests and
`modeld resolve --host-json FILE` can describe a host that is not this one (e.g. an H200 box).
Parsing is strict: unknown or missing keys, wrong types, negative sizes -> InvalidHostFacts.
Nothing here probes hardware; see `modeld.host.probe`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from modeld.errors import ModeldError

SCHEMA = "modeld.host-facts/v1"
INTERCONNECTS = ("none", "pcie", "nvlink", "unknown")
ARCH_RE = re.compile(r"sm_[0-9]{2,3}[a-z]?")
VERSION_RE = re.compile(r"[0-9]+(\.[0-9]+)*")


class InvalidHostFacts(ModeldError):
    """A host description (e.g. `--host-json FILE`) is not a valid HostFacts document."""


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """One GPU. `free_memory_bytes` is None when no source could read it without side effects."""

    index: int
    name: str
    arch: str  # "sm_90" for compute capability 9.0
    total_memory_bytes: int
    free_memory_bytes: int | None = None
    nvlink_active_links: int = 0


@dataclass(frozen=True, slots=True)
class HostFacts:
    """Everything the resolver may ask about a host. Versions are dotted strings ("550.54.15").

    `interconnect`: "none" (0-1 GPU), "pcie", "nvlink" (every GPU has an active NVLink), "unknown".
    `sources` lists which probes answered ("proc", "nvml", "torch", "json"); `notes` lists the
    probe failures that were tolerated, so a user can see why e.g. the driver is unknown.
    """

    os: str
    os_release: str
    machine: str
    python: str
    cpu_model: str
    cpu_cores: int
    ram_total_bytes: int
    ram_available_bytes: int | None
    gpus: tuple[GpuFacts, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # highest CUDA the driver supports (NVML)
    cuda_runtime_version: str | None = None  # the CUDA runtime the engine links (torch.version.cuda)
    interconnect: str = "none"
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = [asdict(gpu) for gpu in self.gpus]
        data["sources"] = list(self.sources)
        data["notes"] = list(self.notes)
        return {"schema": SCHEMA, **data}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: object) -> HostFacts:
        """Strict parse of `to_dict()` output; raises InvalidHostFacts naming the bad key."""
        if not isinstance(data, dict):
            raise InvalidHostFacts("host facts must be a JSON object")
        data = dict(data)
        if data.pop("schema", None) != SCHEMA:
            raise InvalidHostFacts(f"host facts need \"schema\": \"{SCHEMA}\"")
        gpus_raw = data.get("gpus", [])
        if not isinstance(gpus_raw, list):
            raise InvalidHostFacts("gpus must be a list")
        data["gpus"] = tuple(_gpu_from_dict(i, g) for i, g in enumerate(gpus_raw))
        for key in ("sources", "notes"):
            value = data.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise InvalidHostFacts(f"{key} must be a list of strings")
            data[key] = tuple(value)
        facts = _build(cls, data, "host")
        _check_host(facts)
        return facts

    @classmethod
    def from_json(cls, text: str) -> HostFacts:
        try:
            data = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            raise InvalidHostFacts(f"not valid JSON: {exc}") from None
        return cls.from_dict(data)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed")


_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "int | None": (int, type(None)),
    "str": (str,),
    "str | None": (str, type(None)),
}


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise InvalidHostFacts(f"{where}: unknown key(s) {', '.join(unknown)}")
    for f in fields(cls):
        if f.name not in data:
            continue  # a missing key with no default fails in cls(**data) below
        allowed = _TYPES.get(str(f.type))
        value = data[f.name]
        if allowed is not None and (isinstance(value, bool) or not isinstance(value, allowed)):
            raise InvalidHostFacts(f"{where}.{f.name}: expected {f.type}, got {type(value).__name__}")
    try:
        return cls(**data)
    except TypeError as exc:  # a missing required key
        raise InvalidHostFacts(f"{where}: {exc}") from None


def _gpu_from_dict(index: int, data: object) -> GpuFacts:
    if not isinstance(data, dict):
        raise InvalidHostFacts(f"gpus[{index}] must be an object")
    gpu = _build(GpuFacts, data, f"gpus[{index}]")
    if not ARCH_RE.fullmatch(gpu.arch):
        raise InvalidHostFacts(f"gpus[{index}].arch {gpu.arch!r} is not like 'sm_90'")
    if gpu.total_memory_bytes < 0 or (gpu.free_memory_bytes or 0) < 0 or gpu.nvlink_active_links < 0:
        raise InvalidHostFacts(f"gpus[{index}]: sizes and counts must be >= 0")
    if gpu.free_memory_bytes is not None and gpu.free_memory_bytes > gpu.total_memory_bytes:
        raise InvalidHostFacts(f"gpus[{index}]: free memory exceeds total memory")
    return gpu


def _check_host(facts: HostFacts) -> None:
    if facts.interconnect not in INTERCONNECTS:
        raise InvalidHostFacts(f"interconnect must be one of {', '.join(INTERCONNECTS)}")
    if facts.cpu_cores < 1 or facts.ram_total_bytes < 0 or (facts.ram_available_bytes or 0) < 0:
        raise InvalidHostFacts("cpu_cores must be >= 1 and memory sizes >= 0")
    for key in ("driver_version", "cuda_driver_version", "cuda_runtime_version"):
        value = getattr(facts, key)
        if value is not None and not VERSION_RE.fullmatch(value):
            raise InvalidHostFacts(f"{key} {value!r} is not a dotted version like '12.4'")
    if [gpu.index for gpu in facts.gpus] != list(range(len(facts.gpus))):
        raise InvalidHostFacts("gpus must be listed by index 0, 1, 2, ...")


def version_tuple(text: str) -> tuple[int, ...]:
    """"550.54.15" -> (550, 54, 15). The caller guarantees VERSION_RE matched."""
    return tuple(int(part) for part in text.split("."))
