"""T3 distribution: identities, artifacts, the registry, cell manifests and the resolver.

Light to import: pydantic is loaded only by `modeld.distribution.manifests` (import it, or call
`resolve_on_this_host`, when you need manifests).
"""

from modeld.distribution.checks import Reason, Rejection
from modeld.distribution.errors import (
    ArtifactMissing,
    InvalidArtifact,
    InvalidIdentity,
    InvalidManifest,
    ModelNotFound,
    NoCellCanServe,
)
from modeld.distribution.identity import ModelIdentity, gguf_weights_id
from modeld.distribution.resolver import Resolution, resolve

__all__ = [
    "ArtifactMissing", "InvalidArtifact", "InvalidIdentity", "InvalidManifest", "ModelIdentity",
    "ModelNotFound", "NoCellCanServe", "Reason", "Rejection", "Resolution", "gguf_weights_id",
    "resolve", "resolve_on_this_host",
]


def __getattr__(name: str):
    # resolve_on_this_host pulls in the registry and host probe: load it on first use only.
    if name == "resolve_on_this_host":
        from modeld.distribution.this_host import resolve_on_this_host

        return resolve_on_this_host
    raise AttributeError(name)
