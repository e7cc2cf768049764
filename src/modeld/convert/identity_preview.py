"""The identity an .mspec artifact would get, computed from its conversion plan without writing it.

Why it cannot drift from the converter: `preview_identity(plan)` consumes the very
`ConversionPlan` that `emit` hands to the writer (same family name map, recipe, casts and
quantizers: recipe.plan_objects), calls its producers in the writer's order (sorted by name),
turns each result into bytes with the writer's own `_as_bytes`, and builds the directory with
the writer's own `build_directory`, validated by `parse_directory`. Nothing about naming, layout,
dtype or quantization is restated here; tests compare the previewed directory bytes with the
directory of the file `modeld synth` + `modeld convert` writes (tests/convert/test_convert_direct.py).

`synth_identity(...)` is the shortcut for synthetic checkpoints (no file at all: synth_source).
Producers are run with `measure_error=False` where this module builds the plan (error columns
do not enter any identity). Mutates nothing on disk.
"""

from __future__ import annotations

import hashlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from modeld.convert.emit import ConversionPlan
from modeld.convert.progress import byte_progress
from modeld.mspec import format as F
from modeld.mspec.directory import Directory, ObjectEntry, build_directory, parse_directory
from modeld.mspec.errors import MspecWriteError
from modeld.mspec.writer import _as_bytes


@dataclass(frozen=True)
class ArtifactIdentity:
    """What `emit(plan, out)` would write, minus the payload: identities, inventory, sizes."""

    directory: Directory            # parsed, validated; .objects is the inventory with sha256s
    directory_sha256: str           # hex sha256 of the directory bytes (header field of the file)
    file_bytes: int                 # exact size of the .mspec file

    @property
    def model_id(self) -> str:
        return self.directory.model_id

    @property
    def weights_id(self) -> str:
        return self.directory.weights_id

    @property
    def tokenizer_id(self) -> str:
        return self.directory.tokenizer_id

    @property
    def recipe_hash(self) -> str:
        return self.directory.recipe_hash

    @property
    def objects(self) -> tuple[ObjectEntry, ...]:
        return self.directory.objects

    def as_json(self) -> dict:
        d = self.directory
        return {"model_id": d.model_id, "weights_id": d.weights_id, "tokenizer_id": d.tokenizer_id,
                "family": d.family, "profile": d.recipe.get("profile"), "recipe_hash": d.recipe_hash,
                "objects": len(d.objects), "payload_bytes": d.payload_length, "file_bytes": self.file_bytes,
                "directory_sha256": self.directory_sha256}


def preview_identity(plan: ConversionPlan, *, hash_workers: int = 1) -> ArtifactIdentity:
    """Run every producer of `plan` once, hash, and return the identity of the would-be file.

    `hash_workers > 1` hashes objects concurrently (hashlib releases the GIL; at most
    2 * hash_workers results held). Shows a byte progress bar (progress.py). Raises what the
    producers raise, MspecWriteError for a producer result that does not match its plan, and the
    directory validators' errors.
    """
    objects = sorted(plan.objects, key=lambda o: o.name)
    names = [o.name for o in objects]
    if len(set(names)) != len(names):
        raise MspecWriteError("an object is planned twice")
    entries, offset = [], 0
    for o in objects:                                   # the writer's entry, offsets and all
        entries.append({"name": o.name, "kind": o.kind, "dtype": o.dtype, "shape": list(o.shape),
                        "layout": o.layout, "offset": offset, "length": o.length, "sha256": "0" * 64})
        offset = F.align_up(offset + o.length)
    payload_length = offset

    def digest(view) -> str:
        return hashlib.sha256(view).hexdigest()

    with byte_progress("identity", payload_length) as bar:
        if hash_workers <= 1:
            for o, entry in zip(objects, entries):
                entry["sha256"] = digest(_as_bytes(o, o.produce()))
                bar.advance(F.align_up(o.length), o.name)
        else:
            with ThreadPoolExecutor(hash_workers, thread_name_prefix="hash") as pool:
                pending: deque = deque()
                for o, entry in zip(objects, entries):
                    pending.append((o, entry, pool.submit(digest, _as_bytes(o, o.produce()))))
                    while len(pending) > 2 * hash_workers or (pending and pending[0][2].done()):
                        po, pentry, fut = pending.popleft()
                        pentry["sha256"] = fut.result()
                        bar.advance(F.align_up(po.length), po.name)
                for po, pentry, fut in pending:
                    pentry["sha256"] = fut.result()
                    bar.advance(F.align_up(po.length), po.name)
    raw = build_directory(model_id=plan.model_id, family=plan.family, recipe=plan.recipe,
                          metadata=plan.metadata, objects=entries, payload_length=payload_length)
    directory = parse_directory(raw)
    file_bytes = F.align_up(F.HEADER_SIZE + len(raw)) + payload_length
    return ArtifactIdentity(directory, hashlib.sha256(raw).hexdigest(), file_bytes)


def synth_identity(config: str, seed: int, profile: str, *, layers: int | None = None, include_mtp: bool = True,
                   model_id: str | None = None, device: str | None = None, workers: int | None = None,
                   hash_workers: int = 1, prefetch_bytes: int | None = None,
                   lm_head: str = "bf16") -> ArtifactIdentity:
    """Identity of `modeld synth --config CONFIG --seed SEED` converted with `--profile PROFILE`
    (and `--lm-head LM_HEAD`).

    `device="cuda"` quantizes there (bit-identical to the CPU: quantize.py); `workers` generator
    threads (default: CPUs, max 16). Example (H200, ~1 min for 27B int4):

        >>> from modeld.convert.identity_preview import synth_identity
        >>> ident = synth_identity("27b", 0, "int4", device="cuda", workers=16, hash_workers=4)
        >>> ident.model_id, ident.weights_id      # ('synthetic/qwen3_5-27b-L64-seed0', 'sha256:...')

    Raises SynthConfigError, UnknownProfileError, QuantizationShapeError (e.g. odd + int4).
    """
    from modeld.convert.qwen3_5_spec import preset
    from modeld.convert.synth_source import DEFAULT_PREFETCH_BYTES, synth_plan

    shape = preset(config, layers)
    with synth_plan(shape, seed, profile, include_mtp=include_mtp, model_id=model_id, device=device,
                    workers=workers, measure_error=False, lm_head=lm_head,
                    prefetch_bytes=DEFAULT_PREFETCH_BYTES if prefetch_bytes is None else prefetch_bytes) as plan:
        return preview_identity(plan, hash_workers=hash_workers)
