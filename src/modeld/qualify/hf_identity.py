"""The `weights_id` (and whole identity) `modeld convert --profile P` would record for a synth
checkpoint, computed from an HF model that already holds its weights — no second generation.

The converter's own path does all the work: `synth_source.SynthCheckpoint` (the virtual `modeld
synth` directory: config, side files, tensor inventory incl. MTP), `hf_convert.plan_checkpoint`
(family map, recipe, quantizers), `identity_preview.preview_identity` (the writer's byte
conversion, inventory and directory). The only change is where tensor values come from:
`HFBackedCheckpoint.load` hands out the HF model's parameter for every BF16 tensor the HF text
model holds (bit-identical to synth's values: modeld.qualify.synth_stream) and lets synth generate
the rest (the F32 GDN parameters, the MTP head). For a quantized profile the linears stay on the
model's device, so the converter quantizes them there (its device-exact functions) without a
host round trip.

Needs the converter's identity preview (modeld.convert.identity_preview); raises
IdentityUnavailable when it is missing. Reads the HF parameters, mutates nothing.
"""

from __future__ import annotations

from modeld.convert.qwen3_5_spec import TEXT_PREFIX, Qwen35Shape
from modeld.errors import ModeldError
from modeld.qualify.synth_stream import hf_name, match_parameters


class IdentityUnavailable(ModeldError):
    """This converter has no identity preview (modeld.convert.identity_preview)."""


def _checkpoint_class():
    try:
        from modeld.convert.synth_source import SynthCheckpoint
    except ImportError as exc:  # the converter predates the virtual synth checkpoint
        raise IdentityUnavailable(f"modeld.convert.synth_source is missing: {exc}") from exc
    return SynthCheckpoint


def hf_backed_checkpoint(model, shape: Qwen35Shape, seed: int, profile: str, workers: int | None = None,
                         lm_head: str = "bf16"):
    """A SynthCheckpoint whose BF16 text tensors are read from `model` (see module doc)."""
    from modeld.convert.families import _qwen_role

    base = _checkpoint_class()
    match_parameters(model, shape)
    params = dict(model.named_parameters())

    class HFBackedCheckpoint(base):
        def __init__(self) -> None:
            super().__init__(shape, seed, include_mtp=True, workers=workers)
            self.served = {n for n, s in self.specs.items() if s.dtype == "BF16" and hf_name(n) in params}
            quantized = profile in ("fp8", "int4")
            self.on_device = {n for n in self.served if quantized and n.startswith(TEXT_PREFIX)
                              and _qwen_role(n.removeprefix(TEXT_PREFIX)) == "linear"}
            if lm_head != "bf16":       # `--lm-head P`: quantized beside the linears
                self.on_device.add("lm_head.weight")

        def expect(self, names) -> None:  # prefetch only what synth still has to generate
            super().expect([n for n in names if n not in self.served])

        def load(self, name: str):
            if name not in self.served:
                return super().load(name)
            t = params[hf_name(name)].detach()
            return t if name in self.on_device else t.to("cpu")

    return HFBackedCheckpoint()


def hf_identity(model, shape: Qwen35Shape, seed: int, profile: str, *, device: str | None = None,
                workers: int | None = None, hash_workers: int = 4, lm_head: str = "bf16"):
    """`identity_preview.ArtifactIdentity` of `modeld synth` (shape, seed) converted with `profile`
    (and `--lm-head lm_head`), from the weights in `model`. Raises IdentityUnavailable, and what the
    converter raises."""
    try:
        from modeld.convert.hf_convert import plan_checkpoint
        from modeld.convert.identity_preview import preview_identity
        from modeld.convert.synth_source import load_order
    except ImportError as exc:
        raise IdentityUnavailable(f"the converter has no identity preview: {exc}") from exc

    ckpt = hf_backed_checkpoint(model, shape, seed, profile, workers, lm_head)
    try:
        plan = plan_checkpoint(ckpt, profile, None, device=device, measure_error=False, lm_head=lm_head)
        ckpt.expect(load_order(plan))
        return preview_identity(plan, hash_workers=hash_workers)
    finally:
        ckpt.close()
