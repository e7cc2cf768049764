"""T3 command entry points: `modeld resolve | cells | host | models`.

Each `*_main(argv)` parses its own arguments (argparse, `--help`), prints a rich table or, with
`--json`, one JSON document on stdout, and returns an exit code (0 ok, 2 usage error). Named
failures propagate as ModeldError subclasses; `modeld.cli` prints them as one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from modeld.distribution.errors import InvalidHostFacts
from modeld.distribution.identity import ModelIdentity, check_identity_text
from modeld.host import HostFacts, probe_host

BACKEND_KINDS = ("llama.cpp", "engine", "null")


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | int:
    """argparse exits on --help and on usage errors; turn that into a returned code."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)


def _console() -> Console:
    return Console(soft_wrap=False)


def _emit_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_host_json(path: str) -> HostFacts:
    """HostFacts from a JSON file (as written by `modeld host --json`); raises InvalidHostFacts."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidHostFacts(f"{path}: unreadable ({exc.strerror})") from None
    try:
        return HostFacts.from_json(text)
    except InvalidHostFacts as exc:
        raise InvalidHostFacts(f"{path}: {exc}") from None


# --------------------------------------------------------------------------- resolve


def resolve_main(argv: list[str]) -> int:
    """`modeld resolve MODEL`: which cell serves MODEL on this (or a simulated) host, and why
    every other cell does not. Raises ModelNotFound / ArtifactMissing / NoCellCanServe after
    printing the decision when nothing can serve."""
    parser = argparse.ArgumentParser(
        prog="modeld resolve",
        description="Show which cell would serve MODEL and every reason each other cell was "
                    "rejected. Nothing is downloaded or loaded: only installed artifacts count.",
    )
    parser.add_argument("model", help="a model name (e.g. smollm2), a registered name, or a path "
                                      "to a .gguf/.mspec file; with --weights-id, a model_id")
    parser.add_argument("--weights-id", metavar="SHA",
                        help="resolve the exact identity (MODEL as model_id, this weights id)")
    parser.add_argument("--host-json", metavar="FILE",
                        help="use a simulated host (the output of `modeld host --json`) "
                             "instead of probing this machine")
    parser.add_argument("--backends", metavar="KINDS",
                        help=f"comma-separated backend kinds to treat as available "
                             f"({', '.join(BACKEND_KINDS)}); default: detect installed ones")
    parser.add_argument("--json", action="store_true", help="print the decision as JSON")
    args = _parse(parser, argv)
    if isinstance(args, int):
        return args

    from modeld.distribution.manifests import load_manifests
    from modeld.distribution.render import hashing_progress, print_resolution
    from modeld.distribution.this_host import resolve_on_this_host

    request: str | ModelIdentity = args.model
    if args.weights_id is not None:
        request = ModelIdentity(args.model, args.weights_id)
    else:
        check_identity_text(args.model, "model name")
    host = load_host_json(args.host_json) if args.host_json else None
    backends = None
    if args.backends is not None:
        backends = frozenset(b.strip() for b in args.backends.split(",") if b.strip())
        unknown = backends - set(BACKEND_KINDS)
        if unknown:
            parser.print_usage(sys.stderr)
            print(f"modeld resolve: unknown backend kind(s): {', '.join(sorted(unknown))}",
                  file=sys.stderr)
            return 2
    console = _console()
    manifests = load_manifests()
    with hashing_progress(Console(stderr=True)) as progress:
        resolution = resolve_on_this_host(request, host=host, manifests=manifests,
                                          backends=backends, progress=progress)
    if args.json:
        _emit_json(resolution.to_dict())
    else:
        print_resolution(console, resolution, manifests)
    resolution.require()
    return 0


# --------------------------------------------------------------------------- cells


def cells_main(argv: list[str]) -> int:
    """`modeld cells`: list the cell manifests (built-in and $MODELD_HOME/cells). Raises
    InvalidManifest for a bad manifest file."""
    parser = argparse.ArgumentParser(
        prog="modeld cells",
        description="List the cell manifests: what each cell serves, what it needs from the host "
                    "and how it ranks. Built-in manifests live in modeld/cells/manifests/*.json; "
                    "extra ones are read from $MODELD_HOME/cells/*.json.",
    )
    parser.add_argument("--json", action="store_true", help="print the manifests as JSON")
    args = _parse(parser, argv)
    if isinstance(args, int):
        return args
    from modeld.distribution.manifests import load_manifests
    from modeld.distribution.render import print_cells

    manifests = load_manifests()
    if args.json:
        _emit_json([m.model_dump(mode="json") for m in manifests])
    else:
        print_cells(_console(), manifests)
    return 0


# --------------------------------------------------------------------------- host


def host_main(argv: list[str]) -> int:
    """`modeld host`: probe this machine (OS, CPU, RAM, GPUs). Never fails for a missing GPU."""
    parser = argparse.ArgumentParser(
        prog="modeld host",
        description="Show what the resolver knows about this machine: OS, CPU, RAM and GPUs "
                    "(via NVML, then torch). `--json` writes the HostFacts document that "
                    "`modeld resolve --host-json FILE` reads back (edit it to simulate a host).",
    )
    parser.add_argument("--json", action="store_true", help="print HostFacts as JSON")
    parser.add_argument("--no-torch", action="store_true",
                        help="skip torch (faster; the CUDA runtime version stays unknown)")
    parser.add_argument("--no-nvml", action="store_true", help="skip NVML")
    args = _parse(parser, argv)
    if isinstance(args, int):
        return args
    sources = tuple(s for s, off in (("nvml", args.no_nvml), ("torch", args.no_torch)) if not off)
    facts = probe_host(sources)
    if args.json:
        sys.stdout.write(facts.to_json() + "\n")
    else:
        from modeld.distribution.render import print_host

        print_host(_console(), facts)
    return 0


# --------------------------------------------------------------------------- models


def models_main(argv: list[str]) -> int:
    """`modeld models [list|show|add|remove]`: the models installed on this host. `add` and
    `remove` mutate $MODELD_HOME/registry.json. Raises RegistryError, RegistryConflict,
    ModelNotFound, ArtifactMissing, InvalidArtifact, InvalidIdentity."""
    parser = argparse.ArgumentParser(
        prog="modeld models",
        description="List, show, register or forget models on this host. Nothing is ever "
                    "downloaded: a model is a file already here (the built-in smollm2 GGUF, a "
                    "registered .gguf/.mspec, or a path given as the model name).",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.add_parser("list", help="every named model with its identity (the default)")
    show = sub.add_parser("show", help="one model, by name or path, with its identity")
    show.add_argument("name")
    add = sub.add_parser("add", help="register NAME for the .gguf/.mspec file at PATH")
    add.add_argument("name")
    add.add_argument("path")
    add.add_argument("--model-id", help="the model's id (needed for a GGUF to have an identity)")
    add.add_argument("--replace", action="store_true", help="overwrite an existing NAME")
    remove = sub.add_parser("remove", help="forget NAME (the file is left alone)")
    remove.add_argument("name")
    args = _parse(parser, argv)
    if isinstance(args, int):
        return args

    from modeld.distribution.registry import Registry
    from modeld.distribution.render import hashing_progress, print_models
    from modeld.distribution.this_host import all_artifacts, artifact_for

    console = _console()
    action = args.action or "list"
    if action in ("add", "remove"):
        registry = Registry.load()
        if action == "add":
            registry.add(args.name, args.path, args.model_id, replace=args.replace)
        else:
            registry.remove(args.name)
        registry.save()
        if args.json:
            _emit_json({"action": action, "name": args.name, "ok": True})
        else:
            console.print(f"{'registered' if action == 'add' else 'removed'} {args.name}")
        return 0
    with hashing_progress(Console(stderr=True)) as progress:
        if action == "show":
            check_identity_text(args.name, "model name")
            artifacts = artifact_for(args.name, progress=progress)
            if not artifacts:
                from modeld.distribution.errors import ModelNotFound

                raise ModelNotFound(f"no installed model answers to {args.name!r}")
        else:
            artifacts = all_artifacts(progress=progress)
    if args.json:
        _emit_json([a.to_dict() for a in artifacts])
    else:
        print_models(console, artifacts)
    return 0


__all__ = ["cells_main", "host_main", "load_host_json", "models_main", "resolve_main"]
