"""Streaming synth values into an HF model equals loading the files `modeld synth` writes."""

from __future__ import annotations

import pytest
import torch

from modeld.convert.qwen3_5_spec import preset
from modeld.qualify.synth_stream import SynthStreamMismatch, hf_text_config, stream_into


@pytest.mark.parametrize("name", ["tiny", "odd"])
def test_stream_equals_from_pretrained(synth_ckpt, name):
    from transformers import AutoModelForCausalLM, Qwen3_5ForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(synth_ckpt(name), dtype=torch.bfloat16)
    assert type(ref) is Qwen3_5ForCausalLM
    ref_sd = ref.state_dict()
    model = Qwen3_5ForCausalLM._from_config(hf_text_config(preset(name)), dtype=torch.bfloat16)
    n = stream_into(model, preset(name), 0, workers=2)
    sd = model.state_dict()
    assert set(sd) == set(ref_sd) and n == sum(p.numel() for p in model.parameters())
    assert [k for k in sd if not torch.equal(sd[k], ref_sd[k])] == []


def test_mismatched_model_is_rejected():
    from transformers import Qwen3_5ForCausalLM

    model = Qwen3_5ForCausalLM._from_config(hf_text_config(preset("tiny", layers=3)))
    with pytest.raises(SynthStreamMismatch):
        stream_into(model, preset("tiny"), 0, workers=1)
