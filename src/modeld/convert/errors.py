"""Named errors of `modeld synth` and `modeld convert` (one class per failure mode)."""

from __future__ import annotations

from modeld.errors import ModeldError


class ConvertError(ModeldError):
    """Root of every error raised by `modeld.convert`."""


class SynthConfigError(ConvertError):
    """A synthetic-checkpoint preset or override is unknown or inconsistent."""


class OutputExistsError(ConvertError):
    """The output path exists and is not empty (nothing is ever overwritten silently)."""


class SourceNotFoundError(ConvertError):
    """The conversion source path does not exist or is not a checkpoint directory / GGUF file."""


class SourceFormatError(ConvertError):
    """A source file (config.json, index, safetensors header, GGUF) is malformed."""


class UnsupportedFamilyError(ConvertError):
    """The checkpoint's model_type/architecture is not one the converter has a name map for."""


class MissingTensorError(ConvertError):
    """A tensor the family's name map requires is absent from the checkpoint."""


class LeftoverTensorError(ConvertError):
    """The checkpoint holds a tensor the family's name map does not account for."""


class TensorShapeError(ConvertError):
    """A source tensor's shape differs from the shape the config implies."""


class TensorDtypeError(ConvertError):
    """A source tensor's dtype is not one the recipe accepts for that tensor."""


class UnknownProfileError(ConvertError):
    """The requested weight profile is not bf16, fp8 or int4, or the lm_head format does not fit it."""


class QuantizationShapeError(ConvertError):
    """A tensor cannot be quantized with the profile's layout (e.g. K not divisible by the group)."""


class GGUFTensorTypeError(ConvertError):
    """A GGUF tensor has a ggml type the importer cannot convert."""


class ModelIdError(ConvertError):
    """No model_id was given and none can be derived from the source (or it is not a valid identity)."""


class DeviceError(ConvertError):
    """The requested quantization device is not valid or not available on this machine."""
