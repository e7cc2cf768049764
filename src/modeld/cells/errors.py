"""Named errors of the cell factories (light: imports only the serving error base)."""

from __future__ import annotations

from modeld.serving.errors import Unsupported


class EngineFamilyUnsupported(Unsupported):
    """An engine cell was selected for an artifact whose model family this build's engine does
    not implement (e.g. an .mspec of a family with no `modeld.models.<family>` package)."""
