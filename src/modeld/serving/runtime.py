"""The runtime: loaded cells (by model name) and live sessions, shared by the CLI and the server.

Loading goes through selection (T3 resolver) and the explicit backend mapping. Each loaded cell
has a `turn_lock` — one turn (ensure_prefix + decode, or one session-API operation) at a time
per cell — and a default session that stateless OpenAI requests share, so a repeated prefix
(system prompt, earlier chat turns) is reused across requests. All methods are thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from modeld.serving.contract import Cell, Session
from modeld.serving.errors import Overloaded, UnknownSession
from modeld.serving.selection import CellFactory, CellOptions, CellSpec, build_cell, select_cell

DEFAULT_MODEL = "smollm2"


@dataclass
class LoadedCell:
    name: str
    spec: CellSpec
    cell: Cell
    default_session: Session
    turn_lock: threading.Lock = field(default_factory=threading.Lock)
    loaded_at: float = field(default_factory=time.time)


class Runtime:
    def __init__(
        self,
        *,
        home: Path | None = None,
        options: CellOptions = CellOptions(),
        extra_factories: Mapping[str, CellFactory] | None = None,
        extra_backends: frozenset[str] = frozenset(),
        default_model: str = DEFAULT_MODEL,
        max_sessions: int = 64,
    ) -> None:
        self.home = home
        self.options = options
        self.default_model = default_model
        self.max_sessions = max_sessions
        self._extra_factories = dict(extra_factories or {})
        self._extra_backends = extra_backends
        self._lock = threading.RLock()
        self._by_name: dict[str, LoadedCell] = {}
        self._by_key: dict[tuple[str, str], LoadedCell] = {}
        self._sessions: dict[str, tuple[LoadedCell, Session]] = {}

    def load(self, model: str | None = None, *, require_cell: str | None = None) -> LoadedCell:
        """The loaded cell for `model` (default model if None); loads it on first use.
        Raises the selection errors (ModelNotFound, NoCellCanServe, Fallback, ...)."""
        name = self.default_model if model is None else model
        with self._lock:
            hit = self._by_name.get(name)
            if hit is not None and (require_cell is None or hit.spec.cell_id == require_cell):
                return hit
            spec = select_cell(name, home=self.home, extra_backends=self._extra_backends,
                               require_cell=require_cell)
            key = (spec.cell_id, spec.artifact_path)
            loaded = self._by_key.get(key)
            if loaded is None:
                cell = build_cell(spec, self.options, self._extra_factories)
                loaded = LoadedCell(name, spec, cell, cell.new_session())
                self._by_key[key] = loaded
            self._by_name[name] = loaded
            return loaded

    def loaded(self) -> list[LoadedCell]:
        with self._lock:
            return list(self._by_key.values())

    def create_session(self, model: str | None = None) -> tuple[LoadedCell, Session]:
        """A new session on `model`'s cell. Raises Overloaded past max_sessions."""
        loaded = self.load(model)
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                raise Overloaded(f"too many live sessions ({self.max_sessions}); delete one first")
            session = loaded.cell.new_session()
            self._sessions[session.id] = (loaded, session)
            return loaded, session

    def session(self, session_id: str) -> tuple[LoadedCell, Session]:
        with self._lock:
            found = self._sessions.get(session_id)
        if found is None:
            raise UnknownSession(f"no session {session_id!r}", param="session_id")
        return found

    def delete_session(self, session_id: str) -> None:
        with self._lock:
            found = self._sessions.pop(session_id, None)
        if found is None:
            raise UnknownSession(f"no session {session_id!r}", param="session_id")
        loaded, session = found
        with loaded.turn_lock:
            session.close()

    def close(self) -> None:
        with self._lock:
            for loaded, session in self._sessions.values():
                session.close()
            self._sessions.clear()
            for loaded in self._by_key.values():
                loaded.cell.close()
            self._by_key.clear()
            self._by_name.clear()
