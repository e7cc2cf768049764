"""Read a Hugging Face checkpoint directory strictly and lazily.

Lists every tensor from the safetensors *headers* (no tensor data read), checks the index against
the shards, refuses paths that leave the directory, and loads one tensor at a time on request
(`safe_open` per call, so nothing stays mapped between tensors). Raises SourceNotFoundError /
SourceFormatError; never mutates the source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from modeld.convert.errors import SourceFormatError, SourceNotFoundError

MAX_SAFETENSORS_HEADER = 100 << 20
ST_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I8": "int8",
             "U8": "uint8", "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool",
             "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8,
            "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                   "special_tokens_map.json", "chat_template.jinja")


@dataclass(frozen=True)
class SourceTensor:
    name: str
    file: Path | None          # None for virtual checkpoints (synth_source.SynthCheckpoint)
    dtype: str                 # our dtype names ("bfloat16", ...)
    shape: tuple[int, ...]


def _inside(root: Path, rel: str) -> Path:
    path = (root / rel)
    if Path(rel).is_absolute() or ".." in Path(rel).parts or not path.resolve().is_relative_to(root.resolve()):
        raise SourceFormatError(f"index names a file outside the checkpoint: {rel!r}")
    return path


def read_safetensors_header(path: Path) -> dict[str, SourceTensor]:
    """Tensors of one shard, with offsets and sizes checked against the file length."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) < 8:
            raise SourceFormatError(f"{path.name}: shorter than a safetensors header")
        n = int.from_bytes(raw_len, "little")
        if n > MAX_SAFETENSORS_HEADER or 8 + n > size:
            raise SourceFormatError(f"{path.name}: header length {n} is out of bounds")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise SourceFormatError(f"{path.name}: header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise SourceFormatError(f"{path.name}: header is not an object")
    out: dict[str, SourceTensor] = {}
    data_size = size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SourceFormatError(f"{path.name}: malformed entry for {name!r}") from None
        if dtype not in ST_DTYPES or not all(type(d) is int and d >= 0 for d in shape):
            raise SourceFormatError(f"{path.name}: {name}: unsupported dtype {dtype!r} or bad shape")
        numel = 1
        for d in shape:
            numel *= d
        if not (type(begin) is int and type(end) is int and 0 <= begin <= end <= data_size
                and end - begin == numel * ITEMSIZE[dtype]):
            raise SourceFormatError(f"{path.name}: {name}: data offsets {begin}..{end} do not fit")
        out[name] = SourceTensor(name, path, ST_DTYPES[dtype], shape)
    return out


class CheckpointFiles:
    """Side-file logic shared by on-disk and virtual checkpoints, so both read the same way.

    Subclasses provide `root` (for messages) and `file_bytes(name) -> bytes | None`.
    """

    root: Path

    def file_bytes(self, name: str) -> bytes | None:
        raise NotImplementedError

    def json_file(self, name: str, required: bool = False) -> dict | None:
        """Parsed JSON object `name`, None if absent (SourceFormatError if required or malformed)."""
        raw = self.file_bytes(name)
        if raw is None:
            if required:
                raise SourceFormatError(f"{self.root} has no {name}")
            return None
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise SourceFormatError(f"{name}: not valid JSON ({err})") from None
        if not isinstance(value, dict):
            raise SourceFormatError(f"{name}: not a JSON object")
        return value

    _json = json_file

    def tokenizer_blobs(self) -> dict[str, bytes]:
        """Tokenizer-side files present in the checkpoint (tokenizer.json is required)."""
        blobs = {name: raw for name in TOKENIZER_FILES if (raw := self.file_bytes(name)) is not None}
        if "tokenizer.json" not in blobs:
            raise SourceFormatError(f"{self.root} has no tokenizer.json (the artifact must carry its tokenizer)")
        return blobs

    def chat_template(self) -> str | None:
        jinja = self.file_bytes("chat_template.jinja")
        if jinja is not None:     # universal newlines, as Path.read_text gives
            return jinja.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        config = self.json_file("tokenizer_config.json") or {}
        template = config.get("chat_template")
        return template if isinstance(template, str) else None


class HFCheckpoint(CheckpointFiles):
    """A checkpoint directory: `config`, `tensors` (name -> SourceTensor), tokenizer files."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise SourceNotFoundError(f"{self.root} is not a checkpoint directory")
        self.config = self.json_file("config.json", required=True)
        self.tensors = self._list_tensors()

    def file_bytes(self, name: str) -> bytes | None:
        path = self.root / name
        return path.read_bytes() if path.is_file() else None

    def _list_tensors(self) -> dict[str, SourceTensor]:
        index = self.json_file("model.safetensors.index.json")
        if index is None:
            shards = sorted(self.root.glob("*.safetensors"))
            if not shards:
                raise SourceFormatError(f"{self.root} holds no *.safetensors files")
            tensors: dict[str, SourceTensor] = {}
            for shard in shards:
                for name, t in read_safetensors_header(shard).items():
                    if name in tensors:
                        raise SourceFormatError(f"tensor {name} appears in two shards")
                    tensors[name] = t
            return tensors
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise SourceFormatError("model.safetensors.index.json has no valid weight_map")
        headers = {rel: read_safetensors_header(_inside(self.root, rel)) for rel in sorted(set(weight_map.values()))}
        tensors = {}
        for name, rel in weight_map.items():
            if name not in headers[rel]:
                raise SourceFormatError(f"index puts {name} in {rel}, whose header lacks it")
            tensors[name] = headers[rel][name]
        for rel, header in headers.items():
            extra = sorted(set(header) - set(weight_map))
            if extra:
                raise SourceFormatError(f"{rel} holds tensors the index does not list: {extra[:3]}")
        return tensors

    def load(self, name: str):
        """The tensor `name` as a CPU torch tensor (one read; the file is closed afterwards)."""
        from safetensors import safe_open

        t = self.tensors[name]
        with safe_open(str(t.file), framework="pt") as f:
            return f.get_tensor(name)
