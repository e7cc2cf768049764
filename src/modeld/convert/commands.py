"""Entry points `modeld synth|convert|inspect|verify|export-gguf` (each: argv -> exit code).

`modeld.cli` dispatches here; `python -m modeld.convert.commands <sub> ...` works as well.
A `ModeldError` escapes to the caller (cli.py prints it as one line and exits 2); when run as
`__main__` this module does the same itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path


_LM_HEAD_HELP = ("lm_head weights: bf16 (default; the artifact of every earlier release), or the --profile's own "
                 "format: fp8 (with --profile fp8) or int4 g128 (with --profile int4), which shrinks the logits "
                 "GEMV's per-token read (2.54 GB bf16 at 27B) to 1/2 or ~1/4 at the largest quality cost per byte "
                 "of any tensor; or fp8 with --profile int4 (half the bf16 head's bytes at a quarter of the int4 "
                 "head's error). Recorded in the recipe: a different weights_id than the bf16-head artifact")


def _synth_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="modeld synth",
        description="Write a seeded synthetic Hugging Face checkpoint with the exact tensor names, "
                    "shapes and dtypes of the real model (text + MTP tensors; vision tensors are "
                    "omitted), a config.json that transformers loads, and a real byte-level BPE "
                    "tokenizer with the model's special-token ids and a chat template. Values are "
                    "a pure function of (seed, tensor name): the same command always writes the "
                    "same bytes. Tensors are streamed chunk by chunk into ~3 GB shards, so memory "
                    "stays small even for the 27B shape (54 GB). With --to-mspec, skips the "
                    "checkpoint files and writes the .mspec artifact that `modeld convert --profile P` "
                    "of that checkpoint would write, byte for byte (plus its inventories). With "
                    "--identity, writes nothing and prints that artifact's identity as JSON "
                    "(model_id, weights_id, tokenizer_id, recipe_hash, sizes).",
        epilog="examples:\n  modeld synth --config tiny --seed 0 -o /tmp/ckpt\n"
               "  modeld synth --config 27b --seed 0 --to-mspec /tmp/q27.mspec --profile int4 --device cuda\n"
               "  modeld synth --config 27b --seed 0 --identity --profile int4 --workers 1",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="qwen3_5", choices=["qwen3_5"], help="model family (default qwen3_5)")
    p.add_argument("--config", required=True, choices=["27b", "tiny", "small", "odd"],
                   help="27b: exact Qwen3.8-27B shapes; tiny/small: small shapes where every K is a "
                        "multiple of 128; odd: awkward sizes (7 layers, odd vocab, BF16 GDN params)")
    p.add_argument("--layers", type=int, default=None,
                   help="override the depth (layer i is full attention iff i %% 4 == 3)")
    p.add_argument("--seed", type=int, required=True, help="seed (non-negative integer)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("-o", "--output", type=Path, help="output checkpoint directory (new or empty)")
    what.add_argument("--to-mspec", type=Path, metavar="OUT.mspec",
                      help="write the converted .mspec artifact directly (no checkpoint files)")
    what.add_argument("--identity", action="store_true",
                      help="print the identity of the converted artifact as JSON; write nothing")
    p.add_argument("--workers", type=int, default=None, help="generator threads (default: CPUs, max 16)")
    p.add_argument("--shard-gb", type=float, default=3.0, help="target shard size in GB (default 3; -o only)")
    p.add_argument("--no-mtp", action="store_true", help="omit the mtp.* tensors")
    p.add_argument("--profile", default="bf16", choices=["bf16", "fp8", "int4"],
                   help="weight profile of the artifact (--to-mspec/--identity; as `modeld convert`)")
    p.add_argument("--lm-head", default="bf16", choices=["bf16", "fp8", "int4"],
                   help="--to-mspec/--identity, as `modeld convert`: " + _LM_HEAD_HELP)
    p.add_argument("--device", default="cpu",
                   help="device that quantizes fp8/int4 linears, e.g. cuda (bit-identical to cpu; default cpu)")
    p.add_argument("--model-id", default=None, help="model identity to record (default: the synth model id)")
    p.add_argument("--force", action="store_true", help="replace an existing --to-mspec file")
    p.add_argument("--hash-workers", type=int, default=1, help="--identity: hashing threads (default 1)")
    p.add_argument("--prefetch-gb", type=float, default=4.0,
                   help="--to-mspec/--identity: tensors generated ahead of the writer, in GB (default 4)")
    return p


def synth_main(argv: list[str]) -> int:
    """Write a synthetic checkpoint; prints one summary line. Raises ConvertError subclasses."""
    from modeld.convert.errors import SynthConfigError
    from modeld.convert.qwen3_5_spec import preset
    from modeld.convert.synth import write_synthetic

    args = _synth_parser().parse_args(argv)
    if args.seed < 0:
        raise SynthConfigError(f"--seed must be >= 0, got {args.seed}")
    if args.shard_gb <= 0:
        raise SynthConfigError("--shard-gb must be positive")
    if args.workers is not None and args.workers < 1:
        raise SynthConfigError(f"--workers must be >= 1, got {args.workers}")
    shape = preset(args.config, args.layers)
    if args.output is None:
        return _synth_artifact(args, shape)
    start = time.perf_counter()
    result = write_synthetic(shape, args.seed, args.output, workers=args.workers,
                             shard_bytes=int(args.shard_gb * 1e9), include_mtp=not args.no_mtp)
    seconds = time.perf_counter() - start
    print(f"wrote {result.model_id}: {result.tensors} tensors, {result.total_bytes / 1e9:.3f} GB "
          f"in {result.shards} shard(s) to {result.out_dir} ({seconds:.1f} s)")
    return 0


def _check_device(device: str) -> str | None:
    """None for cpu (quantize in place), else the device string once torch accepts it."""
    from modeld.convert.errors import DeviceError

    if device == "cpu":
        return None
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise DeviceError(f"--device {device!r}: {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"--device {device}: CUDA is not available here")
    return device


def _synth_artifact(args, shape) -> int:
    """--to-mspec / --identity: the converted artifact of the synth checkpoint, with no files between."""
    from modeld.convert.errors import SynthConfigError

    if args.prefetch_gb < 0 or args.hash_workers < 1:
        raise SynthConfigError("--prefetch-gb must be >= 0 and --hash-workers >= 1")
    device = _check_device(args.device)
    prefetch = int(args.prefetch_gb * 1e9)
    start = time.perf_counter()
    if args.identity:
        from modeld.convert.identity_preview import synth_identity

        ident = synth_identity(args.config, args.seed, args.profile, layers=args.layers,
                               include_mtp=not args.no_mtp, model_id=args.model_id, device=device,
                               workers=args.workers, hash_workers=args.hash_workers, prefetch_bytes=prefetch,
                               lm_head=args.lm_head)
        print(json.dumps({**ident.as_json(), "seconds": round(time.perf_counter() - start, 1)}, indent=2))
        return 0
    from modeld.convert.synth_source import write_synth_mspec

    result = write_synth_mspec(shape, args.seed, args.profile, args.to_mspec, include_mtp=not args.no_mtp,
                               model_id=args.model_id, device=device, workers=args.workers,
                               overwrite=args.force, prefetch_bytes=prefetch, lm_head=args.lm_head)
    _print_emitted(result)
    return 0


def _print_emitted(result) -> None:
    d = result.directory
    print(f"wrote {result.path} ({result.path.stat().st_size / 1e6:.1f} MB, {len(d.objects)} objects, "
          f"{result.seconds:.1f} s)\n  model_id   {d.model_id}\n  weights_id {d.weights_id}\n"
          f"  recipe     {d.recipe_hash} ({d.recipe.get('profile')}, lm_head {d.recipe.get('lm_head')})\n"
          f"  inventory  {result.inventory_json} / {result.inventory_txt.name}")


def _convert_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="modeld convert",
        description="Convert a checkpoint to one .mspec artifact. SRC is a Hugging Face checkpoint "
                    "directory (qwen3_5 in the released `model.language_model.*` or text-only "
                    "`model.*` layout, or llama/SmolLM2) or a llama-family .gguf file. Names are "
                    "translated once through the family's map; missing or leftover tensors and "
                    "shape/dtype mismatches are errors. The tokenizer and chat template travel "
                    "inside the artifact. Also writes OUT.inventory.json and OUT.inventory.txt "
                    "(every object, its layout and its quantization error). With --identity instead "
                    "of -o, writes nothing and prints the artifact's identity as JSON.")
    p.add_argument("source", type=Path, help="HF checkpoint directory or .gguf file")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("-o", "--output", type=Path, help="output .mspec path")
    what.add_argument("--identity", action="store_true",
                      help="print the identity the artifact would have (model_id, weights_id, ...) as "
                           "JSON; runs the whole conversion but writes no file")
    p.add_argument("--profile", default=None, choices=["bf16", "fp8", "int4"],
                   help="linear-layer weights: bf16 (default for checkpoint directories); fp8 e4m3 "
                        "with per-output-channel fp32 scales; int4 asymmetric groupwise g128 (default "
                        "for .gguf: Q4_1 blocks are kept losslessly as int4 g32). "
                        "Embeddings, norms, conv, A_log, dt_bias stay as stored; lm_head as --lm-head")
    p.add_argument("--lm-head", default="bf16", choices=["bf16", "fp8", "int4"],
                   help=_LM_HEAD_HELP + " (checkpoint directories only)")
    p.add_argument("--model-id", default=None,
                   help="model identity to record (default: synth.json's, config _name_or_path, or "
                        "for GGUF <general.organization>/<file name before the first dot>)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.add_argument("--device", default="cpu",
                   help="device that quantizes fp8/int4 linears of a checkpoint directory, e.g. cuda "
                        "(bit-identical to cpu; default cpu)")
    return p


def convert_main(argv: list[str]) -> int:
    """Convert SRC to OUT.mspec (+ inventories); prints identity and timing. Raises ModeldError."""
    from modeld.convert.emit import emit
    from modeld.convert.errors import SourceNotFoundError

    args = _convert_parser().parse_args(argv)
    if args.source.is_dir():
        from modeld.convert.hf_convert import plan_hf

        plan = plan_hf(args.source, args.profile or "bf16", args.model_id, device=_check_device(args.device),
                       measure_error=not args.identity, lm_head=args.lm_head)
    elif args.source.is_file() and args.source.suffix == ".gguf":
        from modeld.convert.gguf_import import plan_gguf

        if args.device != "cpu":
            from modeld.convert.errors import DeviceError

            raise DeviceError("--device applies to checkpoint directories only (GGUF import runs on the CPU)")
        if args.lm_head != "bf16":
            from modeld.convert.errors import UnknownProfileError

            raise UnknownProfileError("--lm-head applies to checkpoint directories only (GGUF imports keep it bf16)")
        plan = plan_gguf(args.source, args.profile, args.model_id)
    else:
        raise SourceNotFoundError(f"{args.source} is neither a checkpoint directory nor a .gguf file")
    if args.identity:
        from modeld.convert.identity_preview import preview_identity

        print(json.dumps(preview_identity(plan).as_json(), indent=2))
        return 0
    result = emit(plan, args.output, overwrite=args.force)
    _print_emitted(result)
    return 0


def _file_parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("file", type=Path, help=".mspec file")
    return p


def inspect_main(argv: list[str]) -> int:
    """Print identity, recipe and an inventory summary (structure checked, payload not hashed)."""
    from collections import Counter

    from modeld.mspec import open_mspec

    p = _file_parser("modeld inspect", "Show a .mspec file's identity (model_id, weights_id, tokenizer_id), "
                     "recipe and inventory summary. Validates the header, directory and tiling; use "
                     "`modeld verify` to re-hash the payload.")
    p.add_argument("--objects", action="store_true", help="list every object")
    p.add_argument("--json", action="store_true", help="print the directory (without objects) as JSON")
    args = p.parse_args(argv)
    with open_mspec(args.file) as m:
        d = m.directory
        if args.json:
            print(json.dumps({"model_id": d.model_id, "weights_id": d.weights_id, "tokenizer_id": d.tokenizer_id,
                              "family": d.family, "recipe": dict(d.recipe), "recipe_hash": d.recipe_hash,
                              "payload_length": d.payload_length, "objects": len(d.objects)}, indent=2))
            return 0
        by = Counter()
        size = Counter()
        for o in d.objects:
            by[(o.kind, o.dtype, o.layout)] += 1
            size[(o.kind, o.dtype, o.layout)] += o.length
        print(f"file         {args.file} ({m.size / 1e6:.3f} MB)\nmodel_id     {d.model_id}\n"
              f"weights_id   {d.weights_id}\ntokenizer_id {d.tokenizer_id}\nfamily       {d.family}\n"
              f"recipe_hash  {d.recipe_hash}\nrecipe       {json.dumps(dict(d.recipe), sort_keys=True)}\n"
              f"metadata     {', '.join(sorted(d.metadata))}\nobjects      {len(d.objects)}")
        for key in sorted(by):
            print(f"  {by[key]:6d} x {key[0]:6s} {key[1]:14s} {key[2]:34s} {size[key] / 1e6:12.3f} MB")
        if args.objects:
            for o in d.objects:
                print(f"  {o.name:60s} {o.dtype:14s} {str(list(o.shape)):18s} {o.layout}")
    return 0


def verify_main(argv: list[str]) -> int:
    """Re-hash every object; print OK line or raise the named MspecError (exit 2 via the CLI)."""
    from modeld.convert.progress import byte_progress
    from modeld.mspec import open_mspec

    args = _file_parser("modeld verify", "Fully validate a .mspec file: header, directory hash, schema, "
                        "tiling, identities, then re-hash every object and check every padding byte. "
                        "Exits non-zero with a one-line named error on the first failure.").parse_args(argv)
    start = time.perf_counter()
    with open_mspec(args.file) as m:
        with byte_progress("verify", sum(o.length for o in m.objects)) as bar:
            hashed = m.verify(bar)
        print(f"OK {args.file}: {len(m.objects)} objects, {hashed / 1e6:.3f} MB hashed in "
              f"{time.perf_counter() - start:.1f} s; weights_id {m.directory.weights_id}")
    return 0


def _export_gguf_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="modeld export-gguf",
        description="Write a qwen3_5 Hugging Face checkpoint (the text model; MTP left out) as a GGUF file for "
                    "llama.cpp's qwen35 architecture: the fall-through backend and the second control of the "
                    "engine's certification. Norm weights, A_log, the conv kernel and the value-head order are "
                    "transformed the way llama.cpp's loader reads them; the tokenizer comes from tokenizer.json. "
                    "With --synth, the tensors of `modeld synth --config C --seed N` are generated on the fly (no "
                    "checkpoint on disk: the 27B is 54 GB). Memory holds one tensor at a time (plus --synth's "
                    "prefetch); the file appears only when complete.",
        epilog="examples:\n  modeld synth --config small --seed 0 -o /tmp/ckpt\n"
               "  modeld export-gguf /tmp/ckpt -o /tmp/small.gguf --outtype f32\n"
               "  modeld export-gguf --synth 27b --seed 0 -o /dev/shm/q27-bf16.gguf",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", type=Path, nargs="?", help="Hugging Face checkpoint directory (config.json, "
                                                        "*.safetensors, tokenizer.json); or give --synth")
    p.add_argument("--synth", choices=["27b", "tiny", "small", "odd"], default=None,
                   help="export the synthetic checkpoint of this preset instead of a directory")
    p.add_argument("--seed", type=int, default=0, help="--synth: the seed (default 0)")
    p.add_argument("--workers", type=int, default=None, help="--synth: generator threads (default: CPUs, max 16)")
    p.add_argument("-o", "--output", type=Path, required=True, help="the .gguf file to write")
    p.add_argument("--outtype", default="bf16", choices=["f32", "f16", "bf16"],
                   help="matrix storage (1-D tensors and the conv kernel stay f32; default bf16)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    return p


def export_gguf_main(argv: list[str]) -> int:
    """Export SOURCE (or --synth) to a qwen35 GGUF with a progress bar; prints a JSON summary. Raises ModeldError."""
    from modeld.convert.gguf_export import GGUFExportError, export, open_checkpoint, plan, synth_checkpoint
    from modeld.convert.progress import byte_progress

    p = _export_gguf_parser()
    args = p.parse_args(argv)
    if (args.source is None) == (args.synth is None):
        raise GGUFExportError("give a checkpoint directory or --synth PRESET (one of them)")
    t0 = time.perf_counter()
    source = (synth_checkpoint(args.synth, args.seed, args.workers) if args.synth
              else contextlib.nullcontext(open_checkpoint(args.source)))
    with source as ckpt:
        _, todo = plan(ckpt)
        with byte_progress(f"export-gguf {args.output.name}", sum(math.prod(s) for _, s in todo)) as sink:
            summary = export(ckpt, args.output, args.outtype, overwrite=args.force, progress=sink)
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(summary, indent=2))
    return 0


COMMANDS = {"synth": synth_main, "convert": convert_main, "inspect": inspect_main, "verify": verify_main,
            "export-gguf": export_gguf_main}


def main(argv: list[str] | None = None) -> int:
    """`python -m modeld.convert.commands <sub> ...`: dispatch and print ModeldErrors as one line."""
    from modeld.errors import ModeldError

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m modeld.convert.commands {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]](argv[1:])
    except ModeldError as err:
        print(err.one_line(), file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
