"""Fill a Hugging Face `Qwen3_5ForCausalLM` with `modeld synth` weights, without files.

`modeld synth` values are a pure function of (seed, tensor name, chunk index)
(`modeld.convert.synth.chunk_values`). Streaming those same chunks straight into the parameters of
an HF model (on any device) gives bit-for-bit the model that
`AutoModelForCausalLM.from_pretrained(<synth dir>, dtype=torch.bfloat16)` would give,
minus 54 GB of disk traffic for the 27B shape. tests/qualify/test_synth_stream.py proves the
equality on the `tiny` and `odd` presets against files written by `write_synthetic`.

Name map: synth's `model.language_model.X` -> HF ForCausalLM `model.X`; `lm_head.weight` as is;
`mtp.*` is not part of the HF text model and is skipped. F32-stored tensors (A_log, the GDN norm
weight of the 27B preset) are rounded into bf16 parameters exactly as from_pretrained's cast does.

Needs torch + transformers + numpy. Mutates only the model's parameters. Raises
`SynthStreamMismatch` when the model's parameters and the synth inventory differ.
"""

from __future__ import annotations

import math
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from modeld.convert.qwen3_5_spec import TEXT_PREFIX, Qwen35Shape, checkpoint_inventory, hf_config
from modeld.convert.synth import CHUNK_ELEMS, chunk_values
from modeld.errors import ModeldError


class SynthStreamMismatch(ModeldError):
    """The HF model's parameter names/shapes do not match the synth inventory."""


def hf_text_config(shape: Qwen35Shape):
    """A `Qwen3_5TextConfig` with exactly the text fields synth writes into config.json."""
    from transformers import Qwen3_5TextConfig

    text = dict(hf_config(shape)["text_config"])
    text.pop("model_type", None)
    return Qwen3_5TextConfig(**text)


def hf_name(synth_name: str) -> str | None:
    """HF ForCausalLM parameter name for a synth tensor name (None: not in the text model)."""
    if synth_name.startswith(TEXT_PREFIX):
        return "model." + synth_name[len(TEXT_PREFIX):]
    if synth_name == "lm_head.weight":
        return synth_name
    return None


def match_parameters(model, shape: Qwen35Shape) -> dict:
    """{HF parameter name: synth TensorSpec}; raises SynthStreamMismatch unless they pair 1:1."""
    params = dict(model.named_parameters())
    wanted = {hf_name(s.name): s for s in checkpoint_inventory(shape, include_mtp=False)}
    if set(wanted) != set(params):
        missing, extra = sorted(set(wanted) - set(params)), sorted(set(params) - set(wanted))
        raise SynthStreamMismatch(f"synth-only {missing[:4]}, model-only {extra[:4]}")
    for name, spec in wanted.items():
        if tuple(params[name].shape) != tuple(spec.shape):
            raise SynthStreamMismatch(f"{name}: model {tuple(params[name].shape)} vs synth {spec.shape}")
    return wanted


def stream_into(model, shape: Qwen35Shape, seed: int, workers: int = 8, progress=None) -> int:
    """Overwrite every parameter of `model` (a Qwen3_5ForCausalLM) with synth's values.

    Chunks are generated on the CPU by `workers` threads (numpy and torch release the GIL), rounded
    to bf16 on the CPU with torch (round-to-nearest-even, as synth's writer does) and copied into the
    parameter. `progress(done_elems, total_elems)` is called after each chunk if given.
    Returns the number of elements written.
    """
    import torch

    params = dict(model.named_parameters())
    wanted = match_parameters(model, shape)
    total = sum(math.prod(s.shape) for s in wanted.values())

    def job(spec, chunk, count):
        vals = torch.from_numpy(chunk_values(spec, seed, chunk, count))
        return vals.to(torch.bfloat16) if spec.dtype == "BF16" else vals

    jobs = ((n, s, c, min(CHUNK_ELEMS, math.prod(s.shape) - c * CHUNK_ELEMS))
            for n, s in wanted.items()
            for c in range(max(1, math.ceil(math.prod(s.shape) / CHUNK_ELEMS))))
    done = 0
    with torch.no_grad(), ThreadPoolExecutor(workers) as pool:
        pending: deque = deque()

        def submit() -> bool:
            item = next(jobs, None)
            if item is None:
                return False
            name, spec, chunk, count = item
            pending.append((name, chunk, count, pool.submit(job, spec, chunk, count)))
            return True

        while len(pending) < 3 * workers and submit():
            pass
        while pending:
            name, chunk, count, fut = pending.popleft()
            submit()
            flat = params[name].data.view(-1)
            flat[chunk * CHUNK_ELEMS: chunk * CHUNK_ELEMS + count].copy_(fut.result())
            done += count
            if progress is not None:
                progress(done, total)
    return done
