"""Named errors of the execution tier (T1). Each class is one failure mode."""

from __future__ import annotations

from modeld.errors import ModeldError


class ExecutionError(ModeldError):
    """Root of every error raised by `modeld.execution` and the model packages."""


class ArenaLayoutError(ExecutionError):
    """A buffer spec is invalid (empty name, duplicate name, non-positive dim, unknown dtype)."""


class ArenaLookupError(ExecutionError):
    """A buffer name is not part of the arena's layout."""


class ModelConfigError(ExecutionError):
    """A model config (config.json) is missing a field or holds a value the engine cannot run."""


class WeightLoadError(ExecutionError):
    """Base of the strict weight-loading failures below."""


class MissingTensorError(WeightLoadError):
    """The artifact lacks a tensor the model's layout needs."""


class UnexpectedTensorError(WeightLoadError):
    """The artifact holds a tensor the layout does not consume (strict loading: no leftovers)."""


class TensorShapeMismatch(WeightLoadError):
    """An artifact tensor's shape differs from the layout's."""


class TensorDtypeMismatch(WeightLoadError):
    """An artifact tensor's dtype is not one the layout accepts for that slot."""


class WeightParityError(WeightLoadError):
    """After loading, an arena slot's bytes differ from the artifact tensor it was copied from."""


class StateCapacityError(ExecutionError):
    """A request needs more positions or sequences than the state spec was sized for."""


class StateFormatError(ExecutionError):
    """Slot-state bytes are truncated, of another layout, or describe more positions than fit."""


class TokenizerError(ExecutionError):
    """The tokenizer files are missing or unreadable."""


class GraphCaptureError(ExecutionError):
    """CUDA-graph capture was asked for on a device that cannot capture, or failed."""
