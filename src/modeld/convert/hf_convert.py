"""Plan the conversion of a Hugging Face checkpoint directory (qwen3_5 or llama) to .mspec.

Names are translated once through the family's map (families.py); loading is strict: a missing
tensor, a leftover tensor, a shape or dtype mismatch each raises its named error before any byte
is written. The tokenizer files travel as `tokenizer/<file>` blobs; config and chat template go
into the directory metadata. Nothing is read beyond safetensors headers until `emit` streams.
"""

from __future__ import annotations

from pathlib import Path

from modeld.convert.emit import ConversionPlan, check_model_id
from modeld.convert.errors import (LeftoverTensorError, MissingTensorError, SourceFormatError,
                                   TensorShapeError, UnknownProfileError)
from modeld.convert.families import rules_for
from modeld.convert.hf_source import CheckpointFiles, HFCheckpoint
from modeld.convert.recipe import InventoryRow, plan_objects, recipe_dict
from modeld.mspec import format as F
from modeld.mspec.writer import blob_object


def _listing(names: set[str]) -> str:
    shown = sorted(names)[:5]
    return ", ".join(shown) + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")


def _model_id(ckpt: CheckpointFiles, explicit: str | None) -> str:
    if explicit:
        return check_model_id(explicit)
    synth = ckpt.json_file("synth.json")
    if synth is not None:
        return check_model_id(synth.get("model_id"))
    name = ckpt.config.get("_name_or_path")
    return check_model_id(name if isinstance(name, str) and name and not name.startswith("/") else None)


def _special_ids(ckpt: CheckpointFiles, text: dict) -> dict:
    gen = ckpt.json_file("generation_config.json") or {}
    pick = lambda key: gen.get(key, text.get(key, ckpt.config.get(key)))   # noqa: E731
    return {"bos_token_id": pick("bos_token_id"), "eos_token_id": pick("eos_token_id"),
            "pad_token_id": pick("pad_token_id")}


def plan_hf(src: str | Path, profile: str, model_id: str | None = None, *, device: str | None = None,
            measure_error: bool = True, lm_head: str = "bf16") -> ConversionPlan:
    """Plan the conversion of the checkpoint directory `src` (see module doc)."""
    return plan_checkpoint(HFCheckpoint(src), profile, model_id, device=device, measure_error=measure_error,
                           lm_head=lm_head)


def plan_checkpoint(ckpt, profile: str, model_id: str | None = None, *, device: str | None = None,
                    measure_error: bool = True, lm_head: str = "bf16") -> ConversionPlan:
    """Plan from any checkpoint with HFCheckpoint's interface (`config`, `tensors`, `load(name)`
    and the CheckpointFiles side-file methods): an on-disk directory or a virtual one such as
    synth_source.SynthCheckpoint, which therefore gets exactly the on-disk plan. `device`,
    `measure_error` and `lm_head` ("bf16" or the quantized profile) go to recipe.plan_objects.
    Reads no tensor data; raises the named errors (UnknownProfileError for a quantized lm_head of a
    checkpoint that ties it to the embeddings)."""
    fmap = rules_for(ckpt.config, set(ckpt.tensors))
    recipe = recipe_dict(profile, fmap.family, "hf-safetensors", lm_head=lm_head)
    if lm_head != "bf16" and not any(r.role == "lm_head" for r in fmap.rules):
        raise UnknownProfileError(f"lm_head {lm_head!r}: this checkpoint ties lm_head to embed_tokens "
                                  "(no lm_head tensor to quantize)")
    expected = {r.source for r in fmap.rules}
    present = set(ckpt.tensors) - fmap.ignored
    if expected - present:
        raise MissingTensorError(f"{len(expected - present)} tensor(s) missing: {_listing(expected - present)}")
    if present - expected:
        raise LeftoverTensorError(f"{len(present - expected)} unmapped tensor(s): {_listing(present - expected)}")
    plan = ConversionPlan(_model_id(ckpt, model_id), fmap.family, recipe, {})
    for rule in fmap.rules:
        src_t = ckpt.tensors[rule.source]
        if src_t.shape != rule.shape:
            raise TensorShapeError(f"{rule.source}: shape {list(src_t.shape)}, config implies {list(rule.shape)}")

        def load(src_t=src_t):
            t = ckpt.load(src_t.name)
            if str(t.dtype).removeprefix("torch.") != src_t.dtype or tuple(t.shape) != src_t.shape:
                raise SourceFormatError(f"{src_t.name}: loaded {t.dtype} {list(t.shape)} differs from its header")
            return t

        part = plan_objects(rule, src_t.dtype, load, profile, device=device, measure_error=measure_error,
                            lm_head=lm_head)
        plan.objects += part.objects
        plan.rows += part.rows
    blobs = ckpt.tokenizer_blobs()
    for name, data in sorted(blobs.items()):
        plan.objects.append(blob_object(f"tokenizer/{name}", data))
        plan.rows.append(InventoryRow(f"tokenizer/{name}", name, "uint8", (len(data),), F.PLAIN, len(data), note="blob"))
    plan.metadata = {
        "config": ckpt.config,
        "chat_template": ckpt.chat_template(),
        "tokenizer": {"format": "hf-tokenizers", "files": sorted(f"tokenizer/{n}" for n in blobs),
                      **_special_ids(ckpt, fmap.text_config)},
        "source": {"format": "hf-safetensors", "tensors": len(ckpt.tensors), "ignored": len(fmap.ignored),
                   "name_map": f"modeld.convert.families/{fmap.family}"},
    }
    return plan
