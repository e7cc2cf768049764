"""Direct synth -> .mspec and the identity preview: both must equal `modeld synth` + `modeld convert`."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from modeld.convert import errors as CE
from modeld.convert.commands import main as commands_main, synth_main
from modeld.convert.emit import emit, inventory_paths
from modeld.convert.hf_convert import plan_hf
from modeld.convert.hf_source import HFCheckpoint
from modeld.convert.identity_preview import preview_identity, synth_identity
from modeld.convert.qwen3_5_spec import preset
from modeld.convert.synth_source import SynthCheckpoint, write_synth_mspec
from modeld.mspec import format as F

# weights_id of `modeld synth` + `modeld convert` as written by the converter *before* quantize.py
# learned device-exact division (commit 979d1bc): the change must not move a single CPU byte.
GOLDEN = {
    ("tiny", 0, "bf16"): "sha256:f5abe552f45aa73e10d535f2c7180ef4438d6b7c559c9c14fe8aca6aadc47a83",
    ("tiny", 0, "fp8"): "sha256:f7d73efab103762f025a5bb1be20b5ecaf0c20232d1db144386f3351f4ce4d09",
    ("tiny", 0, "int4"): "sha256:43ea495600c51ed4c2f96f25371f435b5ff4a180468796b19155c85c3753eebc",
    ("small", 1, "int4"): "sha256:adffb23521350ac487f06b0e73e42f9c7597592c9148a19872b22f7c44475d77",
}


def _directory_bytes(path) -> bytes:
    raw = path.read_bytes()
    n = int.from_bytes(raw[16:24], "little")
    return raw[F.HEADER_SIZE:F.HEADER_SIZE + n]


CASES = [("tiny", 7, "bf16"), ("tiny", 7, "fp8"), ("tiny", 7, "int4"), ("odd", 3, "bf16"), ("odd", 3, "fp8")]


@pytest.mark.parametrize("config,seed,profile", CASES)
def test_direct_and_preview_equal_synth_then_convert(config, seed, profile, tiny_ckpt, odd_ckpt, tmp_path):
    ckpt = {"tiny": tiny_ckpt, "odd": odd_ckpt}[config]
    ref = emit(plan_hf(ckpt, profile), tmp_path / "ref.mspec")
    direct = write_synth_mspec(preset(config), seed, profile, tmp_path / "direct.mspec", workers=2,
                               prefetch_bytes=200_000)
    assert direct.path.read_bytes() == ref.path.read_bytes()
    for a, b in zip(inventory_paths(ref.path), inventory_paths(direct.path)):
        assert a.read_bytes() == b.read_bytes()          # error columns included (CPU quantization)
    ident = synth_identity(config, seed, profile, workers=1, hash_workers=1 if profile == "bf16" else 3)
    assert (ident.model_id, ident.weights_id, ident.tokenizer_id, ident.recipe_hash) == (
        ref.directory.model_id, ref.directory.weights_id, ref.directory.tokenizer_id, ref.directory.recipe_hash)
    assert ident.model_id == f"synthetic/qwen3_5-{config}-L{preset(config).layers}-seed{seed}"
    raw = _directory_bytes(ref.path)
    assert ident.directory_sha256 == hashlib.sha256(raw).hexdigest()   # the whole directory, offsets too
    assert ident.file_bytes == ref.path.stat().st_size
    assert ident.objects == ref.directory.objects


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_identity_matches_pinned_converter_output(key):
    config, seed, profile = key
    assert synth_identity(config, seed, profile, workers=2, prefetch_bytes=0).weights_id == GOLDEN[key]


def test_preview_of_any_plan_and_no_mtp(tiny_ckpt, tmp_path):
    plan = plan_hf(tiny_ckpt, "int4", "test/other-id", measure_error=False)
    ident = preview_identity(plan, hash_workers=2)
    ref = emit(plan_hf(tiny_ckpt, "int4", "test/other-id"), tmp_path / "r.mspec")
    assert ident.directory_sha256 == hashlib.sha256(_directory_bytes(ref.path)).hexdigest()
    no_mtp = synth_identity("tiny", 7, "int4", include_mtp=False, workers=2)
    assert not any(o.name.startswith("mtp.") for o in no_mtp.objects)
    assert no_mtp.weights_id != ident.weights_id


def test_odd_int4_is_refused_the_same_way(odd_ckpt, tmp_path):
    with pytest.raises(CE.QuantizationShapeError):
        plan_hf(odd_ckpt, "int4")
    with pytest.raises(CE.QuantizationShapeError):
        synth_identity("odd", 3, "int4")
    with pytest.raises(CE.QuantizationShapeError):
        write_synth_mspec(preset("odd"), 3, "int4", tmp_path / "x.mspec")
    assert not list(tmp_path.iterdir())


def test_virtual_checkpoint_matches_files_in_any_load_order(tiny_ckpt):
    disk = HFCheckpoint(tiny_ckpt)
    virt = SynthCheckpoint(preset("tiny"), 7, workers=3, prefetch_bytes=50_000)
    try:
        assert virt.config == disk.config and virt.tokenizer_blobs() == disk.tokenizer_blobs()
        assert virt.chat_template() == disk.chat_template()
        assert virt.json_file("synth.json") == disk.json_file("synth.json")
        assert {n: (t.dtype, t.shape) for n, t in virt.tensors.items()} == {
            n: (t.dtype, t.shape) for n, t in disk.tensors.items()}
        names = sorted(virt.tensors)
        virt.expect(names)
        order = names[::2] + names[1::2][::-1]            # half as announced, half out of order
        for name in order:
            a, b = virt.load(name), disk.load(name)
            assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    finally:
        virt.close()


def test_cli_to_mspec_identity_and_errors(tiny_ckpt, tmp_path, capsys):
    ref = emit(plan_hf(tiny_ckpt, "fp8"), tmp_path / "ref.mspec")
    out = tmp_path / "cli.mspec"
    base = ["--config", "tiny", "--seed", "7", "--workers", "2", "--profile", "fp8"]
    assert synth_main(base + ["--to-mspec", str(out)]) == 0
    assert out.read_bytes() == ref.path.read_bytes()
    assert f"weights_id {ref.directory.weights_id}" in capsys.readouterr().out
    with pytest.raises(CE.OutputExistsError):
        synth_main(base + ["--to-mspec", str(out)])
    assert synth_main(base + ["--to-mspec", str(out), "--force"]) == 0
    capsys.readouterr()
    assert synth_main(base + ["--identity", "--hash-workers", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["weights_id"] == ref.directory.weights_id and doc["profile"] == "fp8"
    assert doc["file_bytes"] == out.stat().st_size
    assert commands_main(["synth"] + base + ["--identity", "--device", "nonsense:x"]) == 2
    assert capsys.readouterr().err.startswith("DeviceError:")
    if not torch.cuda.is_available():
        assert commands_main(["synth"] + base + ["--identity", "--device", "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
    with pytest.raises(SystemExit):                       # exactly one of -o / --to-mspec / --identity
        synth_main(base + ["--identity", "-o", str(tmp_path / "d")])
    assert commands_main(["convert", str(tiny_ckpt), "--profile", "fp8", "--identity"]) == 0
    assert json.loads(capsys.readouterr().out)["weights_id"] == ref.directory.weights_id
