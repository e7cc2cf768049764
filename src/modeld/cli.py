"""The `modeld` command (also `python -m modeld`).

    modeld run [PROMPT]      stream a chat completion (or --raw completion) to the terminal
    modeld serve             the HTTP server (OpenAI-compatible + native session API)
    modeld resolve|cells|host|models ...   selection and artifacts (T3)
    modeld synth|convert|inspect|verify ...   checkpoint conversion (.mspec)

Every failure exits non-zero with exactly one line on stderr: `Name: message` (exit 2) for a
named ModeldError, `InternalError: ...` (exit 70) for a bug, exit 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from modeld import __version__
from modeld.errors import ModeldError

DISPATCH = {
    "resolve": ("modeld.distribution.commands", "resolve_main", "which cell would serve a model here, and why not the others"),
    "cells": ("modeld.distribution.commands", "cells_main", "list the cell manifests"),
    "host": ("modeld.distribution.commands", "host_main", "show this host's facts (CPU, GPUs, memory)"),
    "models": ("modeld.distribution.commands", "models_main", "list / add / remove installed models"),
    "synth": ("modeld.convert.commands", "synth_main", "write a synthetic checkpoint (.mspec)"),
    "convert": ("modeld.convert.commands", "convert_main", "convert a checkpoint to .mspec (bf16/fp8/int4)"),
    "inspect": ("modeld.convert.commands", "inspect_main", "describe an .mspec file"),
    "verify": ("modeld.convert.commands", "verify_main", "check an .mspec file's integrity"),
    "export-gguf": ("modeld.convert.commands", "export_gguf_main",
                    "write a qwen3_5 checkpoint as GGUF for llama.cpp (qwen35)"),
}


class UsageError(ModeldError):
    """Bad command-line arguments."""


class ModuleMissing(ModeldError):
    """A subcommand's implementation is not part of this installation."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="modeld", description="Serve LLM sessions through certified cells; "
                "llama.cpp everywhere else. The embedded default model is SmolLM2-135M-Instruct.",
                epilog="Run `modeld COMMAND --help` for the options of each command.")
    p.add_argument("--version", action="version", version=f"modeld {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="stream a completion for PROMPT to the terminal",
                         description="Generate a reply to PROMPT (read from stdin when omitted) and "
                         "stream it to stdout. By default the model's chat template is applied.")
    run.add_argument("prompt", nargs="?", help="the prompt text (default: read stdin)")
    run.add_argument("--model", default=None,
                     help="model name, registry name, or a .gguf/.mspec path (default: smollm2). An .mspec "
                     "that no certified cell lists runs on the engine_reference cell: reference kernels "
                     "on the CPU (correct, uncertified, slow)")
    run.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    run.add_argument("--temperature", type=float, default=0.7, help="0 = greedy; up to 2 (default 0.7)")
    run.add_argument("--top-k", type=int, default=40, help="0 disables (default 40)")
    run.add_argument("--top-p", type=float, default=0.95, help="nucleus mass in (0, 1] (default 0.95)")
    run.add_argument("--seed", type=int, default=None, help="sampling seed (same seed, same text)")
    run.add_argument("--system", default=None, help="a system message to put before PROMPT")
    run.add_argument("--raw", action="store_true",
                     help="plain completion of PROMPT: no chat template; prints only the generated text")
    run.add_argument("--n-ctx", type=int, default=2048, help="context length in tokens (default 2048)")
    run.add_argument("--trace", action="store_true",
                     help="print the turn's token accounting and the serving cell's identity (cell_id, "
                     "backend/kernels, profile) as one JSON line to stderr")
    run.add_argument("--require-cell", default=None, metavar="CELL_ID",
                     help="fail (Fallback) unless selection picks this cell, instead of falling through")

    serve = sub.add_parser("serve", help="run the HTTP server",
                           description="Serve the OpenAI-compatible API (/v1/models, /v1/completions, "
                           "/v1/chat/completions), the native session API (/v1/sessions/...), "
                           "/metrics and /healthz.")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--model", default=None,
                       help="default model, loaded at start: a name or a .gguf/.mspec path (default: smollm2)")
    serve.add_argument("--n-ctx", type=int, default=2048, help="context length per cell (default 2048)")
    serve.add_argument("--max-queue", type=int, default=8, help="requests running or waiting before 429 (default 8)")
    serve.add_argument("--context-policy", choices=("clamp", "reject"), default="clamp",
                       help="prompt + max_tokens > context: clamp max_tokens, or reject (default clamp)")
    serve.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")

    for name, (_, _, help_text) in DISPATCH.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return p


def _dispatch(name: str, argv: list[str]) -> int:
    module_name, func_name, _ = DISPATCH[name]
    try:
        module = importlib.import_module(module_name)
        func = getattr(module, func_name)
    except (ImportError, AttributeError) as exc:
        raise ModuleMissing(f"`modeld {name}` is not available in this build ({module_name}.{func_name}: {exc})") from None
    return int(func(argv) or 0)


