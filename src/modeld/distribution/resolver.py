"""The resolver: a pure function from (request, host, artifacts, manifests, backends) to a
Resolution naming the selected cell and EVERY rejection reason of every other cell.

Order (ARCHITECTURE.md §Selection):
1. the request resolves to an artifact already on this host (never downloads);
2. a specialized cell's `serves` holds the artifact's exact (model_id, weights_id) — an artifact
   without a full identity never selects a specialization;
3. the host satisfies the cell's requirements, and its backend is available;
4. highest rank wins, ties go to the lexicographically smaller id;
5. otherwise fall through to the general cell(s) (`serves_any`, i.e. llama.cpp), chosen by the
   same checks and the same (rank, id) order. If none can serve (e.g. an .mspec that llama.cpp
   cannot load), the Resolution has no cell and `require()` raises NoCellCanServe.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modeld.distribution.checks import Reason, Rejection, cell_rejections
from modeld.distribution.errors import (
    ArtifactMissing,
    InvalidManifest,
    ModelNotFound,
    NoCellCanServe,
)
from modeld.distribution.identity import ModelIdentity
from modeld.host.facts import HostFacts

if TYPE_CHECKING:
    from modeld.distribution.artifacts import Artifact
    from modeld.distribution.manifests import CellManifest


@dataclass(frozen=True, slots=True)
class Resolution:
    """The decision. `cell` is None when nothing can serve; `rejections` covers every other cell,
    in manifest order, each cell's reasons in check order."""

    request: str
    artifact: Artifact | None
    cell: CellManifest | None
    fell_through: bool
    rejections: tuple[Rejection, ...]
    cell_ids: tuple[str, ...]  # every cell considered, in manifest order

    @property
    def ok(self) -> bool:
        return self.cell is not None

    def rejections_for(self, cell_id: str) -> tuple[Rejection, ...]:
        return tuple(r for r in self.rejections if r.cell_id == cell_id)

    def reasons_for(self, cell_id: str) -> tuple[Reason, ...]:
        return tuple(r.reason for r in self.rejections_for(cell_id))

    def require(self) -> Resolution:
        """Return self if a cell was selected, else raise the most specific named error:
        ModelNotFound (no artifact answers to the request), ArtifactMissing (registered, file
        absent), NoCellCanServe (listing every rejection)."""
        if self.cell is not None:
            return self
        if self.artifact is None:
            raise ModelNotFound(f"no installed model answers to {self.request!r} "
                                "(see `modeld models`; nothing is downloaded)")
        if not self.artifact.present:
            raise ArtifactMissing(f"{self.request!r} is registered but {self.artifact.path} "
                                  "is not on this host")
        reasons = "; ".join(str(r) for r in self.rejections) or "no cell manifests are installed"
        raise NoCellCanServe(f"{self.request!r}: {reasons}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "artifact": None if self.artifact is None else self.artifact.to_dict(),
            "selected": None if self.cell is None else self.cell.id,
            "fell_through": self.fell_through,
            "cells": list(self.cell_ids),
            "rejections": [r.to_dict() for r in self.rejections],
        }


def find_artifact(request: str | ModelIdentity, artifacts: Sequence[Artifact]) -> Artifact | None:
    """The first artifact answering to `request`: exact identity for a ModelIdentity, one of its
    names (exact, case-sensitive) for a string."""
    for artifact in artifacts:
        if isinstance(request, ModelIdentity):
            if artifact.identity == request:
                return artifact
        elif request in artifact.names:
            return artifact
    return None


def _rank_key(cell: CellManifest) -> tuple[int, str]:
    return (-cell.rank, cell.id)


def _outranked(loser: CellManifest, winner: CellManifest) -> Rejection:
    if loser.rank == winner.rank:
        detail = f"same rank {loser.rank} as {winner.id}, whose id sorts first"
    else:
        detail = f"rank {loser.rank} < rank {winner.rank} of {winner.id}"
    return Rejection(loser.id, Reason.OUTRANKED, detail)


def resolve(
    request: str | ModelIdentity,
    host: HostFacts,
    artifacts: Sequence[Artifact],
    manifests: Sequence[CellManifest],
    backends_available: Collection[str],
) -> Resolution:
    """Select the cell for `request`. Pure: reads its arguments, touches nothing else.

    `request` is a name (matched against `Artifact.names`) or an exact ModelIdentity.
    `backends_available` holds backend kinds ("llama.cpp", "engine", "null").
    Never raises for an unservable request (see `Resolution.require()`); raises InvalidManifest
    if two manifests share an id (the verdicts would be ambiguous).
    """
    ids = [cell.id for cell in manifests]
    if len(ids) != len(set(ids)):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise InvalidManifest(f"id: cell id {duplicate!r} appears in two manifests")
    label = str(request)
    artifact = find_artifact(request, artifacts)
    reasons = {cell.id: cell_rejections(cell, artifact, host, backends_available, label)
               for cell in manifests}
    specialized = sorted((c for c in manifests if not c.serves_any and not reasons[c.id]),
                         key=_rank_key)
    general = sorted((c for c in manifests if c.serves_any and not reasons[c.id]), key=_rank_key)
    if specialized:
        winner, fell_through = specialized[0], False
        for cell in specialized[1:]:
            reasons[cell.id].append(_outranked(cell, winner))
        for cell in general:
            reasons[cell.id].append(Rejection(
                cell.id, Reason.SPECIALIZED_CELL_SELECTED,
                f"the specialized cell {winner.id} serves this exact model; "
                "the general cell is only the fall-through"))
    elif general:
        winner, fell_through = general[0], True
        for cell in general[1:]:
            reasons[cell.id].append(_outranked(cell, winner))
    else:
        winner, fell_through = None, False
    rejections = tuple(r for cell in manifests for r in reasons[cell.id])
    return Resolution(
        request=label,
        artifact=artifact,
        cell=winner,
        fell_through=fell_through,
        rejections=rejections,
        cell_ids=tuple(cell.id for cell in manifests),
    )
