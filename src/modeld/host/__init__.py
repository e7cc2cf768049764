"""T3 host probe: what this machine is (OS, CPU, RAM, GPUs), as JSON-able frozen HostFacts.

Light to import: no torch, NVML or pydantic until `probe_host` runs.
"""

from modeld.host.facts import GpuFacts, HostFacts, InvalidHostFacts
from modeld.host.probe import probe_host

__all__ = ["GpuFacts", "HostFacts", "InvalidHostFacts", "probe_host"]