def _read_prompt(args) -> str:
    if args.prompt is not None:
        return args.prompt
    if sys.stdin is None or sys.stdin.isatty():
        raise UsageError("no PROMPT given and stdin is a terminal (see `modeld run --help`)")
    return sys.stdin.read()


def _cmd_run(args) -> int:
    from modeld.serving.contract import SamplingParams
    from modeld.serving.errors import InvalidRequest
    from modeld.serving.runtime import Runtime
    from modeld.serving.selection import CellOptions

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed).validate()
    prompt = _read_prompt(args)
    if not prompt.strip():
        raise InvalidRequest("the prompt is empty", param="prompt")
    runtime = Runtime(options=CellOptions(n_ctx=args.n_ctx))
    loaded = _with_status("loading model", lambda: runtime.load(args.model, require_cell=args.require_cell))
    cell = loaded.cell
    _note_reference_cell(loaded.spec)
    if args.raw:
        tokens = cell.tokenize(prompt, add_special=True)
    else:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        tokens = cell.chat_tokens(messages + [{"role": "user", "content": prompt}])
    session = cell.new_session()
    session.ensure_prefix(tokens)
    out = sys.stdout
    trace = None
    for ev in session.decode(params):
        if ev.text:
            out.write(ev.text)
            out.flush()
        trace = ev.trace or trace
    out.write("\n")
    out.flush()
    if args.trace and trace is not None:
        # The identity says which cell served (e.g. cell_id "engine_reference", backend
        # "modeld-qwen3_5/reference"), so a user can see an uncertified fall-through.
        print(json.dumps({**trace.to_dict(), "identity": cell.identity.to_dict(),
                          "fell_through": loaded.spec.fell_through}), file=sys.stderr)
    return 0


def _note_reference_cell(spec) -> None:
    """On a terminal, say when the uncertified reference cell was selected (slow on a big model;
    scripts see it in `--trace`'s identity instead, so piped stderr stays clean)."""
    from modeld.cells.engine_reference import CELL_ID

    if spec.cell_id == CELL_ID and sys.stderr.isatty():
        print(f"note: no certified cell serves {spec.model_id} on this host; running on the {CELL_ID} "
              "cell (engine on reference kernels, CPU: correct but uncertified and slow)", file=sys.stderr)


def _with_status(message: str, fn):
    if not sys.stderr.isatty():
        return fn()
    from rich.console import Console

    with Console(stderr=True).status(message):
        return fn()


def _cmd_serve(args) -> int:
    from modeld.serving.http.app import serve
    from modeld.serving.http.state import ServerConfig
    from modeld.serving.runtime import DEFAULT_MODEL, Runtime
    from modeld.serving.selection import CellOptions

    if not 0 <= args.port <= 65535:
        raise UsageError("--port must be in [0, 65535]")
    if args.max_queue < 1:
        raise UsageError("--max-queue must be >= 1")
    # --model becomes the runtime's default, so a request that names no model is answered by it
    # (not by the embedded SmolLM2).
    runtime = Runtime(options=CellOptions(n_ctx=args.n_ctx, context_policy=args.context_policy),
                      default_model=args.model or DEFAULT_MODEL)
    loaded = _with_status("loading model", lambda: runtime.load())
    print(f"modeld {__version__}: serving {loaded.name} ({loaded.spec.cell_id}) on "
          f"http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    serve(runtime, args.host, args.port, ServerConfig(max_queue=args.max_queue), log_level=args.log_level)
    return 0


def _preload_llama_cpp() -> None:
    """Load llama.cpp's libraries before anything imports numpy: a CUDA build of llama-cpp-python 0.3.36 segfaults
    loading a model in a process that imported numpy first (H200, session 23;
    KNOWLEDGE/pitfalls/llama-cpp-cuda-segfaults-after-numpy-import.md). `run` and `serve` may fall through to it.
    Absent or broken, the fall-through cell reports it when it is selected."""
    try:
        import llama_cpp  # noqa: F401
    except Exception:  # noqa: BLE001 - reported by the cell that needs it
        pass


def _main(argv: list[str]) -> int:
    if argv and argv[0] in DISPATCH:
        return _dispatch(argv[0], argv[1:])
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command in ("run", "serve"):
        _preload_llama_cpp()
    if args.command == "run":
        return _cmd_run(args)
    if args.command == "serve":
        return _cmd_serve(args)
    parser.print_help()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point. Returns (and, as a console script, exits with) the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _main(argv)
    except ModeldError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("Interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 141
    except SystemExit as exc:  # --help / --version (argparse) exit through here
        return exc.code if isinstance(exc.code, int) else 0
    except Exception as exc:  # a bug: still one line, never a traceback
        text = " ".join(str(exc).split())
        print(f"InternalError: {type(exc).__name__}: {text}", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
