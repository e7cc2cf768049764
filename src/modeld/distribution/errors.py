"""Named errors of the distribution tier (identity, artifacts, registry, manifests, resolution).

One class per failure mode, every one a `ModeldError`, so the CLI prints `ClassName: message`.
"""

from __future__ import annotations

from modeld.errors import ModeldError
from modeld.host.facts import InvalidHostFacts  # re-exported: raised by the host tier


class DistributionError(ModeldError):
    """Base of every distribution-tier error."""


class InvalidIdentity(DistributionError):
    """A model id, weights id or name breaks the identity rules (ARCHITECTURE.md §Selection)."""


class ModelNotFound(DistributionError):
    """No installed artifact answers to the requested name or identity (nothing is downloaded)."""

    http_status = 404


class ArtifactMissing(DistributionError):
    """A name is registered but its file is not on this host (or is not a regular file)."""

    http_status = 404


class InvalidArtifact(DistributionError):
    """The file exists but is not a readable GGUF / .mspec artifact."""


class UnsafePath(DistributionError):
    """A registry path escapes its root (`..`, symlink out of MODELD_HOME)."""


class RegistryError(DistributionError):
    """`registry.json` is unreadable or malformed, or an add/remove cannot be applied."""


class RegistryConflict(RegistryError):
    """A registry name collides with a built-in name or an existing entry."""


class InvalidManifest(DistributionError):
    """A cell manifest fails validation; the message names the file and the field."""


class MspecReaderUnavailable(DistributionError):
    """`modeld.mspec` is missing or failed while reading an artifact's identity."""


__all__ = [
    "ArtifactMissing", "DistributionError", "InvalidArtifact", "InvalidHostFacts", "InvalidIdentity",
    "InvalidManifest", "ModelNotFound", "MspecReaderUnavailable", "NoCellCanServe", "RegistryConflict",
    "RegistryError", "UnsafePath",
]


class NoCellCanServe(DistributionError):
    """Every cell rejected the request; the message lists each cell's reasons."""

    http_status = 422
